"""Direct links between islands under faults: a peer that dies after the switch fails only itself.

Each test runs a singleton job (``python -m mpimesh``, every mesh an island
of its own) in a subprocess, bounded, over both wires (``MPIMESH_WIRE``).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from functools import cache
from pathlib import Path

import mpitest
import pytest
from mpitest import EXIT_BOUND, python_cmd

pytestmark = pytest.mark.subprocess

JOB = r'''
import json, os, signal, sys, threading, time
import mpimesh
from mpi4py import MPI
from mpimesh import Actor, SupervisionError, endpoint, this_host
from mpimesh._core.current import current


class T(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def addr(self):
        return current().addr

    @endpoint
    def direct(self):
        return current().router.peers()

    @endpoint
    def echo(self, i):
        return i

    @endpoint
    def links(self):
        return current().peers.statistics().__dict__

    @endpoint
    def ask(self, peer, n):
        """n round trips to ``peer`` from this actor; the outcome as a row."""
        start = time.monotonic()
        try:
            return {"type": None, "value": [peer.echo.call_one(i).get(20) for i in range(n)]}
        except Exception as exc:
            return {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


class Hook:
    def __init__(self):
        self.cond = threading.Condition()
        self.failures = []

    def __call__(self, failure):
        with self.cond:
            self.failures.append(failure)
            self.cond.notify_all()

    def of(self, name, timeout):
        with self.cond:
            self.cond.wait_for(lambda: any(f.mesh_name == name for f in self.failures), timeout)
            return [{"mesh": f.mesh_name, "ranks": f.crashed_ranks} for f in self.failures if f.mesh_name == name]


def emit(**row):
    sys.stdout.write("ROW " + json.dumps(row) + "\n")
    sys.stdout.flush()


def linked(x, y, timeout=30):
    ax, ay = x.addr.call_one().get(30), y.addr.call_one().get(30)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ay in x.direct.call_one().get(30) and ax in y.direct.call_one().get(30):
            return True
    return False


mpimesh.unhandled_fault_hook = hook = Hook()
a, b, c = (this_host().spawn_procs(per_host={"gpus": 1}).spawn(name, T) for name in "abc")
emit(adverb="pids", value=[m.pid.call_one().get(30) for m in (a, b, c)], host=MPI.Get_processor_name())
emit(adverb="switch", a_b=a.ask.call_one(b, 20).get(60), b_a=b.ask.call_one(a, 20).get(60), linked=linked(a, b))
os.kill(b.pid.call_one().get(30), signal.SIGKILL)
emit(adverb="after_kill", **a.ask.call_one(b, 1).get(60))
emit(adverb="a_c", **a.ask.call_one(c, 20).get(60), linked=linked(a, c))
emit(adverb="c_a", **c.ask.call_one(a, 20).get(60))
emit(adverb="hook", failures=hook.of("b", 10.0))
print("END", flush=True)
'''

@cache
def ulfm() -> bool:
    """Whether a worker's death is survivable here (Open MPI 5 with ULFM): ``mpimesh info --get ulfm``."""
    mpimesh = Path(sys.executable).parent / "mpimesh"
    result = subprocess.run([str(mpimesh), "info", "--get", "ulfm"], capture_output=True, text=True, timeout=60)
    return result.stdout.strip() == "true"


def needs_ulfm() -> None:
    if not ulfm():
        pytest.skip("a worker's death is survivable only on Open MPI 5 with ULFM (README, 'Which MPI stacks')")


ENV = {"MPIMESH_SHUTDOWN_TIMEOUT": "2", "MPIMESH_CLEANUP_TIMEOUT": "1", "MPIMESH_SPAWN_TIMEOUT": "30"}


@pytest.mark.parametrize("wire", ["native", "mpi4py"])
def test_a_peer_killed_after_the_switch_fails_only_itself(wire: str, tmp_path: Path) -> None:
    """A process killed after its island switched to a direct link fails its callers' calls, naming it.

    The caller on the other island gets a ``SupervisionError`` with the
    controller's report of the death (pid, host, cause), not ULFM's; it goes
    on talking to a third island, over a new direct link; the job ends
    cleanly.
    """
    needs_ulfm()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = mpitest.run_job(python_cmd("-m", "mpimesh", str(script)), timeout=120,
                          env={**ENV, "MPIMESH_WIRE": wire, "MPIMESH_ISLAND_LINKS": "always"}, exit_bound=EXIT_BOUND)
    rows = job.rows
    assert "hook" in rows, job.describe()
    pids, host = rows["pids"]["value"], rows["pids"]["host"]
    switch = rows["switch"]
    assert switch["a_b"]["value"] == list(range(20)) and switch["b_a"]["value"] == list(range(20)), job.describe()
    assert switch["linked"], job.describe()
    killed = rows["after_kill"]
    died = rf"process 2\.0 \(pid {pids[1]}\) on {re.escape(host)} died: {mpitest.death_cause_re(None, signal.SIGKILL)}"
    assert killed["type"] == "SupervisionError", job.describe()
    failed = (r"Endpoint call b\.echo\(\) failed, The actor __main__\.T b\{'gpus': 0/1\} and all its descendants have "
              r"failed: ")
    assert re.fullmatch(failed + died, killed["message"]), job.describe()
    assert rows["a_c"]["value"] == list(range(20)) and rows["a_c"]["linked"], job.describe()
    assert rows["c_a"]["value"] == list(range(20)), job.describe()
    assert rows["hook"]["failures"] == [{"mesh": "b", "ranks": [0]}], job.describe()
    assert "reported failed by MPI" not in job.stdout + job.stderr, job.describe()
    assert not job.hung and job.returncode == 0, job.describe()
    assert job.after_end is not None and job.after_end < EXIT_BOUND, job.describe()
    assert job.orphans == [], job.describe()


BROKEN = JOB.split("mpimesh.unhandled_fault_hook = hook")[0] + r"""
from mpimesh._transport.frames import LINK

# The fault: the controller passes the connector a port that cannot work.
peers = current().peers
send = peers._send
PORT = {"malformed": "no port", "unanswered": "0.0:9999"}[sys.argv[1]]


def broken(dest, frame):
    if frame[0] == LINK and frame[2] == "connect":
        frame = (*frame[:4], PORT)
    return send(dest, frame)


peers._send = broken
mpimesh.unhandled_fault_hook = hook = Hook()
a, b = (this_host().spawn_procs(per_host={"gpus": 1}).spawn(name, T) for name in "ab")
emit(adverb="pids", value=[m.pid.call_one().get(30) for m in (a, b)], host=MPI.Get_processor_name())
rounds = []
for _ in range(20):
    rounds.append(a.ask.call_one(b, 10).get(60))
    rounds.append(b.ask.call_one(a, 10).get(60))
end = time.monotonic() + (10 if sys.argv[2] == "fails" else 0)
while time.monotonic() < end and a.links.call_one().get(30)["pending"] + b.links.call_one().get(30)["pending"]:
    pass  # the connect failed: the controller ends the acceptor's wait
emit(adverb="relayed", rounds=rounds, direct=[a.direct.call_one().get(30), b.direct.call_one().get(30)],
     controller=peers.statistics().__dict__, a=a.links.call_one().get(30), b=b.links.call_one().get(30))
if sys.argv[2] == "waits":
    # The connector dies while the acceptor waits: the controller ends the wait.
    os.kill(b.pid.call_one().get(30), signal.SIGKILL)
    hook.of("b", 10.0)
    end = time.monotonic() + 10
    while time.monotonic() < end and a.links.call_one().get(30)["pending"]:
        pass
    emit(adverb="connector_killed", a=a.links.call_one().get(30))
print("END", flush=True)
"""


@pytest.mark.parametrize("fault", ["malformed", "unanswered"])
def test_a_link_that_cannot_be_made_leaves_the_pair_on_the_relay(fault: str, tmp_path: Path) -> None:
    """A connect that fails, or never returns, delays no frame: the pair stays on the relay, in order.

    The controller passes the connector a port that was never opened:
    ``malformed`` (not a port name) or ``unanswered`` (a port name nobody
    opened).  MPICH's ``MPI_Comm_connect`` fails at once on either, and the
    controller ends the acceptor's ``MPI_Comm_accept`` by connecting itself
    (the acceptor sees the controller and disconnects).  Open MPI's waits
    on either, so both calls wait; when the connector dies (ULFM), the
    controller ends the acceptor's wait the same way.  The job ends cleanly.
    """
    fails = not ulfm()  # MPICH
    script = tmp_path / "job.py"
    script.write_text(BROKEN)
    job = mpitest.run_job(python_cmd("-m", "mpimesh", str(script), fault, "fails" if fails else "waits"), timeout=120,
                          env={**ENV, "MPIMESH_ISLAND_LINKS": "always"}, exit_bound=EXIT_BOUND)
    rows = job.rows
    assert "relayed" in rows, job.describe()
    row = rows["relayed"]
    assert row["rounds"] == [{"type": None, "value": list(range(10))}] * 40, job.describe()
    assert row["direct"] == [[], []], job.describe()
    assert row["controller"]["relayed"] >= 400 and row["controller"]["links"] == 0, job.describe()
    if fails:
        assert row["controller"]["failed"] == 1, job.describe()
        assert (row["a"]["pending"], row["b"]["pending"], row["b"]["failed"]) == (0, 0, 1), job.describe()
    else:
        assert row["controller"]["failed"] == 0, job.describe()
        assert (row["a"]["pending"], row["b"]["pending"]) == (1, 1), job.describe()
        assert rows["connector_killed"]["a"]["pending"] == 0, job.describe()
    assert not job.hung and job.returncode == 0, job.describe()
    assert job.after_end is not None and job.after_end < EXIT_BOUND, job.describe()
    assert job.orphans == [], job.describe()


STOPPING = r'''
import json, sys, time
from mpimesh import Actor, endpoint, this_host
from mpimesh._core.current import current


class T(Actor):
    @endpoint
    def echo(self, i):
        return i

    @endpoint
    def tell(self, peer):
        peer.echo.broadcast(0)  # relayed: the controller starts brokering a link, and nobody waits


stops = []
for delay in [0, 0, 0.001, 0.002, 0.003, 0.005] * 3:
    meshes = [this_host().spawn_procs(per_host={"gpus": 1}) for _ in range(2)]
    a, b = (m.spawn(name, T) for m, name in zip(meshes, "ab"))
    a.echo.call_one(1).get(30)
    b.echo.call_one(1).get(30)
    a.tell.call_one(b).get(30)
    time.sleep(delay)
    start = time.monotonic()
    for m in meshes:
        m.stop().get(30)
    stops.append(time.monotonic() - start)
print("ROW " + json.dumps({"adverb": "stopped", "stops": stops, "links": current().peers.statistics().__dict__}),
      flush=True)
print("END", flush=True)
'''


@pytest.mark.parametrize("ranks", [1, 2])
def test_processes_stop_while_their_link_is_being_made(ranks: int, tmp_path: Path) -> None:
    """Two islands that stop while the controller brokers their link stop cleanly, 18 times over.

    One actor's one-way message to another island starts a link; both meshes
    stop 0-5 ms later, while the accept and the connect are under way.  At
    ``-n 2`` the first mesh is the launch pool's rank (it stays, to the job's
    end), the second a spawned island.  Before: the controller's connect that
    ends a stranded accept ran beside the next ``MPI_Comm_spawn`` and crashed
    it (SIGSEGV in Open MPI's ``ompi_group_allocate``), or a pool rank held a
    link whose other end had left and never stopped ("ranks [1] did not stop
    within 10 s"); 7 runs of 7 failed one way or the other.
    """
    script = tmp_path / "job.py"
    script.write_text(STOPPING)
    cmd = python_cmd("-m", "mpimesh", str(script))
    if ranks > 1:
        cmd = mpitest.mpiexec_cmd(ranks, *cmd)
    job = mpitest.run_job(cmd, timeout=120, env={**ENV, "MPIMESH_ISLAND_LINKS": "always"}, exit_bound=EXIT_BOUND)
    rows = job.rows
    assert "stopped" in rows, job.describe()
    row = rows["stopped"]
    assert len(row["stops"]) == 18 and max(row["stops"]) < 5.0, job.describe()
    # every link was made, or given up (the pair stayed on the relay): none is left waiting
    assert row["links"]["links"] + row["links"]["failed"] == 18 and row["links"]["pending"] == 0, job.describe()
    assert "did not stop" not in job.stdout + job.stderr, job.describe()
    assert not job.hung and job.returncode == 0, job.describe()
    assert job.after_end is not None and job.after_end < EXIT_BOUND, job.describe()
    assert job.orphans == [], job.describe()
