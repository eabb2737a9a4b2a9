"""Run shared_job.py once per test session and hand each of its tests the section that is its own."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from mpitest import Run, python_cmd, run

JOB = Path(__file__).with_name("shared_job.py")
#: The whole job's bound: the three checks took 17-27 s each in CI, each under a bound of 240-300 s.
TIMEOUT = 300.0


@cache
def shared_job() -> Run:
    """The one run of shared_job.py (cached: the first test that asks pays for all three sections)."""
    return run(python_cmd(str(JOB)), timeout=TIMEOUT)


def section(name: str) -> str:
    """The output of section ``name`` (a check module's name), once the job ended well and the section passed.

    Raises:
        AssertionError: the job failed, left processes behind or did not print the section, or the section failed.
    """
    result = shared_job()
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert out.rstrip().endswith("done"), out + result.stderr
    assert result.orphans == [], result.orphans
    found = re.search(rf"^== {name}\n(.*?)^== {name} (ok|FAILED)\n", out, re.M | re.S)
    assert found is not None, f"no section {name}:\n{out}{result.stderr}"
    assert found[2] == "ok", f"section {name} failed:\n{found[1]}"
    return found[1]
