"""RDMABuffer and RDMAAction: one-sided reads and writes, every path, every bad input.

The ``mesh`` tests run the same bodies between the controller and workers,
between two workers, and with the MPI window path forced; the death of an
owner runs in a subprocess (it ends a job without fault tolerance).
"""

from __future__ import annotations

import os
import pickle
import textwrap
import time

import numpy as np
import pytest
import torch
from mpitest import ROOT, mpiexec_cmd, python_cmd, run

from mpimesh import Actor, RDMAAction, RDMABuffer, endpoint, rma
from mpimesh.config import settings

N = 1 << 18  # floats: 1 MiB


class Owner(Actor):
    """Owns a tensor exposed as an RDMABuffer; reads and writes others' buffers."""

    def __init__(self, fill: float = 1.0) -> None:
        self.data = torch.full((N,), fill)
        self.buffer = RDMABuffer(self.data.view(torch.uint8))

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buffer

    @endpoint
    def new_handle(self, fill: float) -> RDMABuffer:
        self.data = torch.full((N,), fill)
        self.buffer = RDMABuffer(self.data.view(torch.uint8))
        return self.buffer

    @endpoint
    def first_last(self) -> tuple[float, float]:
        return float(self.data[0]), float(self.data[-1])

    @endpoint
    def drop(self) -> None:
        self.buffer.drop().get(10)

    @endpoint
    def read(self, handle: RDMABuffer, force: str | None = None) -> tuple[float, str]:
        rma._force = force
        try:
            dst = torch.zeros(handle.size() // 4)
            backend = handle.backend
            handle.read_into(dst.view(torch.uint8)).get(60)
            return float(dst.sum()), backend
        finally:
            rma._force = None

    @endpoint
    def write(self, handle: RDMABuffer, value: float, force: str | None = None) -> None:
        rma._force = force
        try:
            handle.write_from(torch.full((handle.size() // 4,), value).view(torch.uint8)).get(60)
        finally:
            rma._force = None

    @endpoint
    def reaches(self, owner: object, handle: RDMABuffer, bound: float = 20.0) -> bool:
        """Whether this process gets a direct MPI link to ``handle``'s owner (a pull needs one).

        Talking to the owner is what makes one: the controller relays the
        first frames between two islands and brokers their link
        (``MPIMESH_ISLAND_LINKS``), which comes up a few ms later.
        """
        from mpimesh._core import calls

        here = calls.here()
        deadline = time.monotonic() + bound
        while True:
            owner.first_last.call_one().get(30)  # type: ignore[attr-defined]
            if here.pulls.reaches(handle._h.owner):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    @endpoint
    def window(self) -> bool:
        from mpimesh._data import windows as _windows

        return _windows.window() is not None

    @endpoint
    def drop_other(self, handle: RDMABuffer, force: str | None = None) -> None:
        rma._force = force
        try:
            handle.drop().get(10)
        finally:
            rma._force = None


@pytest.fixture(scope="module")
def owners(procs: object) -> object:
    mesh = procs.spawn("owners", Owner, 2.0)  # type: ignore[attr-defined]
    mesh.initialized.get(30)
    return mesh


def fresh(owners: object, rank: int, fill: float) -> RDMABuffer:
    return owners.slice(gpus=rank).new_handle.call_one(fill).get(30)  # type: ignore[attr-defined, no-any-return]


def need_window(owners: object, force: str | None) -> None:
    if force == "window" and not owners.slice(gpus=1).window.call_one().get(30):  # type: ignore[attr-defined]
        pytest.skip("no MPI window on one host (MPIMESH_RMA_WINDOWS=auto); test_mpi_window_path covers it")


# --- the controller reads and writes a worker's buffer ----------------------------------------


@pytest.mark.mesh
def test_controller_reads_a_workers_buffer(owners: object) -> None:
    """read_into copies the whole buffer, one-sidedly, into a tensor of the controller."""
    handle = fresh(owners, 0, 3.0)
    assert handle.size() == 4 * N and handle.owner.startswith("owners[0]@") and handle.backend == "cma"
    dst = torch.zeros(N)
    fut = handle.read_into(dst.view(torch.uint8))
    assert fut.get(30) is None
    assert float(dst.sum()) == 3.0 * N


@pytest.mark.mesh
def test_controller_writes_a_workers_buffer(owners: object) -> None:
    """write_from overwrites the start of the owner's memory; the owner sees it."""
    handle = fresh(owners, 1, 0.0)
    handle.write_from(torch.full((N,), 5.0).view(torch.uint8)).get(30)
    assert owners.slice(gpus=1).first_last.call_one().get(30) == (5.0, 5.0)  # type: ignore[attr-defined]
    handle.write_from(torch.full((8,), 6.0).view(torch.uint8)).get(30)  # a shorter source
    assert owners.slice(gpus=1).first_last.call_one().get(30) == (6.0, 5.0)  # type: ignore[attr-defined]


@pytest.mark.mesh
@pytest.mark.parametrize("kind", ["numpy", "bytearray", "memoryview", "larger"])
def test_destinations_of_every_kind(owners: object, kind: str) -> None:
    """numpy arrays, bytearrays, memoryviews and larger tensors all take a read."""
    handle = fresh(owners, 0, 1.5)
    size = handle.size()
    dst: object = {"numpy": np.zeros(size, np.uint8), "bytearray": bytearray(size),
                   "memoryview": memoryview(bytearray(size)), "larger": torch.zeros(N + 100)}[kind]
    handle.read_into(dst).get(30)
    got = np.frombuffer(dst.numpy() if isinstance(dst, torch.Tensor) else dst, np.float32)  # type: ignore
    assert got[:N].sum() == 1.5 * N


@pytest.mark.mesh
def test_handles_pickle_small_and_describe_themselves(owners: object) -> None:
    """A handle pickles to a few hundred bytes whatever the buffer's size, and says what it is."""
    handle = fresh(owners, 0, 1.0)
    assert len(pickle.dumps(handle)) < 600
    again = pickle.loads(pickle.dumps(handle))
    assert again.size() == handle.size()
    assert repr(handle).startswith("<RDMABuffer 1048576 bytes of cpu memory of owners[0]@")


# --- between workers, and through the MPI window ----------------------------------------------


@pytest.mark.mesh
@pytest.mark.parametrize("force", [None, "window", "pull"])
def test_worker_reads_and_writes_another_workers_buffer(procs: object, owners: object, force: str | None) -> None:
    """A handle passed to another actor works there: same host (cma), or MPI: a read by pull, a write
    through the island's window (each path forced in turn)."""
    need_window(owners, force)
    addrs = procs._addrs  # type: ignore[attr-defined]
    handle = fresh(owners, 0, 4.0)
    reader = owners.slice(gpus=1)  # type: ignore[attr-defined]
    if force == "pull" and addrs[0][0] != addrs[1][0]:
        links = settings.island_links
        if links == "never":
            pytest.skip("the two owners are in different islands (a pool rank and a spawned one) with no direct "
                        "MPI link (MPIMESH_ISLAND_LINKS=never): a pull needs one")
        from mpimesh._transport import peers

        if not peers.enabled():  # auto, not Open MPI: no link will come (waiting for one took 20 s)
            pytest.skip("no direct link between the two islands under this MPI (MPIMESH_ISLAND_LINKS=auto)")
        # A link between islands is made once they talk (auto: under Open MPI only).
        if not reader.reaches.call_one(owners.slice(gpus=0), handle).get(60) and links == "auto":  # type: ignore
            pytest.skip("no direct link between the two islands under this MPI (MPIMESH_ISLAND_LINKS=auto)")
    total, backend = reader.read.call_one(handle, force).get(60)
    same_host = len(set(procs._hosts)) == 1  # type: ignore[attr-defined]
    # One host: a kernel copy (CMA); the owner on another host: MPI.
    assert total == 4.0 * N and backend == ("mpi" if force else ("cma" if same_host else "mpi"))
    reader.write.call_one(handle, 9.0, None if force == "pull" else force).get(60)
    assert owners.slice(gpus=0).first_last.call_one().get(30) == (9.0, 9.0)  # type: ignore[attr-defined]


@pytest.mark.mesh
@pytest.mark.parametrize("force", [None, "window"])
def test_a_holder_can_drop_for_everyone(owners: object, force: str | None) -> None:
    """drop() by a holder invalidates the handle everywhere; the owner frees it on its next registration."""
    need_window(owners, force)
    handle = fresh(owners, 0, 1.0)
    owners.slice(gpus=1).drop_other.call_one(handle, force).get(30)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"^RDMABuffer.read_into: <RDMABuffer .*> was dropped by its owner or a "
                                         r"holder; ask its owner for a new buffer$"):
        handle.read_into(torch.zeros(N)).get(30)


@pytest.mark.mesh
def test_worker_reads_a_controller_buffer(owners: object) -> None:
    """The controller can own buffers too."""
    mine = torch.full((N,), 7.0)
    handle = RDMABuffer(mine.view(torch.uint8))
    assert handle.owner == "controller" or handle.owner.startswith("process ")
    total, _ = owners.slice(gpus=0).read.call_one(handle).get(60)  # type: ignore[attr-defined]
    assert total == 7.0 * N
    dst = torch.zeros(N)
    assert handle.backend == "local"
    handle.read_into(dst).get(10)
    assert float(dst.sum()) == 7.0 * N
    handle.drop().get(10)


# --- RDMAAction ---------------------------------------------------------------------------------


@pytest.mark.mesh
def test_action_reads_and_writes_in_one_submit(owners: object) -> None:
    """A batch of reads and writes on two owners completes as one future, and can be resubmitted."""
    a, b = fresh(owners, 0, 1.0), fresh(owners, 1, 2.0)
    ra, rb = torch.zeros(N), torch.zeros(N)
    action = RDMAAction().read_remote(ra.view(torch.uint8), a).read_remote(rb.view(torch.uint8), b)
    action.submit().get(60)
    assert (float(ra.sum()), float(rb.sum())) == (1.0 * N, 2.0 * N)
    RDMAAction().write_remote(a, torch.full((N,), 8.0).view(torch.uint8)).submit().get(60)
    action.submit().get(60)
    assert float(ra.sum()) == 8.0 * N


def test_action_rejects_races_and_atomics() -> None:
    """Overlapping local memory, or a write with another op on one buffer, is refused; atomics are not supported."""
    handle = pickle.loads(pickle.dumps(_fake_handle()))
    dst = torch.zeros(2 * N)
    action = RDMAAction().read_remote(dst[:N].view(torch.uint8), handle)
    with pytest.raises(ValueError, match=r"^RDMAAction: the local memory of operation 1 \(read\) overlaps that of "
                                         r"operation 0 \(read\), and a read writes it; use separate memory$"):
        action.read_remote(dst[N // 2:N + N // 2].view(torch.uint8), handle)
    with pytest.raises(ValueError, match=r"^RDMAAction: operation 1 \(write\) and operation 0 \(read\) both touch "
                                         r"<RDMABuffer .*>, and one writes it; split them into two actions$"):
        action.write_remote(handle, torch.zeros(4).view(torch.uint8))
    with pytest.raises(TypeError, match=r"^RDMAAction.read_remote: expecting an RDMABuffer as src, got Tensor$"):
        RDMAAction().read_remote(dst, dst)  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match=r"^RDMAAction.fetch_add is not supported; "):
        RDMAAction().fetch_add(handle, dst, 1)
    with pytest.raises(NotImplementedError, match=r"^RDMAAction.compare_and_swap is not supported; "):
        RDMAAction().compare_and_swap(handle, dst, 1, 2)


# --- bad input ------------------------------------------------------------------------------------


def _fake_handle(size: int = 4 * N) -> RDMABuffer:
    """A handle made without a runtime (the checks below run before any transfer)."""
    h = rma._Handle((0, 1), "owners[0]@0.1", "elsewhere", 1, None, 4096, size, "cpu", False, 0, 1, False, 1)
    return rma._rebuild(h)


def test_buffer_refuses_non_contiguous_empty_and_foreign_data() -> None:
    """RDMABuffer() says what it expects and how to get it."""
    with pytest.raises(ValueError, match=r"^RDMABuffer: expecting a contiguous tensor, got shape \(64, 64\) with "
                                         r"strides \(1, 64\); pass tensor.contiguous\(\) \(a copy\) or a "
                                         r"contiguous view such as the flat storage$"):
        RDMABuffer(torch.zeros(64, 64).t())
    with pytest.raises(ValueError, match=r"^RDMABuffer: expecting at least 1 byte, got an empty buffer; wrap memory "
                                         r"with data in it$"):
        RDMABuffer(torch.zeros(0))
    with pytest.raises(TypeError, match=r"^RDMABuffer: expecting a torch.Tensor, memoryview or other buffer, got "
                                        r"str$"):
        RDMABuffer("weights")


def test_destination_too_small_or_unusable() -> None:
    """read_into checks the destination before moving a byte."""
    handle = _fake_handle()
    with pytest.raises(ValueError, match=r"^RDMABuffer.read_into: expecting a destination of at least 1048576 "
                                         r"bytes for <RDMABuffer 1048576 bytes of cpu memory of owners\[0\]@0.1 "
                                         r"\(process 0.1\)>, got 4096 bytes; pass a larger one, e.g. "
                                         r"torch.empty\(1048576, dtype=torch.uint8\)$"):
        handle.read_into(torch.zeros(1024))
    with pytest.raises(ValueError, match=r"^RDMABuffer.read_into: expecting a contiguous tensor, got shape "):
        handle.read_into(torch.zeros(2 * N, 2).t())
    with pytest.raises(ValueError, match=r"^RDMABuffer.read_into: expecting a writable buffer, got a read-only "
                                         r"bytes; "):
        handle.read_into(bytes(4 * N))


def test_source_too_large_and_read_only_buffers() -> None:
    """write_from checks the source, and refuses buffers over read-only memory."""
    handle = _fake_handle(64)
    with pytest.raises(ValueError, match=r"^RDMABuffer.write_from: expecting a source of at most 64 bytes for "
                                         r"<RDMABuffer 64 bytes .*>, got 128 bytes; write a slice of the source, "
                                         r"or expose a larger buffer$"):
        handle.write_from(torch.zeros(32))
    ro = RDMABuffer(memoryview(b"x" * 64))
    try:
        with pytest.raises(ValueError, match=r"^RDMABuffer.write_from: <RDMABuffer 64 bytes .*> exposes read-only "
                                             r"memory; create the RDMABuffer from writable memory to write to it$"):
            ro.write_from(bytearray(8))
        out = bytearray(64)
        ro.read_into(out).get(10)
        assert bytes(out) == b"x" * 64
    finally:
        ro.drop().get(10)


def test_a_dropped_handle_refuses_use() -> None:
    """After drop(), the same handle raises at once; dropping again does nothing."""
    data = torch.ones(16)
    handle = RDMABuffer(data)
    handle.drop().get(10)
    assert handle.drop().get(10) is None
    with pytest.raises(ValueError, match=r"^RDMABuffer.read_into: cannot use <RDMABuffer 64 bytes of cpu memory "
                                         r".*, dropped> after drop\(\); ask its owner for a new buffer$"):
        handle.read_into(torch.zeros(16))
    with pytest.raises(ValueError, match=r"^RDMABuffer.write_from: cannot use .* after drop\(\)"):
        handle.write_from(torch.zeros(16))


@pytest.mark.mesh
def test_reading_a_buffer_its_owner_dropped_fails_cleanly(owners: object) -> None:
    """Another process's copy of a dropped handle fails in the future, without touching freed memory."""
    handle = fresh(owners, 0, 1.0)
    owners.slice(gpus=0).drop.call_one().get(30)  # type: ignore[attr-defined]
    dst = torch.full((N,), -1.0)
    with pytest.raises(ValueError, match=r"^RDMABuffer.read_into: <RDMABuffer .*> was dropped by its owner or a "
                                         r"holder; ask its owner for a new buffer$"):
        handle.read_into(dst).get(30)
    assert float(dst.sum()) == -1.0 * N


def test_no_path_between_hosts_without_a_shared_window() -> None:
    """A buffer on another host outside this island's window has no path, and the error says so."""
    handle = _fake_handle()
    with pytest.raises(ConnectionError, match=r"^no path from process .* to <RDMABuffer .*> on elsewhere: .*; have an "
                                              r"actor in the owner's island \(same ProcMesh, or launched together "
                                              r"under mpiexec\) do the transfer$"):
        handle.read_into(torch.zeros(N))
    assert handle.backend == "none"


OWNER_DIES = textwrap.dedent("""
    import os, signal, sys, torch
    import mpimesh
    from mpimesh import Actor, RDMABuffer, SupervisionError, endpoint, this_host

    mpimesh.unhandled_fault_hook = lambda failure: print("supervised:", failure.mesh_name, flush=True)

    class Owner(Actor):
        def __init__(self):
            self.data = torch.ones(1 << 18)
            self.buffer = RDMABuffer(self.data.view(torch.uint8))

        @endpoint
        def handle(self):
            return self.buffer

        @endpoint
        def die(self):
            os.kill(os.getpid(), signal.SIGKILL)

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    owner = procs.spawn("owner", Owner)
    handle = owner.handle.call_one().get(30)
    dst = torch.zeros(1 << 18)
    handle.read_into(dst).get(30)
    print("before:", float(dst.sum()), flush=True)
    owner.die.call_one()
    try:
        while True:  # the death is seen at once (same host) or within the liveness timeout
            handle.read_into(torch.zeros(1 << 18)).get(30)
    except SupervisionError as exc:
        print("after:", type(exc).__name__, exc, flush=True)
    """)


@pytest.mark.subprocess
@pytest.mark.parametrize("launch", ["spawned", "mpirun2"])
def test_reading_a_buffer_whose_owner_died_raises_supervision_error(tmp_path: object, launch: str) -> None:
    """The owner's death fails the read with SupervisionError (no hang, no garbage), pool or spawned."""
    from mpimesh._transport.mpi import library

    if not library().startswith("Open MPI"):
        pytest.skip("MPICH ends the whole job (controller included) when a process dies")
    script = os.path.join(str(tmp_path), "owner_dies.py")
    with open(script, "w") as f:
        f.write(OWNER_DIES)
    cmd = python_cmd(script) if launch == "spawned" else mpiexec_cmd(2, *python_cmd("-m", "mpimesh", script))
    env = {"MPIMESH_HEARTBEAT_TIMEOUT": "3"}
    result = run(cmd, timeout=90, env=env, cwd=ROOT)
    assert "before: 262144.0" in result.stdout, result.stderr
    expect = "after: SupervisionError the owner of <RDMABuffer 1048576 bytes of cpu memory of owner[0]@"
    assert expect in result.stdout, result.stdout + result.stderr
    assert "has died: " in result.stdout


MPI_PATH = textwrap.dedent("""
    import torch
    from mpimesh._core import current as _current
    from mpimesh import Actor, Channel, RDMABuffer, endpoint, rma, this_host

    N = 1 << 18

    class Peer(Actor):
        def __init__(self):
            self.data = torch.full((N,), 2.0)
            self.buffer = RDMABuffer(self.data.view(torch.uint8))

        @endpoint
        def handle(self):
            return self.buffer

        @endpoint
        def total(self):
            return float(self.data.sum())

        @endpoint
        def access(self, handle, value):
            rma._force = "window"
            dst = torch.zeros(N)
            assert handle.backend == "mpi", handle.backend
            handle.read_into(dst.view(torch.uint8)).get(60)
            handle.write_from(torch.full((N,), value).view(torch.uint8)).get(60)
            handle.drop().get(60)
            try:
                handle.read_into(dst.view(torch.uint8))
            except ValueError as exc:
                dropped = str(exc)
            return float(dst.sum()), dropped

        @endpoint
        def read_late(self, handle, timeout):
            rma._force = "window"
            try:
                handle.read_into(torch.zeros(N).view(torch.uint8), timeout=timeout).get(60)
            except TimeoutError as exc:
                return str(exc)
            return "no timeout"

        @endpoint
        def stall(self, port, seconds):
            import time
            with _current.current().progress.holding():  # no MPI progress in this process meanwhile
                port.send("stalling")
                time.sleep(seconds)

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    peers = procs.spawn("peers", Peer)
    a, b = peers.slice(gpus=0), peers.slice(gpus=1)
    handle = a.handle.call_one().get(30)
    total, dropped = b.access.call_one(handle, 5.0).get(120)
    print("read:", total)
    print("written:", a.total.call_one().get(30))
    print("dropped:", dropped)
    port, receiver = Channel.open()
    h2 = procs.spawn("owner2", Peer).slice(gpus=0)
    handle2 = h2.handle.call_one().get(30)
    h2.stall.call_one(port, 3.0)
    receiver.recv().get(30)
    print("timeout:", b.read_late.call_one(handle2, 0.5).get(60))
    procs.stop().get(60)
    print("done")
    """)


@pytest.mark.subprocess
@pytest.mark.parametrize("launch", ["mpirun3", "spawned"])
def test_mpi_window_path(tmp_path: object, launch: str) -> None:
    """Read, write, drop and time out through the island's dynamic window (MPIMESH_RMA_WINDOWS=always)."""
    script = os.path.join(str(tmp_path), "mpi_path.py")
    with open(script, "w") as f:
        f.write(MPI_PATH)
    cmd = python_cmd(script) if launch == "spawned" else mpiexec_cmd(3, *python_cmd("-m", "mpimesh", script))
    result = run(cmd, timeout=120, env={"MPIMESH_RMA_WINDOWS": "always"}, cwd=ROOT)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert f"read: {2.0 * N}" in out and f"written: {5.0 * N}" in out, out + result.stderr
    assert "dropped: RDMABuffer.read_into: cannot use <RDMABuffer 1048576 bytes of cpu memory of peers[0]@" in out
    assert ("timeout: RDMABuffer.read_into: <RDMABuffer 1048576 bytes of cpu memory of owner2[0]@" in out
            and "not done after 0.5 s through the MPI window; its owner must poll MPI for the transfer to progress: "
            "pass a larger timeout" in out), out
    assert out.rstrip().endswith("done") and result.orphans == []
