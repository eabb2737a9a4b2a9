"""Worker side of the tensor engine: an actor per process that executes the controller's commands.

The controller spawns one :class:`Engine` actor on every process of a mesh
the first time the mesh is activated.  Each process keeps a table from the
controller's tensor ids to its local tensors and runs the commands of a
batch in order (:mod:`._commands`).  A command that fails stores a
:class:`~._commands.Poison` under its outputs instead of tensors; commands
that read a poisoned tensor pass the poison on, and ``fetch`` raises it as a
:class:`~mpimesh.RemoteTensorError`.  The process goes on serving.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any, cast

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .._core import current as _current
from ..actor import Actor, endpoint
from ..context import context, current_rank
from ..errors import RemoteTensorError
from ..shape import Shape
from . import _collectives, _device
from ._commands import BCAST, DEL, INDEX, OP, OPF, PUT, RANK, REDUCE, REMOTE, Poison, Ref

__all__ = ["Engine", "resolve_op"]

_OPS: dict[str, Any] = {}
_KERNELS: dict[str, Any] = {}

#: Seconds a batch waits at most for a fetched tensor's reply to leave before writing to it.
_LEND_BOUND = 60.0


def resolve_op(name: str) -> Any:
    """The operator overload called ``name`` (``"aten::add.Tensor"``), looked up once per process."""
    op = _OPS.get(name)
    if op is None:
        qualified, _, overload = name.partition(".")
        namespace, _, opname = qualified.partition("::")
        packet = getattr(getattr(torch.ops, namespace), opname)
        op = getattr(packet, overload or "default")
        _OPS[name] = op
    return op


class _Poisoned(Exception):
    def __init__(self, poison: Poison) -> None:
        self.poison = poison


class Engine(Actor):
    """Holds this process's tensors of one mesh and runs the controller's commands on them."""

    def __init__(self) -> None:
        _device.use_local_device()  # before any tensor: on a node of several GPUs, not everyone's cuda:0
        # this process's index in the mesh's processes (the base index of every view's Shape)
        self.index = current_rank().rank
        self.table: dict[int, Any] = {}
        self.functions: dict[int, Callable[..., Any]] = {}
        self._lent = False  # a fetch's reply may still be reading a tensor's memory
        self.comms = _collectives.Communicators(context().actor_instance.proc.addresses[0])
        self.spares = _collectives.Spares()
        self.staging = _collectives.Staging()  # page-locked buffers for CUDA tensors a CUDA-unaware MPI reduces
        # reduction groups by the controller's key: this process's group (members' addresses, ports to join them)
        self.groups: dict[int, tuple[tuple[tuple[int, int], ...], tuple[str, ...], str]] = {}

    # --- reading arguments

    def _value(self, x: Any) -> Any:
        if isinstance(x, Ref):
            value = self.table.get(x.id)
            if value is None:
                raise KeyError(f"tensor {x.id} is not on this process (it was deleted or made on another mesh)")
            if isinstance(value, Poison):
                raise _Poisoned(value)
            return value
        return x

    def _store(self, out_ids: tuple[int | None, ...], result: Any) -> None:
        leaves = [x for x in tree_flatten(result)[0] if isinstance(x, torch.Tensor)]
        for i, leaf in zip(out_ids, leaves, strict=False):
            if i is not None:
                self.table[i] = leaf

    def _poison(self, out_ids: Any, poison: Poison) -> None:
        for i in out_ids:
            if i is not None:
                self.table[i] = poison

    # --- commands

    @endpoint
    def run(self, batch: list[tuple[Any, ...]]) -> None:
        """Execute a batch of commands in order (sent with ``broadcast``: nothing is returned)."""
        if self._lent:
            self._lent = False
            _current.current().drain_sends(_LEND_BOUND)
        for command in batch:
            kind = command[0]
            if kind == OPF:
                self._opf(*command[1:])
            elif kind == OP:
                self._op(*command[1:])
            elif kind == DEL:
                for i in command[1]:
                    self.spares.give(self.table.pop(i, None))
            elif kind == REMOTE:
                self._remote(*command[1:])
            elif kind == REDUCE:
                self._reduce(*command[1:])
            elif kind == RANK:
                self._rank(*command[1:])
            elif kind == PUT:
                self.table[command[1]] = command[2]
            elif kind == BCAST:
                self._bcast(*command[1:])
            elif kind == INDEX:
                self.index = command[1][self.comms.me]

    def _opf(self, name: str, args: tuple[Any, ...], refs: tuple[int, ...], kwargs: dict[str, Any] | None,
             outs: tuple[int | None, ...], site: str) -> None:
        # The common command (no containers in the arguments), read without a tree walk and without
        # a closure: T1 in docs/design/tensor.md.  Failures are stored as _guard stores them.
        table = self.table
        try:
            values = list(args)
            for i in refs:
                value = table.get(values[i])
                if value is None or type(value) is Poison:
                    self._value(Ref(values[i]))  # raises: the tensor is missing, or poisoned
                values[i] = value
            kernel = _KERNELS.get(name)
            if kernel is None:
                op = resolve_op(name)
                kernel = _KERNELS[name] = getattr(op, "_op", op)  # the C++ callable OpOverload.__call__ wraps
            result = kernel(*values, **kwargs) if kwargs else kernel(*values)
        except _Poisoned as p:
            self._poison(outs, p.poison)
            return
        except Exception as exc:
            self._failed(outs, name, site, exc)
            return
        if type(result) is torch.Tensor and len(outs) == 1:
            if outs[0] is not None:
                table[outs[0]] = result
        else:
            self._store(outs, result)

    def _op(self, name: str, args: Any, kwargs: Any, outs: tuple[int | None, ...], site: str) -> None:
        self._guard(outs, name, site, lambda: resolve_op(name)(*self._tree(args), **self._tree(kwargs)))

    def _remote(self, key: int, fn: Callable[..., Any] | None, args: Any, kwargs: Any,
                outs: tuple[int | None, ...], site: str) -> None:
        if fn is not None:
            self.functions[key] = fn
        known = self.functions[key]
        self._guard(outs, getattr(known, "__qualname__", repr(known)), site,
                    lambda: known(*self._tree(args), **self._tree(kwargs)))

    def _rank(self, out: int, shape: Shape, dim: str, site: str) -> None:
        self._guard((out,), f"rank_tensor({dim!r})", site, lambda: self._coordinate(shape, dim))

    def _tree(self, tree: Any) -> Any:
        return tree_map(self._value, tree)

    def _guard(self, outs: tuple[int | None, ...], what: str, site: str, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
        except _Poisoned as p:
            self._poison(outs, p.poison)
        except Exception as exc:
            self._failed(outs, what, site, exc)
        else:
            self._store(outs, result)

    def _failed(self, outs: tuple[int | None, ...], what: str, site: str, exc: Exception) -> None:
        formatted = "".join(traceback.format_exception(exc))
        self._poison(outs, Poison(what, site, f"{type(exc).__name__}: {exc}", formatted))

    def _coordinate(self, shape: Shape, dim: str) -> torch.Tensor:
        rank = shape.ranks().index(self.index)
        return torch.tensor(shape.coordinates(rank)[dim])

    def _reduce(self, in_ids: tuple[int, ...], out_ids: tuple[int, ...], reduction: str, scatter: bool, key: int,
                groups: dict[int, tuple[tuple[tuple[int, int], ...], tuple[str, ...], str]] | None, site: str) -> None:
        what = f"reduce({reduction!r})"
        try:
            comm = self._group(key, groups)
        except Exception as exc:  # the communicator could not be made (MPI): the result says why
            self._failed(out_ids, what, site, exc)
            return
        if comm is None:
            self._poison(out_ids, Poison(what, site, _NO_GROUP, ""))
            return
        values = [self.table.get(i) for i in in_ids]
        bad: Poison | None = next((v for v in values if isinstance(v, Poison)), None)
        if bad is None and any(v is None for v in values):
            bad = Poison(what, site, "KeyError: a tensor to reduce is not on this process", "")
        # Every member takes part even when an input is poisoned (or MPI would
        # hang the others); a poisoned input anywhere poisons the outputs
        # everywhere, and so do local tensors whose shapes differ (a remote
        # function may make them so), which MPI would misread.
        mine = None if bad is not None else tuple((tuple(v.shape), str(v.dtype)) for v in values if v is not None)
        try:
            everyone = comm.allgather(mine)
        except Exception as exc:  # a member died (MPI_ERR_PROC_FAILED): the result says so, the engine goes on
            self._failed(out_ids, what, site, exc)
            return
        if bad is None and any(other is None for other in everyone):
            bad = Poison(what, site, "the input is poisoned on another process of the group", "")
        if bad is None and len(set(everyone)) > 1:
            shapes = "; ".join(str(other) for other in everyone)
            bad = Poison(what, site, f"ValueError: the local tensors differ in shape or dtype across the group: "
                                     f"{shapes}", "")
        if bad is not None:
            for out in out_ids:
                self.table[out] = bad
            return
        tensors = cast(list[torch.Tensor], values)  # checked above: no poison, none missing
        try:
            if len(tensors) == 1:
                self.table[out_ids[0]] = _collectives.reduce(
                    comm, tensors[0], reduction, scatter, inplace=in_ids == out_ids, spares=self.spares,
                    staging=self.staging)
            else:
                results = _collectives.reduce_many(comm, tensors, reduction, inplace=in_ids == out_ids,
                                                   staging=self.staging)
                for out, result in zip(out_ids, results, strict=True):
                    self.table[out] = result
        except Exception as exc:
            formatted = "".join(traceback.format_exception(exc))
            for out in out_ids:
                self.table[out] = Poison(what, site, f"{type(exc).__name__}: {exc}", formatted)

    def _group(self, key: int, groups: dict[int, tuple[tuple[tuple[int, int], ...], tuple[str, ...], str]] | None,
               ) -> Any:
        # This process's communicator of group ``key``; None when this process never heard of the group:
        # it replaced a dead process after the command was queued (its peers' collective fails, not hangs:
        # the group held the dead process).
        if groups is not None:
            self.groups[key] = groups[self.index]
        group = self.groups.get(key)
        return None if group is None else self.comms.get(*group)

    def _bcast(self, ids: tuple[int, ...], metas: tuple[tuple[tuple[int, ...], torch.dtype, str], ...], key: int,
               groups: dict[int, tuple[tuple[tuple[int, int], ...], tuple[str, ...], str]] | None, root: int | None,
               site: str) -> None:
        # broadcast_: the processes that hold every tensor with the controller's shape and dtype say so;
        # the chosen one (``root``, or the first holder) sends, the others receive, into their own
        # tensor or a new one (a process that replaced a dead one has none).
        what = "broadcast_"
        try:
            comm = self._group(key, groups)
        except Exception as exc:
            self._failed(ids, what, site, exc)
            return
        if comm is None:
            self._poison(ids, Poison(what, site, _NO_GROUP, ""))
            return
        values = [self.table.get(i) for i in ids]
        have = all(isinstance(v, torch.Tensor) and tuple(v.shape) == shape and v.dtype == dtype
                   for v, (shape, dtype, _) in zip(values, metas, strict=True))
        try:
            everyone = comm.allgather(have)
        except Exception as exc:  # a member died: the result says so, the engine goes on
            self._failed(ids, what, site, exc)
            return
        if root is None:
            root = next((r for r, h in enumerate(everyone) if h), None)
        if root is None or not everyone[root]:
            error = ("no process of the group holds the tensor to copy (with its shape and dtype)" if root is None
                     else f"process {root} of the group, the source, does not hold the tensor (with its shape "
                          "and dtype)")
            self._poison(ids, Poison(what, site, f"ValueError: {error}", ""))
            return
        me = comm.Get_rank()
        try:
            for i, value, (shape, dtype, device) in zip(ids, values, metas, strict=True):
                if me != root and not (have and isinstance(value, torch.Tensor)):
                    value = self.table[i] = torch.empty(shape, dtype=dtype, device=device)
                _collectives.broadcast(comm, cast(torch.Tensor, value), root, self.staging)
        except Exception as exc:
            self._failed(ids, what, site, exc)

    @endpoint
    def open_ports(self, count: int) -> list[str]:
        """Open ``count`` MPI ports: this process leads a reduction group that spans several MPI worlds."""
        return self.comms.open_ports(count)

    # --- values back

    @endpoint
    def fetch(self, id: int) -> torch.Tensor:
        """A copy of this process's tensor ``id`` on the CPU.

        Raises:
            RemoteTensorError: an operation the tensor depends on failed.
        """
        value = self.table.get(id)
        if value is None:
            raise KeyError(f"tensor {id} is not on this process (it was deleted or made on another mesh)")
        if isinstance(value, Poison):
            error = RemoteTensorError(value.what, value.site, value.error)
            raise error from _Formatted(value.formatted) if value.formatted else error
        if value.device.type == "cpu" and value.is_contiguous():
            # Lent, not copied (a 64 MiB copy into fresh memory cost 3x the
            # transfer): the reply is sent from this memory, so the next batch
            # waits for the sends to leave before it may write to it.
            self._lent = True
            lent: torch.Tensor = value.detach()
            return lent
        result: torch.Tensor = value.detach().to("cpu").contiguous()
        return result

    @endpoint
    def stats(self) -> dict[str, int]:
        """How many tensors (and poisoned results) this process holds, and how many communicators."""
        poisoned = sum(isinstance(v, Poison) for v in self.table.values())
        return {"tensors": len(self.table) - poisoned, "poisoned": poisoned, "communicators": len(self.comms)}

    def __cleanup__(self, exc: BaseException | None) -> None:
        self.table.clear()
        self.comms.free()


_NO_GROUP = ("SupervisionError: this process replaced a dead one after the collective was issued; "
             "issue it again")


class _Formatted(Exception):
    """The traceback text of the failed operation, as the cause of the fetch's error."""

    def __str__(self) -> str:
        return str(self.args[0])
