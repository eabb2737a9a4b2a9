"""Can two spawned islands connect directly?  Raw mpi4py, no mpimesh (issue #16 item 4).

Run as a singleton (it spawns its islands):

    .venv/bin/python scripts/islands_feasibility.py
    PATH=$PWD/.venv-mpich/bin:$PATH .venv-mpich/bin/python scripts/islands_feasibility.py

The parent (the "controller") spawns island A and island B (2 processes each,
two separate ``MPI_Comm_spawn`` calls) and brokers ports between them: A's
process opens a port (``MPI_Open_port``) and waits in ``COMM_SELF.Accept``, the
parent passes the port name to B's process, which ``COMM_SELF.Connect``s.
While they connect, a second thread in every island process keeps using MPI
(ping-pong on the island's world), as mpimesh's poller would.

It prints: the time of each connect (both sides), how many ping-pongs the
other thread made meanwhile, the round trip over the new link against the
round trip relayed by the parent, and what a dead peer does to a pending
Accept and to a Connect (each bounded: a hang is reported as such).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

if os.path.exists(os.path.join(sys.prefix, "bin", "prte")):
    # The PyPI Open MPI wheel, set up as mpimesh sets it up (mpimesh/_transport/mpi.py).
    os.environ.setdefault("OPAL_PREFIX", sys.prefix)
    os.environ.setdefault("OMPI_MCA_btl", "^ofi")
    os.environ.setdefault("OMPI_MCA_mpi_ft_enable", "true")
    os.environ.setdefault("PRTE_MCA_state_base_recoverable", "1")
    os.environ.setdefault("PRTE_MCA_state_base_error_non_zero_exit", "0")
os.environ["PATH"] = os.path.join(sys.prefix, "bin") + os.pathsep + os.environ.get("PATH", "")

import mpi4py  # noqa: E402

mpi4py.rc.thread_level = "multiple"
mpi4py.rc.errors = "exception"
from mpi4py import MPI  # noqa: E402

CTL = 1  # tag of control messages on the parent intercommunicator
BG = 2  # tag of the background thread's ping-pong
N_RTT = 2000


def log(*args: object) -> None:
    """Print a line at once."""
    print(*args, flush=True)


# --- island process ------------------------------------------------------------------------------


def island(name: str) -> None:
    """An island process: serve the parent's requests."""
    parent = MPI.Comm.Get_parent()
    world = MPI.COMM_WORLD
    me = world.Get_rank()
    stop = threading.Event()
    count = [0]

    def background() -> None:
        # The island's other thread: ping-pong with the other rank of the island.
        peer = 1 - me
        buf = bytearray(8)
        while not stop.is_set():
            if me == 0:
                world.Send(buf, peer, BG)
                world.Recv(buf, peer, BG)
            else:
                world.Recv(buf, peer, BG)
                world.Send(buf, peer, BG)
            count[0] += 1
            if buf[0]:
                break

    t = threading.Thread(target=background, daemon=True)
    t.start()
    links: dict[str, MPI.Intercomm] = {}
    while True:
        op = parent.recv(source=0, tag=CTL)
        what = op[0]
        if what == "open":
            port = MPI.Open_port()
            parent.send(port, 0, CTL)
            before = count[0]
            t0 = time.perf_counter()
            links[op[1]] = MPI.COMM_SELF.Accept(port)
            parent.send((time.perf_counter() - t0, count[0] - before), 0, CTL)
            MPI.Close_port(port)
        elif what == "open_only":
            port = MPI.Open_port()
            parent.send(port, 0, CTL)
        elif what == "accept_bounded":
            # Accept on a port nobody will connect to, but the parent may, to wake us.
            port = MPI.Open_port()
            parent.send(port, 0, CTL)
            t0 = time.perf_counter()
            try:
                comm = MPI.COMM_SELF.Accept(port)
                result = ("returned", time.perf_counter() - t0)
                comm.Disconnect()
            except MPI.Exception as exc:
                result = ("error", time.perf_counter() - t0, exc.Get_error_string())
            parent.send(result, 0, CTL)
        elif what == "accept_selfwake":
            # Accept in a thread; after 1 s this process connects to its own port to end it.
            port = MPI.Open_port()
            done: list[object] = []

            def accept(port: str = port, done: list[object] = done) -> None:
                t0 = time.perf_counter()
                comm = MPI.COMM_SELF.Accept(port)
                done.append(time.perf_counter() - t0)
                comm.Disconnect()

            th = threading.Thread(target=accept, daemon=True)
            th.start()
            time.sleep(1.0)
            t0 = time.perf_counter()

            def wake(port: str = port, done: list[object] = done) -> None:
                self_ = MPI.COMM_SELF.Dup()
                self_.Connect(port).Disconnect()
                done.append("woken")

            threading.Thread(target=wake, daemon=True).start()
            th.join(5)
            parent.send((done or "still waiting after 5 s", time.perf_counter() - t0), 0, CTL)
        elif what == "connect_bg":
            # Connect in a thread of its own: the main thread goes on serving.
            def connect(port: str = op[2]) -> None:
                try:
                    MPI.COMM_SELF.Connect(port)
                    log(f"{name}{me}: the background Connect returned")
                except MPI.Exception as exc:
                    log(f"{name}{me}: the background Connect failed: {exc.Get_error_string()}")
            threading.Thread(target=connect, daemon=True).start()
            parent.send("started", 0, CTL)
        elif what == "finalize":
            t0 = time.perf_counter()
            MPI.Finalize()
            log(f"{name}{me}: MPI_Finalize returned after {time.perf_counter() - t0:.2f} s")
            os._exit(0)
        elif what == "connect":
            before = count[0]
            t0 = time.perf_counter()
            try:
                links[op[1]] = MPI.COMM_SELF.Connect(op[2])
                result = (time.perf_counter() - t0, count[0] - before)
            except MPI.Exception as exc:
                result = ("error", time.perf_counter() - t0, exc.Get_error_string())
            parent.send(result, 0, CTL)
        elif what == "rtt_direct":
            comm = links[op[1]]
            buf = bytearray(64)
            if op[2]:
                for i in range(N_RTT + 200):
                    if i == 200:
                        t0 = time.perf_counter()
                    comm.Send(buf, 0, 7)
                    comm.Recv(buf, 0, 7)
                parent.send((time.perf_counter() - t0) / N_RTT, 0, CTL)
            else:
                for _ in range(N_RTT + 200):
                    comm.Recv(buf, 0, 7)
                    comm.Send(buf, 0, 7)
        elif what == "rtt_relay":
            buf = bytearray(64)
            if op[1]:
                for i in range(N_RTT + 200):
                    if i == 200:
                        t0 = time.perf_counter()
                    parent.Send(buf, 0, 8)
                    parent.Recv(buf, 0, 8)
                parent.send((time.perf_counter() - t0) / N_RTT, 0, CTL)
            else:
                for _ in range(N_RTT + 200):
                    parent.Recv(buf, 0, 8)
                    parent.Send(buf, 0, 8)
        elif what == "free":
            for comm in links.values():
                comm.Disconnect()
            links.clear()
            parent.send("freed", 0, CTL)
        elif what == "pid":
            parent.send(os.getpid(), 0, CTL)
        elif what == "exit":
            stop.set()
            if me == 0:
                pass
            break
    t.join(0.0)
    world.Barrier() if False else None
    os._exit(0)


# --- parent ---------------------------------------------------------------------------------------


def ask(comm: MPI.Intercomm, rank: int, *op: object) -> None:
    """Send a request to an island process."""
    comm.send(op, rank, CTL)


def answer(comm: MPI.Intercomm, rank: int, timeout: float) -> object:
    """An island process's answer, or None when nothing came within ``timeout``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if comm.iprobe(rank, CTL):
            return comm.recv(source=rank, tag=CTL)
        time.sleep(0.001)
    return None


def relay_rtt(a: MPI.Intercomm, b: MPI.Intercomm) -> float:
    """The round trip A0-B0 with the parent relaying each message, as mpimesh's controller does."""
    ask(a, 0, "rtt_relay", True)
    ask(b, 0, "rtt_relay", False)
    buf = bytearray(64)
    for _ in range(N_RTT + 200):
        a.Recv(buf, 0, 8)
        b.Send(buf, 0, 8)
        b.Recv(buf, 0, 8)
        a.Send(buf, 0, 8)
    return answer(a, 0, 60)  # type: ignore[return-value]


def main() -> None:
    """The parent: spawn two islands, broker their links, report."""
    log(f"library: {MPI.Get_library_version().splitlines()[0].strip()}; thread level {MPI.Query_thread()} "
        f"(MULTIPLE={MPI.THREAD_MULTIPLE})")
    t0 = time.perf_counter()
    a = MPI.COMM_SELF.Spawn(sys.executable, [__file__, "A"], 2)
    log(f"spawn A: {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    b = MPI.COMM_SELF.Spawn(sys.executable, [__file__, "B"], 2)
    log(f"spawn B: {time.perf_counter() - t0:.2f} s")

    # 1. Connect every pair (A i, B j): 4 links, each A's process accepting.
    for i in range(2):
        for j in range(2):
            t0 = time.perf_counter()
            ask(a, i, "open", f"B{j}")
            port = answer(a, i, 30)
            ask(b, j, "connect", f"A{i}", port)
            acc = answer(a, i, 30)
            con = answer(b, j, 30)
            total = time.perf_counter() - t0
            log(f"link A{i}-B{j}: accept {acc[0] * 1e3:.1f} ms (other thread: {acc[1]} ping-pongs meanwhile), "
                f"connect {con[0] * 1e3:.1f} ms ({con[1]} ping-pongs), brokered total {total * 1e3:.1f} ms")

    # 2. Round trips: direct against relayed by the parent.
    ask(a, 0, "rtt_direct", "B0", True)
    ask(b, 0, "rtt_direct", "A0", False)
    direct = answer(a, 0, 60)
    relayed = relay_rtt(a, b)
    log(f"round trip A0-B0, 64 B: direct {direct * 1e6:.1f} us, relayed by the parent {relayed * 1e6:.1f} us")
    # Disconnect is collective over each link: ask everyone first.
    for comm in (a, b):
        for r in range(2):
            ask(comm, r, "free")
    for comm in (a, b):
        for r in range(2):
            answer(comm, r, 30)

    # 3. A pending Accept whose connector never comes: bounded?  Then the parent connects to wake it.
    ask(a, 1, "accept_bounded")
    port = answer(a, 1, 30)
    res = answer(a, 1, 3.0)
    log(f"Accept with no connector after 3 s: {'still waiting' if res is None else res}")
    t0 = time.perf_counter()
    wake = MPI.COMM_SELF.Connect(port)
    wake.Disconnect()
    res = answer(a, 1, 30)
    log(f"the parent connects to the port to wake it: Accept {res}, connect+disconnect "
        f"{(time.perf_counter() - t0) * 1e3:.1f} ms")

    # 4. Connect to a port whose acceptor died before accepting.
    ask(a, 1, "pid")
    pid = answer(a, 1, 30)
    ask(a, 1, "open_only")
    port = answer(a, 1, 30)
    os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
    time.sleep(0.5)
    ask(b, 1, "connect_bg", "A1dead", port)
    answer(b, 1, 30)
    time.sleep(10)
    log("Connect to the port of a killed process: see whether B1 said it returned within 10 s (above)")

    # 4b. B1, with that Connect still pending in one thread, connects to A0 from its main thread.
    ask(a, 0, "open", "B1again")
    port = answer(a, 0, 30)
    ask(b, 1, "connect", "A0again", port)
    acc, con = answer(a, 0, 30), answer(b, 1, 30)
    log(f"B1 with a Connect stuck in another thread connects to A0: accept {acc}, connect {con}")

    # 5. Does the island of the killed process go on?  B0 and A0 still connect.
    t0 = time.perf_counter()
    ask(a, 0, "open", "B0again")
    port = answer(a, 0, 30)
    ask(b, 0, "connect", "A0again", port)
    acc, con = answer(a, 0, 30), answer(b, 0, 30)
    log(f"after the kill, A0-B0 connect again: accept {acc}, connect {con}")
    ask(b, 1, "pid")
    pid = answer(b, 1, 30)
    ask(b, 1, "finalize")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 15 and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.05)
    gone = not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    log(f"B1 (a Connect stuck in a thread) asked to MPI_Finalize: {'exited' if gone else 'still running after 15 s'}")
    if not gone:
        os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
    # Last (it may wedge the process): B0 ends its own pending Accept by connecting to its port.
    ask(b, 0, "accept_selfwake")
    res = answer(b, 0, 30)
    log(f"a process ends its own pending Accept by connecting to its port from another thread: {res}")
    ask(b, 0, "pid")
    log(f"... and then answers the parent: {answer(b, 0, 5) is not None}")
    for comm, ranks in ((a, [0]), (b, [0])):
        for r in ranks:
            ask(comm, r, "exit")
    log("done (the parent exits hard)")
    os._exit(0)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        island(sys.argv[1])
    else:
        main()
