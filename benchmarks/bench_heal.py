"""Heal against restart (issue #27 item 7: heal <= 0.2x restart): a dead rank replaced in place, or the job resubmitted.

Run (one host, then across two simulated hosts of ``.ci/multihost.sh``)::

    .venv/bin/python benchmarks/bench_heal.py [--repeats 5] [--size 2]
    MPIMESH_HOSTS_PREFIX=hb MPIMESH_HOSTS_NET=10.82.0 bash .ci/multihost.sh up 2
    MPIMESH_HOSTS_NET=10.82.0 .venv/bin/python benchmarks/bench_heal.py --hosts hb1,hb2
    # under Slurm, as root (3 nodes; SLURM_HOSTS_PREFIX/NET as for .ci/slurm-hosts-tests.sh):
    eval "$(SLURM_HOSTS_PREFIX=hs SLURM_HOSTS_NET=10.83.0 bash .ci/slurm-hosts.sh up 3)"
    SLURM_HOSTS_PREFIX=hs SLURM_HOSTS_NET=10.83.0 .venv/bin/python benchmarks/bench_heal.py --slurm hs
    SLURM_HOSTS_PREFIX=hs SLURM_HOSTS_NET=10.83.0 bash .ci/slurm-hosts.sh down

Three kinds of job, each launched ``--repeats`` times in turn, all with the
same launcher and the same number of ranks (the controller, a mesh of
``--size`` workers and one spare: what a user resubmits is the same job):

* ``heal``: the controller spawns the mesh, an actor mesh on it with a
  constructor argument, and calls it; it then SIGKILLs one worker while a
  call to it is pending, catches the ``SupervisionError`` (``detect_ms``),
  calls ``heal_mesh(procs)`` and calls the healed actor mesh once more.
  ``heal_s``: from ``heal_mesh`` to that first call answered (the spare
  takes over, the actor is made again, the call answered); ``kill_to_answer_s``
  adds the detection.
* ``restart``: a fresh job that builds the same mesh and actors and answers
  the first call.  ``restart_s``: from just before ``Popen`` of the launcher
  to that first answer (both sides read the machine's one CLOCK_MONOTONIC;
  the simulated hosts share the kernel).  The dead job's teardown and the
  batch system's queue are left out, which favours the restart.
* ``raw``: the baseline, a plain mpi4py job of the same size under the same
  launcher: ``MPI_Init``, rank 0 sends to each worker rank and receives its
  answer.  ``raw_restart_s``: from ``Popen`` to that answer, the floor of
  any restart.

Under Slurm (``--slurm PREFIX``: the 3-node Slurm of ``.ci/slurm-hosts.sh``
on simulated hosts PREFIX1..3, ``SLURM_CONF`` and the Open MPI settings of
its ``env`` in the environment) every job is an ``sbatch --wait`` of 9 tasks,
3 a node: the mpimesh jobs through ``jobs/slurm/mpimesh.sbatch`` (``srun
--mpi=pmix --no-kill``), the raw one through ``srun --mpi=pmix`` of the same
allocation shape.  The mesh has one worker a node; the ``heal`` job's loss
is a whole host: once a call to PREFIX3's worker is pending, the driver
SIGKILLs every process of PREFIX3 (slurmd, slurmstepd, the worker and its two
spares), the script catches the ``SupervisionError`` (``detect_ms``, X8:
host loss to the error at the caller) and heals from a spare of another host;
PREFIX3 is revived after each.  ``restart_s`` there runs from just before
``sbatch`` to the first answer: submission and scheduling (an empty queue)
are in it, as for a user who resubmits.

On one host the launcher is ``mpimesh run -n N --oversubscribe``; with
``--hosts A,B`` it is ``mpiexec $(multihost.sh flags) --with-ft ulfm --host
A:1,B:size+1`` with the PRRTE settings ``mpimesh run`` adds: the mesh and
its spare on B, so the heal takes B's spare.  mpimesh's bytecode is
compiled first, as an installed package's is (see bench_b5.py).

Prints one JSON line per job and, last, a summary: medians over repeats
with ``[min, max]``, and the ratios ``heal_s / restart_s`` (target <= 0.2)
and ``restart_s / raw_restart_s``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import kill_session, launch_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "slurm"))
from slurmlib import nodes_idle  # noqa: E402  (the Slurm tests' helper: this benchmark runs on their cluster)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
#: What ``mpimesh run`` adds under ULFM on Open MPI 5.0.9+ (mpimesh/_launch/cli.py ULFM_RUNTIME).
ULFM_RUNTIME = {
    "PRTE_MCA_state_base_error_non_zero_exit": "0",
    "PRTE_MCA_state_base_recoverable": "1",
    "MPIMESH_PMIX_EXIT_STATUS": "1",
}


# ---------------------------------------------------------------------------
# the job side


def _say(**row: Any) -> None:
    sys.stdout.write("HEALROW " + json.dumps(row) + "\n")
    sys.stdout.flush()


def _mesh(size: int, across: bool, slurm: bool = False) -> tuple[Any, Any]:
    """The job's mesh (on the last host; under Slurm one worker a node) and its actor mesh, as both jobs build them."""
    from mpimesh import Actor, endpoint, host_mesh, this_host

    class Trainer(Actor):
        def __init__(self, lr: float, *, seed: int = 0) -> None:
            self.lr, self.seed, self.steps = lr, seed, 0

        @endpoint
        def hold(self, seconds: float) -> str:
            time.sleep(seconds)
            return socket.gethostname()

        @endpoint
        def host(self) -> str:
            return socket.gethostname()

        @endpoint
        def step(self) -> int:
            self.steps += 1
            return self.steps

        @endpoint
        def pid(self) -> int:
            return os.getpid()

    if slurm:  # one worker a node
        procs = host_mesh().spawn_procs(per_host={"gpus": 1})
        return procs, procs.spawn("trainer", Trainer, 0.1, seed=7)
    where = host_mesh().slice(hosts=len(host_mesh()) - 1) if across else this_host()
    procs = where.spawn_procs(per_host={"gpus": size})
    return procs, procs.spawn("trainer", Trainer, 0.1, seed=7)


def job_heal(size: int, across: bool) -> None:
    """Spawn, call, kill a worker while a call is pending, heal, call again; one HEALROW line."""
    import signal

    import mpimesh
    from mpimesh import DeviceMeshError, heal_mesh

    mpimesh.unhandled_fault_hook = lambda failure: True  # handled here: the script heals
    procs, trainers = _mesh(size, across)
    trainers.step.call().get(60)
    victim = trainers.slice(gpus=size - 1)
    pid = victim.pid.call_one().get(60)
    pending = victim.step.call_one()
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    try:
        pending.get(60)
        raise AssertionError("the call to the killed worker answered")
    except DeviceMeshError:
        caught = time.monotonic()
    heal_mesh(procs)
    answer = trainers.step.call().get(60)
    done = time.monotonic()
    assert list(answer.values()) == [2] * (size - 1) + [1], answer  # survivors: 2nd step; the new actor: 1st
    _say(job="heal", detect_ms=round((caught - killed) * 1e3, 2), heal_s=round(done - caught, 4),
         kill_to_answer_s=round(done - killed, 4))
    procs.stop().get(60)


def job_slurm_heal() -> None:
    """Under Slurm: a call to the last node's worker pending, that whole node killed (by the driver), healed."""
    import mpimesh
    from mpimesh import DeviceMeshError, heal_mesh, host_mesh

    mpimesh.unhandled_fault_hook = lambda failure: True  # handled here: the script heals
    procs, trainers = _mesh(1, False, slurm=True)
    trainers.step.call().get(60)
    victim = trainers.slice(hosts=len(host_mesh()) - 1)
    host = victim.host.call_one().get(60)
    pending = victim.hold.call_one(120)
    sys.stdout.write(f"HEALREADY {host}\n")
    sys.stdout.flush()
    try:
        pending.get(90)
        raise AssertionError("the call to the lost node's worker answered")
    except DeviceMeshError:
        caught = time.monotonic()
    heal_mesh(procs)
    answer = trainers.step.call().get(60)
    done = time.monotonic()
    assert sorted(answer.values()) == [1, 2, 2], answer  # survivors: 2nd step; the new actor: 1st
    where = sorted(trainers.host.call().get(60).values())
    _say(job="heal", caught=caught, heal_s=round(done - caught, 4), done=done, lost=host, hosts_after=where)
    procs.stop().get(60)


def job_restart(size: int, across: bool, slurm: bool = False) -> None:
    """A fresh job: the same mesh and actors, the first call answered; one HEALROW line with the time."""
    procs, trainers = _mesh(size, across, slurm)
    trainers.step.call().get(60)
    _say(job="restart", answered=time.monotonic())
    procs.stop().get(60)


def job_raw(size: int) -> None:
    """The raw baseline (plain mpi4py, no mpimesh): rank 0 sends to the last ``size`` ranks and hears back."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    workers = range(comm.size - size, comm.size)
    if comm.rank == 0:
        for dest in workers:
            comm.send(("step", 0.1), dest=dest, tag=77)
        for src in workers:
            comm.recv(source=src, tag=77)
        answered = time.monotonic()
        _say(job="raw", answered=answered, mpi_library=MPI.Get_library_version().splitlines()[0].rstrip("\x00"))
        for dest in range(1, comm.size):
            comm.send(None, dest=dest, tag=78)
    else:
        if comm.rank in workers:
            comm.send((comm.rank, comm.recv(source=0, tag=77)), dest=0, tag=77)
        comm.recv(source=0, tag=78)


# ---------------------------------------------------------------------------
# the driver


def _flags(prefix: str) -> list[str]:
    """``multihost.sh flags`` for the hosts ``<prefix>1, <prefix>2``, on the net ``MPIMESH_HOSTS_NET`` names."""
    if prefix != "mh" and "MPIMESH_HOSTS_NET" not in os.environ:
        # multihost.sh would name its default net (mh's) in the flags: the ranks would look for TCP there
        sys.exit(f"bench_heal.py: set MPIMESH_HOSTS_NET to the net the hosts {prefix}1, {prefix}2 were made on")
    env = dict(os.environ, VENV=str(BIN.parent), MPIMESH_HOSTS_PREFIX=prefix)
    done = subprocess.run(["bash", str(ROOT / ".ci" / "multihost.sh"), "flags"], capture_output=True, text=True,
                          timeout=30, env=env, check=True)
    return done.stdout.split()


def _launch(hosts: list[str], size: int) -> tuple[list[str], dict[str, str]]:
    """The launcher and its environment, for ``size`` workers and one spare (plus the controller)."""
    env = launch_env({"PYTHONPATH": str(ROOT)})
    n = size + 2
    if not hosts:
        return [sys.executable, "-m", "mpimesh._launch.cli", "run", "-n", str(n), "--oversubscribe"], env
    prefix = hosts[0].rstrip("0123456789")
    env.update(ULFM_RUNTIME)
    return [str(BIN / "mpiexec"), *_flags(prefix), "--with-ft", "ulfm", "--host",
            f"{hosts[0]}:1,{hosts[1]}:{n - 1}", "-n", str(n)], env


def _job(cmd: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run one job in a session of its own; its HEALROW, ``started`` (monotonic, before Popen) and status."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=str(ROOT))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, err = proc.communicate()
        return {"error": f"timed out after {timeout} s", "stderr": err[-1500:]}
    finally:
        kill_session(proc.pid)
    rows = [json.loads(line[len("HEALROW "):]) for line in out.splitlines() if line.startswith("HEALROW ")]
    if proc.returncode != 0 or not rows:
        return {"error": f"status {proc.returncode}", "stdout": out[-1500:], "stderr": err[-1500:]}
    row: dict[str, Any] = rows[-1]
    if "answered" in row:
        row["start_s"] = round(row.pop("answered") - started, 4)
    row["exit_s"] = round(time.monotonic() - started, 3)
    return row


#: tasks of every Slurm job, and a node's share
SLURM_TASKS, SLURM_PER_NODE = 9, 3
RAW_SBATCH = """#!/bin/bash
export PATH="$VENV/bin:$PATH" OPAL_PREFIX="$VENV"
exec srun --mpi=pmix "$VENV/bin/python" "$@"
"""


def _slurm_job(kind: str, prefix: str, tmp: Path, timeout: float) -> dict[str, Any]:
    """One ``sbatch --wait`` of ``kind``; for ``heal``, every process of node PREFIX3 killed once a call is pending."""
    hosts = [f"{prefix}{i}" for i in (1, 2, 3)]
    states = nodes_idle(hosts, 60)
    if states is not None:
        sys.exit(f"bench_heal.py: the Slurm nodes are not idle: {states}")
    out = tmp / f"{kind}-{time.monotonic_ns()}.out"
    env = dict(os.environ, VENV=str(BIN.parent), PYTHONPATH=str(ROOT))
    if kind == "raw":
        script = tmp / "raw.sbatch"
        script.write_text(RAW_SBATCH)
        tail = [str(script), __file__, "--job", "raw", "--size", str(len(hosts))]
    else:
        tail = [str(ROOT / "jobs" / "slurm" / "mpimesh.sbatch"), __file__, "--job", kind, "--where", "slurm"]
    cmd = ["sbatch", "--wait", "--quiet", f"--nodes={len(hosts)}", f"--ntasks={SLURM_TASKS}",
           f"--ntasks-per-node={SLURM_PER_NODE}", "--time=5", f"--output={out}", "--job-name=benchheal", *tail]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=str(tmp), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    killed, row = 0.0, {}
    try:
        if kind == "heal":
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and proc.poll() is None:
                if out.exists() and "HEALREADY " in out.read_text(errors="replace"):
                    break
                time.sleep(0.05)
            time.sleep(0.5)  # the call to the node's worker is on its way
            pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", hosts[2]], capture_output=True,
                                                   text=True, timeout=30, check=False).stdout.split()]
            killed = time.monotonic()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        row["error"] = f"timed out after {timeout} s"
        subprocess.run(["scancel", "--full", "--name=benchheal"], timeout=30, check=False)
    finally:
        kill_session(proc.pid)
        proc.wait()
        if kind == "heal":
            subprocess.run(["bash", str(ROOT / ".ci" / "slurm-hosts.sh"), "revive", hosts[2]], capture_output=True,
                           timeout=120, check=False)
    text = out.read_text(errors="replace") if out.exists() else ""
    rows = [json.loads(line[len("HEALROW "):]) for line in text.splitlines() if line.startswith("HEALROW ")]
    if not rows or proc.returncode != 0:  # a handled loss leaves the script's own status
        return {**row, "error": row.get("error", f"status {proc.returncode}"), "output": text[-2000:]}
    row = rows[-1]
    if "answered" in row:
        row["start_s"] = round(row.pop("answered") - started, 4)
    if "caught" in row:
        row["detect_ms"] = round((row.pop("caught") - killed) * 1e3, 1)
        row["kill_to_answer_s"] = round(row.pop("done") - killed, 4)
    row["exit_s"] = round(time.monotonic() - started, 3)
    return row


def _stat(values: list[float]) -> list[float] | None:
    return [round(statistics.median(values), 4), round(min(values), 4), round(max(values), 4)] if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--size", type=int, default=2, help="workers in the mesh (one more rank is the spare)")
    ap.add_argument("--hosts", default="", help="two simulated hosts, e.g. hb1,hb2 (default: this host only)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per job")
    ap.add_argument("--slurm", default="", metavar="PREFIX",
                    help="under the 3-node Slurm of .ci/slurm-hosts.sh on hosts PREFIX1..3 (SLURM_CONF set)")
    ap.add_argument("--job", choices=["heal", "restart", "raw"], help=argparse.SUPPRESS)
    ap.add_argument("--across", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--where", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job == "heal":
        return job_slurm_heal() if args.where == "slurm" else job_heal(args.size, args.across)
    if args.job == "restart":
        return job_restart(args.size, args.across, slurm=args.where == "slurm")
    if args.job == "raw":
        return job_raw(args.size)

    import mpimesh

    compiled = compileall.compile_dir(os.path.dirname(os.path.abspath(mpimesh.__file__)), quiet=1)
    if args.slurm:
        return _main_slurm(args.slurm, args.repeats, args.timeout, bool(compiled))
    hosts = [h for h in args.hosts.split(",") if h]
    launcher, env = _launch(hosts, args.size)
    tail = ["--size", str(args.size)] + (["--across"] if hosts else [])
    mesh = [sys.executable, "-m", "mpimesh", __file__] if hosts else [__file__]
    cmds = {
        "heal": [*launcher, *mesh, "--job", "heal", *tail],
        "restart": [*launcher, *mesh, "--job", "restart", *tail],
        # mpimesh run starts the script under `python -m mpimesh`: the raw job needs the plain launcher
        "raw": ([*launcher, sys.executable, __file__, "--job", "raw", *tail] if hosts else
                [str(BIN / "mpiexec"), "--oversubscribe", "--bind-to", "none", "-n", str(args.size + 2),
                 sys.executable, __file__, "--job", "raw", *tail]),
    }
    found: dict[str, list[dict[str, Any]]] = {k: [] for k in cmds}
    for i in range(args.repeats):
        for kind, cmd in cmds.items():
            row = _job(cmd, env, args.timeout)
            row.update(run=i, kind=kind)
            print(json.dumps(row), flush=True)
            found[kind].append(row)

    def col(kind: str, key: str) -> list[float]:
        return [float(r[key]) for r in found[kind] if key in r]

    heal, restart, raw = col("heal", "heal_s"), col("restart", "start_s"), col("raw", "start_s")
    summary: dict[str, Any] = {
        "bench": "heal_vs_restart", "where": "across hosts " + ",".join(hosts) if hosts else "one host",
        "launcher": "mpiexec --with-ft ulfm (multihost.sh flags)" if hosts else "mpimesh run",
        "ranks": args.size + 2, "mesh": args.size,
        "repeats": args.repeats, "heal_s": _stat(heal), "kill_to_answer_s": _stat(col("heal", "kill_to_answer_s")),
        "detect_ms": _stat(col("heal", "detect_ms")), "restart_s": _stat(restart), "raw_restart_s": _stat(raw),
        "heal_over_restart": round(statistics.median(heal) / statistics.median(restart), 3) if heal and restart
        else None,
        "restart_over_raw": round(statistics.median(restart) / statistics.median(raw), 2) if restart and raw
        else None,
        "errors": sum("error" in r for rows in found.values() for r in rows),
        "bytecode": "precompiled" if compiled else "compileall failed",
        "load1": round(os.getloadavg()[0], 2),
        "mpi_library": next((r["mpi_library"] for r in found["raw"] if "mpi_library" in r), None),
    }
    summary["ok"] = summary["heal_over_restart"] is not None and summary["heal_over_restart"] <= 0.2
    print(json.dumps(summary), flush=True)


def _main_slurm(prefix: str, repeats: int, timeout: float, compiled: bool) -> None:
    """Heal against resubmission under Slurm, each kind ``repeats`` times in turn; JSON rows, then a summary."""
    import tempfile

    if not os.environ.get("SLURM_CONF"):
        sys.exit("bench_heal.py: --slurm needs SLURM_CONF: eval \"$(bash .ci/slurm-hosts.sh env)\"")
    found: dict[str, list[dict[str, Any]]] = {k: [] for k in ("heal", "restart", "raw")}
    loads = []
    with tempfile.TemporaryDirectory(prefix="bench-heal-slurm-") as tmp:
        os.chmod(tmp, 0o755)
        for i in range(repeats):
            for kind in found:
                loads.append(os.getloadavg()[0])
                row = _slurm_job(kind, prefix, Path(tmp), timeout)
                row.update(run=i, kind=kind)
                print(json.dumps(row), flush=True)
                found[kind].append(row)

    def col(kind: str, key: str) -> list[float]:
        return [float(r[key]) for r in found[kind] if key in r]

    heal, restart, raw = col("heal", "heal_s"), col("restart", "start_s"), col("raw", "start_s")
    print(json.dumps({
        "bench": "heal_vs_restart", "where": f"3-node Slurm on simulated hosts {prefix}1..3",
        "launcher": "sbatch + srun --mpi=pmix (jobs/slurm/mpimesh.sbatch; raw: plain srun)",
        "ranks": SLURM_TASKS, "mesh": "one worker a node", "loss": f"every process of {prefix}3 SIGKILLed",
        "repeats": repeats, "heal_s": _stat(heal), "kill_to_answer_s": _stat(col("heal", "kill_to_answer_s")),
        "detect_ms": _stat(col("heal", "detect_ms")), "restart_s": _stat(restart), "raw_restart_s": _stat(raw),
        "heal_over_restart": round(statistics.median(heal) / statistics.median(restart), 4) if heal and restart
        else None,
        "restart_over_raw": round(statistics.median(restart) / statistics.median(raw), 2) if restart and raw
        else None,
        "errors": sum("error" in r for rows in found.values() for r in rows),
        "bytecode": "precompiled" if compiled else "compileall failed",
        "load1": [round(min(loads), 1), round(max(loads), 1)],
    }), flush=True)


if __name__ == "__main__":
    main()
