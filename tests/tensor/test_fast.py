"""The tensor engine's fast path, its keys and the line it reports (pure: no mesh).

The replay table is keyed by tokens that stand for a handle's metadata, and
the reported line is cached by instruction; both are caches whose mistakes
would be silent (a wrong replay, a wrong line in an error), so each is
checked against what it stands for.
"""

from __future__ import annotations

from typing import Any

from mpimesh.tensor import _fast
from mpimesh.tensor._fast import Token, site, token


class Keyed:
    """A stand-in handle: keyed by ``meta``, as a mesh tensor is by its ``_mkey``."""

    _fast_key = "meta"
    _fk = Token()

    def __init__(self, meta: Any) -> None:
        self.meta = meta


def test_equal_keys_share_a_token_and_others_do_not() -> None:
    a = token((True, (4,), (1,), "float32", "cpu"))
    assert token((True, (4,), (1,), "float32", "cpu")) == a
    assert token((True, (4,), (1,), "float64", "cpu")) != a


def test_a_token_is_never_reused_after_its_table_is_cleared() -> None:
    before = token(("cleared", 1))
    _fast._tokens.clear()
    after = {token(("cleared", 1)), token(("cleared", 2))}
    assert before not in after  # an entry of the replay table keyed by `before` can only miss now


def test_a_handle_finds_its_token_once_and_keeps_it() -> None:
    h = Keyed(("meta", 1))
    assert "_fk" not in h.__dict__
    first = h._fk
    assert h.__dict__["_fk"] == first == token(("meta", 1))
    assert Keyed(("meta", 1))._fk == first
    assert Keyed(("meta", 2))._fk != first
    assert Keyed.__dict__["_fk"].__get__(None, Keyed) is Keyed.__dict__["_fk"]


def test_site_names_the_callers_line() -> None:
    here = site().split(":")
    line = int(here[-1].split(" in ")[0])
    assert here[0] == __file__
    assert line == test_site_names_the_callers_line.__code__.co_firstlineno + 1
    assert site().endswith(f":{line + 4} in test_site_names_the_callers_line")


def test_site_gives_one_string_per_line_whatever_the_instruction() -> None:
    # two calls on one line are two instructions: one string, so that a batch pickles it once
    first, second = site(), site()
    assert first is second
    assert site() is not first
