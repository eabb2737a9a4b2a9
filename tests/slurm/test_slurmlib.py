"""The Slurm helpers shared by the Slurm tests and ``benchmarks/bench_heal.py`` (pure: fake Slurm commands)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurmlib import nodes_idle, sbatch_wait

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``sinfo`` first on PATH that prints the file it returns, word for word."""
    states = tmp_path / "states"
    fake = tmp_path / "bin" / "sinfo"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\ncat "{states}"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    return states


def test_idle_nodes_return_at_once(sinfo: Path) -> None:
    """Every node named and idle: None."""
    sinfo.write_text("fx1 idle\nfx2 idle\n")
    assert nodes_idle(["fx1", "fx2"], 5) is None


def test_a_node_not_idle_gives_the_states_at_the_timeout(sinfo: Path) -> None:
    """A node down (or one missing) is waited for until the timeout, then the states seen are returned."""
    sinfo.write_text("fx1 idle\nfx2 down*\n")
    assert nodes_idle(["fx1", "fx2"], 0.3) == ["fx1", "idle", "fx2", "down*"]
    sinfo.write_text("fx1 idle\n")
    assert nodes_idle(["fx1", "fx2"], 0.0) == ["fx1", "idle"]


def test_the_benchmark_imports_the_helper_without_pytest() -> None:
    """bench_heal.py finds slurmlib from its own folder, and slurmlib needs nothing but the standard library."""
    code = ("import sys; sys.modules['pytest'] = None; sys.path.insert(0, 'benchmarks'); "
            "import runpy; g = runpy.run_path('benchmarks/bench_heal.py', run_name='not_main'); "
            "assert g['nodes_idle'].__module__ == 'slurmlib'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``sbatch`` (writes MPIMESH_FAKE_OUTPUT to --output, sleeps MPIMESH_FAKE_SLEEP, exits
    MPIMESH_FAKE_STATUS) and ``scancel`` first on PATH; both log their arguments to the file returned."""
    log = tmp_path / "calls"
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\n"
        f'echo "sbatch $*" >> "{log}"\n'
        'for a in "$@"; do case "$a" in --output=*) out="${a#--output=}" ;; esac; done\n'
        '[ -n "$MPIMESH_FAKE_OUTPUT" ] && printf "%s\\n" "$MPIMESH_FAKE_OUTPUT" > "$out"\n'
        'sleep "${MPIMESH_FAKE_SLEEP:-0}"\n'
        'exit "${MPIMESH_FAKE_STATUS:-0}"\n')
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "scancel $*" >> "{log}"\n')
    for tool in ("sbatch", "scancel"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_a_job_gives_its_status_and_output_and_is_cancelled_by_name(fake_slurm: Path, tmp_path: Path) -> None:
    """sbatch --wait with the options given after the fixed ones; the job's status and output; scancel by name."""
    out = tmp_path / "job.out"
    env = {**os.environ, "MPIMESH_FAKE_OUTPUT": "HOSTS a b", "MPIMESH_FAKE_STATUS": "3"}
    assert sbatch_wait(["--nodes=2", "job.sh"], name="t-1", output=out, env=env, cwd=tmp_path) == (3, "HOSTS a b\n")
    assert fake_slurm.read_text().splitlines() == [
        f"sbatch --wait --quiet --output={out} --job-name=t-1 --nodes=2 job.sh", "scancel --full --name=t-1"]


def test_a_job_past_its_timeout_gives_minus_one_and_is_cancelled(fake_slurm: Path, tmp_path: Path) -> None:
    """sbatch still waiting at the timeout: status -1, no output file (""), and the job cancelled all the same."""
    env = {**os.environ, "MPIMESH_FAKE_OUTPUT": "", "MPIMESH_FAKE_SLEEP": "5"}
    assert sbatch_wait(["job.sh"], name="t-2", output=tmp_path / "none.out", env=env, cwd=tmp_path,
                       timeout=0.3) == (-1, "")
    assert fake_slurm.read_text().splitlines()[-1] == "scancel --full --name=t-2"
