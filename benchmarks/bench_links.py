"""Direct links between islands (issue #16 item 4): one actor calling another on a second island.

Run (the caller on the launch pool's rank, the callee on an island the
controller spawns; the raw baseline runs in the same job, between the same
two processes)::

    mpiexec --oversubscribe --bind-to none -n 2 .venv/bin/python -m mpimesh benchmarks/bench_links.py

Across two simulated hosts (the pool's rank on mh2, the spawned island on
the controller's host, mh1)::

    bash .ci/multihost.sh up 2
    mpiexec $(bash .ci/multihost.sh flags) --host mh1:1,mh2:1 -n 2 \\
        .venv/bin/python -m mpimesh benchmarks/bench_links.py

From a plain ``python -m mpimesh`` both ends are spawned islands.

Per repeat, three ways for the same two processes, interleaved:

* ``relay``: the controller relays every frame (``FORWARD``), as with
  ``MPIMESH_ISLAND_LINKS=never``: a fresh pair of processes, with the
  controller's brokering switched off for the measurement;
* ``link``: the same pair once the controller has brokered their direct
  link (``MPI_Comm_accept``/``MPI_Comm_connect``, Open MPI);
* ``raw``: mpi4py alone, in endpoints of the same two actors: the callee
  opens a port and accepts, the caller connects, then ping-pongs
  ``send``/``recv`` of the same small object over that intercommunicator.

Each is ``--calls`` round trips (``call_one(i).get()`` from inside the
caller's actor), timed there; the controller's CPU per round trip is
measured around the loop.  Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from _actors import describe_job
from _common import emit, median, r, ratio, watchdog
from mpi4py import MPI

from mpimesh import Actor, endpoint, host_mesh, this_host
from mpimesh._core.current import current


class Peer(Actor):
    """Both ends: the callee echoes; the caller times round trips to it, through the runtime or raw mpi4py."""

    @endpoint
    def echo(self, i: int) -> int:
        return i

    @endpoint
    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": MPI.Get_processor_name(), "addr": current().addr,
                "spawned": MPI.Comm.Get_parent() != MPI.COMM_NULL}

    @endpoint
    def direct(self) -> list[tuple[int, int]]:
        """The processes this one reaches on a direct link."""
        return current().router.peers()

    @endpoint
    def rounds(self, peer: Any, n: int) -> list[float]:
        """``n`` round trips to ``peer`` (µs each)."""
        out = []
        for i in range(n):
            t0 = time.perf_counter()
            peer.echo.call_one(i).get(30)
            out.append((time.perf_counter() - t0) * 1e6)
        return out

    @endpoint
    def raw_open(self) -> str:
        self.port = MPI.Open_port()
        return self.port

    @endpoint
    def raw_serve(self, n: int) -> None:
        comm = MPI.COMM_SELF.Accept(self.port)
        try:
            for _ in range(n):
                comm.send(comm.recv(source=0), dest=0)
        finally:
            comm.Disconnect()
            MPI.Close_port(self.port)

    @endpoint
    def raw_rounds(self, port: str, n: int) -> list[float]:
        comm = MPI.COMM_SELF.Connect(port)
        out = []
        try:
            for i in range(n):
                t0 = time.perf_counter()
                comm.send(("echo", (i,)), dest=0)
                comm.recv(source=0)
                out.append((time.perf_counter() - t0) * 1e6)
        finally:
            comm.Disconnect()
        return out


def ends(repeats: int) -> tuple[Any, Any]:
    """The caller, on the launch pool's rank of the job's last host (else spawned), and ``repeats`` callees.

    The callees are one island the controller spawns on its own host (a job
    across hosts spawns once: open-mpi/ompi#12601), one process per repeat,
    so that each repeat starts with a pair that has no link yet.
    """
    hosts = host_mesh()
    names = hosts.hostnames
    where = hosts.slice(hosts=len(names) - 1) if len(names) > 1 else this_host()
    caller = where.spawn_procs(per_host={"gpus": 1}).spawn("caller", Peer)
    callees = this_host().spawn_procs(per_host={"gpus": repeats}).spawn("callees", Peer)
    return caller, callees


def timed(caller: Any, callee: Any, calls: int) -> tuple[float, float]:
    """Median round trip (µs) and the controller's CPU per round trip (µs)."""
    cpu0 = time.process_time()
    samples = caller.rounds.call_one(callee, calls).get(600)
    return median(samples), (time.process_time() - cpu0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    watchdog()
    peers = current().peers
    runs: dict[str, list[float]] = {"relay": [], "link": [], "raw": []}
    cpu: dict[str, list[float]] = {"relay": [], "link": []}
    relayed: dict[str, int] = {}
    infos: list[dict[str, Any]] = []
    caller, callees = ends(args.repeats)
    for index in range(args.repeats):
        callee = callees.slice(gpus=index)
        infos = [caller.info.call_one().get(60), callee.info.call_one().get(60)]
        if infos[0]["addr"][0] == infos[1]["addr"][0]:
            raise SystemExit("both ends landed on one island: launch with -n 2 (one pool rank) or -n 1")
        on = peers.on
        peers.on = False  # the relay, as with MPIMESH_ISLAND_LINKS=never
        try:
            caller.rounds.call_one(callee, args.warmup).get(300)
            before = peers.statistics().relayed
            latency, work = timed(caller, callee, args.calls)
            relayed["relay"] = peers.statistics().relayed - before
        finally:
            peers.on = on
        runs["relay"].append(latency)
        cpu["relay"].append(work)
        if on:  # the pair's first relayed frame from now on has the controller broker its link
            caller.rounds.call_one(callee, args.warmup).get(300)
            end = time.monotonic() + 30
            while callee.info.call_one().get(60)["addr"] not in caller.direct.call_one().get(60):
                if time.monotonic() > end:
                    raise SystemExit("no direct link between the islands within 30 s")
                time.sleep(0.01)
            caller.rounds.call_one(callee, args.warmup).get(300)
            before = peers.statistics().relayed
            latency, work = timed(caller, callee, args.calls)
            relayed["link"] = peers.statistics().relayed - before
            runs["link"].append(latency)
            cpu["link"].append(work)
        port = callee.raw_open.call_one().get(60)
        serving = callee.raw_serve.call_one(args.calls + args.warmup)
        samples = caller.raw_rounds.call_one(port, args.calls + args.warmup).get(600)
        serving.get(60)
        runs["raw"].append(median(samples[args.warmup:]))
    med = {k: r(median(v)) if v else None for k, v in runs.items()}
    emit({
        "bench": "links",
        "what": "call_one().get() from an actor to an actor on another island: through the controller's relay, "
                "on a direct link, and raw mpi4py send/recv over an intercommunicator between the same processes",
        "calls": args.calls,
        "repeats": args.repeats,
        "round_trip_us": med,
        "round_trip_us_per_repeat": {k: [r(x) for x in v] for k, v in runs.items()},
        "controller_cpu_us_per_round_trip": {k: r(median(v)) if v else None for k, v in cpu.items()},
        "frames_relayed_in_the_timed_loop": relayed,
        "ratio_link_over_raw": ratio(med["link"], med["raw"]),
        "ratio_relay_over_raw": ratio(med["relay"], med["raw"]),
        "links": "on" if peers.on else f"off here ({os.environ.get('MPIMESH_ISLAND_LINKS', 'auto')})",
        "hosts": sorted({i["host"] for i in infos}),
        "baseline": "raw: mpi4py send/recv of a small tuple over an Open_port/Accept/Connect intercommunicator "
                    "between the same two processes, same job",
        "cores": os.cpu_count(),
        **describe_job(infos),
    })


if __name__ == "__main__":
    main()
