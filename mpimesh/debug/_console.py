"""The controller's side of the debugger: the ``mpimesh_dbg>`` prompt on the controller's terminal.

A :class:`Console` keeps the paused sessions (one per actor and rank that
hit a breakpoint, or that ``pm()`` examines) and, while there is at least
one, runs the prompt on a thread of its own: it reads the controller's
stdin (under ``mpirun`` the launcher forwards its stdin to rank 0), prints
on its stdout, and sends each line to the session it is meant for.  The
script's main thread stays blocked in whatever it waits on.  When no
session is left the thread ends and the prompt goes away.

Events from the sessions (a new pause, output, a resume) arrive on the debug
controller's actor thread and are queued; only the prompt's thread reads
them, so the sessions' state has one writer.  Every wait here also watches
the sessions' processes: a rank that dies while paused is dropped, with a
notice, rather than waited for.
"""

from __future__ import annotations

import itertools
import os
import queue
import select
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._core.current import current
from ._commands import CONTINUE_ALL, HELP, Command, parse

__all__ = ["PROMPT", "Console", "Session"]

#: The debugger's prompt.
PROMPT = "mpimesh_dbg> "
# Set in the ranks of a job that a launcher started (Open MPI, MPICH's Hydra, Slurm).
_LAUNCHED = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_PROCID")
# How long a wait for stdin or for the sessions' events sleeps between looks.
_TICK = 0.05


# Launcher processes (as /proc/PID/comm names them) whose stdin rank 0 reads through.
_LAUNCHERS = frozenset({"prterun", "mpirun", "mpiexec", "orterun", "prted", "mpiexec.hydra", "hydra_pmi_proxy",
                        "srun", "slurmstepd"})


def _launcher_stdin() -> str:
    """What the nearest launcher among this process's ancestors reads as stdin (``/proc``); ``""`` if unknown."""
    pid = os.getppid()
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() in _LAUNCHERS:
                    return os.readlink(f"/proc/{pid}/fd/0")
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return ""
        if pid <= 1:
            return ""
    return ""


class _Interrupted:
    """What a read returns when the condition it watched came true before a line did."""


_INTERRUPTED = _Interrupted()


@dataclass
class Session:
    """One paused actor: who it is, where it stopped, and its output not yet shown."""

    sid: int
    name: str
    rank: int
    coords: dict[str, int]
    host: str
    actor_id: str
    kind: str
    #: ``Port`` on which the actor reads its next pdb line
    port: Any
    #: ``(file, line, function)`` where pdb is
    where: tuple[str, int, str]
    #: ``"paused"`` (at the pdb prompt) or ``"running"`` (stepping, or not yet at the prompt)
    state: str = "running"
    output: list[str] = field(default_factory=list)
    #: output of a ``cast`` in progress, kept apart from :attr:`output`
    collect: list[str] | None = None
    #: told to continue by ``continue`` (or end of input)
    released: bool = False
    #: its pause has been announced on the terminal
    announced: bool = False

    @property
    def label(self) -> str:
        """``actor 'trainers' rank 1``."""
        return f"actor {self.name!r} rank {self.rank}"

    @property
    def addr(self) -> tuple[int, int]:
        """The address of the actor's process, from its id ``name[rank]@island.rank``."""
        island, _, rank = self.actor_id.rpartition("@")[2].partition(".")
        return int(island), int(rank)

    def row(self) -> dict[str, Any]:
        """This session as a row of ``list``."""
        path, line, function = self.where
        return {"actor": self.name, "rank": self.rank, "coords": dict(self.coords), "host": self.host,
                "function": function, "line": f"{os.path.basename(path)}:{line}", "kind": self.kind,
                "state": self.state}


def _coords(coords: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in coords.items()) or "-"


class Console:
    """The paused sessions and the prompt that drives them.

    Args:
        fd: the file descriptor to read commands from (the controller's stdin).
        write: where the prompt's text goes (default: ``sys.stdout``, looked up at each write).
    """

    def __init__(self, fd: int = 0, write: Callable[[str], Any] | None = None) -> None:
        self._fd = fd
        self._write_fn = write
        self._lock = threading.Lock()
        self._events: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._pending = b""
        self._attached: Session | None = None
        self._prompting = False
        # Under a launcher rank 0's output is forwarded by whole lines (Open
        # MPI's mpirun, even through the pty it gives the rank; srun): a
        # prompt with no newline would show only after the next line.  There,
        # and where stdout is no terminal, a prompt ends its line.
        self._line_prompts = write is None and (not os.isatty(1) or any(name in os.environ for name in _LAUNCHED))
        self._at_line_start = True
        #: the sessions, by id; added by :meth:`enter`, removed by the prompt's thread
        self.sessions: dict[int, Session] = {}
        #: why no prompt can be shown ("" while the terminal works)
        self.closed = ""
        try:
            os.fstat(fd)
        except OSError:
            self.closed = "the controller has no stdin"
        else:
            if write is None and any(name in os.environ for name in _LAUNCHED) and _launcher_stdin() == "/dev/null":
                # A launcher keeps rank 0's stdin open even when its own is
                # /dev/null (measured: Open MPI 5's prterun): no end of input
                # would ever come, so this is known to be no terminal now.
                self.closed = "the launcher's stdin is /dev/null"

    # --- from the debug controller's actor thread --------------------------------------------------

    def enter(self, info: dict[str, Any], port: Any) -> tuple[int, str]:
        """A rank pauses: a new session, and the prompt if it is not up; returns ``(id, "")``.

        Returns ``(-1, why)`` when the rank must not pause: the controller's
        stdin is closed (``why`` says so) or ``PYTHONBREAKPOINT=0`` is set
        here (``why`` is empty).
        """
        if os.environ.get("PYTHONBREAKPOINT") == "0":
            return -1, ""
        with self._lock:
            if self.closed:
                return -1, self.closed
            sid = next(self._ids)
            self.sessions[sid] = Session(sid, info["name"], info["rank"], info["coords"], info["host"],
                                         info["actor_id"], info["kind"], port, tuple(info["where"]))
            self._events.put(("enter", sid))
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="mpimesh-debugger", daemon=True)
                self._thread.start()
        return sid, ""

    def output(self, sid: int, text: str, state: str, where: tuple[str, int, str]) -> None:
        """A session's pdb output since its last message, and its state now."""
        self._events.put(("output", sid, text, state, tuple(where)))

    def rows(self) -> list[dict[str, Any]]:
        """The sessions as ``list`` shows them."""
        with self._lock:
            return [s.row() for s in sorted(self.sessions.values(), key=lambda s: (s.name, s.rank))]

    # --- output --------------------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        if text:
            self._at_line_start = text.endswith("\n")
        if self._write_fn is not None:
            self._write_fn(text)
            return
        sys.stdout.write(text)
        sys.stdout.flush()

    def _notice(self, text: str) -> None:
        # A line that arrives while the prompt waits for input: on a line of its own, then the prompt again.
        if self._prompting:
            self._write(f"{'' if self._at_line_start else chr(10)}{text}\n{PROMPT}")
            self._end_prompt()
        else:
            self._write(f"{text}\n")

    # --- events --------------------------------------------------------------------------------------

    def _drain(self, block: float = 0.0) -> None:
        """Apply the queued events (waiting up to ``block`` seconds for the first)."""
        try:
            event = self._events.get(timeout=block) if block > 0 else self._events.get_nowait()
        except queue.Empty:
            event = None
        while event is not None:
            self._apply(event)
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                event = None
        self._drop_dead()

    def _apply(self, event: tuple[Any, ...]) -> None:
        session = self.sessions.get(event[1])
        if session is None:
            return
        if event[0] == "enter":
            return  # announced once at its prompt (below): `list` then shows it paused
        _, _, text, state, where = event
        session.where = where
        if state == "paused" and not session.announced:
            session.announced = True
            path, line, function = where
            self._notice(f"mpimesh: {session.label} ({_coords(session.coords)}) on {session.host} paused "
                         f"({session.kind}) at {os.path.basename(path)}:{line} in {function}()")
        if session is self._attached:
            self._write(text)
        elif session.collect is not None:
            session.collect.append(text)
        else:
            session.output.append(text)
        session.state = state
        if state == "ended":
            self._remove(session)
            if session is not self._attached and session.collect is None and not session.released:
                self._notice(f"mpimesh: {session.label} resumed")  # `continue` said so for all already

    def _remove(self, session: Session) -> None:
        with self._lock:
            self.sessions.pop(session.sid, None)

    def _drop_dead(self) -> None:
        dead = current().dead
        if not dead:
            return
        for session in list(self.sessions.values()):
            report = dead.get(session.addr)
            if report is not None:
                self._remove(session)
                session.state = "ended"
                self._notice(f"mpimesh: {session.label} is gone: {report}")

    def _wait_for(self, done: Callable[[], bool]) -> None:
        """Apply events until ``done()``; each of them ends with its sessions (a resume or a death)."""
        while not done():
            self._drain(_TICK)

    # --- input ---------------------------------------------------------------------------------------

    def _end_prompt(self) -> None:
        # Where output goes by whole lines, a prompt must end its line to be seen.
        if self._line_prompts and not self._at_line_start:
            self._write("\n")

    def _readline(self, stop: Callable[[], bool]) -> str | _Interrupted | None:
        """The next line of stdin, applying events meanwhile; None at end of input, ``_INTERRUPTED`` if ``stop()``."""
        while True:
            self._drain()
            self._end_prompt()
            if b"\n" in self._pending:
                line, _, self._pending = self._pending.partition(b"\n")
                return line.decode(errors="replace")
            if stop():
                return _INTERRUPTED
            try:
                ready, _, _ = select.select([self._fd], [], [], _TICK)
                data = os.read(self._fd, 4096) if ready else None
            except OSError:
                data = b""
            if data == b"":
                if self._pending:
                    line, self._pending = self._pending, b""
                    return line.decode(errors="replace")
                return None
            if data:
                self._pending += data

    def _send(self, session: Session, line: str) -> None:
        session.state = "running"
        session.port.send(line)

    # --- the prompt ----------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # the prompt must not leave ranks paused for ever
            print(f"mpimesh: the debugger failed ({type(exc).__name__}: {exc}); continuing every paused rank",
                  file=sys.stderr, flush=True)
            with self._lock:
                self.closed = f"the debugger failed: {exc}"
                sessions = list(self.sessions.values())
            for session in sessions:
                try:
                    session.port.send(CONTINUE_ALL)
                except Exception as failed:
                    print(f"mpimesh: cannot resume {session.label}: {failed}", file=sys.stderr, flush=True)
            with self._lock:
                self.sessions.clear()
                self._thread = None

    def _serve(self) -> None:
        while True:
            self._drain()
            with self._lock:
                if not self.sessions:
                    self._thread = None
                    return
            auto = self._auto()
            if auto is not None:
                self._attach(auto)
                continue
            self._write(PROMPT)
            self._prompting = True
            try:
                line = self._readline(lambda: not self.sessions or self._auto() is not None)
            finally:
                self._prompting = False
            if line is None:
                self._end_of_input()
            elif isinstance(line, _Interrupted):
                self._write("\n")
            else:
                self._command(line)

    def _auto(self) -> Session | None:
        # A post-mortem session is attached to at once: pm() asked for it.
        return next((s for s in self.sessions.values() if s.kind == "post-mortem" and s.state == "paused"), None)

    def _command(self, line: str) -> None:
        try:
            command = parse(line)
        except ValueError as exc:
            self._write(f"mpimesh: {exc}\n")
            return
        verb = command.verb
        if verb == "help":
            self._write(HELP + "\n")
        elif verb == "list":
            self._list()
        elif verb == "attach":
            session = self._find(command)
            if session is not None:
                self._attach(session)
        elif verb == "cast":
            self._cast(command)
        elif verb == "continue":
            self._continue_all()
        elif verb == "detach":
            self._write("mpimesh: not attached to any rank; `attach <actor> <rank>` first\n")

    def _list(self) -> None:
        rows = self.rows()
        table = [("actor", "rank", "coords", "host", "function", "line", "state")]
        table += [(r["actor"], str(r["rank"]), _coords(r["coords"]), r["host"], r["function"], r["line"],
                   r["state"] if r["kind"] == "breakpoint" else f"{r['state']} ({r['kind']})") for r in rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        self._write("".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
                            for row in table))

    def _find(self, command: Command) -> Session | None:
        found = [s for s in self.sessions.values() if s.name == command.actor]
        if not found:
            names = sorted({s.name for s in self.sessions.values()})
            self._write(f"mpimesh: no paused actor named {command.actor!r}; paused: {', '.join(names)}\n")
            return None
        session = next((s for s in found if s.rank == command.rank), None)
        if session is None:
            ranks = ", ".join(str(s.rank) for s in sorted(found, key=lambda s: s.rank))
            self._write(f"mpimesh: actor {command.actor!r} has no paused rank {command.rank}; paused ranks: {ranks}\n")
        return session

    def _attach(self, session: Session) -> None:
        self._attached = session
        self._write(f"mpimesh: attached to {session.label}; `detach` comes back to the {PROMPT.strip()} prompt\n")
        try:
            self._write("".join(session.output))
            session.output.clear()
            while True:
                self._wait_for(lambda: session.state != "running")
                if session.state == "ended":
                    self._write(f"mpimesh: {session.label} resumed\n")
                    return
                line = self._readline(lambda: session.state == "ended")
                if line is None:
                    self._end_of_input()
                    return
                if isinstance(line, _Interrupted):
                    continue
                if line.strip() == "detach":
                    self._write(f"mpimesh: detached from {session.label}\n")
                    return
                self._send(session, line)
        finally:
            self._attached = None

    def _cast(self, command: Command) -> None:
        ranks = command.ranks
        assert ranks is not None  # parse() sets it for cast
        targets = sorted((s for s in self.sessions.values()
                          if s.name == command.actor and ranks.matches(s.rank, s.coords)), key=lambda s: s.rank)
        if not targets:
            self._write(f"mpimesh: no paused rank of actor {command.actor!r} is in the ranks given; "
                        "`list` shows the paused ranks\n")
            return
        self._wait_for(lambda: all(s.state != "running" for s in targets))
        for session in targets:
            session.collect = []
            if session.state == "paused":
                self._send(session, command.pdb)
        try:
            self._wait_for(lambda: all(s.state != "running" for s in targets))
        finally:
            texts = [(s, "".join(s.collect or [])) for s in targets]
            for session in targets:
                session.collect = None
        for session, text in texts:
            text = text.removesuffix("(Pdb) ")
            lines = text.splitlines() or [""]
            self._write("".join(f"[{session.name} {session.rank}] {line}\n" for line in lines))
            if session.state == "ended":
                self._write(f"mpimesh: {session.label} resumed\n")

    def _continue_all(self, *, every: bool = False) -> None:
        """Resume the ranks paused now (clearing their breakpoints); with ``every``, also those that pause meanwhile.

        A rank that stops again later (another ``breakpoint()``) is a new
        session, left for the prompt.
        """
        targets = list(self.sessions.values())
        self._write(f"mpimesh: continuing {len(targets)} paused rank(s), breakpoints cleared\n")
        while True:
            if every:
                targets = list(self.sessions.values())
            live = [s for s in targets if s.sid in self.sessions]
            if not live:
                return
            for session in live:
                if session.state == "paused" and not session.released:
                    session.released = True
                    self._send(session, CONTINUE_ALL)
            self._drain(_TICK)

    def _end_of_input(self) -> None:
        with self._lock:
            self.closed = "the controller's stdin is closed"
        self._write("\nmpimesh: end of input on the controller's stdin: continuing every paused rank; "
                    "later breakpoints are skipped\n")
        self._continue_all(every=True)
