"""A cast's destinations, packed: what a ``CAST`` frame carries for its subtree.

Each destination of a cast down a tree is an entry ``(rank, address,
sequence)``: its rank in the called view, its process's address ``(island,
rank)`` and the sequence number the caller gave it (``_core.multicast``).  A
``CAST`` frame carries its subtree's entries as one ``bytes`` of four
little-endian int64 per entry, so that:

* the caller makes the entries of a call with a few array operations
  (:class:`Table`: the view's ranks and addresses are laid out once, each
  call writes only the sequence numbers), not a tuple per destination;
* pickling a subtree is one copy of its bytes, and a forwarder's split of
  its subtree is slicing them.

:class:`Entries` reads them back as a sequence of entry tuples, so the rare
paths (a resend around a dead forwarder) stay plain Python.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import numpy as np

# numpy is imported by the first Table (a process that casts down trees): it
# would triple the time of `import mpimesh` (see ``_data.buffers``).

__all__ = ["Entries", "Entry", "Table", "pack"]

Addr = tuple[int, int]
#: One destination of a cast: its rank in the view, its address, its sequence number from the caller.
Entry = tuple[int, Addr, int]

_ENTRY = struct.Struct("<4q")
_SIZE = _ENTRY.size
#: the address of the first entry
_HEAD = struct.Struct("<8x2q")


class Entries(Sequence[Entry]):
    """Packed entries (see the module): a read-only sequence of ``(rank, address, sequence)``."""

    __slots__ = ("packed",)

    def __init__(self, packed: bytes) -> None:
        if len(packed) % _SIZE:
            raise ValueError(f"packed cast entries need a multiple of {_SIZE} bytes, got {len(packed)}")
        self.packed = packed

    def __len__(self) -> int:
        return len(self.packed) // _SIZE

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> Entries: ...

    def __getitem__(self, index: int | slice) -> Entry | Entries:
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return Entries(b"".join(self.packed[i * _SIZE:(i + 1) * _SIZE] for i in range(start, stop, step)))
            return Entries(self.packed[start * _SIZE:max(start, stop) * _SIZE])
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"entry {index} of {n}")
        rank, island, proc, number = _ENTRY.unpack_from(self.packed, index * _SIZE)
        return (rank, (island, proc), number)

    @property
    def head(self) -> Addr:
        """The first entry's address: where a subtree's ``CAST`` goes."""
        if not self.packed:
            raise IndexError("no entries")
        return _HEAD.unpack_from(self.packed)

    def __iter__(self) -> Iterator[Entry]:
        for rank, island, proc, number in _ENTRY.iter_unpack(self.packed):
            yield (rank, (island, proc), number)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Entries):
            return self.packed == other.packed
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.packed)

    def __repr__(self) -> str:
        return f"Entries({list(self)!r})"


def pack(entries: Iterable[Entry]) -> bytes:
    """The packed form of ``entries`` (already packed ones are passed through)."""
    if isinstance(entries, Entries):
        return entries.packed
    return b"".join(_ENTRY.pack(rank, addr[0], addr[1], number) for rank, addr, number in entries)


class Table:
    """The entries of casts to one view, laid out once: each call fills in its sequence numbers.

    Args:
        ranks: each destination's rank in the view.
        addrs: each destination's address.
        slots: each destination's place in the caller's array of last
            sequence numbers (:meth:`number`).
        parts: the caller's subtrees, as positions in ``addrs`` (slices, or
            lists where islands interleave).
    """

    __slots__ = ("rows", "slots", "parts", "heads", "_numbers")

    def __init__(self, ranks: Sequence[int], addrs: Sequence[Addr], slots: Sequence[int],
                 parts: list[slice | list[int]]) -> None:
        import numpy as np

        n = len(addrs)
        rows = np.empty((n, 4), dtype="<i8")
        if n:
            rows[:, 0] = ranks
            rows[:, 1:3] = addrs
        self.rows = rows
        # consecutive slots (a mesh's processes, numbered in order): a slice, cheaper than an index array
        first = slots[0] if n else 0
        contiguous = list(slots) == list(range(first, first + n))
        self.slots: slice | np.ndarray[Any, Any] = (
            slice(first, first + n) if contiguous else np.asarray(slots, dtype=np.intp))
        self.parts = parts
        #: each subtree's first address: where its ``CAST`` goes
        self.heads: list[Addr] = [
            tuple(addrs[part.start if type(part) is slice else part[0]]) for part in parts]  # type: ignore[misc]
        self._numbers = rows[:, 3]

    def number(self, last: np.ndarray[Any, Any]) -> list[bytes]:
        """Give each destination its next sequence number (``last`` is updated); the subtrees' packed entries.

        Plain bytes, in the order of :attr:`parts` and :attr:`heads`: what
        each ``CAST`` carries (:class:`Entries` reads them).
        """
        slots = self.slots
        if type(slots) is slice:
            numbers = last[slots]
            numbers += 1  # a view: ``last`` itself
        else:
            numbers = last[slots] + 1
            last[slots] = numbers
        self._numbers[...] = numbers
        rows = self.rows
        return [rows[part].tobytes() for part in self.parts]
