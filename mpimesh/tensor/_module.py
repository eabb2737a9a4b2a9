"""``module_to_mesh``: a ``torch.nn.Module`` whose parameters are global-view tensors on a mesh.

The brief's training step (``model(x)``, ``loss.backward()``,
``optimizer.step()``, ``loss.item()``) runs unchanged on the result:
parameters are :class:`~._dtensor.DTensor` handles, so the forward and
backward passes run on the workers through torch's DTensor, and any
``torch.optim`` optimizer keeps its state there (its ``zeros_like`` of a
parameter is one).  The placements follow DTensor's data and tensor
parallelism: every parameter is replicated over the data-parallel
dimensions, and a plan shards chosen ``Linear`` layers over one mesh
dimension column-wise (output features, ``Shard(0)`` of the weight) or
row-wise (input features, ``Shard(1)``), as torch's ``ColwiseParallel`` and
``RowwiseParallel`` do.  A replicated parameter's gradient comes out of the
backward pass partial over the data-parallel dimensions; it is all-reduced
to the parameter's placements in buckets started during the backward pass
and waited for at its end (:mod:`._buckets`, DDP's synchronization), so
every process steps with the same gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.tensor import Replicate as _TorchReplicate
from torch.distributed.tensor import Shard as _TorchShard

from . import _mesh
from ._buckets import DEFAULT_BUCKET_CAP_MB, GradBuckets
from ._dtensor import DTensor, distribute_global
from ._handle import Tensor

__all__ = ["module_to_mesh"]

#: Plan entries: column-wise shards a Linear's output features, row-wise its input features.
_STYLES = {"colwise": {"weight": 0, "bias": 0}, "rowwise": {"weight": 1}}


def _style(value: Any) -> str:
    if isinstance(value, str) and value in _STYLES:
        return value
    kind = type(value).__name__
    if kind == "ColwiseParallel":
        return "colwise"
    if kind == "RowwiseParallel":
        return "rowwise"
    raise ValueError(f"module_to_mesh: plan entries must be 'colwise', 'rowwise', ColwiseParallel() or "
                     f"RowwiseParallel(), got {value!r}")


def module_to_mesh(module: torch.nn.Module, mesh: Any, plan: Mapping[str, Any] | None = None, *,
                   tp_dim: str | None = None, shard_inputs: bool = True,
                   bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB) -> torch.nn.Module:
    """Put ``module``'s parameters and buffers on ``mesh`` as global-view tensors; returns ``module``.

    Blocks until the mesh's torch.distributed world exists (the first time
    only); the parameters' values are sent from here.

    Args:
        module: the model, on this process.
        mesh: a :class:`mpimesh.distributed.Mesh` (or any process mesh).
        plan: submodule name -> ``"colwise"`` / ``"rowwise"`` (or torch's
            ``ColwiseParallel()`` / ``RowwiseParallel()``), for ``Linear``
            layers sharded over ``tp_dim``; None: pure data parallelism.
        tp_dim: the mesh dimension the plan shards over; default: the last
            one when a plan is given.  Every other dimension is data-parallel.
        shard_inputs: split plain (controller) tensors passed to
            ``module(...)`` by their first dimension over the data-parallel
            dimensions, as a data loader per rank would (left whole when the
            size does not divide).
        bucket_cap_mb: the gradients summed over the data-parallel
            dimensions go in buckets of about this many MiB (of whole
            parameters), each all-reduced as one tensor as soon as all its
            gradients exist (DDP's ``bucket_cap_mb``, default 25); 0: one
            bucket per parameter.

    Raises:
        TypeError: ``module`` is not a Module, or ``mesh`` not a process mesh.
        ValueError: an unknown plan entry, submodule or dimension, or a negative ``bucket_cap_mb``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module_to_mesh: expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(mesh, _mesh.ProcMesh):
        raise TypeError(f"module_to_mesh: expected a process mesh, got {type(mesh).__name__}; "
                        "e.g. mpimesh.distributed.Mesh(shape=(4, 2), mesh_dim_names=('dp', 'tp'))")
    labels = mesh.view_shape.labels
    plan = dict(plan or {})
    if plan and tp_dim is None:
        tp_dim = labels[-1]
    if tp_dim is not None and tp_dim not in labels:
        raise ValueError(f"module_to_mesh: tp_dim {tp_dim!r} is not a dimension of {mesh!r} {list(labels)}")
    if not isinstance(bucket_cap_mb, (int, float)) or bucket_cap_mb < 0:
        raise ValueError(f"module_to_mesh: bucket_cap_mb must be a number of MiB >= 0, got {bucket_cap_mb!r}")
    styles = {name: _style(value) for name, value in plan.items()}
    submodules = dict(module.named_modules())
    for name in styles:
        if name not in submodules:
            raise ValueError(f"module_to_mesh: the plan names {name!r}, which is not a submodule of the model")
    synchronized: list[torch.nn.Parameter] = []
    for owner_name, owner in submodules.items():
        style = styles.get(owner_name)
        for pname, param in list(owner.named_parameters(recurse=False)):
            placements: list[Any] = [_TorchReplicate() for _ in labels]
            dim = _STYLES[style].get(pname) if style is not None else None
            if dim is not None and tp_dim is not None:
                placements[labels.index(tp_dim)] = _TorchShard(dim)
            handle = distribute_global(param.detach(), mesh, placements)
            new = torch.nn.Parameter(handle, requires_grad=param.requires_grad)
            owner._parameters[pname] = new
            if new.requires_grad:
                synchronized.append(new)
        for bname, buffer in list(owner.named_buffers(recurse=False)):
            if buffer is not None:
                owner._buffers[bname] = distribute_global(buffer, mesh, [_TorchReplicate() for _ in labels])
    dp = [i for i, label in enumerate(labels) if label != tp_dim]
    buckets = GradBuckets(synchronized, dp, int(bucket_cap_mb * (1 << 20)))
    for param in synchronized:
        param.register_post_accumulate_grad_hook(buckets.hook)  # type: ignore[no-untyped-call]
    module.register_forward_pre_hook(buckets.reset)
    if shard_inputs:
        module.register_forward_pre_hook(lambda m, args, kwargs: _shard_inputs(mesh, dp, args, kwargs),
                                          with_kwargs=True)
    module.register_state_dict_post_hook(_gather_state)  # type: ignore[no-untyped-call]
    return module


def _shard_inputs(mesh: Any, dp: list[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    sizes = mesh.view_shape.sizes
    ways = 1
    for i in dp:
        ways *= sizes[i]

    def place(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or isinstance(x, Tensor) or x.dim() == 0:
            return x  # a global tensor already, or a per-process one (the operation's own check names the mix)
        placements: list[Any] = [_TorchReplicate() for _ in sizes]
        if x.shape[0] % ways == 0:
            for i in dp:
                placements[i] = _TorchShard(0)
        return distribute_global(x, mesh, placements)

    return tuple(place(a) for a in args), {k: place(v) for k, v in kwargs.items()}


def _gather_state(module: torch.nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """``state_dict()`` gives whole tensors here: each global tensor is gathered from the workers."""
    for key, value in state.items():
        if isinstance(value, DTensor):
            state[key] = value.full_tensor()
