#!/usr/bin/env bash
# Run every mpimesh benchmark with a bounded timeout; collect their JSON lines.
#
# usage: benchmarks/run_all.sh [RESULTS]        (default benchmarks/results.jsonl)
#
# Environment: PYTHON (default .venv/bin/python; its directory must hold the
# matching mpiexec), BENCH_LOGDIR (default: a fresh /tmp/mpimesh-bench.XXXX).
# Each benchmark runs in a session of its own and is killed, with all its
# processes, when it overruns its limit; a line {"bench":..., "error":...}
# then stands in for its figures.
set -u
cd "$(dirname "$0")/.."
RESULTS=${1:-benchmarks/results.jsonl}
PY=${PYTHON:-.venv/bin/python}
MPIEXEC="$(dirname "$PY")/mpiexec"
LOGDIR=${BENCH_LOGDIR:-$(mktemp -d /tmp/mpimesh-bench.XXXX)}
: > "$RESULTS"
MPIRUN=("$MPIEXEC" --oversubscribe --bind-to none)
run() {  # name timeout_s cmd...
    local name=$1 limit=$2
    shift 2
    "$PY" benchmarks/_run.py "$name" "$limit" "$RESULTS" "$LOGDIR" -- "$@" || failed=$((failed + 1))
}
failed=0
run b1 180 "${MPIRUN[@]}" -n 2 "$PY" -m mpimesh benchmarks/bench_b1.py
run b1_spawned 180 "$PY" -m mpimesh benchmarks/bench_b1.py
run b2 180 "${MPIRUN[@]}" -n 3 "$PY" -m mpimesh benchmarks/bench_b2.py
run b3 240 "${MPIRUN[@]}" -n 2 "$PY" -m mpimesh benchmarks/bench_b3.py
run b4 300 "${MPIRUN[@]}" -n 2 "$PY" -m mpimesh benchmarks/bench_b4.py
run b5 600 "$PY" benchmarks/bench_b5.py
run b6 300 "${MPIRUN[@]}" -n 2 "$PY" -m mpimesh benchmarks/bench_b6.py
run b8 300 "${MPIRUN[@]}" -n 3 "$PY" -m mpimesh benchmarks/bench_b8.py
[ -f benchmarks/bench_b7.py ] && run b7 900 "$PY" benchmarks/bench_b7.py
run b9 600 "${MPIRUN[@]}" -n 17 "$PY" -m mpimesh benchmarks/bench_b9.py
run b16 900 "${MPIRUN[@]}" -n 65 "$PY" -m mpimesh benchmarks/bench_b16.py
run links 300 "${MPIRUN[@]}" -n 2 "$PY" -m mpimesh benchmarks/bench_links.py
echo "results: $RESULTS  logs: $LOGDIR  failed: $failed"
exit $((failed > 0))
