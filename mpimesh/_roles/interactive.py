"""Whether the controller is an interactive session: a Jupyter kernel, IPython, ``python -i``.

A script ends when an unhandled failure reaches the top (the default
``unhandled_fault_hook`` ends the job, as Monarch's does).  An interactive
session must not: ending it would take the user's whole state (and, in a
notebook, the kernel) with one failed actor.  There, the default hook only
reports the failure; the failed actors' callers get ``SupervisionError``,
the other meshes keep working, and the user goes on (README, "Notebooks").
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["before_kernel_shutdown", "interactive_session", "report_and_go_on"]


def _ipython_shell() -> Any:
    # The live IPython shell, or None.  Only look: a plain script must not
    # pay for importing IPython.
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    return get() if callable(get) else None


def interactive_session() -> bool:
    """Whether this process is an interactive session.

    True in a Jupyter kernel or an IPython shell (a live IPython
    ``InteractiveShell``), and in the plain interpreter's prompt
    (``python -i``, or ``python`` alone).  Cheap: it imports nothing.
    """
    return bool(sys.flags.interactive) or hasattr(sys, "ps1") or _ipython_shell() is not None


def before_kernel_shutdown(fn: Callable[[], object]) -> bool:
    """Have ``fn()`` run when this process's Jupyter kernel is asked to shut down or restart.

    ipykernel answers a ``shutdown_request`` by terminating the processes of
    its process group (SIGTERM, then SIGKILL) before Python's exit runs the
    ``atexit`` handlers.  The singleton's launcher daemon (Open MPI's
    ``prte``) is one of them, and it kills the workers as it goes: their
    ``__cleanup__`` never runs.  ``fn`` (the controller's shutdown) runs
    first, on the kernel's control thread; then a thread reaps each daemon
    once ipykernel has ended it (see :func:`_reap`).

    Returns:
        Whether this process is an ipykernel kernel (``fn`` is then registered).
    """
    kernel = getattr(_ipython_shell(), "kernel", None)
    found = (getattr(kernel, name, None) for name in ("control_handlers", "shell_handlers"))
    tables: list[dict[str, Any]] = [t for t in found if isinstance(t, dict) and callable(t.get("shutdown_request"))]
    for table in tables:
        table["shutdown_request"] = _first(fn, table["shutdown_request"])
    return bool(tables)


def _first(fn: Callable[[], object], handler: Callable[..., Any]) -> Callable[..., Any]:
    # ipykernel's handler, after fn; awaitable as ipykernel's own is (ipykernel awaits what it returns).
    async def shutdown_request(*args: Any) -> Any:
        try:
            fn()
        finally:
            for pid in _daemons():
                threading.Thread(target=_reap, args=(pid,), name="mpimesh-reap", daemon=True).start()
            result = handler(*args)
            if inspect.isawaitable(result):
                result = await result
        return result

    return shutdown_request


#: The launcher daemons a singleton controller starts as its own children: Open MPI's PRRTE.
DAEMONS = ("prte",)


def _daemons() -> list[int]:
    """This process's children in its process group that are launcher daemons (:data:`DAEMONS`)."""
    me, group = os.getpid(), os.getpgrp()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat")) as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        state_ppid_pgrp = stat[stat.rfind(")") + 2:].split()[:3]
        if comm in DAEMONS and state_ppid_pgrp[1:] == [str(me), str(group)]:
            found.append(int(entry.name))
    return found


def _reap(pid: int) -> None:
    # ipykernel terminates the children of its process group and waits until
    # there are none, but the daemon's parent (Open MPI, in this process)
    # does not reap it then: as a zombie it kept the kernel from exiting
    # until Jupyter killed it (2.5 s later, without atexit handlers).
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # reaped already


def report_and_go_on(report: str) -> None:
    """Print an unhandled failure's ``report`` in an interactive session, which goes on."""
    print(
        "mpimesh: unhandled failure (an interactive session goes on: calls to the failed actors raise "
        "SupervisionError; assign mpimesh.unhandled_fault_hook to act on failures):\n" + report,
        file=sys.stderr,
        flush=True,
    )
