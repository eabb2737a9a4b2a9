"""The waiting discipline's small policies: back-off and deadlines (pure)."""

from __future__ import annotations

import math
import threading
import time

import pytest

from mpimesh._core.progress import Backoff, Progress, deadline


def test_backoff_doubles_from_the_floor_to_the_ceiling() -> None:
    """Each nap doubles the last, from the floor, and never passes the ceiling the caller gives."""
    backoff = Backoff(20e-6)
    naps = [backoff.nap(1e-3) for _ in range(8)]
    assert naps == pytest.approx([20e-6, 40e-6, 80e-6, 160e-6, 320e-6, 640e-6, 1e-3, 1e-3])
    assert backoff.nap(8e-3) == pytest.approx(2e-3)  # a higher ceiling (deep sleep) lets it grow on
    backoff.reset()
    assert backoff.nap(1e-3) == pytest.approx(20e-6)


def test_backoff_start_and_low_ceiling() -> None:
    """A back-off may start from a given nap; a ceiling below the floor wins."""
    backoff = Backoff(40e-6, start=1e-3)
    assert backoff.nap(1e-3) == pytest.approx(1e-3)
    backoff.reset()
    assert backoff.nap(1e-3) == pytest.approx(40e-6)
    assert Backoff(20e-6).nap(10e-6) == pytest.approx(10e-6)


def test_backoff_goes_on_from_a_saved_nap() -> None:
    """``last`` saved before a reset and set after it (a bell that was only a look) resumes the doubling there."""
    backoff = Backoff(20e-6)
    for _ in range(4):
        backoff.nap(1e-3)
    saved = backoff.last
    assert saved == pytest.approx(160e-6)
    backoff.reset()
    assert backoff.last == 0.0
    backoff.last = saved
    assert backoff.nap(1e-3) == pytest.approx(320e-6)


def test_deadline() -> None:
    """No timeout is an infinite deadline, so comparisons need no None check."""
    assert deadline(None, 5.0) == math.inf
    assert deadline(2.5, 5.0) == 7.5


def test_wait_times_out_and_succeeds() -> None:
    """wait() returns False at the timeout and True as soon as done() holds, polling meanwhile."""
    polls: list[float] = []

    def poll(spin: float) -> int:
        polls.append(spin)
        return 0

    progress = Progress(poll)
    cond = threading.Condition()
    start = time.monotonic()
    assert progress.wait(lambda: False, cond, 0.05) is False
    assert 0.05 <= time.monotonic() - start < 5
    assert polls
    flag = threading.Event()
    threading.Timer(0.02, flag.set).start()
    assert progress.wait(flag.is_set, cond, 5) is True


@pytest.mark.parametrize("main_thread_polls", [True, False], ids=["leader", "notebook"])
@pytest.mark.parametrize("where", ["progress.py", "threading.py"])
def test_wait_interrupted_anywhere(main_thread_polls: bool, where: str) -> None:
    """A KeyboardInterrupt at any line of wait() comes out as itself, and leaves no stale leader and the token free.

    In a notebook an interrupt lands in a cell's ``fut.get()``, wherever its
    wait is; a leader left behind would keep the background waiter from
    polling for good, and every later wait of the process would hang.  Each
    run raises the interrupt at the k-th line event of ``wait`` and what it
    calls (as Python runs a signal handler between two lines), for every k:
    in ``progress.py``, or in ``threading.py`` (``Condition.wait``, where the
    condition is left as it was).  An interrupt just after ``Condition.wait``
    released its lock once came out as "RuntimeError: cannot release
    un-acquired lock" (CI, a notebook's ``main_thread_polls=False``).
    """
    import sys
    from types import FrameType
    from typing import Any

    progress = Progress(lambda spin: 0)
    progress._leader_idle = 0.0  # step back at the first turn: every path of the loop runs
    progress._background = 1  # as if the background waiter ran (it is only counted)
    progress.main_thread_polls = main_thread_polls
    cond = threading.Condition(threading.RLock())  # a future's, as concurrent.futures makes it
    events = [0]
    at = [-1]

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename.endswith(where):
            if event == "line":
                events[0] += 1
                if events[0] == at[0]:
                    raise KeyboardInterrupt
            return tracer
        return None if where == "progress.py" else tracer

    def run(k: int) -> bool:
        events[0], at[0] = 0, k
        sys.settrace(tracer)
        try:
            progress.wait(lambda: False, cond, 0.001)
        except KeyboardInterrupt:
            return True
        finally:
            sys.settrace(None)
        return False

    run(-1)
    lines = events[0]
    assert lines > 10
    for k in range(1, lines + 1):
        interrupted = run(k)
        assert progress._leaders == [], f"a leader left behind by an interrupt at line event {k}"
        assert progress._token.acquire(blocking=False), f"the token held after an interrupt at line event {k}"
        progress._token.release()
        if where == "threading.py":
            # (in progress.py, a line event at a `with`'s end lands where no signal does: after its body's last call)
            owned = cond._is_owned()  # type: ignore[attr-defined]
            assert not owned, f"the condition held after an interrupt at line event {k}"
        assert interrupted or k > events[0]
