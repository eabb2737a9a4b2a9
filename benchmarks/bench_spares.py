"""Idle spare CPU (issue #27 item 7: <= 2 %): a launch-pool rank no mesh holds, against a raw mpi4py idle rank.

Run::

    .venv/bin/python benchmarks/bench_spares.py [--seconds 10]

Two jobs on this host, one after the other, each sampling the CPU time
(``/proc/PID/stat`` utime + stime) of its idle rank over ``--seconds``:

* ``mpimesh``: ``mpimesh run -n 3 --spares-per-host 1`` (4 ranks): the
  controller spawns a mesh of 2 workers and calls them once, which leaves
  one spare; the controller samples the spare (its sibling under the same
  PRRTE daemon that is neither itself nor a worker) while the workers idle.
* ``raw``: ``mpiexec -n 2`` of plain mpi4py: rank 1 waits in ``comm.recv``
  for rank 0 (Open MPI's blocking receive polls), rank 0 samples it, then
  sends.  The same launcher, the same MCA settings, in the same run.

Prints one JSON line per job and a last summary line with both figures (CPU
seconds per wall second, in %) and whether the spare is within 2 %.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _common import launch_env, run_bounded

ROOT = Path(__file__).resolve().parents[1]

#: What both jobs run to sample one process's CPU share.
SAMPLER = r'''
import os, time

def cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def siblings(but):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in but:
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getppid():
                        found.append(int(entry))
            except OSError:
                pass
    return found

def share(pid, seconds):
    c0, t0 = cpu(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu(pid) - c0) / (time.monotonic() - t0)
'''

MESH_JOB = SAMPLER + r'''
import json, sys
from mpimesh import Actor, endpoint, this_host

class W(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

seconds = float(sys.argv[1])
procs = this_host().spawn_procs(per_host={"gpus": 2})
ws = procs.spawn("w", W)
workers = list(ws.pid.call().get(60).values())
time.sleep(1.0)  # the spare settles into its idle sleep
spares = siblings([os.getpid(), *workers])
assert len(spares) == 1, spares
print(json.dumps({"job": "mpimesh", "spare_cpu_pct": round(share(spares[0], seconds), 3), "seconds": seconds}))
procs.stop().get(60)
'''

RAW_JOB = SAMPLER + r'''
import json, sys
from mpi4py import MPI

comm = MPI.COMM_WORLD
seconds = float(sys.argv[1])
if comm.rank == 1:
    comm.recv(source=0)
else:
    time.sleep(1.0)
    idle = siblings([os.getpid()])
    assert len(idle) == 1, idle
    print(json.dumps({"job": "raw", "idle_rank_cpu_pct": round(share(idle[0], seconds), 3), "seconds": seconds}))
    comm.send(None, dest=1)
'''


def _run(cmd: list[str], timeout: float) -> dict[str, object]:
    env = launch_env({"PYTHONPATH": str(ROOT)})
    done = run_bounded(cmd, env, timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"{cmd[:6]} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    found: dict[str, object] = json.loads(lines[-1])
    print(json.dumps(found), flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling window of each job")
    args = parser.parse_args()
    bindir = os.path.dirname(sys.executable)
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    mesh_script, raw_script = tmp / f"bench_spares_mesh_{os.getpid()}.py", tmp / f"bench_spares_raw_{os.getpid()}.py"
    mesh_script.write_text(MESH_JOB)
    raw_script.write_text(RAW_JOB)
    try:
        timeout = 120 + 2 * args.seconds
        mesh = _run([sys.executable, "-m", "mpimesh._launch.cli", "run", "-n", "3", "--spares-per-host", "1",
                     "--oversubscribe", str(mesh_script), str(args.seconds)], timeout)
        raw = _run([os.path.join(bindir, "mpiexec"), "-n", "2", "--oversubscribe", "--bind-to", "none",
                    sys.executable, str(raw_script), str(args.seconds)], timeout)
    finally:
        mesh_script.unlink(missing_ok=True)
        raw_script.unlink(missing_ok=True)
    spare, idle = float(str(mesh["spare_cpu_pct"])), float(str(raw["idle_rank_cpu_pct"]))
    print(json.dumps({"bench": "spares_idle", "spare_cpu_pct": spare, "raw_idle_rank_cpu_pct": idle,
                      "target_pct": 2.0, "ok": spare <= 2.0, "seconds": args.seconds}), flush=True)


if __name__ == "__main__":
    main()
