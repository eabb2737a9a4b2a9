"""The binding of the C extension ``mpimesh._native``: whether it fits the loaded MPI.

Receiving a small frame through mpi4py (``improbe``, then ``Message.recv``)
and sending one (``Isend``, then ``Test``) builds a few Python objects per
call; ``mpimesh._native`` makes the same MPI calls on the raw handles
(``native/wire.c``), and can keep probing for a while with the GIL released,
so a waiting thread sees a message as soon as MPI does.  When :func:`bind`
succeeds, :func:`mpimesh._transport.make_router` makes a ``NativeRouter``
(:mod:`.native_router`), whose receive path (unpickle, dispatch:
``native/pump.c``) and send path for a frame that leaves at once
(``native/post.c``) run there too.

The native part is compiled against one MPI's headers and does not link
libmpi, so one checkout can serve virtual environments with different MPIs.
It is used only when the library mpi4py loaded is of the same vendor and major
version as those headers, and by default only with Open MPI, the stack CI runs
it on (``MPIMESH_WIRE=auto``); otherwise the router keeps mpi4py's calls.
``MPIMESH_WIRE=native`` uses it with MPICH too (built for MPICH it passes the
runtime tests; docs/design/transport.md has the figures) and makes a mismatch
an error; ``MPIMESH_WIRE=mpi4py`` never uses the native part.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._launch.discover import parse_library_version
from ..config import settings
from .mpi import MPI, library, loaded_libmpi

__all__ = ["bind", "probe", "isend", "same_mpi", "why_not"]

#: ``probe(handles, tag, spin_ns)`` -> None | (index, source, bytes) | (index, -1, error code)
probe: Callable[[tuple[int, ...], int, int], tuple[int, int, Any] | None] | None = None
#: ``isend(handle, data, dest, tag)`` -> None (sent) | a request handle
isend: Callable[[int, Any, int, int], int | None] | None = None
#: why the native calls are not used (empty when they are)
why_not = "not bound yet"

# The vendors as native/compat.h names them -> as _discover does.
_BUILT_VENDORS = {"Open MPI": "openmpi", "MPICH": "mpich", "Intel MPI": "intel"}


def same_mpi(built: str, loaded: str) -> bool:
    """Whether the native part's headers fit the loaded library: same vendor and major version.

    Args:
        built: ``_native.built_with()``, e.g. ``"Open MPI 5.0.11"``.
        loaded: the library's version string, e.g. ``"Open MPI v5.0.3, package: ..."``.
    """
    vendor, _, release = built.rpartition(" ")
    have, version = parse_library_version(loaded)
    return (
        version is not None
        and _BUILT_VENDORS.get(vendor) == have
        and release.split(".")[0] == version.split(".")[0]
    )


def bind() -> bool:
    """Use the native calls if they fit the loaded MPI; returns whether they are used.

    Raises:
        RuntimeError: ``MPIMESH_WIRE=native`` and they cannot be used.
    """
    global probe, isend, why_not
    if probe is not None:
        return True
    why_not = _try_bind()
    if why_not and settings.wire == "native":
        raise RuntimeError(f"MPIMESH_WIRE=native, but {why_not}; unset MPIMESH_WIRE to fall back to mpi4py")
    return not why_not


def _try_bind() -> str:
    global probe, isend
    if settings.wire == "mpi4py":
        return "MPIMESH_WIRE=mpi4py"
    try:
        from .. import _native
    except ImportError as exc:
        return f"mpimesh._native is not built ({exc}); reinstall with MPIMESH_MPICC=/path/to/mpicc"
    if not all(hasattr(_native, name) for name in ("wire_bind", "Pump", "Sender", "Out")):
        return "mpimesh._native is out of date; rebuild it (see the README's install section)"
    built, loaded = _native.built_with(), library()
    if not same_mpi(built, loaded):
        return f"mpimesh._native was built with {built}, but {loaded!r} is loaded"
    if parse_library_version(loaded)[0] != "openmpi" and settings.wire == "auto":
        # Built for MPICH it passes the runtime tests, but CI runs MPICH with
        # the checkout's Open MPI build: ask for it with MPIMESH_WIRE=native.
        return (f"the native frame path is used with Open MPI unless MPIMESH_WIRE=native "
                f"({loaded!r} is loaded)")
    path = loaded_libmpi()
    if path is None:
        return "the loaded libmpi was not found in /proc/self/maps"
    try:
        _native.wire_bind(path, MPI.BYTE.handle, MPI.Exception)
    except OSError as exc:
        return str(exc)
    probe, isend = _native.wire_probe, _native.wire_isend
    return ""
