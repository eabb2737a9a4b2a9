"""Every exception that mpimesh raises for runtime and distributed failures.

Misuse (a bad argument, an unknown dimension) raises a built-in type such as
``TypeError`` or ``ValueError``; the types here describe what went wrong on
another process, or inside the runtime.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ActorError",
    "DeviceMeshError",
    "MeshInternalError",
    "RemoteException",
    "RemoteTensorError",
    "RemoteTraceback",
    "SupervisionError",
]


class RemoteTraceback(Exception):
    """Where an exception was raised on another process: ``### rank 3 (gpus=3) on node17 in actor 'm'``.

    It is attached as ``__cause__`` of the original exception, so that an
    uncaught :class:`ActorError` prints the rank, its mesh coordinates and the
    host above its own text, which holds the remote traceback itself (as
    Monarch's does; so the traceback prints once).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RemoteException(Exception):
    """Stands in for a remote exception that could not be pickled or unpickled.

    ``type_name`` is the qualified name of the original exception type; the
    message is the original ``str()``.  Raised inside :class:`ActorError`
    (as ``.exception``), never on its own.
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(type_name, message)
        self.type_name = type_name
        self.message = message

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteException, (self.type_name, self.message))


class ActorError(Exception):
    """An endpoint raised an exception on a remote actor.

    Raised by ``Future.get()`` of ``call``, ``call_one``, ``choose`` and
    ``stream``.  The actor keeps serving: catch it like a local exception.

    Its text is Monarch's: a first line ``Actor call trainers.step failed at
    rank 3 (gpus=3) on node17 in actor 'trainers': ValueError: boom (from
    KeyError: 'x')``, then the remote traceback with its whole chain
    (``raise ... from`` and exceptions raised while handling others), each
    ``Traceback`` line reading ``Traceback of where the remote call failed``.
    ``message`` is the first line without ``Actor call ... failed``.

    Attributes:
        exception: the original exception (also ``__cause__``); a
            :class:`RemoteException` when the original could not travel.
        exception_formatted: the remote traceback text.
        header: ``### rank 3 (hosts=0, gpus=3) on node17 in actor 'trainers'``.
        rank: flat rank of the failing actor in its mesh.
        coords: its mesh coordinates.
        host: the host name of the failing process.
        causes: ``Type: message`` of the exceptions it was raised from
            (``raise ... from``) or while handling, innermost last.
        actor_id: the failing actor's id (``name[rank]@island.rank``), which
            ``mpimesh.debug.pm`` uses to find its traceback; ``""`` when the
            error did not come from an actor's endpoint.
        endpoint: ``mesh.method`` that failed (``mesh.__init__`` for a
            constructor); ``""`` when not an actor's endpoint.
    """

    def __init__(
        self,
        exception: BaseException,
        exception_formatted: str = "",
        header: str = "",
        *,
        rank: int = -1,
        coords: dict[str, int] | None = None,
        host: str = "",
        causes: tuple[str, ...] = (),
        actor_id: str = "",
        endpoint: str = "",
    ) -> None:
        super().__init__(exception, exception_formatted, header)
        self.exception = exception
        self.exception_formatted = exception_formatted
        self.header = header
        self.rank = rank
        self.coords = dict(coords or {})
        self.host = host
        self.causes = tuple(causes)
        self.actor_id = actor_id
        self.endpoint = endpoint
        self.__cause__ = exception

    @property
    def message(self) -> str:
        """One line: where it failed, what was raised, and what that was raised from."""
        text = f"{self.header.lstrip('# ')}: {type(self.exception).__name__}: {self.exception}"
        return text + "".join(f" (from {cause})" for cause in self.causes)

    def __str__(self) -> str:
        first = f"Actor call {self.endpoint} failed at {self.message}" if self.endpoint else (
            f"remote call failed at {self.message}")
        if not self.exception_formatted:
            return first
        remote = self.exception_formatted.rstrip("\n").replace(
            "Traceback (most recent call last):", "Traceback of where the remote call failed (most recent call last):")
        return f"{first}\n {remote}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_actor_error,
            (self.exception, self.exception_formatted, self.header, self.rank, self.coords, self.host, self.causes,
             self.actor_id, self.endpoint),
        )


def _rebuild_actor_error(
    exception: BaseException, formatted: str, header: str, rank: int, coords: dict[str, int], host: str,
    causes: tuple[str, ...] = (), actor_id: str = "", endpoint: str = "",
) -> ActorError:
    return ActorError(exception, formatted, header, rank=rank, coords=coords, host=host, causes=causes,
                      actor_id=actor_id, endpoint=endpoint)


class RemoteTensorError(Exception):
    """A mesh tensor has no value: an operation it depends on failed on a worker.

    Raised by ``fetch_shard(t).get()`` and ``inspect(t)`` (the tensor engine
    runs ahead of the controller, so the failure shows at the next value the
    script asks for), with the remote traceback as ``__cause__``.  Tensors
    that do not depend on the failed operation keep working, and so does the
    mesh.

    Attributes:
        what: the failed operation, e.g. ``aten.mm.default``.
        site: the controller line that issued it.
        error: the worker's exception, as text.
    """

    def __init__(self, what: str, site: str, error: str) -> None:
        super().__init__(f"tensor engine: {what} issued at {site} failed: {error}")
        self.what = what
        self.site = site
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteTensorError, (self.what, self.site, self.error))


class SupervisionError(RuntimeError):
    """The process or actor that was to answer a call has failed.

    Raised by pending futures when the target dies (a crash, a kill, an exit)
    and by new calls to the failed part of a mesh.  Calls to healthy slices
    keep working.  ``endpoint`` names the call; ``failure`` is the
    :class:`mpimesh.MeshFailure` describing the cause, when known.
    """

    def __init__(self, message: str, *, endpoint: str = "", failure: Any = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.failure = failure

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_supervision_error, (str(self), self.endpoint))


def _rebuild_supervision_error(message: str, endpoint: str) -> SupervisionError:
    return SupervisionError(message, endpoint=endpoint)


#: The name the brief's programs catch a lost device or node by (``from monarch.exceptions import
#: DeviceMeshError``): the same class as :class:`SupervisionError`, so either ``except`` catches it.
DeviceMeshError = SupervisionError


class MeshInternalError(Exception):
    """A broken invariant inside mpimesh: please file a bug with the traceback."""

    def __init__(self, detail: str = "") -> None:
        text = "internal error in mpimesh - please file a bug"
        super().__init__(f"{text}: {detail}" if detail else text)
