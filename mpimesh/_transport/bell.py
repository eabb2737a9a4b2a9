"""Doorbells: wake an idle process the moment a message is sent to it.

MPI gives an idle rank nothing to block on, so an idle process polls, with
naps of up to ``MPIMESH_DEEP_SLEEP_US`` after half a second without traffic
(``mpimesh._core.progress``).  The first message after a pause then waits for
the end of the receiver's nap (docs/design/transport.md, "Doorbells", has the
figures).

So every process also has a doorbell: a FIFO in the job's directory that its
background waiter sleeps on with ``poll(2)``.  A process sending to a peer
it has not sent to for ``RING_AFTER`` seconds writes one byte to the peer's
bell after the frame, and the peer's poller wakes at once.  Steady traffic
never rings (the peer is polling anyway).  Bells are a same-host shortcut:
a peer on another node has no bell here, so nobody rings it, and its nap
bounds the latency as before.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import tempfile

from .frames import Addr

__all__ = ["Bell", "Ringer", "RING_AFTER", "bell_path", "job_dir"]

#: A frame to a peer not sent to for this long (seconds) rings its bell: by
#: then the peer's actor threads have left polling to its background waiter.
RING_AFTER = 0.02


# select() takes file descriptors below FD_SETSIZE only.
_SELECT_LIMIT = 1024


def job_dir(controller_pid: int) -> str:
    """The job's directory on this host, named by its controller: bells and workers' last words."""
    return os.path.join(tempfile.gettempdir(), f"mpimesh-{controller_pid}")


def bell_path(controller_pid: int, addr: Addr) -> str:
    """The FIFO of the process at ``addr``, in the job's directory."""
    return os.path.join(job_dir(controller_pid), f"bell-{addr[0]}.{addr[1]}")


class Bell:
    """This process's own doorbell: a FIFO it sleeps on.

    Raises:
        OSError: the FIFO cannot be made (the caller goes without a bell).
    """

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a stale bell of a reused address
        os.mkfifo(path, 0o600)
        self.path = path
        # Read-write: a FIFO with a writer of its own never reports hang-up,
        # and this process can ring itself.
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._poller = select.poll()
        self._poller.register(self.fd, select.POLLIN)

    def sleep(self, seconds: float) -> bool:
        """Sleep until rung or ``seconds`` pass; True if rung."""
        if self.fd < _SELECT_LIMIT:
            # select() keeps the back-off's sub-millisecond naps (poll() rounds to 1 ms).
            rung = bool(select.select((self.fd,), (), (), max(0.0, seconds))[0])
        else:
            rung = bool(self._poller.poll(max(0, int(seconds * 1e3 + 0.999))))
        if rung:
            self.drain()
        return rung

    def drain(self) -> None:
        """Forget the rings so far."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def ring(self) -> None:
        """Wake this process's own sleeper (from another of its threads)."""
        with contextlib.suppress(BlockingIOError):  # full: it is awake already
            os.write(self.fd, b"\0")

    def close(self) -> None:
        """Stop listening and remove the FIFO."""
        os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class Ringer:
    """Rings other processes' bells on this host.

    Args:
        controller_pid: the job's controller, which names the job directory.
    """

    def __init__(self, controller_pid: int) -> None:
        self.controller_pid = controller_pid
        # addr -> an open write end, or -1: no bell here (another node, gone)
        self._fds: dict[Addr, int] = {}

    def ring(self, addr: Addr) -> None:
        """Ring ``addr``'s bell if it has one on this host; never blocks or raises."""
        fd = self._fds.get(addr)
        if fd is None:
            fd = self._open(addr)
            if fd is None:
                return  # no bell (yet): a peer still booting, or on another node
            self._fds[addr] = fd
        if fd < 0:
            return
        try:
            os.write(fd, b"\0")
        except BlockingIOError:
            pass  # full of rings: the peer is awake already
        except OSError:  # the peer is gone (EPIPE)
            os.close(fd)
            self._fds[addr] = -1

    def _open(self, addr: Addr) -> int | None:
        path = bell_path(self.controller_pid, addr)
        try:
            if not stat.S_ISFIFO(os.stat(path).st_mode):
                return -1
            # ENXIO if nobody holds it open for reading: the peer is gone.
            return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError:
            return -1

    def forget(self, addr: Addr) -> None:
        """Stop ringing ``addr`` (it has died or left)."""
        fd = self._fds.pop(addr, -1)
        if fd >= 0:
            os.close(fd)
        self._fds[addr] = -1

    def close(self) -> None:
        """Close every write end."""
        for fd in self._fds.values():
            if fd >= 0:
                os.close(fd)
        self._fds.clear()
