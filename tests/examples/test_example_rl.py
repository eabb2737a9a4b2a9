"""examples/rl_weight_sync.py runs, from the launch pool and with spawned workers."""

from __future__ import annotations

import pytest
from mpitest import ROOT, mpiexec_cmd, python_cmd, run

#: Above the run's own bound (120 s): see tests/examples/test_examples.py.
pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(180)]

SCRIPT = str(ROOT / "examples" / "rl_weight_sync.py")


@pytest.mark.parametrize("launch", ["mpirun4", "spawned"])
def test_rl_weight_sync(launch: str) -> None:
    """Generators act with the weights the trainer published the step before, and end in sync."""
    cmd = python_cmd(SCRIPT) if launch == "spawned" else mpiexec_cmd(4, *python_cmd("-m", "mpimesh", SCRIPT))
    result = run(cmd, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "trainer exposes 526340 bytes of weights as <RDMABuffer 526340 bytes of cpu memory of trainer[0]@" in out
    for step in range(5):
        assert f"step {step}: generators acted with weights version [{step}], trainer published version {step + 1}" \
            in out, out
    assert "generators hold the trainer's final weights: True" in out
    assert out.rstrip().endswith("done")
    assert result.orphans == []
