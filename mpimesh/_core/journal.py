"""What happened in this process, kept in small rings for the dashboard (``mpimesh.dashboard``).

The runtime records here, at the few places it already knows of an event
(a process declared dead, a failure handed to its supervisor, a heal, a
shrink) and as the controller prints a worker's forwarded output.  Each
record is one append to a bounded ``deque``: a job nobody watches pays
that and nothing more, and memory stays bounded however long it runs.
The dashboard reads the rings when it draws a page (``snapshot``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

__all__ = ["Event", "event", "events", "labels", "log_lines", "logs", "wait_event"]

#: The events kept (the oldest go first).
MAX_EVENTS = 500
#: The output lines kept per label (actor and rank, or a worker's address).
MAX_LINES = 200
#: The labels whose lines are kept (a job of many short-lived actors must not grow the table).
MAX_LABELS = 4096

#: ``(seq, wall time, kind, text, fields)``: ``kind`` is ``dead``, ``failure``, ``heal`` or ``shrink``.
Event = tuple[int, float, str, str, dict[str, Any]]

_events: deque[Event] = deque(maxlen=MAX_EVENTS)
_lines: dict[str, deque[tuple[float, int, str]]] = {}
_lock = threading.Lock()
_changed = threading.Condition(_lock)
_seq = 0


def event(kind: str, text: str, **fields: Any) -> None:
    """Record an event of this process: ``kind`` (one word), what happened, and plain fields."""
    global _seq
    with _lock:
        _seq += 1
        _events.append((_seq, time.time(), kind, text, fields))
        _changed.notify_all()


def wait_event(after: int, timeout: float) -> int:
    """Wait up to ``timeout`` seconds for an event numbered above ``after``; returns the last number (blocking)."""
    with _lock:
        _changed.wait_for(lambda: _seq > after, timeout)
        return _seq


def events(after: int = 0) -> list[Event]:
    """The kept events whose sequence number is above ``after``, oldest first."""
    with _lock:
        return [e for e in _events if e[0] > after]


def log_lines(stream: int, lines: list[tuple[str, str]]) -> None:
    """Keep the last forwarded lines of each label (``stream``: 1 stdout, 2 stderr; ``(label, text)`` each)."""
    now = time.time()
    with _lock:
        for label, text in lines:
            ring = _lines.get(label)
            if ring is None:
                if len(_lines) >= MAX_LABELS:
                    continue
                ring = _lines[label] = deque(maxlen=MAX_LINES)
            ring.append((now, stream, text))


def labels() -> list[str]:
    """The labels whose output is kept, sorted."""
    with _lock:
        return sorted(_lines)


def logs() -> dict[str, list[tuple[float, int, str]]]:
    """A copy of the kept lines: label -> ``(wall time, stream, text)``, oldest first."""
    with _lock:
        return {label: list(ring) for label, ring in _lines.items()}
