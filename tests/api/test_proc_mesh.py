"""Process meshes: allocation from the pool or by spawning, shapes, stop."""

from __future__ import annotations

import os

import pytest
from mpitest import spawning

from mpimesh import Actor, ProcMesh, endpoint, host_mesh, this_host, this_proc
from mpimesh._core.current import current
from mpimesh._core.owners import Kind

pytestmark = pytest.mark.mesh


class Where(Actor):
    @endpoint
    def where(self) -> tuple[int, str | None]:
        return os.getpid(), os.environ.get("MPIMESH_TEST_BOOT")


def test_spawn_procs_shape() -> None:
    """this_host() has no dimension (as in Monarch): the processes' are per_host's."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        assert isinstance(procs, ProcMesh)
        assert procs.sizes == {"gpus": 2}
        assert len(procs) == 2 and procs.size("gpus") == 2
        assert repr(procs) == "ProcMesh(gpus=2)"
        flat = procs.flatten("rank")
        assert flat.sizes == {"rank": 2}
        assert procs.rename(gpus="workers").sizes == {"workers": 2}
        assert procs.split(gpus=("a", "b"), a=2).sizes == {"a": 2, "b": 1}
    finally:
        procs.stop().get(30)


def free_pool_here() -> int:
    """Free launch-pool ranks on the controller's host."""
    rt = current()
    procs = rt.role.procs.values()  # type: ignore[attr-defined]
    return sum(p.addr[0] == 0 and p.host == rt.host and not p.allocated and not p.dead for p in procs)


def test_pool_first_then_spawn() -> None:
    """On its host, the launch pool serves first; what it lacks is spawned there, in the same mesh."""
    pool = free_pool_here()
    if pool:
        procs = this_host().spawn_procs(per_host={"gpus": pool})
        assert {addr[0] for addr in procs._addrs} == {0}
        procs.stop().get(30)
    with spawning():
        procs = this_host().spawn_procs(per_host={"gpus": pool + 1})
    try:
        assert [addr[0] == 0 for addr in procs._addrs] == [True] * pool + [False]
        pids = procs.spawn("where", Where).where.call().get(30).values()
        assert len({pid for pid, _ in pids}) == pool + 1
    finally:
        procs.stop().get(30)


@pytest.mark.mpi(min_size=2)
def test_stopped_pool_ranks_are_reused() -> None:
    """After stop(), the same launch-pool ranks serve the next mesh."""
    first = this_host().spawn_procs(per_host={"gpus": 1})
    addrs = first._addrs
    pid = first.spawn("w", Where).where.call_one().get(30)[0]
    first.stop().get(30)
    second = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        assert second._addrs == addrs
        assert second.spawn("w", Where).where.call_one().get(30)[0] == pid
    finally:
        second.stop().get(30)


def test_bootstrap_runs_before_actors() -> None:
    """spawn_procs(bootstrap=fn) runs fn on every new process first."""

    def boot() -> None:
        os.environ["MPIMESH_TEST_BOOT"] = "booted"

    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=boot)
    try:
        assert [env for _, env in procs.spawn("w", Where).where.call().get(30).values()] == ["booted", "booted"]
    finally:
        procs.stop().get(30)


def test_this_proc_is_the_caller() -> None:
    """this_proc() is the calling process as a 0-dimensional mesh."""
    here = this_proc()
    assert len(here) == 1 and here.sizes == {}
    mesh = here.spawn("w", Where)
    assert mesh.where.call_one().get(10)[0] == os.getpid()  # type: ignore[attr-defined]
    mesh.stop().get(10)  # type: ignore[attr-defined]


def test_per_host_validation() -> None:
    """Malformed per_host raises at once with the fix."""
    host = this_host()
    with pytest.raises(
        ValueError,
        match=r"^per_host\['gpus'\] must be a positive int, got 0; "
        r"e.g. per_host=\{'gpus': 4\}$",
    ):
        host.spawn_procs(per_host={"gpus": 0})
    with pytest.raises(TypeError, match=r"^per_host keys must be dimension names, got 3; "):
        host.spawn_procs(per_host={3: 1})  # type: ignore[dict-item]
    with pytest.raises(
        ValueError,
        match=r"^per_host dimension 'hosts' clashes with a dimension of HostMesh\(hosts=\d+\); "
        r"choose another name$",
    ):
        host_mesh().spawn_procs(per_host={"hosts": 2})
    with pytest.raises(NotImplementedError, match=r"^spawn_procs\(proc_bind=...\) is not supported by mpimesh; "):
        host.spawn_procs(per_host={"gpus": 1}, proc_bind=[{"cpus": "0"}])


def test_references_cannot_stop_processes() -> None:
    """A slice of a process mesh cannot stop the processes."""
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        with pytest.raises(RuntimeError, match=r"^cannot stop ProcMesh\(\): it is a reference"):
            procs.slice(gpus=0).stop()
    finally:
        procs.stop().get(30)
    # Monarch's phrase, which its tests and users match on, inside mpimesh's fuller text
    with pytest.raises(
        RuntimeError,
        match=r"^cannot spawn on ProcMesh\(gpus=2\): `ProcMesh` has already been stopped; "
        r"create new processes with spawn_procs\(\)$",
    ):
        procs.spawn("late", Where)


def test_actor_spawns_its_own_processes() -> None:
    """An actor can create processes (through the controller) and actors on them."""
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        parent = procs.spawn("parent", Parent)
        pids = parent.grow.call_one().get(60)  # type: ignore[attr-defined]
        assert len(set(pids)) == 2 and os.getpid() not in pids
    finally:
        procs.stop().get(30)


def test_stopping_processes_drops_their_actor_meshes_from_the_owner() -> None:
    """An actor that stopped processes it spawned keeps no actor mesh on them: its own stop sends nothing there.

    Kept, its stop sent STOP to processes that were gone (a spawned
    island's route with them) and waited out the cleanup bound (3 s).
    """
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        parent = procs.spawn("parent", Parent)
        assert parent.grow_and_count.call_one().get(60) == (1, 0)  # type: ignore[attr-defined]
    finally:
        procs.stop().get(30)


class Parent(Actor):
    @endpoint
    def grow(self) -> list[int]:
        children = this_host().spawn_procs(per_host={"kids": 2})
        pids = [pid for pid, _ in children.spawn("kid", Where).where.call().get(30).values()]
        children.stop().get(30)
        return pids

    @endpoint
    def grow_and_count(self) -> tuple[int, int]:
        children = this_host().spawn_procs(per_host={"kids": 2})
        children.spawn("kid", Where).where.call().get(30)
        before = len(current().owners.of_kind(Kind.ACTOR_MESH))
        children.stop().get(30)
        return before, len(current().owners.of_kind(Kind.ACTOR_MESH))


def test_a_process_that_said_bye_is_not_declared_dead_by_mpi() -> None:
    """ULFM reports the exit of a worker that skipped MPI_Finalize; after its BYE that is no death."""
    with spawning():
        procs = this_host().spawn_procs(per_host={"gpus": free_pool_here() + 1})
    spawned = [a for a in procs._addrs if a[0] != 0]
    procs.stop().get(30)
    rt = current()
    assert all(rt.role.procs[a].bye for a in spawned)  # type: ignore[attr-defined]
    rt.failures.mpi_failed(spawned, "MPI_ERR_PROC_FAILED: injected by the test")
    rt.failures.check_reported()
    assert not any(a in rt.dead for a in spawned)


def test_the_ownership_tree_follows_spawn_and_stop() -> None:
    """A process mesh is adopted by its maker when made, and stop() takes it out (issue 26)."""
    from mpimesh._core.owners import Kind

    owners = current().owners
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    key = procs._key
    node = owners.get(key)
    assert node is not None and node.kind is Kind.PROC_MESH and node.owner is owners.root
    mesh = procs.spawn("where", Where)
    mesh_key = mesh._ref.key  # type: ignore[attr-defined]
    assert owners.get(mesh_key).owner is owners.root
    mesh.stop().get(60)  # type: ignore[attr-defined]
    assert owners.get(mesh_key) is None
    procs.stop().get(60)
    assert owners.get(key) is None
