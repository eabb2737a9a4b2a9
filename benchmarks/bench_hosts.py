"""X1, X4, X6, X7: B1, B4, B6 and B7 with the controller on one simulated host and the actor on another.

Run (as root, with the simulated hosts of ``.ci/multihost.sh`` up)::

    bash .ci/multihost.sh up 2
    .venv/bin/python benchmarks/bench_hosts.py --runs 3
    .venv/bin/python benchmarks/bench_hosts.py --runs 1 --only x1,x4

Every job runs ``mpiexec $(.ci/multihost.sh flags) --host mh1:1,mh2:K ...``:
rank 0, the controller, on mh1 and the workers on mh2, so the actor is on
the other host and every raw baseline runs between the same two ranks over
the same link (TCP over a veth pair and a bridge), in the same job.

* X1: ``bench_b1.py`` as it is (2 ranks): ``call_one().get()`` round trip
  against a pickled ``send``/``recv`` ping-pong.  Target: <= 3x raw.
* X4: ``bench_b4.py`` as it is (64 MiB float32 tensor; ``transfer_only`` is
  the no-op endpoint) against a 64 MiB ``Send``/``Recv``; and this file's
  ``first`` job: the first call with a 64 MiB tensor after the actor is
  ``initialized``, the steady calls after it, and raw ``Send``/``Recv``;
  and its ``rawfirst`` job: raw mpi4py's own first 64 MiB ``Send`` (into a
  fresh buffer, over an unused link) against its steady ones, in a job of
  its own; and ``rawfirst`` with ``--ready`` (the ``-ready`` rows): the
  connection opened and the receive buffer faulted in before it, as an
  mpimesh worker's are at its first call.  Targets: >= 0.8x raw, first
  <= 2x steady.  ``--only first`` runs these jobs alone with a 32 MiB
  argument (issue 30's measure).  The ``first`` job runs twice: as it
  is, then without the worker's warm receive block
  (``MPIMESH_RECV_WARM_BYTES=0``, the ``-nowarm`` rows); it reports the
  worker's minor page faults in its first two calls.
* X6: ``bench_b6.py`` as it is (``RDMABuffer.read_into`` of 64 MiB against
  ``Win.Allocate`` + ``Get``); and this file's ``rdma`` job: the same reads,
  then as many ``write_from`` of 64 MiB, against a raw ``Send``/``Recv`` of
  64 MiB.  Target: >= 0.8x raw.
* X7: ``bench_b7.py``'s job side as it is, under ``mpiexec --with-ft ulfm``
  with the PRRTE settings ``mpimesh run`` adds, and every pool worker on mh2:
  ``sigkill`` (the controller kills the worker: the hosts share one PID
  namespace) and ``exit1`` (the worker stamps CLOCK_MONOTONIC and calls
  ``os._exit(1)``); ms from the death to the ``SupervisionError``.  Baseline:
  ULFM's own detection, ``bench_b7.py --raw`` across the same hosts.  And
  ``hostloss``: pending calls on both workers of mh2, then every process of
  mh2 killed at once; what the controller sees and how the job ends.
  Targets: SIGKILL <= 0.1 s, any other death <= 2 s.

Each job prints its JSON; this driver prints one ``{"bench": "X..", "run":
i, ...}`` line per job run and, last, one summary line per workload: the
median over runs of each run's median, with ``[min, max]`` over runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
NB = 64 * 1024 * 1024
#: What ``mpimesh run`` adds under ULFM on Open MPI 5.0.9+ (mpimesh/_launch/cli.py ULFM_RUNTIME).
ULFM_RUNTIME = {
    "PRTE_MCA_state_base_error_non_zero_exit": "0",
    "PRTE_MCA_state_base_recoverable": "1",
    "MPIMESH_PMIX_EXIT_STATUS": "1",
}
WORKLOADS = ("x1", "x4", "x6", "x7")


# ---------------------------------------------------------------------------
# the job side (under `python -m mpimesh benchmarks/bench_hosts.py --job ...`)


def job_first(calls: int, nbytes: int = NB) -> None:
    """X4's first call: spawn, wait for ``initialized``, then time each call with a 64 MiB tensor; raw Send/Recv."""
    import _bulk
    import torch
    from mpi4py import MPI

    from mpimesh import Actor, endpoint, host_mesh

    class Sink(Actor):
        @endpoint
        def where(self) -> list[Any]:
            return [MPI.Get_processor_name(), MPI.COMM_WORLD.Get_rank()]

        @endpoint
        def ignore(self, x: Any) -> None:
            return None

        @endpoint
        def faults(self) -> int:
            return minor_faults()

        @endpoint
        def raw_peer(self, nbytes: int, reps: int) -> int:
            return _bulk.sendrecv_peer(MPI.COMM_WORLD, nbytes, reps)

    x = torch.randn(nbytes // 4)
    t0 = time.perf_counter()
    mesh = host_mesh().slice(hosts=1).spawn_procs(per_host={"gpus": 1}).spawn("sink", Sink)
    mesh.initialized.get(60)
    init_s = time.perf_counter() - t0
    one = mesh.slice(gpus=0)
    host, rank = one.where.call_one().get(60)
    times = []
    faults = []  # the worker's minor page faults in each of the first two calls (and a faults() call)
    for i in range(calls):
        before = one.faults.call_one().get(60) if i < 2 else 0
        t = time.perf_counter()
        one.ignore.call_one(x).get(60)
        times.append((time.perf_counter() - t) * 1e3)
        if i < 2:
            faults.append(one.faults.call_one().get(60) - before)
    fut = one.raw_peer.call_one(nbytes, calls)
    raw = [s * 1e3 for s in _bulk.sendrecv_root(MPI.COMM_WORLD, rank, x.view(torch.uint8).numpy(), calls)]
    fut.get(120)
    steady = statistics.median(times[2:])
    print(json.dumps({"actor_host": host, "controller_host": MPI.Get_processor_name(),
                      "spawn_to_initialized_s": round(init_s, 3), "first_ms": round(times[0], 2),
                      "steady_ms": round(steady, 2), "first_over_steady": round(times[0] / steady, 2),
                      "raw_ms": round(statistics.median(raw[2:]), 2),
                      "ratio": round(statistics.median(raw[2:]) / steady, 2),
                      "worker_faults_first": faults[0], "worker_faults_second": faults[1],
                      "calls_ms": [round(t, 1) for t in times]}), flush=True)


def minor_faults() -> int:
    """This process's minor page faults so far (``/proc/self/stat``)."""
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def job_rawfirst(calls: int, nbytes: int = NB, ready: bool = False) -> None:
    """X4's first transfer in raw mpi4py, in a job of its own (plain python): Send/Recv of 64 MiB, each acked.

    Rank 1 receives into one buffer it allocated fresh, as a worker receives
    a first argument into fresh memory, over a link nothing used before.
    With ``ready``, rank 1 first faults its buffer in and answers a 1-byte
    message, and rank 0 waits for that answer before it times: the TCP
    connection is then open and the receiver ready, as an mpimesh worker's
    is at its first call (its start-up frames opened the connection, its
    warm block is faulted in), so what is left is the transfer's own first
    use of the link.
    """
    import _bulk
    import numpy as np
    import torch
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ack = np.empty(1, np.uint8)
    if not ready:
        if comm.Get_rank() == 1:
            _bulk.sendrecv_peer(comm, nbytes, calls)
            return
        x = torch.randn(nbytes // 4)
        raw = [s * 1e3 for s in _bulk.sendrecv_root(comm, 1, x.view(torch.uint8).numpy(), calls)]
    elif comm.Get_rank() == 1:
        # sendrecv_peer's exchange, with a "ready" answer once the buffer is faulted in
        offset = np.empty(1, np.int64)
        comm.Recv(offset, 0, _bulk.BULK_TAG)
        buf = _bulk.aligned(nbytes, int(offset[0]))
        comm.Send(ack, 0, _bulk.BULK_TAG + 1)
        for _ in range(calls):
            comm.Recv(buf, 0, _bulk.BULK_TAG)
            comm.Send(ack, 0, _bulk.BULK_TAG)
        return
    else:
        src = torch.randn(nbytes // 4).view(torch.uint8).numpy()
        comm.Send(np.array([src.ctypes.data % 64], np.int64), 1, _bulk.BULK_TAG)
        comm.Recv(ack, 1, _bulk.BULK_TAG + 1)
        time.sleep(0.3)  # the handshake's segments long acknowledged, as at an mpimesh worker's first call
        raw = []
        for _ in range(calls):
            t0 = time.perf_counter()
            comm.Send(src, 1, _bulk.BULK_TAG)
            comm.Recv(ack, 1, _bulk.BULK_TAG)
            raw.append((time.perf_counter() - t0) * 1e3)
    steady = statistics.median(raw[2:])
    print(json.dumps({"raw_first_ms": round(raw[0], 2), "raw_steady_ms": round(steady, 2),
                      "raw_first_over_steady": round(raw[0] / steady, 2),
                      "raw_ms_each": [round(t, 1) for t in raw]}), flush=True)


def job_rdma(reads: int) -> None:
    """X6 against Send: ``read_into`` of a 64 MiB RDMABuffer owned on the other host, and raw Send/Recv."""
    import _bulk
    import torch
    from mpi4py import MPI

    from mpimesh import Actor, RDMABuffer, endpoint, host_mesh

    class Owner(Actor):
        def __init__(self) -> None:
            self.weights = torch.randn(NB // 4)
            self.buffer = RDMABuffer(self.weights.view(torch.uint8))

        @endpoint
        def handle(self) -> Any:
            return self.buffer

        @endpoint
        def where(self) -> list[Any]:
            return [MPI.Get_processor_name(), MPI.COMM_WORLD.Get_rank()]

        @endpoint
        def raw_peer(self, nbytes: int, reps: int) -> int:
            return _bulk.sendrecv_peer(MPI.COMM_WORLD, nbytes, reps)

    mesh = host_mesh().slice(hosts=1).spawn_procs(per_host={"gpus": 1}).spawn("owner", Owner)
    one = mesh.slice(gpus=0)
    host, rank = one.where.call_one().get(60)
    handle = one.handle.call_one().get(60)
    dst = torch.empty(NB, dtype=torch.uint8)
    times = []
    for _ in range(reads + 2):
        t = time.perf_counter()
        handle.read_into(dst, timeout=120).get(120)
        times.append((time.perf_counter() - t) * 1e3)
    writes = []
    for _ in range(reads + 2):
        t = time.perf_counter()
        handle.write_from(dst, timeout=120).get(120)
        writes.append((time.perf_counter() - t) * 1e3)
    fut = one.raw_peer.call_one(NB, reads + 2)
    raw = [s * 1e3 for s in _bulk.sendrecv_root(MPI.COMM_WORLD, rank, dst.numpy(), reads + 2)]
    fut.get(120)
    ours, base = statistics.median(times[2:]), statistics.median(raw[2:])
    wrote = statistics.median(writes[2:])
    print(json.dumps({"actor_host": host, "backend": handle.backend, "read_ms": round(ours, 2),
                      "raw_send_ms": round(base, 2), "ratio": round(base / ours, 2),
                      "write_ms": round(wrote, 2), "write_ratio": round(base / wrote, 2),
                      "reads_ms": [round(t, 1) for t in times], "writes_ms": [round(t, 1) for t in writes]}),
          flush=True)
    handle.drop().get(60)


def job_hostloss() -> None:
    """Pending calls on every worker of the other host, then that host is killed (by the driver)."""
    from mpi4py import MPI

    import mpimesh
    from mpimesh import Actor, endpoint, host_mesh

    class Sleeper(Actor):
        @endpoint
        def where(self) -> str:
            return MPI.Get_processor_name()

        @endpoint
        def block(self) -> None:
            time.sleep(600)

    failures: list[Any] = []
    mpimesh.unhandled_fault_hook = failures.append
    mesh = host_mesh().slice(hosts=1).spawn_procs(per_host={"gpus": 2}).spawn("victims", Sleeper)
    hosts = mesh.where.call().get(60).values()
    futures = [mesh.slice(gpus=i).block.call_one() for i in range(2)]
    print("KILLHOST " + json.dumps({"hosts": hosts, "t": time.clock_gettime(time.CLOCK_MONOTONIC)}), flush=True)
    for i, fut in enumerate(futures):
        try:
            fut.get(10)
            row = {"outcome": "value"}
        except Exception as exc:
            row = {"outcome": type(exc).__name__, "message": str(exc)}
        row["t"] = time.clock_gettime(time.CLOCK_MONOTONIC)
        print(f"HOSTLOSS{i} " + json.dumps(row), flush=True)
    print("HOSTLOSSEND " + json.dumps({"failures": len(failures)}), flush=True)


# ---------------------------------------------------------------------------
# the driver


def flags() -> list[str]:
    done = subprocess.run(["bash", os.path.join(ROOT, ".ci", "multihost.sh"), "flags"], capture_output=True,
                          text=True, timeout=20, env=dict(os.environ, VENV=os.path.dirname(BIN)))
    if done.returncode != 0:
        raise SystemExit(f"bench_hosts: the simulated hosts are not up ({done.stderr.strip()}); "
                         "run `bash .ci/multihost.sh up 2` (root)")
    return done.stdout.split()


def netns_pids(hosts: list[str]) -> list[int]:
    out: list[int] = []
    for host in hosts:
        done = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True, timeout=10)
        out += [int(p) for p in done.stdout.split()]
    return out


def run(cmd: list[str], timeout: float, hosts: list[str], ft: bool = False, kill_host: str | None = None,
        extra: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one job bounded, in a session of its own; everything it left in the hosts is killed after."""
    from _common import kill_session, launch_env

    env = launch_env({**(ULFM_RUNTIME if ft else {}), **(extra or {})})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH", ""), ROOT) if p)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=HERE, start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    marks: dict[str, float] = {}

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if kill_host and line.startswith("KILLHOST "):
                marks["killed"] = time.clock_gettime(time.CLOCK_MONOTONIC)
                for pid in netns_pids([kill_host]):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for reader in readers:
        reader.start()
    start = time.monotonic()
    try:
        code: int | None = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
    kill_session(proc.pid)
    proc.wait()
    for pid in netns_pids(hosts):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for reader in readers:
        reader.join(5)
    return {"returncode": code, "seconds": time.monotonic() - start, "stdout": "".join(out),
            "stderr": "".join(err), "marks": marks}


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    return None


def prefixed(text: str, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)]


def one_run(what: list[str], fl: list[str], hosts: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    mpiexec = os.path.join(BIN, "mpiexec")
    pair = [mpiexec, *fl, "--host", f"{hosts[0]}:1,{hosts[1]}:1", "-n", "2", sys.executable, "-m", "mpimesh"]
    rows: list[dict[str, Any]] = []

    def job(bench: str, cmd: list[str], timeout: float, **kw: Any) -> dict[str, Any]:
        done = run(cmd, timeout, hosts, **kw)
        got = last_json(done["stdout"]) or {}
        if done["returncode"] != 0 or not got:
            got["error"] = f"status {done['returncode']} after {done['seconds']:.1f} s: {done['stderr'][-800:]}"
        got["bench"] = bench
        return got

    def firsts(bench: str, nbytes: int) -> None:
        # The first call against the steady ones (with the worker's warm receive block, then without:
        # MPIMESH_RECV_WARM_BYTES=0), then raw mpi4py's own first Send in a job of its own.
        size = ["--calls", "12", "--bytes", str(nbytes)]
        for label, warm in (("", None), ("-nowarm", "0")):
            cmd = [*pair[:1], "-x", "MPIMESH_RECV_WARM_BYTES", *pair[1:]] if warm else pair
            first = job(f"{bench}first{label}", [*cmd, __file__, "--job", "first", *size], 300,
                        extra={"MPIMESH_RECV_WARM_BYTES": warm} if warm else None)
            rows.append({k: first.get(k) for k in ("bench", "spawn_to_initialized_s", "first_ms", "steady_ms",
                                                    "first_over_steady", "worker_faults_first",
                                                    "worker_faults_second", "raw_ms", "ratio", "error")})
        # Raw mpi4py's first Send as it comes (the connection opens and the receiver allocates during it), and
        # with both done before it (-ready: what an mpimesh worker's first call finds).
        for label, ready in (("", []), ("-ready", ["--ready"])):
            raw_pair = [*pair[: pair.index("-m")], __file__, "--job", "rawfirst", *size, *ready]
            rawfirst = job(f"{bench}rawfirst{label}", raw_pair, 300)
            rows.append({k: rawfirst.get(k) for k in ("bench", "raw_first_ms", "raw_steady_ms",
                                                       "raw_first_over_steady", "error")})

    if "x1" in what:
        b1 = job("X1", [*pair, "bench_b1.py", "--repeats", "3"], 300)
        rows.append({k: b1.get(k) for k in ("bench", "median_us", "p99_us", "baseline_median_us", "ratio", "error")})
    if "x4" in what:
        b4 = job("X4", [*pair, "bench_b4.py", "--repeats", "3"], 400)
        rows.append({"bench": "X4", "call_with_sum_ms": b4.get("median_ms"),
                     "transfer_only_ms": b4.get("transfer_only_ms"), "raw_ms": b4.get("baseline_median_ms"),
                     "ratio": (round(b4["baseline_median_ms"] / b4["transfer_only_ms"], 2)
                               if b4.get("transfer_only_ms") and b4.get("baseline_median_ms") else None),
                     "error": b4.get("error")})
        firsts("X4", NB)
    if "first" in what:
        firsts("X4-32MiB", 32 << 20)
    if "x6" in what:
        b6 = job("X6", [*pair, "bench_b6.py", "--repeats", "3", "--mpi-reads", "0"], 600)
        rows.append({"bench": "X6", "backend": b6.get("backend"), "read_ms": b6.get("median_ms"),
                     "raw_get_ms": b6.get("baseline_median_ms"), "ratio_vs_get": b6.get("ratio_gbps"),
                     "error": b6.get("error")})
        rd = job("X6send", [*pair, __file__, "--job", "rdma", "--reads", "8"], 600)
        rows.append({k: rd.get(k) for k in ("bench", "backend", "read_ms", "raw_send_ms", "ratio", "write_ms",
                                             "write_ratio", "error")})
    if "x7" in what:
        k = args.x7_workers
        many = [mpiexec, *fl, "--with-ft", "ulfm", "--host", f"{hosts[0]}:1,{hosts[1]}:{k}", "-n", str(k + 1)]
        for mode in ("sigkill", "exit1"):
            done = run([*many, sys.executable, "-m", "mpimesh", "bench_b7.py", "--child", mode, "--rounds", str(k),
                        "--cap", "10"], 300, hosts, ft=True)
            got = prefixed(done["stdout"], "B7ROUND ")
            ms = [g["detect_ms"] for g in got if "detect_ms" in g]
            rows.append({"bench": f"X7{mode}", "rounds": len(got), "detected": len(ms),
                         "median_ms": round(statistics.median(ms), 2) if ms else None,
                         "max_ms": round(max(ms), 2) if ms else None,
                         "outcomes": sorted({g.get("outcome", "?") for g in got}), "status": done["returncode"]})
        done = run([*many, sys.executable, "bench_b7.py", "--raw"], 300, hosts, ft=True)
        got = prefixed(done["stdout"], "B7ROUND ")
        ms = [g["detect_ms"] for g in got if "detect_ms" in g]
        rows.append({"bench": "X7raw", "rounds": len(got), "median_ms": round(statistics.median(ms), 2) if ms else None,
                     "max_ms": round(max(ms), 2) if ms else None})
        done = run([mpiexec, *fl, "--with-ft", "ulfm", "--host", f"{hosts[0]}:1,{hosts[1]}:2", "-n", "3",
                    sys.executable, "-m", "mpimesh", __file__, "--job", "hostloss"], 120, hosts, ft=True,
                   kill_host=hosts[1])
        lost = [prefixed(done["stdout"], f"HOSTLOSS{i} ") for i in range(2)]
        killed = done["marks"].get("killed")
        rows.append({"bench": "X7hostloss", "status": done["returncode"], "seconds": round(done["seconds"], 2),
                     "calls": [(x[0]["outcome"], round((x[0]["t"] - killed) * 1e3, 1) if killed else None)
                               for x in lost if x],
                     "ended_by_launcher": not prefixed(done["stdout"], "HOSTLOSSEND "),
                     "launcher_said": " ".join(line.strip() for line in done["stdout"].splitlines()
                                               if "daemon" in line.lower())[:200]})
    return rows


def summarize(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for rows in runs:
        for row in rows:
            by.setdefault(row["bench"], []).append(row)
    out = []
    for bench, rows in by.items():
        summary: dict[str, Any] = {"bench": bench, "runs": len(rows), "summary": True}
        for key in rows[0]:
            values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)]
            if values and key != "bench":
                summary[key] = [round(statistics.median(values), 2), round(min(values), 2), round(max(values), 2)]
        errors = [r["error"] for r in rows if r.get("error")]
        if errors:
            summary["errors"] = errors
        out.append(summary)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default=",".join(WORKLOADS),
                    help="comma-separated: x1,x4,x6,x7, and first (X4's first call with 32 MiB, alone)")
    ap.add_argument("--bytes", type=int, default=NB, help=argparse.SUPPRESS)
    ap.add_argument("--hosts", default="mh1,mh2")
    ap.add_argument("--x7-workers", type=int, default=6, help="pool workers on the other host per X7 job")
    ap.add_argument("--job", choices=["first", "rawfirst", "rdma", "hostloss"], help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, default=12, help=argparse.SUPPRESS)
    ap.add_argument("--reads", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--ready", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job == "first":
        return job_first(args.calls, args.bytes)
    if args.job == "rawfirst":
        return job_rawfirst(args.calls, args.bytes, args.ready)
    if args.job == "rdma":
        return job_rdma(args.reads)
    if args.job == "hostloss":
        return job_hostloss()
    sys.path.insert(0, HERE)
    what = [w for w in args.only.split(",") if w]
    hosts = args.hosts.split(",")
    fl = flags()
    runs = []
    for i in range(args.runs):
        rows = one_run(what, fl, hosts, args)
        for row in rows:
            print(json.dumps({"run": i, "loadavg_1m": round(os.getloadavg()[0], 2), **row}), flush=True)
        runs.append(rows)
    for row in summarize(runs):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
