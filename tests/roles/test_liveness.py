"""Liveness under load: busy is not dead; stopped, hung and gone still are (issue #14 item 11).

A job whose processes were all alive ended because a 2 GB result kept the
controller's poll in one receive past ``MPIMESH_HEARTBEAT_TIMEOUT``: its
idle bystanders looked silent and were declared dead.  The first half pins
:class:`~mpimesh._roles.liveness.Liveness`'s verdicts with a fake clock and
a fake ``/proc``; the second runs jobs that inject each load for several
heartbeat timeouts and checks that the call returns and nobody died, and
that a worker hung with the GIL held (no CPU used) is still declared dead.
The SIGSTOP case is ``test_faults.test_silent_worker_is_declared_dead``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import mpitest
import pytest
from mpitest import EXIT_BOUND, python_cmd
from test_faults import needs_ulfm

from mpimesh._core.protocol import Frame
from mpimesh._roles.liveness import HOST_ANSWER, Liveness, progress

Addr = tuple[int, int]

# ---------------------------------------------------------------------------
# fakes for the controller's runtime


class FakeRouter:
    """Records the heartbeats sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[Addr, Frame]] = []

    def send_quiet(self, dest: Addr, frame: Frame) -> None:
        self.sent.append((dest, frame))


class FakeFailures:
    """Records the deaths declared, with the clock's time."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.dead: dict[Addr, tuple[float, str]] = {}

    def declare_dead(self, addr: Addr, cause: str) -> None:
        self.dead[addr] = (self.clock(), cause)


class FakeRuntime:
    """What Liveness uses of the controller's runtime."""

    def __init__(self, clock: Clock) -> None:
        self.addr: Addr = (0, 0)
        self.host = "here"
        self.pid = os.getpid()
        self.router = FakeRouter()
        self.failures = FakeFailures(clock)


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeProc:
    """A ``/proc`` whose one process uses ``share`` of a core, in state ``state``."""

    def __init__(self, clock: Clock, state: str = "S", share: float = 0.0, running: bool = False) -> None:
        self.clock = clock
        self.state = state
        self.share = share
        self.running = running
        self.start = clock()

    def __call__(self, pid: int) -> tuple[str, float, bool] | None:
        return self.state, 2.0 + self.share * (self.clock() - self.start), self.running


TIMEOUT = 1.0
#: a step of a controller that listens (polls) steadily
STEP = 0.05
#: the cause of a death for silence, with TIMEOUT
SILENT = r"^stopped answering: silent for 1\.\d s \(MPIMESH_HEARTBEAT_TIMEOUT=1\)$"


def make(proc: FakeProc | None = None) -> tuple[Liveness, Clock, FakeRuntime]:
    clock = proc.clock if proc is not None else Clock()
    rt = FakeRuntime(clock)
    return Liveness(rt, timeout=TIMEOUT, clock=clock, proc=proc), clock, rt


def listen(lv: Liveness, clock: Clock, seconds: float) -> None:
    """A controller that polls every STEP and runs its heartbeat round, for ``seconds``."""
    end = clock.now + seconds
    while clock.now < end - 1e-9:
        clock.now += STEP
        lv.check()
        lv.heartbeat()


@pytest.fixture
def here() -> tuple[Addr, int]:
    """A same-host worker: this very process, so that its pidfd is real and never fires."""
    return (1, 0), os.getpid()


# ---------------------------------------------------------------------------
# verdicts


def test_the_controllers_deafness_is_no_ones_silence() -> None:
    """A gap in the controller's polls (a long receive, the GIL held) does not count as any worker's silence."""
    lv, clock, rt = make()
    workers = [(1, 0), (1, 1)]
    for addr in workers:
        lv.watch(addr, 0, "elsewhere")  # another host: heartbeats only
    listen(lv, clock, 0.5)
    clock.now += 30 * TIMEOUT  # deaf: nothing polled, no heartbeat round
    lv.check()
    lv.heartbeat()
    assert rt.failures.dead == {}
    assert lv.deaf_seconds == pytest.approx(30 * TIMEOUT - lv.deaf_after)
    assert {dest for dest, _ in rt.router.sent[-2:]} == set(workers)  # pinged again at once


def test_silence_while_listening_still_kills() -> None:
    """After a deaf spell, a worker that stays silent while the controller listens is dead after the timeout."""
    lv, clock, rt = make()
    lv.watch((1, 0), 0, "elsewhere")
    clock.now += 30 * TIMEOUT
    lv.check()
    deaf_end = clock.now
    listen(lv, clock, 2 * TIMEOUT)
    when, cause = rt.failures.dead[(1, 0)]
    assert re.match(SILENT, cause), cause
    assert deaf_end + TIMEOUT - lv.deaf_after <= when <= deaf_end + TIMEOUT + 2 * STEP


@pytest.mark.parametrize(("state", "share", "running"), [("S", 0.5, False), ("R", 0.0, True), ("D", 0.3, False)])
def test_busy_same_host_worker_is_not_dead(here: tuple[Addr, int], state: str, share: float, running: bool) -> None:
    """A silent same-host worker that uses CPU (an actor holding the GIL), or is running, lives."""
    proc = FakeProc(Clock(), state, share, running)
    lv, clock, rt = make(proc)
    addr, pid = here
    lv.watch(addr, pid, "here")
    try:
        listen(lv, clock, 20 * TIMEOUT)
        assert rt.failures.dead == {}
        assert lv.busy_verdicts >= 15
    finally:
        lv.forget(addr)


@pytest.mark.parametrize(("state", "share"), [("T", 0.0), ("t", 0.0), ("T", 1.0), ("S", 0.0), ("S", 0.05)])
def test_stopped_or_hung_same_host_worker_is_dead(here: tuple[Addr, int], state: str, share: float) -> None:
    """A silent same-host worker that is stopped (SIGSTOP, a debugger), or uses no CPU, dies after the timeout."""
    proc = FakeProc(Clock(), state, share)
    lv, clock, rt = make(proc)
    addr, pid = here
    lv.watch(addr, pid, "here")
    start = clock.now
    try:
        listen(lv, clock, 2 * TIMEOUT)
        when, cause = rt.failures.dead[addr]
        assert re.match(SILENT, cause), cause
        assert start + TIMEOUT <= when <= start + TIMEOUT + 2 * STEP
    finally:
        lv.forget(addr)


def test_worker_on_another_host_silent_is_dead() -> None:
    """A worker on another host has only its silence to go by: dead after the timeout, however busy."""
    lv, clock, rt = make()
    lv.watch((1, 0), 12345, "elsewhere")
    start = clock.now
    listen(lv, clock, 2 * TIMEOUT)
    when, cause = rt.failures.dead[(1, 0)]
    assert re.match(SILENT, cause), cause
    assert start + TIMEOUT <= when <= start + TIMEOUT + 2 * STEP


def test_a_frame_ends_the_silence(here: tuple[Addr, int]) -> None:
    """A worker heard again (any frame) starts a new silence: its CPU is measured from then."""
    proc = FakeProc(Clock(), "S", 0.0)
    lv, clock, rt = make(proc)
    addr, pid = here
    lv.watch(addr, pid, "here")
    try:
        for _ in range(5):
            listen(lv, clock, 0.8 * TIMEOUT)
            lv.last_heard[addr] = clock.now  # what the router does for every frame
        assert rt.failures.dead == {}
    finally:
        lv.forget(addr)


# ---------------------------------------------------------------------------
# /proc


def test_progress_of_a_running_process() -> None:
    """This process: running (the thread that reads), some CPU used."""
    seen = progress(os.getpid())
    assert seen is not None
    state, cpu, running = seen
    assert state == "R" and running and cpu > 0.0


def test_progress_of_a_stopped_process_and_of_none() -> None:
    """A stopped child is ``T`` and not running; a reaped one is no process at all."""
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as child:
        try:
            os.kill(child.pid, signal.SIGSTOP)
            os.waitpid(child.pid, os.WUNTRACED)  # returns once it is stopped
            seen = progress(child.pid)
            assert seen is not None and seen[0] == "T" and not seen[2], seen
        finally:
            child.kill()
            child.wait(10)
    assert progress(child.pid) is None


# ---------------------------------------------------------------------------
# a silent host: one death with no word from it, and its other workers are asked (issue #27 item 6)

#: a death ULFM reported with no word from the dead process's host
NO_WORD = "reported failed by MPI (MPI_ERR_PROC_FAILED)"


def _host(lv: Liveness, host: str, n: int) -> list[Addr]:
    addrs = [(1, i) for i in range(n)]
    for addr in addrs:
        lv.watch(addr, 0, host)
    return addrs


def test_the_silent_workers_of_a_host_go_with_its_dead_one() -> None:
    """A frozen host: one process reported failed, the host's others are PINGed and die HOST_ANSWER later."""
    lv, clock, rt = make()
    dead, *mates = _host(lv, "far", 3)
    lv.watch((2, 0), 0, "other")
    lv.lost(dead, NO_WORD)
    start = clock.now
    assert {dest for dest, _ in rt.router.sent} == set(mates)
    listen(lv, clock, HOST_ANSWER + 2 * STEP)  # less than TIMEOUT: not the heartbeats' verdict
    assert set(rt.failures.dead) == set(mates)  # not the worker of the other host
    for addr in mates:
        when, cause = rt.failures.dead[addr]
        assert start + HOST_ANSWER <= when <= start + HOST_ANSWER + 2 * STEP
        assert cause.startswith("stopped answering with its host far: ") and "process 1.0 of far" in cause, cause


def test_a_host_that_answers_loses_nobody_else() -> None:
    """A single death on a live host: its other workers answer the PING, and nobody else is declared dead."""
    lv, clock, rt = make()
    dead, *mates = _host(lv, "far", 3)
    lv.lost(dead, NO_WORD)
    clock.now += STEP
    for addr in mates:  # what the wire does with their echoes
        lv.last_heard[addr] = clock.now
    listen(lv, clock, HOST_ANSWER + 2 * STEP)
    assert rt.failures.dead == {}


@pytest.mark.parametrize(("host", "cause"), [
    ("far", "killed by signal 9 (SIGKILL)"),  # the host's watcher saw the exit: the host is alive
    ("here", NO_WORD),  # the controller's own host is not lost while the controller runs
])
def test_no_host_suspected(host: str, cause: str) -> None:
    """A death whose host spoke (an exit cause), or on the controller's host, makes no host suspect."""
    lv, clock, rt = make()
    dead, *_ = _host(lv, host, 3)
    lv.lost(dead, cause)
    assert rt.router.sent == []
    listen(lv, clock, HOST_ANSWER + 2 * STEP)
    assert rt.failures.dead == {}


def test_the_controllers_deafness_is_not_the_hosts_silence() -> None:
    """A deaf spell of the controller while it waits for the answers extends the wait."""
    lv, clock, rt = make()
    dead, mate = _host(lv, "far", 2)
    lv.lost(dead, NO_WORD)
    clock.now += 30 * HOST_ANSWER  # deaf: the echo may sit unread
    lv.check()
    assert rt.failures.dead == {}
    lv.last_heard[mate] = clock.now + STEP  # read at the next poll
    listen(lv, clock, HOST_ANSWER + 2 * STEP)
    assert rt.failures.dead == {}


# ---------------------------------------------------------------------------
# jobs: load for several heartbeat timeouts


def needs_native_beat() -> None:
    """Skip where a worker has no native heartbeat (the native part not built, or older)."""
    from mpimesh._transport import native

    if not native.bind():
        pytest.skip(f"no native heartbeat: {native.why_not}")
    from mpimesh import _native

    if not hasattr(_native, "beat_start"):
        pytest.skip("no native heartbeat: mpimesh._native is out of date; rebuild it")

#: MPIMESH_HEARTBEAT_TIMEOUT of the jobs; each load lasts several times this.
JOB_TIMEOUT = 0.3

LOADED = r'''
import ctypes, json, os, sys, time
import numpy as np
import mpimesh
from mpimesh import Actor, endpoint, this_host
from mpimesh._core import current

TIMEOUT = float(os.environ["MPIMESH_HEARTBEAT_TIMEOUT"])
BIG = 2_000_000_000  # 2 GB, as in issue #14 item 11 (2 GiB and more fail: MPI's int count)


class W(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def load(self, kind):
        start = time.monotonic()
        if kind == "big_result":
            return np.ones(BIG, dtype=np.uint8)
        if kind == "gil":
            3 ** 8_000_000  # one C call: the GIL held, the CPU busy
        elif kind == "mpi_lock":
            # an actor in a long MPI call holds the router's lock: the poll stalls
            with current.runtime.router.exclusive():
                time.sleep(8 * TIMEOUT)
        elif kind == "hung":
            ctypes.PyDLL(None).usleep(int(30e6))  # the GIL held, no CPU used: hung in C
        beat = current.runtime.role.heartbeat
        ulfm = 0  # ULFM's C beat threads (native/ulfm_beat.c), running where its detector is on
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as comm:
                ulfm += comm.read().strip() == "mpimesh-ulfm"
        return {"held": time.monotonic() - start, "heartbeats": beat.sent, "native": beat.native_sent, "ulfm": ulfm}


def emit(**row):
    print("ROW " + json.dumps(row), flush=True)


load = kind = sys.argv[1]
failures = []
mpimesh.unhandled_fault_hook = failures.append
mesh = this_host().spawn_procs(per_host={"gpus": 2}).spawn("w", W)
pids = sorted(mesh.pid.call().get(30).values())
one = mesh.slice(gpus=0)
loaded_pid = one.pid.call_one().get(30)
start = time.monotonic()
try:
    if load == "deaf_controller":
        ctypes.PyDLL(None).usleep(int(8 * TIMEOUT * 1e6))  # the controller holds the GIL: deaf
        value = {"held": time.monotonic() - start}
    else:
        if kind.endswith("_remote"):
            # as if the workers ran on another host: no /proc verdicts, only what they send
            current.runtime.role.liveness._pids.clear()
            kind = kind[:-len("_remote")]
        value = one.load.call_one(kind).get(60)
    if load == "big_result":
        value = {"nbytes": int(value.nbytes), "ones": bool(value[::1 << 20].all())}
    row = {"type": None, "value": value}
except Exception as exc:
    row = {"type": type(exc).__name__, "message": str(exc)}
row["seconds"] = time.monotonic() - start
liveness = current.runtime.role.liveness
row.update(deaf=liveness.deaf_seconds, busy=liveness.busy_verdicts, pid=loaded_pid)
emit(adverb="load", **row)
try:
    alive = sorted(mesh.pid.call().get(10).values())
    # read again once the controller has surely polled since the load (its poll thread may not have yet)
    emit(adverb="later", type=None, value=alive == pids, deaf=liveness.deaf_seconds)
except Exception as exc:
    emit(adverb="later", type=type(exc).__name__, message=str(exc))
emit(adverb="failures", value=[f.report() for f in failures])
print("END", flush=True)
'''

ENV = {"MPIMESH_HEARTBEAT_TIMEOUT": str(JOB_TIMEOUT), "MPIMESH_SHUTDOWN_TIMEOUT": "2",
       "MPIMESH_CLEANUP_TIMEOUT": "1", "MPIMESH_SPAWN_TIMEOUT": "30"}


def loaded_job(kind: str, tmp_path: Path) -> mpitest.Job:
    path = tmp_path / "job.py"
    path.write_text(LOADED)
    env: dict[str, str | None] = dict(ENV)
    if kind == "gil":
        env["MPIMESH_WIRE"] = "mpi4py"  # no native heartbeat: the controller's /proc verdict alone saves it
    if kind in ("gil", "gil_remote"):
        # ULFM's detector on, as under srun: the spawned worker holding the GIL runs ULFM's C beat too
        env.update(OMPI_MCA_mpi_ft_enable="true", OMPI_MCA_mpi_ft_detector="true")
    job = mpitest.run_job(python_cmd("-m", "mpimesh", str(path), kind), timeout=100, env=env)
    assert not job.hung and job.returncode == 0, job.describe()
    assert job.after_end is not None and job.after_end < EXIT_BOUND, job.describe()
    assert job.orphans == [], job.describe()
    return job


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["big_result", "gil", "gil_remote", "mpi_lock", "deaf_controller"])
def test_busy_worker_is_not_declared_dead(kind: str, tmp_path: Path) -> None:
    """A job loaded for several heartbeat timeouts (a 2 GB result, an actor holding the GIL or the router's
    lock, a controller holding the GIL) loses no process: the call returns, later calls reach every actor.

    ``gil``: without the native part (``MPIMESH_WIRE=mpi4py``), the
    controller's ``/proc`` verdict keeps it alive; ``gil_remote``: the
    controller judges the worker as one on another host (no ``/proc``), and
    the worker's native heartbeat keeps it alive.  Both with ULFM's
    detector on: the spawned worker runs ULFM's C beat thread as a pool
    worker does, under ``MPIMESH_WIRE=mpi4py`` too."""
    if kind == "gil_remote":
        needs_native_beat()
    job = loaded_job(kind, tmp_path)
    rows = job.rows
    load: dict[str, Any] = rows["load"]
    assert load["type"] is None, job.describe()
    assert (rows["later"]["type"], rows["later"]["value"]) == (None, True), job.describe()
    assert rows["failures"]["value"] == [], job.describe()
    value = load["value"]
    # The load lasted past the timeout, and the part of liveness that saves it was at work.
    if kind == "big_result":
        assert value == {"nbytes": 2_000_000_000, "ones": True}, job.describe()
        assert rows["later"]["deaf"] > JOB_TIMEOUT, job.describe()  # the controller's poll sat in the receive
    elif kind == "gil":
        assert value["held"] > 2 * JOB_TIMEOUT and load["busy"] >= 1 and value["native"] == 0, job.describe()
        assert value["ulfm"] == 1, job.describe()  # the native part, not its wire
    elif kind == "gil_remote":
        assert value["held"] > 2 * JOB_TIMEOUT and value["native"] >= 2 and load["busy"] == 0, job.describe()
        assert value["ulfm"] == 1, job.describe()
    elif kind == "mpi_lock":
        assert value["held"] > 2 * JOB_TIMEOUT and value["heartbeats"] >= 2, job.describe()
    else:
        assert value["held"] > 2 * JOB_TIMEOUT and rows["later"]["deaf"] > 2 * JOB_TIMEOUT, job.describe()


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["hung", "hung_remote"])
def test_worker_hung_in_c_is_declared_dead(kind: str, tmp_path: Path) -> None:
    """A worker hung in C with the GIL held and no CPU used is dead after the timeout, and ended at exit.

    ``hung_remote``: judged as a worker on another host, whose native
    heartbeat sends nothing while the process uses no CPU."""
    job = loaded_job(kind, tmp_path)
    rows = job.rows
    load = rows["load"]
    silent = rf"stopped answering: silent for \d+\.\d s \(MPIMESH_HEARTBEAT_TIMEOUT={JOB_TIMEOUT:g}\)"
    died = rf"process [1-9]\d*\.\d+ \(pid {load['pid']}\) on \S+ died: {silent}"
    assert load["type"] == "SupervisionError", job.describe()
    gone = r"Endpoint call w\.load\(\) failed, The actor __main__\.W w and all its descendants have failed: "
    assert re.fullmatch(gone + died, load["message"]), job.describe()
    assert load["seconds"] < JOB_TIMEOUT + 4.0, job.describe()  # silence counts from the last frame, before the call
    assert rows["later"]["type"] == "SupervisionError", job.describe()
    assert len(rows["failures"]["value"]) == 1, job.describe()


# ---------------------------------------------------------------------------
# the native heartbeat thread, on this process alone

BEAT_TAG = 4242


def test_native_heartbeat_sends_while_busy() -> None:
    """With no CPU share asked, the thread sends its frame every period, to the rank and tag given."""
    needs_native_beat()
    from mpi4py import MPI

    from mpimesh import _native

    comm = MPI.COMM_SELF
    _native.beat_start(comm.handle, 0, BEAT_TAG, b"alive", 0.001, 0.0)
    try:
        got = bytearray(16)
        status = MPI.Status()
        comm.Recv(got, 0, BEAT_TAG, status)  # the first heartbeat, within a period
        assert bytes(got[:status.Get_count(MPI.BYTE)]) == b"alive"
    finally:
        sent = _native.beat_stop()
    assert sent >= 1
    while comm.iprobe(0, BEAT_TAG):  # leave nothing behind
        comm.Recv(got, 0, BEAT_TAG)


def test_native_heartbeat_is_silent_while_idle() -> None:
    """A process that does not use the share of a core asked sends nothing: a hung process stays silent."""
    needs_native_beat()
    from mpi4py import MPI

    from mpimesh import _native

    _native.beat_start(MPI.COMM_SELF.handle, 0, BEAT_TAG, b"alive", 0.001, 1e9)
    assert _native.beat_stop() == 0
    assert not MPI.COMM_SELF.iprobe(0, BEAT_TAG)


def test_native_heartbeat_misuse() -> None:
    """A period that is not positive, or a second start, is refused with the fix."""
    needs_native_beat()
    from mpi4py import MPI

    from mpimesh import _native

    with pytest.raises(ValueError, match=r"^beat_start: expecting a period > 0, got 0$"):
        _native.beat_start(MPI.COMM_SELF.handle, 0, BEAT_TAG, b"alive", 0.0, 0.1)
    _native.beat_start(MPI.COMM_SELF.handle, 0, BEAT_TAG, b"alive", 10.0, 1e9)
    try:
        with pytest.raises(RuntimeError, match=r"^beat_start: the heartbeat runs already; call beat_stop\(\) first$"):
            _native.beat_start(MPI.COMM_SELF.handle, 0, BEAT_TAG, b"alive", 10.0, 1e9)
    finally:
        assert _native.beat_stop() == 0



# ---------------------------------------------------------------------------
# the controller's exit, bounded as the workers' MPI_Finalize is

SLOW_EXIT = r"""
import atexit, time
from mpimesh import Actor, endpoint, this_host

class A(Actor):
    @endpoint
    def hi(self) -> int:
        return 1

mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn("a", A)
print("calls:", mesh.hi.call().get(30).values(), flush=True)
atexit.register(time.sleep, 30)  # the controller's exit outlasts the workers' wait in MPI_Finalize
"""


@pytest.mark.subprocess
def test_a_controller_exit_that_outlasts_the_workers_finalize_ends(tmp_path: Path) -> None:
    """The workers give up MPI_Finalize at their bound; the controller, whose Finalize would then spin for ever
    (the job hung until killed), says so at the same bound and ends at 1.5 times it (about 5 s)."""
    needs_ulfm()
    script = tmp_path / "slow_exit.py"
    script.write_text(SLOW_EXIT)
    mpimesh_run = str(Path(sys.executable).parent / "mpimesh")
    done = mpitest.run([mpimesh_run, "run", "-n", "2", str(script)], timeout=60, env={"MPIMESH_FINALIZE_BOUND": "2"})
    assert "calls: [1]" in done.stdout, (done.stdout, done.stderr)
    assert ("mpimesh: the controller's exit (the script's atexit handlers, the interpreter's teardown) has taken "
            "2 s: the workers stop waiting for it in MPI_Finalize now, and MPI_Finalize here would not return; "
            "this process ends 1 s from now with status 1") in done.stderr, (done.stdout, done.stderr)
    # the launcher's status stays the script's (handed over at the end of the job, _roles/job_status.py)
    assert done.returncode == 0 and done.seconds < 30 and not done.orphans, (done.returncode, done.seconds,
                                                                             done.stdout, done.stderr)
