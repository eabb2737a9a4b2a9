#!/usr/bin/env bash
# The demo: set up (first run only), then run the hello-mesh and ping-pong
# examples on 5 MPI ranks (rank 0 is the controller, ranks 1-4 the workers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
for example in examples/hello_mesh.py examples/ping_pong.py; do
  echo "== mpimesh run -n 5 $example"
  timeout 300 .venv/bin/mpimesh run -n 5 "$example"
done
