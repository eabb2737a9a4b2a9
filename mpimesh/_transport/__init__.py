"""Frames over MPI: the MPI library handle, the router and its wires, doorbells.

* :mod:`.frames`: what the transport knows of a frame (addresses, tags, the
  kinds it opens itself);
* :mod:`.mpi`: the one import of ``mpi4py.MPI``;
* :mod:`.router`: :class:`~.router.Router`, routing: which link takes a
  frame to an address, islands, the switch to direct links;
* :mod:`.wire`: :class:`~.wire.Wire`, what a router asks of the wire that
  makes the frame path's MPI calls, and its two classes:
  :mod:`.wire_mpi4py` (through mpi4py) and :mod:`.wire_native` (the hot
  halves in C);
* :mod:`.links`, :mod:`.outbox`, :mod:`.chores`: the links, and what both
  wires do in Python (batching, raw buffers, sends in flight; frames to this
  very process, one-sided operations);
* :mod:`.native`: the binding of the C extension ``mpimesh._native``;
* :mod:`.buffers`: raw buffers in a frame and the pool they are received into;
* :mod:`.bell`: doorbells that wake an idle process.

:func:`make_router` picks the wire, once per process.  Nothing here is
imported before it is used: ``mpimesh._core.protocol`` reads :mod:`.frames`
without initialising MPI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .frames import Addr
    from .links import Failed, Handler
    from .router import Router

__all__ = ["make_router"]


def make_router(
    addr: Addr,
    handlers: dict[int, Handler],
    failed: Failed | None = None,
    broken: Callable[[str], None] | None = None,
    *,
    names: Mapping[int, str] | None = None,
) -> Router:
    """This process's router, over a ``NativeWire`` when the native part binds, else an ``Mpi4pyWire``.

    The native part binds when it was built for the MPI that mpi4py loaded and
    ``MPIMESH_WIRE`` allows it (see :func:`.native.bind`).  Both wires take
    these arguments (see :class:`~.wire_mpi4py.Mpi4pyWire`) and behave the same.

    Raises:
        RuntimeError: ``MPIMESH_WIRE=native`` and the native part cannot be used.
    """
    from . import native
    from .router import Router

    if native.bind():
        from .wire_native import NativeWire

        return Router(addr, NativeWire(addr, handlers, failed, broken, names=names))
    from .wire_mpi4py import Mpi4pyWire

    return Router(addr, Mpi4pyWire(addr, handlers, failed, broken, names=names))
