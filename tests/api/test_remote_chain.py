"""A remote exception keeps its chain: ``raise Outer from Inner`` arrives with ``Inner`` in message and traceback."""

from __future__ import annotations

import pickle
import re
import traceback

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
    assert str(err).splitlines()[0].endswith(": ValueError: outer (from KeyError: 'inner-key')"), str(err)
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
    assert err.causes == () and str(err).splitlines()[0].endswith(": ValueError: alone")
    assert "During handling" not in str(err) and "KeyError" not in str(err)


def test_every_link_of_a_longer_chain(chained: object) -> None:
    err = failure(chained.three_deep.call_one())  # type: ignore[attr-defined]
    assert err.causes == ("KeyError: 'lookup'", "OSError: disk")
    assert str(err).splitlines()[0].endswith(": ValueError: top (from KeyError: 'lookup') (from OSError: disk)")


# --- the text Monarch's users read and match on (issue #14 item 8) -----------------------------


def test_text_is_monarchs_actor_call_line_then_the_remote_traceback(chained: object) -> None:
    """str(ActorError) is "Actor call mesh.method failed at ...", then the whole remote chain, as Monarch prints it."""
    err = failure(chained.raise_from.call_one())  # type: ignore[attr-defined]
    assert err.endpoint == "chained.raise_from"
    first, rest = str(err).split("\n", 1)
    assert re.fullmatch(r"Actor call chained\.raise_from failed at rank 0 \(gpus=0\) on \S+ in actor 'chained': "
                        r"ValueError: outer \(from KeyError: 'inner-key'\)", first), first
    assert rest.startswith(" Traceback of where the remote call failed (most recent call last):\n"), rest
    assert rest.count("Traceback of where the remote call failed (most recent call last):") == 2, rest
    assert "Traceback (most recent call last)" not in rest
    assert "KeyError: 'inner-key'\n\nThe above exception was the direct cause of the following exception:" in rest
    assert rest.endswith("ValueError: outer"), rest


def test_text_shows_an_exception_raised_while_handling_another(chained: object) -> None:
    """An exception raised in an ``except`` block shows Python's "During handling" banner in the text."""
    err = failure(chained.raise_during.call_one())  # type: ignore[attr-defined]
    text = str(err)
    assert "KeyError: 'missing'\n\nDuring handling of the above exception, another exception occurred:" in text
    assert text.endswith("RuntimeError: while handling"), text


def test_the_remote_traceback_is_printed_once(chained: object) -> None:
    """The cause chain names where it ran (the ### header) and leaves the traceback to the text: no repeat."""
    err = failure(chained.raise_from.call_one())  # type: ignore[attr-defined]
    cause = err.exception.__cause__
    assert str(cause).strip() == err.header
    printed = "".join(traceback.format_exception(err))
    assert printed.count("raise ValueError(\"outer\") from exc") == 1, printed
    assert printed.count(err.header) == 1, printed
