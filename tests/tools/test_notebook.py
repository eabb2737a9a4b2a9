"""A Jupyter kernel as the controller: the example notebook, interrupts, and the kernel's end (issue #17).

Each test starts a real kernel of this interpreter (``ipykernel``, through a
kernelspec in a temporary folder) whose environment carries a unique
``MPIMESH_TEST_TAG``: every process the kernel starts (the singleton's PRRTE
daemon, the spawned workers) inherits it, so :func:`mpitest.leftovers` finds
them whoever their parent is now.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from mpitest import ROOT, base_env, leftovers

pytestmark = pytest.mark.subprocess

NOTEBOOK = ROOT / "examples" / "notebook.ipynb"
KERNEL = "mpimesh-test"
#: Seconds a cell may take (a spawn on a loaded 2-core machine takes a few).
CELL_TIMEOUT = 90.0
#: Seconds every process of a kernel may take to go once the kernel is ended.
GONE_BOUND = 30.0


@dataclass
class Kernel:
    """A running kernel, its client and the tag its processes carry."""

    km: KernelManager
    kc: Any
    tag: str
    #: where the kernel's cells leave files (``NOTEBOOK_TEST_FOLDER``)
    folder: Path
    #: stdout/stderr text of each cell, by message id
    outputs: dict[str, list[str]] = field(default_factory=dict)

    def execute(self, code: str) -> str:
        """Send ``code`` for execution; returns its message id (does not wait)."""
        msg_id: str = self.kc.execute(code)
        return msg_id

    def until(self, msg_id: str, *, text: str | None = None, timeout: float = CELL_TIMEOUT) -> dict[str, Any]:
        """IOPub messages of ``msg_id`` until ``text`` appears in its output, or until it is idle.

        Returns:
            The cell's error content (``ename``, ``evalue``, ``traceback``), or ``{}`` if none so far.

        Raises:
            AssertionError: not there within ``timeout``.
        """
        end = time.monotonic() + timeout
        error: dict[str, Any] = {}
        out = self.outputs.setdefault(msg_id, [])
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"cell {msg_id} not done within {timeout:g} s; output: {''.join(out)!r}")
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except Exception:  # queue.Empty: the loop's bound reports it
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
                if text is not None and text in "".join(out):
                    return error
            elif kind == "error":
                error = content
            elif kind == "status" and content["execution_state"] == "idle" and text is None:
                return error

    def run(self, code: str) -> str:
        """Run ``code`` to its end; returns its output, failing with the traceback on an error."""
        msg_id = self.execute(code)
        error = self.until(msg_id)
        assert not error, "\n".join(error["traceback"])
        return "".join(self.outputs[msg_id])

    def processes(self) -> dict[int, str]:
        """Every live process of this kernel's tag (the kernel's included): pid -> command line."""
        return {int(line.split(":")[0]): line for line in leftovers(self.tag)}


def _write_spec(folder: Path) -> KernelSpecManager:
    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(folder / "kernels")])


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    """A kernel of this interpreter, started in the repository root; killed (and its processes) after the test."""
    tag = f"mpimesh-test-{uuid.uuid4().hex}"
    env = base_env(
        MPIMESH_TEST_TAG=tag, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), JUPYTER_PLATFORM_DIRS="1",
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        # the workers that a fault ends are reported within this bound, not the default 10 s
        MPIMESH_SHUTDOWN_TIMEOUT="3",
        NOTEBOOK_TEST_FOLDER=str(tmp_path),
    )
    env.pop("MPIMESH_TEST_EXPECT_NPROCS", None)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # The connection file in the test's folder, not in the user's Jupyter runtime folder.
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=_write_spec(tmp_path),
                       connection_file=str(tmp_path / "connection.json"))
    km.start_kernel(env=env, cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=CELL_TIMEOUT)
        yield Kernel(km, kc, tag, tmp_path)
    finally:
        kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        left = _wait_gone({int(line.split(':')[0]): line for line in leftovers(tag)}, GONE_BOUND)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait_gone(procs: dict[int, str], bound: float) -> dict[int, str]:
    """Wait up to ``bound`` seconds for every process of ``procs`` to exit; those left (pid -> command line)."""
    fds: dict[int, int] = {}
    for pid in procs:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass
    end = time.monotonic() + bound
    try:
        while fds:
            left = end - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(fds), [], [], left)
            for fd in ready:
                del fds[fd]
                os.close(fd)
        gone = {pid for pid in procs if not os.path.exists(f"/proc/{pid}") or _zombie(pid)}
        return {pid: line for pid, line in procs.items() if pid not in gone}
    finally:
        for fd in fds:
            os.close(fd)


def _zombie(pid: int) -> bool:
    try:
        return ") Z " in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True


SPAWN = """
import asyncio, atexit, os, pathlib
import mpimesh

FOLDER = pathlib.Path(os.environ["NOTEBOOK_TEST_FOLDER"])
atexit.register((FOLDER / "kernel-atexit").touch)

class Waiter(mpimesh.Actor):
    def __init__(self):
        self.released = asyncio.Event()

    def __cleanup__(self, exc):
        (FOLDER / f"cleanup-{os.getpid()}").touch()

    @mpimesh.concurrent_endpoint
    async def pid(self):
        return os.getpid()

    @mpimesh.concurrent_endpoint
    async def slow(self):
        await asyncio.wait_for(self.released.wait(), 120)
        return "released"

    @mpimesh.concurrent_endpoint
    async def release(self):
        self.released.set()

procs = mpimesh.this_host().spawn_procs(per_host={"gpus": 2})
waiters = procs.spawn("waiters", Waiter)
print("workers", sorted(waiters.pid.call().get(60).values()))
"""


def _spawn(kernel: Kernel) -> list[int]:
    out = kernel.run(SPAWN)
    return json.loads(out.split("workers", 1)[1].strip())  # type: ignore[no-any-return]


def test_example_notebook_runs(kernel: Kernel) -> None:
    """examples/notebook.ipynb runs cell by cell in a real kernel; a dead worker does not end the kernel."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") and cell.get("execution_count") is None
               for cell in nb.cells if cell.cell_type == "code"), "the example notebook is saved with outputs"
    client = NotebookClient(nb, km=kernel.km, kernel_name=KERNEL, timeout=int(CELL_TIMEOUT),
                            resources={"metadata": {"path": str(ROOT)}})
    try:
        client.execute()
    finally:
        if client.kc is not None:
            client.kc.stop_channels()  # the kernel is the fixture's; the client's sockets are ours to close
    text = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
    assert "incr on every actor: [15, 20]" in text, text
    assert "the actor at gpus=1: 20" in text, text
    assert "call_one on a slice: 16" in text, text
    assert "caught ZeroDivisionError from rank 1: division by zero" in text, text
    assert "still there: [8.0, 10.0]" in text, text
    assert "caught SupervisionError: Endpoint call doomed.crash() failed" in text, text
    assert "the counters still answer: [16, 20]" in text, text
    assert text.rstrip().endswith("stopped"), text
    assert "mpimesh: unhandled failure (an interactive session goes on" in text, text
    # The failure reached the default hook, which in a kernel only reports:
    # no thread is counting down to end the kernel, and it still answers.
    assert kernel.run("import threading; print(sorted(t.name for t in threading.enumerate()))").count(
        "mpimesh-end-job") == 0
    assert kernel.km.is_alive()


def test_interrupt_waiting_cell(kernel: Kernel) -> None:
    """Interrupting a cell blocked in ``fut.get()`` raises KeyboardInterrupt there; the future and the mesh live on.

    Twice: the kernel's process group (the singleton's PRRTE daemon with it)
    gets each SIGINT.
    """
    _spawn(kernel)
    for _ in range(2):
        msg_id = kernel.execute("fut = waiters.slice(gpus=0).slow.call_one()\nprint('waiting', flush=True)\nfut.get()")
        kernel.until(msg_id, text="waiting")
        # "waiting" is printed just before fut.get(): give the cell time to enter it (a SIGINT that
        # lands earlier, in IPython's own machinery, comes back with no line of the cell to show)
        time.sleep(0.5)
        start = time.monotonic()
        kernel.km.interrupt_kernel()
        error = kernel.until(msg_id)
        print(f"interrupted after {time.monotonic() - start:.3f} s")
        assert error.get("ename") == "KeyboardInterrupt", error
        assert any("fut.get()" in line for line in error["traceback"]), error["traceback"]
    out = kernel.run("print(fut.done(), sorted(waiters.pid.call().get(30).values()))\n"
                     "waiters.release.call().get(30)\nprint(fut.get(30))")
    assert out.startswith("False [") and out.rstrip().endswith("released"), out


@pytest.mark.parametrize("how", ["shutdown", "restart", "kill", "sigkill-kernel-alone"])
def test_kernel_end_leaves_no_process(kernel: Kernel, how: str) -> None:
    """Shutting the kernel down, restarting it or killing it ends every worker and the launcher daemon.

    Jupyter kills a kernel's whole process group (the daemon with it; the
    workers are in groups of their own); the OOM killer kills the kernel
    alone: the daemon sees its keep-alive pipe close, the workers the
    controller's pid go.

    A shutdown or restart stops the workers as a script's exit does (their
    ``__cleanup__`` runs) and the kernel leaves through its ``atexit``
    handlers, before Jupyter would kill it (a zombie launcher daemon kept it
    waiting until then).
    """
    workers = _spawn(kernel)
    before = kernel.processes()
    assert set(workers) <= set(before), before
    assert any("prte" in line for line in before.values()), before  # the singleton's launcher daemon
    if how == "shutdown":
        kernel.km.shutdown_kernel()
    elif how == "restart":
        kernel.km.restart_kernel()
    elif how == "kill":
        kernel.km.shutdown_kernel(now=True)
    else:
        os.kill(kernel.km.provisioner.pid, signal.SIGKILL)  # what the OOM killer does
    start = time.monotonic()
    left = _wait_gone(before, GONE_BOUND)
    print(f"every process of the kernel gone {time.monotonic() - start:.2f} s after its {how}")
    assert not left, f"left after the kernel's {how}: {sorted(left.values())}"
    if how in ("shutdown", "restart"):
        assert sorted(p.name for p in kernel.folder.glob("cleanup-*")) == sorted(f"cleanup-{w}" for w in workers)
        assert (kernel.folder / "kernel-atexit").exists()
    if how == "restart":
        # the new kernel spawns afresh
        kernel.kc.wait_for_ready(timeout=CELL_TIMEOUT)
        assert len(_spawn(kernel)) == 2
