"""The job's debug controller (Monarch's ``debug_controller()``), and ``pm()``.

:class:`DebugController` is a singleton actor in the controller's process
(``get_or_spawn_controller``): a paused actor announces itself with
``enter``, sends its pdb output with ``output``, and reads its input from a
channel whose port it passed to ``enter``.  The prompt itself is a
:class:`~._console.Console` on a thread of the controller's process.
"""

from __future__ import annotations

from typing import Any

from .._core import protocol
from .._core.current import current
from .._core.ports import OneReply
from ..actor import Actor, endpoint
from ..errors import ActorError
from ..proc_mesh import get_or_spawn_controller

__all__ = ["DebugController", "debug_controller", "pm"]

#: The debug controller's name among the job's singleton actors.
NAME = "mpimesh_debug_controller"

# This process's handle on the debug controller, once asked for.
_mesh: Any = None


class DebugController(Actor):
    """The job's debugger: the sessions of paused actors and the ``mpimesh_dbg>`` prompt.

    One per job, in the controller's process; get it with
    :func:`debug_controller`.  Its endpoints are called by the actors that
    pause (``enter``, ``output``); ``sessions`` lists them for a script.
    The prompt reads the controller's stdin and writes its stdout.
    """

    def __init__(self) -> None:
        from ._console import Console  # the controller's process only, when a rank first pauses

        self.console = Console()

    @endpoint
    def enter(self, info: dict[str, Any], port: Any) -> tuple[int, str]:
        """A rank pauses (``info``: name, rank, coords, host, actor_id, where, kind); it reads lines from ``port``.

        Returns:
            ``(session id, "")``, or ``(-1, why)`` when it must not pause
            (no terminal; ``why`` is empty for ``PYTHONBREAKPOINT=0``).
        """
        return self.console.enter(info, port)

    @endpoint
    def output(self, sid: int, text: str, state: str, where: tuple[str, int, str]) -> None:
        """Session ``sid``'s pdb output since its last call; ``state``: ``paused``, ``running`` or ``ended``."""
        self.console.output(sid, text, state, where)

    @endpoint
    def sessions(self) -> list[dict[str, Any]]:
        """The paused ranks, as ``list`` shows them: actor, rank, coords, host, function, line, kind, state."""
        return self.console.rows()


def debug_controller() -> Any:
    """The job's :class:`DebugController` (an actor mesh of one), spawned on first use (blocking).

    As Monarch's ``monarch.actor.debug_controller()``; any process may ask.
    ``debug_controller().sessions.call_one().get()`` lists the paused ranks.
    """
    global _mesh
    if _mesh is None:
        _mesh = get_or_spawn_controller(NAME, DebugController).get()
    return _mesh


def _address(actor_id: str) -> tuple[int, int]:
    # name[rank]@island.rank -> (island, rank)
    island, _, rank = actor_id.rpartition("@")[2].partition(".")
    return int(island), int(rank)


def pm(error: ActorError, *, timeout: float | None = None) -> None:
    """A post-mortem pdb, on the controller's terminal, of the remote frames of ``error``.

    ``error`` is an :class:`~mpimesh.ActorError` the script caught; the
    actor that raised it keeps the traceback of its last failed call (one per
    actor, dropped when the actor stops, so the frames' locals stay alive
    until then).  Blocks until the session ends (``continue`` or ``quit``).
    With no terminal on the controller, the actor prints a one-line notice
    and this returns at once.

    Args:
        error: the error of a call to an actor's endpoint.
        timeout: seconds to wait for the session to end; ``None``: no limit.

    Raises:
        TypeError: ``error`` is not an ``ActorError``.
        ValueError: ``error`` names no actor, or the actor no longer keeps
            its traceback (it stopped, or a later call failed).
        SupervisionError: the actor's process has died.
        TimeoutError: the session did not end within ``timeout``.
    """
    if not isinstance(error, ActorError):
        raise TypeError(f"pm() needs an ActorError, got {type(error).__name__}; "
                        "catch the error of fut.get() with `except mpimesh.ActorError as error`")
    if not error.actor_id:
        raise ValueError(f"cannot debug {error.header or 'this error'} post mortem: it names no actor")
    rt = current()
    addr = _address(error.actor_id)
    reply = OneReply("mpimesh.debug.pm()", f"pm({error.actor_id})", addr)
    port = (rt.addr, rt.ports.open(reply))
    rt.send(addr, protocol.debug("pm", (error.actor_id, port)))
    why: str = reply.get(timeout)
    if why:
        raise ValueError(f"cannot debug actor {error.actor_id} post mortem: {why}")
