"""Mesh handles as values: what a pickled or sliced mesh keeps (pure: no runtime, no MPI)."""

from __future__ import annotations

import pickle
import sys

import pytest

from mpimesh import ActorMesh, Port, Shape, context
from mpimesh._core.calls import MeshRef
from mpimesh.actor import EndpointInfo


def mesh() -> ActorMesh[object]:
    ref = MeshRef((0, 0, 7), Shape.row_major(("hosts", "gpus"), (1, 2)), ((0, 1), (0, 2)))
    info = EndpointInfo("step", False, False, None)
    return ActorMesh(ref=ref, name="trainers", class_name="Trainer", endpoints={"step": info},
                     methods=frozenset({"helper"}), owned=True)


def test_an_actor_mesh_pickles_as_a_reference() -> None:
    """A pickled mesh keeps its name, shape and actors, and can call them, but does not own them."""
    copy = pickle.loads(pickle.dumps(mesh()))
    assert repr(copy) == "ActorMesh('trainers', Trainer, hosts=1, gpus=2)"
    assert copy._ref.key == (0, 0, 7) and copy._ref.targets == [(0, 1), (0, 2)]
    assert repr(copy.step) == "<Endpoint trainers.step of ActorMesh('trainers', Trainer, hosts=1, gpus=2)>"
    with pytest.raises(RuntimeError, match=r"^cannot stop ActorMesh\('trainers', Trainer, hosts=1, gpus=2\): it is a "):
        copy.stop()


def test_a_slice_addresses_its_actors_with_points_of_its_own() -> None:
    """A slice's handle reaches the sliced actors, with message points relative to the slice."""
    one = mesh().slice(gpus=1)
    assert repr(one) == "ActorMesh('trainers', Trainer, hosts=1)"
    assert one._ref.targets == [(0, 2)]
    assert one._ref.point(0) == (0, ("hosts",), (1,))


def test_a_port_is_a_public_value() -> None:
    """Port pickles by value under its public name; it lives in _core so actors can build it."""
    port: Port[int] = Port(((0, 3), 12), 2)
    assert type(port).__module__ == "mpimesh"
    copy = pickle.loads(pickle.dumps(port))
    assert repr(copy) == "Port(0.3#12)" and copy._index == 2


def test_the_root_context_knows_its_process_mesh_through_proc_mesh() -> None:
    """context imports no mesh module: proc_mesh installs this_proc() into it."""
    import mpimesh.proc_mesh

    # the module: `mpimesh.context` is the function the package re-exports under that name
    assert sys.modules["mpimesh.context"]._this_proc is mpimesh.proc_mesh.this_proc
    assert context().actor_instance.name == "client"
