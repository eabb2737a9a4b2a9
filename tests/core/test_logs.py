"""Worker output reaches the controller's terminal prefixed with actor and rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from mpitest import mpiexec_cmd, python_cmd, run

from mpimesh._core.logs import fold_labels, warn

SCRIPT = """
import logging, sys, time
from mpimesh import Actor, endpoint, this_host

class Talker(Actor):
    def __init__(self):
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")

    @endpoint
    def talk(self, x):
        print("hello", x)
        print("to stderr", file=sys.stderr)
        logging.getLogger("talker").info("logged %s", x)
        sys.stdout.write("half a ")
        sys.stdout.write("line\\n")

    @endpoint
    def slow(self):
        time.sleep(1.6)

procs = this_host().spawn_procs(per_host={"gpus": 3})
talkers = procs.spawn("talkers", Talker)
talkers.talk.call(7).get(30)
if len(sys.argv) > 1:
    talkers.slice(gpus=0).slow.call_one().get(30)
print("controller line")
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("launch", ["mpirun4", "spawned"])
def test_lines_are_prefixed(tmp_path: Path, launch: str) -> None:
    """print, stderr and logging from an actor come out as `[mesh[rank]] text`."""
    path = tmp_path / "talk.py"
    path.write_text(SCRIPT)
    cmd = python_cmd("-m", "mpimesh", str(path))
    if launch == "mpirun4":
        cmd = mpiexec_cmd(4, *cmd)
    result = run(cmd, timeout=60)
    assert result.returncode == 0, result.stderr
    for rank in range(3):
        assert f"[talkers[{rank}]] hello 7" in result.stdout
        assert f"[talkers[{rank}]] half a line" in result.stdout
        assert f"[talkers[{rank}]] to stderr" in result.stderr
        assert f"[talkers[{rank}]] INFO talker logged 7" in result.stderr
    assert "controller line" in result.stdout
    assert result.orphans == []


@pytest.mark.subprocess
def test_identical_lines_fold(tmp_path: Path) -> None:
    """MPIMESH_LOG_FOLD prints a line said by every rank once, with the ranks."""
    path = tmp_path / "talk.py"
    path.write_text(SCRIPT)
    result = run(python_cmd("-m", "mpimesh", str(path)), timeout=60, env={"MPIMESH_LOG_FOLD": "0.3"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("hello 7") == 1
    assert "[talkers[0-2]] hello 7" in result.stdout
    assert "[talkers[0-2]] INFO talker logged 7" in result.stderr


@pytest.mark.subprocess
def test_forwarding_off_and_waits_shown(tmp_path: Path) -> None:
    """MPIMESH_LOG_FORWARD=0 leaves lines unprefixed; MPIMESH_SHOW_WAITS reports long waits."""
    path = tmp_path / "talk.py"
    path.write_text(SCRIPT)
    result = run(python_cmd("-m", "mpimesh", str(path), "slow"), timeout=60,
                 env={"MPIMESH_LOG_FORWARD": "0", "MPIMESH_SHOW_WAITS": "0.5"})
    assert result.returncode == 0, result.stderr
    assert "hello 7" in result.stdout and "[talkers[" not in result.stdout
    assert "mpimesh: still waiting for talkers.slow.call_one() after 1 s" in result.stderr


def test_fold_labels() -> None:
    """Ranks of one mesh fold into ranges; other labels are listed."""
    assert fold_labels(["g[0]", "g[1]", "g[3]", "g[2]", "g[7]"]) == "g[0-3,7]"
    assert fold_labels(["g[1]", "worker 0.2", "h[0]"]) == "g[1], h[0], worker 0.2"


def test_diagnostics_format(capsys: pytest.CaptureFixture[str]) -> None:
    """mpimesh's own diagnostics have one format: `mpimesh: text`, or `mpimesh i.r: text` naming a process."""
    warn("ranks [2] did not stop within 2 s; aborting the job")
    warn("error in the polling thread (reported once):\nTraceback", (1, 3))
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "mpimesh: ranks [2] did not stop within 2 s; aborting the job\n"
        "mpimesh 1.3: error in the polling thread (reported once):\nTraceback\n"
    )
