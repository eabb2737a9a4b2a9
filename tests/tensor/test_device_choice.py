"""Which CUDA device a tensor-engine worker picks (pure: the environment and the counts are inputs)."""

from __future__ import annotations

import pytest

from mpimesh.tensor._device import LOCAL_RANK_VARIABLES, local_device


@pytest.mark.parametrize("variable", LOCAL_RANK_VARIABLES)
def test_each_launchers_local_rank_picks_its_device_modulo_the_count(variable: str) -> None:
    """Local rank 5 on a node of 4 GPUs: cuda:1; local rank 2: cuda:2."""
    assert local_device({variable: "5"}, 4, 0) == 1
    assert local_device({variable: "2"}, 4, 0) == 2


def test_open_mpis_variable_goes_first() -> None:
    """Several launchers' variables (srun inside mpirun's environment): Open MPI's, then MPICH's, then Slurm's."""
    assert local_device({"OMPI_COMM_WORLD_LOCAL_RANK": "3", "MPI_LOCALRANKID": "1", "SLURM_LOCALID": "2"}, 8, 0) == 3
    assert local_device({"MPI_LOCALRANKID": "1", "SLURM_LOCALID": "2"}, 8, 0) == 1


@pytest.mark.parametrize("count", [0, 1])
def test_one_device_or_none_is_left_as_it_is(count: int) -> None:
    assert local_device({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}, count, 0) is None


def test_a_device_chosen_by_the_user_is_kept() -> None:
    """CUDA_VISIBLE_DEVICES naming one device, or a current device a bootstrap set: no choice made."""
    environ = {"OMPI_COMM_WORLD_LOCAL_RANK": "3"}
    assert local_device({**environ, "CUDA_VISIBLE_DEVICES": "6"}, 4, 0) is None
    assert local_device(environ, 4, 2) is None
    assert local_device({**environ, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 4, 0) == 3  # several named: still chosen


@pytest.mark.parametrize("environ", [{}, {"SLURM_LOCALID": ""}, {"OMPI_COMM_WORLD_LOCAL_RANK": "x"}])
def test_without_a_local_rank_nothing_is_chosen(environ: dict[str, str]) -> None:
    assert local_device(environ, 4, 0) is None
