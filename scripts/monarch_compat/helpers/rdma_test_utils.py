"""The harness's ``rdma_test_utils``, used in place of Monarch's test helper.

Monarch's helper runs each RDMA test once per Monarch transport setting
(``rdma_disable_ibverbs`` x ``rdma_allow_tcp_fallback``, Monarch config keys).
mpimesh has one path per pair of processes, chosen by itself, so
``rdma_backends`` runs the test once as it stands; ``RDMA_BACKENDS`` and
``skip_if_ibverbs_unavailable`` keep their meaning through
``monarch.rdma.is_ibverbs_available``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from monarch.rdma import is_ibverbs_available

RDMA_BACKENDS: list[str] = ["ibverbs", "tcp"]


def skip_if_ibverbs_unavailable() -> None:
    """Skip the running test when this host has no ibverbs device."""
    if not is_ibverbs_available():
        pytest.skip("ibverbs backend requested but no ibverbs device on this host")


def rdma_backends(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run the test once: mpimesh picks the path itself (no backend setting)."""
    return fn
