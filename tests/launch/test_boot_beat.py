"""ULFM's heartbeats fed from ``MPI_Init`` to the boot (``_launch/boot_beat.py``): when, and that it stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from mpimesh._launch import boot_beat


@pytest.fixture(autouse=True)
def _stopped() -> Iterator[None]:
    boot_beat.stop()
    yield
    boot_beat.stop()


@pytest.mark.parametrize(("environ", "on"), [
    ({}, False),
    ({"OMPI_MCA_mpi_ft_enable": "true"}, False),  # ULFM without its detector (mpiexec --with-ft ulfm)
    ({"OMPI_MCA_mpi_ft_detector": "true"}, False),
    ({"OMPI_MCA_mpi_ft_enable": "true", "OMPI_MCA_mpi_ft_detector": "true"}, True),  # srun --mpi=pmix
    ({"OMPI_MCA_mpi_ft_enable": "1", "OMPI_MCA_mpi_ft_detector": "True"}, True),
    ({"OMPI_MCA_mpi_ft_enable": "true", "OMPI_MCA_mpi_ft_detector": "false"}, False),
])
def test_the_thread_is_wanted_where_ulfm_s_detector_runs(environ: dict[str, str], on: bool) -> None:
    assert boot_beat.detector_on(environ) is on
    assert boot_beat.wanted(environ) is on
    assert not boot_beat.wanted({**environ, "MPIMESH_BOOT_BEAT": "0"})


def test_the_thread_calls_mpi_every_period_until_stopped() -> None:
    calls: list[float] = []
    boot_beat.start(lambda: calls.append(time.monotonic()))
    boot_beat.start(lambda: pytest.fail("a second thread was started"))
    assert boot_beat.running()
    deadline = time.monotonic() + 10
    while len(calls) < 3 * boot_beat.CALLS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) >= 3 * boot_beat.CALLS
    boot_beat.stop()
    assert not boot_beat.running()
    made = len(calls)
    assert made % boot_beat.CALLS == 0, "a wake makes CALLS calls (Open MPI runs its timers once in 8)"
    time.sleep(3 * boot_beat.PERIOD)
    assert len(calls) == made, "an MPI call after stop(): the boot's Dup would race it"
    assert not any(t.name == "mpimesh-boot-beat" for t in threading.enumerate())
    boot_beat.stop()  # twice is fine


def test_stop_waits_for_the_call_in_flight() -> None:
    inside, release, done = threading.Event(), threading.Event(), threading.Event()

    def slow_call() -> None:
        inside.set()
        release.wait(10)
        done.set()

    boot_beat.start(slow_call)
    assert inside.wait(10)
    stopper = threading.Thread(target=boot_beat.stop)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive(), "stop() returned while the thread was still inside its MPI call"
    release.set()
    stopper.join(10)
    assert done.is_set() and not stopper.is_alive()


def test_a_failing_call_ends_the_thread_quietly() -> None:
    def failing() -> None:
        raise RuntimeError("MPI is failing")

    boot_beat.start(failing)
    deadline = time.monotonic() + 10
    while any(t.name == "mpimesh-boot-beat" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "mpimesh-boot-beat" for t in threading.enumerate())


#: a singleton that starts the C thread after the boot (_transport/ulfm_beat.py) as boot_controller does
NATIVE = r'''
import os, sys, time
from mpimesh._transport import mpi, native, ulfm_beat
from mpimesh._transport.mpi import MPI

def threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as comm:
            names.append(comm.read().strip())
    return names.count("mpimesh-ulfm")

if not native.bind():
    print("SKIP", native.why_not, flush=True)
    sys.exit(0)
started = ulfm_beat.start(mpi.loaded_libmpi(), MPI.COMM_SELF.handle)
print("STARTED", started, ulfm_beat.running(), threads(), flush=True)
if started:
    with mpi.alone():  # a communicator being made: no MPI call from the thread
        time.sleep(0.5)
        print("HELD", ulfm_beat.stop(), threads(), flush=True)
    ulfm_beat.start(mpi.loaded_libmpi(), MPI.COMM_SELF.handle)
    time.sleep(0.5)
    print("POLLING", threads(), flush=True)
    # the exit ends it before mpi4py's MPI_Finalize: an MPI_Iprobe after would abort (status 14)
'''


@pytest.mark.subprocess
@pytest.mark.parametrize("on", [True, False])
def test_the_c_thread_runs_after_the_boot_where_the_detector_runs(on: bool) -> None:
    """The C thread (native/ulfm_beat.c): started only with the detector on, held by ``alone()``, ended at exit."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_MCA_mpi_ft", "MPIMESH_BOOT_BEAT"))}
    if on:
        environ.update(OMPI_MCA_mpi_ft_enable="true", OMPI_MCA_mpi_ft_detector="true")
    done = subprocess.run([sys.executable, "-c", NATIVE], env={**environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    if lines and lines[0].startswith("SKIP"):
        pytest.skip(lines[0])
    if not on:
        assert lines == ["STARTED False False 0"], done.stdout + done.stderr
        return
    assert lines[0] == "STARTED True True 1", done.stdout + done.stderr
    held = lines[1].split()
    assert held[0] == "HELD" and int(held[1]) <= 1 and held[2] == "0", f"it polled while held: {done.stdout}"
    assert lines[2:] == ["POLLING 1"], done.stdout + done.stderr
    assert "after MPI_FINALIZE" not in done.stderr, done.stderr
