"""A live dashboard of the job, served by the controller (issue #29).

``mpimesh.dashboard()`` in the controller's script (or ``mpimesh run
--dashboard[=PORT]``, or ``MPIMESH_DASHBOARD=[HOST:]PORT``) serves a page
that shows, pushed once a second: the job's hosts, processes, process
meshes and actor meshes (a tree, and a grid per actor mesh coloured by
health), each process's CPU and memory, calls and bytes per second per
mesh, the supervision events, the last output lines of any rank, the
Python stack of any process on demand, and the curves of the metrics the
job logs with :func:`log_metric`.  Its data comes over mpimesh's own
messages (``_probe``), only while a page is open.

The web part (Starlette, uvicorn, Plotly's script) is the ``dashboard``
extra: ``pip install mpimesh[dashboard]``; it is imported when a dashboard
starts, never by workers.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .._core import hooks as _hooks
from .._core.protocol import CONTROLLER
from ..config import parse_dashboard, settings
from . import _probe as _probe  # registers the "dash.stats" request in every process
from ._metrics import log_metric as log_metric

__all__ = ["dashboard", "log_metric"]

_LOCALHOST = ("127.0.0.1", "localhost", "::1")
_lock = threading.Lock()
_server: Any = None


def dashboard(port: int = 8780, *, host: str = "127.0.0.1", token: str | bool | None = None) -> str:
    """Serve the job's live dashboard from this (the controller's) process, and print its URL; returns the URL.

    Call it in the controller's script (or a notebook); it returns at once,
    the page is served by a thread of this process until the job ends (a
    failing job's page stays up until then).  A second call returns the
    first one's URL.  ``mpimesh run --dashboard[=PORT]`` and
    ``MPIMESH_DASHBOARD=[HOST:]PORT`` start it before the script runs.

    Args:
        port: the TCP port; if it is taken, a free one is used instead (the URL says which); 0: any free port.
        host: where to listen; the default, ``127.0.0.1``, keeps it to this machine (from your laptop:
            ``ssh -L 8780:localhost:8780 login-node``).  Another address shares it, e.g. ``"0.0.0.0"``.
        token: a secret every URL must carry; by default one is made when ``host`` is not localhost.
            ``False``: none.

    Raises:
        ImportError: the dashboard's packages are missing; ``pip install mpimesh[dashboard]``.
        RuntimeError: called in a worker (a process other than the controller).
    """
    global _server
    from .._core import current as _current

    rt = _current.current()
    if rt.addr != CONTROLLER:
        raise RuntimeError(f"dashboard() serves from the controller; it was called in process {rt.addr[0]}."
                           f"{rt.addr[1]}; call it in the controller's script")
    with _lock:
        if _server is None:
            _server = _start(host, port, token)
        return str(_server.url)


def _start(host: str, port: int, token: str | bool | None) -> Any:
    import secrets

    try:
        from ._server import Server
    except ImportError as exc:
        raise ImportError(f"the dashboard needs its packages ({exc.name} is missing); "
                          "pip install 'mpimesh[dashboard]'") from exc
    secret: str | None
    if token is None:
        secret = None if host in _LOCALHOST else secrets.token_urlsafe(16)
    elif token is False:
        secret = None
    elif token is True:
        secret = secrets.token_urlsafe(16)
    else:
        secret = str(token)
    try:
        server = Server(host, port, secret)
    except OSError as exc:
        if port == 0:
            raise
        server = Server(host, 0, secret)
        print(f"mpimesh: port {port} is taken ({exc.strerror}); the dashboard uses port {server.port}",
              file=sys.stderr, flush=True)
    print(f"mpimesh: dashboard at {server.url}", file=sys.stderr, flush=True)
    return server


def _autostart(rt: Any) -> None:
    """Start the dashboard with the controller's runtime when ``MPIMESH_DASHBOARD`` asks for one."""
    if rt.addr != CONTROLLER or not settings.dashboard:
        return
    host, port = parse_dashboard(settings.dashboard)
    global _server
    with _lock:
        if _server is None:
            try:
                _server = _start(host, port, None)
            except ImportError as exc:
                print(f"mpimesh: MPIMESH_DASHBOARD={settings.dashboard}: no dashboard: {exc}",
                      file=sys.stderr, flush=True)


_hooks.register_on_install(_autostart)
