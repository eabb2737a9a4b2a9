"""Shared fixtures: meshes for runtime tests, strictness for all.

Runtime tests (marker ``mesh``) run under the real entry point,
``mpiexec -n N python -m mpimesh -m pytest -m mesh``: rank 0 runs pytest as
the controller and ranks 1..N-1 serve.  Under plain ``pytest`` they still
run: the controller is embedded and spawns its workers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def world_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


#: Modules whose tests change the worker processes themselves, not only the
#: actors on them: they get process meshes of their own (and may stop the
#: shared ones: those are spawned anew for the next module).
OWN_MESHES = {
    "test_monarch_names": "shutdown_context() stops every mesh this process spawned",
    "test_engine": "the tensor engine's client lives with the mesh; tests count the workers' tensors",
    "test_comm_from_group": "communicators made from the processes' group stay with them",
    "test_spmd": "sets up a torch.distributed world in the worker processes",
}


class _Shared:
    """The session's mesh of ``gpus`` spawned workers, for the modules not in :data:`OWN_MESHES`.

    A spawn costs 1-2.5 s (18 module meshes at ``-n 1``).  Shared only at
    ``-n 1``, where every process is spawned: with a launch pool (``-n 2``
    and up) each module's mesh is its own and stopped after it, as before,
    so that every test finds the pool's ranks free or taken as it did (a
    mesh kept for the session would hold them, or turn a pool mesh into a
    spawned one for the modules after it).  A module that leaves a shared
    mesh stopped, or with a process that is dead or does not answer, fails
    at its end (:func:`_shared_meshes_outlive_each_module`) and the next
    module gets fresh processes: no module sees another's dead workers.
    """

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.mesh: Any = None

    def module_mesh(self) -> Iterator[object]:
        """The shared mesh (spawned on first use) at ``-n 1``; with a launch pool, the module's own mesh."""
        from mpimesh import this_host

        if world_size() > 1:
            mesh: Any = this_host().spawn_procs(per_host={"gpus": self.gpus})
            yield mesh
            mesh.stop().get(30)
            return
        if self.mesh is None:
            self.mesh = this_host().spawn_procs(per_host={"gpus": self.gpus})
        yield self.mesh

    def broken(self) -> str:
        """Why the mesh can serve no other module ("" when it can); a broken mesh is let go."""
        mesh = self.mesh
        if mesh is None:
            return ""
        why = "stopped it" if mesh.stopped else ""
        if not why:
            # A call to every process finds a death the runtime has not heard of yet, at once.
            from shared_mesh_probe import Probe

            probe = mesh.spawn("shared_mesh_probe", Probe)
            try:
                probe.pid.call().get(30)
                probe.stop().get(30)
            except Exception as exc:
                why = f"left a process that does not answer: {type(exc).__name__}: {exc}"
        if not why and mesh.dead():
            why = f"left processes dead: {mesh.dead()}"
        if why:
            self.mesh = None
            if not mesh.stopped:
                mesh.stop().get(30)
        return why


@pytest.fixture(scope="session")
def _shared_meshes() -> Iterator[dict[int, _Shared]]:
    shared = {2: _Shared(2), 1: _Shared(1)}
    yield shared
    for one in shared.values():
        if one.mesh is not None and not one.mesh.stopped:
            one.mesh.stop().get(30)


@pytest.fixture(scope="module", autouse=True)
def _shared_meshes_outlive_each_module(request: pytest.FixtureRequest,
                                       _shared_meshes: dict[int, _Shared]) -> Iterator[None]:
    """After each module: a shared mesh it stopped or left with a dead process fails it (unless in OWN_MESHES)."""
    yield
    module = request.module.__name__
    broken = [f"gpus={gpus}: {why}" for gpus, shared in _shared_meshes.items() if (why := shared.broken())]
    if broken and module.rpartition(".")[2] not in OWN_MESHES:
        pytest.fail(f"{module} shares the session's process meshes and {'; '.join(broken)}; "
                    "give it meshes of its own (tests/conftest.py, OWN_MESHES)")


def _module_mesh(request: pytest.FixtureRequest, shared: dict[int, _Shared], gpus: int) -> Iterator[object]:
    if request.module.__name__.rpartition(".")[2] not in OWN_MESHES:
        yield from shared[gpus].module_mesh()
        return
    from mpimesh import this_host

    mesh = this_host().spawn_procs(per_host={"gpus": gpus})
    yield mesh
    mesh.stop().get(30)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def procs(request: pytest.FixtureRequest, _shared_meshes: dict[int, _Shared]) -> Iterator[object]:
    """A mesh of two worker processes, ``gpus=2`` (spawned ones are shared by the session: :class:`_Shared`)."""
    yield from _module_mesh(request, _shared_meshes, 2)


@pytest.fixture(scope="module")
def one_proc(request: pytest.FixtureRequest, _shared_meshes: dict[int, _Shared]) -> Iterator[object]:
    """A mesh of one worker process (spawned ones are shared by the session: :class:`_Shared`)."""
    yield from _module_mesh(request, _shared_meshes, 1)


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


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m mesh`` alone, a test file that marks nothing ``mesh`` is not imported.

    Its tests would all be deselected; importing them (torch, the examples'
    helpers) cost each runtime run 3-4 s, and CI has ten of them.  A mesh
    test is marked in its own file (``pytest.mark.mesh``, as a decorator,
    in ``pytestmark`` or in a parameter's marks), so the text says it.
    """
    if (config.getoption("markexpr") != "mesh" or collection_path.suffix != ".py"
            or not collection_path.name.startswith("test_")):
        return None
    return True if "mark.mesh" not in collection_path.read_text() else None


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
