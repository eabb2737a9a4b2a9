"""The dashboard's web server: a Starlette app under uvicorn, on a thread of the controller's process.

Routes (all but ``/static/`` check the token when there is one, ``?token=``):

- ``/``: the page (``static/index.html``), its script and style under ``/static/``;
- ``/static/plotly.min.js``: the charting library, from the installed ``plotly`` package (no network);
- ``/events``: the job's snapshot as server-sent events, one a second while the page is open, each with
  the supervision events, metric points and log labels that are new since the last one it sent;
- ``/api/stack?proc=I.R``: the Python stacks of that process's threads, asked on demand;
- ``/api/logs?label=L``: the last forwarded lines of one actor rank (or worker);
- ``/api/snapshot``: the last snapshot, as JSON (scripts, tests).

The server runs its own event loop on its own thread; what blocks (a stack
request) runs on Starlette's thread pool.  Nothing it does holds a lock the
runtime needs: it reads the collector's last snapshot and the journal's
rings.  A closed page ends its event stream (its collector watch with it);
a bad request is answered 400 or 404, and costs the job nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import secrets
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from .._core import journal
from . import _metrics
from ._collect import Collector, stack_of

__all__ = ["Server", "plotly_js"]

STATIC = os.path.join(os.path.dirname(__file__), "static")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def plotly_js() -> str | None:
    """The path of ``plotly.min.js`` in the installed ``plotly`` package (``mpimesh[dashboard]``), or None."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "package_data", "plotly.min.js")
    return path if os.path.exists(path) else None


def _addr(text: str) -> tuple[int, int]:
    island, _, rank = text.partition(".")
    return int(island), int(rank)


class _TokenCheck:
    """ASGI middleware: every request for the job's data must carry ``?token=<token>`` (a shared dashboard's lock).

    The page's own files (``/static/``: its script, style and Plotly) hold nothing of the job, and the page
    loads them without the token.
    """

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("path", "").startswith("/static/"):
            given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[0]
            if not secrets.compare_digest(given, self.token):
                from starlette.responses import PlainTextResponse

                await PlainTextResponse("mpimesh dashboard: missing or wrong ?token= in the URL", 403)(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


class Server:
    """The dashboard of this job: a collector and a web server on ``host:port``, started at once.

    Args:
        host: the address to listen on; ``127.0.0.1`` keeps it to this machine (reach it over an SSH tunnel).
        port: the TCP port; 0 picks a free one.
        token: required in every URL; None for none (the default on localhost).

    Raises:
        ImportError: the dashboard's packages are not installed (``pip install mpimesh[dashboard]``).
        OSError: the port cannot be bound.
    """

    def __init__(self, host: str, port: int, token: str | None) -> None:
        import uvicorn  # noqa: F401 - fail here, in the caller, when the extra is missing

        self.host = host
        self.token = token
        self.collector = Collector()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        self.sock.listen(128)  # a browser pointed at the printed URL at once waits for the server, not refused
        self._thread = threading.Thread(target=self._serve, name="mpimesh-dashboard", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """Where to point a browser."""
        shown = self.host
        if shown in ("0.0.0.0", "::", ""):
            shown = socket.gethostname()
        if ":" in shown:
            shown = f"[{shown}]"
        query = f"?token={self.token}" if self.token else ""
        return f"http://{shown}:{self.port}/{query}"

    def _serve(self) -> None:
        import uvicorn

        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off")
        uvicorn.Server(config).run(sockets=[self.sock])

    # --- the app ----------------------------------------------------------------------------------

    def app(self) -> Any:
        """The ASGI app: Starlette's routes (see the module), behind the token check when there is a token."""
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
        from starlette.routing import Mount, Route
        from starlette.staticfiles import StaticFiles

        collector = self.collector

        async def page(request: Request) -> Response:
            return FileResponse(os.path.join(STATIC, "index.html"), headers={"Cache-Control": "no-store"})

        async def plotly(request: Request) -> Response:
            path = plotly_js()
            if path is None:
                return PlainTextResponse("console.error('mpimesh dashboard: no plotly; "
                                         "pip install mpimesh[dashboard]')", media_type="text/javascript")
            return FileResponse(path, media_type="text/javascript")

        async def events(request: Request) -> Response:
            return StreamingResponse(self._stream(request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

        def stack(request: Request) -> Response:  # sync: Starlette runs it on its thread pool
            try:
                addr = _addr(request.query_params["proc"])
            except (KeyError, ValueError):
                return JSONResponse({"error": "expecting ?proc=<island>.<rank>, e.g. ?proc=0.1"}, 400)
            try:
                return JSONResponse({"proc": request.query_params["proc"], "threads": stack_of(addr)})
            except LookupError as exc:
                return JSONResponse({"error": str(exc)}, 404)

        async def logs(request: Request) -> Response:
            label = request.query_params.get("label", "")
            lines = journal.logs().get(label)
            if lines is None:
                return JSONResponse({"error": f"no output kept for {label!r}"}, 404)
            return JSONResponse({"label": label, "lines": lines[-100:]})

        async def snapshot(request: Request) -> Response:
            return JSONResponse(collector.snapshot)

        app = Starlette(routes=[
            Route("/", page),
            Route("/static/plotly.min.js", plotly),
            Mount("/static", StaticFiles(directory=STATIC)),
            Route("/events", events),
            Route("/api/stack", stack),
            Route("/api/logs", logs),
            Route("/api/snapshot", snapshot),
        ])
        return _TokenCheck(app, self.token) if self.token else app

    async def _stream(self, request: Any) -> AsyncIterator[str]:
        """One page's event stream: a snapshot whenever the collector has a new one, with what is new for it."""
        collector = self.collector
        loop = asyncio.get_running_loop()
        fresh = asyncio.Event()

        def wake() -> None:  # on the collector's thread: one wake-up of this loop per snapshot
            with contextlib.suppress(RuntimeError):  # the server's loop has ended
                loop.call_soon_threadsafe(fresh.set)

        collector.watch(wake)
        version, event_seq, metric_seq, first = 0, 0, 0, True
        try:
            while True:
                fresh.clear()
                if collector.version <= version:
                    await fresh.wait()
                    continue
                version = collector.version
                data = dict(collector.snapshot)
                new_events = journal.events(event_seq)
                if new_events:
                    event_seq = new_events[-1][0]
                data["events"] = [{"seq": e[0], "time": e[1], "kind": e[2], "text": e[3], "fields": e[4]}
                                  for e in new_events]
                metric_seq, series = _metrics.series(metric_seq)
                data["metrics"] = [{"name": s.name, "source": s.source, "x": [p[0] for p in s.points],
                                    "y": [p[1] for p in s.points]} for s in series if s.points]
                data["log_labels"] = journal.labels()
                data["first"] = first  # the page starts its curves and timeline afresh
                yield f"data: {json.dumps(data, default=str)}\n\n"
                first = False
        finally:
            collector.unwatch(wake)
