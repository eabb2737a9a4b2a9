"""``mpimesh.log_metric``: user metrics, kept where they are logged until the dashboard draws them.

A metric logged on the controller goes straight into its series.  One
logged on a worker (inside an endpoint) waits in a bounded queue of that
process; the dashboard's next look at the process (``_probe``, about once
a second while a page is open) takes it to the controller.  Nothing is sent
for a metric by itself: a job nobody watches pays one append per call.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from numbers import Real

from .._core import current as _current
from .._core.protocol import CONTROLLER
from ..context import context

__all__ = ["Series", "drain", "log_metric", "series", "take"]

#: Points kept per series on the controller (the oldest go first), and waiting per worker.
MAX_POINTS = 10_000

#: ``(step, value, wall time)``
Point = tuple[float, float, float]

_lock = threading.Lock()
#: worker side: ``(name, source, point)`` not yet taken to the controller
_pending: deque[tuple[str, str, Point]] = deque(maxlen=MAX_POINTS)
#: controller side: (metric name, source) -> (arrival number, point), oldest first
_series: dict[tuple[str, str], deque[tuple[int, Point]]] = {}
#: the last arrival number given on the controller
_arrived = 0
#: the next step of each (name, source) logged without one
_steps: dict[tuple[str, str], int] = {}


class Series:
    """The points of one metric from one source (``controller``, or an actor and rank: ``trainers[1]``)."""

    __slots__ = ("name", "source", "points")

    def __init__(self, name: str, source: str, points: list[Point]) -> None:
        self.name = name
        self.source = source
        self.points = points


def _source() -> str:
    instance = context().actor_instance
    if instance._actor is None:  # the script, or a worker's own thread
        rt = _current.runtime
        return "controller" if rt is None or rt.addr == CONTROLLER else f"process {rt.addr[0]}.{rt.addr[1]}"
    return f"{instance.name}[{instance.rank.rank}]"


def log_metric(name: str, value: float, *, step: float | None = None) -> None:
    """Record ``value`` of the metric ``name`` at ``step``, to be drawn as a curve by the dashboard.

    Call it from the controller's script or from inside an endpoint; it
    never blocks and never sends a message by itself (workers' points
    travel with the dashboard's next look at their process, about once a
    second while a page is open).  Each source (the controller, or an actor
    and its rank) has its own curve.  The last 10,000 points of each are
    kept.

    Args:
        name: the metric's name, e.g. ``"loss"``.
        value: a real number.
        step: the x coordinate; default: one more than this source's last step of ``name`` (from 0).

    Raises:
        TypeError: ``name`` is not a string, or ``value`` or ``step`` is not a real number.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"log_metric() expects a non-empty string name, got {name!r}")
    if not isinstance(value, Real):
        raise TypeError(f"log_metric({name!r}) expects a real number value, got {type(value).__name__}; "
                        "pass float(value)")
    if step is not None and not isinstance(step, Real):
        raise TypeError(f"log_metric({name!r}) expects a real number step, got {type(step).__name__}")
    source = _source()
    key = (name, source)
    with _lock:
        at = float(step) if step is not None else float(_steps.get(key, 0))
        _steps[key] = math.floor(at) + 1 if math.isfinite(at) else _steps.get(key, 0)
        point = (at, float(value), time.time())
        rt = _current.runtime
        if rt is not None and rt.addr != CONTROLLER:
            _pending.append((name, source, point))
        else:
            _add(name, source, [point])


def _add(name: str, source: str, points: list[Point]) -> None:
    global _arrived
    ring = _series.get((name, source))
    if ring is None:
        ring = _series[(name, source)] = deque(maxlen=MAX_POINTS)
    for point in points:
        _arrived += 1
        ring.append((_arrived, point))


def drain() -> list[tuple[str, str, Point]]:
    """Worker side: the points logged here since the last call (taken by the dashboard's probe)."""
    with _lock:
        points = list(_pending)
        _pending.clear()
    return points


def take(points: list[tuple[str, str, Point]]) -> None:
    """Controller side: add points drained on a worker."""
    with _lock:
        for name, source, point in points:
            _add(name, source, [point])


def series(after: int = 0) -> tuple[int, list[Series]]:
    """Controller side: the last arrival number, and every series with its points that arrived after ``after``.

    A page asks with the number it got last time, and receives only what is new (all at first).
    """
    with _lock:
        return _arrived, [Series(name, source, [p for n, p in ring if n > after])
                          for (name, source), ring in _series.items()]
