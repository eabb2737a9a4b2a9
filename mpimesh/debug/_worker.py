"""The actor's side of the debugger: a pdb whose terminal is the controller's.

On every worker, ``sys.breakpointhook`` and ``pdb.set_trace`` are replaced
(:func:`install`, run as each runtime is installed): called from an actor's
endpoint, they pause that actor only, in a :class:`RemotePdb` whose stdin and
stdout are messages to and from the job's debug controller
(``_controller.DebugController``, a singleton actor in the controller's
process).  Its output goes with endpoint calls; its input comes back on a
channel of its own.  No port is opened, no second program is needed.

While it waits for a line the actor's thread waits on a future, as any
caller does, so the process keeps polling: its heartbeats are answered and
its other actors keep serving; only the paused actor's mailbox waits.

Post-mortem: each actor keeps the exception of its last failed call
(``_core.actor_cell``: one per actor, dropped when it stops); a DEBUG ``"pm"``
frame (:func:`mpimesh.debug.pm`) opens a pdb on its traceback, on a thread
of its own, in the same way.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from .._core import hooks as _hooks
from .._core.current import current
from .._core.protocol import CONTROLLER, Frame, Kind, Status
from ..context import Context, _context_var, context
from ._commands import CONTINUE_ALL

if TYPE_CHECKING:
    import pdb

    from .._core.runtime import Runtime

__all__ = ["Agent", "RemotePdb", "install"]

Addr = tuple[int, int]

# How often a paused actor looks whether its process is shutting down.
_LOOK_EVERY = 1.0

_previous_hook: Callable[..., Any] | None = None


def _actor() -> Any:
    """The actor (``_core.actor_cell.ActorCell``) whose endpoint the calling thread runs, or None."""
    return context().actor_instance._actor


# cloudpickle names the code of functions it ships by value (those of the
# script's __main__) "<dynamic-code>", but keeps their globals' __file__.
_DYNAMIC = "<dynamic-code>"


def _where(frame: FrameType | None) -> tuple[str, int, str]:
    if frame is None:
        return ("?", 0, "?")
    path = frame.f_code.co_filename
    if path == _DYNAMIC:
        path = str(frame.f_globals.get("__file__") or path)
    return (path, frame.f_lineno, frame.f_code.co_name)


def _find_source(frame: FrameType | None) -> str:
    """Let pdb show the source of code shipped by value (the script's classes); returns its file, or ``""``.

    Only when the file is readable here (the same host, or a shared file system).
    """
    if frame is None or frame.f_code.co_filename != _DYNAMIC:
        return ""
    import linecache

    path = str(frame.f_globals.get("__file__"))
    try:
        with open(path) as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError):
        return ""  # another host without the file: pdb says it has no source
    # Line numbers are the original ones (cloudpickle keeps them); mtime None: never checked again.
    linecache.cache[_DYNAMIC] = (sum(map(len, lines)), None, lines, path)
    return path


class _Terminal:
    """pdb's stdin and stdout: output to the debug controller, input from a channel.

    Output is kept until pdb reads a line, then sent with the session's new
    state, so a prompt and what led to it arrive together.

    Args:
        actor: the paused actor.
        kind: ``"breakpoint"`` or ``"post-mortem"``.
    """

    def __init__(self, actor: Any, kind: str) -> None:
        from ..channel import Channel

        self.actor = actor
        self.kind = kind
        self.sid = -1
        self.where: tuple[str, int, str] = ("?", 0, "?")
        self._out: list[str] = []
        self._port, self._inbox = Channel.open()
        self._controller: Any = None

    # -- the session -----------------------------------------------------

    def open(self) -> bool:
        """Announce the pause to the debug controller; False when it says not to pause (blocking)."""
        from ._controller import debug_controller

        actor = self.actor
        self._controller = debug_controller()
        info = {
            "name": actor.name, "rank": actor.point.rank, "coords": dict(actor.point), "host": current().host,
            "actor_id": actor.actor_id, "where": self.where, "kind": self.kind,
        }
        sid, notice = self._controller.enter.call_one(info, self._port).get()
        if sid < 0:
            if notice:
                path, line, function = self.where
                print(f"mpimesh: {self.kind} at {os.path.basename(path)}:{line} in {function}() of actor "
                      f"{actor.name!r} rank {actor.point.rank} skipped: {notice}", file=sys.stderr, flush=True)
            return False
        self.sid = sid
        return True

    def send(self, state: str) -> None:
        """Send the output kept so far, and the session's state: ``paused``, ``running`` or ``ended``."""
        text = "".join(self._out)
        self._out.clear()
        self._controller.output.broadcast(self.sid, text, state, self.where)
        if state == "ended":
            self.sid = -1

    # -- the file interface pdb uses -------------------------------------

    def write(self, text: str) -> int:
        """Keep ``text`` for the next send."""
        self._out.append(text)
        return len(text)

    def flush(self) -> None:
        """Nothing: output leaves with the next prompt."""

    def readline(self) -> str:
        """Send the output and wait for the controller's next line (blocking)."""
        self.send("paused")
        line = self._inbox.recv()
        role = getattr(current(), "role", None)
        while True:
            try:
                text: str = line.get(_LOOK_EVERY)
            except TimeoutError:
                if getattr(role, "stopping", False):
                    return CONTINUE_ALL + "\n"  # the job ends: let the endpoint finish
                continue
            return text + "\n"


def _remote_pdb_class() -> type[pdb.Pdb]:
    import pdb

    class _RemotePdb(pdb.Pdb):
        """A pdb on a :class:`_Terminal`; each stop is announced, each resume reported."""

        def __init__(self, terminal: _Terminal, post_mortem: bool = False) -> None:
            super().__init__(stdin=terminal, stdout=terminal, nosigint=True, readrc=False)  # type: ignore[arg-type]
            self.terminal = terminal
            self.post_mortem = post_mortem
            self._ended = False
            #: the file of the code shipped by value that pdb shows, once found
            self.dynamic_path = ""

        def canonic(self, filename: str) -> str:
            # "> script.py(23)step()" rather than "<dynamic-code>", and breakpoints by the script's name
            if filename == _DYNAMIC and self.dynamic_path:
                return self.dynamic_path
            return str(super().canonic(filename))

        def interaction(self, frame: FrameType | None, traceback: TracebackType | None) -> None:
            """One stop: open the session if it is new, run the prompt, say whether the rank still steps."""
            term = self.terminal
            here = frame
            if here is None and traceback is not None:
                while traceback.tb_next is not None:
                    traceback = traceback.tb_next
                here = traceback.tb_frame
            term.where = _where(here)
            self.dynamic_path = _find_source(here) or self.dynamic_path
            if term.sid < 0 and not term.open():
                self.set_continue()
                return
            self._ended = False
            try:
                super().interaction(frame, traceback)
            finally:
                term.where = _where(getattr(self, "curframe", None))
                term.send("ended" if self._ended or self.post_mortem else "running")

        def preloop(self) -> None:
            # Before each prompt: `list` on the console shows the frame pdb is in.
            self.terminal.where = _where(getattr(self, "curframe", None))

        def postcmd(self, stop: bool, line: str) -> bool:
            self.terminal.where = _where(getattr(self, "curframe", None))
            return stop

        def onecmd(self, line: str) -> bool:
            if line == CONTINUE_ALL:
                self.clear_all_breaks()
                return bool(self.do_continue(""))
            return bool(super().onecmd(line))

        def set_continue(self) -> None:
            self._ended = True
            super().set_continue()

        def set_quit(self) -> None:
            self._ended = True
            super().set_quit()

    return _RemotePdb


#: ``RemotePdb(terminal, post_mortem=False)``: made on first use (pdb is imported only then).
RemotePdb: Callable[..., Any] = lambda *args, **kwargs: _remote_pdb_class()(*args, **kwargs)  # noqa: E731


def _breakpoints_off() -> bool | None:
    # PYTHONBREAKPOINT: "0" disables, another hook than pdb's is called instead (None: ours).
    value = os.environ.get("PYTHONBREAKPOINT", "")
    if value == "0":
        return True
    if value and value != "pdb.set_trace":
        return False
    return None


def _pause(actor: Any, frame: FrameType, header: str | None = None) -> None:
    debugger = RemotePdb(_Terminal(actor, "breakpoint"))
    if header is not None:
        debugger.message(header)
    debugger.set_trace(frame)


def _breakpointhook(*args: Any, **kwargs: Any) -> Any:
    """``sys.breakpointhook`` on a worker: in an endpoint, pause the actor on the controller's terminal."""
    actor = _actor()
    if actor is None:
        return (_previous_hook or sys.__breakpointhook__)(*args, **kwargs)
    off = _breakpoints_off()
    if off:
        return None
    if off is False:
        return sys.__breakpointhook__(*args, **kwargs)
    _pause(actor, sys._getframe(1))
    return None


def _set_trace(*, header: str | None = None) -> None:
    """``pdb.set_trace`` on a worker: in an endpoint, as ``breakpoint()``; elsewhere pdb's own."""
    import pdb

    frame = sys._getframe(1)
    actor = _actor()
    if actor is None or _breakpoints_off() is not None:
        if _breakpoints_off():
            return
        debugger = pdb.Pdb()
        if header is not None:
            debugger.message(header)
        debugger.set_trace(frame)
        return
    _pause(actor, frame, header)


# --- post-mortem ---------------------------------------------------------------------------------


#: op -> ``fn(runtime, argument)``: DEBUG requests ``(argument, reply port)`` answered with ``fn``'s value.
_OPS: dict[str, Callable[[Any, Any], Any]] = {}


def register_op(op: str, fn: Callable[[Any, Any], Any]) -> None:
    """Answer DEBUG ``op`` frames in every process with ``fn(runtime, argument)`` (quick: on the polling thread)."""
    _OPS[op] = fn


def stacks(rt: Any, _: Any = None) -> list[dict[str, Any]]:
    """The current Python stack of every thread of this process, the actors' first (``"stack"`` op).

    Each entry: ``thread`` (its name), ``actor`` (the actor id whose thread it is, or ``""``), ``busy``
    (the endpoint it runs, or ``""``) and ``frames``: ``(file, line, function, source line)``, innermost last.
    """
    import traceback

    actors = {cell.thread.ident: cell for cell in list(rt.actors.live.values())}
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, top in sys._current_frames().items():
        cell = actors.get(ident)
        frames = []
        for summary in traceback.extract_stack(top):
            path, line, function = _where_summary(summary, top)
            frames.append((path, line, function, summary.line or ""))
        busy = getattr(cell, "busy", None)
        out.append({"thread": names.get(ident, str(ident)), "actor": cell.actor_id if cell is not None else "",
                    "busy": busy[0] if busy else "", "frames": frames})
    out.sort(key=lambda entry: (not entry["actor"], entry["thread"]))
    return out


def _where_summary(summary: Any, top: FrameType) -> tuple[str, int, str]:
    # the script's code shipped by value is named by its file, as the debugger names it
    path = summary.filename
    if path == _DYNAMIC:
        frame: FrameType | None = top
        while frame is not None and not (frame.f_code.co_name == summary.name and frame.f_lineno == summary.lineno):
            frame = frame.f_back
        if frame is not None:
            path = str(frame.f_globals.get("__file__") or path)
    return (path, summary.lineno or 0, summary.name)


register_op("stack", stacks)


class Agent:
    """Serves DEBUG frames in one process (see ``protocol.debug``).

    Args:
        runtime: this process's runtime.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    def on_debug(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """DEBUG: ``"pm"`` ``(actor id, reply port)`` opens a post-mortem pdb on that actor's last failure.

        The reply comes when the session ends: ``""``, or why there is none.
        Served off the polling thread: the session runs on a thread of its own.
        """
        _, _, op, arg = frame
        serve = _OPS.get(op)
        if serve is not None:
            # A quick look at this process (its stacks, the dashboard's figures), answered at once.
            value, port = serve(self.rt, arg[0]), arg[1]
            self.rt.reply(port, 0, Status.OK, value)
            return
        if op != "pm":
            return
        actor_id, port = arg
        actor = next((a for a in list(self.rt.actors.live.values()) if a.actor_id == actor_id), None)
        error = getattr(actor, "last_error", None)
        if actor is None or error is None or error.__traceback__ is None:
            why = "it has stopped" if actor is None else "it keeps no traceback (its last call did not fail)"
            self.rt.reply(port, 0, Status.OK, why)
            return
        thread = threading.Thread(target=self._post_mortem, args=(actor, error, port), daemon=True,
                                  name=f"mpimesh-debug-pm-{actor_id}")
        thread.start()

    def _post_mortem(self, actor: Any, error: BaseException, port: Any) -> None:
        _context_var.set(Context(actor.identity, actor.point))  # a thread of its own: its context is its own
        try:
            debugger = RemotePdb(_Terminal(actor, "post-mortem"), post_mortem=True)
            debugger.reset()
            debugger.interaction(None, error.__traceback__)
        except BaseException as exc:  # the caller of pm() hears of it
            self.rt.reply(port, 0, Status.OK, f"the post-mortem failed: {type(exc).__name__}: {exc}")
            return
        self.rt.reply(port, 0, Status.OK, "")


def install(rt: Runtime) -> None:
    """Serve DEBUG frames in ``rt``'s process; on a worker, route breakpoints in endpoints to the controller.

    The controller's own process keeps Python's hooks: its terminal is the
    debugger's, so a breakpoint there (in the script, or in an actor living
    beside it) is a plain local pdb.
    """
    global _previous_hook
    if Kind.DEBUG not in rt.handlers():  # installed once per runtime
        rt.handle(Kind.DEBUG, Agent(rt).on_debug)
    if rt.addr == CONTROLLER or sys.breakpointhook is _breakpointhook:
        return
    _previous_hook = sys.breakpointhook
    sys.breakpointhook = _breakpointhook
    import pdb

    pdb.set_trace = _set_trace


_hooks.register_on_install(install)
