"""Named mesh shapes: extents, points and strided views over a flat rank list.

A mesh of actors or processes is a set of ranks laid out on named dimensions.
:class:`Shape` is Monarch's ``Shape``/``NDSlice`` pair: labels plus an affine
view (offset, sizes, strides) into a flat base list, so slicing never copies.
:class:`Extent` and :class:`Point` are the label-to-size and label-to-coordinate
mappings users see, and :class:`MeshTrait` gives every mesh type ``slice``,
``split``, ``flatten``, ``rename`` and ``size``. Nothing here blocks or
communicates, and the module imports neither MPI nor torch.

Example:
    >>> shape = Shape.row_major(("hosts", "gpus"), (2, 4))
    >>> shape.slice({"gpus": slice(1, None, 2)}).ranks()
    [1, 3, 5, 7]
    >>> shape.split({"gpus": ("tp", "cp"), "cp": 2}).sizes
    (2, 2, 2)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Self

from ._shape_checks import (
    as_index,
    check_distinct,
    check_ints,
    check_labels,
    describe,
    infer_sizes,
    product,
    resolve_slice,
    row_major_strides,
    split_names,
    split_size,
    unknown,
    unravel,
)
from ._shape_points import Extent, Point, Value

__all__ = ["Extent", "MeshTrait", "Point", "Shape"]

# Method `Shape.slice` shadows the builtin in the class body; annotations use these.
_Selector = int | slice
_SplitValue = tuple[str, ...] | int


# --- Shape


class Shape(Value):
    """A named, strided view into a flat base list (Monarch's Shape and NDSlice).

    Element ``i`` of the view, counted row-major over ``sizes``, is base index
    ``offset + sum(coord[d] * strides[d])``. The base list is normally the
    ranks of the root mesh, so a sliced mesh keeps its members' base indices.
    Shapes are immutable, compared and hashed by all four fields, and pickle.
    Operations return new shapes and take an ``owner`` string (the mesh's
    repr, ``repr(self)`` by default) that their error messages name.

    Args:
        labels: Distinct dimension names, outermost first.
        offset: Base index of the first element.
        sizes: One positive size per label.
        strides: One stride per label, in base-index units.

    Raises:
        TypeError: If a label is not a str or a number is not an int.
        ValueError: If labels repeat, the lengths differ, a size is below 1 or
            the view reaches a negative base index.
    """

    __slots__ = ("_dense", "_extent", "_inverse", "_offset", "_ranks", "_strides")

    def __init__(
        self, labels: Iterable[str], offset: int, sizes: Iterable[int], strides: Iterable[int]
    ) -> None:
        names = check_labels(labels, "Shape")
        self._extent = Extent(names, check_ints(sizes, names, "sizes", "Shape"))
        self._strides = check_ints(strides, names, "strides", "Shape")
        number = as_index(offset)
        if number is None:
            raise TypeError(
                f"expecting an int offset for Shape, got {describe(offset)}; pass an int"
            )
        low = number + sum(
            min(0, (n - 1) * s) for n, s in zip(self.sizes, self._strides, strict=True)
        )
        if low < 0:
            raise ValueError(
                f"expecting base indices of at least 0 for Shape with offset {number}, sizes "
                f"{self.sizes!r} and strides {self._strides!r}, got {low}; raise the offset "
                f"to {number - low}"
            )
        self._offset = number
        self._ranks: tuple[int, ...] | None = None
        self._inverse: dict[int, int] | None = None
        self._dense: Shape | bool | None = None

    @classmethod
    def row_major(cls, labels: Iterable[str], sizes: Iterable[int]) -> Shape:
        """Return the dense shape over base indices ``0 .. prod(sizes) - 1``."""
        names = check_labels(labels, "Shape")
        dims = check_ints(sizes, names, "sizes", "Shape")
        return cls(names, 0, dims, row_major_strides(dims))

    def dense(self) -> Shape:
        """Return the row-major shape with these labels and sizes: this one if it already is.

        Example:
            >>> shape = Shape.row_major(("hosts", "gpus"), (2, 4))
            >>> shape.dense() is shape, shape.slice({"gpus": 1}).dense() == Shape.row_major(("hosts",), (2,))
            (True, True)
        """
        dense = self._dense
        if dense is None:
            # a shape never changes: found once (every call() asks); True: this one (no cycle)
            if self._offset == 0 and self._strides == row_major_strides(self._extent.sizes):
                dense = True
            else:
                dense = Shape.row_major(self._extent.labels, self._extent.sizes)
            self._dense = dense
        return dense if isinstance(dense, Shape) else self

    @classmethod
    def unity(cls) -> Shape:
        """Return the shape with no dimensions and one element, at base index 0."""
        return cls((), 0, (), ())

    @property
    def labels(self) -> tuple[str, ...]:
        """The dimension names, outermost first."""
        return self._extent.labels

    @property
    def offset(self) -> int:
        """The base index of the first element."""
        return self._offset

    @property
    def sizes(self) -> tuple[int, ...]:
        """The dimension sizes, in label order."""
        return self._extent.sizes

    @property
    def strides(self) -> tuple[int, ...]:
        """The strides in base-index units, in label order."""
        return self._strides

    @property
    def extent(self) -> Extent:
        """The labels and sizes as an :class:`Extent`."""
        return self._extent

    @property
    def nelements(self) -> int:
        """The number of elements in the view."""
        return self._extent.nelements

    def __len__(self) -> int:
        return self._extent.nelements

    def ranks(self) -> list[int]:
        """Return the base indices of all elements, in row-major order."""
        if self._ranks is None:  # cached: meshes ask on every cast and lookup
            self._ranks = tuple(self.base_index(i) for i in range(len(self)))
        return list(self._ranks)

    def base_index(self, rank: int) -> int:
        """Return the base index of local ``rank``.

        Raises:
            TypeError: If ``rank`` is not an int.
            IndexError: If ``rank`` is outside ``[0, len(self))``.
        """
        coords = unravel(self._check_rank(rank), self.sizes)
        return self._offset + sum(c * s for c, s in zip(coords, self._strides, strict=True))

    def local_rank(self, base_index: int) -> int:
        """Return the local rank whose base index is ``base_index``.

        Raises:
            ValueError: If no element of the view has that base index.
        """
        if self._inverse is None:
            self._inverse = {base: i for i, base in enumerate(self.ranks())}
        if as_index(base_index) is None or base_index not in self._inverse:
            raise ValueError(
                f"expecting a base index in {self!r}, got {base_index!r}; use one of shape.ranks()"
            )
        return self._inverse[base_index]

    def point(self, rank: int) -> Point:
        """Return local ``rank`` as a :class:`Point`; errors as :meth:`base_index`."""
        return Point(self._check_rank(rank), self._extent)

    def coordinates(self, rank: int) -> dict[str, int]:
        """Return local ``rank``'s coordinates as a dict; errors as :meth:`base_index`."""
        return dict(self.point(rank))

    def is_dense(self) -> bool:
        """Return whether the view is one contiguous, increasing run of base indices."""
        dense = row_major_strides(self.sizes)
        return all(
            n == 1 or s == d for n, s, d in zip(self.sizes, self._strides, dense, strict=True)
        )

    def slice(self, dims: Mapping[str, _Selector], owner: str | None = None) -> Shape:
        """Select along named dimensions, relative to this view.

        An int picks one index and drops the dimension; a ``slice`` keeps the
        dimension and restricts it by Python's rules (negative values count
        from the end, bounds are clamped, negative steps reverse).

        Raises:
            TypeError: On an unknown label or a value that is not an int or slice.
            IndexError: On an int out of range or a slice that selects nothing.
            ValueError: On a slice step of 0.
        """
        who = repr(self) if owner is None else owner
        offset, sizes, strides = self._offset, list(self.sizes), list(self._strides)
        dropped = set()
        for label, selector in dims.items():
            d = self._dim(label, who)
            size, stride = sizes[d], strides[d]
            if isinstance(selector, slice):
                start, step, count = resolve_slice(selector, label, size, who)
                offset, sizes[d], strides[d] = offset + start * stride, count, stride * step
                continue
            index = as_index(selector)
            if index is None:
                fix = f"pass e.g. {label}=0 or {label}=slice(0, {size})"
                raise TypeError(
                    f"expecting an int or a slice for dimension {label!r} of {who}, got "
                    f"{describe(selector)}; {fix}"
                )
            if not -size <= index < size:
                raise IndexError(
                    f"index {index} out of range for dimension {label!r} of size {size} "
                    f"in {who}; use an index from {-size} to {size - 1}"
                )
            offset += (index % size) * stride
            dropped.add(d)
        kept = [d for d in range(len(sizes)) if d not in dropped]
        return Shape(
            [self.labels[d] for d in kept],
            offset,
            [sizes[d] for d in kept],
            [strides[d] for d in kept],
        )

    def split(self, spec: Mapping[str, _SplitValue], owner: str | None = None) -> Shape:
        """Split dimensions into new named dimensions, keeping rank order.

        ``{"hosts": ("dp", "pp"), "pp": 2}`` replaces ``hosts`` by ``dp`` and
        ``pp`` (outer to inner) at its position; an int value is the size of a
        new dimension. Per split, one new dimension may be left unsized and is
        inferred; the sizes must multiply to the old size.

        Raises:
            TypeError: On an unknown label to split or a value of the wrong type.
            ValueError: If sizes do not fit, cannot be inferred or are unused,
                or if names repeat afterwards.
        """
        who = repr(self) if owner is None else owner
        groups: dict[str, tuple[str, ...]] = {}
        given: dict[str, int] = {}
        for key, value in spec.items():
            if key in self._extent:
                groups[key] = split_names(key, value, who)
            elif isinstance(value, (tuple, list)):
                raise unknown(TypeError, who, key, self.labels)
            else:
                given[key] = split_size(key, value, who)
        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        for label, size, stride in zip(self.labels, self.sizes, self._strides, strict=True):
            names = groups.get(label, (label,))
            new_sizes = infer_sizes(label, size, names, given, who)
            labels += names
            sizes += new_sizes
            strides += [stride * s for s in row_major_strides(new_sizes)]
        for key, value in given.items():
            if key not in labels:
                dim = self.labels[0] if self.labels else "dim"
                raise ValueError(
                    f"expecting sizes only for new dimensions in split of {who}, got "
                    f"{key}={value}; name {key!r} in a tuple, e.g. {dim}=({dim!r}, {key!r}), "
                    "or remove it"
                )
        check_distinct(labels, f"after split of {who}")
        return Shape(labels, self._offset, sizes, strides)

    def flatten(self, name: str, owner: str | None = None) -> Shape:
        """Merge all dimensions into one named ``name``, keeping rank order.

        A shape with no dimensions flattens to one dimension of size 1.

        Raises:
            TypeError: If ``name`` is not a str.
            ValueError: If the view is not dense (see :meth:`is_dense`).
        """
        who = repr(self) if owner is None else owner
        if not isinstance(name, str):
            raise TypeError(
                f"expecting a str dimension name to flatten {who}, got {describe(name)}; "
                "pass a name such as 'rank'"
            )
        if not self.is_dense():
            raise ValueError(
                f"expecting dense strides {row_major_strides(self.sizes)!r} to flatten {who}, "
                f"got {self._strides!r}; flatten before slicing with a step, then slice the "
                "flat dimension"
            )
        return Shape((name,), self._offset, (len(self),), (1,))

    def rename(self, mapping: Mapping[str, str], owner: str | None = None) -> Shape:
        """Rename dimensions; labels not in ``mapping`` are kept.

        Raises:
            TypeError: On an unknown label or a new name that is not a str.
            ValueError: If names repeat afterwards.
        """
        who = repr(self) if owner is None else owner
        labels = list(self.labels)
        for old, new in mapping.items():
            d = self._dim(old, who)
            if not isinstance(new, str):
                raise TypeError(
                    f"expecting a str new name for dimension {old!r} in rename of {who}, got "
                    f"{describe(new)}; pass e.g. {old}='new_name'"
                )
            labels[d] = new
        check_distinct(labels, f"after rename of {who}")
        return Shape(labels, self._offset, self.sizes, self._strides)

    def _dim(self, label: str, owner: str) -> int:
        if label not in self._extent:
            raise unknown(TypeError, owner, label, self.labels)
        return self.labels.index(label)

    def _check_rank(self, rank: int) -> int:
        number, n = as_index(rank), len(self)
        if number is None:
            raise TypeError(
                f"expecting an int local rank for {self!r}, got {describe(rank)}; "
                f"pass an int from 0 to {n - 1}"
            )
        if not 0 <= number < n:
            raise IndexError(
                f"local rank {number} out of range for {self!r} of {n} elements; "
                f"use a rank from 0 to {n - 1}"
            )
        return number

    def _args(self) -> tuple[tuple[str, ...], int, tuple[int, ...], tuple[int, ...]]:
        return (self.labels, self._offset, self.sizes, self._strides)

    def __repr__(self) -> str:
        return (
            f"Shape(labels={self.labels!r}, offset={self._offset}, "
            f"sizes={self.sizes!r}, strides={self._strides!r})"
        )



class MeshTrait:
    """Mixin giving a mesh Monarch's shape operations.

    Subclasses (ProcMesh, ActorMesh, ValueMesh, HostMesh) provide ``_shape``,
    as an attribute or a property, and ``_new_with_shape(shape)``, which
    returns a mesh of the same kind over a sub-view of the same base ranks.
    Each operation passes ``repr(self)`` to :class:`Shape` so that errors name
    the mesh; see the Shape methods for the rules and errors. None of them
    blocks or communicates.
    """

    __slots__ = ()

    _shape: Shape

    def _new_with_shape(self, shape: Shape) -> Self:
        """Return a mesh like ``self`` over ``shape``; subclasses must override it."""
        raise NotImplementedError(
            f"{type(self).__name__} must override _new_with_shape(shape) to use MeshTrait"
        )

    def _sizes_repr(self) -> str:
        """Return the sizes as a mesh's repr shows them, e.g. ``hosts=2, gpus=4``."""
        return ", ".join(f"{k}={v}" for k, v in zip(self._shape.labels, self._shape.sizes, strict=True))

    def slice(self, **dims: _Selector) -> Self:
        """Select along dimensions, e.g. ``mesh.slice(hosts=1, gpus=slice(0, 2))``."""
        return self._new_with_shape(self._shape.slice(dims, repr(self)))

    def split(self, **kwargs: _SplitValue) -> Self:
        """Split dimensions, e.g. ``mesh.split(hosts=("dp", "pp"), pp=2)``."""
        return self._new_with_shape(self._shape.split(kwargs, repr(self)))

    def flatten(self, name: str) -> Self:
        """Merge all dimensions into one called ``name``; the mesh must be dense."""
        return self._new_with_shape(self._shape.flatten(name, repr(self)))

    def rename(self, **old_to_new: str) -> Self:
        """Rename dimensions, e.g. ``mesh.rename(hosts="dp")``."""
        return self._new_with_shape(self._shape.rename(old_to_new, repr(self)))

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Return the number of elements in the mesh, in one dimension or in several.

        Args:
            dim: None for the whole mesh, a label, or a sequence of labels whose
                sizes are multiplied.

        Raises:
            TypeError: On an unknown label or a ``dim`` of another type.
        """
        shape = self._shape
        if dim is None:
            return len(shape)
        if isinstance(dim, str):
            return shape.sizes[shape._dim(dim, repr(self))]
        if not isinstance(dim, Sequence) or not all(isinstance(d, str) for d in dim):
            raise TypeError(
                f"expecting None, a dimension name or a sequence of names for size() of {self!r}, "
                f"got {describe(dim)}; pass e.g. size(('hosts', 'gpus'))"
            )
        return product([shape.sizes[shape._dim(d, repr(self))] for d in dim])

    @property
    def sizes(self) -> dict[str, int]:
        """The dimension sizes as a label-to-size dict, in dimension order."""
        return dict(self._shape.extent)

    @property
    def extent(self) -> Extent:
        """The labels and sizes of this mesh as an :class:`Extent`."""
        return self._shape.extent

    def __len__(self) -> int:
        return len(self._shape)
