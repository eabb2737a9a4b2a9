"""A cast's tree: how its destinations split into subtrees, and how a subtree is sent.

Shared by the caller's side of a cast (``_core.multicast``) and a receiver's
(``_core.forwarder``): both send a subtree to its first entry, and around
that entry, to its parts, when it cannot be reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from . import protocol
from .entries import Entries, Entry, pack
from .protocol import CAST_FANOUT, Frame

__all__ = ["DIRECT", "GATHER", "RESEND", "plan", "send_subtree", "split"]

Addr = tuple[int, int]

#: How a cast's replies travel (``protocol.cast``'s ``gather``).
DIRECT, GATHER, RESEND = 0, 1, 2


class _Sender(Protocol):
    def send(self, dest: Addr, frame: Frame, buffers: list[Any] = ...) -> None: ...


class TreeRuntime(Protocol):
    """What sending a subtree needs of its process's runtime (``_core.runtime.Runtime``)."""

    dead: dict[Addr, str]

    @property
    def router(self) -> _Sender: ...


def split(entries: Sequence[Entry], parts: int) -> list[Sequence[Entry]]:
    """``entries`` in at most ``parts`` contiguous, nearly equal parts (none empty)."""
    n = len(entries)
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    out = []
    start = 0
    for i in range(parts):
        stop = start + size + (i < extra)
        out.append(entries[start:stop])
        start = stop
    return out


def plan(entries: Sequence[Entry], fanout: int) -> list[Sequence[Entry]]:
    """The subtrees a caller sends to: each in one island, at most ``fanout`` of them per island group.

    Every island gets at least one subtree, so a cast that spans more than
    ``fanout`` islands leaves the caller as one message per island.
    """
    groups: dict[int, list[Entry]] = {}
    for entry in entries:
        groups.setdefault(entry[1][0], []).append(entry)
    share = max(1, fanout // len(groups))
    return [part for group in groups.values() for part in split(group, share)]


def send_subtree(rt: TreeRuntime, frame: Frame, subtree: Sequence[Entry], buffers: list[Any],
                 sent: list[Addr] | None = None, unreachable: str | None = None) -> list[tuple[Addr, str]]:
    """Send CAST ``frame`` for ``subtree`` to its first entry; around it, to its parts, if it cannot be reached.

    Each process the frame reached is appended to ``sent``.  ``unreachable``:
    why the first entry cannot be reached, when the caller's own send found
    it so (it is not tried again).

    Returns:
        The ``(address, report)`` of each process that could not be reached.
    """
    dead = rt.dead
    child = subtree.head if type(subtree) is Entries else subtree[0][1]
    report = unreachable
    if report is None and dead:
        report = dead.get(child)
    if report is None:
        try:
            rt.router.send(child, protocol.subtree(frame, pack(subtree)), buffers)
            if sent is not None:
                sent.append(child)
            return []
        except ConnectionError as exc:
            report = str(exc)
    failed = [(child, report)]
    rest = subtree[1:]
    if rest:
        for part in split(rest, frame[CAST_FANOUT]):
            failed.extend(send_subtree(rt, frame, part, buffers, sent))
    return failed
