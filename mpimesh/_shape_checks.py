"""The checks and arithmetic behind :mod:`mpimesh.shape`: labels, sizes, selectors, row-major order.

Each check raises the built-in error a misuse deserves, with a message that
names the object (``owner``) and gives the fix.  Nothing here blocks,
communicates or imports MPI.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "as_index",
    "check_distinct",
    "check_ints",
    "check_labels",
    "describe",
    "infer_sizes",
    "product",
    "quoted",
    "resolve_slice",
    "row_major_strides",
    "split_names",
    "split_size",
    "unknown",
    "unravel",
]



def describe(value: object) -> str:
    return f"{value!r} ({type(value).__name__})"


def quoted(labels: Sequence[str]) -> str:
    return ", ".join(repr(label) for label in labels)


def as_index(value: object) -> int | None:
    """Return ``value`` as an int, or None if it is a bool or not an integer."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def unknown(kind: type[Exception], owner: str, label: str, labels: Sequence[str]) -> Exception:
    if not labels:
        return kind(f"{owner} has no dimension {label!r} (it has no dimensions); remove {label!r}")
    return kind(
        f"{owner} has no dimension {label!r} (dimensions: {quoted(labels)}); use one of those names"
    )


def check_distinct(labels: Sequence[str], context: str) -> None:
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise ValueError(
                f"expecting distinct dimension names {context}, got {tuple(labels)!r}; "
                f"rename the repeated {label!r}"
            )


def check_labels(labels: object, what: str) -> tuple[str, ...]:
    fix = "pass a tuple such as ('hosts', 'gpus')"
    if isinstance(labels, str) or not isinstance(labels, Iterable):
        raise TypeError(
            f"expecting a sequence of str labels for {what}, got {describe(labels)}; {fix}"
        )
    result = tuple(labels)
    for label in result:
        if not isinstance(label, str):
            raise TypeError(f"expecting str labels for {what}, got {describe(label)}; {fix}")
    check_distinct(result, f"for {what}")
    return result


def check_ints(values: object, labels: tuple[str, ...], kind: str, what: str) -> tuple[int, ...]:
    """Validate one int per label; ``kind`` is "sizes" (which must be positive) or "strides"."""
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise TypeError(
            f"expecting a sequence of int {kind} for {what}, got {describe(values)}; "
            "pass one int per label"
        )
    values = tuple(values)
    if len(values) != len(labels):
        raise ValueError(
            f"expecting {len(labels)} {kind} for labels {labels!r} of {what}, "
            f"got {len(values)}: {values!r}; pass one int per label"
        )
    result = []
    for label, value in zip(labels, values, strict=True):
        number = as_index(value)
        if number is None:
            raise TypeError(
                f"expecting int {kind} for {what}, got {describe(value)} for {label!r}; "
                "pass an int"
            )
        if kind == "sizes" and number < 1:
            raise ValueError(
                f"expecting positive sizes for {what}, got {number} for {label!r}; give every "
                "dimension at least one element"
            )
        result.append(number)
    return tuple(result)


def row_major_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(sizes):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def unravel(rank: int, sizes: Sequence[int]) -> tuple[int, ...]:
    coords = []
    for size in reversed(sizes):
        rank, coord = divmod(rank, size)
        coords.append(coord)
    return tuple(reversed(coords))


def product(sizes: Sequence[int]) -> int:
    result = 1
    for size in sizes:
        result *= size
    return result


# --- selectors of slice and split


def resolve_slice(selector: slice, label: str, size: int, owner: str) -> tuple[int, int, int]:
    """Return ``(start, step, count)`` of ``selector`` on a dimension of ``size``."""
    what = f"dimension {label!r} of {owner}"
    if any(
        p is not None and as_index(p) is None
        for p in (selector.start, selector.stop, selector.step)
    ):
        raise TypeError(
            f"expecting int or None slice bounds for {what}, got {selector!r}; pass e.g. "
            f"{label}=slice(0, {size})"
        )
    if selector.step is not None and as_index(selector.step) == 0:
        raise ValueError(
            f"expecting a non-zero slice step for {what}, got {selector!r}; use a step of 1 or -1"
        )
    start, stop, step = selector.indices(size)
    count = len(range(start, stop, step))
    if count == 0:
        raise IndexError(
            f"expecting a slice that selects at least one index of dimension {label!r} of size "
            f"{size} in {owner}, got {selector!r}; pass e.g. {label}=slice(0, {size})"
        )
    return start, step, count


def split_names(label: str, value: object, owner: str) -> tuple[str, ...]:
    if not isinstance(value, (tuple, list)) or not all(isinstance(n, str) for n in value):
        raise TypeError(
            f"expecting a tuple of new dimension names for {label!r} in split of {owner}, got "
            f"{describe(value)}; pass e.g. {label}=('outer', 'inner')"
        )
    if not value:
        raise ValueError(
            f"expecting at least one new dimension name for {label!r} in split of {owner}, got (); "
            f"to drop a dimension use slice({label}=0)"
        )
    return tuple(value)


def split_size(name: str, value: object, owner: str) -> int:
    size = as_index(value)
    what = f"size for new dimension {name!r} in split of {owner}"
    if size is None:
        raise TypeError(f"expecting an int {what}, got {describe(value)}; pass e.g. {name}=2")
    if size < 1:
        raise ValueError(f"expecting a positive {what}, got {size}; pass a size of at least 1")
    return size


def infer_sizes(
    label: str, size: int, names: tuple[str, ...], given: Mapping[str, int], owner: str
) -> list[int]:
    """Return the sizes of ``names``, which replace dimension ``label`` of ``size``."""
    unsized = [n for n in names if n not in given]
    if len(unsized) > 1:
        raise ValueError(
            f"expecting at most one new dimension without a size when splitting {label!r} of "
            f"{owner} into {names!r}, got {len(unsized)}: {quoted(unsized)}; pass a size for "
            f"{quoted(unsized[1:])}"
        )
    known = product([given[n] for n in names if n in given])
    shown = f"{', '.join(f'{n}={given[n]}' for n in names if n in given)} (product {known})"
    old = f"{size}, the size of dimension {label!r} in {owner}"
    if unsized and size % known:
        raise ValueError(
            f"expecting the given sizes of {names!r} to divide {old}, got {shown}; choose sizes "
            f"whose product divides {size}"
        )
    if not unsized and known != size:
        raise ValueError(
            f"expecting the sizes of {names!r} to multiply to {old}, got {shown}; choose sizes "
            f"whose product is {size}"
        )
    return [given[n] if n in given else size // known for n in names]


