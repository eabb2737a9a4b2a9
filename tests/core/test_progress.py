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
