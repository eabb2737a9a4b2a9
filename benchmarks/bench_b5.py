"""B5: wall time from process start to the first call on a 2-process mesh, then teardown.

Run (a driver: it launches every job itself, each with a timeout)::

    .venv/bin/python benchmarks/bench_b5.py

Modes, each repeated (default 5, interleaved):

* ``pool``: ``mpiexec -n 3 python -m mpimesh _b5_child.py``: the 2 workers
  are launch-pool ranks;
* ``spawned``: ``python -m mpimesh _b5_child.py``: the 2 workers are created
  with ``MPI_Comm_spawn``;
* ``raw_pool`` / ``raw_spawned``: the mpi4py baseline ``_b5_raw.py``: the same
  launches, one pickled round trip with both workers, then exit.

``start_s`` runs from just before the launch (``Popen``) to the first
successful ``call().get()`` on the mesh; ``to_script_s`` is the part before
the controller script's first line (interpreter, MPI_Init, mpimesh boot);
``teardown_s`` runs from just before ``procs.stop()`` to the exit of the
launched command (mpiexec, or the plain python), ``stop_s`` is
``procs.stop().get()`` alone.  Prints one JSON line.

mpimesh's bytecode is compiled first, as an installed package's is (pip
writes it at install time, and mpi4py's, used by the baseline, is there):
in an environment with ``PYTHONDONTWRITEBYTECODE=1`` an editable checkout
would otherwise be compiled from source in every process (~30 ms each).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import time

from _common import emit, launch_env, median, r, ratio, run_bounded

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
MPIEXEC = [os.path.join(BIN, "mpiexec"), "--oversubscribe", "--bind-to", "none", "-n", "3"]


def commands() -> dict[str, list[str]]:
    child = os.path.join(HERE, "_b5_child.py")
    raw = os.path.join(HERE, "_b5_raw.py")
    return {
        "pool": MPIEXEC + [sys.executable, "-m", "mpimesh", child],
        "spawned": [sys.executable, "-m", "mpimesh", child],
        "raw_pool": MPIEXEC + [sys.executable, raw, "pool"],
        "raw_spawned": [sys.executable, raw, "spawn"],
    }


def one_run(cmd: list[str], timeout: float) -> dict[str, float] | dict[str, str]:
    """Launch ``cmd`` once; the timings in seconds, or an ``error``."""
    env = launch_env()
    t_launch = time.time()
    try:
        proc = run_bounded(cmd, env, timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s (session killed)"}
    t_exit = time.time()
    stamps: dict[str, object] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("B5STAMP "):
            stamps.update(json.loads(line[len("B5STAMP "):]))
    if proc.returncode != 0 or "t_stop0" not in stamps:
        return {"error": f"status {proc.returncode}: {proc.stderr[-1500:]}"}
    return {
        "start_s": stamps["t_first"] - t_launch,
        "to_script_s": stamps["t_script"] - t_launch,
        "script_to_first_s": stamps["t_first"] - stamps["t_script"],
        "stop_s": stamps["t_stop1"] - stamps["t_stop0"],
        "teardown_s": t_exit - stamps["t_stop0"],
        "total_s": t_exit - t_launch,
        "spawned": stamps["spawned"],
        "world": stamps["world"],
        "mpi_library": stamps["mpi_library"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per launch")
    ap.add_argument("--modes", default="pool,spawned,raw_pool,raw_spawned")
    args = ap.parse_args()

    import mpimesh

    package = os.path.dirname(os.path.abspath(mpimesh.__file__))
    compiled = compileall.compile_dir(package, quiet=1)
    cmds = commands()
    modes = args.modes.split(",")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for m in modes:
            runs[m].append(one_run(cmds[m], args.timeout))

    out: dict[str, dict] = {}
    library = None
    for m in modes:
        good = [x for x in runs[m] if "error" not in x]
        errors = [x["error"] for x in runs[m] if "error" in x]
        entry: dict[str, object] = {"runs": len(runs[m]), "failed": len(errors)}
        if errors:
            entry["errors"] = errors[:2]
        if good:
            library = good[0]["mpi_library"]
            for key in ("start_s", "to_script_s", "script_to_first_s", "stop_s", "teardown_s", "total_s"):
                entry[key] = r(median(x[key] for x in good), 3)
            entry["repeat_start_s"] = [r(x["start_s"], 3) for x in good]
            entry["repeat_teardown_s"] = [r(x["teardown_s"], 3) for x in good]
            entry["workers"] = "spawned" if good[0]["spawned"] else "pool"
            entry["mpiexec_n"] = 3 if m.endswith("pool") else None
        out[m] = entry

    def fig(mode: str, key: str) -> float | None:
        value = out.get(mode, {}).get(key)
        return value if isinstance(value, float) else None

    record = {
        "bench": "B5",
        "what": "process start to first call on a 2-process mesh; teardown to process exit",
        "repeats": args.repeats,
        "pool_start_s": fig("pool", "start_s"),
        "pool_teardown_s": fig("pool", "teardown_s"),
        "spawned_start_s": fig("spawned", "start_s"),
        "spawned_teardown_s": fig("spawned", "teardown_s"),
        "baseline": "mpi4py: same launch, one pickled round trip with both workers, exit (_b5_raw.py)",
        "baseline_pool_start_s": fig("raw_pool", "start_s"),
        "baseline_pool_teardown_s": fig("raw_pool", "teardown_s"),
        "baseline_spawned_start_s": fig("raw_spawned", "start_s"),
        "baseline_spawned_teardown_s": fig("raw_spawned", "teardown_s"),
        "ratio_pool_start": ratio(fig("pool", "start_s"), fig("raw_pool", "start_s")),
        "ratio_spawned_start": ratio(fig("spawned", "start_s"), fig("raw_spawned", "start_s")),
        "modes": out,
        "bytecode": "precompiled" if compiled else "compileall failed",
        "mpi_library": library,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    emit(record)


if __name__ == "__main__":
    main()
