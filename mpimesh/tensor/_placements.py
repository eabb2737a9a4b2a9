"""Placements: how a tensor is laid out over mesh dimensions.

mpimesh's ``Shard``, ``Replicate`` (the per-process blocks of
:func:`~._distribute.distribute`) and ``Partial``; and for global-view
tensors (:mod:`._dtensor`): the brief's ``sharding_spec`` (or a list of
placements) as torch placements, one per mesh dimension, and the
``DeviceMesh`` without a process group on which DTensor's sharding
propagation runs on the controller.  No handle, no command, no worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial as _TorchPartial
from torch.distributed.tensor import Placement
from torch.distributed.tensor import Replicate as _TorchReplicate
from torch.distributed.tensor import Shard as _TorchShard

if TYPE_CHECKING:
    from ._mesh import ProcMesh

__all__ = ["Partial", "Replicate", "Shard", "device_mesh", "placements_of"]

#: Per mesh view: the controller's process-group-less DeviceMesh that propagation runs on.
_DEVICE_MESHES: dict[Any, DeviceMesh] = {}


@dataclass(frozen=True)
class Shard:
    """Split the tensor's dimension ``dim`` into equal blocks along one mesh dimension."""

    dim: int


@dataclass(frozen=True)
class Replicate:
    """Give every process along one mesh dimension the whole tensor."""


@dataclass(frozen=True)
class Partial:
    """A placement of global-view tensors: each process along one mesh dimension holds a part of the value.

    The value is the parts reduced with ``reduce_op`` (``"sum"``, ``"avg"``,
    ...), as torch's ``Partial``; DTensor reduces them when an operation
    needs the whole value.
    """

    reduce_op: str = "sum"


def device_mesh(procs: ProcMesh, device: torch.device) -> DeviceMesh:
    """The controller's ``DeviceMesh`` of ``procs`` for ``device``: its shape and names, no process group."""
    shape = procs.view_shape
    key = (procs.mesh_id, shape, device.type)
    mesh = _DEVICE_MESHES.get(key)
    if mesh is None:
        # No process group: DTensor's propagation reads the mesh's shape only.
        mesh = _DEVICE_MESHES[key] = DeviceMesh(
            device.type, torch.arange(len(shape)).view(shape.sizes), mesh_dim_names=shape.labels,
            _init_backend=False, _rank=0)
    return mesh


def placements_of(spec: Sequence[Any], procs: ProcMesh, ndim: int) -> tuple[Placement, ...]:
    """Torch placements, one per mesh dimension, from the brief's ``sharding_spec`` or placements.

    ``sharding_spec`` names, per tensor dimension, the mesh dimension it is
    split over, or None; a sequence of placements (torch's or mpimesh's
    ``Shard``/``Replicate``, and ``Partial``) gives one per mesh dimension,
    as DTensor does.

    Raises:
        TypeError: entries of another kind, or names and placements mixed.
        ValueError: an unknown mesh dimension, the wrong number of entries.
    """
    labels = procs.view_shape.labels
    entries = list(spec)
    if any(isinstance(e, str) for e in entries) or (entries and all(e is None for e in entries)):
        if not all(e is None or isinstance(e, str) for e in entries):
            raise TypeError(f"distribute: sharding_spec mixes mesh dimension names and placements: {entries!r}; "
                            "give one name or None per tensor dimension, or one placement per mesh dimension")
        if len(entries) != ndim:
            raise ValueError(f"distribute: expecting a sharding_spec entry per tensor dimension ({ndim}), "
                             f"got {len(entries)}: {entries!r}")
        chosen: list[Placement] = [_TorchReplicate() for _ in labels]
        for dim, name in enumerate(entries):
            if name is None:
                continue
            if name not in labels:
                raise ValueError(f"distribute: {name!r} is not a dimension of {procs!r} {list(labels)}")
            at = labels.index(name)
            if isinstance(chosen[at], _TorchShard):
                raise ValueError(f"distribute: mesh dimension {name!r} shards two tensor dimensions in {entries!r}")
            chosen[at] = _TorchShard(dim)
        return tuple(chosen)
    if len(entries) != len(labels):
        raise ValueError(f"distribute: {procs!r} has {len(labels)} dimensions {list(labels)}, so give "
                         f"{len(labels)} placements, got {len(entries)}")
    out: list[Placement] = []
    for label, p in zip(labels, entries, strict=True):
        if isinstance(p, Shard):
            p = _TorchShard(p.dim)
        elif isinstance(p, Replicate):
            p = _TorchReplicate()
        elif isinstance(p, Partial):
            p = _TorchPartial(p.reduce_op)
        if not isinstance(p, Placement):
            raise TypeError(f"distribute: placement for {label!r} must be Shard(d), Replicate() or Partial(), "
                            f"got {p!r}")
        if isinstance(p, _TorchShard) and not -ndim <= p.dim < ndim:
            raise ValueError(f"distribute: Shard({p.dim}) for {label!r}: the tensor has {ndim} dimensions")
        if isinstance(p, _TorchShard) and p.dim < 0:
            p = _TorchShard(p.dim + ndim)
        out.append(p)
    return tuple(out)
