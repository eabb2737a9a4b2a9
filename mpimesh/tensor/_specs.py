"""Arithmetic on global tensors' specs, by DTensor's own rules: each process's block, and where blocks are equal.

No communication and no handles: :mod:`._dtensor` uses these to size a
per-process view (``to_local``) and to fetch a tensor block by block
(``full_tensor``).
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate as _TorchReplicate
from torch.distributed.tensor import Shard as _TorchShard
from torch.distributed.tensor._dtensor_spec import DTensorSpec

__all__ = ["contiguous_strides", "even_block", "local_shape"]


def local_shape(spec: DTensorSpec, rank: int) -> list[int]:
    """The shape of the piece that process ``rank`` of the mesh holds, by DTensor's own arithmetic."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    coordinate = [int(c) for c in (spec.mesh.mesh == rank).nonzero()[0]]
    shape, _ = _compute_local_shape_and_global_offset(spec.shape, spec.mesh.mesh.shape, coordinate,
                                                      spec.placements, skip_offset=True)
    return list(shape)


def even_block(spec: DTensorSpec) -> list[int] | None:
    """The shape of each process's block where all hold equal blocks split in mesh-dimension order; else None."""
    shape = list(spec.shape)
    for size, p in zip(spec.mesh.mesh.shape, spec.placements, strict=True):
        if type(p) is _TorchShard:
            if shape[p.dim] % size:
                return None
            shape[p.dim] //= size
        elif type(p) is not _TorchReplicate:  # Partial: the parts must be reduced; _StridedShard: interleaved
            return None
    return shape


def contiguous_strides(shape: list[int]) -> tuple[int, ...]:
    """C-contiguous strides of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
