"""The public API: __all__, __module__ and docstrings (pure)."""

from __future__ import annotations

import inspect

import mpimesh


def test_all_is_importable_and_sorted() -> None:
    """Everything in __all__ exists, and nothing public is missing from it."""
    assert sorted(mpimesh.__all__) == mpimesh.__all__
    for name in mpimesh.__all__:
        assert hasattr(mpimesh, name), name
    public = {n for n in vars(mpimesh) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(mpimesh, n))}
    assert public - modules == set(mpimesh.__all__)


def test_public_objects_are_documented_and_rehomed() -> None:
    """Every public object reports module `mpimesh` and has a docstring."""
    for name in mpimesh.__all__:
        obj = getattr(mpimesh, name)
        assert obj.__module__ == "mpimesh", name
        assert inspect.getdoc(obj), name
