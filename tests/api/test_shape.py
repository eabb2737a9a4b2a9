"""Tests for mpimesh.shape: Extent, Point, Shape and MeshTrait (pure, no MPI)."""

from __future__ import annotations

import doctest
import pickle
import re

import pytest

from mpimesh import shape as shape_module
from mpimesh.shape import Extent, MeshTrait, Point, Shape

OWNER = "ProcMesh({'hosts': 2, 'gpus': 4})"
DIMS = "(dimensions: 'hosts', 'gpus')"


def exact(message: str) -> str:
    """Return a regex that matches exactly ``message``."""
    return "^" + re.escape(message) + "$"


def key_error(message: str) -> str:
    """Return a regex for a KeyError, whose str() is the repr of its message."""
    return exact(repr(message))


@pytest.fixture
def grid() -> Shape:
    """A dense 2 x 4 hosts-by-gpus shape over base ranks 0..7."""
    return Shape.row_major(("hosts", "gpus"), (2, 4))


class FakeMesh(MeshTrait):
    """A stand-in mesh holding its shape in an attribute, as ProcMesh will."""

    def __init__(self, shape: Shape) -> None:
        self._shape = shape

    def _new_with_shape(self, shape: Shape) -> FakeMesh:
        return FakeMesh(shape)

    def __repr__(self) -> str:
        return f"FakeMesh({self.sizes})"


class PropertyMesh(MeshTrait):
    """A stand-in mesh exposing its shape through a property."""

    def __init__(self, shape: Shape) -> None:
        self._stored = shape

    @property
    def _shape(self) -> Shape:  # type: ignore[override]
        return self._stored

    def _new_with_shape(self, shape: Shape) -> PropertyMesh:
        return PropertyMesh(shape)


# --- Extent


def test_extent_is_ordered_mapping() -> None:
    """Extent maps labels to sizes in dimension order; nelements is the product."""
    extent = Extent(["hosts", "gpus"], [2, 4])
    assert list(extent) == ["hosts", "gpus"]
    assert dict(extent) == {"hosts": 2, "gpus": 4}
    assert extent["gpus"] == 4 and len(extent) == 2 and extent.nelements == 8
    assert extent.labels == ("hosts", "gpus") and extent.sizes == (2, 4)
    assert "hosts" in extent and "gpu" not in extent and extent.get("gpu") is None


def test_extent_zero_dims_has_one_element() -> None:
    """An extent with no dimensions has exactly one element."""
    assert Extent((), ()).nelements == 1
    assert repr(Extent((), ())) == "Extent({})"


def test_extent_repr_eq_hash() -> None:
    """Extent's repr is Monarch's; equality and hash use (labels, sizes) in order."""
    extent = Extent(("hosts", "gpus"), (1, 4))
    assert repr(extent) == "Extent({'hosts': 1, 'gpus': 4})"
    assert extent == Extent(["hosts", "gpus"], [1, 4])
    assert hash(extent) == hash(Extent(["hosts", "gpus"], [1, 4]))
    assert extent != Extent(("gpus", "hosts"), (4, 1))
    assert extent != {"hosts": 1, "gpus": 4}


def test_extent_accepts_any_iterable() -> None:
    """Labels and sizes may be any non-str iterables, such as dict views."""
    sizes = {"hosts": 2, "gpus": 4}
    assert Extent(sizes.keys(), sizes.values()) == Extent(("hosts", "gpus"), (2, 4))


def test_extent_pickles() -> None:
    """An Extent survives a pickle round trip unchanged."""
    extent = Extent(("hosts", "gpus"), (2, 4))
    assert pickle.loads(pickle.dumps(extent)) == extent


def test_extent_missing_label() -> None:
    """Looking up a missing label raises KeyError naming the extent and its labels."""
    extent = Extent(("hosts", "gpus"), (2, 4))
    message = (
        f"Extent({{'hosts': 2, 'gpus': 4}}) has no dimension 'gpu' {DIMS}; use one of those names"
    )
    with pytest.raises(KeyError, match=key_error(message)):
        extent["gpu"]


@pytest.mark.parametrize(
    ("labels", "sizes", "error", "message"),
    [
        (
            "hg",
            (1, 2),
            TypeError,
            (
                "expecting a sequence of str labels for Extent, got 'hg' (str); "
                "pass a tuple such as ('hosts', 'gpus')"
            ),
        ),
        (
            ("hosts", 1),
            (1, 2),
            TypeError,
            "expecting str labels for Extent, got 1 (int); pass a tuple such as ('hosts', 'gpus')",
        ),
        (
            ("hosts", "hosts"),
            (1, 2),
            ValueError,
            (
                "expecting distinct dimension names for Extent, got ('hosts', 'hosts'); "
                "rename the repeated 'hosts'"
            ),
        ),
        (
            ("hosts",),
            4,
            TypeError,
            "expecting a sequence of int sizes for Extent, got 4 (int); pass one int per label",
        ),
        (
            ("hosts", "gpus"),
            (1, 2, 3),
            ValueError,
            (
                "expecting 2 sizes for labels ('hosts', 'gpus') of Extent, got 3: (1, 2, 3); "
                "pass one int per label"
            ),
        ),
        (
            ("hosts",),
            (2.0,),
            TypeError,
            "expecting int sizes for Extent, got 2.0 (float) for 'hosts'; pass an int",
        ),
        (
            ("hosts",),
            (True,),
            TypeError,
            "expecting int sizes for Extent, got True (bool) for 'hosts'; pass an int",
        ),
        (
            ("hosts",),
            (0,),
            ValueError,
            (
                "expecting positive sizes for Extent, got 0 for 'hosts'; "
                "give every dimension at least one element"
            ),
        ),
    ],
)
def test_extent_rejects_bad_arguments(
    labels: object, sizes: object, error: type[Exception], message: str
) -> None:
    """Extent validates labels and sizes with pinned messages."""
    with pytest.raises(error, match=exact(message)):
        Extent(labels, sizes)  # type: ignore[arg-type]


# --- Point


def test_point_is_row_major_mapping() -> None:
    """A Point maps labels to the row-major decomposition of its rank."""
    extent = Extent(("hosts", "gpus"), (2, 4))
    point = Point(6, extent)
    assert dict(point) == {"hosts": 1, "gpus": 2}
    assert point.rank == 6 and point.extent is extent
    assert point.size("gpus") == 4 and len(point) == 2
    assert [dict(Point(r, extent)) for r in (0, 3, 4)] == [
        {"hosts": 0, "gpus": 0},
        {"hosts": 0, "gpus": 3},
        {"hosts": 1, "gpus": 0},
    ]


def test_point_repr_eq_hash_pickle() -> None:
    """Points print like Monarch's, compare by (rank, extent) and pickle."""
    extent = Extent(("hosts", "gpus"), (2, 4))
    point = Point(3, extent)
    assert repr(point) == "Point({'hosts': 0, 'gpus': 3})"
    assert point == Point(3, Extent(("hosts", "gpus"), (2, 4)))
    assert hash(point) == hash(Point(3, extent))
    assert point != Point(4, extent)
    assert point != Point(3, Extent(("hosts", "gpus"), (1, 4)))
    assert point != {"hosts": 0, "gpus": 3}
    assert pickle.loads(pickle.dumps(point)) == point
    assert repr(Point(0, Extent((), ()))) == "Point({})"


def test_point_str_is_coordinate_over_size() -> None:
    """str() reads like Monarch's rank: coordinate/size per dimension."""
    assert str(Point(3, Extent(("hosts", "gpus"), (2, 4)))) == "{'hosts': 0/2, 'gpus': 3/4}"
    assert str(Point(0, Extent((), ()))) == "{}"


def test_point_missing_label() -> None:
    """Item lookup and size() of a missing label raise KeyError naming the point."""
    point = Point(3, Extent(("hosts", "gpus"), (2, 4)))
    message = (
        f"Point({{'hosts': 0, 'gpus': 3}}) has no dimension 'gpu' {DIMS}; use one of those names"
    )
    with pytest.raises(KeyError, match=key_error(message)):
        point["gpu"]
    with pytest.raises(KeyError, match=key_error(message)):
        point.size("gpu")


@pytest.mark.parametrize(
    ("rank", "error", "message"),
    [
        (
            8,
            ValueError,
            (
                "expecting a rank in [0, 8) for Point in Extent({'hosts': 2, 'gpus': 4}), got 8; "
                "pass a rank from 0 to 7"
            ),
        ),
        (
            -1,
            ValueError,
            (
                "expecting a rank in [0, 8) for Point in Extent({'hosts': 2, 'gpus': 4}), got -1; "
                "pass a rank from 0 to 7"
            ),
        ),
        (
            True,
            TypeError,
            (
                "expecting an int rank for Point in Extent({'hosts': 2, 'gpus': 4}), "
                "got True (bool); "
                "pass an int from 0 to 7"
            ),
        ),
    ],
)
def test_point_rejects_bad_rank(rank: object, error: type[Exception], message: str) -> None:
    """A Point's rank must be an int in [0, nelements)."""
    with pytest.raises(error, match=exact(message)):
        Point(rank, Extent(("hosts", "gpus"), (2, 4)))  # type: ignore[arg-type]


def test_point_rejects_non_extent() -> None:
    """A Point needs an Extent, not a plain dict."""
    message = (
        "expecting an Extent for Point, got {'hosts': 2} (dict); "
        "build one with Extent(labels, sizes)"
    )
    with pytest.raises(TypeError, match=exact(message)):
        Point(0, {"hosts": 2})  # type: ignore[arg-type]


# --- Shape basics


def test_row_major_ranks_and_strides(grid: Shape) -> None:
    """row_major is dense: offset 0, strides (4, 1), ranks 0..7 in order."""
    assert (grid.labels, grid.offset, grid.sizes, grid.strides) == (
        ("hosts", "gpus"),
        0,
        (2, 4),
        (4, 1),
    )
    assert grid.ranks() == list(range(8))
    assert len(grid) == grid.nelements == 8
    assert grid.extent == Extent(("hosts", "gpus"), (2, 4))
    assert grid.is_dense()


def test_ranks_returns_fresh_list(grid: Shape) -> None:
    """ranks() is cached, but mutating the returned list does not change the shape."""
    grid.ranks().append(99)
    assert grid.ranks() == list(range(8))


def test_unity_has_one_element() -> None:
    """Shape.unity() has no dimensions and one element at base index 0."""
    unity = Shape.unity()
    assert (unity.labels, unity.sizes, unity.ranks(), len(unity)) == ((), (), [0], 1)
    assert unity.point(0) == Point(0, Extent((), ()))


def test_point_coordinates_and_local_rank(grid: Shape) -> None:
    """point/coordinates/base_index/local_rank agree on a sliced view."""
    view = grid.slice({"gpus": slice(1, None, 2)}, OWNER)
    assert view.ranks() == [1, 3, 5, 7]
    assert view.base_index(2) == 5
    assert view.local_rank(5) == 2
    assert view.coordinates(3) == {"hosts": 1, "gpus": 1}
    assert view.point(3) == Point(3, Extent(("hosts", "gpus"), (2, 2)))


def test_shape_repr_eq_hash_pickle(grid: Shape) -> None:
    """Shape's repr shows all fields; equality, hashing and pickling use them."""
    assert repr(grid) == "Shape(labels=('hosts', 'gpus'), offset=0, sizes=(2, 4), strides=(4, 1))"
    same = Shape(["hosts", "gpus"], 0, [2, 4], [4, 1])
    assert grid == same and hash(grid) == hash(same)
    assert grid != Shape(("hosts", "gpus"), 1, (2, 4), (4, 1))
    view = grid.slice({"hosts": 1, "gpus": slice(None, None, -2)}, OWNER)
    view.ranks()  # the cache must not leak into the pickle
    clone = pickle.loads(pickle.dumps(view))
    assert clone == view and clone.ranks() == [7, 5]


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (
            (("a",), "0", (2,), (1,)),
            TypeError,
            "expecting an int offset for Shape, got '0' (str); pass an int",
        ),
        (
            (("a",), 0, (2,), (1, 1)),
            ValueError,
            "expecting 1 strides for labels ('a',) of Shape, got 2: (1, 1); pass one int per label",
        ),
        (
            (("a",), 0, (2,), (None,)),
            TypeError,
            "expecting int strides for Shape, got None (NoneType) for 'a'; pass an int",
        ),
        (
            (("a",), 1, (3,), (-1,)),
            ValueError,
            (
                "expecting base indices of at least 0 for Shape with offset 1, sizes (3,) and "
                "strides (-1,), got -1; raise the offset to 2"
            ),
        ),
        (
            (("a",), 0, (0,), (1,)),
            ValueError,
            (
                "expecting positive sizes for Shape, got 0 for 'a'; "
                "give every dimension at least one element"
            ),
        ),
    ],
)
def test_shape_rejects_bad_arguments(
    args: tuple[object, ...], error: type[Exception], message: str
) -> None:
    """The Shape constructor validates its fields with pinned messages."""
    with pytest.raises(error, match=exact(message)):
        Shape(*args)  # type: ignore[arg-type]


def test_rank_lookups_reject_bad_ranks(grid: Shape) -> None:
    """base_index/point/coordinates reject ranks outside the view; local_rank unknown bases."""
    view = grid.slice({"hosts": 1}, OWNER)
    name = "Shape(labels=('gpus',), offset=4, sizes=(4,), strides=(1,))"
    out_of_range = f"local rank 4 out of range for {name} of 4 elements; use a rank from 0 to 3"
    for lookup in (view.base_index, view.point, view.coordinates):
        with pytest.raises(IndexError, match=exact(out_of_range)):
            lookup(4)
    with pytest.raises(
        TypeError,
        match=exact(
            f"expecting an int local rank for {name}, got '1' (str); pass an int from 0 to 3"
        ),
    ):
        view.base_index("1")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=exact(f"expecting a base index in {name}, got 3; use one of shape.ranks()"),
    ):
        view.local_rank(3)


# --- slice


def test_slice_int_drops_dimension(grid: Shape) -> None:
    """An int index drops the dimension and moves the offset."""
    row = grid.slice({"hosts": 1}, OWNER)
    assert (row.labels, row.offset, row.sizes, row.strides) == (("gpus",), 4, (4,), (1,))
    assert row.ranks() == [4, 5, 6, 7]
    one = grid.slice({"hosts": 1, "gpus": 2}, OWNER)
    assert (one.labels, one.ranks()) == ((), [6])


def test_slice_negative_int_counts_from_end(grid: Shape) -> None:
    """A negative int index counts from the end, as in Python."""
    assert grid.slice({"gpus": -1}, OWNER).ranks() == [3, 7]
    assert grid.slice({"gpus": -4}, OWNER).ranks() == [0, 4]


def test_slice_keeps_dimension(grid: Shape) -> None:
    """A slice keeps the dimension; bounds are clamped as in Python."""
    view = grid.slice({"gpus": slice(1, 3)}, OWNER)
    assert (view.labels, view.offset, view.sizes, view.strides) == (
        ("hosts", "gpus"),
        1,
        (2, 2),
        (4, 1),
    )
    assert view.ranks() == [1, 2, 5, 6]
    assert grid.slice({"gpus": slice(-2, 100)}, OWNER).ranks() == [2, 3, 6, 7]
    assert grid.slice({}, OWNER) == grid


def test_slice_with_step(grid: Shape) -> None:
    """Slice steps multiply strides; negative steps walk backwards."""
    even = grid.slice({"gpus": slice(None, None, 2)}, OWNER)
    assert (even.offset, even.strides, even.ranks()) == (0, (4, 2), [0, 2, 4, 6])
    backwards = grid.slice({"gpus": slice(None, None, -1), "hosts": slice(None, None, -1)}, OWNER)
    assert backwards.ranks() == [7, 6, 5, 4, 3, 2, 1, 0]
    assert not backwards.is_dense()


def test_slice_twice_composes(grid: Shape) -> None:
    """A second slice is relative to the first; offsets and strides compose."""
    once = grid.slice({"gpus": slice(1, None)}, OWNER)  # gpus 1, 2, 3
    twice = once.slice({"gpus": slice(None, None, 2), "hosts": 1}, OWNER)  # gpus 1, 3 of host 1
    assert (twice.offset, twice.sizes, twice.strides) == (5, (2,), (2,))
    assert twice.ranks() == [5, 7]
    assert twice.local_rank(7) == 1


def test_slice_unknown_label(grid: Shape) -> None:
    """Slicing a missing dimension raises TypeError naming owner, label and labels."""
    message = f"{OWNER} has no dimension 'gpu' {DIMS}; use one of those names"
    with pytest.raises(TypeError, match=exact(message)):
        grid.slice({"gpu": 0}, OWNER)


def test_slice_unknown_label_without_dimensions() -> None:
    """A 0-dim shape says it has no dimensions and defaults its owner to its repr."""
    message = (
        "Shape(labels=(), offset=0, sizes=(), strides=()) has no dimension 'hosts' "
        "(it has no dimensions); remove 'hosts'"
    )
    with pytest.raises(TypeError, match=exact(message)):
        Shape.unity().slice({"hosts": 0})


@pytest.mark.parametrize(
    ("index", "message"),
    [
        (
            4,
            (
                f"index 4 out of range for dimension 'gpus' of size 4 in {OWNER}; "
                "use an index from -4 to 3"
            ),
        ),
        (
            -5,
            (
                f"index -5 out of range for dimension 'gpus' of size 4 in {OWNER}; "
                "use an index from -4 to 3"
            ),
        ),
        (
            slice(4, None),
            (
                "expecting a slice that selects at least one index of dimension 'gpus' of size 4 "
                f"in {OWNER}, got slice(4, None, None); pass e.g. gpus=slice(0, 4)"
            ),
        ),
        (
            slice(2, 2),
            (
                "expecting a slice that selects at least one index of dimension 'gpus' of size 4 "
                f"in {OWNER}, got slice(2, 2, None); pass e.g. gpus=slice(0, 4)"
            ),
        ),
    ],
)
def test_slice_out_of_range(grid: Shape, index: object, message: str) -> None:
    """Out-of-range ints and empty slices raise IndexError with the dimension's size."""
    with pytest.raises(IndexError, match=exact(message)):
        grid.slice({"gpus": index}, OWNER)  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (
            True,
            TypeError,
            (
                f"expecting an int or a slice for dimension 'gpus' of {OWNER}, got True (bool); "
                "pass e.g. gpus=0 or gpus=slice(0, 4)"
            ),
        ),
        (
            "1",
            TypeError,
            (
                f"expecting an int or a slice for dimension 'gpus' of {OWNER}, got '1' (str); "
                "pass e.g. gpus=0 or gpus=slice(0, 4)"
            ),
        ),
        (
            slice("a", None),
            TypeError,
            (
                f"expecting int or None slice bounds for dimension 'gpus' of {OWNER}, "
                "got slice('a', None, None); pass e.g. gpus=slice(0, 4)"
            ),
        ),
        (
            slice(None, None, 0),
            ValueError,
            (
                f"expecting a non-zero slice step for dimension 'gpus' of {OWNER}, "
                "got slice(None, None, 0); use a step of 1 or -1"
            ),
        ),
    ],
)
def test_slice_bad_values(grid: Shape, value: object, error: type[Exception], message: str) -> None:
    """Only ints (not bools) and int-bounded slices with non-zero steps select."""
    with pytest.raises(error, match=exact(message)):
        grid.slice({"gpus": value}, OWNER)  # type: ignore[dict-item]


# --- split


def test_split_infers_size_and_keeps_rank_order(grid: Shape) -> None:
    """Split replaces a dim in place, infers the unsized one and keeps rank order."""
    split = grid.split({"gpus": ("tp", "cp"), "cp": 2}, OWNER)
    assert (split.labels, split.sizes, split.strides) == (
        ("hosts", "tp", "cp"),
        (2, 2, 2),
        (4, 2, 1),
    )
    assert split.ranks() == grid.ranks()
    assert split.coordinates(3) == {"hosts": 0, "tp": 1, "cp": 1}


def test_split_monarch_example() -> None:
    """Monarch's split(host=("dp","pp"), gpu=("tp","cp"), pp=2, cp=2) splits both dims."""
    base = Shape.row_major(("host", "gpu"), (4, 8))
    split = base.split({"host": ("dp", "pp"), "gpu": ("tp", "cp"), "pp": 2, "cp": 2}, OWNER)
    assert split.labels == ("dp", "pp", "tp", "cp")
    assert split.sizes == (2, 2, 4, 2)
    assert split.ranks() == list(range(32))


def test_split_all_sized_and_single_name(grid: Shape) -> None:
    """Fully sized splits work, and a one-name tuple renames a dimension."""
    split = grid.split({"gpus": ("a", "b"), "a": 2, "b": 2}, OWNER)
    assert split.sizes == (2, 2, 2)
    assert grid.split({"hosts": ("dp",)}, OWNER).labels == ("dp", "gpus")


def test_split_strided_view_keeps_ranks() -> None:
    """Splitting a strided, offset view keeps its base ranks in the same order."""
    base = Shape.row_major(("hosts", "gpus"), (2, 8))
    view = base.slice({"hosts": 1, "gpus": slice(None, None, 2)}, OWNER)  # 8, 10, 12, 14
    split = view.split({"gpus": ("x", "y"), "y": 2}, OWNER)
    assert (split.offset, split.strides) == (8, (4, 2))
    assert split.ranks() == view.ranks() == [8, 10, 12, 14]


def test_split_unknown_dimension(grid: Shape) -> None:
    """A tuple for a label that does not exist is an unknown-dimension TypeError."""
    message = f"{OWNER} has no dimension 'gpu' {DIMS}; use one of those names"
    with pytest.raises(TypeError, match=exact(message)):
        grid.split({"gpu": ("a", "b")}, OWNER)


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        (
            {"gpus": "tp"},
            TypeError,
            (
                f"expecting a tuple of new dimension names for 'gpus' in split of {OWNER}, "
                "got 'tp' (str); pass e.g. gpus=('outer', 'inner')"
            ),
        ),
        (
            {"gpus": 2},
            TypeError,
            (
                f"expecting a tuple of new dimension names for 'gpus' in split of {OWNER}, "
                "got 2 (int); pass e.g. gpus=('outer', 'inner')"
            ),
        ),
        (
            {"gpus": ()},
            ValueError,
            (
                f"expecting at least one new dimension name for 'gpus' in split of {OWNER}, "
                "got (); to drop a dimension use slice(gpus=0)"
            ),
        ),
        (
            {"gpus": ("tp", "cp"), "cp": "2"},
            TypeError,
            (
                f"expecting an int size for new dimension 'cp' in split of {OWNER}, "
                "got '2' (str); pass e.g. cp=2"
            ),
        ),
        (
            {"gpus": ("tp", "cp"), "cp": True},
            TypeError,
            (
                f"expecting an int size for new dimension 'cp' in split of {OWNER}, "
                "got True (bool); pass e.g. cp=2"
            ),
        ),
        (
            {"gpus": ("tp", "cp"), "cp": 0},
            ValueError,
            (
                f"expecting a positive size for new dimension 'cp' in split of {OWNER}, "
                "got 0; pass a size of at least 1"
            ),
        ),
        (
            {"gpus": ("tp", "cp", "ep")},
            ValueError,
            (
                "expecting at most one new dimension without a size when splitting 'gpus' of "
                f"{OWNER} into ('tp', 'cp', 'ep'), got 3: 'tp', 'cp', 'ep'; "
                "pass a size for 'cp', 'ep'"
            ),
        ),
        (
            {"gpus": ("tp", "cp"), "cp": 3},
            ValueError,
            (
                "expecting the given sizes of ('tp', 'cp') to divide 4, the size of dimension "
                f"'gpus' in {OWNER}, got cp=3 (product 3); choose sizes whose product divides 4"
            ),
        ),
        (
            {"gpus": ("tp", "cp"), "tp": 2, "cp": 4},
            ValueError,
            (
                "expecting the sizes of ('tp', 'cp') to multiply to 4, the size of dimension "
                f"'gpus' in {OWNER}, got tp=2, cp=4 (product 8); choose sizes whose product is 4"
            ),
        ),
        (
            {"gpus": ("tp", "cp"), "cp": 2, "pp": 2},
            ValueError,
            (
                f"expecting sizes only for new dimensions in split of {OWNER}, got pp=2; "
                "name 'pp' in a tuple, e.g. hosts=('hosts', 'pp'), or remove it"
            ),
        ),
        (
            {"gpus": ("hosts", "cp"), "cp": 2},
            ValueError,
            (
                f"expecting distinct dimension names after split of {OWNER}, "
                "got ('hosts', 'hosts', 'cp'); rename the repeated 'hosts'"
            ),
        ),
        (
            {"hosts": ("x",), "gpus": ("x", "y"), "y": 4},
            ValueError,
            (
                f"expecting distinct dimension names after split of {OWNER}, "
                "got ('x', 'x', 'y'); rename the repeated 'x'"
            ),
        ),
    ],
)
def test_split_errors(
    grid: Shape, spec: dict[str, object], error: type[Exception], message: str
) -> None:
    """Split rejects wrong types, bad or unused sizes and repeated names."""
    with pytest.raises(error, match=exact(message)):
        grid.split(spec, OWNER)  # type: ignore[arg-type]


def test_split_unused_size_without_dimensions() -> None:
    """On a 0-dim shape an unused size suggests a placeholder dimension name."""
    message = (
        "expecting sizes only for new dimensions in split of Unity, got pp=2; "
        "name 'pp' in a tuple, e.g. dim=('dim', 'pp'), or remove it"
    )
    with pytest.raises(ValueError, match=exact(message)):
        Shape.unity().split({"pp": 2}, "Unity")


# --- flatten and rename


def test_flatten_dense(grid: Shape) -> None:
    """Flatten merges all dims into one, keeping offset and rank order."""
    flat = grid.flatten("rank", OWNER)
    assert (flat.labels, flat.offset, flat.sizes, flat.strides) == (("rank",), 0, (8,), (1,))
    row = grid.slice({"hosts": 1}, OWNER).flatten("rank", OWNER)
    assert row.ranks() == [4, 5, 6, 7]
    single_gpu = grid.slice({"hosts": slice(1, 2), "gpus": slice(1, 3)}, OWNER)
    assert single_gpu.is_dense()
    assert single_gpu.flatten("rank", OWNER).ranks() == [5, 6]


def test_flatten_zero_dims() -> None:
    """Flattening a 0-dim shape gives one dimension of size 1."""
    flat = Shape.unity().flatten("rank", OWNER)
    assert (flat.labels, flat.sizes, flat.ranks()) == (("rank",), (1,), [0])


def test_flatten_rejects_strided_view(grid: Shape) -> None:
    """A strided (non-dense) view cannot be flattened."""
    view = grid.slice({"gpus": slice(None, None, 2)}, OWNER)
    assert not view.is_dense()
    message = (
        f"expecting dense strides (2, 1) to flatten {OWNER}, got (4, 2); "
        "flatten before slicing with a step, then slice the flat dimension"
    )
    with pytest.raises(ValueError, match=exact(message)):
        view.flatten("rank", OWNER)


def test_flatten_rejects_non_str_name(grid: Shape) -> None:
    """Flatten needs a str name."""
    message = (
        f"expecting a str dimension name to flatten {OWNER}, got 1 (int); "
        "pass a name such as 'rank'"
    )
    with pytest.raises(TypeError, match=exact(message)):
        grid.flatten(1, OWNER)  # type: ignore[arg-type]


def test_rename(grid: Shape) -> None:
    """Rename changes labels only; swapping two names is allowed."""
    renamed = grid.rename({"hosts": "dp"}, OWNER)
    assert (renamed.labels, renamed.strides, renamed.ranks()) == (
        ("dp", "gpus"),
        (4, 1),
        grid.ranks(),
    )
    assert grid.rename({"hosts": "gpus", "gpus": "hosts"}, OWNER).labels == ("gpus", "hosts")


@pytest.mark.parametrize(
    ("mapping", "error", "message"),
    [
        (
            {"gpu": "tp"},
            TypeError,
            f"{OWNER} has no dimension 'gpu' {DIMS}; use one of those names",
        ),
        (
            {"gpus": 3},
            TypeError,
            (
                f"expecting a str new name for dimension 'gpus' in rename of {OWNER}, got 3 (int); "
                "pass e.g. gpus='new_name'"
            ),
        ),
        (
            {"gpus": "hosts"},
            ValueError,
            (
                f"expecting distinct dimension names after rename of {OWNER}, "
                "got ('hosts', 'hosts'); rename the repeated 'hosts'"
            ),
        ),
    ],
)
def test_rename_errors(
    grid: Shape, mapping: dict[str, object], error: type[Exception], message: str
) -> None:
    """Rename rejects unknown labels, non-str names and repeated names."""
    with pytest.raises(error, match=exact(message)):
        grid.rename(mapping, OWNER)  # type: ignore[arg-type]


# --- MeshTrait


def test_mesh_trait_operations(grid: Shape) -> None:
    """MeshTrait's kwargs API returns new meshes of the same kind over the new shape."""
    mesh = FakeMesh(grid)
    assert mesh.slice(hosts=1, gpus=slice(0, 2))._shape.ranks() == [4, 5]
    assert mesh.split(gpus=("tp", "cp"), cp=2).sizes == {"hosts": 2, "tp": 2, "cp": 2}
    assert mesh.flatten("rank").sizes == {"rank": 8}
    assert mesh.rename(hosts="dp").extent == Extent(("dp", "gpus"), (2, 4))
    assert isinstance(mesh.slice(hosts=0), FakeMesh)
    prop = PropertyMesh(grid).slice(gpus=-1)
    assert isinstance(prop, PropertyMesh) and prop._shape.ranks() == [3, 7]


def test_mesh_trait_size_sizes_extent(grid: Shape) -> None:
    """size() totals, picks or multiplies dims; sizes/extent/len describe the mesh."""
    mesh = FakeMesh(grid)
    assert (mesh.size(), mesh.size("gpus"), mesh.size(("hosts", "gpus")), mesh.size([])) == (
        8,
        4,
        8,
        1,
    )
    assert mesh.sizes == {"hosts": 2, "gpus": 4} and list(mesh.sizes) == ["hosts", "gpus"]
    assert mesh.extent == grid.extent and len(mesh) == 8


def test_mesh_trait_errors_name_the_mesh(grid: Shape) -> None:
    """Errors from MeshTrait name the mesh by its repr."""
    mesh = FakeMesh(grid)
    owner = "FakeMesh({'hosts': 2, 'gpus': 4})"
    unknown = f"{owner} has no dimension 'gpu' {DIMS}; use one of those names"
    with pytest.raises(TypeError, match=exact(unknown)):
        mesh.slice(gpu=0)
    with pytest.raises(TypeError, match=exact(unknown)):
        mesh.size("gpu")
    with pytest.raises(TypeError, match=exact(unknown)):
        mesh.size(["hosts", "gpu"])
    with pytest.raises(TypeError, match=exact(unknown)):
        mesh.rename(gpu="x")
    with pytest.raises(
        IndexError,
        match=exact(
            f"index 2 out of range for dimension 'hosts' of size 2 in {owner}; "
            "use an index from -2 to 1"
        ),
    ):
        mesh.slice(hosts=2)
    with pytest.raises(
        TypeError,
        match=exact(
            f"expecting None, a dimension name or a sequence of names for size() of {owner}, "
            "got 3 (int); pass e.g. size(('hosts', 'gpus'))"
        ),
    ):
        mesh.size(3)  # type: ignore[arg-type]


def test_mesh_trait_requires_new_with_shape(grid: Shape) -> None:
    """A subclass that forgets _new_with_shape gets a NotImplementedError naming it."""

    class Incomplete(MeshTrait):
        def __init__(self, shape: Shape) -> None:
            self._shape = shape

    message = "Incomplete must override _new_with_shape(shape) to use MeshTrait"
    with pytest.raises(NotImplementedError, match=exact(message)):
        Incomplete(grid).slice(hosts=0)


def test_docstring_examples_run() -> None:
    """The examples in the module's docstrings run as written."""
    results = doctest.testmod(shape_module)
    assert results.attempted > 0 and results.failed == 0
