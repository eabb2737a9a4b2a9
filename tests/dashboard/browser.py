"""Headless Chromium driven over the DevTools protocol, for the dashboard's tests (issue #29).

Debian's ``chromium`` (``scripts/bootstrap.sh`` installs it as root), started
with ``--remote-debugging-port=0``; the port it picked is read from the
``DevToolsActivePort`` file in its profile directory, and one page is driven
over its websocket (``websockets``' synchronous client): navigate, evaluate
JavaScript in the page, take a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest


def find_chromium() -> str:
    """Chromium's path; skips loudly without one, and fails under CI=true (CI must run the browser test)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    message = ("no chromium on PATH: the dashboard's browser test needs it; "
               "as root: apt-get install chromium (scripts/bootstrap.sh does)")
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


class Browser:
    """One headless Chromium with one page.

    Args:
        profile: an empty directory for its profile.
        size: the window's width and height, in pixels.
    """

    def __init__(self, profile: Path, size: tuple[int, int] = (1500, 1700)) -> None:
        from websockets.sync.client import connect

        argv = [find_chromium(), "--headless=new", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--remote-debugging-port=0", f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
                "--remote-allow-origins=*", "about:blank"]
        if os.geteuid() == 0:
            argv.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or len(port_file.read_text().split()) < 2:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not start: {self.proc.stderr.read().decode()[-2000:]}"
                                   if self.proc.stderr else "chromium did not start")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            pages = [t for t in json.load(answer) if t["type"] == "page"]
        self._closing = ExitStack()
        self.ws = self._closing.enter_context(connect(pages[0]["webSocketDebuggerUrl"], max_size=None,
                                                      open_timeout=10))
        self._id = 0
        self.send("Page.enable")
        self.send("Runtime.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events that arrive meanwhile are dropped)."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    def goto(self, url: str) -> None:
        """Load ``url`` in the page."""
        self.send("Page.navigate", url=url)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> tuple[Any, float]:
        """Poll ``expression`` until it is truthy; its value and the seconds it took.

        Raises:
            AssertionError: still falsy after ``timeout`` seconds (with ``what`` and the last value).
        """
        start = time.monotonic()
        value: Any = None
        while time.monotonic() - start < timeout:
            try:
                value = self.js(expression)
            except RuntimeError as exc:  # the page is still loading
                value = str(exc)
            else:
                if value:
                    return value, time.monotonic() - start
            time.sleep(0.05)
        raise AssertionError(f"the page did not show {what} within {timeout:g} s; last: {value!r}")

    def screenshot(self, path: Path) -> None:
        """A PNG of the whole page at ``path``."""
        metrics = self.send("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        """Close the page's connection and end Chromium (its whole process group)."""
        closing = getattr(self, "_closing", None)
        if closing is not None:
            closing.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
