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

Which library and which ``mpiexec`` is ``discover``'s business (a probe in
a child ``python``: this process never loads libmpi; ~0.1 s); the report of
``mpimesh info``, ``info``'s.

``--spares-per-host K`` launches K ranks more on each host (:func:`with_spares`):
no mesh takes them, and ``heal_mesh`` puts them in place of dead processes
(issue #27).

``run`` replaces this process with ``mpiexec`` (``os.execve``) rather than
waiting on a child: signals (Ctrl-C, ``scancel``'s SIGTERM) reach mpiexec
directly and it forwards them to the ranks, the exit status is mpiexec's
exactly (death by signal included), and no idle Python parent is left
holding memory in a batch job.  Except across hosts with Open MPI: there
PRRTE exits 0 after losing a host, so ``run`` waits on mpiexec, passes
signals on, and corrects that status (``lost_host_status``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..config import parse_dashboard
from .discover import MpiLibrary, find_mpiexec, no_mpiexec_message, probe_library
from .info import info_command
from .lost_host_status import STATUS_FILE, run_correcting_status

__all__ = ["main"]

#: ``mpimesh run --dashboard``'s port (``mpimesh.dashboard()``'s default too)
DASHBOARD_PORT = "8780"

_USAGE = """\
usage: mpimesh run -n N [--host LIST | --hostfile FILE] [--spares-per-host K]
                   [--oversubscribe] [--no-ft] [--dashboard[=[HOST:]PORT]]
                   [--dry-run] [--mpiexec PATH] (script.py | -m module) [args...]
       mpimesh info [--get KEY]

Run a Python script (or module) on an MPI world of N processes: rank 0 runs
it as the controller, the other ranks serve actors.

run options:
  -n N, --np N      number of MPI processes (required)
  --host LIST       hosts and slots, e.g. node1:4,node2:4 (passed to mpiexec;
                    MPICH: -hosts)
  --hostfile FILE   a host file (passed to mpiexec; MPICH: -f)
  --spares-per-host K
                    launch K spare ranks more on each host: no mesh takes
                    them, and heal_mesh() replaces a dead process with one
                    (same host first); one host: N+K processes in all; with
                    --host node1:4,node2:4 each count grows by K (node1:5,
                    node2:5) and N by K per host; not with --hostfile, nor
                    in a multi-node allocation without --host
  --oversubscribe   allow more processes than CPUs or slots (also for
                    workers spawned later); automatic when N exceeds the
                    usable CPUs outside a Slurm allocation
  --no-ft           Open MPI 5: do not pass --with-ft ulfm
  --dashboard[=[HOST:]PORT]
                    serve the job's live dashboard from the controller
                    (MPIMESH_DASHBOARD) and print its URL; default port
                    8780 on 127.0.0.1; a HOST shares it (with a token)
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
        spares_per_host: ``--spares-per-host K``: K more ranks on each host (0: none).
        dashboard: ``--dashboard[=[HOST:]PORT]``: ``MPIMESH_DASHBOARD`` for the job, or ``None``.

    """

    nprocs: int
    target: list[str] = field(default_factory=list)
    oversubscribe: bool = False
    ft: bool = True
    dry_run: bool = False
    mpiexec: str | None = None
    hosts: str | None = None
    hostfile: str | None = None
    spares_per_host: int = 0
    dashboard: str | None = None


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
    spares = 0
    dashboard: str | None = None
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
        elif arg == "--spares-per-host":
            spares = _parse_spares(value(arg))
        elif arg.startswith("--spares-per-host="):
            spares = _parse_spares(arg[len("--spares-per-host="):])
        elif arg == "--dashboard":
            dashboard = DASHBOARD_PORT
        elif arg.startswith("--dashboard="):
            dashboard = arg[len("--dashboard="):]
            try:
                parse_dashboard(dashboard)
            except ValueError:
                raise ValueError(f"mpimesh run: expecting --dashboard=PORT or --dashboard=HOST:PORT, got {arg!r};"
                                 " e.g. `mpimesh run -n 4 --dashboard=8780 script.py`") from None
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
    if spares and hostfile is not None:
        raise ValueError(
            "mpimesh run: --spares-per-host cannot change a --hostfile; add the spares to the file"
            " (K more slots on each host) and to -n (K more per host) instead"
        )
    return RunOptions(nprocs, target, oversubscribe, ft, dry_run, mpiexec, hosts, hostfile, spares, dashboard)


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


def _parse_spares(text: str) -> int:
    """Return a spare count per host.

    Raises:
        ValueError: If *text* is not a non-negative integer.

    """
    if not text.isdigit():
        raise ValueError(
            f"mpimesh run: expecting a non-negative integer after --spares-per-host, got {text!r}"
        )
    return int(text)


def with_spares(opts: RunOptions, environ: Mapping[str, str]) -> tuple[int, str | None]:
    """Return the process count and ``--host`` list once ``--spares-per-host`` is added.

    One host: ``N + K``.  ``--host a:2,b`` (a host without a count has one
    slot): every count grows by K and N by K per host.

    Raises:
        ValueError: In a multi-node allocation without ``--host`` (where the
            spares would land is mpiexec's mapping), or on a malformed entry.

    """
    k = opts.spares_per_host
    if k == 0:
        return opts.nprocs, opts.hosts
    if opts.hosts is None:
        if _multi_node(environ):
            raise ValueError(
                "mpimesh run: --spares-per-host in a multi-node allocation needs --host LIST (which host"
                " gets which ranks); or ask Slurm for the spares: more --ntasks-per-node than the meshes"
                " use (jobs/README.md)"
            )
        return opts.nprocs + k, None
    entries = []
    for entry in opts.hosts.split(","):
        name, _, slots = entry.partition(":")
        if not name or not (slots.isdigit() or slots == ""):
            raise ValueError(
                f"mpimesh run: expecting --host entries HOST or HOST:SLOTS with --spares-per-host, got {entry!r}"
            )
        entries.append(f"{name}:{int(slots or 1) + k}")
    return opts.nprocs + k * len(entries), ",".join(entries)


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


def _across_hosts(opts: RunOptions, environ: Mapping[str, str]) -> bool:
    """Return whether the ranks may run on more than one node (``--host``, ``--hostfile``, a multi-node allocation)."""
    return opts.hosts is not None or opts.hostfile is not None or _multi_node(environ)


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

    Raises:
        ValueError: If ``--spares-per-host`` cannot be placed (:func:`with_spares`).

    """
    nprocs, hosts = with_spares(opts, environ)
    argv = [mpiexec, "-n", str(nprocs)]
    added: dict[str, str] = {}
    # Ranks placed on listed hosts: this node's CPUs say nothing about them.
    placed = hosts is not None or opts.hostfile is not None
    oversubscribe = opts.oversubscribe if placed else want_oversubscribe(replace(opts, nprocs=nprocs), environ, cpus)
    if lib.vendor != "openmpi":
        if hosts is not None:
            argv += ["-hosts", hosts]
        if opts.hostfile is not None:
            argv += ["-f", opts.hostfile]
    if lib.vendor == "openmpi":
        if hosts is not None:
            argv += ["--host", hosts]
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
    if opts.dashboard is not None:
        added["MPIMESH_DASHBOARD"] = opts.dashboard
    argv += [python, "-m", "mpimesh", *opts.target]
    return argv, added


def format_command(argv: Sequence[str], added: Mapping[str, str]) -> str:
    """Return a shell line that runs *argv* with *added* in the environment."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in added.items()]
    return " ".join([*assignments, shlex.join(argv)])


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
    if lib.vendor == "openmpi" and _across_hosts(opts, environ) and STATUS_FILE not in environ:
        # PRRTE exits 0 after losing a host: wait on it, and correct that (lost_host_status).
        return run_correcting_status(argv, environ)
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
            return info_command(rest)
        raise ValueError(f"expecting a command among run, info, got {command!r}")
    except ValueError as exc:
        _error(str(exc))
        return 2
    except RuntimeError as exc:
        _error(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
