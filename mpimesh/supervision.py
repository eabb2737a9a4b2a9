"""Supervision: failures go to whoever owns the failed mesh.

A failure (a process that died or stopped answering, an actor whose
``broadcast`` endpoint raised) becomes a :class:`MeshFailure` delivered to the
mesh's owner, the actor that spawned it: ``Actor.__supervise__(failure)``
returns truthy to handle it; falsy passes it up (the owner itself fails);
raising replaces it with a new, chained failure.  Failures that reach the
controller script go to ``mpimesh.unhandled_fault_hook``, whose default ends
the whole job with a report and exit status 1.

Independently of ownership, every pending call to the failed process fails
at once with :class:`~mpimesh.SupervisionError`, and later calls to that part
of the mesh fail before anything is sent.  Calls to healthy slices go on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MeshFailure", "Unhandled", "default_unhandled_fault_hook", "unhandled_fault_hook"]


@dataclass
class MeshFailure:
    """Part of an actor mesh has failed.

    Attributes:
        mesh_name: the name the mesh was spawned with; compare it with the
            meshes you own to decide what to do.
        crashed_ranks: flat ranks of the failed actors in that mesh.
        cause: what happened, e.g. ``process 0.3 (pid 4711) on node7 died:
            killed by SIGSEGV``.
        mesh: always ``None`` (Monarch compatibility).
    """

    mesh_name: str
    crashed_ranks: list[int]
    cause: str
    class_name: str = ""
    coords: list[dict[str, int]] = field(default_factory=list)
    mesh: Any = None
    #: each failed rank as Monarch prints a point, ``{'gpus': 1/2}``
    points: list[str] = field(default_factory=list)

    def report(self) -> str:
        """A multi-line description for logs.

        Its first line names ``MeshFailure``, the mesh, each failed
        ``rank=N`` with its coordinates and ``crashed_ranks``, as Monarch's
        does; the cause follows, indented.
        """
        where = ", ".join(
            f"rank={r} ({', '.join(f'{k}={v}' for k, v in c.items())})" if c else f"rank={r}"
            for r, c in zip(self.crashed_ranks, self.coords or [{}] * len(self.crashed_ranks), strict=True)
        )
        kind = f" ({self.class_name})" if self.class_name else ""
        points = self.points or [""] * len(self.crashed_ranks)
        actors = ", ".join(f"{self.mesh_name}{p}" for p in points)
        who = f"{self.class_name} {actors}" if self.class_name else actors
        return (f"MeshFailure of actor mesh {self.mesh_name!r}{kind}: {where} failed, "
                f"crashed_ranks={self.crashed_ranks}: The actor {who} and all its descendants have failed:\n"
                f"  {self.cause}")

    def __str__(self) -> str:
        return self.report()


class Unhandled(SystemExit):
    """Raised by :func:`default_unhandled_fault_hook`: the failure is unhandled; exit status 1.

    Like Monarch's default hook, which calls ``sys.exit(1)``: it is a
    ``SystemExit``, and the controller, which runs the hook, ends the job.
    """


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Print the failure and end the whole job with exit status 1.

    It raises :class:`Unhandled` (a ``SystemExit(1)``); the controller, which
    runs the hook, then interrupts the script's main thread with a
    ``KeyboardInterrupt`` (Monarch's way), so that its ``finally`` blocks and
    ``atexit`` handlers run as it leaves; every worker is stopped and the job
    exits 1.  A script that has not begun to leave within
    ``MPIMESH_SHUTDOWN_TIMEOUT`` is ended at once, so no process is left
    behind.  Replace the hook by assigning ``mpimesh.unhandled_fault_hook = my_hook``.

    In an interactive session (a Jupyter kernel, IPython, ``python -i``) the
    controller does not run it: it prints the report and the session goes
    on (calls to the failed actors raise ``SupervisionError``).

    Raises:
        Unhandled: always.
    """
    print(f"mpimesh: unhandled failure, ending the job:\n{failure.report()}", file=sys.stderr, flush=True)
    raise Unhandled(1)


#: Called on the controller with each failure that no actor handled.
#: Returning normally means handled; raising means unhandled: the job ends,
#: with the exception added to the failure's cause unless it is the default's.
unhandled_fault_hook: Callable[[MeshFailure], Any] = default_unhandled_fault_hook


def current_hook() -> Callable[[MeshFailure], Any]:
    """The hook in force: ``mpimesh.unhandled_fault_hook`` as the user last set it."""
    package = sys.modules.get("mpimesh")
    hook = getattr(package, "unhandled_fault_hook", None) if package is not None else None
    return hook if callable(hook) else unhandled_fault_hook
