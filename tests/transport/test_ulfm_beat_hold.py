"""The bounds on ``ulfm_beat_hold`` and ``ulfm_beat_stop`` (native/ulfm_beat.c): a stuck ``MPI_Iprobe`` hangs nobody.

The thread polls under its lock, and a hold or a stop waits for the polls
under way.  Here its ``MPI_Iprobe`` is a stand-in that sleeps (a tiny
library built for the test, which the thread finds as it finds libmpi): the
hold and the stop must give up at their bound with a ``TimeoutError``, not
wait for the call; a worker's ``finish`` then leaves without
``MPI_Finalize``, status 1, and so does the stop at the interpreter's exit
(the controller's).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mpimesh._transport import ulfm_beat

#: an MPI_Iprobe that takes SLOW seconds, and says that it was called
SLOW = 2.0
FAKE = f'''
#include <unistd.h>
volatile int entered;
int MPI_Iprobe(int source, int tag, void *comm, int *flag, void *status) {{
    (void)source; (void)tag; (void)comm; (void)status;
    entered = 1;
    usleep({int(SLOW * 1e6)});
    *flag = 0;
    return 0;
}}
'''


@pytest.fixture
def slow_libmpi(tmp_path: Path) -> tuple[str, ctypes.CDLL]:
    """A loaded library whose MPI_Iprobe sleeps for SLOW seconds; its path and handle."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build the stand-in MPI_Iprobe")
    (tmp_path / "fake.c").write_text(FAKE)
    lib = tmp_path / "libfakempi.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fake.c")], check=True, timeout=60)
    return str(lib), ctypes.CDLL(str(lib))


def _polling_in_slow_iprobe(slow_libmpi: tuple[str, ctypes.CDLL]) -> Any:
    """The native module, its beat thread started on the slow library and inside its first MPI_Iprobe."""
    try:
        from mpimesh import _native
    except ImportError:
        pytest.skip("the native part is not built")
    path, lib = slow_libmpi
    entered = ctypes.c_int.in_dll(lib, "entered")
    _native.ulfm_beat_start(path, 0, 0.001, 1)
    deadline = time.monotonic() + 10
    while not entered.value and time.monotonic() < deadline:
        time.sleep(0.01)
    if not entered.value:
        _native.ulfm_beat_stop()
        pytest.fail("the thread never polled")
    return _native


def test_a_hold_gives_up_at_its_bound_while_an_iprobe_does_not_return(slow_libmpi: tuple[str, ctypes.CDLL]) -> None:
    """A hold raises TimeoutError within its bound, not after the stuck call, and leaves nothing held."""
    _native = _polling_in_slow_iprobe(slow_libmpi)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"^ulfm_beat_hold: the thread's MPI_Iprobe has not returned within "
                                               r"0\.2 s \(MPI's progress is stuck\); not held$"):
            _native.ulfm_beat_hold(0.2)
        assert time.monotonic() - start < SLOW / 2
    finally:
        _native.ulfm_beat_stop()  # waits for the call under way: SLOW at most


def test_held_raises_and_releases_nothing_when_the_hold_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """``held()`` passes its bound down; a hold that timed out is not released, and the body does not run."""
    calls: list[tuple[str, float | None]] = []

    class Native:
        def ulfm_beat_hold(self, bound: float) -> None:
            calls.append(("hold", bound))
            raise TimeoutError("ulfm_beat_hold: stuck")

        def ulfm_beat_release(self) -> None:
            calls.append(("release", None))

    monkeypatch.setattr(ulfm_beat, "_native", Native())
    ran = False
    with pytest.raises(TimeoutError, match="stuck"), ulfm_beat.held(0.5):
        ran = True
    assert not ran and calls == [("hold", 0.5)]


def test_a_stop_gives_up_at_its_bound_while_an_iprobe_does_not_return(slow_libmpi: tuple[str, ctypes.CDLL]) -> None:
    """A stop raises TimeoutError within its bound and leaves the thread running; a later stop ends it."""
    path, _ = slow_libmpi
    _native = _polling_in_slow_iprobe(slow_libmpi)
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"^ulfm_beat_stop: the thread's MPI_Iprobe has not returned within "
                                               r"0\.2 s \(MPI's progress is stuck\); the thread still runs$"):
            _native.ulfm_beat_stop(0.2)
        assert time.monotonic() - start < SLOW / 2
        with pytest.raises(RuntimeError, match="runs already"):
            _native.ulfm_beat_start(path, 0, 0.001, 1)
    finally:
        assert _native.ulfm_beat_stop(SLOW * 5) >= 1  # the call under way returns: SLOW at most


def test_stop_keeps_the_thread_when_it_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """``stop()`` passes its bound down and, when it times out, still counts the thread as running."""
    bounds: list[float] = []

    class Native:
        def ulfm_beat_stop(self, bound: float) -> int:
            bounds.append(bound)
            if len(bounds) == 1:
                raise TimeoutError("ulfm_beat_stop: stuck")
            return 3

    monkeypatch.setattr(ulfm_beat, "_native", Native())
    with pytest.raises(TimeoutError, match="stuck"):
        ulfm_beat.stop(0.5)
    assert ulfm_beat.running()
    assert ulfm_beat.stop() == 3 and not ulfm_beat.running()
    assert bounds == [0.5, ulfm_beat.STOP_BOUND]


#: a process whose thread is in the sleeping MPI_Iprobe when it ends: argv[1] the library, argv[2] how it ends
ENDS = """
import ctypes, sys, time
import mpi4py
mpi4py.rc.initialize = False  # no MPI here: the stand-in library is the thread's only MPI
from mpimesh import _native
from mpimesh._transport import ulfm_beat
from mpimesh._roles import worker

path, how = sys.argv[1], sys.argv[2]
entered = ctypes.c_int.in_dll(ctypes.CDLL(path), "entered")
_native.ulfm_beat_start(path, 0, 0.001, 1, 0.2)
ulfm_beat._native = _native
ulfm_beat.STOP_BOUND = 0.2
while not entered.value:
    time.sleep(0.01)

class MPI:
    @staticmethod
    def Finalize() -> None:
        print("FINALIZE", flush=True)

worker.MPI = MPI
worker.library = lambda: "Open MPI"
print("POLLING", flush=True)
if how == "finish":
    sys.exit(worker.finish(0, False))
"""


@pytest.mark.parametrize("how", ["finish", "exit"])
def test_a_process_whose_stop_times_out_leaves_without_finalize(slow_libmpi: tuple[str, ctypes.CDLL],
                                                                 tmp_path: Path, how: str) -> None:
    """A worker's finish, or the interpreter's exit (the controller's), skips Finalize: status 1 and why.

    ``finish`` stops the thread within ``STOP_BOUND``; the exit stops it
    within the bound given at start, right before mpi4py's ``MPI_Finalize``.
    """
    try:
        from mpimesh import _native  # noqa: F401
    except ImportError:
        pytest.skip("the native part is not built")
    script = tmp_path / "ends.py"
    script.write_text(ENDS)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script), slow_libmpi[0], how], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))
    took = time.monotonic() - start
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "POLLING" in proc.stdout and "FINALIZE" not in proc.stdout, proc.stdout
    if how == "finish":
        assert ("mpimesh: ulfm_beat_stop: the thread's MPI_Iprobe has not returned within 0.2 s (MPI's progress "
                "is stuck); the thread still runs; exiting with status 1 without MPI_Finalize") in proc.stderr
    else:
        assert ("mpimesh: the ULFM beat thread's MPI_Iprobe has not returned within 0.2 s at exit (MPI's "
                "progress is stuck); exiting with status 1 without MPI_Finalize") in proc.stderr
    assert took < 20, took
