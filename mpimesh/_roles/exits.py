"""How a watched process that is not our child ended: its wait status, when Linux still tells.

The controller watches same-host workers through pidfds, but the workers
are children of the launcher (``prted``), which reaps them; ``waitpid`` is
not ours to call.  Linux tells the status anyway, for a while:

* while the process is a zombie (until the launcher reaps it, typically a
  few milliseconds), the last field of ``/proc/PID/stat`` is its wait
  status (Linux 3.5);
* once reaped, ``ioctl(pidfd, PIDFD_GET_INFO)`` with ``PIDFD_INFO_EXIT``
  returns it to whoever held a pidfd of the process (Linux 6.15).

Either may be missing (an older kernel, a reap between the two reads):
then the status is unknown and the caller says so.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import time

# struct pidfd_info (include/uapi/linux/pidfd.h), its first version: 64 bytes
_INFO = struct.Struct("=QQ11Ii")
_INFO_EXIT = 1 << 3
_GET_INFO = (3 << 30) | (_INFO.size << 16) | (0xFF << 8) | 11  # _IOWR(PIDFS_IOCTL_MAGIC, 11, struct pidfd_info)


def _from_pidfd(fd: int) -> int | None:
    buf = bytearray(_INFO.size)
    struct.pack_into("=Q", buf, 0, _INFO_EXIT)
    try:
        fcntl.ioctl(fd, _GET_INFO, buf)
    except OSError:
        return None  # an older kernel, or not reaped yet (ESRCH)
    fields = _INFO.unpack(buf)
    return fields[-1] if fields[0] & _INFO_EXIT else None


def _from_proc(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rpartition(b")")[2].split()
    if len(fields) < 50 or fields[0] != b"Z":  # only a zombie's status is final
        return None
    return int(fields[-1])


def exit_status(fd: int, pid: int) -> int | None:
    """The wait status of the exited process ``pid`` (whose pidfd is ``fd``), or None when Linux no longer tells."""
    status = _from_pidfd(fd)
    if status is None:
        status = _from_proc(pid)
    if status is None:
        status = _from_pidfd(fd)  # reaped between the two reads
    return status


#: Seconds :func:`ended_status` waits for the status of a process whose pidfd said it ended.
SETTLE = 0.02


def ended_status(fd: int, pid: int, within: float = SETTLE) -> int | None:
    """:func:`exit_status` of a process whose pidfd polled readable: it waits up to ``within`` seconds.

    The pidfd is readable as the process exits, a moment before it is a
    zombie in ``/proc`` (CI saw "exited without a word" for an
    ``os._exit(1)`` detected that early): the status is read again, every
    millisecond, until it shows or ``within`` has passed.
    """
    end = time.monotonic() + within
    while True:
        status = exit_status(fd, pid)
        if status is not None or time.monotonic() >= end:
            return status
        time.sleep(0.001)


def describe(status: int | None) -> str:
    """Why a process that left no last words ended, as a death report says it.

    A signal is named as Monarch names it (``Killed(sig=9)``), in its phrase
    for a process that failed under an actor.
    """
    if status is None:
        return "exited without a word (os._exit, SIGKILL or the OOM killer; the launcher's log has its exit status)"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        core = ", core" if os.WCOREDUMP(status) else ""
        return (f"the process this actor was running on failed: Killed(sig={number}{core}) "
                f"({name} from outside the process: kill, the OOM killer or the launcher)")
    code = os.WEXITSTATUS(status)
    return (f"the process this actor was running on exited with code {code} without a word "
            "(os._exit or an exit from C: no Python exception to report)")
