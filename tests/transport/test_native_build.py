"""setup.py's build of ``mpimesh._native``: which compiler wrapper it takes, and when it skips.

Each test builds into its own temporary directories (``--build-lib``,
``--build-temp``), never in place, so the checkout's build is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpitest import ROOT


def _build(tmp_path: Path, mpicc: str) -> tuple[subprocess.CompletedProcess[str], list[Path]]:
    lib, temp = tmp_path / "lib", tmp_path / "temp"
    env = {k: v for k, v in os.environ.items() if k != "MPICC"}
    env["MPIMESH_MPICC"] = mpicc
    result = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(lib), "--build-temp", str(temp)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    return result, sorted(lib.rglob("_native*.so"))


def test_none_skips_the_native_part(tmp_path: Path) -> None:
    """MPIMESH_MPICC=none: a second venv with another MPI must not overwrite the in-place build."""
    result, built = _build(tmp_path, "none")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "mpimesh._native not built: MPIMESH_MPICC=none" in result.stdout + result.stderr
    assert built == []


def test_a_missing_wrapper_is_reported_and_the_next_place_is_tried(tmp_path: Path) -> None:
    """A $MPIMESH_MPICC that is not there does not stop the search: the mpicc beside the interpreter builds it."""
    if not (Path(sys.executable).parent / "mpicc").exists():
        pytest.skip(f"no mpicc beside {sys.executable}")
    result, built = _build(tmp_path, "/nowhere/mpicc")
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(built) == 1 and f"{Path(sys.executable).parent / 'mpicc'} " in result.stdout


def test_the_wrapper_beside_the_interpreter_builds_it(tmp_path: Path) -> None:
    mpicc = Path(sys.executable).parent / "mpicc"
    if not mpicc.exists():
        pytest.skip(f"no mpicc beside {sys.executable}")
    result, built = _build(tmp_path, str(mpicc))
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(built) == 1, result.stdout[-2000:] + result.stderr[-2000:]
    load = ("import importlib.util as u, sys; spec = u.spec_from_file_location('mpimesh._native', sys.argv[1]); "
            "mod = u.module_from_spec(spec); spec.loader.exec_module(mod); print(mod.built_with())")
    probe = subprocess.run([sys.executable, "-c", load, str(built[0])], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.startswith(("Open MPI", "MPICH")), probe.stdout
