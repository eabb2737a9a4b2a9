"""Whether the controller is an interactive session: a Jupyter kernel, IPython, ``python -i``.

A script ends when an unhandled failure reaches the top (the default
``unhandled_fault_hook`` ends the job, as Monarch's does).  An interactive
session must not: ending it would take the user's whole state (and, in a
notebook, the kernel) with one failed actor.  There, the default hook only
reports the failure; the failed actors' callers get ``SupervisionError``,
the other meshes keep working, and the user goes on (README, "Notebooks").
"""

from __future__ import annotations

import sys

__all__ = ["interactive_session", "report_and_go_on"]


def _ipython_shell() -> bool:
    # Only look: a plain script must not pay for importing IPython.
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    return callable(get) and get() is not None


def interactive_session() -> bool:
    """Whether this process is an interactive session.

    True in a Jupyter kernel or an IPython shell (a live IPython
    ``InteractiveShell``), and in the plain interpreter's prompt
    (``python -i``, or ``python`` alone).  Cheap: it imports nothing.
    """
    return bool(sys.flags.interactive) or hasattr(sys, "ps1") or _ipython_shell()


def report_and_go_on(report: str) -> None:
    """Print an unhandled failure's ``report`` in an interactive session, which goes on."""
    print(
        "mpimesh: unhandled failure (an interactive session goes on: calls to the failed actors raise "
        "SupervisionError; assign mpimesh.unhandled_fault_hook to act on failures):\n" + report,
        file=sys.stderr,
        flush=True,
    )
