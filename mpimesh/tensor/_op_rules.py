"""Operators the workers run as their decomposition on DTensors, because torch's DTensor gets them wrong.

torch's DTensor (2.13) shards an operator it has no sharding rule for
through the operator's decomposition: it traces the decomposition to derive
the placements of the results (``DecompShardingStrategy``), but then runs
the operator itself on each process's pieces.  That is right only where the
operator's kernel computes each piece of the result from the pieces of its
inputs alone.  Kernels whose arithmetic uses the whole input's shape get
their piece's shape instead, silently (docs/design/tensor.md, "Operators
without a sharding rule"): the backward of ``mse_loss``, ``smooth_l1_loss``,
``huber_loss`` and ``binary_cross_entropy`` with ``reduction="mean"``
divides by the piece's number of elements, so a batch sharded over ``n``
data-parallel processes got ``n`` times the gradient, and
``native_group_norm_backward`` fails on a sharded batch.

Run as its decomposition, every step is an operator DTensor has a rule for,
over the global sizes.  So every operator DTensor would shard by its
decomposition runs as that decomposition: the same test torch's
``ShardingPropagator`` makes (no strategy, no rule, no custom handler, a
decomposition), one rule rather than a list of operators.  The controller
asks the same question (its sharding propagation takes the same path), so
it sends such operators to :func:`._dtensor_worker.run_op` rather than as
the engine's compact command, which calls the operator itself.
"""

from __future__ import annotations

from typing import Any

from torch._decomp import decomposition_table
from torch.distributed.tensor import DTensor

__all__ = ["by_decomposition", "decomposed"]

#: Per operator: whether it runs as its decomposition (decided once per process).
_DECOMPOSE: dict[Any, bool] = {}


def by_decomposition(op: Any) -> bool:
    """Whether DTensor has no sharding rule for operator ``op`` but a decomposition: it must run as the latter."""
    known = _DECOMPOSE.get(op)
    if known is None:
        dispatcher = DTensor._op_dispatcher
        propagator = dispatcher.sharding_propagator
        known = (op not in propagator.op_strategy_funcs
                 and op not in propagator.op_single_dim_strategy_funcs
                 and op not in propagator.op_to_rules
                 and op not in dispatcher._custom_op_handlers
                 and (op in decomposition_table or op._can_decompose()))
        _DECOMPOSE[op] = known
    return known


def decomposed(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Operator ``op`` (one :func:`by_decomposition` chose) run as its decomposition."""
    decomposition = decomposition_table.get(op)
    if decomposition is not None:
        return decomposition(*args, **kwargs)
    return op.decompose(*args, **kwargs)
