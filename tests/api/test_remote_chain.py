"""A remote exception keeps its chain: ``raise Outer from Inner`` arrives with ``Inner`` in message and traceback."""

from __future__ import annotations

import pickle

import pytest

from mpimesh import Actor, ActorError, endpoint

pytestmark = pytest.mark.mesh


class Chained(Actor):
    @endpoint
    def raise_from(self) -> None:
        try:
            raise KeyError("inner-key")
        except KeyError as exc:
            raise ValueError("outer") from exc

    @endpoint
    def raise_during(self) -> None:
        try:
            {}["missing"]
        except KeyError:
            raise RuntimeError("while handling")  # noqa: B904 - the implicit context is the point

    @endpoint
    def raise_suppressed(self) -> None:
        try:
            raise KeyError("hidden")
        except KeyError:
            raise ValueError("alone") from None

    @endpoint
    def three_deep(self) -> None:
        try:
            try:
                raise OSError("disk")
            except OSError as exc:
                raise KeyError("lookup") from exc
        except KeyError as exc:
            raise ValueError("top") from exc


@pytest.fixture(scope="module")
def chained(one_proc: object) -> object:
    return one_proc.spawn("chained", Chained)  # type: ignore[attr-defined]


def failure(fut: object) -> ActorError:
    with pytest.raises(ActorError) as info:
        fut.get(30)  # type: ignore[attr-defined]
    return info.value


def test_raise_from_names_the_cause(chained: object) -> None:
    err = failure(chained.raise_from.call_one())  # type: ignore[attr-defined]
    assert str(err).endswith(": ValueError: outer (from KeyError: 'inner-key')"), str(err)
    assert err.causes == ("KeyError: 'inner-key'",)
    assert "KeyError: 'inner-key'" in err.exception_formatted
    assert "The above exception was the direct cause" in err.exception_formatted
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err) and copy.causes == err.causes


def test_raise_while_handling_names_the_context(chained: object) -> None:
    err = failure(chained.raise_during.call_one())  # type: ignore[attr-defined]
    assert err.causes == ("KeyError: 'missing'",), err.causes


def test_from_none_hides_the_context(chained: object) -> None:
    err = failure(chained.raise_suppressed.call_one())  # type: ignore[attr-defined]
    assert err.causes == () and str(err).endswith(": ValueError: alone")


def test_every_link_of_a_longer_chain(chained: object) -> None:
    err = failure(chained.three_deep.call_one())  # type: ignore[attr-defined]
    assert err.causes == ("KeyError: 'lookup'", "OSError: disk")
    assert str(err).endswith(": ValueError: top (from KeyError: 'lookup') (from OSError: disk)")
