"""The native Lock (``native/lock.c``): a threading.Lock to Python code, a C call to the pump and the Sender."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from mpimesh._transport import native as binding

_native = pytest.importorskip("mpimesh._native", reason="the native part is not built here")


def test_it_is_taken_and_given_back_as_threading_lock() -> None:
    """acquire, release, locked, the context manager and repr, as threading.Lock's."""
    lock = _native.Lock()
    assert not lock.locked() and "unlocked" in repr(lock)
    assert lock.acquire() is True and lock.locked() and "<locked " in repr(lock)
    assert lock.acquire(False) is False and lock.acquire(blocking=False) is False
    assert lock.acquire(True, 0.01) is False and lock.acquire(timeout=0) is False
    lock.release()
    assert not lock.locked()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    assert lock.acquire(blocking=True, timeout=1.5) is True
    lock.release()


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda lock: lock.release(), RuntimeError, "^release unlocked lock$"),
    (lambda lock: lock.acquire(False, 1), ValueError, "^can't specify a timeout for a non-blocking call$"),
    (lambda lock: lock.acquire(timeout=-2), ValueError, "^timeout value must be a non-negative number$"),
    (lambda lock: lock.acquire(timeout=1e300), OverflowError, "^timeout value is too large$"),
    (lambda lock: lock.acquire(wait=1), TypeError, "^acquire\\(\\) got an unexpected keyword argument 'wait'$"),
    (lambda lock: lock.acquire(True, blocking=True), TypeError,
     "^acquire\\(\\) got multiple values for argument 'blocking'$"),
    (lambda lock: lock.acquire(True, 1, 2), TypeError, "^acquire\\(\\) takes at most 2 arguments \\(3 given\\)$"),
    (lambda lock: _native.Lock(1), TypeError, "^Lock\\(\\) takes no arguments$"),
])
def test_bad_use_raises_as_threading_lock(call: object, error: type[Exception], message: str) -> None:
    """threading.Lock's errors, with its messages."""
    with pytest.raises(error, match=message):
        call(_native.Lock())  # type: ignore[operator]


def test_a_blocked_acquire_lets_other_threads_run_and_wakes_at_release() -> None:
    """A thread waiting for the lock does not hold the GIL; it takes the lock once it is given back."""
    lock = _native.Lock()
    lock.acquire()
    took = threading.Event()

    def waiter() -> None:
        with lock:
            took.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    spins = 0
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:  # this thread runs Python meanwhile: the waiter does not hold the GIL
        spins += 1
    assert spins > 1000 and not took.is_set()
    lock.release()
    assert took.wait(10)
    thread.join(10)
    assert not lock.locked()


def test_a_timed_acquire_gives_up_in_time() -> None:
    """acquire(timeout=t) on a lock another thread holds returns False after about t seconds."""
    lock = _native.Lock()
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            done.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    start = time.monotonic()
    assert lock.acquire(timeout=0.1) is False
    assert 0.09 <= time.monotonic() - start < 5
    done.set()
    thread.join(10)


def test_a_signal_reaches_a_thread_blocked_on_it() -> None:
    """A signal's handler runs while the main thread waits for the lock, and what it raises comes out of acquire."""
    lock = _native.Lock()
    lock.acquire()

    class Woken(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Woken

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        start = time.monotonic()
        with pytest.raises(Woken):
            lock.acquire(timeout=10)
        assert time.monotonic() - start < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert lock.locked()  # still the first holder's
    lock.release()


def test_the_native_wire_takes_its_locks_in_c() -> None:
    """NativeWire's two locks are native Locks (the pump and Sender.post take them without a Python call)."""
    from mpimesh._transport.wire_native import NativeWire

    if not binding.bind():
        pytest.skip(f"the native frame path cannot bind here: {binding.why_not}")
    wire = NativeWire((0, 0), {})
    assert type(wire.lock) is _native.Lock and type(wire.send_lock) is _native.Lock
