"""The operators a training user hits, with inputs and layouts (for dtensor_ops_job.py and torch_dtensor_ops.py).

A case is a function of full tensors and, per layout, each input's
sharding spec over a 2 x 2 ``("dp", "tp")`` mesh: ``"dp"`` shards the batch
over two data-parallel processes (replicated over ``tp``), ``"dp x tp"``
shards a second dimension (often the one the operator reduces or
normalizes over) over ``tp`` as well.  The checks compare the forward
result and the gradient of ``(out * w).sum()`` for a random ``w`` with one
process's torch on the full tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

Spec = list[str | None]


@dataclass
class Case:
    """One operator: ``fn(*inputs)``, and each layout's spec per input (None: a replicated input)."""

    name: str
    fn: Callable[..., torch.Tensor]
    inputs: list[torch.Tensor]
    layouts: dict[str, list[Spec | None]]
    grad: list[bool]


def _cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    x, y = rand(8, 6), rand(8, 6)
    x3 = rand(4, 4, 6)
    odd, odd_y = rand(7, 6), rand(7, 6)  # 7 rows over 2 processes: pieces of 4 and 3 rows
    probs = torch.softmax(rand(8, 6), -1)
    target = torch.randint(0, 6, (8,), generator=g)
    target_ignore = target.clone()
    target_ignore[[1, 6]] = -100
    unit = torch.sigmoid(rand(8, 6))
    labels = (rand(8, 6) > 0).double()
    ln_w, ln_b = rand(6), rand(6)
    gn_x, gn_w, gn_b = rand(4, 4, 3), rand(4), rand(4)
    emb_w, idx = rand(10, 6), torch.randint(0, 10, (8, 3), generator=g)
    lin_w, lin_b = rand(4, 6), rand(4)
    both: dict[str, list[Spec | None]] = {"dp": [["dp", None], ["dp", None]], "dp x tp": [["dp", "tp"], ["dp", "tp"]]}
    one: dict[str, list[Spec | None]] = {"dp": [["dp", None]], "dp x tp": [["dp", "tp"]]}
    one3: dict[str, list[Spec | None]] = {"dp x tp": [["dp", None, "tp"]]}  # pointwise: one layout is enough
    cls: dict[str, list[Spec | None]] = {"dp": [["dp", None], ["dp"]], "dp x tp": [["dp", "tp"], ["dp"]]}
    cases: list[Case] = []

    def add(name: str, fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor],
            layouts: dict[str, list[Spec | None]], grad: list[bool] | None = None) -> None:
        cases.append(Case(name, fn, inputs, layouts, grad or [t.is_floating_point() for t in inputs]))

    for red in ("mean", "sum"):
        add(f"mse_loss {red}", lambda a, b, r=red: F.mse_loss(a, b, reduction=r), [x, y], both)
        add(f"binary_cross_entropy {red}", lambda a, b, r=red: F.binary_cross_entropy(a, b, reduction=r),
            [unit, labels], both, [True, False])
        add(f"cross_entropy indices {red}", lambda a, t, r=red: F.cross_entropy(a, t, reduction=r), [x, target], cls)
        add(f"cross_entropy probabilities {red}", lambda a, p, r=red: F.cross_entropy(a, p, reduction=r),
            [x, probs], both, [True, False])
    # "sum" of these divides by nothing: the four above stand for it, and the job stays short
    add("l1_loss mean", F.l1_loss, [x, y], both)
    add("smooth_l1_loss mean", lambda a, b: F.smooth_l1_loss(a, b, beta=0.5), [x, y], both)
    add("huber_loss mean", lambda a, b: F.huber_loss(a, b, delta=0.5), [x, y], both)
    add("bce_with_logits mean", F.binary_cross_entropy_with_logits, [x, labels], both, [True, False])
    add("cross_entropy ignore_index mean", F.cross_entropy, [x, target_ignore], cls)
    add("nll_loss mean", lambda a, t: F.nll_loss(torch.log_softmax(a, -1), t), [x, target], cls)
    add("mse_loss mean uneven", F.mse_loss, [odd, odd_y], both)
    add("smooth_l1_loss mean uneven", F.smooth_l1_loss, [odd, odd_y], both)
    add("cross_entropy uneven", F.cross_entropy, [odd, target[:7]], cls)
    add("mean uneven", lambda a: a.mean(), [odd], one)
    add("var dim 0 uneven", lambda a: a.var(0), [odd], one)
    add("cross_entropy label_smoothing", lambda a, t: F.cross_entropy(a, t, label_smoothing=0.1), [x, target], cls)
    add("kl_div batchmean", lambda a, p: F.kl_div(torch.log_softmax(a, -1), p, reduction="batchmean"),
        [x, probs], both, [True, False])
    add("kl_div mean", lambda a, p: F.kl_div(torch.log_softmax(a, -1), p, reduction="mean"), [x, probs], both,
        [True, False])
    add("mean", lambda a: a.mean(), [x], one)
    add("mean dim 0", lambda a: a.mean(0), [x], one)
    add("mean dim 1", lambda a: a.mean(1), [x], one)
    add("var", lambda a: a.var(), [x], one)
    add("var dim 0", lambda a: a.var(0), [x], one)
    add("var dim 1 biased", lambda a: a.var(1, unbiased=False), [x], one)
    add("std dim 0", lambda a: a.std(0), [x], one)
    add("std dim 1", lambda a: a.std(1), [x], one)
    add("var_mean dim 1", lambda a: torch.stack(torch.var_mean(a, 1)), [x], one)
    add("norm", lambda a: a.norm(), [x], one)
    add("vector_norm dim 1", lambda a: torch.linalg.vector_norm(a, dim=1), [x], one)
    add("norm p=1 dim 0", lambda a: a.norm(p=1, dim=0), [x], one)
    add("logsumexp dim 1", lambda a: torch.logsumexp(a, 1), [x], one)
    add("softmax dim 1", lambda a: torch.softmax(a, 1), [x], one)
    add("softmax dim 0", lambda a: torch.softmax(a, 0), [x], one)
    add("log_softmax dim 1", lambda a: torch.log_softmax(a, 1), [x], one)
    add("log_softmax dim 0", lambda a: torch.log_softmax(a, 0), [x], one)
    add("layer_norm", lambda a, w, b: F.layer_norm(a, (6,), w, b), [x3, ln_w, ln_b],
        {"dp": [["dp", None, None], None, None], "dp x tp": [["dp", None, "tp"], None, None]})
    add("rms_norm", lambda a, w: F.rms_norm(a, (6,), w), [x3, ln_w],
        {"dp": [["dp", None, None], None], "dp x tp": [["dp", None, "tp"], None]})
    add("group_norm", lambda a, w, b: F.group_norm(a, 2, w, b), [gn_x, gn_w, gn_b],
        {"dp": [["dp", None, None], None, None], "dp x tp": [["dp", "tp", None], None, None]})
    add("gelu", F.gelu, [x3], one3)
    add("gelu tanh", lambda a: F.gelu(a, approximate="tanh"), [x3], one3)
    add("silu", F.silu, [x3], one3)
    add("relu", F.relu, [x3], one3)
    add("dropout eval", lambda a: F.dropout(a, 0.5, training=False), [x3], one3)
    add("embedding", F.embedding, [idx, emb_w],
        {"dp": [["dp", None], None], "dp x tp": [["dp", None], [None, "tp"]]})
    add("linear", F.linear, [x, lin_w, lin_b],
        {"dp": [["dp", None], None, None], "dp x tp": [["dp", None], ["tp", None], ["tp"]]})
    add("linear rowwise", F.linear, [x, lin_w, lin_b],
        {"dp": [["dp", None], None, None], "dp x tp": [["dp", "tp"], [None, "tp"], None]})
    add("matmul", lambda a, b: a @ b.T, [x, y], {"dp": [["dp", None], None], "dp x tp": [["dp", "tp"], [None, "tp"]]})
    return cases


CASES = _cases()


def weights(out: torch.Tensor) -> torch.Tensor:
    """The fixed random ``w`` of a case's ``(out * w).sum()``."""
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)


def reference(case: Case) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """One process's forward result and input gradients, on the full tensors."""
    inputs = [t.clone().requires_grad_(g) for t, g in zip(case.inputs, case.grad, strict=True)]
    out = case.fn(*inputs)
    (out * weights(out)).sum().backward()
    return out.detach(), [t.grad for t in inputs]


def difference(a: Any, b: torch.Tensor) -> float:
    """The largest absolute difference; inf where the shapes differ."""
    if a is None or tuple(a.shape) != tuple(b.shape):
        return float("inf")
    return float((a.double() - b.double()).abs().max()) if b.numel() else 0.0
