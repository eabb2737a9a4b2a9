"""Faults across hosts: a worker on the other host dies (every way), hangs, or its whole host is lost.

One job per fault, ``mpiexec --with-ft ulfm --host mh1:2,mh2:2 -n 4``: the
controller (rank 0) and rank 1 on mh1, ranks 2 and 3 on mh2.  The script
spawns a 3-process mesh on the pool, makes a worker on mh2 fault (for
``host``: every process of mh2 is killed at once by this test, with calls
pending on both of mh2's workers), and then checks, printing ``ROW`` lines:

* the caller gets the documented exception within its bound (issue #13,
  "Cross-host supervision": SIGKILL <= 0.1 s, any other death <= 2 s), a
  ``SupervisionError`` naming the process and its host;
* the owner (the fault hook) hears once per dead process;
* later calls to the dead fail at once;
* the survivors, on both hosts, keep answering;
* ``spawn_procs`` afterwards gives working processes (``recover``).

Then the job must end by itself with status 0, promptly, leaving no process
on any host.  These assert the behaviour issue #13 asks for: those that fail
today fail, with the reason in docs/design/hosts.md.
"""

from __future__ import annotations

import re
import signal
import time
from typing import Any

import pytest
from hostlib import HOST_TMP, PREAMBLE, Job, assert_ended, host_cmd, hosts, kill_host, run_job
from mpitest import death_cause_re

pytestmark = pytest.mark.subprocess

FAULTS = ("exception", "exit0", "exit1", "sigkill", "sigsegv", "hang", "host")
DEATHS = ("exit0", "exit1", "sigkill", "sigsegv", "host")

#: A whole host lost cannot be survived under mpiexec: when a node's daemon
#: dies, PRRTE 3.0.14 ends the whole job (errmgr_dvm.c, proc_errors) and
#: prterun exits 0, before mpimesh can report (docs/design/hosts.md).  Issue
#: #13 item 4 stays open; strict, so that a fix turns these red.
HOST_LOST = pytest.mark.xfail(strict=True, reason="PRRTE 3.0.14 ends the whole job when a node's daemon dies "
                              "(errmgr_dvm.c proc_errors; prterun exits 0): issue #13 item 4")
CASES = [pytest.param(f, marks=HOST_LOST) if f == "host" else f for f in FAULTS]

#: Seconds from the fault to the SupervisionError at the caller (issue #13).
BOUND = {"sigkill": 0.1}
DETECT_BOUND = 2.0
#: A later call to a known-dead process fails before anything is sent.
AT_ONCE = 0.5
#: What a call to a failed actor says before the cause (Monarch's phrase, which its users match on)
#: How a failed call to the actor of a one-actor slice begins (Monarch's words)
GONE = r"failed, The actor __main__\.W w and all its descendants have failed: "

MATRIX = PREAMBLE + r'''
fault = sys.argv[1]
hook = mpimesh.unhandled_fault_hook = Hook()
# The launch pool, host by host: one worker on this host, two on the other.
hosts = host_mesh()
mine = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1}).spawn("w", W)
theirs = hosts.slice(hosts=1).spawn_procs(per_host={"gpus": 2}).spawn("w", W)
actors = [mine.slice(gpus=0), theirs.slice(gpus=0), theirs.slice(gpus=1)]  # world ranks 1, 2, 3
where = [a.where.call_one().get(30) for a in actors]
emit(adverb="where", value=where, host=HOST, pid=os.getpid())
remote = [i for i, (h, _) in enumerate(where) if h != HOST]
victims = remote if fault == "host" else remote[:1]
survivors = [i for i in range(len(where)) if i not in victims]
wait = 0.5 if fault == "hang" else 10.0

if fault == "host":
    futures = [actors[i].fault.call_one("hang") for i in victims]
    # The test kills every process of the host when it reads this line.
    print("KILLHOST " + where[victims[0]][0], flush=True)
    for i, fut in zip(victims, futures):
        emit(adverb=f"victim{i}", rank=i, pid=where[i][1], host=where[i][0], **outcome(lambda: fut.get(wait)))
else:
    i = victims[0]
    since = time.monotonic()
    emit(adverb=f"victim{i}", rank=i, pid=where[i][1], host=where[i][0], since=since,
         **outcome(lambda: actors[i].fault.call_one(fault).get(wait)))
deaths = len(victims) if fault in ("exit0", "exit1", "sigkill", "sigsegv", "host") else 0
emit(adverb="hook", **failures_row(hook, "w", 0.0, deaths, 10.0 if deaths else 0.0))
for i in victims:
    emit(adverb=f"later{i}", **outcome(lambda: actors[i].where.call_one().get(0.5 if fault == "hang" else 10)))
# The survivors must stay healthy, not only for the next few milliseconds:
# give the launcher time to act on the death (a wait for something not to happen).
time.sleep(1.0)
emit(adverb="survivors", want=[where[i] for i in survivors],
     **outcome(lambda: [actors[i].where.call_one().get(10) for i in survivors]))
# Fresh processes on this host (the pool has no free rank left: spawned).  Not
# on both: PRRTE 3.0.14 here sometimes loses a host's daemon during a spawn
# across both hosts after a fault, and one hangs spawning onto a host whose
# pool workers all died (docs/design/hosts.md, "Spawning across hosts").
fresh = outcome(lambda: this_host().spawn_procs(per_host={"gpus": 2}).spawn("fresh", W).where.call()
                .get(30).values())
emit(adverb="recover", **fresh)
print("END", flush=True)
'''


_jobs: dict[str, Job] = {}


def matrix_job(fault: str, tmp_path_factory: pytest.TempPathFactory) -> Job:
    """The job of ``fault`` (run once, shared by its tests)."""
    if fault not in _jobs:
        names = hosts(2)
        path = tmp_path_factory.mktemp(f"hosts-{fault}") / "faults.py"
        path.write_text(MATRIX)

        def on_line(line: str, job: Job) -> None:
            if line.startswith("KILLHOST "):
                host = line.split()[1]
                job.marks["killed"] = time.monotonic()
                job.marks["pids"] = float(len(kill_host(host)))

        _jobs[fault] = run_job(host_cmd(f"{names[0]}:2,{names[1]}:2", 4, str(path), fault), timeout=120,
                               on_line=on_line)
    return _jobs[fault]


#: How each death reads although it happened on another host: the host's watcher read the wait status
#: and the last words there (``_roles.hostwatch``), as the controller does for its own host's workers.
CAUSES = {
    "exit0": death_cause_re(0),
    "exit1": death_cause_re(1),
    "sigkill": death_cause_re(None, signal.SIGKILL),
    "sigsegv": r"killed by a fatal signal \(Segmentation fault, Killed\(sig=11\)\)",
    "host": ".+",
}


def died_re(row: dict[str, Any], fault: str) -> str:
    """The death report: which process, its pid and host, and the cause."""
    return (rf"process 0\.{row['rank'] + 1} \(pid {row['pid']}\) on {re.escape(row['host'])} died: "
            rf"{CAUSES[fault]}")


@pytest.mark.parametrize("fault", CASES)
def test_caller_sees_the_fault(fault: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The call to the faulting worker on the other host ends as documented, within its bound.

    An endpoint exception: ActorError naming the remote host, the actor lives
    on.  A death (any kind, or its whole host lost): SupervisionError naming
    the process and its host; later calls fail at once.  A hang: TimeoutError.
    """
    names = hosts(2)
    job = matrix_job(fault, tmp_path_factory)
    where = job.rows.get("where")
    assert where is not None, job.describe()
    assert [h for h, _ in where["value"]].count(names[1]) == 2 and where["host"] == names[0], job.describe()
    victims = [row for key, row in job.rows.items() if key.startswith("victim")]
    assert len(victims) == (2 if fault == "host" else 1), job.describe()
    for row in victims:
        assert row["host"] == names[1], job.describe()
        later = job.rows[f"later{row['rank']}"]
        if fault == "exception":
            assert row["type"] == "ActorError", job.describe()
            # The header names the actor's own point in its mesh, and its host.
            i = row["rank"]
            assert re.fullmatch(rf"Actor call w\.\w+ failed at rank {i - 1} \(gpus={i - 1}\) on {names[1]} "
                                r"in actor 'w': ValueError: boom 42", row["message"].split("\n", 1)[0]), job.describe()
            assert row["seconds"] < DETECT_BOUND, job.describe()
            assert (later["type"], later["value"]) == (None, [row["host"], row["pid"]]), job.describe()
        elif fault == "hang":
            assert row["type"] == "TimeoutError", job.describe()
            assert 0.5 <= row["seconds"] < DETECT_BOUND, job.describe()
            assert later["type"] == "TimeoutError", job.describe()
        else:
            assert row["type"] == "SupervisionError", job.describe()
            expected = rf"Endpoint call w\.fault\(\) {GONE}{died_re(row, fault)}"
            assert re.fullmatch(expected, row["message"]), job.describe()
            since = job.marks["killed"] if fault == "host" else row["since"]
            bound = BOUND.get(fault, DETECT_BOUND)
            assert row["at"] - since < bound, f"detected after {row['at'] - since:.3f} s > {bound} s\n" + \
                job.describe()
            assert later["type"] == "SupervisionError", job.describe()
            expected = rf"Endpoint call w\.where\(\) {GONE}{died_re(row, fault)}"
            assert re.fullmatch(expected, later["message"]), job.describe()
            assert later["seconds"] < AT_ONCE, job.describe()


@pytest.mark.parametrize("fault", CASES)
def test_owner_hears_once_per_death(fault: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The fault hook gets one MeshFailure per dead process, naming its host; none for exception or hang."""
    names = hosts(2)
    job = matrix_job(fault, tmp_path_factory)
    hook = job.rows.get("hook")
    assert hook is not None, job.describe()
    ranks = sorted(r for f in hook["failures"] for r in f["ranks"])
    if fault in DEATHS:
        # the victims are the other host's workers: ranks 0.. of their own mesh
        victims = sorted(row["rank"] - 1 for key, row in job.rows.items() if key.startswith("victim"))
        assert ranks == victims, job.describe()
        for failure in hook["failures"]:
            assert f" on {names[1]} died: " in failure["report"], job.describe()
    else:
        assert ranks == [], job.describe()


@pytest.mark.parametrize("fault", CASES)
def test_survivors_go_on_and_spawn_works(fault: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """After the fault, the other workers on both hosts answer, fresh processes can be spawned and
    answer, and the job ends by itself with status 0, promptly, leaving no process on any host."""
    names = hosts(2)
    job = matrix_job(fault, tmp_path_factory)
    survivors = job.rows.get("survivors")
    assert survivors is not None, job.describe()
    assert (survivors["type"], survivors["value"]) == (None, survivors["want"]), job.describe()
    recover = job.rows.get("recover")
    assert recover is not None, job.describe()
    assert recover["type"] is None and len(recover["value"]) == 2, job.describe()
    if fault == "host":
        lost = job.rows["victim2"]["host"] if "victim2" in job.rows else None
        assert all(host != lost for host, _ in recover["value"]), job.describe()
    assert_ended(job, 0)
    if fault != "hang":
        # The other host's job directory (bells, last words, the dead's too) went with its last worker.
        folder = HOST_TMP / names[1] / f"mpimesh-{job.rows['where']['pid']}"
        assert not folder.exists(), f"{folder} is left: {sorted(p.name for p in folder.iterdir())}"


def test_kill_reaches_every_process_of_the_host(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The host loss killed the host's PRRTE daemon and both ranks (at least 3 processes)."""
    hosts(2)
    job = matrix_job("host", tmp_path_factory)
    assert job.marks.get("pids", 0) >= 3, job.describe()

