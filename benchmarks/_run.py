"""Run one benchmark command with a timeout and append its JSON line to a file.

Usage: ``python benchmarks/_run.py NAME TIMEOUT_S RESULTS LOGDIR -- CMD...``

The command runs in a session of its own; on timeout every process of the
session is killed (mpiexec, its ranks, a singleton's prte), and a JSON line
``{"bench": NAME, "error": ...}`` is appended instead.  stdout and stderr
are kept in ``LOGDIR/NAME.out`` and ``LOGDIR/NAME.err``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from _common import launch_env, run_bounded


def tree_state() -> str:
    """``HEAD`` of the checkout, with ``+dirty`` if mpimesh/ has local edits."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "mpimesh"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def main(argv: list[str]) -> int:
    name, timeout, results, logdir = argv[0], float(argv[1]), argv[2], argv[3]
    if argv[4] != "--":
        raise SystemExit("usage: _run.py NAME TIMEOUT_S RESULTS LOGDIR -- CMD...")
    cmd = argv[5:]
    t0 = time.monotonic()
    record: dict
    try:
        proc = run_bounded(cmd, launch_env(), timeout)
    except subprocess.TimeoutExpired:
        out, err, rc = "", "", None
        record = {"bench": name, "error": f"timed out after {timeout:g} s; every process of its session was killed"}
    else:
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
        record = {}
        for line in reversed(out.splitlines()):
            try:
                record = json.loads(line)
                break
            except ValueError:
                continue
        if rc != 0 or not record:
            record = {"bench": name, "error": f"exit status {rc}", "stderr_tail": err[-800:]}
    record["run"] = name
    record["cmd"] = " ".join(os.path.relpath(c) if c.startswith("/") and os.path.exists(c) else c for c in cmd)
    record["wall_s"] = round(time.monotonic() - t0, 1)
    record["tree"] = tree_state()
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, f"{name}.out"), "w") as f:
        f.write(out)
    with open(os.path.join(logdir, f"{name}.err"), "w") as f:
        f.write(err)
    with open(results, "a") as f:
        f.write(json.dumps(record) + "\n")
    status = "ok" if "error" not in record else record["error"]
    print(f"{name}: {status} ({record['wall_s']} s)", flush=True)
    return 0 if "error" not in record else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
