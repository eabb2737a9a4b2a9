"""ValueMesh: one value per point of a mesh, the result of ``call()``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from .shape import MeshTrait, Point, Shape

__all__ = ["ValueMesh"]

R = TypeVar("R")


class ValueMesh(MeshTrait, Generic[R]):
    """Values laid out on a mesh: ``vm.item(hosts=0, gpus=3)``.

    It slices like the mesh it came from (``slice``, ``split``, ``flatten``,
    ``rename``) and pickles, so it can be passed to actors, which read their
    own entry with ``vm.item(**context().actor_instance.rank)``.

    Args:
        shape: the mesh layout; only its labels and sizes matter.
        values: one value per point, in row-major rank order.

    Raises:
        ValueError: ``values`` does not have one entry per point.
    """

    def __init__(self, shape: Shape, values: Sequence[R]) -> None:
        values = list(values)
        if len(values) != len(shape):
            raise ValueError(
                f"expecting {len(shape)} values for mesh of size {len(shape)}, got {len(values)}; "
                "pass one value per point in row-major order"
            )
        self._shape = shape.dense()
        self._base: list[R] = values

    @classmethod
    def _view(cls, shape: Shape, base: list[R]) -> ValueMesh[R]:
        vm = cls.__new__(cls)
        vm._shape = shape
        vm._base = base
        return vm

    def _new_with_shape(self, shape: Shape) -> ValueMesh[R]:
        return ValueMesh._view(shape, self._base)

    def __repr__(self) -> str:
        return f"ValueMesh({self._sizes_repr()})"

    def get(self, rank: int) -> R:
        """The value at flat rank ``rank`` (row-major within this mesh).

        Raises:
            IndexError: ``rank`` is out of range.
        """
        n = len(self._shape)
        if not 0 <= rank < n:
            raise IndexError(f"rank {rank} out of range for {self!r} of size {n}; use 0 <= rank < {n}")
        return self._base[self._shape.base_index(rank)]

    def item(self, **coords: int) -> R:
        """The value at the given coordinates, one for every dimension.

        Raises:
            KeyError: a dimension is unknown or missing.
            IndexError: a coordinate is out of range.
        """
        labels = self._shape.labels
        extra = [k for k in coords if k not in labels]
        if extra:
            raise KeyError(f"{self!r} has no dimension {extra[0]!r}; its dimensions are {list(labels)}")
        missing = [k for k in labels if k not in coords]
        if missing:
            raise KeyError(
                f"{self!r}.item() needs a coordinate for every dimension, missing {missing[0]!r}; "
                f"e.g. item({', '.join(f'{k}=0' for k in labels)})"
            )
        rank = 0
        for label, size in zip(labels, self._shape.sizes, strict=True):
            index = coords[label]
            if not 0 <= index < size:
                raise IndexError(f"index {index} out of range for dimension {label!r} of size {size} in {self!r}")
            rank = rank * size + index
        return self._base[self._shape.base_index(rank)]

    def values(self) -> list[R]:
        """All values in rank order."""
        return [self._base[i] for i in self._shape.ranks()]

    def items(self) -> Iterator[tuple[Point, R]]:
        """``(point, value)`` pairs in rank order."""
        extent = self._shape.extent
        for rank, index in enumerate(self._shape.ranks()):
            yield Point(rank, extent), self._base[index]

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        return self.items()

    def __len__(self) -> int:
        return len(self._shape)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ValueMesh):
            return NotImplemented
        return self.sizes == other.sizes and self.values() == other.values()

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (ValueMesh, (self._shape.dense(), self.values()))
