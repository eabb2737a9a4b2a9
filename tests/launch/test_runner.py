"""The tests' job runner starts a launcher again when it failed to start, and only then."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mpitest import LAUNCH_TRIES, LAUNCHER_FLAKES, run, run_job

pytestmark = pytest.mark.subprocess

#: Fails like PRRTE's PMIx listener the first ``FAILS`` times, then runs.
FLAKY = """
import sys
from pathlib import Path
count = Path(sys.argv[1])
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
if n < int(sys.argv[2]):
    print({flake!r}, file=sys.stderr)
    sys.exit(213)
print("ROW {{\\"adverb\\": \\"call\\", \\"try\\": %d}}" % n)
print("END")
"""


def flaky(tmp_path: Path, fails: int) -> list[str]:
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY.format(flake=LAUNCHER_FLAKES[0]))
    return [sys.executable, str(script), str(tmp_path / "count"), str(fails)]


@pytest.mark.parametrize("runner", ["run", "run_job"])
def test_a_launcher_that_failed_to_start_is_started_again(runner: str, tmp_path: Path) -> None:
    cmd = flaky(tmp_path, fails=LAUNCH_TRIES - 1)
    if runner == "run":
        done = run(cmd, timeout=30)
        assert done.returncode == 0, done.stderr
    else:
        job = run_job(cmd, timeout=30)
        assert job.returncode == 0 and job.ended, job.describe()
        assert job.relaunched == LAUNCH_TRIES - 1
        assert job.rows["call"]["try"] == LAUNCH_TRIES - 1
    assert (tmp_path / "count").read_text() == str(LAUNCH_TRIES)


def test_a_launcher_that_keeps_failing_is_reported(tmp_path: Path) -> None:
    job = run_job(flaky(tmp_path, fails=LAUNCH_TRIES), timeout=30)
    assert job.returncode == 213
    assert LAUNCHER_FLAKES[0] in job.stderr
    assert f"after {LAUNCH_TRIES - 1} launcher start failures" in job.describe()


def test_a_job_that_failed_after_it_started_is_not_run_again(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(f"import sys\nprint('started')\nprint({LAUNCHER_FLAKES[0]!r}, file=sys.stderr)\nsys.exit(1)\n")
    counter = tmp_path / "count"
    script.write_text(f"from pathlib import Path\nPath({str(counter)!r}).open('a').write('x')\n" + script.read_text())
    job = run_job([sys.executable, str(script)], timeout=30)
    assert job.returncode == 1 and job.relaunched == 0
    assert counter.read_text() == "x"
