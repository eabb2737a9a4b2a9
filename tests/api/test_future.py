"""Future: the concurrent.futures contract plus get/await (pure)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from mpimesh import Future


def test_is_a_concurrent_future() -> None:
    """wait() and as_completed() work unchanged."""
    futs = [Future.completed(i) for i in range(3)]
    assert isinstance(futs[0], concurrent.futures.Future)
    done, _ = concurrent.futures.wait(futs, timeout=1)
    assert {f.get() for f in done} == {0, 1, 2}


def test_timeout_does_not_consume() -> None:
    """A TimeoutError leaves the future waitable; set later, get() returns."""
    fut: Future[int] = Future("demo")
    with pytest.raises(TimeoutError, match=r"^<mpimesh.Future demo pending> not done after 0.01 s; call get\(\) again"):
        fut.get(0.01)
    fut.set_result(5)
    assert fut.get(0) == 5 and fut.result() == 5 and fut.exception() is None


def test_exception_and_await() -> None:
    """exception() returns the error; awaiting raises it."""
    fut: Future[int] = Future("e")
    fut.set_exception(KeyError("k"))
    assert isinstance(fut.exception(1), KeyError)

    async def main() -> None:
        with pytest.raises(KeyError):
            await fut
        assert await Future.completed(3) == 3
        assert await Future.completed(4).as_asyncio() == 4

    asyncio.run(main())


def test_stdlib_future_attributes_are_the_ones_made_lazily() -> None:
    """Future skips concurrent.futures.Future.__init__: pin what that sets."""
    from mpimesh import future

    made = set(vars(concurrent.futures.Future()))
    assert made == {"_state", "_result", "_exception", *future._LAZY}


def test_settled_before_anyone_waits() -> None:
    """A future settled with no waiter still serves every stdlib entry point."""
    fut: Future[int] = Future("early")
    fut.set_result(7)
    assert "_condition" not in vars(fut)
    seen: list[int] = []
    fut.add_done_callback(lambda f: seen.append(f.result()))
    assert seen == [7] and fut.result(0) == 7 and fut.done() and not fut.cancelled()
    assert [f.result() for f in concurrent.futures.as_completed([fut], timeout=1)] == [7]
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_result(8)
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_exception(ValueError())


def test_settled_by_another_thread_wakes_stdlib_waiters() -> None:
    """wait(), as_completed() and callbacks registered first see a later settle."""
    futs: list[Future[int]] = [Future(f"f{i}") for i in range(3)]
    seen: list[int] = []
    futs[0].add_done_callback(lambda f: seen.append(f.result()))

    def settle() -> None:
        time.sleep(0.02)
        futs[0].set_result(0)
        futs[1].set_exception(KeyError("k"))
        futs[2].set_result(2)

    threading.Thread(target=settle).start()
    done, _ = concurrent.futures.wait(futs, timeout=5, return_when=concurrent.futures.FIRST_COMPLETED)
    assert done
    got = {f._what: f.exception() for f in concurrent.futures.as_completed(futs, timeout=5)}
    assert got["f0"] is None and isinstance(got["f1"], KeyError) and got["f2"] is None
    assert seen == [0] and futs[2].get(0) == 2
    with pytest.raises(KeyError):
        futs[1].get(0)


def test_cancel_a_pending_future() -> None:
    """cancel() works on a future nobody waited on."""
    fut: Future[int] = Future("c")
    assert fut.cancel() and fut.cancelled() and fut.done()
    with pytest.raises(concurrent.futures.CancelledError):
        fut.result(0)


def test_get_without_a_timeout_spins_first_and_falls_back_to_the_driver() -> None:
    """get() tries the driver's spin (``Progress.spin``, in C with the native wire); a timeout goes to the driver."""
    from mpimesh import future as _future

    class Driver:
        def __init__(self) -> None:
            self.spun: list[Future[int]] = []
            self.waits: list[float | None] = []

        def spin(self, fut: Future[int]) -> bool:
            self.spun.append(fut)
            return False  # not settled while spinning: the driver's wait goes on

        def wait(self, done: object, cond: object, timeout: float | None) -> bool:
            self.waits.append(timeout)
            if timeout is None:
                self.spun[-1].set_result(7)
                return True
            return False

    driver = Driver()
    saved = _future._driver
    _future.set_driver(driver.wait)
    try:
        fut: Future[int] = Future("spun")
        with pytest.raises(TimeoutError, match=r"^<mpimesh.Future spun pending> not done after 0.5 s; "):
            fut.get(0.5)
        assert driver.spun == [] and driver.waits == [0.5]  # with a timeout: never the spin
        assert fut.get() == 7 and driver.spun == [fut] and driver.waits == [0.5, None]
        assert fut.get() == 7 and len(driver.spun) == 1  # settled: neither
    finally:
        _future.set_driver(saved)
