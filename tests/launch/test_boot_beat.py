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
