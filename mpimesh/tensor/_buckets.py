"""Gradient synchronization of ``module_to_mesh``, as DDP does it: buckets, started during the backward pass.

A parameter replicated over the data-parallel mesh dimensions gets its
gradient partial (a per-process sum) over them.  The parameters are put in
buckets of about ``bucket_cap_mb`` (in the reverse order of registration, as
DDP: the order the backward pass produces gradients in) and of one dtype.
When every gradient of a bucket has been accumulated, one command starts
the bucket's all-reduce on the workers without waiting
(:func:`._dtensor_worker.bucket_start`: one flat tensor, ``async_op=True``
on the data-parallel dimension's process group), so the engine computes the
rest of the backward pass while it runs.  At the end of the backward pass
(a callback queued on autograd's engine) buckets that did not fill (a
parameter unused this step) are started too, then every bucket is waited
for and the gradients become the summed ones, with their parameters'
placements.  A gradient partial over other dimensions as well (a
tensor-parallel reduction DTensor left pending) goes through DTensor's own
redistribution at once, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.tensor import Partial as _TorchPartial
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

from . import _dtensor_worker as _worker
from ._dtensor import DTensor, _call, _handle, _redistributed
from ._handle import mesh_tensor

__all__ = ["DEFAULT_BUCKET_CAP_MB", "GradBuckets"]

#: DDP's default bucket size.
DEFAULT_BUCKET_CAP_MB = 25.0

#: A bucket's parameters that have their gradient: id(param) -> (param, gradient).
_Ready = dict[int, tuple[DTensor, DTensor]]


class GradBuckets:
    """The gradient buckets of one module's parameters (made by ``module_to_mesh``).

    Args:
        params: the parameters that need a gradient, in registration order.
        dp: the indices of the data-parallel mesh dimensions.
        cap_bytes: the most bytes of parameters (whole, not per process) in one bucket; 0: one per parameter.
    """

    def __init__(self, params: Iterable[torch.Tensor], dp: list[int], cap_bytes: int) -> None:
        self._dp = dp
        self.buckets: list[list[int]] = []  # ids of the parameters of each bucket
        self._bucket_of: dict[int, int] = {}
        open_: dict[torch.dtype, tuple[int, int]] = {}  # dtype -> (its open bucket, bytes in it)
        for p in reversed(list(params)):
            size = p.numel() * p.element_size()
            at = open_.get(p.dtype)
            if at is None or (at[1] > 0 and at[1] + size > cap_bytes):
                at = (len(self.buckets), 0)
                self.buckets.append([])
            self.buckets[at[0]].append(id(p))
            self._bucket_of[id(p)] = at[0]
            open_[p.dtype] = (at[0], at[1] + size)
        self._ready: list[_Ready] = [{} for _ in self.buckets]
        self._started: list[tuple[Any, list[tuple[DTensor, DTensor]]]] = []
        self._queued = False

    def reset(self, *_: Any) -> None:
        """Forget a backward pass that raised before its end (a forward pre-hook: each step starts clean).

        Its started buckets are never waited for here; their sums land in
        flat tensors nobody reads, freed with their handles.
        """
        self._ready = [{} for _ in self.buckets]
        self._started = []
        self._queued = False

    def hook(self, param: torch.Tensor) -> None:
        """After ``param``'s gradient accumulated: count it in its bucket, and start the bucket once full."""
        grad = param.grad
        if not isinstance(param, DTensor) or not isinstance(grad, DTensor) or grad.placements == param.placements:
            return
        if self._partial_dims(param, grad) is None:  # more than a data-parallel sum: DTensor's redistribution
            spec = DTensorSpec(grad._spec.mesh, param.placements, grad._spec.tensor_meta)
            param.grad = _redistributed(grad, spec)
            return
        if not self._queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._queued = True
        index = self._bucket_of[id(param)]
        ready = self._ready[index]
        ready[id(param)] = (param, grad)
        if len(ready) == len(self.buckets[index]):
            self._start(index)

    def _partial_dims(self, param: DTensor, grad: DTensor) -> list[int] | None:
        """The data-parallel dimensions ``grad`` is a sum over, or None where it differs from ``param`` otherwise."""
        dims = []
        for i, (want, have) in enumerate(zip(param.placements, grad.placements, strict=True)):
            if want == have:
                continue
            if i not in self._dp or not isinstance(have, _TorchPartial) or have.reduce_op != "sum":
                return None
            dims.append(i)
        return dims

    def _start(self, index: int) -> None:
        """Start the all-reduce of the gradients ready in bucket ``index``, one per set of dimensions."""
        ready, self._ready[index] = self._ready[index], {}
        by_dims: dict[tuple[int, ...], list[tuple[DTensor, DTensor]]] = {}
        for param, grad in ready.values():
            by_dims.setdefault(tuple(self._partial_dims(param, grad) or ()), []).append((param, grad))
        for dims, pairs in by_dims.items():
            first = pairs[0][1]
            # a per-process tensor only bucket_finish reads: its shape here is no process's
            flat = mesh_tensor(torch.empty(0, dtype=first.dtype, device="meta"), first._procs, first._client,
                               first.device)
            _call(first._procs, first._client, _worker.bucket_start, ([g for _, g in pairs], list(dims)),
                  (flat._id,))
            self._started.append((flat, pairs))

    def _finish(self) -> None:
        """End of the backward pass: start what did not fill, then wait for every bucket and set the sums."""
        self._queued = False
        for index, ready in enumerate(self._ready):
            if ready:
                self._start(index)
        started, self._started = self._started, []
        for flat, pairs in started:
            first = pairs[0][1]
            outs = []
            for param, grad in pairs:
                stride = _worker.contiguous_stride(grad.shape)
                spec = DTensorSpec(grad._spec.mesh, param.placements,
                                   TensorMeta(grad.shape, stride, grad.dtype))
                outs.append(_handle(grad.shape, stride, grad.dtype, spec, first._procs, first._client, grad.device))
            _call(first._procs, first._client, _worker.bucket_finish,
                  (flat, [g for _, g in pairs], [p.placements for p, _ in pairs]),
                  tuple(o._id for o in outs))
            for (param, _), out in zip(pairs, outs, strict=True):
                param.grad = out
