"""Outliving a lost host: what each launcher allows, and what mpimesh turns on for it (issue #27).

Measured (``/work/shared/reference/hostloss/REPORT.md``, ``docs/design/hosts.md`` §3.5):

* Open MPI's ``mpiexec`` (PRRTE 3.x and 4.x) ends the whole job when it loses
  a host's daemon, whatever the options; PRRTE's master branch tolerates it
  (openpmix/prrte PR #2443), in no release yet.  Under ``mpiexec`` across
  hosts the controller therefore says once, at start, that a lost host ends
  the job there (:func:`host_loss_notice`).
* Slurm's ``srun --mpi=pmix --no-kill --kill-on-bad-exit=0`` keeps the step,
  and Open MPI's ULFM lets the survivors go on, given three things that
  :func:`direct_launch_settings` and :func:`load_notify_interposer` provide
  before ``MPI_Init`` (``mpimesh/_transport/mpi.py`` calls them): ULFM itself
  (no ``mpiexec --with-ft ulfm`` turns it on), its heartbeat detector and
  in-MPI propagation (a frozen host sends no RST, and Slurm's PMIx server
  propagates nothing), and the ``PMIx_Notify_event`` interposer
  (``native/pmix_notify.c``), without which Slurm's PMIx plugin kills the
  step at the first notification of a dead peer.

Pure helpers over an environment mapping, importable before MPI.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "DIRECT_LAUNCH_ULFM", "slurm_pmix_direct", "direct_launch_settings", "open_mpi_expected", "notify_library",
    "notify_report", "load_notify_interposer", "host_loss_notice", "prrte_version", "TOLERANT_PRRTE",
]

#: What ULFM needs under direct launch, where no ``mpiexec --with-ft ulfm`` sets it: a dead peer is an
#: MPI error, not the end of this process; the failure is spread by MPI itself (reliable broadcast),
#: as Slurm's PMIx server spreads nothing; and a silent (frozen) peer is found by heartbeats, every
#: 0.5 s, dead after 2 s.  ULFM's ring finds only the first process of a frozen host that quickly
#: (each next one after its own timeout, 5.7-6 s for two); the controller then asks that host's other
#: workers and declares the silent ones dead 0.5 s later (``_roles/liveness.py``): the frozen host of
#: tests/slurm is found in 2.30-2.48 s (6 runs).  A timeout of 1.5 s gave 1.80-2.09 s (6 runs) and no false positive
#: in 60 s beside 4 spinning processes on 2 cores (``tests/slurm/test_slurm_load.py``, twice), but one
#: job of 5 in a benchmark died at boot: a rank declared dead while it imported mpimesh between
#: ``MPI_Init`` and the boot, sending no heartbeat (3 jobs in ~30 at 2 s too; fixed since by
#: ``boot_beat``, docs/design/runtime.md "Boot under srun"; 1.5 s not measured again).
DIRECT_LAUNCH_ULFM = {
    "OMPI_MCA_mpi_ft_enable": "true",
    "OMPI_MCA_mpi_ft_propagator_with_rbcast": "true",
    "OMPI_MCA_mpi_ft_detector": "true",
    "OMPI_MCA_mpi_ft_detector_period": "0.5",
    "OMPI_MCA_mpi_ft_detector_timeout": "2",
    # coll/han is not ULFM-aware, and a boot under srun crashed in it (SIGSEGV in mca_coll_han_comm_create,
    # one job in 7 of tests/slurm); tuned/basic serve.  (With it off, tests/slurm's negative control,
    # MPIMESH_PMIX_NOTIFY=0, still died at boot in 2 runs of 2: that one is not han's.)
    "OMPI_MCA_coll": "^han",
}

#: The first PRRTE major version taken to tolerate a lost daemon (PR #2443 is on master, which calls
#: itself 5.0.0a1; the first release with it is unknown): under it the notice may be wrong.
TOLERANT_PRRTE = 5

_PACKAGE = Path(__file__).resolve().parent.parent
_NOTIFY = "_pmix_notify"
#: setup.py's record of the interposer's build
NOTIFY_RECORD = _PACKAGE / "_pmix_notify_build.json"


def slurm_pmix_direct(environ: Mapping[str, str]) -> bool:
    """Whether this process was started by ``srun --mpi=pmix`` (Slurm's PMIx plugin), not by an mpiexec."""
    return ("SLURM_STEP_ID" in environ and "PMIX_RANK" in environ
            and "PRTE_LAUNCHED" not in environ) or "SLURM_PMIXP_ABORT_AGENT_PORT" in environ


def direct_launch_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The ULFM settings of :data:`DIRECT_LAUNCH_ULFM` that *environ* does not set already (the user's win)."""
    return {name: value for name, value in DIRECT_LAUNCH_ULFM.items() if name not in environ}


def open_mpi_expected(prefix: str, environ: Mapping[str, str]) -> bool:
    """Whether the libmpi mpi4py will load is Open MPI's, told before it is loaded.

    The PyPI wheel in *prefix* (``bin/prte`` and ``lib/libmpi.so.40``), or an Open MPI library
    (soname ``libmpi.so.40``; MPICH's is ``libmpi.so.12``) on ``LD_LIBRARY_PATH``.
    """
    if os.path.exists(os.path.join(prefix, "bin", "prte")) and os.path.exists(
            os.path.join(prefix, "lib", "libmpi.so.40")):
        return True
    return any(os.path.exists(os.path.join(d, "libmpi.so.40"))
               for d in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d)


def notify_library() -> Path | None:
    """The interposer's shared library beside the package (``mpimesh/_pmix_notify*.so``), or ``None``."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _PACKAGE / f"{_NOTIFY}{suffix}"
        if path.is_file():
            return path
    return None


def notify_report() -> str:
    """Whether the interposer was built, for ``mpimesh info``: its path, or why it is missing."""
    path = notify_library()
    if path is not None:
        return f"built: {path}"
    try:
        record = json.loads(NOTIFY_RECORD.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    reason = record.get("reason") if isinstance(record, dict) and not record.get("built") else None
    return f"not built ({reason or 'no record of its build: reinstall mpimesh'})"


def load_notify_interposer(environ: Mapping[str, str]) -> str:
    """Load the interposer ``RTLD_GLOBAL``, before libmpi; returns why not, or ``""`` once loaded.

    Loaded first, its ``PMIx_Notify_event`` is the one libmpi binds to.  ``MPIMESH_PMIX_NOTIFY=0``
    leaves it out (then Slurm cancels the step at the first dead peer: the tests' negative control).
    """
    if environ.get("MPIMESH_PMIX_NOTIFY", "1").lower() in ("0", "false", "no", "off"):
        return "MPIMESH_PMIX_NOTIFY=0"
    path = notify_library()
    if path is None:
        return f"mpimesh's PMIx_Notify_event interposer is {notify_report()}"
    try:
        ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as exc:
        return f"mpimesh's PMIx_Notify_event interposer {path} cannot be loaded: {exc}"
    return ""


def _multi_host_prrte(environ: Mapping[str, str]) -> bool:
    # PRRTE tells each rank its job's size and how many of its ranks share its host.
    size, local = environ.get("OMPI_COMM_WORLD_SIZE", ""), environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "")
    return (environ.get("PRTE_LAUNCHED") == "1" and size.isdigit() and local.isdigit()
            and int(local) < int(size))


def host_loss_notice(environ: Mapping[str, str], argv: Sequence[str]) -> str | None:
    """The line rank 0 of a multi-host ``mpiexec`` job prints once at start, or ``None``.

    Only for the launch world's rank 0, the controller (not a spawned worker, ``--worker``).
    ``MPIMESH_HOST_LOSS_NOTICE=0`` silences it.
    """
    if (environ.get("MPIMESH_HOST_LOSS_NOTICE", "1") in ("0", "false", "no", "off")
            or environ.get("OMPI_COMM_WORLD_RANK") != "0" or list(argv[1:2]) == ["--worker"]
            or not _multi_host_prrte(environ)):
        return None
    return ("mpimesh: this job spans hosts under mpiexec (PRRTE): if a whole host is lost (crash, power, "
            "network), mpiexec ends the whole job, and no SupervisionError is raised; to outlive a lost host, "
            "launch under Slurm with `srun --mpi=pmix --no-kill --kill-on-bad-exit=0` in an `sbatch --no-kill` "
            "job (jobs/slurm/mpimesh.sbatch); the job's status is then 1 under `mpimesh run`, but 0 under a "
            "plain mpiexec (PRRTE's) (MPIMESH_HOST_LOSS_NOTICE=0 silences this notice)")


def prrte_version(prte_info: str) -> tuple[int, int, int] | None:
    """PRRTE's version from ``prte_info``'s output (its ``errmgr: dvm`` component's), or ``None``."""
    match = re.search(r"MCA errmgr: dvm \(.*?Component v(\d+)\.(\d+)\.(\d+)", prte_info)
    if match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch
