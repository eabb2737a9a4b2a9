"""Check that MPI_COMM_WORLD has as many ranks as the launcher started.

A launcher whose process-management interface does not match the MPI library
starts N processes that each initialize MPI as a singleton (a world of size
1) and can all exit 0. Measured on this project's machines: ``srun --mpi=pmi2``
or a plain ``srun`` (``MpiDefault=none``) with the PyPI Open MPI 5, a plain
``srun`` with the PyPI MPICH, and MPICH's ``mpiexec`` running a Python whose
mpi4py loads Open MPI. The launcher still tells each process how many it
started, through environment variables set *before* the program runs; this
module compares that count with the world size and says how to fix a
mismatch.

The runtime (``python -m mpimesh``) calls :func:`check_world_size` once at
start-up on every rank of the initial world, with the environment as it was
when the process started. It must not call it in processes created by
``MPI_Comm_spawn``: they inherit the parent's ``SLURM_*`` and ``MPIMESH_*``
variables, which describe the parent's launch, not theirs.

This module does not import MPI.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["expected_world_size", "check_world_size", "EXPECT_NPROCS_VAR"]

#: Set to the number of MPI processes to check against, overriding every
#: launcher variable; ``0`` turns the check off (e.g. for a process started
#: with a scrubbed or inherited environment that does not describe its launch).
EXPECT_NPROCS_VAR = "MPIMESH_EXPECT_NPROCS"

# Variables the launchers set, innermost launcher first. Each is set by the
# launcher before the program starts (verified here: none is set or changed by
# MPI_Init), so a singleton still sees the count it was meant to join.
#   OMPI_COMM_WORLD_SIZE  Open MPI's mpirun/mpiexec (prterun); also set for
#                         processes spawned through PRRTE (their own size).
#   PMI_SIZE              MPICH's Hydra mpiexec (and Intel MPI), and srun
#                         --mpi=pmi2. Hydra inside an allocation starts its
#                         proxies with a one-task-per-node srun step, so the
#                         SLURM_* variables below then describe that step and
#                         must come last.
#   MV2_COMM_WORLD_SIZE   MVAPICH's mpirun_rsh.
# Slurm's pmix plugin sets PMIX_RANK and PMIX_NAMESPACE but no size variable.
_MPI_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
# srun sets these for every task of a step. They are only meaningful inside a
# step (SLURM_STEP_ID set): a batch script, and mpirun run from it, see the
# allocation's SLURM_NTASKS without a step id.
_SLURM_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")

_MPIMESH_RUN_FIX = (
    "launch with `mpimesh run -n {n} …`, which picks the matching mpiexec"
    " (see `mpimesh info`)"
)
_SRUN_FIX = (
    "launch with `srun --mpi=pmix …` for Open MPI or `srun --mpi=pmi2 …`"
    " for MPICH (check `srun --mpi=list` and `mpimesh info`), or with"
    " `mpimesh run -n {n} …` inside the allocation"
)


def _parse_count(name: str, value: str) -> int:
    """Return the process count in launcher variable *name*.

    Raises:
        ValueError: If *value* is not a positive integer.

    """
    try:
        count = int(value.strip())
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(
            f"expecting a positive integer in {name}, got {value!r};"
            f" unset {name} or fix the launcher that set it"
        )
    return count


def expected_world_size(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """Return the number of processes the launcher started, and who said so.

    Looks, in order, at ``MPIMESH_EXPECT_NPROCS`` (explicit; ``0`` disables
    the check), ``OMPI_COMM_WORLD_SIZE`` (Open MPI's mpiexec), ``PMI_SIZE``
    (Hydra mpiexec, ``srun --mpi=pmi2``), ``MV2_COMM_WORLD_SIZE`` (MVAPICH),
    then, inside a Slurm step (``SLURM_STEP_ID`` set),
    ``SLURM_STEP_NUM_TASKS``, ``SLURM_NTASKS`` and ``SLURM_NPROCS``.

    Args:
        environ: The environment as the process received it, e.g.
            ``os.environ`` read before MPI is initialized.

    Returns:
        ``(count, variable)`` for the first variable found, or ``None`` when
        no launcher variable is set (a plain ``python`` run: a singleton is
        what was asked for) or the check is disabled.

    Raises:
        ValueError: If a variable holds something other than a positive
            integer (``MPIMESH_EXPECT_NPROCS`` may also be ``0``).

    """
    explicit = environ.get(EXPECT_NPROCS_VAR)
    if explicit is not None and explicit.strip() != "":
        if explicit.strip() == "0":
            return None
        try:
            return _parse_count(EXPECT_NPROCS_VAR, explicit), EXPECT_NPROCS_VAR
        except ValueError:
            raise ValueError(
                f"expecting a non-negative integer in {EXPECT_NPROCS_VAR},"
                f" got {explicit!r}; set it to the number of MPI processes,"
                " or to 0 to skip the world-size check"
            ) from None
    for name in _MPI_LAUNCHER_VARS:
        value = environ.get(name)
        if value is not None:
            return _parse_count(name, value), name
    if environ.get("SLURM_STEP_ID") is not None:
        for name in _SLURM_VARS:
            value = environ.get(name)
            if value is not None:
                return _parse_count(name, value), name
    return None


def _plural(count: int, word: str) -> str:
    """Return e.g. ``"1 rank"``, ``"4 ranks"`` or ``"2 processes"``."""
    if count == 1:
        return f"{count} {word}"
    return f"{count} {word}es" if word.endswith("s") else f"{count} {word}s"


def check_world_size(world_size: int, environ: Mapping[str, str]) -> None:
    """Raise if ``MPI_COMM_WORLD`` is not as large as the launcher promised.

    Does not block and does not communicate: every rank can decide alone,
    because every rank received the same launcher variables.

    Args:
        world_size: ``MPI.COMM_WORLD.Get_size()`` after ``MPI_Init``.
        environ: The environment as the process received it (see
            :func:`expected_world_size`).

    Raises:
        RuntimeError: If the sizes differ. The message names the launcher,
            both counts, what most likely happened and the command to use
            instead, e.g. ``srun started 4 tasks but MPI_COMM_WORLD has 1
            rank: each task initialized MPI as a singleton; launch with
            `srun --mpi=pmix …` …``.
        ValueError: If a launcher variable is malformed.

    """
    expected = expected_world_size(environ)
    if expected is None:
        return
    count, source = expected
    if count == world_size:
        return
    have = f"MPI_COMM_WORLD has {_plural(world_size, 'rank')}"
    if source == EXPECT_NPROCS_VAR:
        raise RuntimeError(
            f"{EXPECT_NPROCS_VAR} expects {_plural(count, 'process')}"
            f" but {have}; launch {count} processes, e.g. with"
            f" `mpimesh run -n {count} …`, or set {EXPECT_NPROCS_VAR}=0"
            " to skip this check"
        )
    srun = source in _SLURM_VARS or (
        # srun --mpi=pmi2 sets PMI_SIZE to the step's task count
        source == "PMI_SIZE"
        and environ.get("SLURM_STEP_ID") is not None
        and environ.get("SLURM_STEP_NUM_TASKS") == str(count)
    )
    if srun:
        what = f"srun started {_plural(count, 'task')} ({source}={count})"
        unit, culprit = "task", "srun's --mpi plugin"
        fix = _SRUN_FIX.format(n=count)
    else:
        who = "Open MPI's mpiexec" if source == "OMPI_COMM_WORLD_SIZE" else "the launcher"
        what = f"{who} started {_plural(count, 'process')} ({source}={count})"
        unit, culprit = "process", "this launcher"
        fix = _MPIMESH_RUN_FIX.format(n=count)
    if world_size == 1:
        cause = (
            f"each {unit} initialized MPI as a singleton, so {culprit}"
            " does not match the MPI library mpi4py loads"
        )
    else:
        cause = f"{culprit} and the MPI library mpi4py loads disagree on the world"
    raise RuntimeError(f"{what} but {have}: {cause}; {fix}")
