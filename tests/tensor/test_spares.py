"""Spare reduction results: memory is reused only when nothing else can see it (pure)."""

from __future__ import annotations

import torch

from mpimesh.tensor._collectives import Spares

MIB = (1 << 18,)  # 1 MiB of float32
CPU = torch.device("cpu")


def test_a_released_result_is_reused_for_the_next_of_its_size() -> None:
    """The next take() of the same size and dtype gets the same memory back, once."""
    spares = Spares()
    table = {1: spares.take(MIB, torch.float32, CPU)}
    ptr = table[1].data_ptr()
    spares.give(table.pop(1))
    again = spares.take(MIB, torch.float32, CPU)
    assert again.data_ptr() == ptr
    fresh = spares.take(MIB, torch.float32, CPU)  # held, so malloc cannot hand ``again``'s memory back
    assert fresh.data_ptr() != ptr


def test_a_view_that_starts_where_its_base_does_leaves_the_base_reusable() -> None:
    """``s[:1]`` has the address of ``s``: letting the view go first must not make ``s`` forgotten."""
    spares = Spares()
    table = {1: spares.take(MIB, torch.float32, CPU)}
    ptr = table[1].data_ptr()
    table[2] = table[1][:1]
    spares.give(table.pop(2))
    spares.give(table.pop(1))
    assert spares._bytes == 1 << 20  # kept (an address check alone could pass by malloc's reuse)
    again = spares.take(MIB, torch.float32, CPU)
    assert again.data_ptr() == ptr and spares._bytes == 0


def test_memory_a_view_or_a_reference_still_sees_is_not_reused() -> None:
    """A view of the result, or a Python reference kept elsewhere, keeps its memory out of the spares."""
    spares = Spares()
    table = {1: spares.take(MIB, torch.float32, CPU)}
    view = table[1][:10]
    spares.give(table.pop(1))
    assert spares.take(MIB, torch.float32, CPU).data_ptr() != view.data_ptr()
    table = {2: spares.take(MIB, torch.float32, CPU)}
    kept = table[2]
    spares.give(table.pop(2))
    assert spares.take(MIB, torch.float32, CPU).data_ptr() != kept.data_ptr()


def test_small_and_foreign_tensors_are_never_kept() -> None:
    """Below MIN_BYTES, or not made by take(), a tensor is simply freed."""
    spares = Spares()
    table = {1: spares.take((16,), torch.float32, CPU), 2: torch.empty(MIB)}
    spares.give(table.pop(1))
    spares.give(table.pop(2))
    assert spares._bytes == 0 and spares._free.get((16, torch.float32, CPU), []) == []


def test_a_reused_result_is_reusable_again() -> None:
    """A spare handed out (same shape or another of its size) can come back once more: it is no view.

    It was once ``t.view(shape)``, which ``give`` left alone as a view, so a
    loop of ``s = t.reduce(...)`` reused the memory only every other time.
    """
    spares = Spares()
    ptr = 0
    for shape in (MIB, MIB, (512, 512), MIB):
        table = {1: spares.take(shape, torch.float32, CPU)}
        assert table[1].shape == shape and table[1]._base is None
        assert ptr in (0, table[1].data_ptr())
        ptr = table[1].data_ptr()
        spares.give(table.pop(1))
        assert spares._bytes == 1 << 20
