"""``broadcast_``: copy a tensor from one process to the others of its group, in place (``MPI_Bcast``).

What it is for: after ``ProcMesh.heal()`` the processes that replaced dead
ones hold none of the mesh's tensors; replicated state (model parameters,
optimizer state) is copied there from a survivor with one call, and
data-parallel training goes on (docs/design/tensor.md, "Heal and shrink").
"""

from __future__ import annotations

from typing import Any, cast

from torch.utils._pytree import tree_flatten

from . import _dtensor_worker as _worker
from ._commands import BCAST
from ._dtensor import DTensor, _call, _ensure_world
from ._dtensor_heal import replicated_dims
from ._handle import Tensor, site
from ._reduce import _dims
from ._specs import local_shape as _local_shape

__all__ = ["broadcast_"]


def broadcast_(t: Any, dims: str | tuple[str, ...] | list[str] | None = None, *,
               src: dict[str, int] | None = None) -> Any:
    """Give every process the value that one process of its group holds; in place, returns ``t``.

    A group is the processes that share their coordinates on the mesh
    dimensions not in ``dims`` (default: every dimension, one group), as
    for :func:`mpimesh.reduce`.  ``src`` picks the sending process by its
    coordinates along ``dims`` (missing ones are 0); by default each group
    sends from its first process (in mesh order) that holds the tensor, so
    that after ``procs.heal()`` a survivor's value reaches the replacements::

        except DeviceMeshError:
            procs = procs.heal()
            mpimesh.tensor.broadcast_([*model.parameters(), *momentum])  # replicated state, from a survivor

    Like PyTorch's ``torch.distributed.broadcast``, but over mesh
    dimensions.  ``t`` may be a mesh tensor or a pytree (list, tuple, dict)
    of tensors of one mesh view.  Returns at once.  A process that holds no
    value of the controller's shape and dtype receives into a new tensor;
    a group where no process (or not ``src``) holds one poisons the tensor
    there (``fetch_shard`` raises :class:`~mpimesh.RemoteTensorError`).

    Global-view tensors (:class:`mpimesh.DTensor`: the parameters of
    :func:`mpimesh.module_to_mesh`, their optimizer state) are copied the
    same way, piece by piece, over ``dims`` on which they are replicated:
    after a heal the replacement gets the piece its data-parallel peers
    hold (``broadcast_([*model.parameters(), *momentum], "dp")``).

    Raises:
        TypeError: ``t`` holds something other than mesh tensors.
        ValueError: tensors of several views, an unknown dimension, ``src`` outside the group, or a
            global tensor that is not replicated over ``dims`` (its pieces differ: no survivor holds
            another's), or mixed with per-process tensors.
        SupervisionError: a process of the view is dead (heal or shrink the mesh first).
    """
    leaves, _ = tree_flatten(t)
    if not leaves or not all(isinstance(leaf, Tensor) for leaf in leaves):
        raise TypeError(f"tensor engine: broadcast_ needs an mpimesh.Tensor or a pytree of them, got {t!r}")
    first: Tensor = leaves[0]
    procs = first._procs
    for leaf in leaves[1:]:
        if not procs.same_view(leaf._procs):
            raise ValueError(f"tensor engine: broadcast_ mixes tensors of {procs!r} and {leaf._procs!r}; "
                             "broadcast each mesh's tensors apart")
    shape = procs.view_shape
    names = shape.labels if dims is None else _dims(first, dims)
    root = None
    if src is not None:
        root = 0
        for d in names:
            c = src.get(d, 0)
            if not 0 <= c < shape.extent[d]:
                raise ValueError(f"tensor engine: broadcast_ src {src!r}: {d}={c} is outside {procs!r}")
            root = root * shape.extent[d] + c
        unknown = set(src) - set(names)
        if unknown:
            raise ValueError(f"tensor engine: broadcast_ src {src!r} names {sorted(unknown)}, not among the "
                             f"dimensions broadcast over {list(names)}")
    client = first._client
    if client.changed:
        client.check_use(procs, [], "broadcast_")  # a stale view raises; lost values are what this restores
    if any(isinstance(leaf, DTensor) for leaf in leaves):
        _broadcast_global(leaves, tuple(names), root)
        return t
    key, groups = client.group(procs, tuple(names))
    metas = tuple((tuple(x.shape), x.dtype, str(x.device)) for x in leaves)
    ids = tuple(x._id for x in leaves)
    client.issue(shape, (BCAST, ids, metas, key, groups, root, site()))
    client.restored(procs, ids)
    return t


def _broadcast_global(leaves: list[Tensor], names: tuple[str, ...], root: int | None) -> None:
    """``broadcast_`` of global tensors: each process's piece, as a per-process tensor's value, then rewrapped.

    The piece of each tensor replaces it in the workers' tables
    (``to_local``), goes out as a per-process ``broadcast_`` (a replacement
    holds none and receives it), and becomes the process's share of the
    DTensor again, on the mesh's world, made again first if the mesh was
    healed.
    """
    first = leaves[0]
    procs, client = first._procs, first._client
    labels = procs.view_shape.labels
    metas = []
    for leaf in leaves:
        if not isinstance(leaf, DTensor):
            raise ValueError(f"tensor engine: broadcast_ mixes global tensors and {leaf!r}; "
                             "broadcast per-process tensors apart")
        for name in names:
            p = leaf.placements[labels.index(name)]
            if not p.is_replicate():
                raise ValueError(
                    f"tensor engine: broadcast_ over {name!r}: {leaf!r} is {p} there, each process holding its own "
                    "piece, which no other process can give; broadcast over the dimensions it is replicated on "
                    f"({replicated_dims(leaf)}), or make it again (mpimesh.distribute(...))")
        pieces = {tuple(_local_shape(leaf._spec, r)) for r in range(len(procs.view_shape))}
        if len(pieces) > 1:
            raise ValueError(f"tensor engine: broadcast_ of {leaf!r}: its pieces differ in shape ({sorted(pieces)}); "
                             "redistribute it to placements that split it evenly first")
        metas.append((next(iter(pieces)), leaf.dtype, str(leaf.device)))
    world = _ensure_world(procs, client, first.device)
    for leaf in leaves:
        _call(procs, client, _worker.to_local, (leaf,), (leaf._id,))
    key, groups = client.group(procs, names)
    ids = tuple(x._id for x in leaves)
    client.issue(procs.view_shape, (BCAST, ids, tuple(metas), key, groups, root, site()))
    for leaf in cast(list[DTensor], leaves):  # checked above
        _call(procs, client, _worker.from_local, (world, leaf, leaf.placements, leaf.shape, leaf.stride()),
              (leaf._id,))
    client.restored(procs, ids)
