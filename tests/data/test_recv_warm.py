"""The receive pool's warm block: faulted in ahead of the first large argument across hosts (issue 30, item 3)."""

from __future__ import annotations

import sys

import pytest

from mpimesh._transport import buffers
from mpimesh._transport.buffers import HUGE_PAGE

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/stat is Linux's")

MIB = 1 << 20


def minor_faults() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def test_first_large_receive_lands_in_the_warm_block_already_faulted_in() -> None:
    pool = buffers._Pool()
    pool.warm(16 * MIB)
    view = pool.take(6 * MIB, 3)
    assert (pool.hits, pool.misses, pool.statistics().blocks) == (1, 0, 1)
    assert view.ctypes.data % 64 == 3
    before = minor_faults()
    view[:] = 1
    # A fresh block would fault 1,536 pages of 4 KiB (or 3 huge pages); Python's own few are allowed.
    assert minor_faults() - before < 64


def test_warm_block_is_the_last_resort_and_not_for_small_receives() -> None:
    pool = buffers._Pool()
    pool.warm(32 * MIB)
    small = pool.take(HUGE_PAGE // 2, 0)
    assert (pool.hits, pool.misses) == (0, 1)  # a block of its own: the warm one stays for a large argument
    first = pool.take(4 * MIB, 0)  # the first large one: the warm block
    second = pool.take(4 * MIB, 0)  # the warm block is in use: a block of its size
    assert (pool.hits, pool.misses) == (1, 2)
    del first, second
    again = pool.take(4 * MIB, 0)  # both idle: the block of the right size, not the warm one
    big = pool.take(20 * MIB, 0)  # so the warm one is still there for this
    assert (pool.hits, pool.misses) == (3, 2)
    assert big.nbytes == 20 * MIB and small.nbytes == HUGE_PAGE // 2 and again.nbytes == 4 * MIB


def test_warm_block_evicted_is_forgotten() -> None:
    pool = buffers._Pool()
    pool.limit_blocks = 1
    pool.warm(4 * MIB)
    held = pool.take(8 * MIB, 0)  # larger than the warm block: a new one, and the warm one is evicted
    assert pool._warm is None and pool.statistics().blocks == 1
    assert held.nbytes == 8 * MIB


def test_warm_runs_in_a_thread_and_zero_is_off() -> None:
    assert buffers.warm(0) is None
    thread = buffers.warm(2 * MIB)
    assert thread is not None
    thread.join(30)
    assert not thread.is_alive()
