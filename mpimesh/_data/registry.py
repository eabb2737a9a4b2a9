"""The owner's side of RDMA: which memory this process exposes, and tokens to check it.

Every :class:`~mpimesh.RDMABuffer` created in a process is registered here
until it is dropped: the registry keeps its memory alive, attaches it to the
island's MPI window (when there is one), and gives it a slot holding a random
token.  Readers check the slot through the same path as the data (a
same-host copy or the window), so a handle whose buffer was dropped fails
instead of reading memory that may have been reused.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import buffers as _buffers

if TYPE_CHECKING:
    import numpy as np

    from .windows import Window

__all__ = ["Entry", "Registry", "registry"]


@dataclass
class Entry:
    """One exposed buffer."""

    memory: _buffers.Memory
    slot: tuple[int, int]
    attached: bool


class Registry:
    """The buffers this process owns, each with a token in a slot readers check.

    A reader compares the slot's value with the token in its handle before
    and after it copies: a dropped buffer's slot holds 0 (or a later
    buffer's token), so a stale handle fails instead of reading memory that
    may have been reused.  Slots live in slabs that are never freed, and each
    slab is attached once to the island's window, so a slot's address stays
    readable for as long as the process lives.
    """

    _SLOTS = 512

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slabs: list[np.ndarray] = []
        self.free: list[tuple[int, int]] = []
        self.entries: dict[int, Entry] = {}
        #: buffers attached to the island's window: other hosts may read or
        #: write them one-sidedly at any time (see _core.progress)
        self.attached = 0

    def _slot_address(self, slot: tuple[int, int]) -> int:
        return int(self.slabs[slot[0]].ctypes.data) + 8 * slot[1]

    def register(self, memory: _buffers.Memory, window: Window | None) -> tuple[int, int, bool]:
        """Expose ``memory``; returns (slot address, token, attached to the window)."""
        import numpy as np

        self.sweep()
        with self.lock:
            if not self.free:
                slab = np.zeros(self._SLOTS, np.uint64)
                if window is not None and not window.attach(slab, int(slab.ctypes.data)):
                    window = None
                self.slabs.append(slab)
                self.free.extend((len(self.slabs) - 1, i) for i in reversed(range(self._SLOTS)))
            slot = self.free.pop()
            token = int.from_bytes(os.urandom(8), "little") | 1
            self.slabs[slot[0]][slot[1]] = token
        if memory.device == "cpu" and not memory.readonly:
            from .cma import prefer_huge_pages

            prefer_huge_pages(memory.addr, memory.nbytes)
        attached = False
        if window is not None and memory.nbytes:
            target = memory.tensor() if memory.device != "cpu" else memory.array()
            attached = window.attach(target, memory.addr)
        with self.lock:
            self.entries[token] = Entry(memory, slot, attached)
            self.attached += attached
        return self._slot_address(slot), token, attached

    def valid(self, token: int) -> Entry | None:
        """The entry of ``token`` if it is still registered."""
        with self.lock:
            entry = self.entries.get(token)
            if entry is None or int(self.slabs[entry.slot[0]][entry.slot[1]]) != token:
                return None
            return entry

    def release(self, token: int) -> None:
        """Unexpose the buffer of ``token`` (idempotent)."""
        with self.lock:
            entry = self.entries.pop(token, None)
            if entry is None:
                return
            self.slabs[entry.slot[0]][entry.slot[1]] = 0
            self.free.append(entry.slot)
            self.attached -= entry.attached
        if entry.attached:
            from .windows import window

            win = window()
            if win is not None:
                win.detach(entry.memory.addr)

    def sweep(self) -> None:
        """Release the buffers that another process dropped (it zeroed their slots)."""
        with self.lock:
            gone = [t for t, e in self.entries.items() if int(self.slabs[e.slot[0]][e.slot[1]]) != t]
        for token in gone:
            self.release(token)


#: This process's registry.
registry = Registry()
