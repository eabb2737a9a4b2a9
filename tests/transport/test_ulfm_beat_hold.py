"""The bound on ``ulfm_beat_hold`` (native/ulfm_beat.c): an ``MPI_Iprobe`` that does not return hangs nobody.

The thread polls under its lock, and a hold waits for the polls under way.
Here its ``MPI_Iprobe`` is a stand-in that sleeps (a tiny library built
for the test, which the thread finds as it finds libmpi): the hold must give
up at its bound with a ``TimeoutError``, not wait for the call.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import time
from pathlib import Path

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


def test_a_hold_gives_up_at_its_bound_while_an_iprobe_does_not_return(slow_libmpi: tuple[str, ctypes.CDLL]) -> None:
    """A hold raises TimeoutError within its bound, not after the stuck call, and leaves nothing held."""
    try:
        from mpimesh import _native
    except ImportError:
        pytest.skip("the native part is not built")
    path, lib = slow_libmpi
    entered = ctypes.c_int.in_dll(lib, "entered")
    _native.ulfm_beat_start(path, 0, 0.001, 1)
    try:
        deadline = time.monotonic() + 10
        while not entered.value and time.monotonic() < deadline:
            time.sleep(0.01)
        assert entered.value, "the thread never polled"
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
