"""Host meshes: the job's hosts, this host, and processes placed host by host.

These run under the mesh suite on one host and across simulated hosts
(``.ci/hosts-tests.sh``): every assertion holds for any number of hosts.
"""

from __future__ import annotations

import pickle

import pytest
from mpitest import spawning

from mpimesh import Actor, HostMesh, current_rank, endpoint, host_mesh, this_host
from mpimesh._core.current import current

pytestmark = pytest.mark.mesh


class Placed(Actor):
    @endpoint
    def where(self) -> tuple[str, dict[str, int]]:
        from mpi4py import MPI

        return MPI.Get_processor_name(), dict(current_rank())

    @endpoint
    def job_hosts(self) -> list[str]:
        return host_mesh().hostnames

    @endpoint
    def spawn_here(self) -> list[str]:
        """Processes on this actor's own host, made from inside an actor (asked of the controller)."""
        from mpi4py import MPI

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            name = procs.spawn("inner", Placed).where.call_one().get(60)[0]
        finally:
            procs.stop().get(60)
        return [MPI.Get_processor_name(), name]


def my_host() -> str:
    from mpi4py import MPI

    return MPI.Get_processor_name()


def test_host_mesh_is_the_jobs_hosts_controller_first() -> None:
    hosts = host_mesh()
    assert isinstance(hosts, HostMesh)
    assert hosts.sizes == {"hosts": len(hosts.hostnames)}
    assert hosts.hostnames[0] == my_host()
    assert len(set(hosts.hostnames)) == len(hosts.hostnames)
    assert repr(hosts) == f"HostMesh(hosts={len(hosts)})"
    assert hosts.slice(hosts=0).hostnames == [my_host()]


def test_this_host_has_no_dimension() -> None:
    here = this_host()
    assert here.sizes == {} and len(here) == 1
    assert here.hostnames == [my_host()]
    assert repr(here) == f"HostMesh({my_host()!r})"
    copy = pickle.loads(pickle.dumps(here))
    assert copy.hostnames == here.hostnames and copy.sizes == {}


def test_this_host_spawns_on_this_host_with_local_ranks() -> None:
    """Monarch's shape: sizes gpus=3, vm.item(gpus=2) works, all on the caller's host."""
    with spawning():
        procs = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        vm = procs.spawn("placed", Placed).where.call().get(60)
        assert vm.sizes == {"gpus": 3}
        assert vm.item(gpus=2) == (my_host(), {"gpus": 2})
        assert [host for host, _ in vm.values()] == [my_host()] * 3
        assert procs.host_mesh.hostnames == [my_host()]
    finally:
        procs.stop().get(60)


def test_host_mesh_spawn_procs_places_each_row_on_its_host() -> None:
    """hosts=H, gpus=2: row h runs on host h, gpus is the index on that host."""
    hosts = host_mesh()
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    try:
        assert procs.sizes == {"hosts": len(hosts), "gpus": 2}
        vm = procs.spawn("placed", Placed).where.call().get(60)
        for point, (host, rank) in vm.items():
            assert host == hosts.hostnames[point["hosts"]], (dict(point), host)
            assert rank == dict(point)
        assert procs.host_mesh.hostnames == hosts.hostnames
        last = len(hosts) - 1
        one_host = procs.slice(hosts=last)
        assert one_host.sizes == {"gpus": 2}
        names = one_host.spawn("again", Placed).where.call().get(60).values()
        assert {host for host, _ in names} == {hosts.hostnames[last]}
    finally:
        procs.stop().get(60)


def free_pool(host: str) -> int:
    """Free launch-pool ranks on ``host``."""
    procs = current().role.procs.values()  # type: ignore[attr-defined]
    return sum(p.addr[0] == 0 and p.host == host and not p.allocated and not p.dead for p in procs)


def test_a_second_mesh_spawns_where_the_pool_has_no_room() -> None:
    """With every pool rank taken, more processes are spawned, still host by host, in one spawn."""
    hosts = host_mesh()
    taken = [hosts.slice(hosts=i).spawn_procs(per_host={"gpus": free_pool(h)})
             for i, h in enumerate(hosts.hostnames) if free_pool(h)]
    try:
        assert all(free_pool(h) == 0 for h in hosts.hostnames)
        with spawning():
            second = hosts.spawn_procs(per_host={"gpus": 1})
        try:
            assert all(addr[0] != 0 for addr in second._addrs)
            assert len({addr[0] for addr in second._addrs}) == 1  # one MPI_Comm_spawn_multiple
            names = second.spawn("placed", Placed).where.call().get(60)
            assert [host for host, _ in names.values()] == hosts.hostnames
        finally:
            second.stop().get(60)
    finally:
        for procs in taken:
            procs.stop().get(60)


def test_slice_of_host_mesh_spawns_only_there() -> None:
    hosts = host_mesh()
    last = hosts.slice(hosts=len(hosts) - 1)
    assert last.sizes == {}
    procs = last.spawn_procs(per_host={"gpus": 1})
    try:
        assert procs.sizes == {"gpus": 1}
        assert procs.spawn("placed", Placed).where.call_one().get(60)[0] == hosts.hostnames[-1]
    finally:
        procs.stop().get(60)


def test_an_actor_sees_the_same_hosts_and_spawns_on_its_own() -> None:
    hosts = host_mesh()
    procs = hosts.slice(hosts=len(hosts) - 1).spawn_procs()
    try:
        placed = procs.spawn("placed", Placed)
        assert placed.job_hosts.call_one().get(60) == hosts.hostnames
        with spawning():
            outer, inner = placed.spawn_here.call_one().get(120)
        assert outer == inner == hosts.hostnames[-1]
    finally:
        procs.stop().get(60)
