"""The ownership tree (``_core.owners``): adoption, bottom-up closes within a bound, re-adoption, the job's end.

Pure tests, without MPI: the closes are plain callables that record their
order, and stops are standard futures.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any

import pytest

from mpimesh._core.owners import Kind, Owners


def recorder(log: list[str], name: str, stop: Future[Any] | None = None) -> Any:
    def close(reason: str) -> Future[Any] | None:
        log.append(f"{name}: {reason}")
        return stop

    return close


class FakeActor:
    actor_id = "worker[0]@0.1"


def test_close_is_bottom_up_and_last_adopted_first() -> None:
    tree = Owners()
    log: list[str] = []
    procs = tree.adopt(tree.root, Kind.PROC_MESH, "procs", recorder(log, "procs"), key="p")
    tree.adopt(procs, Kind.ATTACHED, "client", recorder(log, "client"))
    tree.adopt(tree.root, Kind.ACTOR_MESH, "mesh", recorder(log, "mesh"), key="m")
    assert tree.root.close("done", 1.0) == []
    # the actor mesh (adopted last) first, then the process mesh after what it owns
    assert log == ["mesh: done", "client: done", "procs: done"]
    assert tree.get("p") is None and tree.get("m") is None and not tree.root.children


def test_close_waits_for_stops_within_one_bound() -> None:
    tree = Owners()
    log: list[str] = []
    late: Future[Any] = Future()
    done: Future[Any] = Future()
    done.set_result(None)
    tree.adopt(tree.root, Kind.ACTOR_MESH, "slow", recorder(log, "slow", late))
    tree.adopt(tree.root, Kind.ACTOR_MESH, "quick", recorder(log, "quick", done))
    start = time.monotonic()
    errors = tree.root.close("bye", 0.2)
    assert time.monotonic() - start < 2.0
    assert [type(e) for e in errors] == [TimeoutError]
    assert log == ["quick: bye", "slow: bye"]


def test_a_close_that_raises_does_not_stop_the_others() -> None:
    tree = Owners()
    log: list[str] = []

    def broken(reason: str) -> None:
        raise RuntimeError("no")

    tree.adopt(tree.root, Kind.PROC_MESH, "a", recorder(log, "a"))
    tree.adopt(tree.root, Kind.PROC_MESH, "b", broken)
    errors = tree.root.close("x", 1.0)
    assert [str(e) for e in errors] == ["no"] and log == ["a: x"]
    with pytest.raises(RuntimeError):
        tree.adopt(tree.root, Kind.PROC_MESH, "c", broken)
        tree.root.start_close("x")


def test_a_thing_stopped_directly_leaves_the_tree_and_closes_what_it_owns() -> None:
    tree = Owners()
    log: list[str] = []
    tree.adopt(tree.root, Kind.PROC_MESH, "procs", recorder(log, "procs"), key="p")
    client = tree.attach("p", "tensor", lambda: "client-object", lambda obj: log.append(f"freed {obj}"))
    assert client == "client-object"
    assert tree.attach("p", "tensor", lambda: "another", None) == "client-object"  # made once
    node = tree.take("p")  # ProcMesh.stop: the node first, then what it owns, not itself
    assert node is not None and node.close("stop", 1.0, itself=False) == []
    assert log == ["freed client-object"]
    assert tree.take("p") is None and not tree.root.children
    with pytest.raises(LookupError):
        tree.attach("p", "tensor", lambda: "again", None)


def test_attach_to_a_mesh_not_in_the_tree_is_kept_by_the_root() -> None:
    tree = Owners()
    tree.attach("received", "tensor", lambda: 1, None)
    assert [n.kind for n in tree.root.children] == [Kind.ATTACHED]


def test_an_actor_closes_what_it_made_and_its_owner_is_found() -> None:
    tree = Owners()
    log: list[str] = []
    actor = FakeActor()
    mine = tree.owner_of(actor)
    assert tree.owner_of(actor) is mine and tree.owner_of(None) is tree.root
    mesh = tree.adopt(mine, Kind.ACTOR_MESH, "inner", recorder(log, "inner"), key="k")
    assert tree.actor_of(mesh) is actor
    tree.adopt(tree.root, Kind.ACTOR_MESH, "other", recorder(log, "other"))
    assert tree.close_actor(actor, "its owner stopped", 1.0) == []
    assert log == ["inner: its owner stopped"] and tree.get(actor) is None
    assert tree.close_actor(actor, "again", 1.0) == []


def test_readopt_moves_a_subtree() -> None:
    tree = Owners()
    log: list[str] = []
    old = tree.owner_of(FakeActor())
    new = tree.owner_of(FakeActor())
    mesh = tree.adopt(old, Kind.ACTOR_MESH, "m", recorder(log, "m"), key="m")
    tree.readopt(mesh, new)
    assert tree.actor_of(mesh) is new.key and mesh not in old.children
    old.close("old", 1.0)
    assert log == []
    new.close("new", 1.0)
    assert log == ["m: new"]


def test_end_of_job_runs_only_local_closes() -> None:
    tree = Owners()
    log: list[str] = []
    procs = tree.adopt(tree.root, Kind.PROC_MESH, "procs", recorder(log, "procs"), key="p")
    tree.adopt(procs, Kind.ATTACHED, "client", recorder(log, "client"))
    tree.adopt(tree.root, Kind.CHANNEL, "channel", recorder(log, "channel"))
    tree.adopt(tree.root, Kind.ACTOR_MESH, "mesh", recorder(log, "mesh"))
    tree.end()
    assert log == ["channel: the job ends", "client: the job ends"]
    # the meshes stay: a failure found while the job ends still finds its owner
    assert [n.name for n in tree.root.children] == ["procs", "mesh"] and tree.get("p") is procs


def test_owner_of_is_one_node_across_threads() -> None:
    tree = Owners()
    actor = FakeActor()
    nodes: list[Any] = []
    threads = [threading.Thread(target=lambda: nodes.append(tree.owner_of(actor))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(node is nodes[0] for node in nodes) and len(tree.root.children) == 1



class Owner:
    """Stands for an actor's user object: the actor's frames hold it while it stops what it owns."""


def test_the_errors_of_a_close_keep_no_cycle_through_the_closing_frames() -> None:
    """A close's error is kept without its traceback, which held the frames that closed.

    Kept with it, the list of errors made a cycle through the stopping
    actor's frames, which hold its user's object: the object was freed at
    the next cycle collection instead of when the actor stopped.
    """
    tree = Owners()
    owner = FakeActor()
    timed_out: Future[Any] = Future()
    failed: Future[Any] = Future()
    try:
        raise KeyError("the cause")
    except KeyError as cause:
        error = RuntimeError("the stop failed")
        error.__cause__ = cause
        failed.set_exception(error)

    def broken(reason: str) -> None:
        raise ValueError("the close raised")

    node = tree.owner_of(owner)
    tree.adopt(node, Kind.ACTOR_MESH, "late", recorder([], "late", timed_out))
    tree.adopt(node, Kind.ACTOR_MESH, "failed", recorder([], "failed", failed))
    tree.adopt(node, Kind.PROC_MESH, "broken", broken)

    def stopping(obj: Owner) -> list[str]:
        held = [obj]  # as the actor's frames hold its object while it closes what it owns
        errors = tree.close_actor(owner, "stop", 0.01)
        assert held and all(e.__traceback__ is None for e in errors)
        return sorted(type(e).__name__ for e in errors)

    obj = Owner()
    gone = weakref.ref(obj)
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # only reference counts free the object now
    try:
        assert stopping(obj) == ["RuntimeError", "TimeoutError", "ValueError"]
        del obj
        assert gone() is None, "a cycle keeps the owner's object"
    finally:
        if enabled:
            gc.enable()
