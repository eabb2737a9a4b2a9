"""Fault injection: every fault, through every adverb, under both launches, ends as documented.

The matrix is {endpoint exception, ``os._exit(0)``, ``os._exit(1)``, SIGKILL,
SIGSEGV, hang, unpicklable result, unpicklable exception, exception in the
controller script, Ctrl-C at the controller} x {``call``, ``call_one``,
``choose``, ``stream``, ``broadcast``} x {launch-pool workers
(``mpimesh run -n 7``: ``mpiexec --with-ft ulfm``), spawned workers (``python
-m mpimesh``: ``MPI_Comm_spawn``)}.

One job per (fault, launch) runs the five adverbs, each against a fresh
one-process mesh, and prints one ``ROW`` line (JSON) per cell, then a
``recover`` row (fresh processes spawned after the faults answer).
:func:`test_cell` pins each cell: exception type and message, the time it
took, what a later call to the same actor gets, what reached the fault hook.
:func:`test_job` pins the job: exit status, a bound on its duration after the
script's end, and no process left behind.  Every job runs in its own session
with a time bound, and is killed with all its processes if it overruns.

Known runtime bugs show up as xfails with the precise signature they have
(see the ``BUG_*`` reasons): a job that overruns for another reason fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import mpitest
import pytest
from mpitest import EXIT_BOUND, Job, death_cause_re, mpiexec_cmd, python_cmd

pytestmark = pytest.mark.subprocess

ADVERBS = ("call", "call_one", "choose", "stream", "broadcast")
LAUNCHES = ("pool", "spawned")
CRASHES = ("exit0", "exit1", "sigkill", "sigsegv")
FAULTS = ("exception", *CRASHES, "hang", "unpicklable_result", "unpicklable_exception",
          "controller_exception", "ctrl_c")

#: Seconds from sending a fatal call to the SupervisionError at the caller.
DETECT_BOUND = 2.0
#: The same for SIGKILL of a launch-pool worker (B7 asks 0.1 s; this leaves room for a loaded box).
POOL_SIGKILL_BOUND = 1.0
#: A later call to a known-dead process fails before anything is sent.
AT_ONCE = 0.5
#: How long a hang cell waits for its stuck call, and for the call queued behind it: 10 such waits per
#: hang job, so short (the wait ends in a TimeoutError whatever its length).
HANG_WAIT = 0.2
#: Rank 0 of a mesh ``gpus=1``, as Monarch prints a point
ONE = r"\{'gpus': 0/1\}"


def gone(what: str, who: str, cls: str = "W") -> str:
    """The start of a failed call's SupervisionError, in Monarch's words (regexes: ``mesh\\.method``, the actor).

    The actor is named with its class, ``__main__.cls``, as Monarch's display name has it.
    """
    return rf"Endpoint call {what}\(\) failed, The actor __main__\.{cls} {who} and all its descendants have failed: "


def mesh_failed(name: str, cls: str = "W") -> str:
    """The first line of the MeshFailure of rank 0 of mesh ``name`` (``gpus=1``) of class ``__main__.cls``."""
    return (rf"MeshFailure of actor mesh '{name}' \(__main__\.{cls}\): rank=0 \(gpus=0\) failed, crashed_ranks=\[0\]: "
            rf"The actor __main__\.{cls} {name}{ONE} and all its descendants have failed:")

ENV = {
    "MPIMESH_SHUTDOWN_TIMEOUT": "2",
    "MPIMESH_CLEANUP_TIMEOUT": "1",
    "MPIMESH_SPAWN_TIMEOUT": "30",
}

BUG_FINALIZE_HANG = (
    "runtime bug: under `mpiexec --with-ft ulfm` (Open MPI 5.0.11) MPI_Finalize can spin forever once a "
    "rank of the world has died (survivors loop in ompi_mpi_finalize / ompi_comm_shrink_internal ERA "
    "agreement; a raw mpi4py program shows the same, cf. open-mpi/ompi#11404); mpimesh calls it "
    "unbounded (its exit watchdog starts only after MPI_Finalize returns), so the job never ends"
)
BUG_STOPPED_NOT_KILLED = (
    "runtime bug: a launch-pool worker declared dead for silence (SIGSTOP, hung in C) is never killed, "
    "so at exit the survivors wait for it in MPI_Finalize and mpiexec never returns"
)


# ---------------------------------------------------------------------------
# running one job


def run_job(cmd: list[str], *, timeout: float = 90.0, env: dict[str, str] | None = None,
            on_line: Callable[[str, Job], None] | None = None, end: str = "END") -> Job:
    """:func:`mpitest.run_job` with the fault tests' bounds (:data:`ENV`) in the job's environment."""
    return mpitest.run_job(cmd, timeout=timeout, env={**ENV, **(env or {})}, on_line=on_line, end=end,
                           exit_bound=EXIT_BOUND)


@cache
def info(key: str) -> str:
    """``mpimesh info --get KEY`` of the MPI that the venv's mpi4py loads."""
    mpimesh = Path(sys.executable).parent / "mpimesh"
    result = subprocess.run([str(mpimesh), "info", "--get", key], capture_output=True, text=True, timeout=60)
    return result.stdout.strip()


def ulfm() -> bool:
    return info("ulfm") == "true"


def needs_ulfm(fault: str = "sigkill") -> None:
    if fault in CRASHES and not ulfm():
        pytest.skip("a worker's death is survivable only on Open MPI 5 with ULFM (README, 'Which MPI stacks')")


@cache
def records_job_status() -> bool:
    """``mpimesh run`` makes a worker's non-zero exit survivable here (Open MPI 5.0.9 and later)."""
    mpimesh = Path(sys.executable).parent / "mpimesh"
    result = subprocess.run([str(mpimesh), "run", "-n", "2", "--dry-run", __file__], capture_output=True, text=True,
                            timeout=60)
    return "MPIMESH_PMIX_EXIT_STATUS=1" in result.stdout


def needs_job_status(fault: str, launch: str) -> None:
    """Skip where ``mpimesh run`` cannot make this death survivable (Open MPI before 5.0.9)."""
    if (launch == "pool_no_room" or (launch, fault) == ("pool", "exit1")) and not records_job_status():
        pytest.skip("under `mpimesh run` a worker's non-zero exit, and a spawned worker's death, are survivable "
                    "from Open MPI 5.0.9 on (README, 'Which MPI stacks keep the survivors')")


def job_cmd(launch: str, path: Path, *args: str, n: int = 7) -> list[str]:
    """The command that runs ``path`` as the controller script.

    ``pool``: ``mpimesh run -n N``; ``spawned``: ``python -m mpimesh``, a
    singleton; ``pool_no_room``: ``mpimesh run -n 1``, whose controller
    spawns every process through ``mpiexec``'s runtime.
    """
    mpimesh = str(Path(sys.executable).parent / "mpimesh")
    if launch == "pool":
        # What users type: adds --with-ft ulfm (Open MPI 5), --oversubscribe when n > cores, root flags.
        return [mpimesh, "run", "-n", str(n), str(path), *args]
    if launch == "pool_no_room":
        return [mpimesh, "run", "-n", "1", "--oversubscribe", str(path), *args]
    return python_cmd("-m", "mpimesh", str(path), *args)


def assert_ended(job: Job, code: int, *, pool_deaths: bool, stopped: bool = False) -> None:
    """The job ended by itself with ``code``, within EXIT_BOUND of its END line, leaving no process.

    A pool job that reached END after a death and then never ended is the
    known MPI_Finalize hang: xfail with its reason.
    """
    if job.hung and job.ended and pool_deaths:
        pytest.xfail(BUG_STOPPED_NOT_KILLED if stopped else BUG_FINALIZE_HANG)
    assert not job.hung, job.describe()
    assert job.returncode == code, job.describe()
    assert job.after_end is not None and job.after_end < EXIT_BOUND, job.describe()
    assert job.orphans == [], job.describe()


# ---------------------------------------------------------------------------
# the matrix job

PREAMBLE = r'''
import ctypes, json, os, signal, sys, threading, time
import mpimesh
from mpi4py import MPI
from mpimesh import Actor, ActorError, SupervisionError, endpoint, this_host

HOST = MPI.Get_processor_name()
ADVERBS = ("call", "call_one", "choose", "stream", "broadcast")


class Unpicklable(Exception):
    """Carries a lock: it cannot be pickled."""

    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


class W(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def fault(self, kind):
        if kind == "none":
            return None
        if kind == "exception":
            raise ValueError("boom 42")
        if kind == "exit0":
            os._exit(0)
        if kind == "exit1":
            os._exit(1)
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "sigsegv":
            ctypes.string_at(0)  # a real segmentation fault
        if kind == "hang":
            time.sleep(3600)
        if kind == "unpicklable_result":
            return threading.Lock()
        if kind == "unpicklable_exception":
            raise Unpicklable("cannot travel 7")
        raise AssertionError(kind)


class Hook:
    """mpimesh.unhandled_fault_hook that records failures (so the script keeps running)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.failures = []

    def __call__(self, failure):
        with self.cond:
            self.failures.append((time.monotonic(), failure))
            self.cond.notify_all()

    def of(self, name, timeout=0.0):
        with self.cond:
            self.cond.wait_for(lambda: any(f.mesh_name == name for _, f in self.failures), timeout)
            return [(t, f) for t, f in self.failures if f.mesh_name == name]


def emit(**row):
    # one write with its newline: a KeyboardInterrupt (the default hook) cannot split the line
    sys.stdout.write("ROW " + json.dumps(row) + "\n")
    sys.stdout.flush()


def outcome(fn):
    start = time.monotonic()
    try:
        value = fn()
    except KeyboardInterrupt:
        raise  # the default hook ending the job: the script must see it
    except BaseException as exc:
        row = {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
        if isinstance(exc, ActorError):
            inner = exc.exception
            row.update(inner=type(inner).__name__, inner_message=str(inner), inner_args=[str(a) for a in inner.args],
                       type_name=getattr(inner, "type_name", None), rank=exc.rank, coords=exc.coords,
                       host=exc.host, cause_is_original=exc.__cause__ is inner)
        if isinstance(exc, SupervisionError):
            row.update(endpoint=exc.endpoint)
        return row
    if not isinstance(value, (int, str, list, type(None))):
        value = repr(value)
    return {"type": None, "value": value, "seconds": time.monotonic() - start}


def failures_row(hook, name, since, timeout):
    found = hook.of(name, timeout)
    return {"failures": [{"mesh": f.mesh_name, "ranks": f.crashed_ranks, "cause": f.cause, "report": f.report(),
                          "seconds": t - since} for t, f in found]}
'''

MATRIX = PREAMBLE + r'''
CRASHES = ("exit0", "exit1", "sigkill", "sigsegv")
fault = sys.argv[1]
hang_wait = float(sys.argv[2])
hook = mpimesh.unhandled_fault_hook = Hook()


def cell(adverb):
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn(adverb, W)
    pid = mesh.pid.call_one().get(30)
    row = {"adverb": adverb, "pid": pid, "host": HOST}
    ep = mesh.fault
    wait = hang_wait if fault == "hang" else 10.0
    futures = []

    if adverb == "call_one":
        # the fault's call then goes through a registered site (in C with the native wire), and a
        # crash's wait, without a timeout, spins in C too: it must end in SupervisionError all the same
        ep.call_one("none").get(30)

    def send_and_wait():
        if adverb == "broadcast":
            return ep.broadcast(fault)
        fut = next(iter(ep.stream(fault))) if adverb == "stream" else getattr(ep, adverb)(fault)
        futures.append(fut)
        return fut.get() if adverb == "call_one" and fault in CRASHES else fut.get(wait)

    since = time.monotonic()
    row.update(outcome(send_and_wait))
    if fault == "hang" and futures:
        # A timeout does not consume the future: it is still pending and times out again.
        again = outcome(lambda: futures[0].get(0.1))
        row.update(again_type=again["type"], again_done=futures[0].done())
    fails = fault in CRASHES or (adverb == "broadcast" and fault in ("exception", "unpicklable_exception"))
    row.update(failures_row(hook, adverb, since, 10.0 if fails else 0.0))
    later = outcome(lambda: mesh.pid.call_one().get(hang_wait if fault == "hang" else 10.0))
    row.update({"later_" + k: v for k, v in later.items()})
    if fault in CRASHES:
        again = outcome(lambda: mesh.pid.broadcast())
        row.update({"later_broadcast_" + k: v for k, v in again.items()})
    emit(**row)


def pending(adverb):
    mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn(adverb, W)
    mesh.pid.call_one().get(30)
    if adverb == "broadcast":
        mesh.fault.broadcast("hang")
        fut = mesh.pid.call_one()
    elif adverb == "stream":
        fut = next(iter(mesh.fault.stream("hang")))
    else:
        fut = getattr(mesh.fault, adverb)("hang")
    emit(adverb=adverb, type=None, pending=not fut.done())
    return fut


if fault in ("controller_exception", "ctrl_c"):
    futures = [pending(adverb) for adverb in ADVERBS]
    print("END", flush=True)
    if fault == "controller_exception":
        raise ValueError("controller script failed 13")
    os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C at the controller delivers
    futures[-1].get(60)
    print("not interrupted", flush=True)
    sys.exit(0)

for adverb in ADVERBS:
    cell(adverb)
procs = this_host().spawn_procs(per_host={"gpus": 1})
emit(adverb="recover", failures_total=len(hook.failures),
     **outcome(lambda: procs.spawn("fresh", W).pid.call_one().get(30)))
print("END", flush=True)
'''

_matrix_jobs: dict[tuple[str, str], Job] = {}


def matrix_job(fault: str, launch: str, tmp_path_factory: pytest.TempPathFactory) -> Job:
    key = (fault, launch)
    if key not in _matrix_jobs:
        path = tmp_path_factory.mktemp(f"{fault}-{launch}") / "faults.py"
        path.write_text(MATRIX)
        _matrix_jobs[key] = launch_matrix(job_cmd(launch, path, fault, str(HANG_WAIT)))
    return _matrix_jobs[key]


def launch_matrix(cmd: list[str]) -> Job:
    return run_job(cmd, timeout=100)


def proc_re(launch: str, row: dict[str, Any], cause: str) -> str:
    """The death report: which process, its pid and host, and why (never ULFM's poorer word)."""
    addr = r"0\.[1-6]" if launch == "pool" else r"[1-9]\d*\.\d+"
    return rf"process {addr} \(pid {row['pid']}\) on {re.escape(row['host'])} died: {cause}"


def lost_cause(text: str) -> None:
    """No death report is ULFM's poorer one: the controller's pidfd report (pid, host, cause) comes first.

    ULFM's MPI_ERR_PROC_FAILED often reaches a process before the controller's
    report; the runtime waits for that report a moment (``_MPI_REPORT_GRACE``).
    """
    assert "reported failed by MPI" not in text, text


CAUSES = {
    "exit0": death_cause_re(0),
    "exit1": death_cause_re(1),
    "sigkill": death_cause_re(None, signal.SIGKILL),
    "sigsegv": r"killed by a fatal signal \(Segmentation fault, Killed\(sig=11\)\)",
}


def check_actor_error(row: dict[str, Any], adverb: str, text: str) -> None:
    where = rf"rank 0 \(gpus=0\) on {re.escape(row['host'])} in actor '{adverb}'"
    first = row["message"].split("\n", 1)[0]  # then the remote traceback, as Monarch's ActorError reads
    assert re.fullmatch(rf"Actor call {adverb}\.\w+ failed at {where}: {text}", first), row
    assert (row["rank"], row["coords"], row["host"]) == (0, {"gpus": 0}, row["host"]), row
    assert row["cause_is_original"], row


def check_cell(fault: str, launch: str, adverb: str, row: dict[str, Any]) -> None:
    failures = row.get("failures", [])
    if fault in ("exception", "unpicklable_result", "unpicklable_exception") and adverb != "broadcast":
        # The endpoint's exception comes back as ActorError; the actor lives on.
        assert row["type"] == "ActorError", row
        if fault == "exception":
            check_actor_error(row, adverb, "ValueError: boom 42")
            assert (row["inner"], row["inner_args"]) == ("ValueError", ["boom 42"]), row
        elif fault == "unpicklable_result":
            check_actor_error(row, adverb, r"TypeError: cannot pickle the result of endpoint fault "
                              r"\(<unlocked _thread\.lock object at 0x[0-9a-f]+>\): cannot pickle '_thread\.lock' "
                              r"object; return plain data, numpy arrays or tensors")
            assert row["inner"] == "TypeError", row
        else:
            # Text fallback: the exception could not travel, its type name and message did.
            check_actor_error(row, adverb, r"RemoteException: __main__\.Unpicklable: cannot travel 7")
            assert (row["inner"], row["type_name"]) == ("RemoteException", "__main__.Unpicklable"), row
            assert row["inner_message"] == "__main__.Unpicklable: cannot travel 7", row
        assert row["seconds"] < DETECT_BOUND, row
        assert (row["later_type"], row["later_value"]) == (None, row["pid"]), row
        assert failures == [], row
        return
    if fault == "unpicklable_result":  # broadcast: nobody waits for the result, nothing fails
        assert (row["type"], row["value"]) == (None, None), row
        assert (row["later_type"], row["later_value"]) == (None, row["pid"]), row
        assert failures == [], row
        return
    if fault in ("exception", "unpicklable_exception"):  # broadcast: the actor fails, its owner hears
        raised = "ValueError in fault: boom 42" if fault == "exception" else "Unpicklable in fault: cannot travel 7"
        assert (row["type"], row["value"]) == (None, None), row
        assert len(failures) == 1, row
        failure = failures[0]
        assert (failure["mesh"], failure["ranks"]) == ("broadcast", [0]), row
        head = (rf"actor broadcast\[0\]@\d+\.\d+ on {re.escape(row['host'])}: {raised}\n"
                r"Traceback \(most recent call last\):\n")
        assert re.match(head, failure["cause"]), row
        assert failure["report"].startswith(
            "MeshFailure of actor mesh 'broadcast' (__main__.W): rank=0 (gpus=0) failed, crashed_ranks=[0]: "), row
        assert failure["seconds"] < DETECT_BOUND, row
        assert row["later_type"] == "SupervisionError", row
        later = gone(r"broadcast\.pid", "broadcast" + ONE)
        assert re.fullmatch(rf"{later}Actor broadcast\[0\]@\d+\.\d+ is unhealthy with reason: {raised}",
                            row["later_message"]), row
        assert row["later_seconds"] < AT_ONCE, row
        return
    if fault in CRASHES:
        died = proc_re(launch, row, CAUSES[fault])
        bound = POOL_SIGKILL_BOUND if (fault, launch) == ("sigkill", "pool") else DETECT_BOUND
        if adverb == "broadcast":
            assert (row["type"], row["value"]) == (None, None), row
        else:
            assert row["type"] == "SupervisionError", row
            who = rf"{adverb}({ONE})?" if adverb == "stream" else rf"{adverb}{ONE}"
            assert re.fullmatch(gone(rf"{adverb}\.fault", who) + died, row["message"]), row
            assert row["seconds"] < bound, row
        # The owner (here the script: the hook) hears exactly once, with the cause.
        assert len(failures) == 1, row
        failure = failures[0]
        assert (failure["mesh"], failure["ranks"]) == (adverb, [0]), row
        assert re.fullmatch(rf"{mesh_failed(adverb)}\n  {died}",
                            failure["report"]), row
        assert failure["seconds"] < bound, row
        # Later calls fail at once, without sending; broadcast raises synchronously.
        assert row["later_type"] == "SupervisionError", row
        assert re.fullmatch(gone(rf"{adverb}\.pid", adverb + ONE) + died,
                            row["later_message"]), row
        assert row["later_seconds"] < AT_ONCE, row
        assert row["later_broadcast_type"] == "SupervisionError", row
        assert re.fullmatch(rf"cannot broadcast {adverb}\.pid\(\): {died}", row["later_broadcast_message"]), row
        return
    if fault == "hang":
        if adverb == "broadcast":
            assert (row["type"], row["value"]) == (None, None), row
        else:
            what = "stream.fault.stream()[0]" if adverb == "stream" else f"{adverb}.fault.{adverb}()"
            assert row["type"] == "TimeoutError", row
            assert row["message"] == (f"<mpimesh.Future {what} pending> not done after {HANG_WAIT:g} s; call get() "
                                      "again to keep waiting, or raise the timeout"), row
            assert HANG_WAIT <= row["seconds"] < DETECT_BOUND, row
            assert (row["again_type"], row["again_done"]) == ("TimeoutError", False), row
        # The actor is busy: the next call waits behind the stuck one.
        assert row["later_type"] == "TimeoutError", row
        assert row["later_message"] == (f"<mpimesh.Future {adverb}.pid.call_one() pending> not done after "
                                        f"{HANG_WAIT:g} s; call get() again to keep waiting, or raise the timeout"), row
        assert failures == [], row
        return
    # controller_exception, ctrl_c: the call was pending when the script ended (see test_job)
    assert row == {"adverb": adverb, "type": None, "pending": True}, row


CELLS = [(f, launch, a) for f in FAULTS for launch in LAUNCHES for a in ADVERBS]


@pytest.mark.parametrize(("fault", "launch", "adverb"), CELLS, ids=["-".join(c) for c in CELLS])
def test_cell(fault: str, launch: str, adverb: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each (fault, launch, adverb) ends in the documented exception within its bound.

    Endpoint exceptions and bad data: ActorError, the actor lives on (broadcast:
    the actor fails and its owner gets a MeshFailure).  Deaths: SupervisionError
    naming rank, coordinates, host and cause; the owner hears once; later calls
    fail at once.  Hangs: TimeoutError that does not consume the future.
    """
    needs_ulfm(fault)
    needs_job_status(fault, launch)
    job = matrix_job(fault, launch, tmp_path_factory)
    row = job.rows.get(adverb)
    assert row is not None, job.describe()
    check_cell(fault, launch, adverb, row)
    lost_cause(json.dumps(row))


@pytest.mark.parametrize(("fault", "launch"), [(f, launch) for f in FAULTS for launch in LAUNCHES])
def test_job(fault: str, launch: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The job of each (fault, launch) ends with the documented status, promptly, leaving no process.

    After the faults, fresh processes answer (recovery).  An exception in the
    controller script exits 1 with its traceback; Ctrl-C exits 130.
    """
    needs_ulfm(fault)
    needs_job_status(fault, launch)
    job = matrix_job(fault, launch, tmp_path_factory)
    if fault == "controller_exception":
        assert_ended(job, 1, pool_deaths=False)
        assert job.stderr.count("ValueError: controller script failed 13") == 1, job.describe()
        assert "Traceback (most recent call last):" in job.stderr, job.describe()
    elif fault == "ctrl_c":
        assert_ended(job, 130, pool_deaths=False)
        assert "KeyboardInterrupt" in job.stderr and "not interrupted" not in job.stdout, job.describe()
    else:
        assert_ended(job, 0, pool_deaths=launch == "pool" and fault in CRASHES)
        recover = job.rows["recover"]
        assert recover["type"] is None and isinstance(recover["value"], int), job.describe()
        expected = 5 if fault in CRASHES else 1 if fault in ("exception", "unpicklable_exception") else 0
        assert recover["failures_total"] == expected, job.describe()
    assert set(ADVERBS) <= set(job.rows), job.describe()


def test_stream_failure_names_the_rank(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A SupervisionError from stream() names the rank and coordinates, like every other adverb's."""
    needs_ulfm()
    row = matrix_job("sigkill", "spawned", tmp_path_factory).rows["stream"]
    assert re.match(gone(r"stream\.fault", rf"stream({ONE})?") + "process ", row["message"]), row


# ---------------------------------------------------------------------------
# the default hook, __supervise__, slices, heartbeats, text fallback

DEFAULT_HOOK = PREAMBLE + r'''
mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn("w", W)
pid = mesh.pid.call_one().get(30)
emit(adverb="pid", pid=pid, host=HOST)
import atexit
atexit.register(lambda: print("atexit ran", flush=True))
try:
    fut = mesh.fault.call_one("hang")
    print("END", flush=True)  # from here on the job must end by itself, promptly
    os.kill(pid, signal.SIGKILL)
    emit(adverb="call_one", **outcome(lambda: fut.get(10)))
    threading.Event().wait(60)  # the default hook ends the job before this returns
    print("not ended", flush=True)
finally:
    print("finally ran", flush=True)
'''


@pytest.mark.parametrize("launch", LAUNCHES)
def test_default_hook_ends_the_job(launch: str, tmp_path: Path) -> None:
    """With no hook set, a death ends the whole job: report on stderr, status 1, promptly, no orphans.

    The script catches the SupervisionError (when it gets it before the hook
    ends the process): catching it does not stop the default hook (Monarch's
    behaviour).  The end reaches the script as a KeyboardInterrupt, as in
    Monarch: its `finally` blocks and atexit handlers run.
    """
    needs_ulfm()
    path = tmp_path / "job.py"
    path.write_text(DEFAULT_HOOK)
    job = run_job(job_cmd(launch, path, n=3), timeout=60)
    assert job.rows.get("call_one", {"type": "SupervisionError"})["type"] == "SupervisionError", job.describe()
    assert_ended(job, 1, pool_deaths=launch == "pool")
    died = proc_re(launch, job.rows["pid"], CAUSES["sigkill"])
    report = (r"mpimesh: unhandled failure, ending the job:\n"
              rf"{mesh_failed('w')}\n  {died}\n")
    assert len(re.findall(report, job.stderr)) == 1, job.describe()
    assert "not ended" not in job.stdout
    assert job.stdout.count("finally ran") == 1 and job.stdout.count("atexit ran") == 1, job.describe()
    assert "mpimesh: the script was interrupted by the unhandled failure above" in job.stderr, job.describe()
    lost_cause(job.stderr)


#: Seconds from the SIGINT that the script's own handler swallowed to the script's `finally`: mpimesh sends
#: SIGINT again every 50 ms while the main thread has not moved (``_roles/sigint.py``), well under the 2 s fallback.
RESENT_BOUND = 1.0

SWALLOWS_SIGINT = PREAMBLE + r"""
import atexit
mode = sys.argv[1]  # once: the script's handler swallows one SIGINT, then puts Python's back; always: every one
mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn("w", W)
pid = mesh.pid.call_one().get(30)
emit(adverb="pid", pid=pid, host=HOST)
atexit.register(lambda: print("atexit ran", flush=True))
swallowed = []


def swallow(signum, frame):
    # a SIGINT that never becomes a KeyboardInterrupt: as if lost
    swallowed.append(time.monotonic())
    print("the script's handler swallowed a SIGINT", flush=True)
    if mode == "once":
        signal.signal(signal.SIGINT, signal.default_int_handler)


signal.signal(signal.SIGINT, swallow)
try:
    fut = mesh.fault.call_one("hang")
    print("END", flush=True)  # from here on the job must end by itself, promptly
    os.kill(pid, signal.SIGKILL)
    # The handler returns into this wait's lock acquire, which blocks again: the same frame
    # (threading.Condition.wait), at the same instruction.  (A select woken by signal.set_wakeup_fd
    # would return and loop: the position would move, and nothing would be sent again.)
    threading.Event().wait(60)  # the default hook ends the job before this returns
    print("not ended", flush=True)
finally:
    emit(adverb="finally", seconds=time.monotonic() - swallowed[0] if swallowed else None)
    print("finally ran", flush=True)
"""


def unhandled_report(launch: str, job: Job) -> str:
    """The default hook's report of the SIGKILL of the process of ``job``'s ``pid`` row."""
    died = proc_re(launch, job.rows["pid"], CAUSES["sigkill"])
    return rf"mpimesh: unhandled failure, ending the job:\n{mesh_failed('w')}\n  {died}\n"


@pytest.mark.parametrize("launch", LAUNCHES)
def test_default_hook_sends_a_lost_sigint_again(launch: str, tmp_path: Path) -> None:
    """A SIGINT of the default hook that the script never sees is sent again: the end still runs `finally`.

    The script's own handler swallows the first SIGINT, as if it were lost
    (CPython's race: it lands as a blocking wait drops the GIL, and wakes
    nothing), and puts ``signal.default_int_handler`` back.  The wait it
    interrupted resumes in the same frame at the same instruction, so
    mpimesh sends SIGINT again within 50 ms: the script ends in a
    KeyboardInterrupt, its `finally` and atexit handlers run once each, the
    job exits 1, long before the ``MPIMESH_SHUTDOWN_TIMEOUT`` (2 s) fallback.
    """
    needs_ulfm()
    path = tmp_path / "job.py"
    path.write_text(SWALLOWS_SIGINT)
    job = run_job(job_cmd(launch, path, "once", n=3), timeout=60)
    assert_ended(job, 1, pool_deaths=launch == "pool")
    assert len(re.findall(unhandled_report(launch, job), job.stderr)) == 1, job.describe()
    assert job.stdout.count("the script's handler swallowed a SIGINT") == 1, job.describe()
    assert "not ended" not in job.stdout, job.describe()
    assert job.stdout.count("finally ran") == 1 and job.stdout.count("atexit ran") == 1, job.describe()
    assert job.rows["finally"]["seconds"] < RESENT_BOUND, job.describe()
    assert "mpimesh: the script was interrupted by the unhandled failure above" in job.stderr, job.describe()


@pytest.mark.parametrize("launch", LAUNCHES)
def test_default_hook_ends_a_script_that_keeps_its_sigint_handler(launch: str, tmp_path: Path) -> None:
    """A script whose own handler swallows every SIGINT is ended at the fallback.

    Its wait never moves, so SIGINT is sent again, and swallowed, every
    50 ms; ``MPIMESH_SHUTDOWN_TIMEOUT`` after the first the controller stops
    the workers and leaves with ``os._exit(1)``: status 1, no `finally`, no
    atexit handler, no process left.
    """
    needs_ulfm()
    path = tmp_path / "job.py"
    path.write_text(SWALLOWS_SIGINT)
    job = run_job(job_cmd(launch, path, "always", n=3), timeout=60)
    assert_ended(job, 1, pool_deaths=launch == "pool")
    assert len(re.findall(unhandled_report(launch, job), job.stderr)) == 1, job.describe()
    assert job.stdout.count("the script's handler swallowed a SIGINT") >= 1, job.describe()
    assert job.after_end is not None and job.after_end >= float(ENV["MPIMESH_SHUTDOWN_TIMEOUT"]), job.describe()
    for line in ("not ended", "finally ran", "atexit ran"):
        assert line not in job.stdout, job.describe()


ASYNCIO_SIGINT = PREAMBLE + r"""
import asyncio
mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn("w", W)
mesh.pid.call_one().get(30)


async def main():
    return repr(signal.getsignal(signal.SIGINT))


emit(adverb="sigint", booted=signal.getsignal(signal.SIGINT) is signal.default_int_handler,
     in_asyncio_run=asyncio.run(main()), after=signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


@pytest.mark.parametrize("launch", LAUNCHES)
def test_asyncio_run_gets_its_own_sigint_handler(launch: str, tmp_path: Path) -> None:
    """mpimesh installs no SIGINT handler: in a booted controller ``asyncio.run`` installs its own.

    ``asyncio.run`` (Python 3.11+) installs the handler that cancels its main
    task only over ``signal.default_int_handler``; a Monarch program, often
    ``asyncio.run(main())``, must get Ctrl-C as without mpimesh.
    """
    path = tmp_path / "job.py"
    path.write_text(ASYNCIO_SIGINT)
    job = run_job(job_cmd(launch, path, n=2), timeout=60)
    assert job.returncode == 0, job.describe()
    row = job.rows["sigint"]
    assert row["booted"] is True and row["after"] is True, job.describe()
    assert re.match(r"^functools\.partial\(<bound method Runner\._on_sigint of ", row["in_asyncio_run"]), job.describe()


FINALIZERS = PREAMBLE + r'''
import finmod


class Keeper(W):
    @endpoint
    def keep(self, path):
        import finmod
        finmod.KEPT.append(finmod.Noted(path, "module global"))
        return os.getpid()


procs = this_host().spawn_procs(per_host={"gpus": 1})
keeper = procs.spawn("keeper", Keeper)
emit(adverb="pid", pid=keeper.keep.call_one(sys.argv[1]).get(30))
procs.stop().get(30)
emit(adverb="after_stop", notes=open(sys.argv[1]).read() if os.path.exists(sys.argv[1]) else None)
print("END", flush=True)
'''

FINMOD = r'''
KEPT = []


class Noted:
    def __init__(self, path, what):
        # open now: late in an interpreter's exit, builtins such as open() are gone
        self.file, self.what = open(path, "a"), what

    def __del__(self):
        self.file.write(f"{self.what} finalized\n")
        self.file.close()
        print(f"{self.what} says goodbye", flush=True)  # after MPI_Finalize: must not reach for MPI
'''


@pytest.mark.parametrize("launch", LAUNCHES)
def test_worker_interpreters_finalize_module_globals(launch: str, tmp_path: Path) -> None:
    """A worker ends like a Python program: its module globals are finalized (their __del__ runs).

    A spawned process ends when its mesh stops, before stop() is done; a
    launch-pool process is reused, and ends with the job.
    """
    (tmp_path / "finmod.py").write_text(FINMOD)
    path = tmp_path / "job.py"
    path.write_text(FINALIZERS)
    notes = tmp_path / "notes.txt"
    job = run_job(job_cmd(launch, path, str(notes), n=2), timeout=60)
    assert_ended(job, 0, pool_deaths=False)
    assert notes.read_text() == "module global finalized\n", job.describe()
    # printed late in the interpreter's exit, to the process's own stdout (Python has restored it by then)
    assert re.search(r"^(\[keeper\[0\]\] )?module global says goodbye$", job.stdout, re.M), job.describe()
    after_stop = job.rows["after_stop"]["notes"]
    assert after_stop == ("module global finalized\n" if launch == "spawned" else ""), job.describe()


AT_EXIT = PREAMBLE + r'''
import atexit
atexit.register(lambda: print("atexit ran", flush=True))
if sys.argv[1] == "custom":
    mpimesh.unhandled_fault_hook = lambda failure: print(f"hook {failure.mesh_name}", flush=True)


class Late(W):
    @endpoint
    def late(self):
        raise ValueError("failed as the script ended")


mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn("late", Late)
mesh.late.broadcast()
print("END", flush=True)  # the script ends before the failure reaches the controller, most times
'''


@pytest.mark.parametrize("hook", ["custom", "default"])
def test_failure_found_as_the_script_ends_reaches_the_hook_once(hook: str, tmp_path: Path) -> None:
    """A failure that arrives while the job ends still reaches unhandled_fault_hook, exactly once.

    The default hook makes the job's status 1; atexit handlers run either way.
    """
    path = tmp_path / "job.py"
    path.write_text(AT_EXIT)
    job = run_job(job_cmd("pool", path, hook, n=2), timeout=60)
    assert_ended(job, 0 if hook == "custom" else 1, pool_deaths=False)
    assert job.stdout.count("atexit ran") == 1, job.describe()
    if hook == "custom":
        assert job.stdout.count("hook late") == 1, job.describe()
    else:
        report = "mpimesh: unhandled failure, ending the job:\nMeshFailure of actor mesh 'late' (__main__.Late): "
        assert job.stderr.count(report) == 1, job.describe()


SUPERVISE = PREAMBLE + r'''
mode = sys.argv[1]


class Owner(Actor):
    """Spawns a child mesh and decides, in __supervise__, what its failure means."""

    def __init__(self):
        self.seen = []

    def __supervise__(self, failure):
        self.seen.append(failure.report())
        if mode == "raising":
            raise RuntimeError("owner gives up 9")
        return mode == "handled"

    @endpoint
    def run(self):
        self.child = this_host().spawn_procs(per_host={"gpus": 1}).spawn("child", W)
        pid = self.child.pid.call_one().get(30)
        fut = self.child.fault.call_one("hang")
        os.kill(pid, signal.SIGKILL)
        try:
            fut.get(10)
        except SupervisionError as exc:
            return [pid, f"{type(exc).__name__}: {exc}"]
        return [pid, "no error"]

    @endpoint
    def seen_failures(self):
        return list(self.seen)

    @endpoint
    def pid(self):
        return os.getpid()


hook = mpimesh.unhandled_fault_hook = Hook()
owner = this_host().spawn_procs(per_host={"gpus": 1}).spawn("owner", Owner)
since = time.monotonic()
pid, caught = owner.run.call_one().get(30)
emit(adverb="run", pid=pid, host=HOST, caught=caught)
if mode == "handled":
    # Handled: nothing reaches the hook, and the owner keeps serving.
    emit(adverb="later", **outcome(lambda: owner.pid.call_one().get(10)))
    emit(adverb="seen", value=owner.seen_failures.call_one().get(10))
    emit(adverb="hook", **failures_row(hook, "owner", since, 0.0))
else:
    emit(adverb="hook", **failures_row(hook, "owner", since, 10.0))
    emit(adverb="later", **outcome(lambda: owner.pid.call_one().get(10)))
# Recovery after the failure: fresh processes, fresh actors.
procs = this_host().spawn_procs(per_host={"gpus": 1})
emit(adverb="recover", **outcome(lambda: procs.spawn("fresh", W).pid.call_one().get(30)))
print("END", flush=True)
'''


@pytest.mark.parametrize("mode", ["handled", "unhandled", "raising"])
@pytest.mark.parametrize("launch", LAUNCHES)
def test_supervise(launch: str, mode: str, tmp_path: Path) -> None:
    """The failure of a child mesh goes to the actor that spawned it.

    ``__supervise__`` truthy: handled, the owner keeps serving and the hook
    hears nothing.  Falsy: the owner fails too and the hook gets the owner's
    failure wrapping the child's.  Raising: the same, with the exception chained.
    Either way the owner's pending call got SupervisionError and the job recovers.
    """
    needs_ulfm()
    path = tmp_path / "job.py"
    path.write_text(SUPERVISE)
    job = run_job(job_cmd(launch, path, mode, n=4), timeout=60)
    rows = job.rows
    assert {"run", "hook", "later", "recover"} <= set(rows), job.describe()
    run_row = rows["run"]
    died = proc_re(launch, run_row, CAUSES["sigkill"])
    assert re.fullmatch("SupervisionError: " + gone(r"child\.fault", "child" + ONE) + died, run_row["caught"]), \
        job.describe()
    child = rf"{mesh_failed('child')}\n  {died}"
    failures = rows["hook"]["failures"]
    if mode == "handled":
        assert failures == [], job.describe()
        assert rows["later"]["type"] is None and isinstance(rows["later"]["value"], int), job.describe()
        assert len(rows["seen"]["value"]) == 1 and re.fullmatch(child, rows["seen"]["value"][0]), job.describe()
    else:
        raised = "; __supervise__ raised RuntimeError: owner gives up 9" if mode == "raising" else ""
        assert len(failures) == 1, job.describe()
        failure = failures[0]
        assert (failure["mesh"], failure["ranks"]) == ("owner", [0]), job.describe()
        owner = rf"actor owner\[0\]@\d+\.\d+ on \S+ did not handle a failure{re.escape(raised)}"
        assert re.fullmatch(rf"{owner}:\n  {child}", failure["cause"]), job.describe()
        assert failure["seconds"] < DETECT_BOUND, job.describe()
        later = rows["later"]
        assert later["type"] == "SupervisionError", job.describe()
        refused = gone(r"owner\.pid", "owner" + ONE, "Owner")
        assert re.fullmatch(rf"{refused}Actor owner\[0\]@\d+\.\d+ is unhealthy with reason: unhandled failure of "
                            rf"its mesh 'child'{re.escape(raised)}", later["message"]), job.describe()
    assert rows["recover"]["type"] is None, job.describe()
    assert_ended(job, 0, pool_deaths=launch == "pool")
    lost_cause(job.stdout)


SLICES = PREAMBLE + r'''
mpimesh.unhandled_fault_hook = hook = Hook()
mesh = this_host().spawn_procs(per_host={"gpus": 2}).spawn("pair", W)
pids = mesh.pid.call().get(30).values()
emit(adverb="pids", value=pids, host=HOST)
healthy, doomed = mesh.slice(gpus=0), mesh.slice(gpus=1)
# Calls before the death register call sites: the calls after it go through them.
emit(adverb="sites", value=[healthy.pid.call_one().get(10), doomed.pid.call_one().get(10)])
emit(adverb="kill", **outcome(lambda: doomed.fault.call_one(sys.argv[1]).get(10)))
emit(adverb="whole_call", **outcome(lambda: mesh.pid.call().get(10)))
emit(adverb="whole_stream", values=[outcome(lambda f=f: f.get(10)) for f in mesh.pid.stream()])
emit(adverb="whole_broadcast", **outcome(lambda: mesh.pid.broadcast()))
emit(adverb="doomed_call_one", **outcome(lambda: doomed.pid.call_one().get(10)))
# The healthy half must stay healthy, not only for the next few milliseconds:
# give the launcher time to act on the death (a wait for something not to happen).
time.sleep(1.0)
emit(adverb="healthy_call_one", **outcome(lambda: healthy.pid.call_one().get(10)))
emit(adverb="healthy_choose", **outcome(lambda: healthy.pid.choose().get(10)))
emit(adverb="healthy_broadcast", **outcome(lambda: healthy.pid.broadcast()))
emit(adverb="healthy_after", **outcome(lambda: healthy.pid.call().get(10).values()))
emit(adverb="hook", **failures_row(hook, "pair", 0.0, 0.0))
print("END", flush=True)
'''


#: Every cast down a tree: the controller sends to rank 0, which forwards to rank 1 (issue #16).
TREE = {"MPIMESH_CAST_TREE_MIN": "2", "MPIMESH_CAST_FANOUT": "1"}


@pytest.mark.parametrize(("fault", "launch", "tree"), [
    *((fault, launch, False) for fault in CRASHES for launch in (*LAUNCHES, "pool_no_room")),
    *((fault, launch, True) for fault in ("exit1", "sigkill") for launch in LAUNCHES),
], ids=lambda v: {False: "direct", True: "tree"}.get(v, v) if isinstance(v, bool) else v)
def test_healthy_slices_keep_working(launch: str, fault: str, tree: bool, tmp_path: Path) -> None:
    """After one process of a 2-process mesh dies, its half fails at once and the other half keeps serving.

    However it dies, and however the mesh was made: launch-pool ranks, one
    ``MPI_Comm_spawn`` job of a singleton, or one spawned through
    ``mpiexec``'s runtime (a pool without room).  Spawned, the two processes
    are one MPI job, which Open MPI's runtime used to end with its first
    dead member (issue #3: ``_controller.SPAWN_RECOVERY``, ``_launcher.ULFM_RUNTIME``).
    ``tree``: the same with the whole-mesh calls cast down a tree whose
    forwarder is the healthy rank (``_core.multicast``).
    """
    needs_ulfm()
    needs_job_status(fault, launch)
    path = tmp_path / "job.py"
    path.write_text(SLICES)
    job = run_job(job_cmd(launch, path, fault, n=3), timeout=60, env=TREE if tree else None)
    rows = job.rows
    assert "hook" in rows, job.describe()
    pids = rows["pids"]["value"]
    assert rows["sites"]["value"] == pids, job.describe()
    died = proc_re(launch, {"pid": pids[1], "host": rows["pids"]["host"]}, CAUSES[fault])
    rank1 = gone(r"pair\.pid", r"pair\{'gpus': 1/2\}") + died
    # The slice gpus=1 has one dimension left: its only actor is rank 0, with no coordinates.
    kill = rows["kill"]["message"]
    assert re.fullmatch(gone(r"pair\.fault", "pair") + died, kill), job.describe()
    assert rows["whole_call"]["type"] == "SupervisionError", job.describe()
    assert re.fullmatch(rank1, rows["whole_call"]["message"]), job.describe()
    assert rows["whole_call"]["seconds"] < AT_ONCE, job.describe()
    stream = rows["whole_stream"]["values"]
    assert sorted(str(v["type"]) for v in stream) == ["None", "SupervisionError"], job.describe()
    assert [v["value"] for v in stream if v["type"] is None] == [pids[0]], job.describe()
    assert rows["whole_broadcast"]["type"] == "SupervisionError", job.describe()
    assert re.fullmatch(rf"cannot broadcast pair\.pid\(\): {died}", rows["whole_broadcast"]["message"]), job.describe()
    assert rows["doomed_call_one"]["type"] == "SupervisionError", job.describe()
    assert rows["doomed_call_one"]["seconds"] < AT_ONCE, job.describe()
    assert re.fullmatch(gone(r"pair\.pid", "pair") + died, rows["doomed_call_one"]["message"]), job.describe()
    failures = rows["hook"]["failures"]
    assert (rows["healthy_call_one"]["type"], rows["healthy_call_one"]["value"]) == (None, pids[0]), job.describe()
    assert (rows["healthy_choose"]["type"], rows["healthy_choose"]["value"]) == (None, pids[0]), job.describe()
    assert (rows["healthy_broadcast"]["type"], rows["healthy_broadcast"]["value"]) == (None, None), job.describe()
    assert rows["healthy_after"]["value"] == [pids[0]], job.describe()
    assert [(f["mesh"], f["ranks"]) for f in failures] == [("pair", [1])], job.describe()
    assert_ended(job, 0, pool_deaths=launch == "pool")
    lost_cause(job.stdout)


HEARTBEAT = PREAMBLE + r'''
mpimesh.unhandled_fault_hook = hook = Hook()
mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn("w", W)
pid = mesh.pid.call_one().get(30)
emit(adverb="pid", pid=pid, host=HOST)
fut = mesh.fault.call_one("hang")
since = time.monotonic()
os.kill(pid, signal.SIGSTOP)  # alive, but silent
emit(adverb="call_one", **outcome(lambda: fut.get(20)))
emit(adverb="hook", **failures_row(hook, "w", since, 10.0))
emit(adverb="later", **outcome(lambda: mesh.pid.call_one().get(10)))
procs = this_host().spawn_procs(per_host={"gpus": 1})
emit(adverb="recover", **outcome(lambda: procs.spawn("fresh", W).pid.call_one().get(30)))
print("END", flush=True)
'''


@pytest.mark.parametrize("launch", LAUNCHES)
def test_silent_worker_is_declared_dead(launch: str, tmp_path: Path) -> None:
    """A worker that stops answering (SIGSTOP) fails its calls after MPIMESH_HEARTBEAT_TIMEOUT, and is ended at exit."""
    needs_ulfm()
    path = tmp_path / "job.py"
    path.write_text(HEARTBEAT)
    job = run_job(job_cmd(launch, path, n=3), timeout=60, env={"MPIMESH_HEARTBEAT_TIMEOUT": "1"})
    rows = job.rows
    assert {"call_one", "hook", "later", "recover"} <= set(rows), job.describe()
    silent = r"stopped answering: silent for \d+\.\d s \(MPIMESH_HEARTBEAT_TIMEOUT=1\)"
    died = proc_re(launch, rows["pid"], silent)
    call = rows["call_one"]
    assert call["type"] == "SupervisionError", job.describe()
    assert re.fullmatch(gone(r"w\.fault", "w" + ONE) + died, call["message"]), job.describe()
    assert 1.0 <= call["seconds"] < 1.0 + 2 * DETECT_BOUND, job.describe()
    assert [(f["mesh"], f["ranks"]) for f in rows["hook"]["failures"]] == [("w", [0])], job.describe()
    assert rows["later"]["type"] == "SupervisionError" and rows["later"]["seconds"] < AT_ONCE, job.describe()
    assert rows["recover"]["type"] is None, job.describe()
    assert_ended(job, 0, pool_deaths=launch == "pool", stopped=True)


JOB_STATUS = PREAMBLE + r'''
mode = sys.argv[1]
mpimesh.unhandled_fault_hook = hook = Hook()
# Three launch-pool workers exit with status 1: PRRTE used to end the whole job at the third.
for i in range(3):
    mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn(f"w{i}", W)
    emit(adverb=f"exit{i}", pid=mesh.pid.call_one().get(30), host=HOST,
         **outcome(lambda: mesh.fault.call_one("exit1").get(10)))
live = this_host().spawn_procs(per_host={"gpus": 2}).spawn("live", W)
emit(adverb="live", **outcome(lambda: live.pid.call().get(10).values()))
print("END", flush=True)
if mode == "exit":
    sys.exit(3)
if mode == "raise":
    raise ValueError("controller script failed 17")
if mode == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
'''

#: The report Open MPI's launcher prints when it ends a job because a rank called abort.
PRRTE_ABORT_REPORT = 'calling\n"abort"'


@pytest.mark.parametrize(("mode", "status"), [("ok", 0), ("exit", 3), ("raise", 1), ("sigkill", None)])
def test_job_status_is_the_scripts(mode: str, status: int | None, tmp_path: Path) -> None:
    """Under ``mpimesh run``, workers that exit non-zero are deaths, and the job's status is still the script's.

    ``sys.exit(3)`` gives 3, an uncaught exception 1 (traceback once), a
    controller killed by a signal a non-zero status; no launcher report of an
    abort, nothing left behind.
    """
    needs_ulfm()
    needs_job_status("exit1", "pool")
    path = tmp_path / "job.py"
    path.write_text(JOB_STATUS)
    job = run_job(job_cmd("pool", path, mode), timeout=60)
    for i in range(3):
        row = job.rows.get(f"exit{i}")
        assert row is not None and row["type"] == "SupervisionError", job.describe()
        died = proc_re("pool", row, CAUSES["exit1"])
        assert re.fullmatch(gone(rf"w{i}\.fault", f"w{i}" + ONE) + died, row["message"]), job.describe()
        assert row["seconds"] < DETECT_BOUND, job.describe()
    live = job.rows.get("live", {})
    assert live.get("type") is None and len(live.get("value", [])) == 2, job.describe()
    if status is None:  # the controller was killed: its workers end the job, non-zero
        assert not job.hung and job.returncode not in (0, None), job.describe()
        assert job.after_end is not None and job.after_end < EXIT_BOUND, job.describe()
        assert job.orphans == [], job.describe()
        return
    assert_ended(job, status, pool_deaths=True)
    assert PRRTE_ABORT_REPORT not in job.stderr, job.describe()
    if mode == "raise":
        assert job.stderr.count("ValueError: controller script failed 17") == 1, job.describe()
    lost_cause(job.stdout)


FALLBACK = PREAMBLE + r'''
class NeedsTwo(Exception):
    """Pickles, but does not unpickle (its __init__ wants two arguments)."""

    def __init__(self, a, b):
        super().__init__(f"{a} and {b}")


class Unloadable:
    """Pickles, but fails when it is unpickled."""

    def __reduce__(self):
        return (_fail, ("no way back 5",))


def _fail(text):
    raise RuntimeError(text)


class V(Actor):
    @endpoint
    def raise_two(self):
        raise NeedsTwo("x", "y")

    @endpoint
    def unloadable(self):
        return Unloadable()

    @endpoint
    def pid(self):
        return os.getpid()


mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn("v", V)
pid = mesh.pid.call_one().get(30)
emit(adverb="raise_two", **outcome(lambda: mesh.raise_two.call_one().get(10)))
emit(adverb="unloadable", **outcome(lambda: mesh.unloadable.call_one().get(10)))
emit(adverb="later", pid=pid, **outcome(lambda: mesh.pid.call_one().get(10)))
print("END", flush=True)
'''


def test_text_fallback(tmp_path: Path) -> None:
    """An exception or result that pickles but will not unpickle reaches the caller as text, not as a hang."""
    path = tmp_path / "job.py"
    path.write_text(FALLBACK)
    job = run_job(job_cmd("spawned", path), timeout=60)
    rows = job.rows
    assert {"raise_two", "unloadable", "later"} <= set(rows), job.describe()
    two = rows["raise_two"]
    check_actor_error(two, "v", r"RemoteException: __main__\.NeedsTwo: x and y")
    assert (two["inner"], two["type_name"]) == ("RemoteException", "__main__.NeedsTwo"), two
    bad = rows["unloadable"]
    assert bad["type"] == "ActorError", bad
    assert bad["message"] == ("remote call failed at result of v.unloadable: RemoteException: RuntimeError: cannot "
                              "unpickle the result of v.unloadable: no way back 5"), bad
    assert (rows["later"]["type"], rows["later"]["value"]) == (None, rows["later"]["pid"]), job.describe()
    assert_ended(job, 0, pool_deaths=False)


# ---------------------------------------------------------------------------
# launches: without ULFM, and Ctrl-C at the terminal

NO_ULFM = PREAMBLE + r'''
mpimesh.unhandled_fault_hook = Hook()
mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn("w", W)
pid = mesh.pid.call_one().get(30)
emit(adverb="pid", pid=pid, host=HOST)
fut = mesh.fault.call_one("hang")
os.kill(pid, signal.SIGKILL)
emit(adverb="call_one", **outcome(lambda: fut.get(10)))
print("END", flush=True)
threading.Event().wait(60)  # the job ends before this returns
print("not ended", flush=True)
'''


def test_pool_death_without_ulfm_ends_the_job(tmp_path: Path) -> None:
    """Plain ``mpiexec`` (no --with-ft ulfm): a dead pool worker ends the whole job, promptly, non-zero, no orphans.

    Open MPI's launcher kills the job when a rank dies; the controller prints
    its report first when it is fast enough (documented in the README's
    table "Which MPI stacks keep the survivors").
    """
    if info("mpi_vendor") != "openmpi":
        pytest.skip("Open MPI's plain mpiexec behaviour")
    path = tmp_path / "job.py"
    path.write_text(NO_ULFM)
    job = run_job(mpiexec_cmd(3, *python_cmd("-m", "mpimesh", str(path))), timeout=60)
    assert not job.hung, job.describe()
    assert job.returncode not in (0, None), job.describe()
    assert job.seconds < 30, job.describe()
    assert "not ended" not in job.stdout, job.describe()
    assert job.orphans == [], job.describe()
    report = ("mpimesh: this MPI job cannot outlive a dead process (MPICH, or Open MPI without fault tolerance), "
              "so it ends now; launch with `mpimesh run -n N script.py` (Open MPI: adds --with-ft ulfm) to keep "
              "the survivors")
    launcher = re.search(r"prterun noticed that process rank 1 with PID \d+ on node \S+ exited on\s+signal 9",
                         job.stderr)
    assert report in job.stderr or launcher, job.describe()


CTRL_C = PREAMBLE + r'''
futures = []
for adverb in ADVERBS:
    mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn(adverb, W)
    mesh.pid.call_one().get(30)
    futures.append(getattr(mesh.fault, adverb)("hang") if adverb not in ("stream", "broadcast") else
                   next(iter(mesh.fault.stream("hang"))) if adverb == "stream" else mesh.fault.broadcast("hang"))
print("END", flush=True)
futures[0].get(60)
print("not interrupted", flush=True)
'''


@pytest.mark.parametrize("launch", LAUNCHES)
def test_ctrl_c_at_the_terminal(launch: str, tmp_path: Path) -> None:
    """Ctrl-C at the terminal (SIGINT to the job's process group) ends the job promptly, leaving no process.

    Spawned: the controller stops its workers (they ignore SIGINT) and exits
    130.  Under mpiexec the launcher ends the job itself (Open MPI: status 1
    within about 0.3 s, before the controller's KeyboardInterrupt is reported).
    """
    path = tmp_path / "job.py"
    path.write_text(CTRL_C)
    sent: list[float] = []

    def interrupt(line: str, job: Job) -> None:
        if line.strip() == "END" and not sent:
            sent.append(time.monotonic())
            os.killpg(job.pid, signal.SIGINT)

    job = run_job(job_cmd(launch, path), timeout=60, on_line=interrupt)
    assert sent, job.describe()
    assert not job.hung, job.describe()
    assert job.after_end is not None and job.after_end < EXIT_BOUND, job.describe()
    assert "not interrupted" not in job.stdout, job.describe()
    assert job.orphans == [], job.describe()
    if launch == "spawned":
        assert job.returncode == 130, job.describe()
        assert "KeyboardInterrupt" in job.stderr, job.describe()
    else:
        assert job.returncode not in (0, None), job.describe()


STUCK_ISLANDS = PREAMBLE + r'''
class Stuck(Actor):
    @endpoint
    def ok(self):
        return 1

    @endpoint
    def block(self):
        time.sleep(1000)


for i in range(4):  # four spawn_procs() calls: four islands, each stuck in an endpoint
    mesh = this_host().spawn_procs(per_host={"gpus": 1}).spawn(f"stuck{i}", Stuck)
    mesh.ok.call_one().get(30)
    mesh.block.broadcast()
print("END", flush=True)
'''


def test_stuck_islands_stop_together(tmp_path: Path) -> None:
    """At exit every island is asked to stop at once: one cleanup bound for all, not one per island."""
    path = tmp_path / "stuck.py"
    path.write_text(STUCK_ISLANDS)
    job = run_job(job_cmd("spawned", path), timeout=90, env={"MPIMESH_SHUTDOWN_TIMEOUT": "5"})
    assert not job.hung and job.returncode == 0, job.describe()
    # each island's workers give up on their stuck actor after the 1 s cleanup
    # timeout and leave; one island after the other took 4 s and more
    assert job.after_end is not None and job.after_end < 2.5, job.describe()
    assert job.orphans == [], job.describe()
