"""Frames over MPI: the MPI library handle, the router and its native subclass, doorbells.

* :mod:`.frames`: what the transport knows of a frame (addresses, tags, the
  kinds it opens itself);
* :mod:`.mpi`: the one import of ``mpi4py.MPI``;
* :mod:`.router`: :class:`~.router.Router`, routing, batching and the I/O
  path through mpi4py;
* :mod:`.native`: the binding of the C extension ``mpimesh._native``;
* :mod:`.native_router`: :class:`~.native_router.NativeRouter`, the router
  with its receive and send halves in C;
* :mod:`.buffers`: raw buffers on the wire and the pool they are received into;
* :mod:`.bell`: doorbells that wake an idle process.

:func:`make_router` picks the router, once per process.  Nothing here is
imported before it is used: ``mpimesh._core.protocol`` reads :mod:`.frames`
without initialising MPI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .frames import Addr
    from .router import Failed, Handler, Router

__all__ = ["make_router"]


def make_router(
    addr: Addr,
    handlers: dict[int, Handler],
    failed: Failed | None = None,
    broken: Callable[[str], None] | None = None,
    *,
    names: Mapping[int, str] | None = None,
) -> Router:
    """This process's router: a ``NativeRouter`` when the native part binds, else a ``Router``.

    The native part binds when it was built for the MPI that mpi4py loaded and
    ``MPIMESH_WIRE`` allows it (see :func:`.native.bind`).  Both take the same
    arguments (see :class:`~.router.Router`) and behave the same.

    Raises:
        RuntimeError: ``MPIMESH_WIRE=native`` and the native part cannot be used.
    """
    from . import native

    if native.bind():
        from .native_router import NativeRouter

        return NativeRouter(addr, handlers, failed, broken, names=names)
    from .router import Router

    return Router(addr, handlers, failed, broken, names=names)
