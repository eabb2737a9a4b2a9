"""Run Monarch's own actor tests against mpimesh and classify every test (issue #14).

Usage (from the repository root, as in docs/design/monarch-compat.md)::

    nice -n 5 .venv/bin/python scripts/monarch_compat/run.py            # every file in FILES
    nice -n 5 .venv/bin/python scripts/monarch_compat/run.py test_cookbook test_actor_error
    ... run.py --np 5 test_proc_mesh      # under mpiexec -n 5 --with-mpi (pool ranks)

Steps:

1. Obtain Monarch's ``python/tests`` into ``WORK/src`` (once): ``pip download
   torchmonarch==VERSION --no-deps --no-binary :all:`` for its sdist; if no
   sdist is reachable, ``git archive`` from a mirror of
   github.com/meta-pytorch/monarch (``--mirror``, default ``$MONARCH_MIRROR``
   or the snapshot the session's ``fetch`` tool makes).  Nothing of Monarch
   is copied into this repository.
2. Lay out ``WORK/tests``: Monarch's test files and helpers, less its
   ``conftest.py`` (its Rust-extension probes), and with the harness's own
   ``helpers/`` in place of three of Monarch's test helpers that reach its
   config and private state (``isolate_in_subprocess``, ``rdma_test_utils``,
   ``proc_mesh_test_utils``: same contract, public names only); a ``pytest.ini`` with Monarch's own pytest
   options (``asyncio_mode = auto``).
3. Install pytest-asyncio (Monarch's tests are ``async def``) into
   ``WORK/site``, outside the project's environment.
4. Run each file alone: ``timeout T nice -n 5 python -m mpimesh -m pytest``
   with ``shim/`` (the ``monarch`` package of public names) and this folder
   on ``PYTHONPATH`` and ``compat_plugin`` loaded; results per test in
   ``WORK/results/FILE.jsonl``, output in ``WORK/logs/FILE.log``.
5. Print the table (pass / fail / internals / by-design / skipped per file)
   and write it, with every failure's reason, to ``WORK/summary.md``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_MIRROR = "/work/.mirror/meta-pytorch+monarch/repo"

#: Monarch's actor-level test files (python/tests/...), the ones issue #14 measures.
FILES = (
    "test_python_actors",
    "test_actor_error",
    "test_proc_mesh",
    "test_supervision_hierarchy",
    "test_concurrent_endpoints",
    "test_cookbook",
    "test_client_shutdown",
    "test_controller_dedup",
    "test_inter_mesh_ping_pong",
    "test_actor_shape",
    "test_rdma",
    "test_rdma_unit",
    "test_rdma_action",
    "test_rdma_cpu_no_torch",
)

#: Monarch's actor-only examples (paths in its repository), each run as a script: pass = exit status 0.
EXAMPLES = (
    "docs/source/examples/ping_pong.py",
    "docs/source/rdma.py",
    "docs/source/examples/grpo_yield.py",
)

CATEGORIES = ("pass", "fail", "internals", "by-design", "skipped")


def obtain(work: str, version: str, mirror: str) -> str:
    """Monarch's python/tests under WORK/src; returns where they came from."""
    src = os.path.join(work, "src")
    stamp = os.path.join(work, "SOURCE")
    if os.path.isdir(os.path.join(src, "python", "tests")) and os.path.exists(stamp):
        with open(stamp) as f:
            source = f.read().strip()
        if source.startswith("sdist") or all(os.path.exists(os.path.join(src, p)) for p in EXAMPLES):
            return source
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    dl = os.path.join(work, "download")
    os.makedirs(dl, exist_ok=True)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "download",
        f"torchmonarch=={version}",
        "--no-deps",
        "--no-binary",
        ":all:",
        "-d",
        dl,
    ]
    got = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    sdists = glob.glob(os.path.join(dl, "torchmonarch-*.tar.gz"))
    if got.returncode == 0 and sdists:
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(src, filter="data")
        (top,) = os.listdir(src)
        for entry in os.listdir(os.path.join(src, top)):
            shutil.move(os.path.join(src, top, entry), src)
        source = f"sdist torchmonarch=={version} ({os.path.basename(sdists[0])})"
    else:
        if not os.path.isdir(mirror):
            raise SystemExit(
                f"monarch_compat: no sdist of torchmonarch=={version} ({got.stderr.strip().splitlines()[-1:]}) "
                f"and no mirror at {mirror!r}; clone github.com/meta-pytorch/monarch and pass --mirror PATH"
            )
        commit = subprocess.run(
            ["git", "-C", mirror, "log", "-1", "--format=%H %cs"], capture_output=True, text=True, check=True
        )
        version_line = subprocess.run(
            ["git", "-C", mirror, "show", "HEAD:setup.py"], capture_output=True, text=True, check=True
        )
        dev = next((line.split('"')[-2] for line in version_line.stdout.splitlines() if "MONARCH_VERSION" in line), "?")
        archive = subprocess.run(
            ["git", "-C", mirror, "archive", "HEAD", "python/tests", *EXAMPLES], capture_output=True, check=True
        )
        tar_path = os.path.join(work, "monarch.tar")
        with open(tar_path, "wb") as f:
            f.write(archive.stdout)
        with tarfile.open(tar_path) as tar:
            tar.extractall(src, filter="data")
        sha, date = commit.stdout.split()
        source = f"github.com/meta-pytorch/monarch at {sha[:12]} ({date}, version {dev})"
    with open(stamp, "w") as f:
        f.write(source + "\n")
    return source


def lay_out(work: str) -> str:
    """Monarch's tests, the harness's helpers and a pytest.ini under WORK/tests; returns that folder."""
    tests = os.path.join(work, "tests")
    shutil.rmtree(tests, ignore_errors=True)
    shutil.copytree(os.path.join(work, "src", "python", "tests"), tests)
    os.remove(os.path.join(tests, "conftest.py"))
    for helper in os.listdir(os.path.join(HERE, "helpers")):
        if helper.endswith(".py"):
            shutil.copy(os.path.join(HERE, "helpers", helper), os.path.join(tests, helper))
    with open(os.path.join(tests, "pytest.ini"), "w") as f:
        f.write(
            "[pytest]\n"
            "asyncio_mode = auto\n"
            "asyncio_default_fixture_loop_scope = function\n"
            "timeout = 120\n"
            "addopts = -p no:cacheprovider -p compat_plugin -rN\n"
            "markers =\n    oss_skip: Monarch's marker for tests skipped in its OSS CI\n"
        )
    return tests


def site_packages(work: str) -> str:
    """pytest-asyncio under WORK/site (installed once, outside the project's environment)."""
    site = os.path.join(work, "site")
    if not os.path.isdir(os.path.join(site, "pytest_asyncio")):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, "pytest-asyncio"],
            check=True,
            timeout=300,
        )
    return site


def run_file(work: str, tests: str, site: str, name: str, *, np: int, timeout: int) -> list[dict[str, str]]:
    """Run one test file under mpimesh with a bound; its classified results, one per test."""
    results = os.path.join(work, "results", f"{name}.jsonl")
    log = os.path.join(work, "logs", f"{name}.log")
    for path in (results, log):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.remove(path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "site_hook"), os.path.join(HERE, "shim"), HERE, site, tests]
    )
    env["MONARCH_COMPAT_RESULTS"] = results
    bindir = os.path.dirname(sys.executable)
    pytest = ["-m", "mpimesh", "-m", "pytest", "-c", os.path.join(tests, "pytest.ini"), "--rootdir", tests]
    if np > 1:
        cmd = [
            os.path.join(bindir, "mpiexec"),
            "--oversubscribe",
            "--bind-to",
            "none",
            "-n",
            str(np),
            sys.executable,
            *pytest,
            "--with-mpi",
        ]
    else:
        cmd = [sys.executable, *pytest]
    cmd = ["timeout", "-k", "15", str(timeout), "nice", "-n", "5", *cmd, os.path.join(tests, f"{name}.py"), "-q"]
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(cmd, env=env, cwd=tests, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    elapsed = time.monotonic() - started
    by_id: dict[str, dict[str, str]] = {}
    if os.path.exists(results):
        with open(results) as f:
            for line in f:
                record = json.loads(line)
                previous = by_id.get(record["nodeid"])
                if previous is None or previous["category"] == "pass":
                    by_id[record["nodeid"]] = record
    for test in collect(tests, site, name):
        if test not in by_id:
            reason = (
                "file timed out before this test ended"
                if proc.returncode in (124, 137)
                else f"no result (pytest exit {proc.returncode})"
            )
            by_id[test] = {"nodeid": test, "category": "fail", "reason": reason}
    print(f"{name}: exit {proc.returncode} in {elapsed:.0f} s", file=sys.stderr)
    return list(by_id.values())


def collect(tests: str, site: str, name: str) -> list[str]:
    """The test ids of one file, so that tests a timed-out run never reached still count."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "site_hook"), os.path.join(HERE, "shim"), HERE, site, tests]
    )
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            os.path.join(tests, "pytest.ini"),
            "--rootdir",
            tests,
            "--collect-only",
            "-q",
            f"{name}.py",
        ],
        env=env,
        cwd=tests,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return [line.strip() for line in got.stdout.splitlines() if "::" in line]


def run_example(work: str, site: str, path: str, *, np: int, timeout: int) -> dict[str, str]:
    """Run one of Monarch's examples as a script under mpimesh with a bound; pass when it exits 0."""
    script = os.path.join(work, "src", path)
    name = os.path.basename(path)
    if not os.path.exists(script):
        return {"nodeid": path, "category": "fail", "reason": "not in the source obtained (an sdist has no docs/)"}
    log = os.path.join(work, "logs", f"example_{name}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "site_hook"), os.path.join(HERE, "shim"), HERE, site])
    cmd = [sys.executable, "-m", "mpimesh", script]
    if np > 1:
        cmd = [
            os.path.join(os.path.dirname(sys.executable), "mpiexec"),
            "--oversubscribe",
            "--bind-to",
            "none",
            "-n",
            str(np),
            *cmd,
        ]
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run(
            ["timeout", "-k", "15", str(timeout), "nice", "-n", "5", *cmd],
            env=env,
            cwd=os.path.dirname(script),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    elapsed = time.monotonic() - started
    if proc.returncode == 0:
        return {"nodeid": path, "category": "pass", "reason": f"{elapsed:.0f} s"}
    reason = "timed out" if proc.returncode in (124, 137) else f"exit status {proc.returncode}"
    return {"nodeid": path, "category": "fail", "reason": f"{reason} after {elapsed:.0f} s (log: {log})"}


def table(per_file: dict[str, list[dict[str, str]]]) -> str:
    """The markdown table of counts per file and category."""
    lines = [
        "| file | tests | " + " | ".join(CATEGORIES) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in CATEGORIES) + " |",
    ]
    totals = dict.fromkeys(CATEGORIES, 0)
    for name, records in per_file.items():
        counts = {c: sum(r["category"] == c for r in records) for c in CATEGORIES}
        for c in CATEGORIES:
            totals[c] += counts[c]
        label = "examples" if name == "examples" else f"`{name}.py`"
        lines.append(f"| {label} | {len(records)} | " + " | ".join(str(counts[c]) for c in CATEGORIES) + " |")
    lines.append(f"| total | {sum(totals.values())} | " + " | ".join(str(totals[c]) for c in CATEGORIES) + " |")
    return "\n".join(lines)


def stored_report(work: str) -> str:
    """The table and the non-passing tests of every file of FILES whose results WORK holds (the last run of each)."""
    per_file: dict[str, list[dict[str, str]]] = {}
    for name in FILES:
        path = os.path.join(work, "results", f"{name}.jsonl")
        if not os.path.exists(path):
            continue
        by_id: dict[str, dict[str, str]] = {}
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if record["nodeid"] not in by_id or by_id[record["nodeid"]]["category"] == "pass":
                    by_id[record["nodeid"]] = record
        per_file[name] = list(by_id.values())
    with open(os.path.join(work, "SOURCE")) as f:
        lines = [f"Monarch: {f.read().strip()}", "", table(per_file), ""]
    for records in per_file.values():
        for r in sorted(records, key=lambda r: r["nodeid"]):
            if r["category"] != "pass":
                lines.append(f"- {r['category']}: `{r['nodeid']}`: {r['reason']}")
    return "\n".join(lines)


def main() -> None:
    """Obtain, lay out, run the files, print and save the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test file names without .py (default: all of FILES)")
    parser.add_argument("--work", default="/tmp/monarch_compat")
    parser.add_argument("--version", default="0.7.0")
    parser.add_argument("--mirror", default=os.environ.get("MONARCH_MIRROR", DEFAULT_MIRROR))
    parser.add_argument("--np", type=int, default=1, help="mpiexec -n NP (1: workers spawned)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per file")
    parser.add_argument("--examples", action="store_true", help="run Monarch's actor-only examples (EXAMPLES) too")
    parser.add_argument("--report", action="store_true", help="run nothing: the table of the results stored in WORK")
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if args.report:
        print(stored_report(args.work))
        return
    source = obtain(args.work, args.version, args.mirror)
    tests = lay_out(args.work)
    site = site_packages(args.work)
    names = args.files if args.files else ([] if args.examples else list(FILES))
    per_file = {name: run_file(args.work, tests, site, name, np=args.np, timeout=args.timeout) for name in names}
    if args.examples:
        per_file["examples"] = [
            run_example(args.work, site, path, np=args.np, timeout=min(args.timeout, 300)) for path in EXAMPLES
        ]
    report = [
        f"Monarch: {source}",
        f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, np={args.np}",
        "",
        table(per_file),
        "",
    ]
    for records in per_file.values():
        for r in sorted(records, key=lambda r: r["nodeid"]):
            if r["category"] != "pass":
                report.append(f"- {r['category']}: `{r['nodeid']}`: {r['reason']}")
    text = "\n".join(report) + "\n"
    with open(os.path.join(args.work, "summary.md"), "a") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
