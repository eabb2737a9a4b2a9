"""Large buffers that mpimesh allocates are 2 MiB-aligned and advised into huge pages.

A 64 MiB Send from 4 KiB pages ran 1.2-1.6x slower than from huge pages
(docs/design/data.md, "Where a Send loses its speed"): these tests pin the
allocation property, not a timing.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from mpimesh._data import buffers
from mpimesh._data.hugepages import HUGE_PAGE, empty_fast, empty_like_fast, huge_page_advised
from mpimesh._transport.buffers import huge_block, recv_buffer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and smaps are Linux's")

MIB64 = 64 << 20


def test_huge_block_is_aligned_advised_and_owns_its_views() -> None:
    """The block starts on a huge page, its mapping carries MADV_HUGEPAGE, and views refer to the block."""
    block = huge_block(MIB64 + 5)
    assert block.nbytes >= MIB64 + 5 and block.nbytes % HUGE_PAGE == 0
    assert block.ctypes.data % HUGE_PAGE == 0
    assert huge_page_advised(block.ctypes.data)
    assert huge_page_advised(block.ctypes.data + block.nbytes - 1)
    before = sys.getrefcount(block)
    view = block[100:200]
    after = sys.getrefcount(block)
    assert view.base is block
    assert after == before + 1


def test_large_receive_blocks_are_advised_at_the_senders_offset() -> None:
    """A large receive buffer lies in an advised block, at the sender's address modulo 64."""
    buf = recv_buffer(MIB64, 48)
    assert buf.nbytes == MIB64 and buf.ctypes.data % 64 == 48
    assert huge_page_advised(buf.ctypes.data)
    assert buf.base.ctypes.data % HUGE_PAGE == 0


def test_small_receive_buffers_stay_plain() -> None:
    """Below the pool's floor a receive buffer is a bytearray."""
    assert type(recv_buffer(1000)) is bytearray


def test_empty_fast_is_advised_and_shaped_like_torch_empty() -> None:
    """Large tensors sit in advised, aligned memory; shape, dtype and writes behave as torch.empty's."""
    torch = pytest.importorskip("torch")
    t = empty_fast(4, 1024, 1024, dtype=torch.float32)
    assert t.shape == (4, 1024, 1024) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.data_ptr() % HUGE_PAGE == 0 and huge_page_advised(t.data_ptr())
    t.fill_(2.0)
    assert float(t.sum()) == 2.0 * t.numel()
    like = empty_like_fast(torch.ones((1024, 1024), dtype=torch.bfloat16))
    assert like.shape == (1024, 1024) and like.dtype == torch.bfloat16 and huge_page_advised(like.data_ptr())
    assert empty_fast((3, 4)).dtype == torch.get_default_dtype()
    small = empty_fast(10)
    assert small.shape == (10,) and not huge_page_advised(small.data_ptr())


def test_empty_fast_memory_lives_as_long_as_a_view() -> None:
    """The mapping stays mapped while only a view of the tensor is left."""
    torch = pytest.importorskip("torch")
    t = empty_fast(MIB64, dtype=torch.uint8)
    t[-1] = 9
    tail = t[-16:]
    del t
    assert int(tail[-1]) == 9 and huge_page_advised(tail.data_ptr())


def test_torch_default_allocation_is_not_advised() -> None:
    """The cause in the first place: torch's own large CPU tensors carry no huge-page advice (by default)."""
    torch = pytest.importorskip("torch")
    import os

    if os.environ.get("THP_MEM_ALLOC_ENABLE"):
        pytest.skip("torch was asked for huge pages")
    assert not huge_page_advised(torch.empty(MIB64, dtype=torch.uint8).data_ptr() + HUGE_PAGE)


def test_tensors_copied_for_the_wire_are_advised() -> None:
    """A non-contiguous tensor that reduce_tensor must copy is copied into advised memory."""
    torch = pytest.importorskip("torch")
    src = torch.arange(2 * MIB64 // 4, dtype=torch.float32).view(-1, 2)[:, 0]
    _, args = buffers.reduce_tensor(src, 1 << 16)
    raw = np.frombuffer(args[0].raw(), np.uint8)
    assert huge_page_advised(raw.ctypes.data)
    rebuilt = buffers.rebuild_tensor(*args)
    assert torch.equal(rebuilt, src)
