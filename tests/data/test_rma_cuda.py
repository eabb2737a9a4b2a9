"""The GPU path of the data plane: CUDA tensors in messages and RDMA transfers.

Skipped without a CUDA device.  Without a CUDA-aware MPI (neither PyPI wheel
is one), CUDA memory is staged through pinned host buffers on the caller's
side, and an RDMABuffer over CUDA memory is refused with the fix.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpimesh import Actor, RDMABuffer, endpoint
from mpimesh._core import serialize as _serialize
from mpimesh._data import buffers as _buffers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

N = 1 << 18


def test_cuda_tensor_travels_out_of_band_and_comes_back_on_its_device() -> None:
    """A CUDA tensor pickles as a host buffer plus its device, and is rebuilt on that device."""
    t = torch.arange(N, dtype=torch.float32, device="cuda:0")
    body, buffers = _serialize.dumps(t)
    assert len(buffers) == 1 and buffers[0].nbytes == 4 * N
    out = _serialize.loads(body, [bytearray(b) for b in buffers])
    assert out.device == t.device and torch.equal(out, t)


def test_large_receive_blocks_are_page_locked_in_place_once() -> None:
    """A CUDA tensor rebuilt from a large pooled receive block copies from page-locked memory; others stay."""
    block = _buffers.recv_buffer(8 << 20)
    assert _buffers.page_lock(block) and _buffers.page_lock(block[4096:])  # the second: already registered
    t = torch.arange(1 << 20, dtype=torch.float32)
    block.view(np.uint8)[: t.nbytes] = t.numpy().view(np.uint8)
    out = _buffers.rebuild_tensor(block[: t.nbytes], "float32", (1 << 20,), "cuda:0", False, False)
    assert out.device.type == "cuda" and torch.equal(out.cpu(), t)
    assert not _buffers.page_lock(_buffers.recv_buffer(4096))  # small: not worth a registration
    assert not _buffers.page_lock(bytearray(8 << 20))  # not the pool's


def test_cuda_buffer_needs_a_cuda_aware_mpi() -> None:
    """Without CUDA-aware MPI an RDMABuffer over device memory is refused, naming the fix."""
    if _buffers.cuda_support().aware:
        pytest.skip("this MPI is CUDA-aware")
    with pytest.raises(ValueError, match=r"^RDMABuffer: expecting CPU memory, got a cuda:0 tensor, and the MPI "
                                         r"library is not CUDA-aware \(.*\); expose a host copy: host = "
                                         r"tensor.cpu\(\).pin_memory\(\); RDMABuffer\(host\), refreshed with "
                                         r"host.copy_\(tensor\), or use an MPI built with CUDA"):
        RDMABuffer(torch.zeros(N, device="cuda"))


def test_staging_buffers_are_pinned_and_reused() -> None:
    """Staging takes pinned host memory and gives the same buffer back next time."""
    first = _buffers.take_staging(1 << 20)
    assert first.is_pinned()
    _buffers.give_staging(first)
    again = _buffers.take_staging(1 << 19)
    assert again.data_ptr() == first.data_ptr()
    _buffers.give_staging(again)


class HostOwner(Actor):
    def __init__(self) -> None:
        self.data = torch.full((N,), 3.0)
        self.buffer = RDMABuffer(self.data.view(torch.uint8))

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buffer

    @endpoint
    def first(self) -> float:
        return float(self.data[0])

    @endpoint
    def device_of(self, t: torch.Tensor) -> str:
        return str(t.device)


@pytest.fixture(scope="module")
def host_owner(one_proc: object) -> object:
    mesh = one_proc.spawn("host_owner", HostOwner)  # type: ignore[attr-defined]
    mesh.initialized.get(60)
    return mesh


@pytest.mark.mesh
def test_read_into_and_write_from_cuda_tensors(host_owner: object) -> None:
    """A CUDA destination or source of a transfer is staged through pinned host memory."""
    handle = host_owner.handle.call_one().get(30)  # type: ignore[attr-defined]
    dst = torch.zeros(N, device="cuda")
    handle.read_into(dst.view(torch.uint8)).get(30)
    assert float(dst.sum()) == 3.0 * N
    handle.write_from(torch.full((N,), 4.0, device="cuda").view(torch.uint8)).get(30)
    assert host_owner.first.call_one().get(30) == 4.0  # type: ignore[attr-defined]


@pytest.mark.mesh
def test_cuda_argument_arrives_on_the_workers_gpu(host_owner: object) -> None:
    """An endpoint argument on cuda:0 is rebuilt on cuda:0 in the worker (which sees the same GPUs)."""
    t = torch.ones(N, device="cuda:0")
    assert host_owner.device_of.call_one(t).get(60) == "cuda:0"  # type: ignore[attr-defined]
