"""Bulk data in endpoint arguments and results: out of band, pooled, aligned.

The pure tests pin the pieces (the tensor reducer, the receive pool, memory
checks, the CUDA-aware query); the ``mesh`` tests send tensors and arrays
through real calls, between processes, inside one process and across islands.
"""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest
import torch

from mpimesh import Actor, context, endpoint, this_proc
from mpimesh._core import serialize as _serialize
from mpimesh._data import buffers as _buffers
from mpimesh._transport import mpi as _mpi
from mpimesh.config import settings

BIG = settings.oob_threshold  # bytes: from here on, buffers travel out of band


def big(dtype: torch.dtype = torch.float32, n: int = 1 << 16) -> torch.Tensor:
    return (torch.arange(n) % 251).to(dtype)


# --- pure: the reducer ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool,
                                   torch.bfloat16, torch.float16, torch.complex64])
def test_large_tensors_go_out_of_band_and_come_back_equal(dtype: torch.dtype) -> None:
    """A tensor of at least MPIMESH_OOB_THRESHOLD bytes leaves one raw buffer and a small pickle."""
    t = big(dtype, BIG)  # at least BIG bytes for every dtype
    body, buffers = _serialize.dumps(t)
    assert len(buffers) == 1 and buffers[0].nbytes == t.numel() * t.element_size()
    assert len(body) < 400
    out = _serialize.loads(body, [bytearray(b) for b in buffers])
    assert out.dtype == dtype and out.shape == t.shape and torch.equal(out, t)


def test_nested_tensors_and_arrays_each_take_a_buffer() -> None:
    """Tensors and arrays anywhere in a structure travel out of band, small ones in band."""
    value = {"a": [big(), (big(torch.int64),)], "b": np.arange(BIG, dtype=np.int32), "small": torch.ones(3),
             "n": 7}
    body, buffers = _serialize.dumps(value)
    assert len(buffers) == 3
    out = _serialize.loads(body, [bytearray(b) for b in buffers])
    assert torch.equal(out["a"][0], value["a"][0]) and torch.equal(out["a"][1][0], value["a"][1][0])
    assert np.array_equal(out["b"], value["b"]) and torch.equal(out["small"], torch.ones(3)) and out["n"] == 7


def test_non_contiguous_and_view_flags_are_resolved() -> None:
    """Transposed, strided, conjugated tensors arrive equal (and contiguous)."""
    base = big().reshape(256, 256)
    cases = [base.t(), base[:, ::2], torch.randn(1 << 14, dtype=torch.complex64).conj(), -big()]
    for t in cases:
        body, buffers = _serialize.dumps(t)
        out = _serialize.loads(body, [bytearray(b) for b in buffers])
        assert torch.equal(out, t.resolve_conj()) and out.is_contiguous()


def test_parameters_and_requires_grad_survive() -> None:
    """nn.Parameter comes back a Parameter; requires_grad is kept."""
    p = torch.nn.Parameter(big())
    g = big().requires_grad_()
    out_p, out_g = _serialize.loads(*(lambda b: (b[0], [bytearray(x) for x in b[1]]))(_serialize.dumps((p, g))))
    assert type(out_p) is torch.nn.Parameter and out_p.requires_grad and torch.equal(out_p, p)
    assert out_g.requires_grad and out_g.is_leaf


def test_received_tensor_shares_the_receive_buffer() -> None:
    """Rebuilding makes no copy: the tensor is a view of the buffer MPI received into."""
    t = big()
    body, buffers = _serialize.dumps(t)
    recv = _buffers.recv_buffer(buffers[0].nbytes)
    recv[:] = np.frombuffer(buffers[0], np.uint8)
    out = _serialize.loads(body, [recv])
    assert out.data_ptr() == recv.ctypes.data


def test_read_only_buffers_are_copied_on_rebuild() -> None:
    """A read-only buffer (bytes) gives a writable tensor, without torch's warning."""
    t = big()
    body, buffers = _serialize.dumps(t)
    out = _serialize.loads(body, [bytes(buffers[0])])
    out += 1
    assert torch.equal(out, t + 1)


def test_untouched_types_keep_torch_pickling() -> None:
    """Sparse tensors and tensors below the threshold use torch's own reducer."""
    sparse = torch.eye(300).to_sparse()
    body, buffers = _serialize.dumps(sparse)
    assert buffers == [] and torch.equal(pickle.loads(body).to_dense(), torch.eye(300))


def test_a_small_view_travels_without_its_storage() -> None:
    """A few elements of a large tensor pickle as themselves, not with the 64 MiB storage under them."""
    big = torch.arange(1 << 24, dtype=torch.float32)
    for view in (big[:1], big[5:9].view(2, 2), big[::1 << 22]):
        body, buffers = _serialize.dumps(view)
        assert buffers == [] and len(body) < 1024, len(body)
        assert torch.equal(_serialize.loads(body, buffers), view)
    grad = torch.ones(1 << 20, requires_grad=True)
    body, buffers = _serialize.dumps(grad.detach()[:2].requires_grad_())
    back = _serialize.loads(body, buffers)
    assert len(body) < 1024 and back.requires_grad and back.tolist() == [1.0, 1.0]


# --- pure: the receive pool ---------------------------------------------------------


def test_pool_reuses_a_block_only_once_nothing_refers_to_it() -> None:
    """A block is handed out again only after every view of it (tensor, array) is gone."""
    n = 1 << 20
    first = _buffers.recv_buffer(n)
    first[:] = 1
    held = torch.frombuffer(first, dtype=torch.uint8)
    del first
    gc.collect()
    second = _buffers.recv_buffer(n)
    assert second.ctypes.data != held.data_ptr()
    before = _buffers.pool_statistics()
    del held, second
    gc.collect()
    third = _buffers.recv_buffer(n)
    after = _buffers.pool_statistics()
    assert after.hits == before.hits + 1 and after.misses == before.misses
    assert third.nbytes == n and third.flags.writeable


@pytest.mark.parametrize("offset", [0, 16, 40])
def test_large_buffers_are_received_at_the_senders_alignment(offset: int) -> None:
    """layout() records address % 64 of large buffers; recv_buffer() honours it."""
    base = np.ones((1 << 20) + 128, np.uint8)
    start = (offset - base.ctypes.data) % 64
    src = base[start:start + (1 << 20)]
    (entry,) = _buffers.layout([src])
    assert entry == (1 << 20, offset)
    assert _buffers.recv_buffer(*entry).ctypes.data % 64 == offset
    assert _buffers.layout([b"x" * 10]) == (10,)


def test_copy_buffer_is_private_and_writable() -> None:
    """A frame delivered inside one process gets its own copy of each buffer."""
    src = np.arange(1 << 18, dtype=np.uint8)
    out = _buffers.copy_buffer(memoryview(src))
    src[:] = 0
    assert out.flags.writeable and out[5] == 5


# --- pure: memory checks and CUDA awareness -----------------------------------------


def test_local_memory_describes_tensors_and_buffers() -> None:
    """Address, size, device and writability of each accepted kind."""
    t = big()
    m = _buffers.local_memory(t, "x", writable=True)
    assert (m.addr, m.nbytes, m.device, m.readonly) == (t.data_ptr(), t.numel() * 4, "cpu", False)
    a = np.zeros(10, np.int64)
    assert _buffers.local_memory(a, "x", writable=True).addr == a.ctypes.data
    assert _buffers.local_memory(memoryview(b"abc"), "x", writable=False).readonly


def test_local_memory_errors_name_the_fix() -> None:
    """Non-contiguous, read-only and foreign inputs are refused with the fix."""
    with pytest.raises(ValueError, match=r"^x: expecting a contiguous tensor, got shape \(4, 4\) with strides "
                                         r"\(1, 4\); pass tensor.contiguous\(\) \(a copy\) or a contiguous view "
                                         r"such as the flat storage$"):
        _buffers.local_memory(torch.zeros(4, 4).t(), "x", writable=False)
    with pytest.raises(ValueError, match=r"^x: expecting a C-contiguous buffer, got one of shape \(4,\) with "
                                         r"strides \(16,\); pass numpy.ascontiguousarray\(x\) \(a copy\)$"):
        _buffers.local_memory(np.zeros(8)[::2], "x", writable=False)
    with pytest.raises(ValueError, match=r"^x: expecting a writable buffer, got a read-only bytes; pass a "
                                         r"bytearray, numpy array or tensor$"):
        _buffers.local_memory(b"abc", "x", writable=True)
    with pytest.raises(TypeError, match=r"^x: expecting a torch.Tensor, memoryview or other buffer, got list$"):
        _buffers.local_memory([1, 2], "x", writable=False)


def test_cuda_support_is_queried_from_the_loaded_library() -> None:
    """The PyPI MPI wheels are not CUDA-aware, and say so through their query function."""
    from mpi4py import MPI

    support = _buffers.cuda_support()
    assert support.library == MPI.Get_library_version().splitlines()[0].strip("\x00 ")
    assert support.run_time is False and support.aware is False
    assert support.how.startswith(("MPIX_Query_cuda_support", "MPIX_GPU_query_support"))
    path = _mpi.loaded_libmpi()
    assert path is not None and _buffers._ctypes_query(path)[0] == 0


# --- through the runtime ------------------------------------------------------------


class Store(Actor):
    """Receives, keeps and returns bulk data."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []

    @endpoint
    def total(self, x: torch.Tensor) -> float:
        return float(x.double().sum())

    @endpoint
    def echo(self, value: object) -> object:
        return value

    @endpoint
    def keep(self, x: torch.Tensor) -> int:
        self.kept.append(x)
        return len(self.kept)

    @endpoint
    def kept_sums(self) -> list[float]:
        return [float(t.double().sum()) for t in self.kept]

    @endpoint
    def mutate(self, x: torch.Tensor) -> float:
        x += 1  # received tensors are writable and private
        return float(x[0])

    @endpoint
    def make(self, n: int) -> dict[str, object]:
        return {"t": torch.full((n,), float(context().actor_instance.rank.rank)), "a": np.full(n, 3, np.int16)}

    @endpoint
    def pool(self) -> _buffers.PoolStatistics:
        return _buffers.pool_statistics()

    @endpoint
    def forward(self, other: object, x: torch.Tensor) -> float:
        return other.total.call_one(x).get(30)  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="module")
def store(procs: object) -> object:
    mesh = procs.spawn("store", Store)  # type: ignore[attr-defined]
    mesh.initialized.get(30)
    return mesh


@pytest.mark.mesh
def test_tensor_argument_and_result_between_processes(store: object) -> None:
    """A 4 MiB tensor goes to the actor and a dict of large values comes back intact."""
    x = torch.randn(1 << 20)
    assert store.slice(gpus=0).total.call_one(x).get(30) == pytest.approx(float(x.double().sum()))  # type: ignore
    out = store.slice(gpus=1).make.call_one(1 << 16).get(30)  # type: ignore[attr-defined]
    assert torch.equal(out["t"], torch.full((1 << 16,), 1.0)) and out["a"].dtype == np.int16


@pytest.mark.mesh
def test_nested_structures_round_trip(store: object) -> None:
    """Tensors and arrays nested in lists, tuples and dicts, with small values around them."""
    value = {"w": [big(torch.float64), {"deep": (big(torch.int32), "x")}], "a": np.arange(BIG), "s": torch.ones(2)}
    out = store.slice(gpus=0).echo.call_one(value).get(30)  # type: ignore[attr-defined]
    assert torch.equal(out["w"][0], value["w"][0]) and torch.equal(out["w"][1]["deep"][0], value["w"][1]["deep"][0])
    assert out["w"][1]["deep"][1] == "x" and np.array_equal(out["a"], value["a"]) and torch.equal(out["s"], value["s"])


@pytest.mark.mesh
def test_broadcast_sends_the_same_buffers_to_every_actor(store: object) -> None:
    """call() on the whole mesh delivers the tensor to each actor."""
    x = big(torch.float32, 1 << 18)
    expect = float(x.double().sum())
    assert store.total.call(x).get(30).values() == [expect, expect]  # type: ignore[attr-defined]


@pytest.mark.mesh
def test_kept_tensors_are_never_overwritten_by_later_messages(store: object) -> None:
    """The pool does not reuse a block an actor still holds."""
    one = store.slice(gpus=0)  # type: ignore[attr-defined]
    sums = []
    for i in range(6):
        t = torch.full((1 << 18,), float(i))
        sums.append(float(t.double().sum()))
        one.keep.call_one(t).get(30)
    assert one.kept_sums.call_one().get(30)[-6:] == sums


@pytest.mark.mesh
def test_repeated_same_size_messages_reuse_pooled_buffers(store: object) -> None:
    """Steady traffic of one size hits the pool instead of allocating."""
    one = store.slice(gpus=1)  # type: ignore[attr-defined]
    x = torch.randn(1 << 20)
    one.total.call_one(x).get(30)
    before = one.pool.call_one().get(30)
    for _ in range(10):
        one.total.call_one(x).get(30)
    after = one.pool.call_one().get(30)
    # The next call's buffer can arrive (on the worker's background poller)
    # while the actor thread still holds the previous one, between sending
    # its reply and returning: that costs one block, once.
    assert after.hits - before.hits >= 9 and after.misses - before.misses <= 1


@pytest.mark.mesh
def test_a_received_tensor_is_the_receivers_own_copy(store: object) -> None:
    """Mutating an argument in the actor changes nothing at the caller."""
    x = torch.zeros(1 << 16)
    assert store.slice(gpus=0).mutate.call_one(x).get(30) == 1.0  # type: ignore[attr-defined]
    assert float(x.sum()) == 0.0


@pytest.mark.mesh
def test_same_process_delivery_copies_buffers() -> None:
    """An actor in the controller's own process gets private, writable tensors."""
    local = this_proc().spawn("local_store", Store)
    x = torch.zeros(1 << 16)
    assert local.mutate.call_one(x).get(30) == 1.0  # type: ignore[attr-defined]
    assert float(x.sum()) == 0.0
    assert local.total.call_one(big()).get(30) == pytest.approx(float(big().double().sum()))  # type: ignore


@pytest.mark.mesh
def test_actor_to_actor_across_meshes(store: object, one_proc: object) -> None:
    """An actor forwards a tensor to an actor of another process mesh (relayed across islands if spawned)."""
    other = one_proc.spawn("other_store", Store)  # type: ignore[attr-defined]
    x = torch.randn(1 << 18)
    got = store.slice(gpus=0).forward.call_one(other, x).get(60)  # type: ignore[attr-defined]
    assert got == pytest.approx(float(x.double().sum()))
