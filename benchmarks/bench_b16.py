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
* the controller's own work per call, *replayed* (:func:`replayed`): the
  exact frames of one real call, issued and received again with the
  workers idle, so that the figure is the controller's code, not the cache
  misses that 64 processes sharing its two cores cause (:func:`cold`
  measures those); the raw baseline's counterpart pickles a message to each
  rank and unpickles a reply from each (``raw_fanout``).

At N = ``--big-size``: a ``--big-mib`` MiB tensor argument to a no-op
endpoint on every actor (mpimesh's own choice, ``default``: direct when every
actor runs on the controller's host; direct; tree with the default fan-out;
tree with fan-out 2) against ``MPI.Bcast`` of the same bytes on the same ranks.

The switch between direct and tree is the controller's
``MPIMESH_CAST_TREE_MIN`` (and ``MPIMESH_CAST_FANOUT``,
``MPIMESH_CAST_ROOT_FANOUT``: ``--root-fanout``), set here between
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
from mpimesh._core.entries import pack
from mpimesh._core.multicast import split
from mpimesh._core.protocol import Kind
from mpimesh.config import settings


def use(tree_min: int, fanout: int, near: int = 0, root: int | None = None) -> None:
    """The controller's tree settings from now on (benchmark only: the settings are frozen for users).

    ``near``: ``MPIMESH_CAST_NEAR_DIRECT``; 0 (the default here) keeps large casts on the tree
    even when every actor runs on the controller's host, so that ``tree`` measures the tree.
    """
    object.__setattr__(settings, "cast_tree_min", tree_min)
    object.__setattr__(settings, "cast_fanout", fanout)
    object.__setattr__(settings, "cast_near_direct", near)
    if root is not None:
        object.__setattr__(settings, "cast_root_fanout", root)


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


def issue(mesh: Any, how: str) -> Any:
    """One no-op call to the whole mesh: ``call`` (a ValueMesh) or ``reduce`` (folded in the tree)."""
    return mesh.noop.reduce(operator.add, 1) if how == "reduce" else mesh.noop.call(1)


def replayed(mesh: Any, n: int, how: str) -> float:
    """The controller's own work per call (µs of CPU), replayed warm, with no worker running.

    On a cluster the controller has a core of its own.  Here 64 workers share
    two cores with it, and after each call the controller's caches are cold:
    an array operation that takes 2 µs in a loop takes 40-100 µs of CPU right
    after a call at N = 64 (:func:`cold`).  So this replays, in the same job,
    exactly what the controller does for one call: it records the REPLY
    frames of one real call (their pickles), then ``n`` times issues the call
    with every frame it sends pickled and dropped (the send itself, one per
    child of the controller, is left out) and hands it the recorded replies,
    unpickled, as the pump would, and takes the result (``get``).  The
    workers never see these calls: the sequence numbers are put back after.
    """
    rt = current()
    reply = Kind.REPLY
    handler = rt.dispatch[reply]
    ports = rt.ports
    opened: list[int] = []
    real_open = ports.open

    def tracked(receiver: Any) -> int:
        pid: int = real_open(receiver)
        opened.append(pid)
        return pid

    seen: list[tuple[Any, bytes]] = []

    def record(src: Any, frame: Any, buffers: list[Any]) -> None:
        if opened and frame[2] == opened[-1]:
            assert not buffers, "a no-op's replies carry no raw buffers"
            seen.append((src, pickle.dumps(frame, protocol=5)))
        handler(src, frame, buffers)

    ports.open = tracked  # type: ignore[method-assign]
    rt.dispatch[reply] = record
    try:
        issue(mesh, how).get(120)
    finally:
        rt.dispatch[reply] = handler
    assert seen, "no reply recorded"

    # Idle workers nap 1 ms at a time, then 8 ms after 0.5 s without traffic: 64 of them waking every
    # millisecond on two cores would still cool the controller's caches.
    time.sleep(0.6)
    multicast = rt.multicast
    numbers = None if multicast._last is None else multicast._last.copy()
    router = rt.router
    loads, dumps = pickle.loads, pickle.dumps

    def dropped(dest: Any, frame: Any, buffers: Any = ()) -> None:
        dumps(frame, protocol=5)

    router.send = dropped  # type: ignore[method-assign]
    try:
        t0 = time.thread_time()
        for _ in range(n):
            fut = issue(mesh, how)
            pid = opened[-1]
            for src, wire in seen:
                frame = loads(wire)
                handler(src, (*frame[:2], pid, *frame[3:]), [])
            fut.get(0)
        spent = time.thread_time() - t0
    finally:
        del router.send
        del ports.open
        if numbers is not None:
            multicast._last[:len(numbers)] = numbers  # type: ignore[index]
    return spent / n * 1e6


def replayed_raw(n: int, calls: int) -> float:
    """What a hand-written mpi4py controller pickles per call (µs of CPU): a message to each of ``n`` ranks, a
    reply from each (mpi4py's ``send``/``recv`` pickle with protocol 5), the MPI calls left out as above."""
    message = ("noop", (1,), {})
    wire = pickle.dumps(1, protocol=5)
    t0 = time.thread_time()
    for _ in range(calls):
        for _ in range(n):
            pickle.dumps(message, protocol=5)
        [pickle.loads(wire) for _ in range(n)]
    return (time.thread_time() - t0) / calls * 1e6


def cold(mesh: Any, n: int) -> dict[str, float]:
    """A fixed piece of work (µs of CPU): in a loop, and right after each of ``n`` calls to the whole mesh."""
    work = [(i, (0, i), i) for i in range(256)]

    def piece() -> None:
        pickle.loads(pickle.dumps(work, protocol=5))

    t0 = time.thread_time()
    for _ in range(200):
        piece()
    warm = (time.thread_time() - t0) / 200
    after = []
    for _ in range(n):
        mesh.noop.call(1).get(120)
        t0 = time.thread_time()
        piece()
        after.append(time.thread_time() - t0)
    return {"warm_us": r(warm * 1e6), "after_a_call_us": r(median(after) * 1e6)}


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


def depth(n: int, fanout: int, root: int | None = None) -> int:
    """Hops from the caller to the deepest of ``n`` destinations, as ``multicast`` splits them.

    The caller sends to the first of each of ``root`` parts (default
    ``fanout``); each of those forwards the rest of its part in ``fanout``
    parts, and so on.
    """
    if n == 0:
        return 0
    parts = split([(i, (0, i), 0) for i in range(n)], fanout if root is None else root)
    return max(1 + depth(len(part) - 1, fanout) for part in parts)


def fit(points: dict[int, float]) -> tuple[float, float]:
    """Least squares ``cpu = a + b * N`` over the measured ``N -> cpu`` points."""
    xs, ys = list(points), list(points.values())
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs) or 1.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var
    return my - b * mx, b


def _with_mpi(results: dict[str, Any]) -> float | None:
    if "1" not in results or "64" not in results:
        return None
    one = results["1"]
    mpi = one["direct"]["controller_work_us_per_call"] - one["replayed_work_us_per_call"]["direct"]
    if mpi <= 0:
        return None
    return ratio(results["64"]["replayed_work_us_per_call"]["tree"] + mpi,
                 one["replayed_work_us_per_call"]["direct"] + mpi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--replay-calls", type=int, default=2000,
                    help="calls per repeat of the replayed controller work (each a few µs)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fanout", type=int, default=settings.cast_fanout)
    ap.add_argument("--root-fanout", type=int, default=settings.cast_root_fanout,
                    help="MPIMESH_CAST_ROOT_FANOUT: the controller's children in a tree")
    ap.add_argument("--big-size", type=int, default=16)
    ap.add_argument("--big-mib", type=int, default=64)
    ap.add_argument("--big-calls", type=int, default=5)
    ap.add_argument("--hosts", action="store_true",
                    help="spread each mesh over every host of the job (host_mesh()), not the controller's")
    args = ap.parse_args()
    watchdog(float(os.environ.get("BENCH_WATCHDOG_S", "1500")))

    sizes = [int(s) for s in args.sizes.split(",")]
    use(settings.cast_tree_min, args.fanout, settings.cast_near_direct, args.root_fanout)
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
        replay: dict[str, float] = {}
        for mode, tree_min, how in (("direct", 1 << 30, "call"), ("tree", 2, "call"), ("reduce", 2, "reduce")):
            use(tree_min, args.fanout)
            replayed(mesh, args.warmup, how)
            replay[mode] = r(median(replayed(mesh, args.replay_calls, how) for _ in range(args.repeats)))
        replay["raw_fanout"] = r(median(replayed_raw(k, args.replay_calls) for _ in range(args.repeats)))
        results[str(k)]["replayed_work_us_per_call"] = replay
        results[str(k)]["cold_cache"] = cold(mesh, 20)
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
    entry = len(pack([(r_, (0, r_ + 1), 1) for r_ in range(1000)])) / 1000
    tree_cpu = {int(k): v["tree"]["controller_work_us_per_call"] for k, v in results.items()}
    direct_cpu = {int(k): v["direct"]["controller_work_us_per_call"] for k, v in results.items()}
    reduce_cpu = {int(k): v["reduce"]["controller_work_us_per_call"] for k, v in results.items()}
    replay_cpu = {int(k): v["replayed_work_us_per_call"] for k, v in results.items()}
    (pa, pb) = fit({n: v["tree"] for n, v in replay_cpu.items()})
    (ta, tb), (da, db), (ra, rb) = fit(tree_cpu), fit(direct_cpu), fit(reduce_cpu)
    model = {
        "fanout": args.fanout,
        "cpu_fit_us": {"tree": [r(ta), r(tb)], "direct": [r(da), r(db)], "reduce": [r(ra), r(rb)],
                       "replayed_tree": [r(pa), r(pb)],
                       "form": "a + b * N", "of": "controller_work_us_per_call"},
        "bytes_per_entry": r(entry),
        "points": {
            str(n): {
                "depth": depth(n, args.fanout, args.root_fanout),
                "controller_messages_tree": 2 * min(n, args.root_fanout),
                "controller_messages_direct": 2 * n,
                "forwarder_messages_max": 2 * (args.fanout + 1),
                "controller_header_bytes_tree": r(entry * n),
                "controller_cpu_us_tree": r(ta + tb * n),
                "controller_cpu_us_direct": r(da + db * n),
                "controller_cpu_us_reduce": r(ra + rb * n),
                "replayed_cpu_us_tree": r(pa + pb * n),
                "measured_replayed_cpu_us_tree": replay_cpu[n]["tree"] if n in replay_cpu else None,
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
        "target_replayed_ratio_64_over_1": {
            mode: ratio(replay_cpu[64][mode], replay_cpu[1][mode]) if 1 in replay_cpu and 64 in replay_cpu else None
            for mode in ("tree", "reduce", "direct", "raw_fanout")
        },
        # The replay leaves out the MPI calls: one send and one receive per call at N = 1 and, with a
        # root fan-out of 1, at N = 64 too.  Their cost, as this run measured it at N = 1 (the metered
        # work less the replayed), added to both sides:
        "target_replayed_ratio_with_one_send_receive": _with_mpi(results),
        "root_fanout": args.root_fanout,
        "baseline": "raw_fanout: mpi4py pickled send to each rank, then recv from each; raw_collective: "
        "bcast + gather on a communicator of the same ranks; raw_bcast: MPI.Bcast of the same bytes + "
        "Barrier; same job, same processes",
        "cores": os.cpu_count(),
    }
    record.update(job or {})
    emit(record)


if __name__ == "__main__":
    main()
