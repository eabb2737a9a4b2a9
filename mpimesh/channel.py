"""Channels: ports that any actor can send to, and their receivers."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ._core import calls as _calls
from ._core.ports import Port, PortReceiver

__all__ = ["Channel", "Port", "PortReceiver"]

R = TypeVar("R")


class Channel(Generic[R]):
    """Opens port/receiver pairs: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[Any], PortReceiver[Any]]:
        """A new channel whose receiver lives in the calling process.

        Args:
            once: the port closes after its first message.
        """
        return _calls.open_channel(once, ranked=False)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[Any], PortReceiver[Any]]:
        """Like :meth:`open`, but ``recv()`` gives ``(rank, value)`` pairs."""
        return _calls.open_channel(once, ranked=True)
