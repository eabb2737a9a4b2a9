"""The binding of the C extension ``mpimesh._native``: whether it fits the loaded MPI.

Receiving a small frame through mpi4py (``improbe``, then ``Message.recv``)
and sending one (``Isend``, then ``Test``) builds a few Python objects per
call; ``mpimesh._native`` makes the same MPI calls on the raw handles
(``native/wire.c``), and can keep probing for a while with the GIL released,
so a waiting thread sees a message as soon as MPI does.  When :func:`bind`
succeeds, :func:`mpimesh._transport.make_router` puts the router over a
``NativeWire`` (:mod:`.wire_native`), whose receive path (unpickle, dispatch:
``native/pump.c``) and send path for a frame that leaves at once
(``native/post.c``) run there too.

The native part is compiled against one MPI's headers and does not link
libmpi, so one checkout can serve virtual environments with different MPIs.
It is used only when the library mpi4py loaded is of the same vendor and major
version as those headers, and by default only with Open MPI, the stack CI runs
it on (``MPIMESH_WIRE=auto``); otherwise the router's wire makes mpi4py's calls.
``MPIMESH_WIRE=native`` uses it with MPICH too (built for MPICH it passes the
runtime tests; docs/design/transport.md has the figures) and makes a mismatch
an error; ``MPIMESH_WIRE=mpi4py`` never uses the native part.

Which path is in use, and why, is :func:`report` (``mpimesh info``'s
``wire`` and ``wire_reason``); :func:`notice` is the one line the controller
prints at start-up when Open MPI is loaded, ``MPIMESH_WIRE`` is left to
``auto`` and the native path is not in use, with the command that fixes it.
The build's record, ``mpimesh/_native_build.json`` (setup.py), says which
``mpicc`` built the native part, or why it was not built.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._launch.discover import parse_library_version
from ..config import settings
from .mpi import MPI, library, loaded_libmpi

__all__ = [
    "bind", "probe", "isend", "same_mpi", "why_not", "fix", "build_record", "rebuild_command", "report", "notice",
    "announce",
]

#: ``probe(handles, tag, spin_ns)`` -> None | (index, source, bytes) | (index, -1, error code)
probe: Callable[[tuple[int, ...], int, int], tuple[int, int, Any] | None] | None = None
#: ``isend(handle, data, dest, tag)`` -> None (sent) | a request handle
isend: Callable[[int, Any, int, int], int | None] | None = None
#: why the native calls are not used (empty when they are)
why_not = "not bound yet"
#: the command that makes them used, when :data:`why_not` is one a rebuild cures (else empty)
fix = ""

#: setup.py's record of the native part's build, beside the package's modules
RECORD = Path(__file__).resolve().parent.parent / "_native_build.json"

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
    global probe, isend, why_not, fix
    if probe is not None:
        return True
    why_not, fix = _try_bind(), ""
    if why_not.startswith(_REBUILD_CURES) and (settings.wire == "native" or _loaded_vendor() == "openmpi"):
        fix = rebuild_command()
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
        record = build_record()
        cause = record.get("reason") if record and not record.get("built") else None
        return f"mpimesh._native is not built ({cause or exc})"
    if not all(hasattr(_native, name) for name in ("wire_bind", "Pump", "Sender", "Out")):
        return "mpimesh._native is out of date"
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


# The reasons a rebuild against the loaded MPI cures (see :func:`rebuild_command`), where that MPI is one
# the native path is used with (Open MPI, or any with MPIMESH_WIRE=native).
_REBUILD_CURES = ("mpimesh._native is not built", "mpimesh._native is out of date", "mpimesh._native was built with")


def _loaded_vendor() -> str | None:
    return parse_library_version(library())[0]


def build_record() -> dict[str, Any] | None:
    """setup.py's record of the last build of the native part, or ``None`` where there is none."""
    try:
        record = json.loads(RECORD.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _mpicc() -> str:
    """The compiler wrapper of the loaded MPI: beside the interpreter (the PyPI wheels), its prefix's, or PATH's."""
    libmpi = loaded_libmpi()
    for where in (Path(sys.executable).parent, Path(libmpi).parent.parent / "bin" if libmpi else None):
        if where is not None and os.access(where / "mpicc", os.X_OK):
            return str(where / "mpicc")
    return "$(command -v mpicc)"


def rebuild_command() -> str:
    """The command that rebuilds the native part for the loaded MPI, as mpimesh was installed.

    Run from a checkout (an editable install), it is reinstalled from there;
    else ``direct_url.json`` (PEP 610) says where it came from: a checkout or
    an sdist is reinstalled from there, a wheel is rebuilt from its source (it
    was built without the native part), an index's release from its sdist.
    """
    mpicc = _mpicc()
    checkout = Path(__file__).resolve().parents[2]
    pip = (f"MPIMESH_MPICC={mpicc if mpicc.startswith('$') else shlex.quote(mpicc)} "
           f"{shlex.quote(sys.executable)} -m pip install --no-deps --force-reinstall")
    if (checkout / "setup.py").is_file() and (checkout / "native").is_dir():
        return f"{pip} -e {shlex.quote(str(checkout))}"  # run from a checkout (editable or on sys.path)
    # Imported here: importlib.metadata (and the email package under it) is ~50 ms of every process's start.
    from importlib import metadata

    try:
        direct = json.loads(metadata.distribution("mpimesh").read_text("direct_url.json") or "null")
    except (metadata.PackageNotFoundError, ValueError):
        direct = None
    if not isinstance(direct, dict):
        return f"{pip} --no-binary=mpimesh mpimesh"
    url = str(direct.get("url", ""))
    source = url.removeprefix("file://")
    if direct.get("dir_info", {}).get("editable"):
        return f"{pip} -e {shlex.quote(source)}"
    if source.endswith(".whl"):
        return f"{pip} <the checkout or sdist {os.path.basename(source)} was built from>"
    return f"{pip} {shlex.quote(source)}"


def report() -> dict[str, str]:
    """Which path the frames take in this process and why: ``wire`` (native, mpi4py, or error) and ``reason``."""
    try:
        bound = bind()
    except RuntimeError as exc:
        return {"wire": "error", "reason": str(exc)}
    if not bound:
        return {"wire": "mpi4py", "reason": why_not + (f"; fix: {fix}" if fix else "")}
    from .. import _native

    record = build_record()
    how = f" ({record['origin']})" if record and record.get("built") and record.get("origin") else ""
    vendor, version = parse_library_version(library())
    return {"wire": "native", "reason": f"built for {_native.built_with()}{how}; {vendor} {version} loaded"}


def notice() -> str | None:
    """The start-up line when the native path is not in use though the loaded MPI could use it, else ``None``.

    Silent where it is in use, where ``MPIMESH_WIRE`` chose a path, and where
    the loaded MPI is not Open MPI (the native path's default stack).
    """
    if settings.wire != "auto" or bind() or _loaded_vendor() != "openmpi":
        return None
    cure = f"fix: {fix}" if fix else "no rebuild cures it"
    return (f"mpimesh: calls take the slower mpi4py path: {why_not}; {cure} "
            f"(MPIMESH_WIRE=mpi4py silences this notice)")


def announce() -> None:
    """Print :func:`notice` on stderr, if any; the controller calls it once, at start-up."""
    line = notice()
    if line:
        print(line, file=sys.stderr, flush=True)
