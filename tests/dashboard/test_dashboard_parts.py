"""The dashboard's parts without a job: its setting, the --dashboard flag, log_metric's checks, the server's token."""

from __future__ import annotations

import configparser
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mpitest import ROOT

from mpimesh._dashboard import _metrics
from mpimesh._launch import cli
from mpimesh._launch.discover import MpiLibrary
from mpimesh.config import load, parse_dashboard


def test_the_setting_parses_port_or_host_and_port() -> None:
    assert parse_dashboard("8780") == ("127.0.0.1", 8780)
    assert parse_dashboard("0") == ("127.0.0.1", 0)
    assert parse_dashboard("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert parse_dashboard("[::]:0") == ("::", 0)
    assert load({}).dashboard == ""
    assert load({"MPIMESH_DASHBOARD": "8781"}).dashboard == "8781"
    for bad in ("http", "99999", ":80", "host:"):
        with pytest.raises(ValueError, match="MPIMESH_DASHBOARD must be PORT or HOST:PORT"):
            load({"MPIMESH_DASHBOARD": bad})


def test_run_passes_the_dashboard_to_the_job() -> None:
    lib = MpiLibrary("openmpi", "5.0.11", "Open MPI v5.0.11", ulfm=True)
    for args, want in ((["--dashboard"], "8780"), (["--dashboard=0.0.0.0:9000"], "0.0.0.0:9000"), ([], None)):
        opts = cli.parse_run_args(["-n", "2", *args, "s.py", "--dashboard"])
        assert opts.dashboard == want and opts.target == ["s.py", "--dashboard"]
        _, added = cli.build_command(lib, "mpiexec", opts, python="python", environ={}, cpus=4, euid=1000)
        assert added.get("MPIMESH_DASHBOARD") == want
    with pytest.raises(ValueError, match="expecting --dashboard=PORT or --dashboard=HOST:PORT"):
        cli.parse_run_args(["-n", "2", "--dashboard=x", "s.py"])


def test_log_metric_checks_its_arguments_and_counts_steps() -> None:
    with pytest.raises(TypeError, match="expects a non-empty string name"):
        _metrics.log_metric("", 1.0)
    with pytest.raises(TypeError, match="expects a real number value, got str; pass float"):
        _metrics.log_metric("loss", "1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expects a real number step"):
        _metrics.log_metric("loss", 1.0, step="x")  # type: ignore[arg-type]
    before, _ = _metrics.series()
    for value in (3.0, 2.0, 1.0):
        _metrics.log_metric("parts-test", value)  # no runtime: kept as the controller's
    _metrics.log_metric("parts-test", 0.5, step=10)
    _metrics.log_metric("parts-test", 0.25)
    last, series = _metrics.series(before)
    (mine,) = [s for s in series if s.name == "parts-test"]
    assert mine.source == "controller"
    assert [(p[0], p[1]) for p in mine.points] == [(0, 3.0), (1, 2.0), (2, 1.0), (10, 0.5), (11, 0.25)]
    assert not any(s.points for s in _metrics.series(last)[1])


def test_the_wheel_ships_the_page() -> None:
    static = ROOT / "mpimesh" / "_dashboard" / "static"
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    assert "_dashboard/static/*" in parser["options.package_data"]["mpimesh"]
    assert "recursive-include mpimesh/_dashboard/static" in (ROOT / "MANIFEST.in").read_text()
    assert {p.name for p in static.iterdir()} == {"index.html", "app.js", "app.css"}


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_shared_dashboard_needs_its_token(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    from mpimesh._dashboard._server import Server, plotly_js

    server = Server("127.0.0.1", 0, "s3cret")
    base = f"http://127.0.0.1:{server.port}/"
    assert server.url == base + "?token=s3cret"
    assert _status(base) == 403
    assert _status(base + "?token=wrong") == 403
    assert _status(base + "?token=s3cret") == 200
    assert _status(base + "static/app.js") == 200  # the page's own files hold nothing of the job
    assert _status(base + "static/plotly.min.js") == 200
    assert _status(base + "events") == 403
    assert _status(base + "api/snapshot") == 403
    assert _status(base + "api/stack?proc=x&token=s3cret") == 400
    assert _status(base + "nothing?token=s3cret") == 404
    with urllib.request.urlopen(base + "api/snapshot?token=s3cret", timeout=10) as answer:
        assert json.load(answer) == {}  # nobody watched: the collector never looked
    assert server.collector.version == 0
    assert plotly_js() is not None, "plotly's script is missing: pip install mpimesh[dashboard]"
