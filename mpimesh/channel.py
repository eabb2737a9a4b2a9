"""Channels: ports that any actor can send to, and their receivers."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ._core import current as _current
from ._core import serialize as _serialize
from ._core.ports import Queue
from ._core.protocol import Status
from .future import Future

__all__ = ["Channel", "Port", "PortReceiver"]

R = TypeVar("R")
Addr = tuple[int, int]


class Port(Generic[R]):
    """The sending end of a channel; pickles, so it can be passed to actors.

    Messages from one sender arrive in the order they were sent.
    """

    def __init__(self, port: tuple[Addr, int], index: int = -1) -> None:
        self._port = port
        self._index = index

    def __repr__(self) -> str:
        (island, rank), pid = self._port
        return f"Port({island}.{rank}#{pid})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Port, (self._port, self._index))

    def send(self, obj: R) -> None:
        """Send ``obj`` to the receiver; returns at once.

        Raises:
            TypeError: ``obj`` cannot be pickled.
        """
        try:
            _current.current().reply(self._port, self._index, Status.OK, obj)
        except Exception as exc:
            raise TypeError(
                f"cannot send {_serialize.describe(obj)} on {self!r}: {exc}; send data that pickles"
            ) from exc

    def exception(self, exc: Exception) -> None:
        """Make the receiver's next ``recv()`` raise ``exc`` (as an ActorError)."""
        rt = _current.current()
        payload = _serialize.error_payload(exc, f"### port sender on {rt.host}", -1, {}, rt.host)
        rt.reply(self._port, self._index, Status.ERROR, payload)


class PortReceiver(Generic[R]):
    """The receiving end of a channel; lives in the process that opened it."""

    def __init__(self, queue: Queue, port: Port[R]) -> None:
        self._queue = queue
        self._port = port

    def __repr__(self) -> str:
        return f"PortReceiver({self._port!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(f"cannot pickle {self!r}: a receiver stays in its process; send its Port instead")

    def recv(self) -> Future[R]:
        """The next message, as a future (in arrival order)."""
        return self._queue.recv()


class Channel(Generic[R]):
    """Opens port/receiver pairs: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[Any], PortReceiver[Any]]:
        """A new channel whose receiver lives in the calling process.

        Args:
            once: the port closes after its first message.
        """
        return Channel._open(once, ranked=False)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[Any], PortReceiver[Any]]:
        """Like :meth:`open`, but ``recv()`` gives ``(rank, value)`` pairs."""
        return Channel._open(once, ranked=True)

    @staticmethod
    def _open(once: bool, ranked: bool) -> tuple[Port[Any], PortReceiver[Any]]:
        rt = _current.current()
        queue = Queue("Channel", once=once, ranked=ranked)
        port: Port[Any] = Port((rt.addr, rt.ports.open(queue)))
        return port, PortReceiver(queue, port)
