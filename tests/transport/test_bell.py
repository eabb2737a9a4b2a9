"""Doorbells: a FIFO per process that wakes its idle poller (pure)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from mpimesh._transport import bell as _bell
from mpimesh._transport.bell import Bell, Ringer, bell_path


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """A fake controller pid whose job directory lives under tmp_path."""
    monkeypatch.setattr(_bell, "job_dir", lambda pid: str(tmp_path / f"job-{pid}"))
    return 4242


def test_sleep_times_out_unrung(job: int) -> None:
    bell = Bell(bell_path(job, (0, 1)))
    try:
        start = time.monotonic()
        assert bell.sleep(0.02) is False
        assert time.monotonic() - start >= 0.015
    finally:
        bell.close()
    assert not os.path.exists(bell_path(job, (0, 1)))


def test_a_peer_rings_a_sleeper_awake(job: int) -> None:
    bell = Bell(bell_path(job, (1, 0)))
    ringer = Ringer(job)
    try:
        threading.Timer(0.05, ringer.ring, args=((1, 0),)).start()
        start = time.monotonic()
        assert bell.sleep(5.0) is True
        assert time.monotonic() - start < 2.0
        assert bell.sleep(0.0) is False  # the ring was consumed
        for _ in range(100_000):  # a full FIFO neither blocks nor raises
            ringer.ring((1, 0))
        bell.drain()
        assert bell.sleep(0.0) is False
    finally:
        ringer.close()
        bell.close()


def test_own_ring_wakes_own_sleeper(job: int) -> None:
    bell = Bell(bell_path(job, (0, 0)))
    try:
        bell.ring()
        assert bell.sleep(1.0) is True
    finally:
        bell.close()


def test_ringing_a_peer_without_a_bell_here_is_a_no_op_until_it_has_one(job: int) -> None:
    ringer = Ringer(job)
    ringer.ring((0, 3))  # not booted yet, or on another node: nothing happens
    bell = Bell(bell_path(job, (0, 3)))
    try:
        ringer.ring((0, 3))  # now it has one: found on the next ring
        assert bell.sleep(1.0) is True
    finally:
        bell.close()
        ringer.close()


def test_a_gone_peer_is_not_rung_again(job: int) -> None:
    ringer = Ringer(job)
    bell = Bell(bell_path(job, (0, 5)))
    ringer.ring((0, 5))
    bell.close()
    os.mkfifo(bell_path(job, (0, 5)))  # a FIFO nobody reads: its owner is gone
    ringer.ring((0, 5))  # EPIPE on the old write end: forgotten, no error
    ringer.forget((0, 5))
    ringer.ring((0, 5))
    assert ringer._fds[(0, 5)] == -1
    ringer.close()


def test_a_stale_bell_of_a_reused_address_is_replaced(job: int) -> None:
    path = bell_path(job, (2, 0))
    os.makedirs(os.path.dirname(path))
    Path(path).write_text("stale")
    bell = Bell(path)
    try:
        bell.ring()
        assert bell.sleep(1.0) is True
    finally:
        bell.close()
