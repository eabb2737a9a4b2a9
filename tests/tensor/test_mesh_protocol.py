"""The process mesh as the tensor engine names it: ProcMesh's public methods fit its protocol (pure)."""

from __future__ import annotations

from mpimesh.proc_mesh import ProcMesh
from mpimesh.shape import Shape
from mpimesh.tensor._mesh import ProcMesh as EngineProcMesh

KEY = (0, 0, 7)
ADDRS = ((0, 1), (0, 2), (1, 0), (1, 1))
HOSTS = ("a", "a", "b", "b")


def grid() -> ProcMesh:
    return ProcMesh(Shape.row_major(("hosts", "gpus"), (2, 2)), ADDRS, HOSTS, key=KEY)


def test_a_proc_mesh_and_its_slices_are_what_the_engine_calls_a_mesh() -> None:
    """The engine checks meshes against its protocol: a ProcMesh and a slice pass, the protocol's members exist."""
    procs = grid()
    assert isinstance(procs, EngineProcMesh)
    assert isinstance(procs.slice(hosts=1), EngineProcMesh)
    assert isinstance(procs.base_mesh(), EngineProcMesh)


def test_a_view_says_its_processes_in_rank_order() -> None:
    """A slice's addresses and hosts are those of its processes, in its rank order; its id is the mesh's."""
    view = grid().slice(gpus=1)
    assert view.mesh_id == KEY
    assert view.addresses == [(0, 2), (1, 1)]
    assert view.hostnames == ["a", "b"]
    assert view.view_shape.labels == ("hosts",)
    assert list(view.view_shape.ranks()) == [1, 3]


def test_the_same_view_is_the_same_processes_in_the_same_shape() -> None:
    """Equal slices of one mesh (or copies) are the same view; another slice, or another mesh, is not."""
    procs = grid()
    assert procs.same_view(procs)
    assert procs.slice(hosts=0).same_view(grid().slice(hosts=0))
    assert not procs.slice(hosts=0).same_view(procs.slice(hosts=1))
    other = ProcMesh(procs.view_shape, ADDRS, HOSTS, key=(0, 0, 8))
    assert not procs.same_view(other)


def test_the_base_mesh_numbers_processes_as_every_view_does() -> None:
    """Rank i of base_mesh() is the process every view's shape numbers i, in one dimension ``rank``."""
    view = grid().slice(hosts=1)
    base = view.base_mesh()
    assert base.mesh_id == KEY
    assert base.view_shape.labels == ("rank",)
    assert base.addresses == list(ADDRS)
    assert [base.addresses[i] for i in view.view_shape.ranks()] == view.addresses
    assert not base.stopped
