"""The native part against real MPI: its binding (``mpimesh._transport.native``), its MPI calls
(``native/wire.c``), its receive path (``native/pump.c``) and its send path (``native/post.c``).

The pure tests run in this process (an MPI singleton); the subprocess test
runs a job with the native calls and one with mpi4py's, and checks that both
carry calls, ordered, in either direction.  The routers built on them are
tested in test_router.py.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import threading
import time
from pathlib import Path

import pytest
from mpitest import mpiexec_cmd, python_cmd, run

from mpimesh._transport import native as binding
from mpimesh._transport.mpi import MPI, library
from mpimesh.config import load, settings

TAG = 77


# Sends to itself that did not complete at once (MPICH completes a self-send
# only once it is received, and reads the buffer only then): each is kept with
# its buffer, and the comm fixture receives what is left and waits for them.
_pending: list[tuple[MPI.Request, bytes]] = []


def _keep(handle: int | None, data: bytes) -> None:
    if handle is not None:
        _pending.append((MPI.Request.fromhandle(handle), data))


@pytest.fixture()
def comm() -> MPI.Intracomm:
    c = MPI.COMM_SELF.Dup()
    yield c
    status = MPI.Status()
    while c.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
        c.Recv(bytearray(status.Get_count(MPI.BYTE)), status.Get_source(), status.Get_tag())
    MPI.Request.Waitall([request for request, _ in _pending])
    _pending.clear()
    c.Free()


@pytest.fixture()
def native() -> None:
    if os.environ.get("MPIMESH_WIRE") == "mpi4py":
        pytest.skip("MPIMESH_WIRE=mpi4py")
    assert binding.bind(), f"the native frame path is not in use: {binding.why_not}"


def test_the_default_install_uses_the_native_path(native: None) -> None:
    """scripts/bootstrap.sh builds mpimesh._native against the MPI it installs."""
    assert binding.probe is not None and binding.isend is not None and binding.why_not == ""


def test_send_and_probe_a_frame(native: None, comm: MPI.Intracomm) -> None:
    assert binding.isend is not None and binding.probe is not None
    assert binding.probe((comm.handle,), TAG, 0) is None
    first, second = b"first", bytearray(b"second")
    # None: complete at once (Open MPI); else a request to complete later (MPICH, to itself)
    requests = [binding.isend(comm.handle, first, 0, TAG), binding.isend(comm.handle, second, 0, TAG)]
    assert binding.probe((comm.handle,), TAG + 1, -1) is None  # another tag is not seen
    assert binding.probe((comm.handle,), TAG, 0) == (0, 0, b"first")
    assert binding.probe((comm.handle,), TAG, -1) == (0, 0, b"second")
    assert binding.probe((comm.handle,), TAG, 0) is None
    for handle in requests:
        if handle is not None:
            MPI.Request.fromhandle(handle).Wait()


def test_probe_finds_the_link_with_a_message(native: None, comm: MPI.Intracomm) -> None:
    assert binding.isend is not None and binding.probe is not None
    other = MPI.COMM_SELF.Dup()
    try:
        payload = b"x" * 1000
        _keep(binding.isend(other.handle, payload, 0, TAG), payload)
        assert binding.probe((comm.handle, other.handle), TAG, 0) == (1, 0, b"x" * 1000)
        assert binding.probe((), TAG, 10_000_000) is None  # no links: no spin either
    finally:
        other.Free()


def test_probe_spins_for_the_time_asked(native: None, comm: MPI.Intracomm) -> None:
    assert binding.probe is not None
    start = time.monotonic()
    assert binding.probe((comm.handle,), TAG, 20_000_000) is None
    assert 0.019 <= time.monotonic() - start < 1.0


def test_a_failed_send_raises_the_mpi_error(native: None, comm: MPI.Intracomm) -> None:
    assert binding.isend is not None
    with pytest.raises(MPI.Exception) as info:
        binding.isend(comm.handle, b"nowhere", 5, TAG)  # COMM_SELF has one rank
    assert info.value.Get_error_class() == MPI.ERR_RANK


def test_bad_arguments_name_the_function(native: None, comm: MPI.Intracomm) -> None:
    assert binding.probe is not None
    with pytest.raises(TypeError, match="wire_probe"):
        binding.probe([comm.handle], TAG, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^wire_probe: at most 64 communicators, got 65$"):
        binding.probe((comm.handle,) * 65, TAG, 0)


@pytest.mark.parametrize(
    ("built", "loaded", "same"),
    [
        ("Open MPI 5.0.11", "Open MPI v5.0.11, package: Open MPI user@localhost Distribution", True),
        ("Open MPI 5.0.11", "Open MPI v5.0.3, package: Debian", True),
        ("Open MPI 5.0.11", "Open MPI v4.1.4, package: Debian", False),
        ("Open MPI 5.0.11", "MPICH Version:      5.0.2", False),
        ("MPICH 5.0.2", "MPICH Version:      5.0.2", True),
    ],
)
def test_only_the_mpi_it_was_built_for(built: str, loaded: str, same: bool) -> None:
    """The MPI types come from the build's headers: vendor and major version must match."""
    assert binding.same_mpi(built, loaded) is same


def test_a_mismatch_falls_back_or_fails_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binding, "probe", None)
    monkeypatch.setattr(binding, "isend", None)
    monkeypatch.setattr(binding, "library", lambda: "Some MPI 1.0")
    native_path = pytest.importorskip("mpimesh._native")
    assert native_path.built_with()
    monkeypatch.setattr(binding, "settings", dataclasses.replace(settings, wire="auto"))
    assert not binding.bind()
    assert binding.why_not.startswith("mpimesh._native was built with ")
    assert "'Some MPI 1.0' is loaded" in binding.why_not
    monkeypatch.setattr(binding, "settings", dataclasses.replace(settings, wire="native"))
    with pytest.raises(RuntimeError, match=r"^MPIMESH_WIRE=native, but mpimesh._native was built with .*; "
                                           r"unset MPIMESH_WIRE to fall back to mpi4py$"):
        binding.bind()
    monkeypatch.setattr(binding, "settings", dataclasses.replace(settings, wire="mpi4py"))
    assert not binding.bind() and binding.why_not == "MPIMESH_WIRE=mpi4py"


def test_the_setting_is_a_choice() -> None:
    assert load({}).wire == "auto"
    assert load({"MPIMESH_WIRE": "MPI4PY"}).wire == "mpi4py"
    with pytest.raises(ValueError, match=r"^MPIMESH_WIRE must be auto, native or mpi4py, got 'c'; "):
        load({"MPIMESH_WIRE": "c"})


SCRIPT = """
import sys
from mpimesh._core import current as _current
from mpimesh import Actor, endpoint, this_host


def native_path():
    from mpimesh._transport.wire_native import NativeWire

    return isinstance(_current.runtime.router.wire, NativeWire)

class Echo(Actor):
    @endpoint
    def echo(self, i):
        return i

    @endpoint
    def path(self):
        return native_path()

    @endpoint
    def relay(self, other, n):
        # worker to worker, plain and pickled results, interleaved
        got = [other.echo.call_one(i).get(30) for i in range(n)]
        got += other.echo.call_one({"k": list(range(3))}).get(30)["k"]
        return got

procs = this_host().spawn_procs(per_host={"gpus": 2})
mesh = procs.spawn("echo", Echo)
a, b = mesh.slice(gpus=0), mesh.slice(gpus=1)
native = native_path()
assert mesh.path.call().get(30).values() == [native, native]
futures = [a.echo.call_one(i) for i in range(500)]  # pipelined: batches
assert [f.get(30) for f in futures] == list(range(500))
assert [a.echo.call_one(i).get(30) for i in range(200)] == list(range(200))
assert a.relay.call_one(b, 50).get(30) == list(range(50)) + [0, 1, 2]
procs.stop().get(30)
print("PATH", "native" if native else "mpi4py")
"""


def _auto_binds() -> bool:
    # What MPIMESH_WIRE=auto does here: native on Open MPI with a matching build.
    try:
        from mpimesh import _native
    except ImportError:
        return False
    loaded = library()
    return loaded.startswith("Open MPI") and binding.same_mpi(_native.built_with(), loaded)


@pytest.mark.subprocess
@pytest.mark.parametrize("wire", ["auto", "mpi4py"])
def test_calls_travel_both_paths(tmp_path: Path, wire: str) -> None:
    path = tmp_path / "wire_job.py"
    path.write_text(SCRIPT)
    env = dict(os.environ, MPIMESH_WIRE=wire)
    result = run(mpiexec_cmd(3, *python_cmd("-m", "mpimesh", str(path))), timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    want = "native" if wire == "auto" and _auto_binds() else "mpi4py"
    assert f"PATH {want}" in result.stdout


# --- the receive path (native/pump.c) -------------------------------------------

BATCH, PING = 15, 11


def _pump(comm: MPI.Intracomm, handlers: dict, *, on_error: object = None, take_buffers: object = None,
          max_frames: int = 64) -> tuple[object, threading.Lock]:
    from mpimesh import _native

    def no_buffers(index: int, src: int, sizes: object) -> list[object]:
        raise AssertionError(f"no raw buffers expected, got sizes {sizes}")

    lock = threading.Lock()
    pump = _native.Pump(lock, handlers, take_buffers or no_buffers, on_error, [], TAG, BATCH, PING, max_frames)
    pump.set_links((comm.handle,), (7,))  # island 7: sources are (7, rank)
    return pump, lock


def _post(comm: MPI.Intracomm, *frames: object) -> None:
    assert binding.isend is not None
    for frame in frames:
        data = pickle.dumps(frame, protocol=5)
        _keep(binding.isend(comm.handle, data, 0, TAG), data)  # completes once received


def test_pump_dispatches_in_order_and_notes_who_was_heard(native: None, comm: MPI.Intracomm) -> None:
    """Frames reach their handlers in arrival order, BATCHes expanded; PINGs are not counted as traffic."""
    seen: list[tuple[object, ...]] = []
    record = lambda src, frame, buffers: seen.append((src, frame, buffers))  # noqa: E731
    pump, lock = _pump(comm, {4: record, PING: record})
    assert pump.poll(0.0) == 0 and pump.frames_in == 0
    inner = [pickle.dumps((4, None, i), protocol=5) for i in (2, 3)]
    _post(comm, (4, None, 1), (BATCH, None, inner), (PING, None), (4, None, 4))
    pump.heard = {(7, 0): 0.0, (7, 5): 0.0}
    assert pump.poll(0.0) == 4
    assert [f for _, f, _ in seen] == [(4, None, 1), (4, None, 2), (4, None, 3), (PING, None), (4, None, 4)]
    assert {src for src, _, _ in seen} == {(7, 0)} and all(b == [] for _, _, b in seen)
    assert pump.frames_in == 5
    assert pump.heard[(7, 0)] > 0 and pump.heard[(7, 5)] == 0.0  # only the sources it tracks
    assert not lock.locked()


def test_pump_notes_the_controller_when_it_tracks_nobody(native: None, comm: MPI.Intracomm) -> None:
    """Without a heard dict, a frame from (0, 0) (a link whose one peer is the controller) is noted."""
    pump, _ = _pump(comm, {4: lambda s, f, b: None})
    pump.set_links((comm.handle,), ((0, 0),))
    pump.heard_controller = 0.0
    _post(comm, (4, None))
    assert pump.poll(0.0) == 1 and pump.heard_controller > time.monotonic() - 5


def test_pump_takes_raw_buffers_after_their_frame(native: None, comm: MPI.Intracomm) -> None:
    """A frame with sizes gets its buffers from take_buffers(link index, source, sizes), under the lock."""
    asked: list[tuple[object, ...]] = []
    got: list[object] = []
    lock_held: list[bool] = []

    def take(index: int, src: int, sizes: object) -> list[object]:
        asked.append((index, src, sizes))
        lock_held.append(lock.locked())
        return [b"raw"]

    pump, lock = _pump(comm, {4: lambda s, f, b: got.append(b)}, take_buffers=take)
    _post(comm, (4, (3,)))
    assert pump.poll(0.0) == 1
    assert asked == [(0, 0, (3,))] and lock_held == [True] and got == [[b"raw"]]


def test_pump_stops_at_max_frames_and_after_one_when_spinning(native: None, comm: MPI.Intracomm) -> None:
    """max_frames bounds one poll; a spinning poll returns with the first frame."""
    seen: list[object] = []
    pump, _ = _pump(comm, {4: lambda s, f, b: seen.append(f[2])}, max_frames=2)
    _post(comm, *[(4, None, i) for i in range(5)])
    assert [pump.poll(0.0), pump.poll(1e-3), pump.poll(0.0), pump.poll(0.0)] == [2, 1, 2, 0]
    assert seen == list(range(5))
    start = time.monotonic()
    assert pump.poll(0.02) == 0  # nothing comes: it spun for the time asked
    assert 0.019 <= time.monotonic() - start < 1.0


def test_pump_reports_a_raising_handler_and_goes_on(native: None, comm: MPI.Intracomm) -> None:
    """on_error(kind, source, exception) hears of a handler's Exception, or of an unknown kind."""
    reports: list[tuple[object, ...]] = []
    seen: list[object] = []

    def bad(src: object, frame: tuple, buffers: list) -> None:
        raise KeyError("boom")

    pump, lock = _pump(comm, {4: bad, 5: lambda s, f, b: seen.append(f)},
                       on_error=lambda kind, src, exc: reports.append((kind, src, exc)))
    _post(comm, (4, None), (9, None), (5, None))
    assert pump.poll(0.0) == 3
    assert seen == [(5, None)]
    assert [(kind, src, type(exc)) for kind, src, exc in reports] == [(4, (7, 0), KeyError), (9, (7, 0), KeyError)]
    assert reports[0][2].__traceback__ is not None and str(reports[1][2]) == "'no handler for frame kind 9'"
    assert not lock.locked()


def test_pump_without_on_error_raises(native: None, comm: MPI.Intracomm) -> None:
    """With on_error None a handler's exception propagates, and so do frames that are not frames."""

    def bad(src: object, frame: tuple, buffers: list) -> None:
        raise KeyError("boom")

    pump, lock = _pump(comm, {4: bad})
    _post(comm, (4, None))
    with pytest.raises(KeyError, match="boom"):
        pump.poll(0.0)
    _post(comm, ["not", "a", "tuple"])
    with pytest.raises(TypeError, match=r"^Pump: a frame must be a \(kind, sizes, ...\) tuple$"):
        pump.poll(0.0)
    assert not lock.locked()  # released on the way out
    with pytest.raises(ValueError, match=r"^Pump.set_links: 1 handles but 2 sources$"):
        pump.set_links((comm.handle,), (1, 2))
    with pytest.raises(ValueError, match=r"^Pump: max_frames must be at least 1, got 0$"):
        _pump(comm, {}, max_frames=0)
    with pytest.raises(TypeError, match=r"^Pump.set_links: a source must be an \(island, rank\) tuple or an island$"):
        pump.set_links((comm.handle,), ((1, 2, 3),))


def test_native_objects_that_skipped_init_refuse_politely(native: None, comm: MPI.Intracomm) -> None:
    """Made with __new__ alone, the native objects raise instead of crashing."""
    from mpimesh import _native

    with pytest.raises(RuntimeError, match=r"^Pump.poll: the Pump was never initialised$"):
        _native.Pump.__new__(_native.Pump).poll(0.0)
    sender, _ = _sender()
    bare = _native.Out.__new__(_native.Out)
    with pytest.raises(AttributeError, match=r"^the Out was never initialised$"):
        _ = bare.frames
    with pytest.raises(TypeError, match=r"^Sender.post: the Out was never initialised$"):
        sender.post(bare, (4, None), 1)
    with pytest.raises(RuntimeError, match=r"^Sender.post: the Sender was never initialised$"):
        _native.Sender.__new__(_native.Sender).post(_native.Out(_Link(comm), 0), (4, None), 1)


# --- the send path (native/post.c) -------------------------------------------------


class _Link:
    def __init__(self, comm: MPI.Intracomm) -> None:
        self.handle = comm.handle


def _sender(*, batching: bool = True, ring_after: float = 3600.0) -> tuple[object, threading.Lock]:
    from mpimesh import _native

    lock = threading.Lock()
    return _native.Sender(lock, TAG, batching, 1e-3, ring_after, (MPI.ERR_PROC_FAILED,)), lock


def _frames(comm: MPI.Intracomm) -> list[object]:
    assert binding.probe is not None
    got = []
    while (hit := binding.probe((comm.handle,), TAG, 0)) is not None:
        got.append(pickle.loads(hit[2]))
    return got


def test_sender_sends_at_once_unless_in_a_burst(native: None, comm: MPI.Intracomm) -> None:
    """A frame leaves at once, unless it follows one to the same process with no poll in between."""
    from mpimesh import _native

    sender, lock = _sender()
    out = _native.Out(_Link(comm), 0)
    assert (out.rank, out.frames, out.polls) == (0, [], -1)
    assert sender.post(out, (4, None, "first"), 1) is None
    assert out.polls == 1 and out.last > 0 and sender.frames_out == 1 and sender.sent_at == out.last
    held = sender.post(out, (4, None, "burst"), 1)  # same poll count, within the burst
    assert pickle.loads(held) == (4, None, "burst")
    assert sender.post(out, (4, None, "polled"), 2) is None  # a poll in between: it leaves
    out.frames = [b"held"]
    assert sender.post(out, (4, None, "behind"), 3) is not None  # frames are held: it must wait behind them
    assert _frames(comm) == [(4, None, "first"), (4, None, "polled")]
    assert sender.frames_out == 2 and not lock.locked()
    unbatched, _ = _sender(batching=False)
    out = _native.Out(_Link(comm), 0)
    assert [unbatched.post(out, (4, None, i), 1) for i in range(3)] == [None] * 3
    assert _frames(comm) == [(4, None, 0), (4, None, 1), (4, None, 2)]


SCALARS = [None, True, False, 0, 255, 256, 65536, -1, 2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**63 - 1, -2**63,
           0.5, -0.0, float("inf"), "", "ascii", "é€😀", "x" * 300, (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4),
           (20, None, 3, 123456, (1, "a", 2.5, True)), ((((1,),),),)]


@pytest.mark.parametrize("frame", SCALARS, ids=lambda frame: repr(frame)[:20])
def test_frames_of_scalars_are_pickled_and_read_in_c(native: None, frame: object) -> None:
    """A frame of None/bool/int/float/str/tuple is written and read without the pickle module, as pickle would."""
    from mpimesh import _native

    data = _native.fast_dumps(frame)
    assert data is not None
    backs = [pickle.loads(data), _native.fast_loads(data)[0]]
    if frame is None or isinstance(frame, (int, float)):  # pickle's own (FRAME, BININT2, LONG1 of any length <= 8)
        backs.append(_native.fast_loads(pickle.dumps(frame, 5))[0])
    for back in backs:
        assert back == frame and repr(back) == repr(frame)  # repr: -0.0 and the types too


@pytest.mark.parametrize("frame", [2**63, -2**63 - 1, "\ud800", 1j, b"x", [1], {"a": 1}, (1, [2]), (((((1,),),),),),
                                   "x" * 600, tuple(range(1000, 1200)), 2**70, type("Int", (int,), {})(3)],
                         ids=lambda frame: repr(frame)[:20])
def test_other_frames_are_left_to_pickle(native: None, frame: object) -> None:
    """Big ints, lone surrogates, other types, subclasses, deep or long frames: pickle.dumps's and loads's."""
    from mpimesh import _native

    assert _native.fast_dumps(frame) is None
    if type(frame).__name__ != "Int":  # a class of this test's own: pickle cannot pickle it
        assert _native.fast_loads(pickle.dumps(frame, 5)) is None


@pytest.mark.parametrize("data", [b"", b"\x80\x05", b"\x80\x05N", b"\x80\x05NN.", b"\x80\x05(N.", b"\x80\x05t.",
                                  b"\x80\x05\x86.", b"\x80\x05\x8c\x05ab.", b"\x80\x05X\xff\xff\xff\x7fab.",
                                  b"\x80\x05\x8c\x01\xff.", b"\x80\x05N.junk", b"\x80\x09N.", b"N."],
                         ids=lambda data: repr(data)[:24])
def test_malformed_pickles_are_left_to_pickle(native: None, data: bytes) -> None:
    """Truncated, unbalanced or undecodable data is pickle.loads's to refuse, with its own error."""
    from mpimesh import _native

    assert _native.fast_loads(data) is None


def test_sender_sends_what_pickle_would_read(native: None, comm: MPI.Intracomm) -> None:
    """Frames of scalars and others, sent by post(), arrive as they left (the receiver's pickle.loads)."""
    from mpimesh import _native

    sender, _ = _sender(batching=False)
    out = _native.Out(_Link(comm), 0)
    frames = [(4, None, 7, 2**40, ("a", -1.5, None)), (4, None, [1, 2], {"k": b"v"}), (4, None, 2**80, "\ud800")]
    for frame in frames:
        assert sender.post(out, frame, 1) is None
    got = _frames(comm)
    assert got == frames and [repr(f) for f in got] == [repr(f) for f in frames]


def test_sender_rings_after_a_pause(native: None, comm: MPI.Intracomm) -> None:
    """ring(out) is called when a frame follows a pause of ring_after seconds."""
    from mpimesh import _native

    sender, _ = _sender(ring_after=0.05)
    rung: list[object] = []
    sender.ring = rung.append
    out = _native.Out(_Link(comm), 0)
    sender.post(out, (4, None, 1), 1)  # never sent to before: a pause
    sender.post(out, (4, None, 2), 2)
    assert rung == [out]
    out.last -= 1.0
    sender.post(out, (4, None, 3), 3)
    assert rung == [out, out]
    assert len(_frames(comm)) == 3
    with pytest.raises(TypeError, match=r"^Sender.ring must be a callable or None$"):
        sender.ring = 3


def test_sender_keeps_a_large_send_until_it_completes(native: None, comm: MPI.Intracomm) -> None:
    """A send that does not complete at once (rendezvous) is kept with its bytes until reaped."""
    from mpimesh import _native

    sender, _ = _sender()
    out = _native.Out(_Link(comm), 0)
    big = b"x" * (8 << 20)
    assert sender.post(out, (4, None, big), 1) is None
    assert sender.pending in (0, 1)  # 1 where the stack needs the receiver for a message this large
    assert _frames(comm) == [(4, None, big)]
    assert sender.reap() == 0 and sender.pending == 0


def test_sender_errors(native: None, comm: MPI.Intracomm) -> None:
    """An MPI error raises MPI.Exception with the lock released; misuse raises TypeError."""
    from mpimesh import _native

    sender, lock = _sender()
    out = _native.Out(_Link(comm), 5)  # COMM_SELF has one rank
    with pytest.raises(MPI.Exception) as info:
        sender.post(out, (4, None), 1)
    assert info.value.Get_error_class() == MPI.ERR_RANK and not lock.locked()
    with pytest.raises(TypeError, match=r"^Sender.post\(out, frame, polls\): out must be an Out$"):
        sender.post(object(), (4, None), 1)
    with pytest.raises(TypeError, match=r"^Out.frames must be a list$"):
        out.frames = ()
    with pytest.raises(TypeError, match=r"^cannot pickle '_thread.lock' object$"):
        sender.post(_native.Out(_Link(comm), 0), (4, None, lock), 1)
    assert not lock.locked()


RELAY = """
from mpimesh import Actor, endpoint, this_host

class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x

class Caller(Actor):
    def __init__(self, other):
        self.other = other

    @endpoint
    def relay(self, n):
        # call sites registered and used through the controller's relay
        return [self.other.echo.call_one(i).get(10) for i in range(n)]

first = this_host().spawn_procs(per_host={"gpus": 1})
second = this_host().spawn_procs(per_host={"gpus": 1})
echo = second.spawn("echo", Echo)
caller = first.spawn("caller", Caller, echo)
assert caller.relay.call_one(30).get(30) == list(range(30))
assert caller.relay.call_one(5).get(30) == list(range(5))
first.stop().get(30)
second.stop().get(30)
print("RELAYED")
"""


@pytest.mark.subprocess
def test_call_sites_across_islands(tmp_path: Path) -> None:
    """Two spawned islands: worker-to-worker calls go through the controller, call sites included."""
    path = tmp_path / "relay_job.py"
    path.write_text(RELAY)
    result = run(python_cmd(str(path)), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RELAYED" in result.stdout


def test_mpich_keeps_mpi4py_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built for MPICH the native path is used only when asked for (see binding._try_bind)."""
    native_part = pytest.importorskip("mpimesh._native")
    monkeypatch.setattr(binding, "probe", None)
    monkeypatch.setattr(binding, "isend", None)
    monkeypatch.setattr(binding, "settings", dataclasses.replace(settings, wire="auto"))
    monkeypatch.setattr(native_part, "built_with", lambda: "MPICH 5.0.2")
    monkeypatch.setattr(binding, "library", lambda: "MPICH Version:      5.0.2")
    assert not binding.bind()
    assert binding.why_not == (
        "the native frame path is used with Open MPI unless MPIMESH_WIRE=native ('MPICH Version:      5.0.2' is loaded)"
    )
    monkeypatch.setattr(binding, "settings", dataclasses.replace(settings, wire="native"))
    assert binding.bind() and binding.why_not == ""  # asked for: binds (to the library really loaded)
