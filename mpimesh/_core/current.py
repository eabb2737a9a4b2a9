"""This process's runtime: the one ambient global, reachable without importing MPI.

``import mpimesh`` must not initialize MPI (the ``mpimesh`` launcher imports
the package before it execs ``mpiexec``).  The public modules reach the
runtime through :func:`current`, which boots an embedded controller on first
use (``python script.py``); ``python -m mpimesh`` boots the runtime of every
rank before the script runs (``mpimesh._roles.boot``).

:func:`install` wires the new runtime to the modules that need it and
cannot import it: futures drive its progress while they wait, a Port that
arrived in a message sends through it, and the hooks that layers above
registered (``_core.hooks``) run.  Nothing is wired by assigning to
another module's attributes.

This module is the hub of the one import that points up, from ``_core`` to
``_roles.boot``, made lazily on first use.  So that it stays a cycle of two,
nothing that ``_roles.boot`` imports may import this module: the runtime's
parts get the runtime passed to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import future
from . import hooks as _hooks
from . import ports as _ports

if TYPE_CHECKING:
    from .runtime import Runtime

__all__ = ["current", "install", "runtime"]

#: This process's runtime, once booted (see :func:`install`).
runtime: Runtime | None = None


def current() -> Runtime:
    """This process's runtime, booting an embedded controller if none runs yet.

    Raises:
        RuntimeError: a rank other than 0 of a multi-rank world runs the
            controller script (it was not started with ``-m mpimesh``).
    """
    rt = runtime
    if rt is not None:
        return rt
    from .._roles.boot import boot_embedded

    return boot_embedded()


def install(rt: Runtime) -> None:
    """Make ``rt`` this process's runtime, and wire it to what needs it (see the module's docstring)."""
    global runtime
    runtime = rt
    future.set_driver(rt.progress.wait)
    _ports.set_runtime_lookup(current)
    for setup in _hooks.on_install():
        setup(rt)
