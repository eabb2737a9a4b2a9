"""The value types of :mod:`mpimesh.shape`: :class:`Extent` and :class:`Point`.

:class:`Value` gives them (and :class:`~mpimesh.shape.Shape`) equality,
hashing and pickling by their constructor arguments.  Both are re-exported by
:mod:`mpimesh.shape` and :mod:`mpimesh`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Self

from ._shape_checks import as_index, check_ints, check_labels, describe, product, unknown, unravel

__all__ = ["Extent", "Point", "Value"]


class Value:
    """Equality, hashing and pickling by the constructor arguments, ``_args()``."""

    __slots__ = ()

    def _args(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Value) or type(other) is not type(self):
            return NotImplemented
        return self._args() == other._args()

    def __hash__(self) -> int:
        return hash(self._args())

    def __reduce__(self) -> tuple[type[Self], tuple[Any, ...]]:
        return (type(self), self._args())


# --- Extent and Point


class Extent(Value, Mapping[str, int]):
    """The ordered sizes of a mesh's named dimensions.

    An immutable mapping from label to size in dimension order, compared and
    hashed by ``(labels, sizes)``; it pickles.

    Args:
        labels: Distinct dimension names, outermost first.
        sizes: One positive size per label.

    Raises:
        TypeError: If a label is not a str or a size is not an int.
        ValueError: If labels repeat, the lengths differ or a size is below 1.

    Example:
        >>> extent = Extent(("hosts", "gpus"), (1, 4))
        >>> extent, extent["gpus"], extent.nelements
        (Extent({'hosts': 1, 'gpus': 4}), 4, 4)
    """

    __slots__ = ("_index", "_labels", "_nelements", "_sizes")

    def __init__(self, labels: Iterable[str], sizes: Iterable[int]) -> None:
        self._labels = check_labels(labels, "Extent")
        self._sizes = check_ints(sizes, self._labels, "sizes", "Extent")
        self._index = {label: i for i, label in enumerate(self._labels)}
        self._nelements = product(self._sizes)

    @property
    def labels(self) -> tuple[str, ...]:
        """The dimension names, outermost first."""
        return self._labels

    @property
    def sizes(self) -> tuple[int, ...]:
        """The dimension sizes, in label order."""
        return self._sizes

    @property
    def nelements(self) -> int:
        """The number of points: the product of the sizes (1 with no dimensions)."""
        return self._nelements

    def _position(self, label: str, owner: object) -> int:
        if label not in self._index:
            raise unknown(KeyError, repr(owner), label, self._labels)
        return self._index[label]

    def __getitem__(self, label: str) -> int:
        return self._sizes[self._position(label, self)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def _args(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        return (self._labels, self._sizes)

    def __repr__(self) -> str:
        return f"Extent({dict(zip(self._labels, self._sizes, strict=True))!r})"


class Point(Value, Mapping[str, int]):
    """One position in an :class:`Extent`: an immutable mapping from label to coordinate.

    The coordinates are the row-major decomposition of ``rank`` (the last
    dimension varies fastest). Compared and hashed by ``(rank, extent)``; it
    pickles. Looking up a missing label raises KeyError naming the point.

    Args:
        rank: Flat row-major index within ``extent``.
        extent: The extent the point lies in.

    Raises:
        TypeError: If ``extent`` is not an Extent or ``rank`` is not an int.
        ValueError: If ``rank`` is outside ``[0, extent.nelements)``.

    Example:
        >>> point = Point(3, Extent(("hosts", "gpus"), (2, 4)))
        >>> point, point.rank, point["gpus"], point.size("gpus")
        (Point({'hosts': 0, 'gpus': 3}), 3, 3, 4)
    """

    __slots__ = ("_coords", "_extent", "_rank")

    def __init__(self, rank: int, extent: Extent) -> None:
        if not isinstance(extent, Extent):
            raise TypeError(
                f"expecting an Extent for Point, got {describe(extent)}; "
                "build one with Extent(labels, sizes)"
            )
        number, last = as_index(rank), extent.nelements - 1
        if number is None:
            raise TypeError(
                f"expecting an int rank for Point in {extent!r}, got {describe(rank)}; "
                f"pass an int from 0 to {last}"
            )
        if not 0 <= number <= last:
            raise ValueError(
                f"expecting a rank in [0, {last + 1}) for Point in {extent!r}, got {number}; "
                f"pass a rank from 0 to {last}"
            )
        self._rank, self._extent = number, extent
        self._coords = unravel(number, extent.sizes)

    @property
    def rank(self) -> int:
        """The flat row-major index of this point within its extent."""
        return self._rank

    @property
    def extent(self) -> Extent:
        """The extent this point lies in."""
        return self._extent

    def size(self, label: str) -> int:
        """Return the size of dimension ``label``; KeyError if there is none."""
        return self._extent.sizes[self._extent._position(label, self)]

    def __getitem__(self, label: str) -> int:
        return self._coords[self._extent._position(label, self)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent.labels)

    def __len__(self) -> int:
        return len(self._coords)

    def _args(self) -> tuple[int, Extent]:
        return (self._rank, self._extent)

    def __repr__(self) -> str:
        return f"Point({dict(zip(self._extent.labels, self._coords, strict=True))!r})"

    def __str__(self) -> str:
        """Coordinate/size per dimension, as Monarch prints a rank: ``{'hosts': 0/1, 'gpus': 1/2}``."""
        pairs = zip(self._extent.labels, self._coords, self._extent.sizes, strict=True)
        return "{" + ", ".join(f"{label!r}: {coord}/{size}" for label, coord, size in pairs) + "}"
