"""One process's figures for the dashboard: CPU, memory, its actors, the metrics logged there.

Served in every process as the debugger's DEBUG request ``"dash.stats"``
(``mpimesh.debug._worker.register_op``): the controller's collector sends
one to each live process about once a second, and only while a page is
open.  The answer is computed on the polling thread from counters the
process keeps anyway (``/proc``, the actors' cells), in well under a
millisecond; nothing runs between requests.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

from .._data import buffers as _buffers
from .._data.registry import registry
from ..debug._worker import register_op
from . import _metrics

__all__ = ["stats"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# (wall time, CPU seconds) at the last look, for the CPU share since then
_last: list[float] = []


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):  # not Linux: the peak is what there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _cpu() -> float:
    """The share of one core this process used since the last look (0 at the first)."""
    now, used = time.monotonic(), time.process_time()
    share = 0.0
    if _last:
        wall = now - _last[0]
        share = (used - _last[1]) / wall if wall > 0 else 0.0
    _last[:] = [now, used]
    return share


def _gpu() -> int | None:
    """Bytes of CUDA memory torch holds in this process; None where torch has not started CUDA here."""
    torch = sys.modules.get("torch")  # never imported for this: a process without torch has no tensors
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        return int(sum(torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count())))
    except Exception:  # a broken CUDA setup must not break the dashboard
        return None


def _actors(rt: Any) -> list[dict[str, Any]]:
    now = time.monotonic()
    out = []
    for key, cell in list(rt.actors.live.items()):
        busy = cell.busy
        out.append({
            "key": repr(key), "name": cell.name, "rank": cell.point.rank, "actor_id": cell.actor_id,
            "labels": list(cell.point.extent.labels), "sizes": list(cell.point.extent.sizes),
            "coords": dict(cell.point), "class": cell.class_path.rpartition(".")[2],
            "busy": busy[0] if busy else "", "busy_for": now - busy[1] if busy else 0.0,
            "calls": cell.calls, "bytes": cell.call_bytes, "phase": cell.lifecycle.phase.value,
            "why": str(cell.lifecycle.failure or ""),
        })
    return out


def stats(rt: Any, _: Any = None) -> dict[str, Any]:
    """This process's figures; metrics logged here since the last look go with them."""
    held = sum(entry.memory.nbytes for entry in list(registry.entries.values()))
    return {
        "pid": os.getpid(), "host": rt.host, "cpu": _cpu(), "rss": _rss(), "buffers": held,
        "pool": _buffers.pool_statistics().bytes, "gpu": _gpu(), "actors": _actors(rt),
        "metrics": _metrics.drain(), "time": time.time(),
    }


def _look(rt: Any, _: Any) -> dict[str, Any]:
    """The ``"dash.stats"`` request: :func:`stats`, and back to the naps the look interrupted.

    A look asks for nothing more, so the process does not poll closely for
    half a second as after a call (``Progress.quiet``): that would double an
    idle worker's CPU, and take CPU from the job's busy processes.
    """
    rt.progress.quiet()
    return stats(rt)


register_op("dash.stats", _look)
