"""Debugging actors from the controller's terminal.

``breakpoint()`` (or ``pdb.set_trace()``) in an endpoint pauses that actor
and opens the ``mpimesh_dbg>`` prompt on the controller's terminal:
``list``, ``attach <actor> <rank>``, ``cast <actor> ranks(...) <pdb command>``,
``continue``, ``detach``, ``help``.  :func:`pm` opens a post-mortem pdb on
the remote frames of an :class:`~mpimesh.ActorError`.
"""

from . import _worker as _worker  # registers its hooks for each runtime (``_core.hooks.register_on_install``)
from ._commands import Ranks as Ranks
from ._commands import parse_ranks as parse_ranks
from ._controller import DebugController as DebugController
from ._controller import debug_controller as debug_controller
from ._controller import pm as pm

__all__ = ["DebugController", "Ranks", "debug_controller", "parse_ranks", "pm"]
