"""The job's named singleton actors (``mpimesh.get_or_spawn_controller``), kept by the controller.

The controller's role owns the registry; spawning the actor in its own
process is the public layer's business (``this_proc().spawn``), which it
registers as a hook (``_core.hooks.spawn_here``) so the roles never import
the public modules.
"""

from __future__ import annotations

import threading
from typing import Any

from . import hooks as _hooks
from . import serialize as _serialize

__all__ = ["Registry"]


class Registry:
    """Name -> actor mesh, each spawned once from the first request's pickled (class, args, kwargs)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._meshes: dict[str, Any] = {}

    def get_or_spawn(self, name: str, body: bytes) -> Any:
        """The mesh of ``name``, spawned here from ``body`` if it is new (blocking)."""
        with self._lock:
            mesh = self._meshes.get(name)
            if mesh is None:
                spawn_here = _hooks.spawn_here()
                cls, args, kwargs = _serialize.loads(body)
                mesh = self._meshes[name] = spawn_here(name, cls, args, kwargs)
            return mesh
