"""Helpers for jobs on the Slurm of simulated hosts (``.ci/slurm-hosts.sh``), for its tests and benchmarks.

Standard library only, so that a benchmark script
(``benchmarks/bench_heal.py``) can import it beside the tests without
pytest.  It sits with the Slurm tests because the cluster it reads is their
fixture; the benchmarks borrow it from there, as they borrow the cluster.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["nodes_idle", "sbatch_wait"]


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


def sbatch_wait(args: Sequence[str], *, name: str, output: Path, env: Mapping[str, str], cwd: Path,
                timeout: float = 150) -> tuple[int, str]:
    """Submit a batch job and wait for its end (``sbatch --wait``), then cancel whatever is left of it.

    Args:
        args: ``sbatch``'s options and script after ``--wait --quiet --output --job-name`` (nodes, tasks, ...).
        name: the job's name, by which it is cancelled (a job ``sbatch`` left running past ``timeout`` too).
        output: the job's output file.
        env: ``sbatch``'s environment (the job's, with the template's defaults).
        cwd: where ``sbatch`` runs.
        timeout: seconds ``sbatch --wait`` may take.

    Returns:
        ``sbatch``'s exit status (the job's; -1: it did not end within ``timeout``) and the output file's
        text ("" where the job wrote none).
    """
    cmd = ["sbatch", "--wait", "--quiet", f"--output={output}", f"--job-name={name}", *args]
    try:
        done = subprocess.run(cmd, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, check=False)
        status = done.returncode
    except subprocess.TimeoutExpired:
        status = -1
    finally:
        subprocess.run(["scancel", "--full", f"--name={name}"], timeout=30, check=False)
    return status, output.read_text(errors="replace") if output.exists() else ""
