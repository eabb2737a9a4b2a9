"""Tests for mpimesh._launch.world_check: the world size must match the launcher's count.

Pure: no MPI is initialized. The environments below are the launcher
variables measured on this project's machine (Slurm 22.05, PyPI Open MPI
5.0.11, PyPI MPICH 5.0.2), trimmed to what the check reads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpimesh._launch.world_check import check_world_size, expected_world_size

# ---------------------------------------------------------------------------
# Environments as the launchers set them (measured, see module docstring).

SRUN_PMIX_4 = {  # srun --mpi=pmix -n 4 (Open MPI forms one world)
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NPROCS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_PROCID": "1",
    "PMIX_RANK": "1",
    "PMIX_NAMESPACE": "slurm.pmix.2.0",
}
SRUN_NONE_4 = {  # srun --mpi=none -n 4: four singletons that exit 0
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NPROCS": "4",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_PROCID": "2",
}
SRUN_PMI2_2 = {  # srun --mpi=pmi2 -n 2 (singletons with Open MPI 5)
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "PMI_SIZE": "2",
    "PMI_RANK": "0",
    "PMI_FD": "11",
}
BATCH_MPIRUN_3 = {  # Open MPI's mpirun -n 3 inside `sbatch --ntasks=3`
    "SLURM_JOB_ID": "5",
    "SLURM_NTASKS": "3",
    "SLURM_NPROCS": "3",
    "SLURM_PROCID": "0",
    "OMPI_COMM_WORLD_SIZE": "3",
    "OMPI_COMM_WORLD_RANK": "1",
    "PMIX_RANK": "1",
}
HYDRA_IN_STEP_4 = {  # MPICH mpiexec -n 4 in an allocation: proxies run in a 1-task srun step
    "SLURM_STEP_ID": "0",
    "SLURM_NTASKS": "1",
    "SLURM_STEP_NUM_TASKS": "1",
    "PMI_SIZE": "4",
    "PMI_RANK": "3",
    "HYDI_CONTROL_FD": "7",
}
PLAIN_PYTHON: dict[str, str] = {"PATH": "/usr/bin", "HOME": "/root"}


# ---------------------------------------------------------------------------
# expected_world_size


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (SRUN_PMIX_4, (4, "SLURM_STEP_NUM_TASKS")),
        (SRUN_NONE_4, (4, "SLURM_STEP_NUM_TASKS")),
        (SRUN_PMI2_2, (2, "PMI_SIZE")),
        (BATCH_MPIRUN_3, (3, "OMPI_COMM_WORLD_SIZE")),
        (HYDRA_IN_STEP_4, (4, "PMI_SIZE")),
        ({"MV2_COMM_WORLD_SIZE": "8"}, (8, "MV2_COMM_WORLD_SIZE")),
        ({"SLURM_STEP_ID": "1", "SLURM_NTASKS": "6"}, (6, "SLURM_NTASKS")),
        ({"SLURM_STEP_ID": "1", "SLURM_NPROCS": "5"}, (5, "SLURM_NPROCS")),
    ],
    ids=["srun-pmix", "srun-none", "srun-pmi2", "mpirun-in-batch", "hydra-in-step",
         "mvapich", "srun-ntasks", "srun-nprocs"],
)
def test_expected_world_size_reads_innermost_launcher(
    environ: dict[str, str], expected: tuple[int, str]
) -> None:
    """The count comes from the innermost launcher: mpiexec variables beat Slurm's."""
    assert expected_world_size(environ) == expected


@pytest.mark.parametrize(
    "environ",
    [
        PLAIN_PYTHON,
        # a batch script (no step): SLURM_NTASKS describes the allocation, not a launch
        {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4"},
        {"MPIMESH_EXPECT_NPROCS": "0", "OMPI_COMM_WORLD_SIZE": "4"},
    ],
    ids=["plain-python", "batch-step", "disabled"],
)
def test_expected_world_size_none_without_a_launch(environ: dict[str, str]) -> None:
    """No launcher variable (or MPIMESH_EXPECT_NPROCS=0) means nothing to check."""
    assert expected_world_size(environ) is None


def test_explicit_count_overrides_launchers() -> None:
    """MPIMESH_EXPECT_NPROCS wins over every launcher variable."""
    environ = {**SRUN_PMIX_4, "OMPI_COMM_WORLD_SIZE": "4", "MPIMESH_EXPECT_NPROCS": "9"}
    assert expected_world_size(environ) == (9, "MPIMESH_EXPECT_NPROCS")


def test_empty_explicit_count_is_ignored() -> None:
    """An empty MPIMESH_EXPECT_NPROCS is treated as unset."""
    assert expected_world_size({"MPIMESH_EXPECT_NPROCS": "", "PMI_SIZE": "2"}) == (2, "PMI_SIZE")


def test_malformed_explicit_count_raises() -> None:
    """A non-integer MPIMESH_EXPECT_NPROCS is a ValueError naming the variable and the fix."""
    with pytest.raises(
        ValueError,
        match=(
            r"^expecting a non-negative integer in MPIMESH_EXPECT_NPROCS, got 'four';"
            r" set it to the number of MPI processes, or to 0 to skip the world-size check$"
        ),
    ):
        expected_world_size({"MPIMESH_EXPECT_NPROCS": "four"})


@pytest.mark.parametrize("value", ["0", "-2", "x"])
def test_malformed_launcher_count_raises(value: str) -> None:
    """A launcher variable that is not a positive integer is a ValueError naming it."""
    with pytest.raises(
        ValueError,
        match=(
            rf"^expecting a positive integer in PMI_SIZE, got '{value}';"
            r" unset PMI_SIZE or fix the launcher that set it$"
        ),
    ):
        expected_world_size({"PMI_SIZE": value})


# ---------------------------------------------------------------------------
# check_world_size


@pytest.mark.parametrize(
    ("world_size", "environ"),
    [
        (4, SRUN_PMIX_4),
        (3, BATCH_MPIRUN_3),
        (4, HYDRA_IN_STEP_4),
        (1, PLAIN_PYTHON),
        (3, PLAIN_PYTHON),
        (1, {"MPIMESH_EXPECT_NPROCS": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4"}),
    ],
)
def test_check_passes_when_sizes_agree(world_size: int, environ: dict[str, str]) -> None:
    """A world as large as the launch (or no launch at all) passes silently."""
    check_world_size(world_size, environ)


def test_check_srun_singletons() -> None:
    """A plain srun with the wrong --mpi plugin is reported as singletons with the srun fix."""
    with pytest.raises(
        RuntimeError,
        match=(
            r"^srun started 4 tasks \(SLURM_STEP_NUM_TASKS=4\) but MPI_COMM_WORLD has 1 rank:"
            r" each task initialized MPI as a singleton, so srun's --mpi plugin does not match"
            r" the MPI library mpi4py loads; launch with `srun --mpi=pmix …` for Open MPI or"
            r" `srun --mpi=pmi2 …` for MPICH \(check `srun --mpi=list` and `mpimesh info`\),"
            r" or with `mpimesh run -n 4 …` inside the allocation$"
        ),
    ):
        check_world_size(1, SRUN_NONE_4)


def test_check_srun_pmi2_is_attributed_to_srun() -> None:
    """PMI_SIZE set by srun --mpi=pmi2 (equal to the step's tasks) still blames srun."""
    with pytest.raises(RuntimeError, match=r"^srun started 2 tasks \(PMI_SIZE=2\) but "):
        check_world_size(1, SRUN_PMI2_2)


def test_check_mismatched_mpiexec_singletons() -> None:
    """Open MPI's mpiexec running a Python whose mpi4py loads another MPI names mpimesh run."""
    with pytest.raises(
        RuntimeError,
        match=(
            r"^Open MPI's mpiexec started 3 processes \(OMPI_COMM_WORLD_SIZE=3\) but"
            r" MPI_COMM_WORLD has 1 rank: each process initialized MPI as a singleton, so"
            r" this launcher does not match the MPI library mpi4py loads; launch with"
            r" `mpimesh run -n 3 …`, which picks the matching mpiexec \(see `mpimesh info`\)$"
        ),
    ):
        check_world_size(1, BATCH_MPIRUN_3)


def test_check_hydra_singletons() -> None:
    """Hydra's PMI_SIZE outside a matching srun step is 'the launcher', not srun."""
    with pytest.raises(
        RuntimeError,
        match=r"^the launcher started 4 processes \(PMI_SIZE=4\) but MPI_COMM_WORLD has 1 rank: ",
    ):
        check_world_size(1, HYDRA_IN_STEP_4)


def test_check_partial_world() -> None:
    """A world of the wrong size other than 1 says the two disagree, not 'singleton'."""
    with pytest.raises(
        RuntimeError,
        match=(
            r"^srun started 4 tasks \(SLURM_STEP_NUM_TASKS=4\) but MPI_COMM_WORLD has 2 ranks:"
            r" srun's --mpi plugin and the MPI library mpi4py loads disagree on the world; "
        ),
    ):
        check_world_size(2, SRUN_NONE_4)


def test_check_explicit_count() -> None:
    """A mismatch with MPIMESH_EXPECT_NPROCS says how to launch or disable the check."""
    with pytest.raises(
        RuntimeError,
        match=(
            r"^MPIMESH_EXPECT_NPROCS expects 3 processes but MPI_COMM_WORLD has 1 rank;"
            r" launch 3 processes, e.g. with `mpimesh run -n 3 …`, or set"
            r" MPIMESH_EXPECT_NPROCS=0 to skip this check$"
        ),
    ):
        check_world_size(1, {"MPIMESH_EXPECT_NPROCS": "3"})


# ---------------------------------------------------------------------------
# The runtime entry point calls the check


@pytest.mark.subprocess
def test_entry_point_refuses_short_world(tmp_path: Path) -> None:
    """`python -m mpimesh` exits non-zero, with the message, when the world is too small.

    A plain interpreter is a singleton; MPIMESH_EXPECT_NPROCS=3 stands in for a
    launcher that promised three processes (safe for every MPI, unlike faking
    OMPI_COMM_WORLD_SIZE, which Open MPI itself reads).
    """
    script = tmp_path / "never.py"
    script.write_text("print('the script must not run')\n")
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_", "HYDI_", "SLURM_", "PRTE_"))
    }
    environ.update(
        MPIMESH_EXPECT_NPROCS="3",
        OMPI_MCA_btl=environ.get("OMPI_MCA_btl", "^ofi"),
        OMPI_MCA_mtl=environ.get("OMPI_MCA_mtl", "^ofi"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "mpimesh", str(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "the script must not run" not in done.stdout
    assert (
        "MPIMESH_EXPECT_NPROCS expects 3 processes but MPI_COMM_WORLD has 1 rank" in done.stderr
    )
