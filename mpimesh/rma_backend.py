"""Which path :class:`~mpimesh.RDMABuffer` transfers take, under Monarch's names (``monarch.rdma``).

Monarch moves buffers over ibverbs hardware and falls back to TCP; programs
ask it which with :func:`get_rdma_backend` and :func:`is_ibverbs_available`.
mpimesh has no transport of its own: a buffer on the caller's host moves by a
kernel copy between the two processes, any other by the MPI library's
one-sided operations over whatever network it uses (InfiniBand included, when
it is built for it).  So an :class:`~mpimesh.RDMABuffer` always works, and the
answers below describe the host rather than a setting:

* :func:`is_ibverbs_available`: this host has an ibverbs device
  (``/sys/class/infiniband`` lists one), which the MPI library may use;
* :func:`get_rdma_backend`: ``"ibverbs"`` then, else ``"tcp"`` (Monarch's word
  for "works without RDMA hardware"); never ``"none"``.

The three warning classes exist so that programs filtering them keep
working; mpimesh raises none of them (it has no TCP fallback to warn about).

Example::

    if get_rdma_backend() == "ibverbs":
        print("RDMA hardware on this host")
"""

from __future__ import annotations

import os
import warnings

__all__ = [
    "RDMAReadTransferWarning",
    "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]

#: Where Linux lists RDMA devices (one entry per HCA: mlx5_0, efa_0, ...).  Tests point it elsewhere.
_IB_CLASS_DIR = "/sys/class/infiniband"


class RDMAReadTransferWarning(Warning):
    """Monarch's warning about a read transfer; mpimesh never raises it (kept for filters)."""


class RDMAWriteTransferWarning(Warning):
    """Monarch's warning about a write transfer; mpimesh never raises it (kept for filters)."""


class RDMATcpFallbackWarning(Warning):
    """Monarch's warning that buffers go over TCP; mpimesh never raises it (it has no such fallback)."""


def is_ibverbs_available() -> bool:
    """Whether this host has an ibverbs device (``/sys/class/infiniband`` lists one).

    Does not block.  The MPI library, not mpimesh, decides whether it uses the
    device for :class:`~mpimesh.RDMABuffer` transfers between hosts.
    """
    try:
        with os.scandir(_IB_CLASS_DIR) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def get_rdma_backend() -> str:
    """``"ibverbs"`` if this host has an ibverbs device, else ``"tcp"``; never ``"none"``.

    Monarch's values: ``"tcp"`` means buffers move without RDMA hardware,
    which every :class:`~mpimesh.RDMABuffer` can (see the module's text).
    """
    return "ibverbs" if is_ibverbs_available() else "tcp"


def is_rdma_available() -> bool:
    """Deprecated, as in Monarch: what :func:`is_ibverbs_available` says, with a ``DeprecationWarning``.

    Warns:
        DeprecationWarning: always; call ``is_ibverbs_available()`` or
            ``get_rdma_backend()`` instead.
    """
    warnings.warn(
        "is_rdma_available() is deprecated, as in Monarch; use is_ibverbs_available() or get_rdma_backend()",
        DeprecationWarning,
        stacklevel=2,
    )
    return is_ibverbs_available()
