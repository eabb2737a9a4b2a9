"""Tensors and arrays as MPI buffers: dtype, contiguity, device, pools.

The data plane's view of memory.  Nothing here imports torch: a tensor can
only exist if the user imported torch, so ``sys.modules`` tells (STYLE §1:
the worker loop stays light).

* :func:`local_memory` checks a tensor, array or memoryview handed to the
  data plane and returns its address, size and device, or raises the error
  that names the fix.
* :func:`reduce_tensor` / :func:`rebuild_tensor` carry large tensors out of
  band in pickle protocol 5: a small header in the pickle, the raw bytes as
  an MPI message.
* :func:`recv_buffer` hands out receive buffers from a pool of blocks that
  are reused once nothing refers to them any more (the transport's pool,
  ``mpimesh._transport.buffers``, re-exported here with :func:`layout`,
  :func:`copy_buffer` and :func:`pool_statistics`).
* :func:`cuda_support` says once whether the loaded MPI is CUDA-aware.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._transport.buffers import (
    POOL_LIMIT_BYTES,
    PoolStatistics,
    copy_buffer,
    layout,
    pool_statistics,
    recv_buffer,
)

if TYPE_CHECKING:
    import numpy as np

# numpy is imported where it is used: it would triple the time of
# `import mpimesh` (docs/design/data.md), and a worker that only ever gets
# small messages never needs it.

__all__ = [
    "CudaSupport",
    "Memory",
    "PoolStatistics",
    "as_array",
    "copy_buffer",
    "cuda_support",
    "local_memory",
    "page_lock",
    "pool_statistics",
    "rebuild_tensor",
    "recv_buffer",
    "reduce_tensor",
    "give_staging",
    "layout",
    "staging",
    "take_staging",
]


def _torch() -> Any:
    return sys.modules.get("torch")


# ---------------------------------------------------------------------------
# local memory: what the data plane reads from and writes into


@dataclass(frozen=True)
class Memory:
    """A contiguous range of bytes in this process.

    Attributes:
        obj: the object that owns the memory; kept to keep it alive.
        addr: address of the first byte (a device address for CUDA memory).
        nbytes: length in bytes.
        device: ``"cpu"`` or ``"cuda:N"``.
        readonly: the memory must not be written.
    """

    obj: Any
    addr: int
    nbytes: int
    device: str
    readonly: bool

    def array(self) -> np.ndarray:
        """The bytes as a flat uint8 numpy array (host memory only)."""
        return as_array(self.addr, self.nbytes, self.obj)

    def tensor(self) -> Any:
        """The bytes as a flat uint8 torch tensor on its device (tensors only)."""
        return self.obj.detach().reshape(-1).view(_torch().uint8)


def as_array(addr: int, nbytes: int, owner: Any = None) -> np.ndarray:
    """A flat uint8 numpy array over ``nbytes`` host bytes at ``addr``.

    The array does not keep the memory alive; the caller holds ``owner``.
    """
    import numpy as np

    if nbytes == 0:
        return np.empty(0, np.uint8)
    raw: Any = (ctypes.c_char * nbytes).from_address(addr)
    return np.frombuffer(raw, np.uint8)


def local_memory(obj: Any, what: str, *, writable: bool) -> Memory:
    """Check ``obj`` (tensor, numpy array, memoryview, bytearray...) and describe its memory.

    Args:
        obj: the memory handed to the data plane.
        what: the call, for error messages (``"RDMABuffer.read_into"``).
        writable: the call writes into it.

    Raises:
        TypeError: ``obj`` is neither a tensor nor a buffer.
        ValueError: ``obj`` is not contiguous, is read-only where it is
            written, or lives on a device other than the CPU or a GPU.
    """
    import numpy as np

    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.is_quantized or obj.is_nested:
            raise ValueError(f"{what}: expecting a dense tensor, got layout {obj.layout}; pass tensor.to_dense()")
        if not obj.is_contiguous():
            raise ValueError(
                f"{what}: expecting a contiguous tensor, got shape {tuple(obj.shape)} with strides {obj.stride()}; "
                "pass tensor.contiguous() (a copy) or a contiguous view such as the flat storage"
            )
        kind = obj.device.type
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"{what}: expecting a CPU or CUDA tensor, got one on {obj.device}; pass tensor.cpu()")
        device = "cpu" if kind == "cpu" else f"cuda:{obj.device.index or 0}"
        return Memory(obj, obj.data_ptr(), obj.numel() * obj.element_size(), device, False)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"{what}: expecting a torch.Tensor, memoryview or other buffer, got {type(obj).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ValueError(
            f"{what}: expecting a C-contiguous buffer, got one of shape {view.shape} with strides {view.strides}; "
            "pass numpy.ascontiguousarray(x) (a copy)"
        )
    if writable and view.readonly:
        raise ValueError(f"{what}: expecting a writable buffer, got a read-only {type(obj).__name__}; "
                         "pass a bytearray, numpy array or tensor")
    flat = np.frombuffer(view.cast("B"), np.uint8) if view.nbytes else np.empty(0, np.uint8)
    return Memory((obj, flat), int(flat.ctypes.data), view.nbytes, "cpu", view.readonly)


# ---------------------------------------------------------------------------
# tensors out of band


def reduce_tensor(tensor: Any, threshold: int) -> Any:
    """A pickle reduction that sends ``tensor``'s bytes out of band, or ``NotImplemented``.

    Only dense CPU or CUDA tensors of at least ``threshold`` bytes qualify
    (CUDA tensors are staged through host memory); the rest keep torch's
    own reducer, except that a small view of a larger storage is first copied
    (torch's reducer sends the whole storage).  A non-contiguous tensor is
    copied into a contiguous one, so views of one storage arrive as separate
    tensors.
    """
    torch = _torch()
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
        return NotImplemented
    if tensor.device.type not in ("cpu", "cuda") or (tensor.requires_grad and not tensor.is_leaf):
        return NotImplemented
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes < max(threshold, 1):
        if type(tensor) is torch.Tensor and tensor.untyped_storage().nbytes() > nbytes:
            # A small view of a larger storage: torch's reducer would send the whole storage
            # (a 4-byte element of a 64 MiB result cost 250 ms); send a compact copy instead.
            compact = tensor.detach().clone().requires_grad_(tensor.requires_grad)
            return compact.__reduce_ex__(5)
        return NotImplemented
    kind = type(tensor)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        return NotImplemented
    data = tensor.detach()
    if data.is_conj():
        data = data.resolve_conj()
    if data.is_neg():
        data = data.resolve_neg()
    device = "cpu"
    if data.device.type == "cuda":
        device = f"cuda:{data.device.index or 0}"
    staged = None
    if data.device.type == "cuda":
        # A reused page-locked buffer: the copy off the GPU runs at DMA speed, with no fresh pages
        # to fault in (a pageable copy of 64 MiB ran 2.5x slower end to end on an H100 machine).
        staged = take_staging(nbytes)
        host = staged[:nbytes].view(data.dtype).view(data.shape)
        host.copy_(data)
        data = host
    elif not data.is_contiguous():
        # A copy mpimesh makes anyway goes into huge pages, which a Send moves faster.
        from .hugepages import empty_fast

        host = empty_fast(tuple(data.shape), dtype=data.dtype)
        host.copy_(data)
        data = host
    flat = data.reshape(-1).view(torch.uint8)
    raw = flat.numpy()
    if staged is not None:  # back to the pool once the send (through the PickleBuffer) lets go of ``raw``
        weakref.finalize(raw, give_staging, staged)
    dtype = str(data.dtype).rpartition(".")[2]
    args = (pickle_buffer(raw), dtype, tuple(data.shape), device, bool(tensor.requires_grad),
            kind is torch.nn.Parameter)
    return rebuild_tensor, args


def pickle_buffer(array: Any) -> Any:
    """``pickle.PickleBuffer`` over ``array`` (imported here to keep the name local)."""
    import pickle

    return pickle.PickleBuffer(array)


def rebuild_tensor(buf: Any, dtype: str, shape: tuple[int, ...], device: str, requires_grad: bool,
                   parameter: bool) -> Any:
    """Inverse of :func:`reduce_tensor`: a tensor over ``buf`` (no copy for CPU tensors).

    Raises:
        RuntimeError: the tensor was on a GPU that this process does not have.
    """
    import torch

    kind = getattr(torch, dtype)
    view = memoryview(buf)
    if view.readonly:
        buf = bytearray(view)  # torch.frombuffer warns on (and must not share) read-only memory
    count = 1
    for n in shape:
        count *= n
    if count == 0:
        out = torch.empty(shape, dtype=kind)
    else:
        out = torch.frombuffer(buf, dtype=kind, count=count).view(shape)
    if device != "cpu":
        index = int(device.partition(":")[2] or 0)
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= have:
            raise RuntimeError(f"cannot rebuild a {device} tensor in process {os.getpid()}, which has {have} CUDA "
                               "devices; send tensor.cpu() instead")
        page_lock(buf)
        out = out.to(device)
    if parameter:
        return torch.nn.Parameter(out, requires_grad=requires_grad)
    if requires_grad:
        out.requires_grad_(True)
    return out


# ---------------------------------------------------------------------------
# GPU staging and CUDA awareness

#: Receive blocks page-locked in place for CUDA (``cudaHostRegister``), by address.
_locked: dict[int, bool] = {}
#: Smaller blocks are not worth a registration (and are not the pool's own mappings).
LOCK_MIN_BYTES = 2 << 20


def page_lock(buf: Any, cudart: Any = None) -> bool:
    """Page-lock, once, the pool's receive block under ``buf``, so that a copy from it to a GPU runs at DMA speed.

    A copy onto the GPU from pageable memory goes through the driver's own
    staging: 8.1 ms for 64 MiB on an H100 machine, against 1.25 ms from
    page-locked memory (docs/design/data.md, "GPUs").  The pool keeps its
    large blocks (huge-page mappings), so each is registered once; it is
    unregistered when the pool and every tensor over it let go of it, before
    its mapping goes.  Best effort: anything else (a copy, a small block, a
    registration CUDA refuses) is left pageable.  True where ``buf`` is in
    page-locked memory now.  A refused registration's error is cleared from
    the CUDA runtime's last error, which a later, unrelated CUDA call would
    report otherwise.

    Args:
        buf: the receive buffer a CUDA tensor is about to be copied from.
        cudart: the CUDA runtime library (``cudaHostRegister``, ``cudaHostUnregister``,
            ``cudaGetLastError``); ``None``: the one torch loaded (:func:`_cudart`), and nothing is
            registered where there is none.
    """
    import mmap

    import numpy as np

    try:
        obj: Any = memoryview(buf).obj
    except TypeError:
        return False
    block = None
    while isinstance(obj, np.ndarray):
        block, obj = obj, obj.base
    if isinstance(obj, memoryview):  # a pool block's base: the memoryview of its mapping
        obj = obj.obj
    if block is None or not isinstance(obj, mmap.mmap) or block.nbytes < LOCK_MIN_BYTES:
        return False
    addr = int(block.ctypes.data)
    with _staging_lock:
        known = _locked.get(addr)
        if known is not None:
            return known
        cudart = cudart if cudart is not None else _cudart()
        if cudart is None:
            return False
        ok = int(cudart.cudaHostRegister(addr, block.nbytes, 0)) == 0
        if not ok:
            cudart.cudaGetLastError()  # reset the runtime's last error to cudaSuccess
        _locked[addr] = ok
    if ok:
        weakref.finalize(block, _unlock, addr, cudart)
    return ok


_runtime: list[Any] = []  # the CUDA runtime library, once found


def _cudart() -> Any:
    """The CUDA runtime library torch loaded (ctypes), or ``None``: no torch, no CUDA, or none mapped.

    Not ``torch.cuda.cudart()``: its bindings lack ``cudaGetLastError``, and
    only the runtime that made an error can clear it, so this is the very
    ``libcudart`` mapped into the process (a second copy has an error state of
    its own).  A torch that links the runtime statically has none: its
    blocks stay pageable.
    """
    if _runtime:
        return _runtime[0]
    torch = _torch()
    if torch is None or not torch.cuda.is_available():
        return None
    with open("/proc/self/maps") as maps:
        paths = [line[line.index("/"):].strip() for line in maps if "/libcudart.so" in line]
    if not paths:
        return None
    lib = ctypes.CDLL(paths[0])
    lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    _runtime.append(lib)
    return lib


def _unlock(addr: int, cudart: Any) -> None:
    with _staging_lock:
        if _locked.pop(addr, False):
            cudart.cudaHostUnregister(addr)  # an error at exit (CUDA gone) changes nothing


_staging_lock = threading.Lock()
_staging_free: list[Any] = []


def take_staging(nbytes: int) -> Any:
    """A flat uint8 host tensor of at least ``nbytes`` bytes, pinned when CUDA is available.

    Give it back with :func:`give_staging`: pinned allocations cost milliseconds.
    """
    import torch

    with _staging_lock:
        fits = [b for b in _staging_free if b.numel() >= nbytes]
        buf = min(fits, key=lambda b: b.numel()) if fits else None
        if buf is not None:
            _staging_free.remove(buf)
    if buf is None:
        buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    return buf


def give_staging(buf: Any) -> None:
    """Return a buffer from :func:`take_staging` for reuse."""
    with _staging_lock:
        _staging_free.append(buf)
        while sum(b.numel() for b in _staging_free) > POOL_LIMIT_BYTES and len(_staging_free) > 1:
            _staging_free.remove(min(_staging_free, key=lambda b: b.numel()))


@contextlib.contextmanager
def staging(nbytes: int) -> Iterator[Any]:
    """:func:`take_staging` as a context manager, yielding exactly ``nbytes`` bytes."""
    buf = take_staging(nbytes)
    try:
        yield buf[:nbytes]
    finally:
        give_staging(buf)


@dataclass(frozen=True)
class CudaSupport:
    """Whether the MPI library in this process can take CUDA device buffers.

    Attributes:
        compile_time: what the MPI headers said when ``mpimesh._native`` was
            built (``None``: unknown, no native part, or built against another MPI).
        run_time: what the loaded library answers (``None``: it has no query).
        library: the loaded library's version line.
        how: the query used (``"MPIX_Query_cuda_support via ctypes"``...).
    """

    compile_time: bool | None
    run_time: bool | None
    library: str
    how: str

    @property
    def aware(self) -> bool:
        """Device buffers may be passed to MPI directly."""
        return bool(self.run_time) if self.run_time is not None else bool(self.compile_time)

    def fix(self) -> str:
        """How to get a CUDA-aware MPI, for messages."""
        return ("use an MPI built with CUDA (Open MPI configured --with-cuda, or MPICH --with-cuda) and install "
                "mpi4py against it: MPICC=/path/to/mpicc pip install --no-binary mpi4py mpi4py")


_cuda: CudaSupport | None = None


def _ctypes_query(path: str) -> tuple[int, str]:
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return -2, ""
    fn = getattr(lib, "MPIX_Query_cuda_support", None)
    if fn is not None:
        fn.restype, fn.argtypes = ctypes.c_int, []
        return int(bool(fn())), "MPIX_Query_cuda_support"
    fn = getattr(lib, "MPIX_GPU_query_support", None)
    if fn is not None:
        flag = ctypes.c_int(0)
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        ok = fn(0, ctypes.byref(flag)) == 0  # MPIX_GPU_SUPPORT_CUDA == 0
        return int(ok and bool(flag.value)), "MPIX_GPU_query_support"
    return -1, ""


def cuda_support() -> CudaSupport:
    """Ask the loaded MPI library, once, whether it is CUDA-aware.

    Uses the native part (``mpimesh._native``) when it was built, else ctypes;
    both call ``MPIX_Query_cuda_support`` (Open MPI) or
    ``MPIX_GPU_query_support`` (MPICH) in the library mpi4py loaded.
    """
    global _cuda
    if _cuda is not None:
        return _cuda
    from .._transport.mpi import library, loaded_libmpi

    lib = library().strip("\x00 ")
    path = loaded_libmpi()
    compile_time: bool | None = None
    try:
        from .. import _native
    except ImportError:
        native = None
    else:
        native = _native
    if native is not None:
        built = native.built_with()
        value = native.cuda_compile_time()
        if value >= 0 and lib.startswith(built.split(" ")[0]):
            compile_time = bool(value)
    code, fn = -2, ""
    source = "native" if native is not None else "ctypes"
    if path is not None:
        code, fn = native.cuda_run_time(path) if native is not None else _ctypes_query(path)
    run_time = bool(code) if code >= 0 else None
    how = f"{fn} via {source}" if fn else f"no query function in {path or 'the loaded libmpi'}"
    _cuda = CudaSupport(compile_time, run_time, lib, how)
    return _cuda
