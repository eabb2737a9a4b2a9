"""The dashboard as a person uses it: a job started with ``--dashboard``, its page in headless Chromium (issue #29).

One job (``dashboard_job.py``, 3 trainers) and one browser: the page's tree
has the mesh's processes, its metric curves have their points, a stack
request shows the endpoint a trainer is stuck in, a killed trainer's cell
turns failed with its cause within 2 s; a bad request is refused, the page
closed stops the collector, and the job ends normally.  The page's
screenshot is kept at ``out/dashboard.png`` (CI keeps ``out/``; the
README shows ``docs/dashboard.png``, a copy).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from browser import Browser, find_chromium
from mpitest import ROOT, Job, run_job

JOB = Path(__file__).with_name("dashboard_job.py")
SCREENSHOT = ROOT / "out" / "dashboard.png"
#: The issue's bound: a killed worker shows as failed within this many seconds.
FAILED_WITHIN = 2.0


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


@pytest.mark.subprocess
@pytest.mark.timeout(240)
def test_the_page_shows_the_job_live(tmp_path: Path) -> None:
    find_chromium()
    pytest.importorskip("websockets.sync.client")
    lines: dict[str, str] = {}
    ready = threading.Event()

    def on_line(line: str, job: Job) -> None:
        word, _, rest = line.strip().partition(" ")
        if word in ("URL", "PIDS"):
            lines[word] = rest
            if len(lines) == 2:
                ready.set()

    cmd = [str(Path(sys.executable).parent / "mpimesh"), "run", "-n", "4", "--dashboard=0", str(JOB), str(tmp_path)]
    done: list[Job] = []
    runner = threading.Thread(target=lambda: done.append(run_job(cmd, timeout=180, on_line=on_line)), daemon=True)
    runner.start()
    browser = None
    try:
        assert ready.wait(120), "the job printed no URL and PIDS within 120 s"
        url, pids = lines["URL"], json.loads(lines["PIDS"])
        assert url.startswith("http://127.0.0.1:"), url  # localhost by default, so no token
        browser = Browser(tmp_path / "chromium", (1500, 1000))
        browser.goto(url)

        # the tree: every process of the mesh, with its actor, under its host
        actors, _ = browser.wait_for(
            "(() => { const a = [...document.querySelectorAll('#tree .actor')].map(e => e.textContent);"
            " return a.length >= 3 ? a.sort() : null; })()", 30, "the trainers in the tree")
        assert actors == ["trainers[0]", "trainers[1]", "trainers[2]"], actors
        assert browser.js("document.querySelectorAll('#tree .proc').length") == 4  # 3 workers and the controller

        # the curves: 8 points of loss from each trainer, 4 of lr from the controller
        curves, _ = browser.wait_for(
            "(() => { const c = document.getElementById('metric-loss'), l = document.getElementById('metric-lr');"
            " if (!c || !l || !c.data || c.data.length < 3) return null;"
            " return {loss: c.data.map(t => [t.name, t.x.length]).sort(), lr: l.data.map(t => t.y.length)}; })()",
            30, "the loss and lr curves")
        assert curves == {"loss": [["trainers[0]", 8], ["trainers[1]", 8], ["trainers[2]", 8]], "lr": [4]}, curves

        # trainer 0 is busy: its cell says so, and its stack shows the endpoint's frame
        browser.wait_for("document.querySelector('.mesh[data-name=trainers] .cell[data-rank=\"0\"]')"
                         "?.dataset.state === 'busy'", 10, "trainer 0 busy")
        addr = browser.js("[...document.querySelectorAll('#tree .proc')].find("
                          "p => p.textContent.includes('trainers[0]')).dataset.addr")
        browser.js(f"document.getElementById('stack-proc').value = '{addr}'; showStack()")
        stack, _ = browser.wait_for("(() => { const t = document.getElementById('stack-text').textContent;"
                                    " return t.includes('in stuck_in_here()') ? t : null; })()", 10,
                                    "trainer 0's stack")
        # the actor's thread, its innermost frame first: the endpoint's, in the job's file
        innermost = r"\(actor trainers\[0\]@[\d.]+\) in stuck_in_here\(\)\n  stuck_in_here\(\) \S*dashboard_job\.py:\d+"
        assert re.search(innermost, stack), stack

        # a killed trainer turns failed, with its cause, within 2 s
        os.kill(pids[2], signal.SIGKILL)
        killed = time.monotonic()
        why, _ = browser.wait_for(
            "(() => { const c = document.querySelector('.mesh[data-name=trainers] .cell[data-rank=\"2\"]');"
            " return c && c.dataset.state === 'failed' ? c.title : null; })()", 30, "trainer 2 failed")
        took = time.monotonic() - killed
        print(f"trainer 2 showed as failed {took:.2f} s after its kill")
        assert f"(pid {pids[2]})" in why and "died" in why, why
        browser.wait_for("document.querySelector('#events .event.dead') !== null", 5, "the death in the timeline")
        browser.js("document.getElementById('log-label').value = 'trainers[1]'; showLogs()")
        browser.wait_for("document.getElementById('log-text').textContent.includes('trained 8 steps')", 10,
                         "trainer 1's output")
        browser.screenshot(SCREENSHOT)
        assert took <= FAILED_WITHIN, f"trainer 2 showed as failed {took:.2f} s after its kill"

        # bad requests cost nothing: answered, and the page goes on
        assert _get(url + "api/stack?proc=nonsense")[0] == 400
        assert _get(url + "api/stack?proc=7.7")[0] == 404
        assert _get(url + "api/logs?label=nobody")[0] == 404
        status, stack_answer = _get(url + f"api/stack?proc={addr}")
        assert status == 200 and any(t["busy"] == "stuck_in_here" for t in stack_answer["threads"]), stack_answer
        lines_answer = _get(url + "api/logs?label=trainers%5B1%5D")[1]
        assert [line[2] for line in lines_answer["lines"]] == ["trained 8 steps"], lines_answer

        # the page closed: the collector stops looking (nothing is asked of the processes any more)
        browser.close()
        browser = None
        time.sleep(2 * 1.0 + 0.5)
        first = _get(url + "api/snapshot")[1]["time"]
        time.sleep(1.5)
        assert _get(url + "api/snapshot")[1]["time"] == first, "the collector kept looking with no page open"
    finally:
        if browser is not None:
            browser.close()
        (tmp_path / "done").touch()
        runner.join(200)
    (job,) = done
    assert job.ended and job.returncode == 0, job.describe()
    assert "hook trainers [2]" in job.stdout, job.describe()
    assert f"mpimesh: dashboard at {url}" in job.stderr, job.describe()


@pytest.mark.subprocess
def test_a_shared_page_works_with_its_token_only(tmp_path: Path) -> None:
    """A dashboard with a token (any host but localhost): the page connects with it, and shows nothing without."""
    find_chromium()
    pytest.importorskip("websockets.sync.client")
    from mpimesh._dashboard._server import Server

    server = Server("127.0.0.1", 0, "s3cret")
    browser = Browser(tmp_path / "chromium")
    try:
        browser.goto(server.url)
        browser.wait_for("document.getElementById('status').textContent === 'live' && typeof Plotly === 'object'",
                         30, "the page live, with Plotly loaded")
        browser.goto(server.url.replace("s3cret", "guess"))
        text, _ = browser.wait_for("document.body.innerText", 10, "the refusal")
        assert "missing or wrong ?token=" in text, text
    finally:
        browser.close()
