"""The tensor engine's command set: what the controller sends and the workers execute.

Commands are plain tuples (cheap to build and to pickle in batches of
hundreds); the first item names the kind.  Tensors in arguments travel as
:class:`Ref` (a worker-side tensor) or as themselves (a controller tensor,
sent with the batch).  This module imports no torch: the worker loop loads it
only when the first engine actor starts.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OP", "OPF", "REMOTE", "DEL", "REDUCE", "RANK", "PUT", "BCAST", "INDEX", "Ref", "Poison"]

#: ("op", "aten::add.Tensor", args, kwargs, out_ids, site): run an operator.
OP = "op"
#: ("opf", "aten::add.Tensor", args, ref_positions, kwargs_or_None, out_ids, site): an operator whose
#: arguments hold no containers; ``args[i]`` for ``i`` in ``ref_positions`` is a worker tensor's id
#: (the common case, read without walking a tree; kwargs hold no worker tensor).
OPF = "opf"
#: ("remote", fn_key, fn_or_None, args, kwargs, out_ids, site): run a @remote function.
REMOTE = "remote"
#: ("del", ids): forget worker tensors (their controller handles are gone).
DEL = "del"
#: ("reduce", in_id, out_id, reduction, scatter, comm_key, groups_or_None, site): a collective.
REDUCE = "reduce"
#: ("rank", out_id, shape, dim, site): each process's coordinate along ``dim`` of ``shape``.
RANK = "rank"
#: ("put", out_id, tensor, site): a tensor sent to one process (distribute).
PUT = "put"
#: ("bcast", ids, metas, comm_key, groups_or_None, root_or_None, site): copy tensors from one process of each
#: group to the others (``broadcast_``); ``metas[i]`` is (shape, dtype, device) for the processes that lack one.
BCAST = "bcast"
#: ("index", {address: base index}): the mesh shrank, so its processes are numbered anew.
INDEX = "index"


class Ref:
    """A worker tensor named by the controller (its id in every process's table)."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class Poison:
    """What a worker stores instead of a tensor whose command failed: the error, kept for the fetch.

    Args:
        what: the command, e.g. ``aten.mm.default``.
        site: the controller line that issued it (``file:line in function``).
        error: the exception's one-line text.
        formatted: the remote traceback.
    """

    __slots__ = ("what", "site", "error", "formatted")

    def __init__(self, what: str, site: str, error: str, formatted: str) -> None:
        self.what = what
        self.site = site
        self.error = error
        self.formatted = formatted
