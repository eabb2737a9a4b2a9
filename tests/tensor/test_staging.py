"""Staging through page-locked host buffers: how CUDA tensors reach an MPI that is not CUDA-aware (pure).

Without a GPU the staged path runs on CPU tensors over ``MPI.COMM_SELF``
(the buffers are then plain host memory): what it computes, and how its
buffers are reused.  With a GPU, the last test runs it for real.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mpimesh._transport.mpi import MPI
from mpimesh.tensor import _collectives
from mpimesh.tensor._collectives import Staging, _reduce_staged, reduce

F32 = torch.float32


def staged_copy(t: torch.Tensor, staging: Staging) -> torch.Tensor:
    host = staging.take(tuple(t.shape), t.dtype)
    host.copy_(t)
    return host


@pytest.mark.parametrize(("reduction", "scatter", "inplace"), [
    ("sum", False, False), ("avg", False, True), ("max", False, True), ("stack", False, False), ("sum", True, False),
])
def test_staged_reductions_give_what_direct_ones_give(reduction: str, scatter: bool, inplace: bool) -> None:
    """New results, in place (the input itself is returned), stack and scatter, through staging buffers."""
    t = torch.arange(12, dtype=F32).reshape(4, 3)
    staging = Staging(pin=False)
    want = reduce(MPI.COMM_SELF, t.clone(), reduction, scatter, inplace=False)
    got = _reduce_staged(MPI.COMM_SELF, t, staged_copy(t, staging), reduction, scatter, inplace, staging)
    assert torch.equal(got, want)
    assert (got is t) == inplace
    if not inplace:
        assert got.data_ptr() not in {b.data_ptr() for bufs in staging._free.values() for b in bufs}


def test_staging_buffers_are_reused_by_size_and_bounded() -> None:
    """A buffer comes back for the next take of its element count (any shape); two per size at most."""
    staging = Staging(pin=False)
    first = staging.take((4, 4), F32)
    ptr = first.data_ptr()
    staging.give(first)
    again = staging.take((16,), F32)
    assert again.data_ptr() == ptr and again.shape == (16,)
    staging.give(again)
    held = [staging.take((4, 4), F32) for _ in range(3)]
    for buf in held:
        staging.give(buf)
    assert len(staging._free[(16, F32)]) == 2 and staging._bytes == 2 * 64
    staging.MAX_BYTES = 64
    staging.give(torch.empty(32, dtype=F32))
    assert (32, F32) not in staging._free or not staging._free[(32, F32)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_tensor_reduces_through_pinned_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """An MPI that is not CUDA-aware gets page-locked copies; the results are back on the device."""
    monkeypatch.setattr(_collectives, "cuda_support", lambda: SimpleNamespace(aware=False))
    staging = Staging()
    t = torch.arange(8, dtype=F32, device="cuda")
    got = reduce(MPI.COMM_SELF, t, "sum", False, inplace=False, staging=staging)
    assert got.device.type == "cuda" and torch.equal(got.cpu(), torch.arange(8, dtype=F32))
    assert reduce(MPI.COMM_SELF, t, "avg", False, inplace=True, staging=staging) is t
    kept = [b for bufs in staging._free.values() for b in bufs]
    assert kept and all(b.is_pinned() for b in kept)
    many = _collectives.reduce_many(MPI.COMM_SELF, [t, t * 2], "sum", inplace=False, staging=staging)
    assert [m.device.type for m in many] == ["cuda", "cuda"] and torch.equal(many[1].cpu(), 2 * t.cpu())
