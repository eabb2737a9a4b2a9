"""Worker side of ``reduce``: MPI collectives straight on tensor memory, over mesh dimensions.

A reduction over dimensions ``dims`` of a mesh runs within each *group*: the
processes that share their coordinates on every other dimension.  Each
group gets its own communicator, made once with ``MPI_Comm_create_group``
(collective over the group's processes only) and cached by its members.
CPU tensors are passed to MPI as NumPy views of their memory (no copy, no
pickling); CUDA tensors go straight to a CUDA-aware MPI and through a host
copy otherwise.
"""

from __future__ import annotations

import sys
from typing import Any, cast

import torch

from .._data.buffers import cuda_support
from .._torchmpi._world import island_comm, join_islands
from .._transport.mpi import MPI
from ..rma import empty_fast

__all__ = ["Communicators", "broadcast", "reduce"]

_OPS: dict[str, Any] = {
    "sum": MPI.SUM, "avg": MPI.SUM, "product": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN,
    "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR,
}


Addr = tuple[int, int]


class Communicators:
    """This process's communicators for reductions, by their members' addresses (in group order).

    Args:
        me: this process's address, ``(island, rank in the island's MPI world)``.
    """

    def __init__(self, me: Addr) -> None:
        self.me = me
        self._comms: dict[tuple[Addr, ...], MPI.Intracomm] = {}
        self._ports: list[str] = []

    def __len__(self) -> int:
        return len(self._comms)

    def open_ports(self, count: int) -> list[str]:
        """Open ``count`` MPI ports for :meth:`get` to accept on (this process leads a group)."""
        ports = [MPI.Open_port() for _ in range(count)]
        self._ports.extend(ports)
        return ports

    def get(self, members: tuple[Addr, ...], ports: tuple[str, ...] = (), tag: str = "") -> MPI.Intracomm:
        """The communicator of ``members`` in their order; collective over them on first use.

        Members in one MPI world share a communicator made with
        ``MPI_Comm_create_group``.  A group that spans several worlds (the
        launch pool and spawned islands) is joined island by island: the
        members joined so far accept (``MPI_Comm_accept`` on a port the
        first member opened, one port per further island), the next island's
        members connect, and the two sides merge; a final split puts the
        ranks in group order (:func:`mpimesh._torchmpi._world.join_islands`,
        which the ``"mpimesh"`` backend's world joins by too).

        ``tag`` (not empty once a process of the job has died): each
        island's part is made with ``MPI_Comm_create_from_group`` under that
        tag instead, which involves the members only; under ULFM
        ``MPI_Comm_create_group`` fails with ``MPI_ERR_PROC_FAILED`` once
        the world holds a dead process, even for a group without it.  That
        call is made while no other thread of the runtime calls MPI
        (:func:`mpimesh._transport.mpi.alone`): beside the
        wire's polling, Open MPI 5 waits for ever in its activation in
        about a third of the tries.
        """
        comm = self._comms.get(members)
        if comm is None:
            comm = self._comms[members] = self._make(members, ports, tag)
        return comm

    def _make(self, members: tuple[Addr, ...], ports: tuple[str, ...], tag: str = "") -> MPI.Intracomm:
        islands = list(dict.fromkeys(i for i, _ in members))
        local = island_comm(members, self.me[0], tag, group_tag=7713)
        if len(islands) == 1:
            return local
        if len(ports) != len(islands) - 1:
            local.Free()
            raise ValueError(f"tensor engine: joining {len(islands)} islands needs {len(islands) - 1} ports, "
                             f"got {len(ports)}")
        final = join_islands(local, islands, islands.index(self.me[0]), ports, members.index(self.me))
        if final is None:
            raise RuntimeError(f"tensor engine: {self.me} was not joined to its group {members}")
        if self.me == members[0]:
            for port in ports:
                MPI.Close_port(port)
                if port in self._ports:
                    self._ports.remove(port)
        return final

    def free(self) -> None:
        """Free every communicator and close unused ports (the engine is stopping)."""
        for comm in self._comms.values():
            if comm != MPI.COMM_NULL:
                try:
                    comm.Free()
                except MPI.Exception:  # a member died (the mesh was healed or shrunk since): nothing to free with
                    pass
        self._comms.clear()
        for port in self._ports:
            MPI.Close_port(port)
        self._ports.clear()


def _host(t: torch.Tensor, staging: Staging | None = None) -> tuple[torch.Tensor, bool]:
    """A contiguous tensor MPI can read, and whether it is a staging copy of a device tensor.

    A CUDA tensor goes to MPI as itself when the MPI is CUDA-aware, else
    through a page-locked host buffer (``staging``), which the device copies
    to and from at full speed.
    """
    if t.device.type == "cpu":
        return t.detach().contiguous(), False
    if t.device.type == "cuda" and cuda_support().aware:
        return t.detach().contiguous(), False
    if staging is None:
        return t.detach().to("cpu").contiguous(), True
    host = staging.take(tuple(t.shape), t.dtype)
    host.copy_(t.detach())
    return host, True


class Staging:
    """Page-locked host buffers for device tensors an MPI that is not CUDA-aware must read, reused.

    Pinning memory costs far more than a copy (the pages are locked one by
    one), so buffers are kept for the next reduction of their size: at most
    two per size, ``MAX_BYTES`` in all.  Without CUDA (tests) the buffers are
    plain host memory.
    """

    MAX_BYTES = 1 << 30

    def __init__(self, pin: bool | None = None) -> None:
        self._pin = pin
        self._free: dict[tuple[int, torch.dtype], list[torch.Tensor]] = {}
        self._bytes = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous host tensor of ``shape`` and ``dtype``: a kept one when there is one."""
        numel = 1
        for d in shape:
            numel *= d
        free = self._free.get((numel, dtype))
        if free:
            flat = free.pop()
            self._bytes -= flat.numel() * flat.element_size()
        else:
            if self._pin is None:
                self._pin = torch.cuda.is_available()
            flat = torch.empty(numel, dtype=dtype, pin_memory=self._pin)
        return flat.view(shape)

    def give(self, t: torch.Tensor) -> None:
        """``t`` (from :meth:`take`) is no longer read: keep its memory for the next take of its size."""
        flat = t if t._base is None else t._base
        nbytes = flat.numel() * flat.element_size()
        free = self._free.setdefault((flat.numel(), flat.dtype), [])
        if len(free) < 2 and self._bytes + nbytes <= self.MAX_BYTES:
            free.append(flat)
            self._bytes += nbytes


def _buf(t: torch.Tensor) -> Any:
    # NumPy views share the tensor's memory; CUDA tensors go through DLPack.
    return t.numpy() if t.device.type == "cpu" else t


class Spares:
    """Large reduction results the controller let go, kept for the next reduction of that size.

    A fresh 64 MiB tensor costs ~16,000 page faults on first touch (more
    than the Allreduce itself on one host); a loop of ``s = t.reduce(...)``
    frees the previous result just before it makes the next.  Only results
    this module made, whose memory nothing else shares, are kept: at most
    two per size, ``MAX_BYTES`` in all.
    """

    MIN_BYTES = 1 << 20
    MAX_BYTES = 1 << 30

    def __init__(self) -> None:
        self._free: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = {}
        self._bytes = 0
        self.made: set[int] = set()  # data_ptr of results this module allocated and still holds in a table

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A tensor of ``shape``: a spare one when there is one, else a new one."""
        numel = 1
        for d in shape:
            numel *= d
        spares = self._free.get((numel, dtype, device))
        if spares:
            t = spares.pop()
            self._bytes -= t.numel() * t.element_size()
            # The same memory in the asked shape, and not a view (t.view would be one, and give()
            # leaves views alone): the result can be a spare again once released.
            out = t if t.shape == shape else torch.empty((0,), dtype=dtype, device=device).set_(
                t.untyped_storage(), 0, shape, _contiguous(shape))
        else:
            out = _empty(shape, dtype, device)
        if numel * out.element_size() >= self.MIN_BYTES:
            self.made.add(out.data_ptr())
        return out

    def give(self, t: Any) -> None:
        """``t`` left its table: keep its memory if this module made it and nothing shares it."""
        if not isinstance(t, torch.Tensor) or t._base is not None or t.data_ptr() not in self.made:
            return  # not ours; or a view, which may start where its base does (``s[:1]``): its base stays ours
        self.made.discard(t.data_ptr())
        nbytes = t.numel() * t.element_size()
        key = (t.numel(), t.dtype, t.device)
        spares = self._free.setdefault(key, [])
        # Nothing else holds it: no Python reference but this call's (a remote
        # function may have kept one), no view or other tensor on its memory.
        unique = (sys.getrefcount(t) <= 2 and t._base is None
                  and torch._C._storage_Use_Count(t.untyped_storage()._cdata) <= 2)
        if unique and len(spares) < 2 and self._bytes + nbytes <= self.MAX_BYTES and t.is_contiguous():
            spares.append(t)
            self._bytes += nbytes


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A new result: in huge pages on the CPU, which a later Send moves faster (``mpimesh.empty_fast``)."""
    if device.type == "cpu":
        return cast(torch.Tensor, empty_fast(shape, dtype=dtype))
    return torch.empty(shape, dtype=dtype, device=device)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The row-major strides of ``shape``."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def reduce(comm: MPI.Intracomm, t: torch.Tensor, reduction: str, scatter: bool, inplace: bool,
           spares: Spares | None = None, staging: Staging | None = None) -> torch.Tensor:
    """Reduce ``t`` over ``comm``'s processes; the result is new unless ``inplace``.

    ``stack`` gathers (a new leading dimension of the group's size, in group
    order); ``scatter=True`` leaves each process the reduction of its block of
    dimension 0 (``Reduce_scatter_block``).
    """
    n = comm.Get_size()
    src, staged = _host(t, staging)
    if staged and staging is not None:
        try:
            return _reduce_staged(comm, t, src, reduction, scatter, inplace, staging)
        finally:
            staging.give(src)
    new = spares.take if spares is not None and not staged else _empty
    if reduction == "stack":
        out = new((n, *src.shape), src.dtype, src.device)
        comm.Allgather(_buf(src), _buf(out))
        return out.to(t.device) if staged else out
    op = _OPS[reduction]
    if scatter:
        out = new((src.shape[0] // n, *src.shape[1:]), src.dtype, src.device)
        comm.Reduce_scatter_block(_buf(src), _buf(out), op=op)
    elif inplace and not staged and src.data_ptr() == t.data_ptr():
        comm.Allreduce(MPI.IN_PLACE, _buf(src), op=op)
        out = src
    else:
        out = new(tuple(src.shape), src.dtype, src.device)
        comm.Allreduce(_buf(src), _buf(out), op=op)
    if reduction == "avg":
        _divide(out, n)
    if staged:
        out = out.to(t.device)
    if inplace:
        if out.data_ptr() != t.data_ptr():
            with torch.no_grad():
                t.copy_(out)
        return t
    return out


def _reduce_staged(comm: MPI.Intracomm, t: torch.Tensor, src: torch.Tensor, reduction: str, scatter: bool,
                   inplace: bool, staging: Staging) -> torch.Tensor:
    # A device tensor through page-locked host buffers: src holds t's copy; the collective runs in
    # place on it (or into a second staging buffer), and the result is copied to t's device.
    n = comm.Get_size()
    if reduction == "stack" or scatter:
        shape = (n, *src.shape) if reduction == "stack" else (src.shape[0] // n, *src.shape[1:])
        out = staging.take(shape, src.dtype)
        try:
            if reduction == "stack":
                comm.Allgather(_buf(src), _buf(out))
            else:
                comm.Reduce_scatter_block(_buf(src), _buf(out), op=_OPS[reduction])
            if reduction == "avg":
                _divide(out, n)
            return out.to(t.device, copy=True)  # a copy even to the host: out goes back to the staging
        finally:
            staging.give(out)
    comm.Allreduce(MPI.IN_PLACE, _buf(src), op=_OPS[reduction])
    if reduction == "avg":
        _divide(src, n)
    if inplace:
        with torch.no_grad():
            t.copy_(src)
        return t
    return src.to(t.device, copy=True)


def _divide(t: torch.Tensor, n: int) -> None:
    t.div_(n) if t.is_floating_point() or t.is_complex() else t.floor_divide_(n)


def reduce_many(comm: MPI.Intracomm, tensors: list[torch.Tensor], reduction: str,
                inplace: bool, staging: Staging | None = None) -> list[torch.Tensor]:
    """Reduce several tensors of one dtype with one ``Allreduce`` over a flat copy of them all.

    As DDP's buckets do: one collective instead of one per tensor (each
    costs a round of messages, and more on a crowded machine).  The results
    are the inputs (``inplace``) or views of one new buffer.  Tensors of one
    device are joined there, so a device that MPI cannot read is staged once.
    """
    n = comm.Get_size()
    if len({t.device for t in tensors}) == 1:
        joined = torch.cat([t.detach().reshape(-1) for t in tensors])
        host, staged = _host(joined, staging)
        try:
            comm.Allreduce(MPI.IN_PLACE, _buf(host), op=_OPS[reduction])
            if reduction == "avg":
                _divide(host, n)
            if staged:
                joined.copy_(host)
        finally:
            if staged and staging is not None:
                staging.give(host)
        flat = joined
    else:
        flat = torch.cat([_host(t)[0].reshape(-1) for t in tensors])
        comm.Allreduce(MPI.IN_PLACE, _buf(flat), op=_OPS[reduction])
        if reduction == "avg":
            _divide(flat, n)
    results = []
    offset = 0
    for t in tensors:
        piece = flat[offset:offset + t.numel()].view(t.shape)
        offset += t.numel()
        if inplace:
            with torch.no_grad():
                t.copy_(piece)
            results.append(t)
        else:
            results.append(piece.to(t.device))
    return results


def broadcast(comm: MPI.Intracomm, t: torch.Tensor, root: int, staging: Staging | None = None) -> None:
    """Give ``t`` on every process of ``comm`` the value it has on ``root`` (``MPI_Bcast``, in place)."""
    src, staged = _host(t, staging)
    try:
        comm.Bcast(_buf(src), root=root)
        if src.data_ptr() != t.data_ptr():
            with torch.no_grad():
                t.copy_(src)
    finally:
        if staged and staging is not None:
            staging.give(src)
