"""The router over each wire (``Mpi4pyWire``, ``NativeWire``) and the factory that picks one, against real MPI.

Each router test runs on both wires, in this process (an MPI singleton), on
a duplicate of ``COMM_SELF`` standing for island 0: a router at ``(0, 0)``
sends to itself without MPI (frames to this very process), one at ``(0, 1)``
sends its frames to ``(0, 0)`` through MPI, to itself.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mpimesh._core.protocol import NAMES, Kind
from mpimesh._transport import make_router
from mpimesh._transport import native as binding
from mpimesh._transport.bell import RING_AFTER
from mpimesh._transport.mpi import MPI
from mpimesh._transport.router import Router
from mpimesh._transport.wire import Wire
from mpimesh._transport.wire_mpi4py import Mpi4pyWire
from mpimesh.config import settings

#: a wire class: made as ``cls(addr, handlers, failed, broken, names=...)``
WireClass = Callable[..., Wire]


@pytest.fixture()
def comm() -> Iterator[MPI.Intracomm]:
    c = MPI.COMM_SELF.Dup()
    yield c
    status = MPI.Status()
    while c.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
        c.Recv(bytearray(status.Get_count(MPI.BYTE)), status.Get_source(), status.Get_tag())
    c.Free()


def _native_class() -> WireClass:
    if os.environ.get("MPIMESH_WIRE") == "mpi4py":
        pytest.skip("MPIMESH_WIRE=mpi4py")
    if not binding.bind():
        pytest.skip(binding.why_not)
    from mpimesh._transport.wire_native import NativeWire

    return NativeWire


@pytest.fixture(params=["Mpi4pyWire", "NativeWire"])
def wire_class(request: pytest.FixtureRequest) -> WireClass:
    """Each router test runs on the mpi4py wire and on the native one."""
    return Mpi4pyWire if request.param == "Mpi4pyWire" else _native_class()


ROUTER_ADDRS = pytest.mark.parametrize("addr", [(0, 0), (0, 1)], ids=["to-itself", "through-mpi"])


def _router(cls: WireClass, comm: MPI.Intracomm, handlers: dict[int, Any], broken: list[str],
            addr: tuple[int, int] = (0, 0)) -> Router:
    router = Router(addr, cls(addr, handlers, broken=broken.append, names=NAMES))
    router.add_island(comm, 0)
    return router


def _poll_until(router: Router, want: int, seconds: float = 10.0) -> int:
    # Sends to itself may complete only once received (MPICH): poll until `want` frames came.
    got, deadline = 0, time.monotonic() + seconds
    while got < want and time.monotonic() < deadline:
        got += router.poll()
    return got


def _unbind(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if the native part had not been bound yet; all of it is restored after the test.
    monkeypatch.setattr(binding, "probe", None)
    monkeypatch.setattr(binding, "isend", None)
    monkeypatch.setattr(binding, "why_not", binding.why_not)


# --- the shape: one router over one wire per I/O path, one factory -----------------


def test_the_factory_picks_the_native_wire_when_it_binds() -> None:
    """make_router: a Router over a NativeWire where the native part binds (Open MPI with a matching build)."""
    cls = _native_class()
    router = make_router((0, 0), {})
    assert type(router) is Router and type(router.wire) is cls


def test_the_factory_picks_the_mpi4py_wire_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """MPIMESH_WIRE=mpi4py (or a native part that does not bind): an Mpi4pyWire."""
    _unbind(monkeypatch)
    monkeypatch.setattr(binding, "settings", dataclasses.replace(settings, wire="mpi4py"))
    assert type(make_router((0, 0), {}).wire) is Mpi4pyWire
    monkeypatch.setattr(binding, "settings", dataclasses.replace(settings, wire="auto"))
    monkeypatch.setattr(binding, "library", lambda: "Some MPI 1.0")
    assert type(make_router((0, 0), {}).wire) is Mpi4pyWire
    monkeypatch.setattr(binding, "settings", dataclasses.replace(settings, wire="native"))
    with pytest.raises(RuntimeError, match=r"^MPIMESH_WIRE=native, but .*; unset MPIMESH_WIRE to fall back to mpi4py$"):
        make_router((0, 0), {})


def test_the_native_wire_needs_the_native_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NativeWire made by hand where the native part does not bind says why, and which class to use."""
    cls = _native_class()
    _unbind(monkeypatch)
    monkeypatch.setattr(binding, "settings", dataclasses.replace(settings, wire="mpi4py"))
    with pytest.raises(RuntimeError, match=r"^the native frame path cannot be used: MPIMESH_WIRE=mpi4py; "
                                           r"make an Mpi4pyWire instead$"):
        cls((0, 0), {})


def test_both_wires_answer_the_wire_protocol_and_nothing_more() -> None:
    """Each wire has the Wire protocol's public members, no others; the router's I/O methods are its wire's own."""
    protocol = {name for name in vars(Wire) if not name.startswith("_")} | set(Wire.__annotations__)
    for cls in (Mpi4pyWire, _native_class()):
        wire = cls((0, 0), {})
        assert {name for name in dir(wire) if not name.startswith("_")} == protocol, cls
        router = Router((0, 0), wire)
        for name in ("poll", "flush", "drain", "pending_sends", "exclusive", "watch", "lock"):
            assert getattr(router, name) == getattr(wire, name), name  # bound once: no step per call


def test_the_router_and_the_mpi4py_wire_know_nothing_of_the_native_part() -> None:
    """One design per class: neither has a branch on the native objects."""
    for cls in (Router, Mpi4pyWire):
        source = inspect.getsource(cls)
        for word in ("_pump", "_sender", "_native", "_isend"):
            assert word not in source, (cls, word)


# --- behaviour, the same on both --------------------------------------------------


@ROUTER_ADDRS
def test_a_raising_handler_is_reported_and_polling_goes_on(wire_class: WireClass, comm: MPI.Intracomm,
                                                           addr: tuple[int, int]) -> None:
    """A handler's exception reaches broken, named by kind and source; the next frame is handled."""
    seen: list[object] = []
    broken: list[str] = []

    def bad(src: object, frame: tuple, buffers: list) -> None:
        raise KeyError("boom")

    router = _router(wire_class, comm, {Kind.LOG: bad, Kind.FAULT: lambda s, f, b: seen.append(f[2])}, broken, addr)
    router.send((0, 0), (Kind.LOG, None, "x"))
    router.send((0, 0), (Kind.FAULT, None, "after"))
    assert _poll_until(router, 2) == 2
    assert seen == ["after"]
    assert len(broken) == 1 and broken[0].startswith("error handling LOG from (0, 0):\n")
    assert "KeyError: 'boom'" in broken[0]
    through_mpi = addr != (0, 0)  # frames to itself are not sent
    assert (router.frames_out, router.frames_in, router.sent_at > 0) == (2 * through_mpi, 2, through_mpi)


def test_a_kind_without_a_name_is_reported_by_number(wire_class: WireClass, comm: MPI.Intracomm) -> None:
    """Without names the report gives the kind's number."""
    broken: list[str] = []

    def bad(src: object, frame: tuple, buffers: list) -> None:
        raise KeyError("boom")

    router = Router((0, 1), wire_class((0, 1), {Kind.LOG: bad}, broken=broken.append))
    router.add_island(comm, 0)
    router.send((0, 0), (Kind.LOG, None, "x"))
    assert _poll_until(router, 1) == 1
    assert len(broken) == 1 and broken[0].startswith(f"error handling {Kind.LOG} from (0, 0):\n")


@ROUTER_ADDRS
def test_every_ms_runs_and_heard_is_kept(wire_class: WireClass, comm: MPI.Intracomm,
                                         addr: tuple[int, int]) -> None:
    """every_ms runs at most once per millisecond of polling; a tracked source's arrival is noted in heard."""
    ticks: list[float] = []
    router = _router(wire_class, comm, {Kind.FAULT: lambda s, f, b: None, Kind.PING: lambda s, f, b: None}, [],
                     addr)
    router.every_ms = lambda: ticks.append(time.monotonic())
    router.heard = {(0, 0): 0.0}
    router.poll()
    assert len(ticks) == 1
    router.poll()
    assert len(ticks) == 1  # not again within the millisecond
    time.sleep(0.002)
    router.send((0, 0), (Kind.PING, None))
    deadline = time.monotonic() + 10
    while router.frames_in == 0 and time.monotonic() < deadline:
        assert router.poll() == 0  # a heartbeat is not traffic
    assert len(ticks) >= 2 and router.heard is not None and router.heard[(0, 0)] > 0
    assert router.frames_in == 1


def test_heard_is_written_again_once_its_grain_has_passed(wire_class: WireClass, comm: MPI.Intracomm) -> None:
    """A source heard again after the native pump's grain (100 us) is noted again; a heartbeat always is.

    The pump writes a source's busy frames to ``heard`` at most once per grain (B1's round trip would pay a
    dict update per reply); liveness, which works in milliseconds, must still see every source it tracks.
    """
    router = _router(wire_class, comm, {Kind.FAULT: lambda s, f, b: None, Kind.PING: lambda s, f, b: None}, [],
                     (0, 1))
    heard = router.heard = {(0, 0): 0.0}
    for kind in (Kind.FAULT, Kind.FAULT, Kind.PING, Kind.PING):
        heard[(0, 0)] = 0.0
        time.sleep(0.001)  # past the grain
        before = time.monotonic()
        router.send((0, 0), (kind, None, "x") if kind == Kind.FAULT else (kind, None))
        deadline = time.monotonic() + 10
        while heard[(0, 0)] == 0.0 and time.monotonic() < deadline:
            router.poll()
        assert heard[(0, 0)] >= before, (kind, heard)


def test_a_worker_notes_when_the_controller_was_heard(wire_class: WireClass, comm: MPI.Intracomm) -> None:
    """With heard None, a frame from the controller moves heard_controller; the setter is read back."""
    router = _router(wire_class, comm, {Kind.FAULT: lambda s, f, b: None}, [], (0, 1))
    router.heard_controller = 0.0
    assert router.heard_controller == 0.0 and router.heard is None
    router.send((0, 0), (Kind.FAULT, None, "hello"))
    assert _poll_until(router, 1) == 1
    assert router.heard_controller > 0.0


def test_a_heartbeat_rings_no_doorbell(wire_class: WireClass, comm: MPI.Intracomm) -> None:
    """send_quiet: no ring, no sent_at, and the next frame after a pause still rings (it wakes the sleeper)."""
    got: list[object] = []
    router = _router(wire_class, comm, {Kind.PING: lambda s, f, b: got.append(f),
                                          Kind.FAULT: lambda s, f, b: got.append(f)}, [], (0, 1))
    rings: list[object] = []
    router.ring = rings.append
    assert router.ring == rings.append
    router.send_quiet((0, 0), (Kind.PING, None, 1))
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        assert router.poll() == 0  # it arrives; a heartbeat is not traffic
    assert got == [(Kind.PING, None, 1)]
    assert rings == [] and router.sent_at == 0.0
    router.send((0, 0), (Kind.FAULT, None, "wake"))
    assert rings == [(0, 0)] and router.sent_at > 0  # the first real frame rings
    time.sleep(RING_AFTER * 1.5)
    router.send_quiet((0, 0), (Kind.PING, None, 2))
    router.send((0, 0), (Kind.FAULT, None, "again"))
    assert rings == [(0, 0), (0, 0)]  # after a pause: the heartbeat in between did not count as a send
    assert _poll_until(router, 2) == 2
    assert got[1:] == [(Kind.FAULT, None, "wake"), (Kind.PING, None, 2), (Kind.FAULT, None, "again")]


@ROUTER_ADDRS
def test_raw_buffers_arrive_with_their_frame(wire_class: WireClass, comm: MPI.Intracomm,
                                             addr: tuple[int, int]) -> None:
    """A frame's raw buffers (small, and large through the pool) reach its handler as private, equal copies."""
    got: list[tuple[object, list[Any]]] = []
    router = _router(wire_class, comm, {Kind.FAULT: lambda s, f, b: got.append((f, b))}, [], addr)
    small, large = bytearray(b"abc"), bytearray(os.urandom(200_000))
    router.send((0, 0), (Kind.FAULT, None, "raw"), [small, large])
    router.send((0, 0), (Kind.FAULT, None, "after"))
    assert _poll_until(router, 2) == 2
    (first, buffers), (second, none) = got
    assert first[0] == Kind.FAULT and first[2] == "raw" and first[1][0] == 3  # bufsizes: 3, then (size, offset)
    assert [bytes(b) for b in buffers] == [bytes(small), bytes(large)]
    assert second == (Kind.FAULT, None, "after") and none == []
    deadline = time.monotonic() + 10
    while router.pending_sends() and time.monotonic() < deadline:
        router.poll()
    assert router.pending_sends() == 0


def test_a_burst_leaves_as_batches(wire_class: WireClass, comm: MPI.Intracomm) -> None:
    """Frames to one process with no poll in between are held and leave as BATCH messages, in order."""
    if settings.batch_frames <= 1:
        pytest.skip("MPIMESH_BATCH_FRAMES=1: no batching")
    seen: list[object] = []
    holds: list[None] = []
    router = _router(wire_class, comm, {Kind.FAULT: lambda s, f, b: seen.append(f[2])}, [], (0, 1))
    router.on_hold = lambda: holds.append(None)
    for i in range(20):
        router.send((0, 0), (Kind.FAULT, None, i))
    assert _poll_until(router, 20) == 20
    assert seen == list(range(20))
    assert router.batches_out >= 1 and len(holds) >= 1 and router.frames_out == 20


def test_frames_to_other_islands_are_relayed(wire_class: WireClass, comm: MPI.Intracomm) -> None:
    """No route to an island: a FORWARD frame to the controller, over the relay link, with the raw buffers."""
    got: list[tuple[object, list[Any]]] = []
    router = _router(wire_class, comm, {Kind.FORWARD: lambda s, f, b: got.append((f, b))}, [], (0, 1))
    router.set_relay(0)
    router.send((3, 2), (Kind.FAULT, None, "far"), [bytearray(b"xy")])
    assert _poll_until(router, 1) == 1
    ((kind, sizes, dest, inner), buffers), = got
    assert (kind, sizes, dest) == (Kind.FORWARD, (2,), (3, 2)) and [bytes(b) for b in buffers] == [b"xy"]
    assert pickle.loads(inner) == (Kind.FAULT, (2,), "far")


def test_without_a_route_or_relay_a_send_fails(wire_class: WireClass, comm: MPI.Intracomm) -> None:
    """Once its island is removed, a process without a relay cannot be reached."""
    router = _router(wire_class, comm, {}, [], (0, 1))
    assert router.islands() == [0]
    assert router.remove_island(0) is comm and router.islands() == [] and router.remove_island(0) is None
    with pytest.raises(ConnectionError, match=r"^no route from process \(0, 1\) to process \(0, 0\): its island is "
                                              r"gone$"):
        router.send((0, 0), (Kind.FAULT, None, "nowhere"))
