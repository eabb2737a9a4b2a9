"""The controller's liveness channel: who is still alive, and why not.

MPI alone cannot be trusted with this: without ULFM a dead rank aborts the
job, with ULFM a rank that calls ``os._exit(1)`` is not reported, and the
death of a spawned process is never reported to its parent
(../shared/reference/mpi-facts.md).  So the controller watches on its own:

* same-host workers through a ``pidfd`` each, polled with every MPI poll:
  a death is seen within milliseconds whatever its cause;
* every worker through heartbeats: one that has been silent for a while gets
  a PING, and one silent for ``MPIMESH_HEARTBEAT_TIMEOUT`` seconds is
  declared dead (hung in C code, stopped, on a lost node);
* ULFM's ``ERR_PROC_FAILED`` where the MPI has it (see ``_transport.router`` and ``_core.failures``).

**Busy is not dead** (issue #14 item 11).  A heartbeat timeout ended a job
whose processes were all alive: a 2 GB result took the controller 21 s to
receive, and a process that cannot answer for a while is not a process
that has died.  An HPC user expects what the batch system does: a rank is
dead when its process is gone, stopped, or hung; a slow rank is alive, and a
call that takes too long is bounded by the caller's ``get(timeout)``, not
by ending the job.  Silence can be the listener's fault or the speaker's:

* *the controller did not listen*: a poll that spends seconds receiving a
  large payload, a script holding the GIL, an overloaded node.  Silence only
  counts while the controller listens: time between two of its polls beyond
  :data:`_DEAF_AFTER` is credited to every worker (:meth:`Liveness.listen`).
  Without it, the idle bystanders of a large transfer were the ones
  declared dead, all at once, right after it.
* *the worker could not answer*: its polling thread blocked in a large
  receive, or waiting for the router's lock that another thread holds for a
  long MPI call.  A worker's heartbeat thread (``_roles.worker``) says it
  is alive whenever its polling has stalled, through the send path alone,
  which a receive never blocks.
* *the worker could not run Python at all*: an actor holding the GIL in a
  long C call.  CPU time spent is progress, counted as life.  A same-host
  worker that is silent past the timeout is declared dead only if ``/proc``
  shows no progress: it is stopped (SIGSTOP, state ``T``), or none of its
  threads is running and it used less than :data:`BUSY_CPU` of a core since
  half the timeout (a deadlock, a C call that sleeps with the GIL held).  A
  worker on another host, which has no ``/proc`` here, says it itself: a
  thread in C that needs no GIL (``native/beat.c``) sends a heartbeat every
  half ping interval in which the process used that much CPU.  A heartbeat
  thread that sent regardless would keep a deadlocked process alive for
  ever; gated on CPU time, it does not.

What is still declared dead: a process that exited (pidfd, at once), one
stopped or hung with no CPU progress for the timeout, and one on another
host silent for the timeout (lost node, SIGSTOP, hung; or holding the GIL
where the native part is not built).  What is not: a process that spins for
ever in C code is indistinguishable from a long computation, and is bounded
by the caller's timeout.

**A silent host goes at once** (issue #27 item 6).  When a process of
another host is declared dead with no word from that host (ULFM's bare
report, or silence; no exit seen by the host's watchers), the host itself
may be lost or frozen, and then every process of it is silent.  ULFM's
detector ring finds a frozen host's processes one after another, each after
its own timeout (two processes: 5.7-6 s), so the controller asks instead:
it PINGs the host's other workers at once, and declares dead with their
host those from which nothing arrives within :data:`HOST_ANSWER` (an idle
worker echoes a PING within milliseconds).  A host that is alive answers,
and nobody else is declared (checked with one rank of a host frozen beside
4 spinning processes on 2 cores: ``tests/slurm/test_slurm_load.py``).  The
risk taken: a worker of that host whose polling stalls longer
(behind a large receive: its native heartbeat comes every second) is
declared dead with it, but only right after a process of its host died
with no word.

The cause comes from the worker's *last words*: every worker points Python's
``faulthandler`` at a file of its own, so a fatal signal (SIGSEGV, SIGABRT,
SIGBUS, SIGFPE, SIGILL) leaves its name and stack there.  An ``os._exit``, a
SIGKILL or the OOM killer leaves nothing: the exit status belongs to the
launcher's daemon, which reaps the process, and is in the launcher's log.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import shutil
import signal
import time
from collections.abc import Callable, Iterable
from typing import IO, Protocol

from .._core import protocol
from .._core.logs import debug
from .._core.protocol import Frame
from .._transport.bell import bell_path, job_dir
from ..config import settings
from .exits import describe, ended_status

__all__ = [
    "BUSY_CPU", "PING_AFTER", "Liveness", "LivenessRuntime", "exit_cause", "job_dir", "last_words_path", "progress",
    "start_last_words", "stop_last_words",
]

Addr = tuple[int, int]


class _Router(Protocol):
    def send_quiet(self, dest: Addr, frame: Frame) -> None: ...


class _Failures(Protocol):
    def declare_dead(self, addr: Addr, cause: str) -> None: ...


class LivenessRuntime(Protocol):
    """What liveness uses of the controller's runtime."""

    @property
    def addr(self) -> Addr: ...

    @property
    def host(self) -> str: ...

    @property
    def pid(self) -> int: ...

    @property
    def router(self) -> _Router: ...

    @property
    def failures(self) -> _Failures: ...

#: A worker silent for a quarter of the heartbeat timeout (at most this long)
#: gets a PING.
PING_AFTER = 2.0
# A gap between two of the controller's polls longer than this (or a tenth
# of the heartbeat timeout, if less) is deafness: the excess does not count
# as anyone's silence.  An idle controller polls every few milliseconds.
_DEAF_AFTER = 0.25
#: Seconds the other workers of a host have to be heard from, after a PING, once a process of that host was
#: declared dead with no word from the host (see the module's docstring); the controller's own deafness is not
#: counted.  The frozen host of tests/slurm is then found 2.30-2.48 s after the freeze, not 5.7-6 s.
HOST_ANSWER = 0.5
# How a death's cause begins when nothing came from the dead process's host: ULFM's report that no host
# watcher's EXITED completed (``Controller.settle_mpi_report``), or the heartbeat timeout.
_NO_WORD = ("reported failed by MPI", "stopped answering:")
#: A silent same-host worker that used at least this share of one core since
#: it went quiet is busy, not hung (a worker's native heartbeat uses the same share).
BUSY_CPU = 0.1
_CLOCK_TICK = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01

_last_words: IO[str] | None = None


def last_words_path(controller_pid: int, addr: Addr) -> str:
    """Where the worker at ``addr`` writes its last words."""
    return os.path.join(job_dir(controller_pid), f"{addr[0]}.{addr[1]}.txt")


def start_last_words(controller_pid: int, addr: Addr) -> None:
    """On a worker: dump fatal signals' tracebacks to this worker's file."""
    global _last_words
    path = last_words_path(controller_pid, addr)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _last_words = open(path, "w")  # noqa: SIM115 - must outlive this call
    except OSError:
        return
    faulthandler.enable(file=_last_words, all_threads=True)


def stop_last_words(controller_pid: int, addr: Addr) -> None:
    """On a worker leaving normally: nothing to say."""
    global _last_words
    if _last_words is None:
        return
    faulthandler.disable()
    _last_words.close()
    _last_words = None
    try:
        os.unlink(last_words_path(controller_pid, addr))
    except OSError:
        pass


def leave_job_dir(controller_pid: int, dead: Iterable[Addr]) -> None:
    """On a worker leaving normally, after its own files went: remove the dead's, and the directory if empty.

    The controller removes the job directory of its own host at the end;
    on another host, the last worker to leave does, with the last words and
    bells of the processes that died there (the controller read those at
    the death, before anyone heard of it).
    """
    folder = job_dir(controller_pid)
    for addr in dead:
        for path in (last_words_path(controller_pid, addr), bell_path(controller_pid, addr)):
            with contextlib.suppress(OSError):
                os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(folder)  # fails while another process of the job still has files here


def progress(pid: int) -> tuple[str, float, bool] | None:
    """What ``/proc`` says of process ``pid``: its state letter, CPU seconds used, whether a thread runs.

    The state is the main thread's (``T``: stopped by a signal, ``t``: by a
    debugger); a thread *runs* when it is on a CPU or waiting for one
    (``R``).  ``None`` when there is no such process (or no ``/proc``).
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    state, cpu = fields[0], (int(fields[11]) + int(fields[12])) * _CLOCK_TICK
    running = False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "R":
                    running = True
                    break
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
    return state, cpu, running


#: faulthandler's names of the fatal signals it reports, and their numbers
_FATAL_SIGNALS = {
    "Segmentation fault": signal.SIGSEGV.value,
    "Aborted": signal.SIGABRT.value,
    "Bus error": signal.SIGBUS.value,
    "Floating point exception": signal.SIGFPE.value,
    "Illegal instruction": signal.SIGILL.value,
}


def exit_cause(controller_pid: int, addr: Addr, status: int | None = None) -> str:
    """Why worker ``addr`` of this host exited: its last words if it left any, else its wait status if known.

    Read where the worker ran: by the controller for its own host's workers,
    by a host watcher (``hostwatch``) for another host's.
    """
    path = last_words_path(controller_pid, addr)
    try:
        with open(path) as f:
            words = f.read()
        os.unlink(path)
    except OSError:
        words = ""
    for line in words.splitlines():
        if line.startswith("Fatal Python error:"):
            what = line[len("Fatal Python error: "):].strip()
            number = _FATAL_SIGNALS.get(what)
            monarch = f", Killed(sig={number})" if number else ""  # as Monarch names it
            return f"killed by a fatal signal ({what}{monarch})"
    return describe(status)


class Liveness:
    """Watches the workers of one controller.

    Args:
        runtime: the controller's runtime.
        timeout: seconds of silence that make a worker dead (default:
            ``MPIMESH_HEARTBEAT_TIMEOUT``).
        clock: the time, in seconds (tests pass a fake).
        proc: what ``/proc`` says of a pid, as :func:`progress` (tests pass a fake).
    """

    def __init__(
        self,
        runtime: LivenessRuntime,
        *,
        timeout: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        proc: Callable[[int], tuple[str, float, bool] | None] = progress,
    ) -> None:
        self.rt = runtime
        self.timeout = settings.heartbeat_timeout if timeout is None else timeout
        self._clock = clock
        self._proc = proc
        self.ping_after = min(PING_AFTER, self.timeout / 4)
        self.deaf_after = min(_DEAF_AFTER, self.timeout / 10)
        self._poller = select.poll()
        self._fds: dict[int, Addr] = {}
        self._by_addr: dict[Addr, int] = {}
        self.last_heard: dict[Addr, float] = {}
        self._next_heartbeat = 0.0
        self._ping = 0
        # Every worker hears from the controller at least this often, so that
        # one on another node can tell when the controller is gone.
        self._pinged: dict[Addr, float] = {}
        # when the controller last listened (a poll, a heartbeat round)
        self._listened = self._clock()
        # same-host workers: addr -> pid, for /proc
        self._pids: dict[Addr, int] = {}
        # a quiet same-host worker: addr -> (its last_heard then, CPU seconds, when)
        self._quiet: dict[Addr, tuple[float, float, float]] = {}
        # every watched worker's host
        self._hosts: dict[Addr, str] = {}
        # a host suspected lost: host -> (when its workers were PINGed, deadline, the dead one, the PINGed)
        self._suspects: dict[str, tuple[float, float, Addr, list[Addr]]] = {}
        #: statistics: seconds of the controller's own deafness credited to every worker
        self.deaf_seconds = 0.0
        #: statistics: silent same-host workers found busy, not dead
        self.busy_verdicts = 0

    def watch(self, addr: Addr, pid: int, host: str) -> None:
        """Start watching a worker (after its hello)."""
        self.last_heard[addr] = self._clock()
        self._hosts[addr] = host
        if not pid or host != self.rt.host or not hasattr(os, "pidfd_open"):
            return  # another node: heartbeats only
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.rt.failures.declare_dead(addr, "was gone before it could be watched")
            return
        except OSError:
            return
        self._fds[fd] = addr
        self._by_addr[addr] = fd
        self._pids[addr] = pid
        self._poller.register(fd, select.POLLIN)

    def watches(self, addr: Addr) -> bool:
        """Whether ``addr``'s exit is seen through a pidfd (a worker on this host)."""
        return addr in self._by_addr

    def forget(self, addr: Addr) -> None:
        """Stop watching (the worker said BYE, or is known dead)."""
        self.last_heard.pop(addr, None)
        self._hosts.pop(addr, None)
        self._pinged.pop(addr, None)
        self._pids.pop(addr, None)
        self._quiet.pop(addr, None)
        fd = self._by_addr.pop(addr, None)
        if fd is not None:
            self._fds.pop(fd, None)
            try:
                self._poller.unregister(fd)
            finally:
                os.close(fd)

    def listen(self, now: float) -> None:
        """The controller listens at ``now``: a long gap since it last did is no one's silence.

        Called with every poll (and every heartbeat round).  While the
        controller does not poll (a long receive, a script holding the GIL,
        a starved process) nothing it could hear arrives; what exceeds
        :attr:`deaf_after` of that gap is added to every worker's
        ``last_heard``, as if each had been heard that much later.
        """
        gap = now - self._listened
        self._listened = now
        credit = gap - self.deaf_after
        if credit <= 0:
            return
        self.deaf_seconds += credit
        for host, (asked, deadline, dead, pinged) in list(self._suspects.items()):
            self._suspects[host] = (asked, deadline + credit, dead, pinged)
        heard, quiet = self.last_heard, self._quiet
        for addr, when in list(heard.items()):
            heard[addr] = later = min(now, when + credit)
            noted = quiet.get(addr)
            if noted is not None and noted[0] == when:
                quiet[addr] = (later, noted[1], noted[2])  # the same silence

    def check(self) -> None:
        """Declare dead every watched process that has exited, and the silent of a suspected host (cheap)."""
        now = self._clock()
        self.listen(now)
        if self._suspects:
            self._settle_suspects(now)
        if not self._fds:
            return
        for fd, _ in self._poller.poll(0):
            addr = self._fds.get(fd)
            if addr is not None:
                status = ended_status(fd, self._pids.get(addr, 0))  # while the pidfd is still open
                self.forget(addr)
                self.rt.failures.declare_dead(addr, self.cause(addr, status))

    def lost(self, addr: Addr, cause: str) -> None:
        """``addr`` was declared dead for ``cause``: stop watching it, and suspect its host if nothing came from it.

        Only for another host: the other workers of that host are PINGed now,
        and :meth:`check` declares dead, :data:`HOST_ANSWER` seconds later,
        those not heard from since.
        """
        host = self._hosts.get(addr)
        self.forget(addr)
        if host is None or host == self.rt.host or host in self._suspects or not cause.startswith(_NO_WORD):
            return
        mates = [a for a, h in self._hosts.items() if h == host]
        if not mates:
            return
        asked = self._clock()
        for mate in mates:
            self._pinged[mate] = asked
            self._ping += 1
            try:
                self.rt.router.send_quiet(mate, protocol.ping(self._ping))
            except ConnectionError:
                pass
        self._suspects[host] = (asked, asked + HOST_ANSWER, addr, mates)
        debug(f"process {addr[0]}.{addr[1]} of {host} died with no word from {host}: "
              f"PINGed its {len(mates)} other workers", self.rt.addr)

    def _settle_suspects(self, now: float) -> None:
        # Declare dead the PINGed workers of a suspected host that were not heard from by the deadline.
        for host, (asked, deadline, dead, pinged) in list(self._suspects.items()):
            if now < deadline:
                continue
            for mate in pinged:
                heard = self.last_heard.get(mate)
                if heard is None or heard > asked:
                    continue  # declared dead meanwhile, or it answered: alive
                self.forget(mate)
                self.rt.failures.declare_dead(
                    mate, f"stopped answering with its host {host}: nothing came from it within {HOST_ANSWER:g} s "
                    f"of a PING once process {dead[0]}.{dead[1]} of {host} had died with no word from that host "
                    "(a lost or frozen host)")
            del self._suspects[host]  # after the declarations: theirs must not make {host} a suspect again

    def heartbeat(self) -> None:
        """PING quiet workers; declare dead those silent past the timeout."""
        now = self._clock()
        self.listen(now)
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.ping_after / 2
        for addr, heard in list(self.last_heard.items()):
            silent = now - heard
            if silent > self.timeout:
                if self._busy(addr, heard, now):
                    self.busy_verdicts += 1
                    self.last_heard[addr] = now  # progress counts as life
                    debug(f"process {addr[0]}.{addr[1]} silent for {silent:.1f} s but busy: not dead", self.rt.addr)
                    continue
                self.forget(addr)
                self.rt.failures.declare_dead(
                    addr, f"stopped answering: silent for {silent:.1f} s (MPIMESH_HEARTBEAT_TIMEOUT={self.timeout:g})"
                )
            elif silent > self.ping_after or now - self._pinged.get(addr, 0.0) > self.timeout / 2:
                if silent > self.timeout / 2 and addr in self._pids:
                    # An idle worker answers its PING within milliseconds, so
                    # it never gets here: /proc is read for the silent only.
                    self._note_quiet(addr, heard, now)
                self._pinged[addr] = now
                self._ping += 1
                try:
                    self.rt.router.send_quiet(addr, protocol.ping(self._ping))
                except ConnectionError:
                    pass

    def _note_quiet(self, addr: Addr, heard: float, now: float) -> None:
        # A same-host worker went quiet: note its CPU time, once per silence.
        quiet = self._quiet.get(addr)
        if quiet is not None and quiet[0] == heard:
            return
        seen = self._proc(self._pids[addr])
        if seen is not None:
            self._quiet[addr] = (heard, seen[1], now)

    def _busy(self, addr: Addr, heard: float, now: float) -> bool:
        # Whether a worker silent past the timeout is busy rather than dead:
        # a same-host one that is not stopped and runs, or used CPU since it
        # went quiet (see the module's docstring).
        pid = self._pids.get(addr)
        if pid is None:
            return False  # another host: silence is all there is
        seen = self._proc(pid)
        if seen is None:
            return False  # gone: the pidfd tells why at the next check
        state, cpu, running = seen
        if state in "Tt":
            return False  # stopped: silent until someone resumes it
        quiet = self._quiet.get(addr)
        self._quiet[addr] = (now, cpu, now)  # the next window starts now
        if running:
            return True
        if quiet is None or quiet[0] != heard:
            return True  # no measure of this silence yet: give it one window
        return cpu - quiet[1] >= BUSY_CPU * (now - quiet[2])

    def cause(self, addr: Addr, status: int | None = None) -> str:
        """Why ``addr`` died: from its last words if it left any, else from its wait status if known."""
        return exit_cause(self.rt.pid, addr, status)

    def close(self) -> None:
        """Stop watching everything and remove the job's last-words directory."""
        for addr in list(self._by_addr):
            self.forget(addr)
        shutil.rmtree(job_dir(self.rt.pid), ignore_errors=True)
