#!/usr/bin/env bash
# Compare B1 and B3 between two checkouts in one run, alternating them so that
# both see the same machine load (a refactor must not slow the hot path).
#
# usage: benchmarks/ab.sh BEFORE_DIR AFTER_DIR [ROUNDS]      (default 3 rounds)
#
# Each directory is a checkout of mpimesh with its native part built in place
# (copy mpimesh/_native*.so into a git worktree).  The benchmark scripts are
# this checkout's, run with PYTHONPATH pointing at each tree in turn; the venv
# is this checkout's .venv.  Prints one JSON line per run, then one summary
# line per benchmark: the medians of both trees' medians and after/before.
set -euo pipefail
cd "$(dirname "$0")/.."
before=$(cd "$1" && pwd) after=$(cd "$2" && pwd) rounds=${3:-3}
PY=${PYTHON:-$PWD/.venv/bin/python}
MPIRUN=("$(dirname "$PY")/mpiexec" --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
out=$(mktemp)
# `python -m` puts the working directory first on sys.path: run from an empty one, or every
# tree would import this checkout's mpimesh (both sides measured the same code).
run=$(mktemp -d) benches=$PWD/benchmarks
trap 'rm -rf "$out" "$run"' EXIT
for _ in $(seq "$rounds"); do
  for tree in "$before" "$after"; do
    for bench in b1 b3; do
      line=$(cd "$run" && PYTHONPATH="$tree" timeout 300 "${MPIRUN[@]}" -n 2 "$PY" -m mpimesh "$benches/bench_$bench.py" | tail -1)
      echo "{\"tree\": \"$tree\", \"data\": $line}" | tee -a "$out"
    done
  done
done
"$PY" - "$out" "$before" "$after" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key = {"B1": "median_us", "B3": "calls_per_s"}
for bench, field in key.items():
    got = {t: [r["data"][field] for r in rows if r["tree"] == t and r["data"]["bench"] == bench] for t in sys.argv[2:]}
    b, a = (statistics.median(got[t]) for t in sys.argv[2:])
    print(json.dumps({"bench": bench, "field": field, "before": b, "after": a, "after_over_before": round(a / b, 3),
                      "before_runs": got[sys.argv[2]], "after_runs": got[sys.argv[3]]}))
PY
