"""Shared fixtures: meshes for runtime tests, strictness for all.

Runtime tests (marker ``mesh``) run under the real entry point,
``mpiexec -n N python -m mpimesh -m pytest -m mesh``: rank 0 runs pytest as
the controller and ranks 1..N-1 serve.  Under plain ``pytest`` they still
run: the controller is embedded and spawns its workers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

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


class Faults:
    """An ``mpimesh.unhandled_fault_hook`` that records failures, so the controller keeps running."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.failures: list[Any] = []

    def __call__(self, failure: Any) -> None:
        with self._cond:
            self.failures.append(failure)
            self._cond.notify_all()

    def wait_for(self, mesh_name: str, count: int = 1, timeout: float = 30.0) -> list[Any]:
        """The failures of ``mesh_name`` once there are ``count`` (bounded by ``timeout``)."""
        def of() -> list[Any]:
            return [f for f in self.failures if f.mesh_name == mesh_name]

        with self._cond:
            self._cond.wait_for(lambda: len(of()) >= count, timeout)
            return of()


@pytest.fixture
def faults() -> Iterator[Faults]:
    """Failures that reach the controller during the test, recorded instead of ending the job."""
    import mpimesh

    recorder = Faults()
    saved = mpimesh.unhandled_fault_hook
    mpimesh.unhandled_fault_hook = recorder
    try:
        yield recorder
    finally:
        mpimesh.unhandled_fault_hook = saved


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write ``<junitxml>.done``: pytest's exit status, the proof that the run went to its end.

    A JUnit report alone is not that proof: an interrupted run writes one
    too, with the tests done so far (a job whose launcher lost a host's
    daemon ends the controller's pytest with a KeyboardInterrupt, and
    ``prterun`` still exits 0).  ``scripts/test.sh`` and ``.ci/hosts-tests.sh``
    read the status from here.
    """
    xmlpath = session.config.option.xmlpath
    if xmlpath:
        with open(f"{xmlpath}.done", "w") as done:
            done.write(f"{int(exitstatus)}\n")
