"""Raw buffers sent with a frame: their layout in a frame, and pooled blocks to receive them into.

A frame's raw buffers (the data plane's out-of-band tensors and arrays) are
sent from the caller's memory without a copy, right after the frame, on
``TAG_DATA`` (see :mod:`.frames`).  The frame's ``bufsizes`` says what
follows: :func:`layout` writes it, and the receiver takes each buffer into
:func:`recv_buffer`.

Large receive buffers come from a pool of blocks that are reused once nothing
refers to them any more, so that a steady stream of large messages does not
pay a page fault per page on every receive (docs/design/transport.md,
"Receive buffers").  A worker whose controller runs on another host faults
one block in ahead of time (:func:`warm`), so that the first large argument
does not pay them either (docs/design/data.md, "First call across hosts").
Nothing here imports torch; numpy is imported where it is used, so a
process that only ever gets small messages never loads it.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

__all__ = ["HUGE_PAGE", "POOL_LIMIT_BYTES", "PoolStatistics", "copy_buffer", "huge_block", "layout", "pieces",
           "pool_statistics", "recv_buffer", "warm"]

_PAGE = 4096

#: Transparent huge page size.  The kernel's cross-process copy (which Open
#: MPI's shared-memory transport uses for large messages) pins the source's
#: pages one by one: from 4 KiB pages a 64 MiB Send ran 1.2-1.6x slower
#: than from huge pages (docs/design/data.md, "Where a Send loses its speed").
HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14

#: The most bytes the receive pool keeps (the data plane's staging pool keeps as much).
POOL_LIMIT_BYTES = 1 << 30

# Below this size a fresh bytearray is as cheap as the pool's bookkeeping.
_POOL_MIN = 64 * 1024
# Copies between addresses that differ modulo a cache line run at half speed
# or less, in memcpy and in the kernel's cross-process copy alike
# (docs/design/transport.md, "Alignment").  So a large buffer travels with
# its sender's offset and is received at the same one.
_ALIGN = 64


@dataclass(frozen=True)
class PoolStatistics:
    """Counters of the receive-buffer pool.

    Attributes:
        hits: receives that reused an idle block.
        misses: receives that allocated a new block.
        blocks: blocks tracked now (idle or in use).
        bytes: bytes in those blocks.
    """

    hits: int
    misses: int
    blocks: int
    bytes: int


class _Pool:
    """Large receive buffers, reused once nothing refers to them.

    A block is a numpy array that owns its memory; a receive gets a view of
    it.  numpy collapses view chains onto the owner, and torch.frombuffer
    keeps its exporter alive, so every user of the bytes holds a reference
    to the block: a block whose reference count is back to the pool's own is
    idle and may be reused.  Blocks stay faulted in once touched.
    """

    # Keep at most this much, and this many blocks; beyond, forget the oldest
    # (an in-use block is then freed by whoever holds it last).
    limit_bytes = POOL_LIMIT_BYTES
    limit_blocks = 32

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: list[np.ndarray] = []
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self._idle_refs = 0  # measured on first use (it needs numpy)
        # The block warm() faulted in: it may serve a receive of any pooled
        # size, not only one within 2x of its own (see take()).
        self._warm: np.ndarray | None = None

    def _calibrate(self) -> int:
        # The reference count of a block nobody else holds, as seen from the
        # loop in take() (list entry + loop variable + getrefcount's argument).
        import numpy as np

        blocks = [np.empty(1, np.uint8)]
        for _, block in enumerate(blocks):
            return sys.getrefcount(block)
        raise AssertionError  # pragma: no cover

    def take(self, nbytes: int, offset: int) -> np.ndarray:
        import numpy as np

        need = nbytes + _ALIGN
        with self._lock:
            if not self._idle_refs:
                self._idle_refs = self._calibrate()
            idle = self._idle_refs
            best: np.ndarray | None = None
            where = -1
            for i, block in enumerate(self._blocks):
                size = block.nbytes
                is_warm = block is self._warm  # (which refers to it too)
                fits = size <= 2 * need + _PAGE or (is_warm and need >= HUGE_PAGE)
                if need <= size and fits and sys.getrefcount(block) == idle + is_warm:
                    # The warm block is the last resort: a block of the right size first.
                    if best is None or best is self._warm or (size < best.nbytes and not is_warm):
                        best, where = block, i
            if best is not None:
                self.hits += 1
                del self._blocks[where]  # (list.remove would compare arrays elementwise)
                self._blocks.append(best)  # most recently used last
            else:
                self.misses += 1
                best = huge_block(need) if need >= HUGE_PAGE else np.empty((need + _PAGE - 1) // _PAGE * _PAGE,
                                                                               np.uint8)
                self._blocks.append(best)
                self._bytes += best.nbytes
                while len(self._blocks) > 1 and (self._bytes > self.limit_bytes
                                                 or len(self._blocks) > self.limit_blocks):
                    old = self._blocks.pop(0)
                    self._bytes -= old.nbytes
                    if old is self._warm:
                        self._warm = None
            start = (offset - int(best.ctypes.data)) % _ALIGN
            return best[start:start + nbytes]

    def warm(self, nbytes: int) -> None:
        """Fault in a block for a receive of up to ``nbytes`` and keep it idle in the pool."""
        block = huge_block(nbytes + _ALIGN)
        block[::_PAGE] = 0  # one write per 4 KiB page: every page, huge or not, is faulted in
        with self._lock:
            self._blocks.append(block)
            self._bytes += block.nbytes
            self._warm = block
        del block  # idle: only the pool refers to it

    def statistics(self) -> PoolStatistics:
        with self._lock:
            return PoolStatistics(self.hits, self.misses, len(self._blocks), self._bytes)


_pool = _Pool()
_libc: Any = None


def _madvise(addr: int, nbytes: int, advice: int) -> int:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc = libc
    return int(_libc.madvise(addr, nbytes, advice))


def huge_block(nbytes: int) -> np.ndarray:
    """An untouched uint8 array of at least ``nbytes`` bytes, 2 MiB-aligned and advised into huge pages.

    Its own anonymous mapping, ``madvise(MADV_HUGEPAGE)`` before any page is
    touched, so that the kernel backs it with huge pages where
    ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or
    ``madvise`` (the default of most distributions); glibc's and torch's
    allocators give neither the alignment nor the advice.  Its base is the
    mapping's memoryview (not another array), so views of it refer to it, as
    the pool's reference counting needs; the memory goes back to the kernel
    when the last view dies.
    """
    import numpy as np

    size = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE
    region = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(region, np.uint8)
    start = -int(whole.ctypes.data) % HUGE_PAGE
    # A slice of `whole` would hand its views `whole` as their base; a fresh
    # array over the aligned bytes has the mapping as its own base instead.
    block = np.frombuffer(region, np.uint8, size, start)
    del whole
    _madvise(int(block.ctypes.data), size, _MADV_HUGEPAGE)  # advice only: an error changes nothing
    return block


# MPI-3 counts are C ints: a raw buffer of 2 GiB or more travels in pieces of
# at most this many bytes (Open MPI 5 reports MPI 3.1, without MPI_Isend_c).
_PIECE = 1 << 30


def pieces(nbytes: int, piece: int = _PIECE) -> list[tuple[int, int]]:
    """The ``(start, stop)`` byte ranges a raw buffer of ``nbytes`` travels in, in order (one for most)."""
    if nbytes <= piece:
        return [(0, nbytes)]
    return [(start, min(start + piece, nbytes)) for start in range(0, nbytes, piece)]


def layout(buffers: Any) -> tuple[Any, ...]:
    """The ``bufsizes`` entries of a frame: ``nbytes``, or ``(nbytes, address % 64)`` for large buffers."""
    import numpy as np

    out: list[Any] = []
    for buf in buffers:
        view = memoryview(buf)
        n = view.nbytes
        if n < _POOL_MIN:
            out.append(n)
        else:
            out.append((n, int(np.frombuffer(view.cast("B"), np.uint8).ctypes.data) % _ALIGN))
    return tuple(out)


def recv_buffer(nbytes: int, offset: int = 0) -> Any:
    """A writable buffer of exactly ``nbytes`` bytes to receive into, at ``offset`` modulo 64."""
    if nbytes < _POOL_MIN:
        return bytearray(nbytes)
    return _pool.take(nbytes, offset)


def copy_buffer(buf: Any) -> Any:
    """A private writable copy of ``buf`` (a message delivered inside one process)."""
    import numpy as np

    view = memoryview(buf).cast("B")
    if view.nbytes < _POOL_MIN:
        return bytearray(view)
    src = np.frombuffer(view, np.uint8)
    out = _pool.take(view.nbytes, int(src.ctypes.data) % _ALIGN)
    out[:] = src
    return out


def warm(nbytes: int) -> threading.Thread | None:
    """Fault in one receive block of ``nbytes`` in a thread of its own; the thread, or None if ``nbytes`` is 0.

    A fresh block costs its receive the kernel's zeroing of every page as
    the data lands (32 MiB of huge pages: 9-16 ms on the loaded 2-core
    VM), the largest part of what a first large argument across hosts pays
    over a steady one.  The block then serves the first receive of 2 MiB or more
    and up to ``nbytes`` that finds no idle block of its own size; once
    that receive's buffer is dropped, it is reused as any other block.
    Memory: ``nbytes`` rounded up to 2 MiB, resident in the process from
    then on (the pool forgets it like any other block beyond its limits).
    """
    if nbytes <= 0:
        return None
    thread = threading.Thread(target=_pool.warm, args=(nbytes,), name="mpimesh-warm-recv", daemon=True)
    thread.start()
    return thread


def pool_statistics() -> PoolStatistics:
    """Counters of the receive-buffer pool of this process."""
    return _pool.statistics()
