"""B16 (issue #16): casts down a tree against casts to each actor, and MPI's own trees, N = 1 ... 64.

Run (64 workers from the launch pool, oversubscribed on a small machine)::

    mpiexec --oversubscribe --bind-to none -n 65 .venv/bin/python -m mpimesh benchmarks/bench_b16.py

For each size N (``--sizes``): ``spawn_procs(per_host={"gpus": N})``, one
actor per process, then per repeat, in the same job on the same processes:

* ``call().get()`` of a no-op, each cast to every actor from the controller
  (``direct``: what mpimesh did before trees) and down a tree of fan-out
  ``MPIMESH_CAST_FANOUT`` with replies gathered up the tree (``tree``):
  median latency and the controller's CPU per call (``time.process_time``,
  all its threads, the waiting thread's polling included);
* the raw baselines: mpi4py pickled ``send`` to each rank then ``recv`` from
  each (``raw_fanout``, a hand-written controller) and ``bcast`` + ``gather``
  on a communicator of the same ranks (``raw_collective``, MPI's own trees).

At N = ``--big-size``: a ``--big-mib`` MiB tensor argument to a no-op
endpoint on every actor (mpimesh's own choice, ``default``: direct when every
actor runs on the controller's host; direct; tree with the default fan-out;
tree with fan-out 2) against ``MPI.Bcast`` of the same bytes on the same ranks.

The switch between direct and tree is the controller's
``MPIMESH_CAST_TREE_MIN`` (and ``MPIMESH_CAST_FANOUT``), set here between
measurements; forwarders take the fan-out from each cast.  Last, a model of
a cast's cost (messages and bytes per process, depth, controller CPU per
call: a fit of the measured points) is extrapolated to 4,096 processes.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import operator
import os
import pickle
import time
from typing import Any

from _actors import Bench, describe_job, raw_collective, raw_fanout
from _common import emit, median, r, ratio, summary_us, watchdog

import mpimesh._core.progress as _progress
from mpimesh import host_mesh, this_host
from mpimesh._core.current import current
from mpimesh._core.multicast import split
from mpimesh.config import settings


def use(tree_min: int, fanout: int, near: int = 0) -> None:
    """The controller's tree settings from now on (benchmark only: the settings are frozen for users).

    ``near``: ``MPIMESH_CAST_NEAR_DIRECT``; 0 (the default here) keeps large casts on the tree
    even when every actor runs on the controller's host, so that ``tree`` measures the tree.
    """
    object.__setattr__(settings, "cast_tree_min", tree_min)
    object.__setattr__(settings, "cast_fanout", fanout)
    object.__setattr__(settings, "cast_near_direct", near)


class Meter:
    """The controller's work per call: issuing it, and the polls that received something (benchmark only).

    A waiting thread spins after each message (``MPIMESH_SPIN_US``, a latency
    choice), and with 64 workers oversubscribed on a few cores a call takes
    milliseconds: the spin, not the call, would fill the CPU time.  While a
    meter is on, the progress engine polls with no probe inside MPI (each
    poll returns at once, ``progress._SPIN_CHUNK = 0``) and the meter adds up
    the thread CPU time of every poll that received frames (receiving,
    unpickling, dispatching, settling the future); :func:`worked` adds the
    CPU time of issuing each call.  Polls that found nothing, and the waiting
    loop around them, are left out.
    """

    def __init__(self) -> None:
        self.engine = current().progress
        self.poll = self.engine._poll
        self.busy = 0.0
        self.chunk = _progress._SPIN_CHUNK

    def __enter__(self) -> Meter:
        _progress._SPIN_CHUNK = 0.0
        object.__setattr__(self.engine, "_poll", self._metered)
        return self

    def __exit__(self, *exc: object) -> None:
        object.__setattr__(self.engine, "_poll", self.poll)
        _progress._SPIN_CHUNK = self.chunk

    def _metered(self, spin: float = 0.0) -> int:
        t0 = time.thread_time()
        handled: int = self.poll(spin)
        if handled:
            self.busy += time.thread_time() - t0
        return handled


def worked(mesh: Any, n: int, how: str) -> float:
    """The controller's work (µs of CPU, waiting excluded) per call, over ``n`` calls (see :class:`Meter`)."""
    issue = 0.0
    with Meter() as meter:
        for _ in range(n):
            t0 = time.thread_time()
            fut = mesh.noop.reduce(operator.add, 1) if how == "reduce" else mesh.noop.call(1)
            issue += time.thread_time() - t0
            fut.get(120)
    return (issue + meter.busy) / n * 1e6


def timed(mesh: Any, n: int, *args: Any, how: str = "call") -> tuple[dict[str, float], float]:
    """``n`` no-op calls on the whole mesh: latency summary (µs) and controller CPU µs per call.

    ``how``: ``call`` (a ValueMesh of the N replies) or ``reduce`` (their
    sum, folded in the tree: ``endpoint.reduce(operator.add)``).
    """
    clock = time.perf_counter_ns
    out = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = clock()
        if args:
            mesh.take.call(*args).get(300)
        elif how == "reduce":
            mesh.noop.reduce(operator.add, 1).get(120)
        else:
            mesh.noop.call(1).get(120)
        out.append(clock() - t0)
    return summary_us(out), (time.process_time() - cpu0) / n * 1e6


def depth(n: int, fanout: int) -> int:
    """Hops from the caller to the deepest of ``n`` destinations, as ``multicast`` splits them.

    The caller sends to the first of each part; each of those forwards the
    rest of its part the same way.
    """
    if n == 0:
        return 0
    parts = split([(i, (0, i), 0) for i in range(n)], fanout)
    return max(1 + depth(len(part) - 1, fanout) for part in parts)


def fit(points: dict[int, float]) -> tuple[float, float]:
    """Least squares ``cpu = a + b * N`` over the measured ``N -> cpu`` points."""
    xs, ys = list(points), list(points.values())
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs) or 1.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    return my - b * mx, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fanout", type=int, default=settings.cast_fanout)
    ap.add_argument("--big-size", type=int, default=16)
    ap.add_argument("--big-mib", type=int, default=64)
    ap.add_argument("--big-calls", type=int, default=5)
    ap.add_argument("--hosts", action="store_true",
                    help="spread each mesh over every host of the job (host_mesh()), not the controller's")
    args = ap.parse_args()
    watchdog(float(os.environ.get("BENCH_WATCHDOG_S", "1500")))

    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, Any] = {}
    big: dict[str, Any] = {}
    job = None
    for k in sizes:
        if args.hosts:
            # every host of the job takes an equal share: the trees span the hosts
            hosts = host_mesh()
            per = max(1, k // len(hosts))
            procs = hosts.spawn_procs(per_host={"gpus": per})
        else:
            procs = this_host().spawn_procs(per_host={"gpus": k})
        mesh = procs.spawn(f"b16_{k}", Bench)
        infos = mesh.info.call().get(300).values()
        job = describe_job(infos)
        pool = not any(i["spawned"] for i in infos)
        ranks = [i["world_rank"] for i in infos]
        rows: dict[str, list[Any]] = {m: [] for m in ("direct", "tree", "reduce", "raw_fanout", "raw_collective")}
        work: dict[str, list[float]] = {m: [] for m in ("direct", "tree", "reduce")}
        for _ in range(args.repeats):
            for mode, tree_min, how in (("direct", 1 << 30, "call"), ("tree", 2, "call"), ("reduce", 2, "reduce")):
                use(tree_min, args.fanout)
                timed(mesh, args.warmup, how=how)
                rows[mode].append(timed(mesh, args.calls, how=how))
                work[mode].append(worked(mesh, args.calls, how))
            if pool:
                ns, cpu = raw_fanout(mesh, ranks, args.warmup + args.calls)
                rows["raw_fanout"].append((summary_us(ns[args.warmup:]), cpu / (args.warmup + args.calls) * 1e6))
                ns, cpu = raw_collective(mesh, ranks, args.warmup + args.calls)
                rows["raw_collective"].append((summary_us(ns[args.warmup:]),
                                               cpu / (args.warmup + args.calls) * 1e6))
        results[str(k)] = {
            mode: {"median_us": r(median(s["median_us"] for s, _ in got)),
                   "controller_cpu_us_per_call": r(median(c for _, c in got)),
                   **({"controller_work_us_per_call": r(median(work[mode]))} if work.get(mode) else {})}
            for mode, got in rows.items() if got
        }
        if k == args.big_size:
            import torch

            nbytes = args.big_mib << 20
            t = torch.ones(nbytes // 4, dtype=torch.float32)
            # default: mpimesh's own choice (MPIMESH_CAST_TREE_MIN=16, MPIMESH_CAST_NEAR_DIRECT=1 MiB)
            for mode, tree_min, fanout, near in (
                ("default", 16, args.fanout, 1 << 20), ("direct", 1 << 30, args.fanout, 0),
                ("tree", 2, args.fanout, 0), ("tree_fanout_2", 2, 2, 0),
            ):
                use(tree_min, fanout, near)
                timed(mesh, 1, t)
                big[mode] = r(median(timed(mesh, 1, t)[0]["median_us"] for _ in range(args.big_calls)) / 1e3)
            if pool:
                ns, _ = raw_collective(mesh, ranks, 1 + args.big_calls, nbytes)
                big["raw_bcast"] = r(median(ns[1:]) / 1e6)
                for mode in ("default", "direct", "tree", "tree_fanout_2"):
                    big[f"{mode}_ratio"] = ratio(big[mode], big["raw_bcast"])
        use(16, args.fanout)
        procs.stop().get(300)

    # The model: a cast and its replies, per process, for N destinations.
    entry = len(pickle.dumps([(r_, (0, r_ + 1), 1) for r_ in range(1000)], protocol=5)) / 1000
    tree_cpu = {int(k): v["tree"]["controller_work_us_per_call"] for k, v in results.items()}
    direct_cpu = {int(k): v["direct"]["controller_work_us_per_call"] for k, v in results.items()}
    reduce_cpu = {int(k): v["reduce"]["controller_work_us_per_call"] for k, v in results.items()}
    (ta, tb), (da, db), (ra, rb) = fit(tree_cpu), fit(direct_cpu), fit(reduce_cpu)
    model = {
        "fanout": args.fanout,
        "cpu_fit_us": {"tree": [r(ta), r(tb)], "direct": [r(da), r(db)], "reduce": [r(ra), r(rb)],
                       "form": "a + b * N", "of": "controller_work_us_per_call"},
        "bytes_per_entry": r(entry),
        "points": {
            str(n): {
                "depth": depth(n, args.fanout),
                "controller_messages_tree": 2 * min(n, args.fanout),
                "controller_messages_direct": 2 * n,
                "forwarder_messages_max": 2 * (args.fanout + 1),
                "controller_header_bytes_tree": r(entry * n),
                "controller_cpu_us_tree": r(ta + tb * n),
                "controller_cpu_us_direct": r(da + db * n),
                "controller_cpu_us_reduce": r(ra + rb * n),
                "measured_cpu_us_tree": tree_cpu.get(n),
                "measured_cpu_us_direct": direct_cpu.get(n),
                "measured_cpu_us_reduce": reduce_cpu.get(n),
            }
            for n in sorted({*tree_cpu, 256, 1024, 4096})
        },
    }
    record = {
        "bench": "B16",
        "what": "call().get() of a no-op on meshes of N actors: casts to each actor vs down a tree, "
        "and MPI's own trees; a large tensor argument to N actors vs MPI.Bcast",
        "calls": args.calls,
        "repeats": args.repeats,
        "sizes": results,
        "large": big,
        "model": model,
        "target_cpu_ratio_64_over_1": {
            mode: ratio(cpu[64], cpu[1]) if 1 in cpu and 64 in cpu else None
            for mode, cpu in (("tree", tree_cpu), ("reduce", reduce_cpu), ("direct", direct_cpu))
        },
        "baseline": "raw_fanout: mpi4py pickled send to each rank, then recv from each; raw_collective: "
        "bcast + gather on a communicator of the same ranks; raw_bcast: MPI.Bcast of the same bytes + "
        "Barrier; same job, same processes",
        "cores": os.cpu_count(),
    }
    record.update(job or {})
    emit(record)


if __name__ == "__main__":
    main()
