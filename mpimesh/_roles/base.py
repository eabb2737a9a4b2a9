"""What the controller and the workers share: their handlers, their stop, their background loop.

A role is the object that makes one process's :class:`~mpimesh._core.runtime.Runtime`
the controller's or a worker's, in the manner of execnet's ``Gateway`` and
``WorkerGateway`` over ``BaseGateway``.  It registers a handler for each kind
in :data:`ROLE_KINDS` (the kinds whose handling depends on the role: the
other role's kinds are unexpected), and answers the runtime's questions
through the :class:`~mpimesh._core.runtime.Role` protocol: each subclass
makes itself the runtime's ``role`` at the end of its constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._core.protocol import NAMES, Frame, Kind
from .._core.runtime import Handler, Runtime
from ..errors import MeshInternalError

__all__ = ["ROLE_KINDS", "BaseRole"]

Addr = tuple[int, int]

#: The kinds whose handler is the role's; every other kind is the runtime's.
ROLE_KINDS = (Kind.INIT, Kind.HELLO, Kind.SHUTDOWN, Kind.BYE, Kind.FORWARD, Kind.ALLOCATE, Kind.JOB_HOSTS,
              Kind.NAMED_ACTOR, Kind.RELEASE, Kind.PING, Kind.LOG, Kind.WATCH, Kind.EXITED,
              Kind.SHRINK)


class BaseRole:
    """The part of a role that the controller and the workers share.

    Args:
        runtime: this process's runtime; the role becomes its ``role``.
        handlers: this role's handler of each kind of :data:`ROLE_KINDS`
            it receives; the others are registered as :meth:`unexpected`.
    """

    #: the role's name in messages
    name = "role"

    def __init__(self, runtime: Runtime, handlers: dict[int, Handler]) -> None:
        self.rt = runtime
        #: set by :meth:`request_stop`: the background loop returns
        self.stopping = False
        #: the status this process exits with
        self.exit_code = 0
        for kind in ROLE_KINDS:
            runtime.handle(kind, handlers.get(kind, self.unexpected))

    def unexpected(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """A frame of a kind that only the other role receives.

        Raises:
            MeshInternalError: always.
        """
        raise MeshInternalError(f"{NAMES.get(frame[0], frame[0])} frame from {src} reached {self.name} {self.rt.addr}")

    def request_stop(self, code: int) -> None:
        """Make the background loop return, this process to exit with ``code``."""
        rt = self.rt
        with rt.cond:
            self.exit_code = code
            self.stopping = True
            rt.cond.notify_all()
        rt.progress.wake()

    def _loop(self, period: float, between: Callable[[], None]) -> None:
        # The background waiter: poll when no other thread does, and run
        # ``between()`` at least every ``period`` seconds, until stopped.
        rt = self.rt
        while not self.stopping:
            rt.progress.wait(lambda: self.stopping, rt.cond, period, background=True)
            between()
