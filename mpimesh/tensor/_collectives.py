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

from typing import Any, cast

import torch

from .._data.buffers import cuda_support
from .._transport.mpi import MPI

__all__ = ["Communicators", "reduce"]

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

    def get(self, members: tuple[Addr, ...], ports: tuple[str, ...] = ()) -> MPI.Intracomm:
        """The communicator of ``members`` in their order; collective over them on first use.

        Members in one MPI world share a communicator made with
        ``MPI_Comm_create_group``.  A group that spans several worlds (the
        launch pool and spawned islands) is joined island by island: the
        members joined so far accept (``MPI_Comm_accept`` on a port the
        first member opened, one port per further island), the next island's
        members connect, and the two sides merge; a final split puts the
        ranks in group order.
        """
        comm = self._comms.get(members)
        if comm is None:
            comm = self._comms[members] = self._make(members, ports)
        return comm

    def _island_comm(self, island: int, members: tuple[Addr, ...]) -> MPI.Intracomm:
        ranks = [r for i, r in members if i == island]
        world = MPI.COMM_WORLD
        group = world.Get_group().Incl(ranks)
        try:
            return world.Create_group(group, tag=7713)
        finally:
            group.Free()

    def _make(self, members: tuple[Addr, ...], ports: tuple[str, ...]) -> MPI.Intracomm:
        islands = list(dict.fromkeys(i for i, _ in members))
        mine = islands.index(self.me[0])
        local = self._island_comm(self.me[0], members)
        if len(islands) == 1:
            return local
        if len(ports) != len(islands) - 1:
            raise ValueError(f"tensor engine: joining {len(islands)} islands needs {len(islands) - 1} ports, "
                             f"got {len(ports)}")
        joined: MPI.Intracomm | None = local if mine == 0 else None
        for k in range(1, len(islands)):
            if joined is not None:  # already in: accept island k
                inter = joined.Accept(ports[k - 1], root=0)
                merged = inter.Merge(high=False)
            elif k == mine:  # island k: connect
                inter = local.Connect(ports[k - 1], root=0)
                merged = inter.Merge(high=True)
            else:
                continue
            inter.Free()
            if joined is not None and joined is not local:
                joined.Free()
            joined = merged
        if joined is None:
            raise RuntimeError(f"tensor engine: {self.me} was not joined to its group {members}")
        final = cast(MPI.Intracomm, joined.Split(0, members.index(self.me)))
        if joined is not local:
            joined.Free()
        local.Free()
        if mine == 0 and self.me == members[0]:
            for port in ports:
                MPI.Close_port(port)
                if port in self._ports:
                    self._ports.remove(port)
        return final

    def free(self) -> None:
        """Free every communicator and close unused ports (the engine is stopping)."""
        for comm in self._comms.values():
            if comm != MPI.COMM_NULL:
                comm.Free()
        self._comms.clear()
        for port in self._ports:
            MPI.Close_port(port)
        self._ports.clear()


def _host(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A contiguous tensor MPI can read, and whether it is a staging copy of a device tensor."""
    if t.device.type == "cpu":
        return t.detach().contiguous(), False
    if t.device.type == "cuda" and cuda_support().aware:
        return t.detach().contiguous(), False
    return t.detach().to("cpu").contiguous(), True


def _buf(t: torch.Tensor) -> Any:
    # NumPy views share the tensor's memory; CUDA tensors go through DLPack.
    return t.numpy() if t.device.type == "cpu" else t


def reduce(comm: MPI.Intracomm, t: torch.Tensor, reduction: str, scatter: bool, inplace: bool) -> torch.Tensor:
    """Reduce ``t`` over ``comm``'s processes; the result is new unless ``inplace``.

    ``stack`` gathers (a new leading dimension of the group's size, in group
    order); ``scatter=True`` leaves each process the reduction of its block of
    dimension 0 (``Reduce_scatter_block``).
    """
    n = comm.Get_size()
    src, staged = _host(t)
    if reduction == "stack":
        out = torch.empty((n, *src.shape), dtype=src.dtype, device=src.device)
        comm.Allgather(_buf(src), _buf(out))
        return out.to(t.device) if staged else out
    op = _OPS[reduction]
    if scatter:
        out = torch.empty((src.shape[0] // n, *src.shape[1:]), dtype=src.dtype, device=src.device)
        comm.Reduce_scatter_block(_buf(src), _buf(out), op=op)
    elif inplace and not staged and src.data_ptr() == t.data_ptr():
        comm.Allreduce(MPI.IN_PLACE, _buf(src), op=op)
        out = src
    else:
        out = torch.empty_like(src)
        comm.Allreduce(_buf(src), _buf(out), op=op)
    if reduction == "avg":
        out.div_(n) if out.is_floating_point() or out.is_complex() else out.floor_divide_(n)
    if staged:
        out = out.to(t.device)
    if inplace:
        if out.data_ptr() != t.data_ptr():
            with torch.no_grad():
                t.copy_(out)
        return t
    return out
