"""Shared fixtures: meshes for runtime tests, strictness for all.

Runtime tests (marker ``mesh``) run under the real entry point,
``mpiexec -n N python -m mpimesh -m pytest -m mesh``: rank 0 runs pytest as
the controller and ranks 1..N-1 serve.  Under plain ``pytest`` they still
run: the controller is embedded and spawns its workers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def world_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


@pytest.fixture(scope="module")
def procs() -> Iterator[object]:
    """A mesh of two worker processes, ``gpus=2``, stopped after the module."""
    from mpimesh import this_host

    mesh = this_host().spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(30)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def one_proc() -> Iterator[object]:
    """A mesh of one worker process, stopped after the module."""
    from mpimesh import this_host

    mesh = this_host().spawn_procs(per_host={"gpus": 1})
    yield mesh
    mesh.stop().get(30)  # type: ignore[attr-defined]
