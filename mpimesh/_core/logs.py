"""Worker output on the controller's terminal, prefixed with actor and rank.

On a worker, ``sys.stdout`` and ``sys.stderr`` (and so ``print`` and every
``logging`` handler that writes to them) become line forwarders: each
complete line travels to the controller as a LOG frame, labelled with the
actor that wrote it (``greeters[2]``: mesh name and rank) or, outside any
actor, with the worker's address.  The controller prints
``[greeters[2]] text`` on its own stdout or stderr.

With ``MPIMESH_LOG_FOLD=<seconds>`` the controller holds lines for that long
and prints identical lines from many ranks once: ``[greeters[0-3]] text``.
``MPIMESH_LOG_FORWARD=0`` leaves worker output to the launcher (unprefixed).
Output written below Python (C ``printf``, a crash dump) is not captured.

mpimesh's own diagnostics (a lost report, a stuck shutdown, a trace line of
``MPIMESH_DEBUG=1``) go through :func:`warn`, in one format:
``mpimesh: text``, or ``mpimesh 0.3: text`` when they name the process.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol, TextIO

from ..config import settings
from . import journal
from .protocol import CONTROLLER, Frame, log

__all__ = ["Forwarder", "Printer", "debug", "install_forwarders", "label", "warn"]

Addr = tuple[int, int]


def warn(text: str, addr: Addr | None = None) -> None:
    """Print one of mpimesh's own diagnostics on ``sys.stderr``.

    Args:
        text: what happened; it may span lines.
        addr: the process it is about, shown as ``island.rank``.
    """
    who = "mpimesh" if addr is None else f"mpimesh {addr[0]}.{addr[1]}"
    print(f"{who}: {text}", file=sys.stderr, flush=True)


def debug(text: str, addr: Addr) -> None:
    """A trace line, printed only when ``MPIMESH_DEBUG=1``."""
    if settings.debug:
        warn(text, addr)


class _Router(Protocol):
    @property
    def lock(self) -> threading.Lock: ...

    def send(self, dest: Addr, frame: Frame, buffers: Sequence[Any] = ()) -> None: ...


class LogRuntime(Protocol):
    """What a forwarder uses of its process's runtime."""

    @property
    def addr(self) -> Addr: ...

    @property
    def router(self) -> _Router: ...


def label(addr: Addr) -> str:
    """Who is writing: ``mesh[rank]`` inside an actor, ``worker island.rank`` outside."""
    from ..context import context

    instance = context().actor_instance
    if instance._actor is None:
        return f"worker {addr[0]}.{addr[1]}"
    return f"{instance.name}[{instance.rank.rank}]"


class Forwarder(io.TextIOBase):
    """A text stream whose complete lines go to the controller."""

    def __init__(self, runtime: LogRuntime, stream: int, original: TextIO) -> None:
        super().__init__()
        self._rt = runtime
        self._stream = stream
        self._original = original
        self._partial: dict[int, str] = {}
        self._queue: deque[tuple[str, str]] = deque()
        self._lock = threading.Lock()
        # once the worker leaves (MPI is finalizing or gone): lines go to the process's own stream
        self._local = False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", "utf-8")

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._original.fileno()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        who = threading.get_ident()
        with self._lock:
            pending = self._partial.pop(who, "") + text
            *lines, rest = pending.split("\n")
            if rest:
                self._partial[who] = rest
            if lines:
                tag = label(self._rt.addr)
                self._queue.extend((tag, line) for line in lines)
        if lines:
            self.drain()
        return len(text)

    def go_local(self) -> None:
        """Send what is queued, then write to the process's own stream (the launcher forwards it).

        For a worker about to finalize MPI: a ``print`` in a ``__del__`` or an
        ``atexit`` handler later on must not call MPI.
        """
        self.flush()
        self._local = True

    def flush(self) -> None:
        who = threading.get_ident()
        with self._lock:
            rest = self._partial.pop(who, "")
            if rest:
                self._queue.append((label(self._rt.addr), rest))
        self.drain()

    def drain(self) -> None:
        """Send queued lines, unless this thread is inside an MPI call (the poll loop retries)."""
        if not self._queue or (not self._local and self._rt.router.lock.locked()):
            return
        with self._lock:
            lines = list(self._queue)
            self._queue.clear()
        if self._local:
            self._original.write("".join(f"[{tag}] {line}\n" for tag, line in lines))
            self._original.flush()
            return
        try:
            self._rt.router.send(CONTROLLER, log(self._stream, lines))
        except Exception:
            for tag, line in lines:  # the controller is gone: say it here
                self._original.write(f"[{tag}] {line}\n")


def install_forwarders(runtime: LogRuntime) -> list[Forwarder]:
    """On a worker: route ``sys.stdout``/``sys.stderr`` to the controller."""
    if not settings.log_forward:
        return []
    out = Forwarder(runtime, 1, sys.stdout)
    err = Forwarder(runtime, 2, sys.stderr)
    sys.stdout, sys.stderr = out, err
    return [out, err]


class Printer:
    """On the controller: print forwarded lines, folding identical ones if asked."""

    def __init__(self, fold: float) -> None:
        self.fold = fold
        self._lock = threading.Lock()
        # (stream, text) -> (first seen, labels)
        self._held: dict[tuple[int, str], tuple[float, list[str]]] = {}

    def on_log(self, stream: int, lines: list[tuple[str, str]]) -> None:
        journal.log_lines(stream, lines)
        if self.fold <= 0:
            target = sys.__stdout__ if stream == 1 else sys.__stderr__
            if target is not None:
                target.write("".join(f"[{tag}] {text}\n" for tag, text in lines))
                target.flush()
            return
        now = time.monotonic()
        with self._lock:
            for tag, text in lines:
                first, tags = self._held.setdefault((stream, text), (now, []))
                tags.append(tag)
        self.flush(due_only=True)

    def flush(self, *, due_only: bool = False) -> None:
        """Print held lines (those older than the window, or all)."""
        now = time.monotonic()
        with self._lock:
            ready = [
                (key, tags) for key, (first, tags) in self._held.items() if not due_only or now - first >= self.fold
            ]
            for key, _ in ready:
                del self._held[key]
        for (stream, text), tags in ready:
            target = sys.__stdout__ if stream == 1 else sys.__stderr__
            if target is not None:
                target.write(f"[{fold_labels(tags)}] {text}\n")
                target.flush()


def fold_labels(tags: list[str]) -> str:
    """``['g[0]', 'g[1]', 'g[3]']`` -> ``'g[0-1,3]'``; mixed names are listed."""
    names: dict[str, list[int]] = {}
    others: list[str] = []
    for tag in tags:
        name, _, rest = tag.partition("[")
        if rest.endswith("]") and rest[:-1].isdigit():
            names.setdefault(name, []).append(int(rest[:-1]))
        else:
            others.append(tag)
    parts = [f"{name}[{_ranges(sorted(set(ranks)))}]" for name, ranks in names.items()]
    return ", ".join(parts + sorted(set(others)))


def _ranges(ranks: list[int]) -> str:
    out: list[str] = []
    start = prev = ranks[0]
    for r in ranks[1:]:
        if r == prev + 1:
            prev = r
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = r
    out.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(out)


def go_local(forwarders: list[Forwarder]) -> None:
    """Flush every forwarder, then let it write locally (a worker about to leave)."""
    for fwd in forwarders:
        fwd.go_local()
