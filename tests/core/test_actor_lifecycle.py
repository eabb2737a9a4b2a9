"""An actor's lifecycle (``_core.actor_lifecycle``) and the countdown helpers (``mpimesh._waits``), without MPI.

What the phases mean to callers (refused calls, stops while ``__init__``
runs, failures) is tested through real actors in ``tests/api`` and
``tests/roles``; here, only the moves themselves.
"""

from __future__ import annotations

import threading
import time

import pytest

from mpimesh._core.actor_lifecycle import Lifecycle, Phase
from mpimesh._waits import Countdown, Deadline, when_all
from mpimesh.errors import MeshInternalError
from mpimesh.future import Future


def running() -> Lifecycle:
    life = Lifecycle("a[0]@0.1")
    assert life.begin_init() and life.init_returned()
    return life


def test_an_actor_runs_then_stops() -> None:
    life = running()
    assert life.phase is Phase.RUNNING
    life.stopping("stopped by client")
    life.stopped()
    assert life.phase is Phase.STOPPED and life.stop_reason == "stopped by client"
    assert life.why_not() == "is stopped"


def test_a_failed_actor_stays_failed_and_says_why() -> None:
    life = running()
    life.fail("ValueError in step: no")
    life.fail("RuntimeError in step: again")
    life.stopped()
    assert life.phase is Phase.FAILED
    assert life.why_not() == "is unhealthy with reason: RuntimeError in step: again"


def test_abandoned_before_or_during_init() -> None:
    before = Lifecycle("a[0]@0.1")
    assert before.abandon("stopped by client") and before.abandoned
    assert not before.begin_init()  # __init__ never runs
    during = Lifecycle("a[0]@0.1")
    assert during.begin_init() and during.abandon("shutdown")
    assert not during.init_returned()  # nor does the actor, once __init__ returns
    assert during.phase is Phase.STOPPED and during.stop_reason == "shutdown"
    assert not running().abandon("late")  # __init__ returned: a stop goes through the mailbox


def test_a_failure_after_the_stop_leaves_it_stopped() -> None:
    life = running()
    life.stopped()
    life.fail("unhandled failure of its mesh 'child'")
    assert life.phase is Phase.STOPPED and life.failure == "unhandled failure of its mesh 'child'"


def test_aborted_inside_init_stays_failed() -> None:
    life = Lifecycle("a[0]@0.1")
    life.begin_init()
    life.fail("aborted: bad state")
    assert life.init_returned()
    assert life.phase is Phase.FAILED


def test_an_impossible_move_is_an_internal_error() -> None:
    life = running()
    with pytest.raises(MeshInternalError, match=r"actor a\[0\]@0\.1 cannot go from running to initializing"):
        life.begin_init()


def test_countdown_runs_done_once_after_the_last() -> None:
    seen: list[int] = []
    countdown = Countdown(3, lambda: seen.append(1))
    threads = [threading.Thread(target=countdown.count) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [1]
    Countdown(0, lambda: seen.append(0))
    assert seen == [1, 0]


def test_when_all_waits_for_every_future_and_raises_the_first_in_order() -> None:
    a: Future[None] = Future("a")
    b: Future[None] = Future("b")
    c: Future[None] = Future("c")
    out = when_all([a, b, c], "all")
    c.set_exception(KeyError("c"))
    b.set_exception(ValueError("b"))
    assert not out.done()
    a.set_result(None)
    with pytest.raises(ValueError, match="b"):
        out.get(0)
    assert when_all([], "none").get(0) is None


def test_deadline_is_shared_and_never_negative() -> None:
    deadline = Deadline(0.05)
    assert 0 < deadline.left() <= 0.05
    time.sleep(0.06)
    assert deadline.left() == 0.0
