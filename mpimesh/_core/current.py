"""This process's runtime, reachable without importing MPI.

``import mpimesh`` must not initialize MPI (the ``mpimesh`` launcher imports
the package before it execs ``mpiexec``).  Public modules reach the runtime
through :func:`current`, which boots it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["current"]

#: Set by ``_runtime`` when the runtime starts.
runtime: Runtime | None = None


def current() -> Runtime:
    """This process's runtime, booting an embedded controller if none runs yet."""
    rt = runtime
    if rt is not None:
        return rt
    from .runtime import current as boot

    return boot()
