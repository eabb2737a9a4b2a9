"""The exit status of a watched process that is not ours to reap (``_roles.exits``)."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time

import pytest

from mpimesh._roles.exits import describe, ended_status, exit_status

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfds are Linux's (5.3)")


def _kernel() -> tuple[int, ...]:
    return tuple(int(part) for part in platform.release().split("-")[0].split(".")[:2])


def ended(code: str) -> tuple[subprocess.Popen[bytes], int]:
    """A child that ran ``code`` and exited, still a zombie; with a pidfd opened while it ran."""
    child = subprocess.Popen([sys.executable, "-c", f"import os, signal, sys, time; {code}"])
    fd = os.pidfd_open(child.pid)
    deadline = time.monotonic() + 30
    while os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        assert time.monotonic() < deadline, "the child did not end"
        time.sleep(0.01)
    return child, fd


@pytest.mark.parametrize(("code", "status"), [
    ("os._exit(3)", 3 << 8),
    ("os._exit(0)", 0),
    ("os.kill(os.getpid(), signal.SIGKILL)", signal.SIGKILL),
    ("os.kill(os.getpid(), signal.SIGTERM)", signal.SIGTERM),
])
def test_a_zombies_status_is_read(code: str, status: int) -> None:
    """Before the launcher reaps it, /proc tells how the process ended."""
    child, fd = ended(code)
    try:
        assert exit_status(fd, child.pid) == status
    finally:
        os.close(fd)
        child.wait()


def test_a_reaped_process_status_is_read_from_its_pidfd() -> None:
    """After the reap, the pidfd held since before the exit still tells (Linux 6.15)."""
    if _kernel() < (6, 15):
        pytest.skip(f"PIDFD_GET_INFO's exit status needs Linux 6.15, this is {platform.release()}")
    child, fd = ended("os.kill(os.getpid(), signal.SIGKILL)")
    try:
        child.wait()  # reaped: /proc/PID is gone
        assert not os.path.exists(f"/proc/{child.pid}")
        assert exit_status(fd, child.pid) == signal.SIGKILL
    finally:
        os.close(fd)


def test_a_live_process_has_no_status() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    fd = os.pidfd_open(child.pid)
    try:
        assert exit_status(fd, child.pid) is None
    finally:
        child.kill()
        child.wait()
        os.close(fd)


def test_the_report_names_the_signal_as_monarch_does() -> None:
    assert describe(signal.SIGKILL) == (
        "the process this actor was running on failed: Killed(sig=9) "
        "(SIGKILL from outside the process: kill, the OOM killer or the launcher)")
    assert describe(1 << 8) == ("the process this actor was running on exited with code 1 without a word "
                                "(os._exit or an exit from C: no Python exception to report)")
    assert describe(None) == ("exited without a word (os._exit, SIGKILL or the OOM killer; "
                              "the launcher's log has its exit status)")


def test_an_ended_process_status_is_waited_for_a_moment() -> None:
    """ended_status reads the status as exit_status does, and gives up after its bound on a live process."""
    child, fd = ended("os._exit(3)")
    try:
        assert ended_status(fd, child.pid) == 3 << 8
    finally:
        os.close(fd)
        child.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    fd = os.pidfd_open(live.pid)
    try:
        start = time.monotonic()
        assert ended_status(fd, live.pid, within=0.05) is None
        assert 0.05 <= time.monotonic() - start < 5
    finally:
        live.kill()
        live.wait()
        os.close(fd)
