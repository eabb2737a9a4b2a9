# torch's stubs type ProcessGroup's methods as the Python API's overloads; torch's C++ trampoline
# calls the overrides below with the C++ signatures (lists of tensors and an options object).
# mypy: disable-error-code="override, assignment"
"""The ``"mpimesh"`` torch.distributed backend: a process group whose collectives are MPI's, on the mesh's processes.

``torch.distributed.init_process_group("mpimesh")`` on every process of a
world set up by ``setup_torch_elastic_env`` makes one communicator among
them (``_world.join``); ``new_group`` and DeviceMesh dimensions get
sub-communicators of it.  Every collective runs straight on the tensors'
memory (NumPy views; CUDA tensors as themselves under a CUDA-aware MPI, else
through a host copy) as a nonblocking MPI call, finished by the group's
progress thread (``_work``).  What DDP, FSDP2 and DTensor use is here:
all-reduce (sum, avg, product, min, max, band, bor, bxor), broadcast,
reduce, all-gather (lists, single tensors, coalesced), reduce-scatter
(lists, single tensors, coalesced), all-to-all (lists, single tensors with
or without splits), gather, scatter, barrier, send and recv.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .._data.buffers import cuda_support
from .._transport.mpi import MPI, alone
from . import _world
from ._work import MPIWork, Progress

__all__ = ["BACKEND", "MPIProcessGroup", "register"]

#: The backend's name for ``init_process_group``.
BACKEND = "mpimesh"

_RED: Any = dist.ReduceOp.RedOpType
_OPS: dict[Any, Any] = {
    _RED.SUM: MPI.SUM, _RED.AVG: MPI.SUM, _RED.PRODUCT: MPI.PROD, _RED.MIN: MPI.MIN, _RED.MAX: MPI.MAX,
    _RED.BAND: MPI.BAND, _RED.BOR: MPI.BOR, _RED.BXOR: MPI.BXOR,
}
#: All-reduces of at least this many bytes are made with MPI's blocking call by the group's runner
#: thread: Open MPI's blocking algorithms move large buffers about twice as fast as its nonblocking ones.
BLOCKING_BYTES = 1 << 20
#: dtypes MPI has no type for, reduced in a wider copy
_REDUCE_AS = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.bool: torch.uint8}


def _op(reduce_op: Any, dtype: torch.dtype) -> tuple[Any, bool]:
    """The MPI op for a torch ReduceOp, and whether the result is divided by the group's size."""
    kind = getattr(reduce_op, "op", reduce_op)
    op = _OPS.get(kind)
    if op is None:
        raise ValueError(f"mpimesh backend: reduce op {kind} is not supported; use SUM, AVG, PRODUCT, MIN, MAX, "
                         "BAND, BOR or BXOR")
    if dtype.is_complex and kind not in (_RED.SUM, _RED.AVG, _RED.PRODUCT):
        raise ValueError(f"mpimesh backend: MPI cannot apply {kind} to complex tensors; use SUM or AVG")
    return op, kind == _RED.AVG


class _Buffer:
    """A tensor as MPI reads or writes it: itself when MPI can, else a staging copy copied back after.

    Args:
        t: the caller's tensor.
        reduce: MPI applies an op to it (a type MPI knows is needed); else it moves bytes.
        fill: copy ``t`` into the staging copy (MPI reads it).
    """

    def __init__(self, t: torch.Tensor, reduce: bool, fill: bool = True) -> None:
        self.t = t
        wide = _REDUCE_AS.get(t.dtype) if reduce else None
        cuda = t.device.type == "cuda"
        direct = t.device.type == "cpu" or (cuda and cuda_support().aware)
        if cuda:
            torch.cuda.current_stream(t.device).synchronize()  # MPI must see what the stream wrote
        if direct and wide is None and t.is_contiguous():
            self.w, self.staged = t.detach(), False
        else:
            device = t.device if direct else torch.device("cpu")
            self.w = torch.empty(t.shape, dtype=wide or t.dtype, device=device)
            if fill:
                self.w.copy_(t.detach())
            self.staged = True
        self.reduce = reduce

    @property
    def mpi(self) -> Any:
        """What mpi4py takes: a NumPy view (CPU) or the tensor (CUDA); bytes where no op applies."""
        w = self.w if self.reduce else self.w.reshape(-1).view(torch.uint8)
        return w.numpy() if w.device.type == "cpu" else w

    def back(self) -> None:
        """Copy the result into the caller's tensor, if MPI wrote a staging copy."""
        if self.staged:
            with torch.no_grad():
                self.t.copy_(self.w)


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' elements one after another, in one new contiguous CPU tensor (bytes of any dtype)."""
    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors])


def _divide(t: torch.Tensor, n: int) -> None:
    t.div_(n) if t.is_floating_point() or t.is_complex() else t.floor_divide_(n)


class MPIProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group over an MPI communicator; rank ``r`` is the communicator's rank ``r``.

    Made by ``init_process_group("mpimesh")`` and ``new_group(...)``, not
    by hand.  Every collective returns at once with an :class:`MPIWork`
    (``async_op=False`` waits on it); ``wait()`` raises
    ``DistBackendError`` when a process of the group died, MPI reported an
    error, or the group's timeout passed.  ``comm`` is the communicator, for
    MPI calls of the user's own beside the group's (mpi4py).

    Args:
        comm: the group's communicator (the group owns it: ``shutdown`` frees it).
        world_ranks: the world ranks of the group's processes, in group order.
        timeout: how long a collective may take.
        name: the group's name, for errors.
    """

    def __init__(self, comm: MPI.Intracomm, world_ranks: list[int], timeout: timedelta, name: str) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())  # type: ignore[call-arg]
        self.comm = comm
        with alone():  # a communicator's activation, as _world.island_comm makes it
            self._big = comm.Dup()  # the runner thread's blocking all-reduces, ordered apart from comm's
        self.world_ranks = world_ranks
        self._timeout_s = timeout.total_seconds()
        self._label = f"process group {name!r} (mpimesh, {comm.Get_size()} ranks)"
        self._progress = Progress(self._label, self._dead)
        # torch keeps a group's name and description on its C++ backends, and this group has none
        self._group_name = name
        self._group_desc = ""

    def _dead(self) -> dict[int, str]:
        world = _world.world()
        if world is None:
            return {}
        dead = world.dead(self.world_ranks)
        return {self.world_ranks.index(r): report for r, report in dead.items()}

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """``"mpimesh"``."""
        return BACKEND

    def name(self) -> str:
        """``"mpimesh"``."""
        return BACKEND

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        """The name torch registered the group under (DTensor finds the group by it)."""
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        """Torch names the group once it is made."""
        self._group_name = name

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        """The group's description (``new_group(group_desc=...)``)."""
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        """Torch describes the group once it is made."""
        self._group_desc = desc

    def __repr__(self) -> str:
        return f"<MPIProcessGroup rank {self.rank()} of {self.size()}>"

    def _start(self, name: str, start: Callable[[], list[Any]], finish: Callable[[], Any], keep: Any,
               statuses: list[Any] | None = None, run: Callable[[], None] | None = None) -> MPIWork:
        self._progress.check()
        if run is not None:
            work = MPIWork(name, [], finish, keep, time.monotonic() + self._timeout_s, run=run)
            return self._progress.submit(work)
        try:
            requests = start()
        except MPI.Exception as exc:
            raise dist.DistBackendError(f"mpimesh backend: {name} on {self._label} failed to start: {exc}") from exc
        work = MPIWork(name, requests, finish, keep, time.monotonic() + self._timeout_s, statuses)
        return self._progress.submit(work)

    # --- all-reduce, broadcast, reduce

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> MPIWork:
        """All-reduce each tensor in place (``opts.reduceOp``, default SUM)."""
        reduce_op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        bufs = [_Buffer(t, reduce=True) for t in tensors]
        ops = [_op(reduce_op, t.dtype) for t in tensors]
        n = self.size()

        def finish() -> list[torch.Tensor]:
            for buf, (_, avg) in zip(bufs, ops, strict=True):
                if avg:
                    _divide(buf.w, n)
                buf.back()
            return tensors

        if sum(b.w.numel() * b.w.element_size() for b in bufs) >= BLOCKING_BYTES:
            def run() -> None:
                for b, (o, _) in zip(bufs, ops, strict=True):
                    self._big.Allreduce(MPI.IN_PLACE, b.mpi, op=o)

            return self._start("allreduce", lambda: [], finish, bufs, run=run)
        return self._start("allreduce", lambda: [self.comm.Iallreduce(MPI.IN_PLACE, b.mpi, op=o)
                                                 for b, (o, _) in zip(bufs, ops, strict=True)], finish, bufs)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> MPIWork:
        """All-reduce the tensors (of one dtype) together, with one MPI call over a flat copy."""
        if len({t.dtype for t in tensors}) > 1:
            raise TypeError(f"mpimesh backend: allreduce_coalesced needs tensors of one dtype, got "
                            f"{sorted(str(t.dtype) for t in tensors)}")
        flat = _flat(tensors)
        buf = _Buffer(flat, reduce=True)
        op, avg = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, flat.dtype)
        n = self.size()

        def finish() -> list[torch.Tensor]:
            if avg:
                _divide(buf.w, n)
            buf.back()
            offset = 0
            with torch.no_grad():
                for t in tensors:
                    t.copy_(flat[offset:offset + t.numel()].view(t.shape))
                    offset += t.numel()
            return tensors

        return self._start("allreduce_coalesced", lambda: [self.comm.Iallreduce(MPI.IN_PLACE, buf.mpi, op=op)],
                           finish, buf)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> MPIWork:
        """Broadcast ``tensors`` from ``opts.rootRank`` in place."""
        root = 0 if opts is None else opts.rootRank
        bufs = [_Buffer(t, reduce=False, fill=self.rank() == root) for t in tensors]

        def finish() -> list[torch.Tensor]:
            for b in bufs:
                b.back()
            return tensors

        return self._start("broadcast", lambda: [self.comm.Ibcast(b.mpi, root=root) for b in bufs], finish, bufs)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> MPIWork:
        """Reduce ``tensors`` to ``opts.rootRank``, in place there; the others' tensors are left as they are."""
        root = 0 if opts is None else opts.rootRank
        bufs = [_Buffer(t, reduce=True) for t in tensors]
        ops = [_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, t.dtype) for t in tensors]
        me, n = self.rank(), self.size()

        def start() -> list[Any]:
            return [self.comm.Ireduce(MPI.IN_PLACE if me == root else b.mpi, b.mpi if me == root else None,
                                      op=o, root=root) for b, (o, _) in zip(bufs, ops, strict=True)]

        def finish() -> list[torch.Tensor]:
            if me == root:
                for b, (_, avg) in zip(bufs, ops, strict=True):
                    if avg:
                        _divide(b.w, n)
                    b.back()
            return tensors

        return self._start("reduce", start, finish, bufs)

    # --- all-gather, gather, scatter

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> MPIWork:
        """All-gather ``input`` into ``output`` (the ranks' inputs one after another: ``all_gather_into_tensor``)."""
        src = _Buffer(input, reduce=False)
        out = _Buffer(output, reduce=False, fill=False)

        def finish() -> list[torch.Tensor]:
            out.back()
            return [output]

        return self._start("all_gather_into_tensor", lambda: [self.comm.Iallgather(src.mpi, out.mpi)],
                           finish, (src, out))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> MPIWork:
        """:meth:`all_gather_single` of each pair, as one work (FSDP2's coalesced all-gather)."""
        pairs = [(_Buffer(i, reduce=False), _Buffer(o, reduce=False, fill=False))
                 for o, i in zip(outputs, inputs, strict=True)]

        def finish() -> list[torch.Tensor]:
            for _, out in pairs:
                out.back()
            return outputs

        return self._start("all_gather_into_tensor_coalesced",
                           lambda: [self.comm.Iallgather(s.mpi, o.mpi) for s, o in pairs], finish, pairs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> MPIWork:
        """All-gather each input into its list of outputs, one per rank."""
        n = self.size()
        srcs = [_Buffer(t, reduce=False) for t in inputs]
        flats = [torch.empty((n, *t.shape), dtype=t.dtype) for t in inputs]
        outs = [_Buffer(f, reduce=False, fill=False) for f in flats]

        def finish() -> list[list[torch.Tensor]]:
            with torch.no_grad():
                for flat, row in zip(flats, outputs, strict=True):
                    for k, t in enumerate(row):
                        t.copy_(flat[k])
            return outputs

        return self._start("allgather", lambda: [self.comm.Iallgather(s.mpi, o.mpi)
                                                 for s, o in zip(srcs, outs, strict=True)], finish, (srcs, outs))

    def allgather_coalesced(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> MPIWork:
        """All-gather each input: ``outputs[r][i]`` is rank ``r``'s ``inputs[i]``."""
        by_input = [[outputs[r][i] for r in range(self.size())] for i in range(len(inputs))]
        work = self.allgather(by_input, inputs, opts)
        work.name = "allgather_coalesced"
        return work

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> MPIWork:
        """Gather ``inputs[0]`` of every rank into ``outputs[0]`` on ``opts.rootRank``."""
        root, me, n = (0 if opts is None else opts.rootRank), self.rank(), self.size()
        src = _Buffer(inputs[0], reduce=False)
        flat = torch.empty((n, *inputs[0].shape), dtype=inputs[0].dtype) if me == root else None
        out = _Buffer(flat, reduce=False, fill=False) if flat is not None else None

        def finish() -> list[list[torch.Tensor]]:
            if flat is not None:
                with torch.no_grad():
                    for k, t in enumerate(outputs[0]):
                        t.copy_(flat[k])
            return outputs

        return self._start("gather", lambda: [self.comm.Igather(src.mpi, out.mpi if out else None, root=root)],
                           finish, (src, out))

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> MPIWork:
        """Scatter ``inputs[0]`` (one tensor per rank) from ``opts.rootRank``; each rank's into ``outputs[0]``."""
        root, me = (0 if opts is None else opts.rootRank), self.rank()
        src = _Buffer(_flat(inputs[0]), reduce=False) if me == root else None
        out = _Buffer(outputs[0], reduce=False, fill=False)

        def finish() -> list[torch.Tensor]:
            out.back()
            return outputs

        return self._start("scatter", lambda: [self.comm.Iscatter(src.mpi if src else None, out.mpi, root=root)],
                           finish, (src, out))

    # --- reduce-scatter

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> MPIWork:
        """Reduce ``input`` over the ranks, each keeping its block of it in ``output`` (``reduce_scatter_tensor``)."""
        return self._start("reduce_scatter_tensor", *self._reduce_scatter(output, input, opts))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> MPIWork:
        """:meth:`reduce_scatter_single` of each pair, as one work."""
        parts = [self._reduce_scatter(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._start("reduce_scatter_tensor_coalesced", *_together(parts, outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> MPIWork:
        """Reduce-scatter each list of inputs (one tensor per rank) into its output."""
        parts = [self._reduce_scatter(o, _flat(row), opts) for o, row in zip(outputs, inputs, strict=True)]
        return self._start("reduce_scatter", *_together(parts, outputs))

    def _reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Parts:
        op, avg = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, input.dtype)
        src = _Buffer(input, reduce=True)
        out = _Buffer(output, reduce=True, fill=False)
        n = self.size()

        def finish() -> list[torch.Tensor]:
            if avg:
                _divide(out.w, n)
            out.back()
            return [output]

        return lambda: [self.comm.Ireduce_scatter_block(src.mpi, out.mpi, op=op)], finish, (src, out)

    # --- all-to-all

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                          input_splits: list[int], opts: Any = None) -> MPIWork:
        """All-to-all of dimension 0's rows: ``input_splits[r]`` rows to rank ``r`` (equal blocks without splits)."""
        n = self.size()
        src = _Buffer(input, reduce=False)
        out = _Buffer(output, reduce=False, fill=False)

        def finish() -> list[torch.Tensor]:
            out.back()
            return [output]

        if not output_splits and not input_splits:
            return self._start("all_to_all_single", lambda: [self.comm.Ialltoall(src.mpi, out.mpi)], finish, (src, out))
        in_row = _row_bytes(input)
        out_row = _row_bytes(output)
        ins = list(input_splits) or [input.shape[0] // n] * n
        outs = list(output_splits) or [output.shape[0] // n] * n
        send = (src.mpi, ([c * in_row for c in ins], _displacements(ins, in_row)), MPI.BYTE)
        recv = (out.mpi, ([c * out_row for c in outs], _displacements(outs, out_row)), MPI.BYTE)
        return self._start("all_to_all_single", lambda: [self.comm.Ialltoallv(send, recv)], finish, (src, out))

    alltoall_base = all_to_all_single

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> MPIWork:
        """All-to-all of tensors: ``outputs[r]`` is rank ``r``'s ``inputs[this rank]``."""
        send_flat = _flat([t.reshape(-1).view(torch.uint8) for t in inputs])
        sizes_in = [t.numel() * t.element_size() for t in inputs]
        sizes_out = [t.numel() * t.element_size() for t in outputs]
        recv_flat = torch.empty(sum(sizes_out), dtype=torch.uint8)
        send = (send_flat.numpy(), (sizes_in, _displacements(sizes_in, 1)), MPI.BYTE)
        recv = (recv_flat.numpy(), (sizes_out, _displacements(sizes_out, 1)), MPI.BYTE)

        def finish() -> list[torch.Tensor]:
            offset = 0
            with torch.no_grad():
                for t, size in zip(outputs, sizes_out, strict=True):
                    t.copy_(recv_flat[offset:offset + size].view(t.dtype).view(t.shape))
                    offset += size
            return outputs

        return self._start("alltoall", lambda: [self.comm.Ialltoallv(send, recv)], finish, (send_flat, recv_flat))

    # --- barrier, point to point

    def barrier(self, opts: Any = None) -> MPIWork:
        """Every rank of the group reached it (``MPI_Ibarrier``)."""
        return self._start("barrier", lambda: [self.comm.Ibarrier()], lambda: None, None)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> MPIWork:
        """Send ``tensors[0]`` to group rank ``dst``."""
        buf = _Buffer(tensors[0], reduce=False)
        return self._start("send", lambda: [self.comm.Isend(buf.mpi, dest=dst, tag=tag)], lambda: tensors, buf)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> MPIWork:
        """Receive ``tensors[0]`` from group rank ``src``."""
        return self._recv(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> MPIWork:
        """Receive ``tensors[0]`` from any rank; the work's ``_source_rank()`` tells which."""
        return self._recv(tensors, MPI.ANY_SOURCE, tag)

    def _recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> MPIWork:
        buf = _Buffer(tensors[0], reduce=False, fill=False)
        status = MPI.Status()
        work: list[MPIWork] = []

        def finish() -> list[torch.Tensor]:
            buf.back()
            work[0].source = status.Get_source()
            return tensors

        work.append(self._start("recv", lambda: [self.comm.Irecv(buf.mpi, source=src, tag=tag)], finish, buf,
                                [status]))
        return work[0]

    # --- life

    def shutdown(self) -> None:
        """Stop the progress thread and free the communicator."""
        self._progress.close()
        for comm in (self.comm, self._big):
            if comm != MPI.COMM_NULL:
                try:
                    comm.Free()
                except MPI.Exception:  # a member died (the world is left after a heal): nothing to free with
                    pass

    def abort(self) -> None:
        """Stop the progress thread (the communicator's pending collectives are left to MPI)."""
        self._progress.close()


_Parts = tuple[Callable[[], list[Any]], Callable[[], Any], Any]


def _together(parts: list[_Parts], value: Any) -> _Parts:
    """Several collectives' parts as one work's: all their requests, all their finishes."""
    def start() -> list[Any]:
        return [req for begin, _, _ in parts for req in begin()]

    def finish() -> Any:
        for _, end, _ in parts:
            end()
        return value

    return start, finish, [keep for _, _, keep in parts]


def _row_bytes(t: torch.Tensor) -> int:
    return (t.numel() // t.shape[0] if t.dim() and t.shape[0] else t.numel()) * t.element_size()


def _displacements(counts: list[int], unit: int) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at * unit)
        at += c
    return out


# --- making groups


def _create(common: Any, backend_options: Any) -> MPIProcessGroup:
    """Make a group: torch's hook (``extended_api``): the default group joins the world; a ``new_group`` splits it."""
    timeout = common.timeout if isinstance(common.timeout, timedelta) else timedelta(minutes=30)
    ranks = list(common.global_ranks_in_group)
    if not dist.is_initialized():  # the default group being made
        comm = _world.join(common.store, common.group_rank, common.group_size, timeout.total_seconds())
        return MPIProcessGroup(comm, list(range(common.group_size)), timeout, str(common.group_id))
    parent = dist.group.WORLD
    if not isinstance(parent, MPIProcessGroup):
        raise RuntimeError(f"mpimesh backend: new_group(backend='mpimesh') needs a default group of the mpimesh "
                           f"backend, got {parent!r}; init_process_group('mpimesh') first")
    comm = _world.subgroup(parent.comm, ranks or list(range(parent.size())))
    return MPIProcessGroup(comm, ranks or list(range(parent.size())), timeout, str(common.group_id))


def register() -> str:
    """Make ``"mpimesh"`` a torch.distributed backend in this process (for CPU and CUDA); returns the name.

    Calling it again does nothing.
    """
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    return BACKEND
