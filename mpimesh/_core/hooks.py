"""The runtime's calls up into the layers above it: registered here by those layers, typed.

The runtime (``_core``, ``_roles``) never imports the public modules.  Where
it must call up, the public layer registers the function here, once, when it
is imported: ``mpimesh/__init__`` imports every public module, and every
process imports the package before its runtime boots (``python -m mpimesh``
runs the package's ``__main__``).  A hook asked for before it is registered
raises ``MeshInternalError``: no caller skips its work silently.

The wiring the other way, the runtime handed to the modules below the public
ones (futures' waits, ports that arrived in a message), is done by
``_core.current.install`` at boot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import MeshInternalError

__all__ = ["on_install", "register_on_install", "register_spawn_here", "spawn_here"]

#: ``(name, Class, args, kwargs) -> ActorMesh``: spawn an actor mesh in this very process.
SpawnHere = Callable[[str, Any, tuple[Any, ...], dict[str, Any]], Any]
#: Run with each runtime this process installs (typed ``Any``: this module imports no runtime).
OnInstall = Callable[[Any], None]

_spawn_here: SpawnHere | None = None
_on_install: list[OnInstall] = []


def register_spawn_here(fn: SpawnHere) -> None:
    """Set how the controller spawns a named actor in its own process (``mpimesh.proc_mesh``)."""
    global _spawn_here
    _spawn_here = fn


def spawn_here() -> SpawnHere:
    """How to spawn an actor mesh in this process (``_core.named``).

    Raises:
        MeshInternalError: ``mpimesh.proc_mesh`` never registered it.
    """
    if _spawn_here is None:
        raise MeshInternalError("internal error in mpimesh - please file a bug (no spawn_here)")
    return _spawn_here


def register_on_install(fn: OnInstall) -> None:
    """Run ``fn(runtime)`` for every runtime this process installs (``mpimesh.debug``: its DEBUG frames)."""
    if fn not in _on_install:
        _on_install.append(fn)


def on_install() -> tuple[OnInstall, ...]:
    """What :func:`register_on_install` registered, in order."""
    return tuple(_on_install)
