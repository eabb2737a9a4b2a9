"""An actor's lifecycle: its phases, and every move between them in one place.

::

    STARTING ──> INITIALIZING ──> RUNNING ──> STOPPED
        │              │             │
        │              └─────────────┴──> FAILED
        └──────────────┴──> STOPPED (let go before __init__ returned: "abandoned")

FAILED and STOPPED are final.  A failure after the actor has stopped is still
reported (by its cell) but leaves it stopped; a stop after it failed leaves
it failed, which is what later calls are told.  Any other move raises
:class:`~mpimesh.errors.MeshInternalError`.

The phase is written by the actor's thread, and by the polling thread when
it lets go of an actor whose ``__init__`` has not returned (see
``ActorCell.stop``): every move takes the lifecycle's lock.  Readers (the
call path, once per call) read the phase without it.
"""

from __future__ import annotations

import enum
import threading

from ..errors import MeshInternalError

__all__ = ["Lifecycle", "Phase"]


class Phase(enum.Enum):
    """Where an actor is in its life (its value is how messages name it: ``is stopped``)."""

    #: its thread exists; ``__init__`` has not begun
    STARTING = "starting"
    #: ``__init__`` runs
    INITIALIZING = "initializing"
    #: ``__init__`` returned: it takes calls
    RUNNING = "running"
    #: an endpoint failed, a failure it owns went unhandled, or it aborted: it refuses calls
    FAILED = "failed"
    #: stopped, or let go before its ``__init__`` returned
    STOPPED = "stopped"


_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset((Phase.INITIALIZING, Phase.STOPPED)),
    Phase.INITIALIZING: frozenset((Phase.RUNNING, Phase.FAILED, Phase.STOPPED)),
    Phase.RUNNING: frozenset((Phase.FAILED, Phase.STOPPED)),
    Phase.FAILED: frozenset(),
    Phase.STOPPED: frozenset(),
}


class Lifecycle:
    """One actor's phase, why it failed or stopped, and the moves between phases.

    Args:
        actor_id: the actor's id, for the message of a move that is refused.
    """

    __slots__ = ("phase", "failure", "stop_reason", "abandoned", "_actor_id", "_lock")

    def __init__(self, actor_id: str) -> None:
        self.phase = Phase.STARTING
        #: why it failed, once FAILED (Monarch's "unhealthy with reason")
        self.failure: str | None = None
        #: why it was stopped, once a stop began
        self.stop_reason: str | None = None
        #: let go while its ``__init__`` had not returned (it may never)
        self.abandoned = False
        self._actor_id = actor_id
        self._lock = threading.Lock()

    def _move(self, to: Phase) -> None:
        # The one writer of `phase` (under the lock).
        if to not in _NEXT[self.phase]:
            raise MeshInternalError(f"actor {self._actor_id} cannot go from {self.phase.value} to {to.value}")
        self.phase = to

    def begin_init(self) -> bool:
        """``__init__`` begins: False if the actor was let go before it could (see :meth:`abandon`)."""
        with self._lock:
            if self.phase is Phase.STOPPED:
                return False
            self._move(Phase.INITIALIZING)
            return True

    def init_returned(self) -> bool:
        """``__init__`` returned: the actor runs; False if it was let go meanwhile (it never runs).

        An actor that aborted inside its ``__init__`` stays failed.
        """
        with self._lock:
            if self.phase is Phase.STOPPED:
                return False
            if self.phase is not Phase.FAILED:
                self._move(Phase.RUNNING)
            return True

    def abandon(self, reason: str) -> bool:
        """Let go of an actor whose ``__init__`` has not returned: stopped now; False if it had returned."""
        with self._lock:
            if self.phase is not Phase.STARTING and self.phase is not Phase.INITIALIZING:
                return False
            self._move(Phase.STOPPED)
            self.abandoned = True
            self.stop_reason = reason
            return True

    def fail(self, failure: str) -> None:
        """The actor has failed because of ``failure`` (a later failure's text replaces an earlier one's)."""
        with self._lock:
            self.failure = failure
            if self.phase is not Phase.FAILED and self.phase is not Phase.STOPPED:
                self._move(Phase.FAILED)

    def stopping(self, reason: str) -> None:
        """A stop begins (``__cleanup__`` is next): remember why, for the calls refused later."""
        self.stop_reason = reason

    def stopped(self) -> None:
        """The actor has stopped, or its thread has ended: STOPPED, unless it failed."""
        with self._lock:
            if self.phase is not Phase.FAILED and self.phase is not Phase.STOPPED:
                self._move(Phase.STOPPED)

    def why_not(self) -> str:
        """Why a call is refused, after the actor's id: ``is stopped``, ``is unhealthy with reason: ...``."""
        if self.phase is Phase.FAILED:
            return f"is unhealthy with reason: {self.failure}"
        return f"is {self.phase.value}"
