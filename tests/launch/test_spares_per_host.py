"""``mpimesh run --spares-per-host K``: K more ranks on each host, for ``heal_mesh`` to take (issue #27)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest
from test_launcher import MPICH, OMPI5, PY, launcher_free_environ

from mpimesh._launch.cli import RunOptions, build_command, main, parse_run_args


@pytest.mark.parametrize("spelling", [["--spares-per-host", "2"], ["--spares-per-host=2"]])
def test_parse_spares_per_host(spelling: list[str]) -> None:
    opts = parse_run_args(["-n", "4", *spelling, "s.py", "--spares-per-host", "9"])
    assert opts.spares_per_host == 2 and opts.target == ["s.py", "--spares-per-host", "9"]
    assert parse_run_args(["-n", "4", "s.py"]).spares_per_host == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "4", "--spares-per-host", "-1", "s.py"],
         r"^mpimesh run: expecting a non-negative integer after --spares-per-host, got '-1'$"),
        (["-n", "4", "--spares-per-host", "one", "s.py"],
         r"^mpimesh run: expecting a non-negative integer after --spares-per-host, got 'one'$"),
        (["-n", "4", "--hostfile", "hf", "--spares-per-host", "1", "s.py"],
         r"^mpimesh run: --spares-per-host cannot change a --hostfile; add the spares to the file"),
    ],
    ids=["negative", "word", "hostfile"],
)
def test_parse_spares_per_host_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_run_args(argv)


def test_one_host_gets_n_plus_k_ranks() -> None:
    argv, _ = build_command(OMPI5, "mpiexec", RunOptions(4, ["a.py"], spares_per_host=2),
                            python=PY, environ={}, cpus=16, euid=1000)
    assert argv[:3] == ["mpiexec", "-n", "6"]
    assert "--oversubscribe" not in argv
    argv, _ = build_command(OMPI5, "mpiexec", RunOptions(2, ["a.py"], spares_per_host=1),
                            python=PY, environ={}, cpus=2, euid=1000)
    assert argv[:3] == ["mpiexec", "-n", "3"] and "--oversubscribe" in argv  # 3 ranks on 2 CPUs


def test_each_listed_host_gets_k_more_slots() -> None:
    opts = RunOptions(5, ["a.py"], hosts="node1:4,node2", spares_per_host=1)
    argv, _ = build_command(OMPI5, "mpiexec", opts, python=PY, environ={}, cpus=2, euid=1000)
    assert argv[:5] == ["mpiexec", "-n", "7", "--host", "node1:5,node2:2"], argv
    argv, _ = build_command(MPICH, "mpiexec", opts, python=PY, environ={}, cpus=2, euid=1000)
    assert argv[:5] == ["mpiexec", "-n", "7", "-hosts", "node1:5,node2:2"], argv


def test_spares_need_a_host_list_in_a_multi_node_allocation() -> None:
    environ = {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "2"}
    with pytest.raises(ValueError, match=r"^mpimesh run: --spares-per-host in a multi-node allocation needs"):
        build_command(OMPI5, "mpiexec", RunOptions(8, ["a.py"], spares_per_host=1),
                      python=PY, environ=environ, cpus=2, euid=1000)
    with pytest.raises(ValueError, match=r"^mpimesh run: expecting --host entries HOST or HOST:SLOTS"):
        build_command(OMPI5, "mpiexec", RunOptions(2, ["a.py"], hosts="a:x", spares_per_host=1),
                      python=PY, environ={}, cpus=2, euid=1000)


def test_help_tells_about_spares(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--spares-per-host K" in out and "heal_mesh()" in out and "node1:5" in out


@pytest.mark.subprocess
def test_main_dry_run_with_spares(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The dry-run line of a one-host job with spares: N+K processes, the script's words unchanged."""
    for name in set(os.environ) - set(launcher_free_environ()):
        monkeypatch.delenv(name)
    script = tmp_path / "app.py"
    script.write_text("")
    assert main(["run", "-n", "3", "--spares-per-host", "2", "--dry-run", str(script)]) == 0
    line = capsys.readouterr().out.strip()
    assert "mpiexec -n 5 " in line, line
    assert line.endswith(shlex.join([sys.executable, "-m", "mpimesh", str(script)]))
