"""ValueMesh: access, slicing and pickling (pure, no MPI needed)."""

from __future__ import annotations

import pickle

import pytest

from mpimesh import Shape, ValueMesh


def make() -> ValueMesh[int]:
    return ValueMesh(Shape.row_major(("hosts", "gpus"), (2, 3)), [0, 1, 2, 10, 11, 12])


def test_item_items_values() -> None:
    """item() takes every coordinate; items() pairs points with values in rank order."""
    vm = make()
    assert vm.item(hosts=1, gpus=2) == 12
    assert vm.values() == [0, 1, 2, 10, 11, 12]
    assert [(p.rank, dict(p), v) for p, v in vm.items()][4] == (4, {"hosts": 1, "gpus": 1}, 11)
    assert list(vm) == list(vm.items())
    assert len(vm) == 6 and vm.get(3) == 10


def test_slicing_keeps_values() -> None:
    """Slices, flatten and rename see the same values."""
    vm = make()
    assert vm.slice(hosts=1).values() == [10, 11, 12]
    assert vm.slice(gpus=slice(1, 3)).item(hosts=0, gpus=0) == 1
    assert vm.flatten("rank").item(rank=5) == 12
    assert vm.rename(gpus="g").item(hosts=0, g=2) == 2


def test_pickles_as_its_view() -> None:
    """A pickled slice is a dense mesh of the slice's values."""
    vm = pickle.loads(pickle.dumps(make().slice(gpus=1)))
    assert vm.sizes == {"hosts": 2} and vm.values() == [1, 11]
    assert vm == make().slice(gpus=1)


def test_errors_name_the_fix() -> None:
    """Bad coordinates raise KeyError/IndexError with the fix."""
    vm = make()
    with pytest.raises(
        KeyError,
        match=r"ValueMesh\(hosts=2, gpus=3\) has no dimension 'x'; "
        r"its dimensions are \['hosts', 'gpus'\]",
    ):
        vm.item(hosts=0, gpus=0, x=1)
    with pytest.raises(
        KeyError,
        match=r"needs a coordinate for every dimension, missing 'gpus'; "
        r"e.g. item\(hosts=0, gpus=0\)",
    ):
        vm.item(hosts=0)
    with pytest.raises(
        IndexError,
        match=r"^index 3 out of range for dimension 'gpus' of size 3 in ValueMesh\(hosts=2, "
        r"gpus=3\)$",
    ):
        vm.item(hosts=0, gpus=3)
    with pytest.raises(
        IndexError,
        match=r"^rank 6 out of range for ValueMesh\(hosts=2, gpus=3\) of size 6; "
        r"use 0 <= rank < 6$",
    ):
        vm.get(6)
    with pytest.raises(
        ValueError,
        match=r"^expecting 6 values for mesh of size 6, got 2; "
        r"pass one value per point in row-major order$",
    ):
        ValueMesh(Shape.row_major(("hosts", "gpus"), (2, 3)), [1, 2])
