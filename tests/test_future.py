"""Future: the concurrent.futures contract plus get/await (pure)."""

from __future__ import annotations

import asyncio
import concurrent.futures

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
