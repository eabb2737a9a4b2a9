"""The SIGINT that ends a job, and when it is sent again, without a job (pure).

``tests/roles/test_faults.py`` pins the whole job's end (a lost SIGINT, a
script whose own handler swallows SIGINT, ``asyncio.run`` left its own
handler); here the re-send rule, with a fake ``send`` that records the
SIGINTs instead of sending them, and a real thread blocked in a wait as the
"main" thread.
"""

from __future__ import annotations

import dis
import gc
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

import pytest

from mpimesh._roles.sigint import Interruption, position

#: How long the waits below run when they must run to their end: long enough for many ticks of 1 ms.
TIMEOUT = 0.1
EVERY = 0.001


class Sends:
    """A fake ``send``: records the SIGINTs, and runs what the test says at the n-th."""

    def __init__(self, target: threading.Thread, at: dict[int, Callable[[], None]] | None = None) -> None:
        self.target = target
        self.count = 0
        self.at = at or {}

    def __call__(self, thread: threading.Thread) -> None:
        assert thread is self.target
        self.count += 1
        if self.count in self.at:
            self.at[self.count]()


class Blocked:
    """A thread blocked in ``first.acquire()``; released, it sets ``moved`` and blocks in ``second.acquire()``."""

    def __init__(self) -> None:
        self.first, self.second = threading.Lock(), threading.Lock()
        self.first.acquire()
        self.second.acquire()
        self.moved = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        # Wait (bounded) until it is in the first acquire: its frame at that call, not before it.
        call = [i.offset for i in dis.get_instructions(self._run) if i.opname == "CALL"][0]
        deadline = time.monotonic() + 10
        while not self._at(call):
            assert time.monotonic() < deadline, "the thread did not reach its wait in 10 s"

    def _at(self, offset: int) -> bool:
        now = position(self.thread)
        return now is not None and now[0].f_code is self._run.__code__ and now[1] >= offset

    def _run(self) -> None:
        self.first.acquire()
        self.moved.set()
        self.second.acquire()

    def move(self) -> None:
        """Let the thread leave its first wait (as a KeyboardInterrupt would), and wait until it has."""
        self.first.release()
        assert self.moved.wait(10)

    def end(self) -> None:
        """Let the thread end, and join it."""
        if not self.moved.is_set():
            self.first.release()
        self.second.release()
        self.thread.join(10)


@pytest.fixture
def blocked() -> Iterator[Blocked]:
    """A thread blocked in a lock's wait, as the script's main thread when a SIGINT is lost."""
    b = Blocked()
    try:
        yield b
    finally:
        b.end()


def frames_held(interruption: Interruption) -> list[FrameType]:
    """The frames ``interruption`` keeps alive (directly or in a tuple of its attributes)."""
    held = gc.get_referents(*gc.get_referents(interruption.__dict__))
    return [o for o in held + gc.get_referents(interruption.__dict__) if isinstance(o, FrameType)]


def test_position_is_the_top_frame_and_its_instruction(blocked: Blocked) -> None:
    """``position`` names the thread's top frame object and ``f_lasti``; None for a thread that has ended."""
    now = position(blocked.thread)
    assert now is not None and now[0].f_code is Blocked._run.__code__ and now[1] == now[0].f_lasti
    blocked.end()
    assert position(blocked.thread) is None


def test_sigint_is_sent_again_while_the_thread_has_not_moved(blocked: Blocked) -> None:
    """A thread still in the same frame at the same instruction never took the SIGINT: it is sent again."""
    sends = Sends(blocked.thread)
    interruption = Interruption(blocked.thread, threading.Event(), send=sends)
    assert sends.count == 1 and interruption.lost()
    assert not interruption.wait_left(TIMEOUT, every=EVERY)
    assert sends.count == interruption.sent > 2
    assert frames_held(interruption) == []


def test_no_sigint_once_the_thread_has_moved(blocked: Blocked) -> None:
    """Once the thread left that position (the interrupt was taken), SIGINT is never sent again.

    It is back in a wait, still: another SIGINT would break into what it
    runs now (the script's ``finally``).
    """
    sends = Sends(blocked.thread)
    sends.at[3] = blocked.move
    interruption = Interruption(blocked.thread, threading.Event(), send=sends)
    assert not interruption.wait_left(TIMEOUT, every=EVERY)
    assert sends.count == 3 and not interruption.lost()
    assert frames_held(interruption) == []


def test_moved_once_is_moved_for_good(blocked: Blocked) -> None:
    """A position that differed once is never trusted again, even if the same frame were back at it."""
    sends = Sends(blocked.thread)
    interruption = Interruption(blocked.thread, threading.Event(), send=sends)
    leaving = interruption.leaving
    leaving.set()
    assert not interruption.lost()  # leaving: not lost, and the position is dropped
    leaving.clear()
    assert not interruption.lost() and sends.count == 1


def test_no_sigint_once_the_script_leaves(blocked: Blocked) -> None:
    """The script has begun to leave: no more SIGINTs, and the wait returns True at once."""
    leaving = threading.Event()
    sends = Sends(blocked.thread, {2: leaving.set})
    interruption = Interruption(blocked.thread, leaving, send=sends)
    assert interruption.wait_left(60.0, every=EVERY)
    assert sends.count == 2 and not interruption.lost()


def test_one_sigint_to_a_thread_that_has_ended() -> None:
    """A main thread that has ended has no position: one SIGINT, and the wait runs to its timeout."""
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    sends = Sends(ended)
    assert not Interruption(ended, threading.Event(), send=sends).wait_left(TIMEOUT, every=EVERY)
    assert sends.count == 1
