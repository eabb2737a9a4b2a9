"""Helpers for jobs on the Slurm of simulated hosts (``.ci/slurm-hosts.sh``), for its tests and benchmarks.

Standard library only, so that a benchmark script
(``benchmarks/bench_heal.py``) can import it beside the tests without
pytest.  It sits with the Slurm tests because the cluster it reads is their
fixture; the benchmarks borrow it from there, as they borrow the cluster.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence

__all__ = ["nodes_idle"]


def nodes_idle(hosts: Sequence[str], timeout: float) -> list[str] | None:
    """Wait until ``sinfo`` shows exactly ``hosts``, each idle (a node revived a moment ago registers again).

    Returns:
        ``None`` once they are; else ``sinfo``'s words (node, state, ...) at ``timeout``.
    """
    want, deadline = [w for h in hosts for w in (h, "idle")], time.monotonic() + timeout
    while True:
        states = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                                timeout=30, check=False).stdout.split()
        if states == want:
            return None
        if time.monotonic() >= deadline:
            return states
        time.sleep(0.2)
