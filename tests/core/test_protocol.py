"""The protocol table: each kind declared once, with its fields, its constructor and its real handler.

The pure tests read ``mpimesh._core.protocol`` and the handlers' source (no
MPI).  The ``mesh`` tests check the live dispatch tables of the controller
and of a worker against the table.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

from mpimesh import Actor, endpoint
from mpimesh._core import protocol
from mpimesh._core.protocol import KINDS, Kind

PACKAGE = Path(protocol.__file__).resolve().parents[1]
UNEXPECTED = "_roles.base.BaseRole.unexpected"


def handlers_of(kind: int) -> list[str]:
    return KINDS[kind].handler.split(" | ")


def defines(module: str, cls: str, method: str) -> bool:
    """Whether ``mpimesh.<module>`` defines ``cls.method`` (read from its source, nothing imported)."""
    path = PACKAGE.joinpath(*module.split(".")).with_suffix(".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return any(
                isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == method for item in node.body
            )
    return False


@pytest.mark.parametrize("kind", sorted(KINDS), ids=lambda k: KINDS[k].name)
def test_handler_names_a_real_method(kind: int) -> None:
    """Every kind's handler string names methods that exist: ``module.Class.method`` under mpimesh."""
    for name in handlers_of(kind):
        module, cls, method = name.rsplit(".", 2)
        assert defines(module, cls, method), f"{KINDS[kind].name}: {name} is not defined"


def test_kinds_are_the_table() -> None:
    """Each ``Kind`` constant has one row, under its own name, and one constructor named after it."""
    constants = {name: value for name, value in vars(Kind).items() if name.isupper()}
    assert {KINDS[value].name: value for value in KINDS} == constants
    for spec in KINDS.values():
        assert callable(getattr(protocol, spec.name.lower())), spec.name


@pytest.mark.parametrize("kind", sorted(KINDS), ids=lambda k: KINDS[k].name)
def test_constructor_builds_the_documented_fields(kind: int) -> None:
    """A kind's constructor takes its fields by name and lays them out in the documented order."""
    spec = KINDS[kind]
    required = tuple(f for f in spec.fields if not f.endswith("?"))
    build = getattr(protocol, spec.name.lower())
    params = [p for p in inspect.signature(build).parameters if p != "bufsizes"]
    assert tuple(params) == required
    frame = build(**{p: f"<{p}>" for p in inspect.signature(build).parameters})
    assert frame[0] == kind
    assert len(frame) == 2 + len(required)
    assert frame[2:] == tuple(f"<{f}>" for f in required)
    assert protocol.describe(frame).startswith(f"{spec.name}(")


def test_optional_field_constructor() -> None:
    """The CALL that registers a call site carries the optional ``site`` field last."""
    fields = KINDS[Kind.CALL].fields
    assert fields[-1] == "site?"
    frame = protocol.call_registering(None, (0, 0, 1), "m", ((), {}), ((0, 0), 1), (0, (), ()), 7)
    assert len(frame) == 2 + len(fields) and frame[-1] == 7


# --- the live dispatch tables (mesh) ------------------------------------------------------------


def test_fields_by_name() -> None:
    """The named positions read the fields the table names, and a CAST's copies change only what they say."""
    call = protocol.call(None, (0, 0, 1), "m", ((), {}), ((0, 0), 5), (2, ("gpus",), (4,)))
    assert (call[protocol.CALL_METHOD], call[protocol.CALL_REPLY_PORT], call[protocol.CALL_POINT]) == (
        "m", ((0, 0), 5), (2, ("gpus",), (4,)))
    fields = KINDS[Kind.CAST].fields
    assert fields[-1] == "entries", "subtree() keeps every field before the entries"
    cast = protocol.cast((8,), (0, 0), (0, 0, 1), "m", ((), {}), ((0, 0), 5), ("gpus",), (4,), 2, 1, None, b"e")
    named = dict(zip(fields, cast[2:], strict=True))
    assert (cast[protocol.CAST_METHOD], cast[protocol.CAST_REPLY_PORT], cast[protocol.CAST_FANOUT],
            cast[protocol.CAST_GATHER]) == (named["method"], named["reply_port"], named["fanout"], named["gather"])
    assert protocol.subtree(cast, b"f") == (*cast[:-1], b"f")
    again = protocol.cast_again(cast, ((0, 3), 7), 2)
    assert dict(zip(fields, again[2:], strict=True)) == {**named, "reply_port": ((0, 3), 7), "gather": 2,
                                                          "entries": b""}
    assert again[:2] == cast[:2]
    seq = protocol.sequenced((0, 0), 3, cast)
    assert seq == protocol.seq((8,), (0, 0), 3, cast)


def test_transport_kinds_are_made_once() -> None:
    """``BATCH`` and ``FORWARD`` frames have one constructor each, the transport's, which the table re-exports."""
    from mpimesh._transport import frames

    assert protocol.batch is frames.batch
    assert protocol.forward is frames.forward


def dispatch_table() -> dict[int, str]:
    """This process's handler of each kind, as ``module.Class.method`` under mpimesh."""
    from mpimesh._core.current import current

    named = {}
    for kind, handler in current().handlers().items():
        func: Any = getattr(handler, "__func__", handler)
        named[kind] = f"{func.__module__.removeprefix('mpimesh.')}.{func.__qualname__}"
    return named


def table_matches(table: dict[int, str]) -> list[str]:
    wrong = [f"{KINDS[k].name} has no handler" for k in KINDS if k not in table]
    wrong += [f"kind {k} is not in the protocol table" for k in table if k not in KINDS]
    wrong += [
        f"{KINDS[k].name} -> {name}"
        for k, name in table.items()
        if k in KINDS and name not in handlers_of(k) and name != UNEXPECTED
    ]
    return wrong


class TableActor(Actor):
    """Reports the dispatch table of the worker it lives on."""

    @endpoint
    def table(self) -> dict[int, str]:
        return dispatch_table()


@pytest.mark.mesh
def test_controller_and_worker_register_every_kind_once(one_proc: Any) -> None:
    """Each role registers every kind exactly once, to the handler the table names (or to ``unexpected``).

    A kind that both roles receive has each role's own handler; across the
    two roles, every handler the table names is registered.
    """
    controller = dispatch_table()
    worker = one_proc.spawn("tables", TableActor).table.call_one().get(30)
    worker = {int(k): v for k, v in worker.items()}
    assert table_matches(controller) == []
    assert table_matches(worker) == []
    named = {name for k in KINDS for name in handlers_of(k)}
    assert named == (set(controller.values()) | set(worker.values())) - {UNEXPECTED}
    assert controller[Kind.HELLO] == "_roles.controller.Controller.on_hello"
    assert worker[Kind.HELLO] == UNEXPECTED
    assert worker[Kind.INIT] == "_roles.worker.Worker.on_init"
    assert controller[Kind.INIT] == UNEXPECTED


@pytest.mark.mesh
def test_a_second_handler_is_refused() -> None:
    """``Runtime.handle`` refuses a second handler for a kind, and keeps the first."""
    from mpimesh import MeshInternalError
    from mpimesh._core.current import current

    rt = current()
    before = rt.handlers()[Kind.CALL]
    with pytest.raises(
        MeshInternalError,
        match=r"^internal error in mpimesh - please file a bug: a second handler for CALL frames in \(0, 0\)$",
    ):
        rt.handle(Kind.CALL, lambda src, frame, buffers: None)
    assert rt.handlers()[Kind.CALL] == before

