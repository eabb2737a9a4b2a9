"""One-sided access to memory of other processes: :class:`RDMABuffer` and :class:`RDMAAction`.

The API is Monarch's (``monarch.rdma``).  The process that owns a tensor
wraps it in an :class:`RDMABuffer`; the buffer pickles to a small handle that
travels in endpoint arguments and results like any value; any process that
holds the handle reads the bytes with :meth:`RDMABuffer.read_into` or
overwrites them with :meth:`RDMABuffer.write_from`, without the owner's actors
doing anything.  Nothing synchronizes readers and writers: the owner keeps
the memory stable while others read it, as with Monarch.

How the bytes move (``RDMABuffer.backend`` tells, seen from the caller):

* ``"local"``: the caller owns the buffer: a memory copy.
* ``"cma"``: the owner runs on the same host: one kernel copy between the two
  address spaces (``process_vm_readv``/``writev``); the owner does nothing,
  and may be a launch-pool worker, a spawned worker or the controller.
* ``"mpi"``: otherwise, an MPI one-sided ``Get``/``Put`` on the dynamic
  window of the owner's island (``_windows``); two processes of different
  islands (spawned separately) on different hosts have no window in common.

CUDA tensors: a CUDA destination or source is staged through a pinned host
buffer unless the MPI library is CUDA-aware (``MPIX_Query_cuda_support``).
An :class:`RDMABuffer` over CUDA memory needs a CUDA-aware MPI: without one
nobody but the owner can reach device memory one-sidedly.

Example::

    class Trainer(Actor):
        def __init__(self):
            self.weights = torch.zeros(1 << 20)
            self.handle = RDMABuffer(self.weights.view(torch.uint8))

        @endpoint
        def weights_handle(self) -> RDMABuffer:
            return self.handle

    handle = trainer.weights_handle.call_one().get()
    local = torch.empty(1 << 20)
    handle.read_into(local.view(torch.uint8)).get()
"""

from __future__ import annotations

import errno
import itertools
import os
from dataclasses import dataclass
from typing import Any

from ._core import calls as _calls
from ._core.calls import Here
from ._data import buffers as _buffers
from ._data import cma as _cma
from ._data import pulls as _pulls
from ._data.hugepages import empty_fast, empty_like_fast
from ._data.registry import registry as _registry
from ._waits import when_all
from .context import context
from .errors import SupervisionError
from .future import Future

__all__ = ["RDMABuffer", "RDMAAction", "empty_fast", "empty_like_fast"]

Addr = tuple[int, int]

_DEFAULT_TIMEOUT = 60.0
# Tests and benchmarks force a path: "cma", or "mpi" (not "cma"), or for reads "pull" or "window"
# (MPI: a two-sided pull, ``_data.pulls``, or the island's window); None: choose.
_force: str | None = None


_ids = itertools.count(1)


# ---------------------------------------------------------------------------
# the handle


@dataclass(frozen=True)
class _Handle:
    """What travels: where the bytes are and how to check they still are."""

    owner: Addr
    owner_name: str
    host: str
    pid: int
    start: int | None
    addr: int
    size: int
    device: str
    readonly: bool
    slot: int
    token: int
    window: bool
    ident: int


def _rebuild(handle: _Handle) -> RDMABuffer:
    buf = RDMABuffer.__new__(RDMABuffer)
    buf._h = handle
    buf._dropped = False
    return buf


class RDMABuffer:
    """Memory of this process that other processes read and write one-sidedly.

    Args:
        data: a contiguous CPU tensor (any shape; its bytes are exposed), a
            CUDA tensor (needs a CUDA-aware MPI), or a C-contiguous
            ``memoryview`` or other buffer (numpy array, bytearray).  No copy
            is made: the buffer exposes ``data``'s memory, and keeps ``data``
            alive until :meth:`drop`.

    Raises:
        TypeError: ``data`` is neither a tensor nor a buffer.
        ValueError: ``data`` is empty or not contiguous, or is CUDA memory
            and the MPI library is not CUDA-aware.

    The object pickles to a small handle: return it from an endpoint or pass
    it as an argument, and the receiving process uses it with
    :meth:`read_into` and :meth:`write_from`.  A read-only ``memoryview``
    makes a buffer that can only be read.
    """

    _h: _Handle
    _dropped: bool

    def __init__(self, data: Any) -> None:
        memory = _buffers.local_memory(data, "RDMABuffer", writable=False)
        if memory.nbytes == 0:
            raise ValueError("RDMABuffer: expecting at least 1 byte, got an empty buffer; wrap memory with data in it")
        if memory.device != "cpu" and not _buffers.cuda_support().aware:
            support = _buffers.cuda_support()
            raise ValueError(
                f"RDMABuffer: expecting CPU memory, got a {memory.device} tensor, and the MPI library is not "
                f"CUDA-aware ({support.library}); expose a host copy: host = tensor.cpu().pin_memory(); "
                "RDMABuffer(host), refreshed with host.copy_(tensor), or " + support.fix()
            )
        from ._data.windows import window

        here = _calls.here()
        win = window()
        slot, token, attached = _registry.register(memory, win)
        _cma.allow_readers()
        me = context().actor_instance
        name = me.actor_id if me.actor_id != "client" else ("controller" if here.addr == (0, 0) else
                                                            f"process {here.addr[0]}.{here.addr[1]}")
        self._h = _Handle(here.addr, name, here.host, os.getpid(), _cma.start_time(os.getpid()), memory.addr,
                          memory.nbytes, memory.device, memory.readonly, slot, token, attached, next(_ids))
        self._dropped = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._h,))

    def __repr__(self) -> str:
        h = self._h
        state = ", dropped" if self._dropped else ""
        return (f"<RDMABuffer {h.size} bytes of {h.device} memory of {h.owner_name} "
                f"(process {h.owner[0]}.{h.owner[1]}){state}>")

    def size(self) -> int:
        """The buffer's length in bytes."""
        return self._h.size

    @property
    def owner(self) -> str:
        """The actor (or ``"controller"``, or ``"process I.R"``) that created the buffer."""
        return self._h.owner_name

    @property
    def backend(self) -> str:
        """How :meth:`read_into` from this process moves bytes: ``"local"``, ``"cma"``, ``"mpi"`` or ``"none"``."""
        try:
            return self._path(_calls.here())
        except ConnectionError:
            return "none"

    def read_into(self, dst: Any, *, timeout: float = _DEFAULT_TIMEOUT) -> Future[None]:
        """Copy the whole buffer into the start of ``dst``.

        Args:
            dst: a contiguous CPU or CUDA tensor, or a writable C-contiguous
                buffer, of at least :meth:`size` bytes.
            timeout: seconds for an MPI transfer (same-host copies finish in
                bounded time and ignore it).

        Returns:
            A future that is done when the bytes are in ``dst``.  Same-host
            copies run on the calling thread and return a done future.  The
            future raises ``ValueError`` if the buffer was dropped,
            :class:`SupervisionError` if its owner died, ``TimeoutError``.

        Raises:
            TypeError: ``dst`` is not a tensor or buffer.
            ValueError: ``dst`` is too small, not contiguous or read-only, or
                this handle was dropped.
            ConnectionError: no path from this process to the owner.
        """
        memory = self._read_memory(dst, "RDMABuffer.read_into")
        return self._start("read", memory, self._h.size, timeout)

    def write_from(self, src: Any, *, timeout: float = _DEFAULT_TIMEOUT) -> Future[None]:
        """Copy all of ``src`` into the start of the buffer.

        Args:
            src: a contiguous CPU or CUDA tensor, or a C-contiguous buffer, of
                at most :meth:`size` bytes.
            timeout: seconds for an MPI transfer.

        Returns:
            A future that is done when the bytes are in the owner's memory
            (see :meth:`read_into` for what it raises).

        Raises:
            TypeError: ``src`` is not a tensor or buffer.
            ValueError: ``src`` is too large or not contiguous, the buffer is
                read-only, or this handle was dropped.
            ConnectionError: no path from this process to the owner.
        """
        memory = self._write_memory(src, "RDMABuffer.write_from")
        return self._start("write", memory, memory.nbytes, timeout)

    def drop(self) -> Future[None]:
        """Stop exposing the memory, for every holder of the handle.

        The owner releases its reference to the memory; reads and writes
        through any copy of the handle then fail with ``ValueError``.  Called
        by another process, the owner releases the memory the next time it
        creates or drops a buffer.  Dropping twice, or a buffer whose owner has
        died, does nothing.

        Returns:
            A future done when the handle is invalid everywhere: at once for
            the owner and for same-host holders, after an MPI round trip
            through the window otherwise.
        """
        fut: Future[None] = Future("RDMABuffer.drop()")
        if self._dropped:
            fut.set_result(None)
            return fut
        self._dropped = True
        h = self._h
        here = _calls.here()
        try:
            if h.pid == os.getpid() and h.owner == here.addr:
                _registry.release(h.token)
                _registry.sweep()
            elif h.owner not in here.dead:
                return self._zero_remote_slot(here)
        except (OSError, SupervisionError):
            pass  # the owner is gone, and the buffer with it
        except ConnectionError as exc:
            fut.set_exception(exc)
            return fut
        fut.set_result(None)
        return fut

    # -- paths ------------------------------------------------------------------

    def _check_open(self, op: str) -> None:
        if self._dropped:
            raise ValueError(f"RDMABuffer.{op}: cannot use {self!r} after drop(); ask its owner for a new buffer")

    def _read_memory(self, dst: Any, what: str) -> _buffers.Memory:
        # The local side of a read of the whole buffer (read_into, RDMAAction.read_remote), checked.
        memory = _buffers.local_memory(dst, what, writable=True)
        self._check_open("read_into")
        size = self._h.size
        if memory.nbytes < size:
            raise ValueError(
                f"{what}: expecting a destination of at least {size} bytes for {self!r}, got "
                f"{memory.nbytes} bytes; pass a larger one, e.g. torch.empty({size}, dtype=torch.uint8)"
            )
        return memory

    def _write_memory(self, src: Any, what: str) -> _buffers.Memory:
        # The local side of a write into the buffer (write_from, RDMAAction.write_remote), checked.
        memory = _buffers.local_memory(src, what, writable=False)
        self._check_open("write_from")
        if self._h.readonly:
            raise ValueError(f"{what}: {self!r} exposes read-only memory; "
                             "create the RDMABuffer from writable memory to write to it")
        if memory.nbytes > self._h.size:
            raise ValueError(
                f"{what}: expecting a source of at most {self._h.size} bytes for {self!r}, got "
                f"{memory.nbytes} bytes; write a slice of the source, or expose a larger buffer"
            )
        return memory

    def _path(self, here: Here, op: str = "read") -> str:
        h = self._h
        if h.pid == os.getpid() and h.owner == here.addr:
            return "local"
        if _force in (None, "cma") and h.host == here.host and h.device == "cpu" and _cma.available() \
                and h.pid not in _cma_refused:
            return "cma"
        if op == "read" and self._pulls(here):
            return "mpi"
        from ._data.windows import unavailable, window

        win = window()
        if _force != "cma" and h.window and win is not None and win.reaches(h.owner):
            return "mpi"
        if win is None:
            why = unavailable()
        elif not h.window:
            why = "its memory is not attached to an MPI window"
        elif not win.reaches(h.owner):
            why = f"processes of islands {here.addr[0]} and {h.owner[0]} share no MPI window"
        else:
            why = f"the path was forced to {_force!r}"
        refused = " (the kernel refused a same-host copy: " + _cma.PermissionHint + ")" if h.pid in _cma_refused else ""
        raise ConnectionError(
            f"no path from process {here.addr[0]}.{here.addr[1]} on {here.host} to {self!r} on {h.host}: "
            f"{why}{refused}; "
            "have an actor in the owner's island (same ProcMesh, or launched together under mpiexec) do the transfer"
        )

    def _start(self, op: str, memory: _buffers.Memory, nbytes: int, timeout: float) -> Future[None]:
        here = _calls.here()
        fut: Future[None] = Future(f"RDMABuffer.{'read_into' if op == 'read' else 'write_from'}()")
        self._alive(here)
        path = self._path(here, op)
        if path == "mpi":
            self._mpi(here, op, memory, nbytes, timeout, fut)
            return fut
        try:
            if path == "local":
                self._copy_local(op, memory, nbytes)
            else:
                self._copy_cma(here, op, memory, nbytes, timeout, fut)
        except BaseException as exc:
            if not fut.done():
                fut.set_exception(exc)
        else:
            if not fut.done():
                fut.set_result(None)
        return fut

    def _alive(self, here: Here) -> None:
        h = self._h
        if h.owner in here.dead:
            raise SupervisionError(f"the owner of {self!r} has died: {here.dead[h.owner]}", endpoint="RDMABuffer")

    def _dead(self, here: Here, how: str) -> SupervisionError:
        h = self._h
        report = here.dead.get(h.owner, how)
        return SupervisionError(f"the owner of {self!r} has died: {report}", endpoint="RDMABuffer")

    def _dropped_error(self, op: str, during: bool = False) -> ValueError:
        when = "while it was being copied (the bytes copied are undefined)" if during else "by its owner or a holder"
        return ValueError(f"RDMABuffer.{op}: {self!r} was dropped {when}; ask its owner for a new buffer")

    def _copy_local(self, op: str, memory: _buffers.Memory, nbytes: int) -> None:
        entry = _registry.valid(self._h.token)
        if entry is None:
            raise self._dropped_error(op)
        owner = entry.memory
        if op == "read":
            _copy(memory, owner, nbytes)
        else:
            _copy(owner, memory, nbytes)

    def _copy_cma(self, here: Here, op: str, memory: _buffers.Memory, nbytes: int, timeout: float,
                  fut: Future[None]) -> None:
        h = self._h
        name = "read_into" if op == "read" else "write_from"
        if _cma.start_time(h.pid) != h.start:
            raise self._dead(here, f"process {h.pid} on {h.host} no longer exists")
        staged = None
        try:
            if memory.device != "cpu":
                staged = _buffers.take_staging(nbytes)
                if op == "write":
                    staged[:nbytes].copy_(memory.tensor()[:nbytes])
                local = int(staged.data_ptr())
            else:
                local = memory.addr
            try:
                self._check_token(name)
                if op == "read":
                    _cma.read(h.pid, h.addr, local, nbytes)
                else:
                    _cma.write(h.pid, h.addr, local, nbytes)
                self._check_token(name, during=True)
            except OSError as exc:
                if exc.errno == errno.ESRCH:
                    raise self._dead(here, f"process {h.pid} on {h.host} exited") from None
                if exc.errno in (errno.EPERM, errno.ENOSYS):  # not allowed here: MPI if there is a window
                    _cma_refused.add(h.pid)
                    if self._path(here) == "mpi":
                        self._mpi(here, op, memory, nbytes, timeout, fut)
                        return
                    raise PermissionError(f"RDMABuffer.{name}: the kernel refused to copy from process {h.pid} "
                                          f"({exc.strerror}); {_cma.PermissionHint}") from None
                raise
            if staged is not None and op == "read":
                memory.tensor()[:nbytes].copy_(staged[:nbytes])
        finally:
            if staged is not None:
                _buffers.give_staging(staged)

    def _check_token(self, op: str, during: bool = False) -> None:
        import numpy as np

        h = self._h
        value = np.zeros(1, np.uint64)
        _cma.read(h.pid, h.slot, int(value.ctypes.data), 8)
        if int(value[0]) != h.token:
            raise self._dropped_error(op, during)

    def _zero_remote_slot(self, here: Here) -> Future[None]:
        import numpy as np

        h = self._h
        zero = np.zeros(1, np.uint64)
        fut: Future[None] = Future("RDMABuffer.drop()")
        if self._path(here, "drop") == "cma":
            value = np.zeros(1, np.uint64)
            _cma.read(h.pid, h.slot, int(value.ctypes.data), 8)
            if int(value[0]) == h.token:
                _cma.write(h.pid, h.slot, int(zero.ctypes.data), 8)
            fut.set_result(None)
            return fut
        self._mpi(here, "drop", _buffers.Memory(zero, int(zero.ctypes.data), 8, "cpu", False), 8, _DEFAULT_TIMEOUT,
                  fut)
        return fut

    def _pulls(self, here: Here) -> bool:
        """Whether a read goes as a pull (``_data.pulls``).

        It does when the owner's memory is on its CPU, one message carries it,
        and this process has a direct MPI link to the owner (unless forced elsewhere).
        """
        h = self._h
        return (_force in (None, "mpi", "pull") and h.device == "cpu" and h.size <= _pulls.MAX_BYTES
                and here.pulls.reaches(h.owner))

    def _mpi(self, here: Here, op: str, memory: _buffers.Memory, nbytes: int, timeout: float,
             fut: Future[None]) -> None:
        from ._data.windows import WindowTransfer, window

        name = {"read": "read_into", "write": "write_from", "drop": "drop"}[op]

        def error(kind: str, why: str = "") -> BaseException:
            # "dead" (why: MPI's words when only MPI has said so yet) or "dropped"
            if kind == "dead":
                return self._dead(here, why or "dead")
            return self._dropped_error(name)

        if op == "read" and self._pulls(here):
            _pulls.Pull(here.pulls, here.dead, self._h, repr(self), memory, nbytes, timeout, fut, error).start()
            return
        win = window()
        if win is None:  # _path() chose "mpi": there is one
            raise ConnectionError(f"no MPI window in process {here.addr[0]}.{here.addr[1]}")
        WindowTransfer(win, here.dead, self._h, repr(self), op, memory, nbytes, timeout, fut, error).start()


_cma_refused: set[int] = set()


def _copy(dst: _buffers.Memory, src: _buffers.Memory, nbytes: int) -> None:
    if dst.device == "cpu" and src.device == "cpu":
        dst.array()[:nbytes] = src.array()[:nbytes]
        return
    import torch

    def flat(m: _buffers.Memory) -> Any:
        return m.tensor() if m.device != "cpu" else torch.from_numpy(m.array())

    flat(dst)[:nbytes].copy_(flat(src)[:nbytes])


# ---------------------------------------------------------------------------
# batches


class RDMAAction:
    """A batch of reads and writes on :class:`RDMABuffer` handles, submitted together.

    Build it with :meth:`read_remote` and :meth:`write_remote` (each returns
    the action, so calls chain), then :meth:`submit` it, as many times as
    needed.  Each operation is validated when added; an operation whose
    local memory overlaps another's where one of them writes it, or that
    writes a buffer that another operation of the batch reads or writes, is a
    race and raises ``ValueError``.
    """

    def __init__(self) -> None:
        self._ops: list[tuple[str, RDMABuffer, _buffers.Memory, int]] = []

    def __repr__(self) -> str:
        return f"<RDMAAction of {len(self._ops)} operations>"

    def read_remote(self, dst: Any, src: RDMABuffer) -> RDMAAction:
        """Add: copy all of ``src`` into the start of ``dst`` (see :meth:`RDMABuffer.read_into`).

        Raises:
            TypeError: ``src`` is not an RDMABuffer, or ``dst`` not memory.
            ValueError: ``dst`` is too small or not writable, or the
                operation races with one already added.
        """
        buf = _check_buffer(src, "RDMAAction.read_remote", "src")
        memory = buf._read_memory(dst, "RDMAAction.read_remote")
        self._add("read", buf, memory, buf.size())
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> RDMAAction:
        """Add: copy all of ``src`` into the start of ``dst`` (see :meth:`RDMABuffer.write_from`).

        Raises:
            TypeError: ``dst`` is not an RDMABuffer, or ``src`` not memory.
            ValueError: ``src`` is too large, ``dst`` is read-only, or the
                operation races with one already added.
        """
        buf = _check_buffer(dst, "RDMAAction.write_remote", "dst")
        memory = buf._write_memory(src, "RDMAAction.write_remote")
        self._add("write", buf, memory, memory.nbytes)
        return self

    def fetch_add(self, *args: Any, **kwargs: Any) -> RDMAAction:
        """Not supported (as in Monarch).

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("RDMAAction.fetch_add is not supported; read, add and write back under a lock")

    def compare_and_swap(self, *args: Any, **kwargs: Any) -> RDMAAction:
        """Not supported (as in Monarch).

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("RDMAAction.compare_and_swap is not supported; "
                                  "read, compare and write back under a lock")

    def _add(self, op: str, buf: RDMABuffer, memory: _buffers.Memory, nbytes: int) -> None:
        start, end = memory.addr, memory.addr + nbytes
        for i, (other_op, other, mem, n) in enumerate(self._ops):
            local = mem.device == memory.device and start < mem.addr + n and mem.addr < end
            if local and "read" in (op, other_op):
                raise ValueError(f"RDMAAction: the local memory of operation {len(self._ops)} ({op}) overlaps that "
                                 f"of operation {i} ({other_op}), and a read writes it; use separate memory")
            if other._h.ident == buf._h.ident and other._h.owner == buf._h.owner and "write" in (op, other_op):
                raise ValueError(f"RDMAAction: operation {len(self._ops)} ({op}) and operation {i} ({other_op}) both "
                                 f"touch {buf!r}, and one writes it; split them into two actions")
        self._ops.append((op, buf, memory, nbytes))

    def submit(self, *, timeout: float = _DEFAULT_TIMEOUT) -> Future[None]:
        """Start every operation; MPI transfers run concurrently.

        Returns:
            A future done when all are; it raises the first operation's error.
        """
        what = f"RDMAAction.submit() of {len(self._ops)}"
        futures = []
        try:
            for op, buf, memory, nbytes in self._ops:
                buf._check_open("read_into" if op == "read" else "write_from")
                futures.append(buf._start(op, memory, nbytes, timeout))
        except BaseException as exc:
            out: Future[None] = Future(what)
            out.set_exception(exc)
            return out
        return when_all(futures, what)


def _check_buffer(obj: Any, what: str, name: str) -> RDMABuffer:
    if not isinstance(obj, RDMABuffer):
        raise TypeError(f"{what}: expecting an RDMABuffer as {name}, got {type(obj).__name__}")
    return obj
