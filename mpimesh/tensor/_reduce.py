"""``reduce`` and ``reduce_``: collectives over mesh dimensions, checked on the controller."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ._client import MeshClient
from ._handle import Tensor, mesh_tensor, site

__all__ = ["REDUCTIONS", "client_for", "reduce", "reduce_"]

REDUCTIONS = ("sum", "avg", "product", "min", "max", "stack", "band", "bor", "bxor")

# What MPI reduces, by dtype (mpi4py maps these to MPI's predefined types).
_FLOAT = {torch.float32, torch.float64}
_INT = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
_COMPLEX = {torch.complex64, torch.complex128}


def _check_dtype(t: Tensor, reduction: str) -> None:
    dtype = t.dtype
    if reduction == "stack":
        ok = dtype in _FLOAT | _INT | _COMPLEX | {torch.bool, torch.float16, torch.bfloat16}
    elif reduction in ("band", "bor", "bxor"):
        ok = dtype in _INT
    elif reduction in ("min", "max"):
        ok = dtype in _FLOAT | _INT
    elif reduction == "avg":
        ok = dtype in _FLOAT | _COMPLEX
    else:
        ok = dtype in _FLOAT | _INT | _COMPLEX
    if not ok:
        fix = "t.float()" if dtype in (torch.float16, torch.bfloat16, torch.bool) else "t.double()"
        raise TypeError(
            f"tensor engine: MPI cannot {reduction!r}-reduce a tensor of dtype {dtype}; reduce a converted "
            f"copy, e.g. {fix}.reduce(...)"
        )


def _dims(t: Tensor, dims: Any) -> tuple[str, ...]:
    labels = t._procs.view_shape.labels
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    if not names or not all(isinstance(d, str) for d in names):
        raise TypeError(f"tensor engine: dims must be a dimension name or a sequence of them, got {dims!r}")
    for d in names:
        if d not in labels:
            raise ValueError(
                f"tensor engine: {t._procs!r} has no dimension {d!r}; its dimensions are {list(labels)}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"tensor engine: dims {names!r} name a dimension twice")
    return tuple(d for d in labels if d in names)  # mesh order: the order of the group


def _prepare(t: Any, dims: Any, reduction: str, scatter: bool, mesh: Any) -> tuple[Tensor, tuple[str, ...], int]:
    if not isinstance(t, Tensor):
        raise TypeError(
            f"tensor engine: reduce needs an mpimesh.Tensor (made inside procs.activate()), got {type(t).__name__}"
        )
    if mesh is not None and not t._procs.same_view(mesh):
        raise ValueError(f"tensor engine: cannot reduce a tensor of {t._procs!r} over {mesh!r}; use its own mesh")
    if reduction not in REDUCTIONS:
        raise ValueError(f"tensor engine: unknown reduction {reduction!r}; use one of {list(REDUCTIONS)}")
    names = _dims(t, dims)
    _check_dtype(t, reduction)
    n = 1
    for d in names:
        n *= t._procs.view_shape.extent[d]
    if scatter:
        if reduction == "stack":
            raise ValueError("tensor engine: scatter=True does not apply to 'stack'; stack gathers")
        if t.dim() == 0 or t.shape[0] % n:
            raise ValueError(
                f"tensor engine: scatter=True splits dimension 0 into {n} blocks, one per process of {names}, "
                f"but the tensor's shape is {tuple(t.shape)}"
            )
    return t, names, n


def client_for(tensors: list[Tensor], what: str) -> MeshClient:
    """The client of ``tensors`` (of one view), checked for use since a heal or shrink."""
    first = tensors[0]
    client = first._client
    if client.changed:
        client.check_use(first._procs, tensors, what)
    return client


def _many(obj: Any, dims: Any, reduction: str, mesh: Any) -> tuple[list[Tensor], Any, tuple[str, ...]]:
    """The mesh tensors of a pytree (all of one mesh and dtype), its spec, and the dimensions."""
    leaves, spec = tree_flatten(obj)
    if not leaves or not all(isinstance(leaf, Tensor) for leaf in leaves):
        raise TypeError("tensor engine: reduce needs an mpimesh.Tensor or a pytree (list, tuple, dict) of them, "
                        f"got {obj!r}" if not leaves else
                        "tensor engine: reduce needs an mpimesh.Tensor or a pytree (list, tuple, dict) of them, "
                        f"got a {type(next(x for x in leaves if not isinstance(x, Tensor))).__name__} in it")
    if reduction in ("stack",):
        raise ValueError("tensor engine: 'stack' takes one tensor, not a pytree; stack each tensor")
    first = leaves[0]
    names: tuple[str, ...] = ()
    for leaf in leaves:
        _, names, _ = _prepare(leaf, dims, reduction, False, mesh)
        if not first._procs.same_view(leaf._procs):
            raise ValueError(f"tensor engine: reduce of a pytree mixes tensors of {first._procs!r} and "
                             f"{leaf._procs!r}; reduce each mesh's tensors apart")
        if leaf.dtype != first.dtype:
            raise TypeError(f"tensor engine: reduce of a pytree mixes dtypes {first.dtype} and {leaf.dtype}; "
                            "reduce each dtype apart")
    return leaves, spec, names


def reduce(t: Any, dims: Any, reduction: str = "sum", *, scatter: bool = False, mesh: Any = None,
           out: Any = None) -> Any:
    """Reduce ``t`` over the mesh dimensions ``dims`` with an MPI collective; returns a new mesh tensor.

    Each group of processes that share their coordinates on the other
    dimensions ends with the same value: ``sum``, ``avg``, ``product``,
    ``min``, ``max`` and the bitwise ``band``/``bor``/``bxor``
    (``MPI_Allreduce``), or ``stack`` (``MPI_Allgather``: a new leading
    dimension, one entry per process, in mesh order).  ``scatter=True``
    leaves each process its block of dimension 0 (``MPI_Reduce_scatter``).
    ``t`` may also be a pytree (list, tuple, dict) of tensors of one mesh and
    dtype: they are reduced together, with one collective over a flat copy
    (as DDP's buckets), and the result has the same structure.  Runs on the
    tensors' memory, never pickled; returns at once.

    Raises:
        TypeError: ``t`` is not a mesh tensor (or a pytree of them), or MPI cannot reduce its dtype.
        ValueError: an unknown dimension or reduction, or a shape ``scatter`` cannot split.
    """
    if out is not None:
        raise NotImplementedError("tensor engine: reduce(out=...) is not supported; use reduce_() in place")
    if not isinstance(t, Tensor) and isinstance(t, (list, tuple, dict)):
        if scatter:
            raise ValueError("tensor engine: scatter=True takes one tensor, not a pytree")
        leaves, spec, names = _many(t, dims, reduction, mesh)
        first = leaves[0]
        client = client_for(leaves, "reduce")
        results = [mesh_tensor(torch.empty_like(leaf._meta, device="meta"), first._procs, client, leaf.device)
                   for leaf in leaves]
        client.issue(first._procs.view_shape, client.reduce_command(
            first._procs, names, tuple(x._id for x in leaves), tuple(x._id for x in results), reduction,
            False, site()))
        return tree_unflatten(results, spec)
    t, names, n = _prepare(t, dims, reduction, scatter, mesh)
    meta = t._meta
    if reduction == "stack":
        meta = torch.empty((n, *meta.shape), dtype=meta.dtype, device="meta")
    elif scatter:
        meta = torch.empty((meta.shape[0] // n, *meta.shape[1:]), dtype=meta.dtype, device="meta")
    else:
        meta = torch.empty_like(meta, device="meta")
    client = client_for([t], "reduce")
    result = mesh_tensor(meta, t._procs, client, t.device)
    client.issue(t._procs.view_shape, client.reduce_command(
        t._procs, names, (t._id,), (result._id,), reduction, scatter, site()))
    return result


def reduce_(t: Any, dims: Any, reduction: str = "sum", *, scatter: bool = False, mesh: Any = None) -> Any:
    """Reduce ``t`` (a mesh tensor or a pytree of them) over ``dims`` in place; see :func:`reduce`.

    Raises:
        ValueError: as :func:`reduce`, and for ``stack`` or ``scatter=True`` (they change the shape).
    """
    if reduction == "stack" or scatter:
        raise ValueError("tensor engine: reduce_ keeps the shape, so it cannot 'stack' or scatter; use reduce()")
    if not isinstance(t, Tensor) and isinstance(t, (list, tuple, dict)):
        leaves, _, names = _many(t, dims, reduction, mesh)
        first = leaves[0]
        client = client_for(leaves, "reduce_")
        ids = tuple(x._id for x in leaves)
        client.issue(first._procs.view_shape, client.reduce_command(
            first._procs, names, ids, ids, reduction, False, site()))
        return t
    t, names, _ = _prepare(t, dims, reduction, scatter, mesh)
    client = client_for([t], "reduce_")
    client.issue(t._procs.view_shape, client.reduce_command(
        t._procs, names, (t._id,), (t._id,), reduction, False, site()))
    return cast(Tensor, t)
