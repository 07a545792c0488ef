#!/usr/bin/env bash
# Chaos under load, for longer than the test suite runs it: the chaos test
# (crates/gantry/tests/chaos_e2e.rs) with its sequence of faults repeated ROUNDS times
# (backend SIGKILL, backend SIGSTOP, worker SIGKILL and restart, server restart, each
# under steady gateway traffic), printing per fault how long the cluster took to converge
# and, at the end, requests answered, failed and cut.
#
#   scripts/chaos.sh        # 5 rounds
#   scripts/chaos.sh 20     # 20 rounds
#
# Needs llama-server and the Python environment like the suite (scripts/test.sh builds
# them; this script reuses their caches).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-5}"
GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh | tail -n 1)
export GANTRY_LLAMA_SERVER
export GANTRY_CHAOS_ROUNDS="$ROUNDS"
export RUST_BACKTRACE=0
cargo nextest run -p gantry --test chaos_e2e --no-capture 2>&1 | grep --line-buffered -E '^chaos:|panicked|PASS|FAIL'
