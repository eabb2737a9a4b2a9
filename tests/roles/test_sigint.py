"""The SIGINT that ends a job, and when it is sent again, without a job (pure).

``tests/roles/test_faults.py`` pins the whole job's end (a lost SIGINT, a
script that keeps its own handler); here the handler and the re-send rule,
with a fake ``send`` that records the SIGINTs instead of sending them.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator

import pytest

from mpimesh._roles.sigint import Interruption, SigintHandler, install_sigint_handler

#: How long the waits below run when they must run to their end: long enough for many ticks of 1 ms.
TIMEOUT = 0.1
EVERY = 0.001


@pytest.fixture
def python_handler() -> Iterator[None]:
    """SIGINT's handler is Python's own during the test, and what it was after it."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture
def ours(python_handler: None) -> SigintHandler:
    """Our handler, installed as at the controller's boot."""
    handler = install_sigint_handler()
    assert handler is not None
    return handler


class Sends:
    """A fake ``send``: records the SIGINTs, and runs what the test says at the n-th."""

    def __init__(self, at: dict[int, Callable[[], None]] | None = None) -> None:
        self.count = 0
        self.at = at or {}

    def __call__(self, thread: threading.Thread) -> None:
        assert thread is threading.main_thread()
        self.count += 1
        if self.count in self.at:
            self.at[self.count]()


def arrives(handler: SigintHandler) -> Callable[[], None]:
    """The SIGINT reaches ``handler``: it raises KeyboardInterrupt (in the main thread, which the fake is)."""

    def run() -> None:
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)

    return run


def test_handler_is_pythons_and_counts_its_runs(ours: SigintHandler) -> None:
    """Installed at boot, a SIGINT still raises KeyboardInterrupt (Ctrl-C as before), and is counted."""
    assert signal.getsignal(signal.SIGINT) is ours and ours.runs == 0
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert ours.runs == 2


def test_handler_is_installed_only_over_pythons_on_the_main_thread(python_handler: None) -> None:
    """The handler replaces only Python's own, and only from the main thread; otherwise nothing changes."""
    got: list[SigintHandler | None] = []
    thread = threading.Thread(target=lambda: got.append(install_sigint_handler()))
    thread.start()
    thread.join()
    assert got == [None] and signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def own(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGINT, own)
    assert install_sigint_handler() is None and signal.getsignal(signal.SIGINT) is own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    assert install_sigint_handler() is None and signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_lost_sigint_is_sent_again_until_it_arrives_then_never(ours: SigintHandler) -> None:
    """While our handler has not run, SIGINT is sent again; once it has, never again (it would hit `finally`)."""
    sends = Sends({3: arrives(ours)})
    interruption = Interruption(threading.main_thread(), threading.Event(), ours, send=sends)
    assert sends.count == 1 and interruption.lost()
    assert not interruption.wait_left(TIMEOUT, every=EVERY)
    assert sends.count == interruption.sent == 3 and ours.runs == 1 and not interruption.lost()


def test_no_sigint_once_the_script_leaves(ours: SigintHandler) -> None:
    """The script has begun to leave: no more SIGINTs, and the wait returns True at once."""
    leaving = threading.Event()
    sends = Sends({2: leaving.set})
    interruption = Interruption(threading.main_thread(), leaving, ours, send=sends)
    assert interruption.wait_left(60.0, every=EVERY)
    assert sends.count == 2 and not interruption.lost()


def test_one_sigint_while_the_scripts_own_handler_is_sigints(ours: SigintHandler) -> None:
    """The script's own handler may have taken the SIGINT: one only, until the script puts ours back."""

    def own(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGINT, own)
    sends = Sends()
    interruption = Interruption(threading.main_thread(), threading.Event(), ours, send=sends)
    assert not interruption.wait_left(TIMEOUT, every=EVERY)
    assert sends.count == 1 and not interruption.lost()

    signal.signal(signal.SIGINT, ours)  # back: the next SIGINTs can be seen to be lost
    sends = Sends({3: arrives(ours)})
    interruption = Interruption(threading.main_thread(), threading.Event(), ours, send=sends)
    assert not interruption.wait_left(TIMEOUT, every=EVERY)
    assert sends.count == 3


def test_one_sigint_without_our_handler_or_main_thread(ours: SigintHandler) -> None:
    """No handler of ours at boot, or a main thread that has ended: one SIGINT, as before the re-sends."""
    sends = Sends()
    assert not Interruption(threading.main_thread(), threading.Event(), None, send=sends).wait_left(
        TIMEOUT, every=EVERY)
    assert sends.count == 1

    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    sent: list[threading.Thread] = []
    assert not Interruption(ended, threading.Event(), ours, send=sent.append).wait_left(TIMEOUT, every=EVERY)
    assert sent == [ended]


def test_resent_sigint_after_the_interrupt_is_dropped(ours: SigintHandler) -> None:
    """Once SIGINT was sent again, only its first arrival raises: a later one would break into `finally`."""
    sends = Sends()
    interruption = Interruption(threading.main_thread(), threading.Event(), ours, send=sends)
    leaving = interruption.leaving
    sends.at[2] = leaving.set  # one re-send, then the script leaves
    assert interruption.wait_left(60.0, every=EVERY)
    with pytest.raises(KeyboardInterrupt):
        ours(signal.SIGINT, None)
    ours(signal.SIGINT, None)  # dropped: no KeyboardInterrupt
    assert ours.runs == 2


def test_without_a_resend_every_sigint_raises(ours: SigintHandler) -> None:
    """An interrupt whose first SIGINT arrived sends no other: Ctrl-C in the script's `finally` still raises."""
    sends = Sends({1: arrives(ours)})
    interruption = Interruption(threading.main_thread(), threading.Event(), ours, send=sends)
    assert not interruption.wait_left(TIMEOUT, every=EVERY)
    with pytest.raises(KeyboardInterrupt):
        ours(signal.SIGINT, None)
    assert sends.count == 1 and ours.runs == 2
