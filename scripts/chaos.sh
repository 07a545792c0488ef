#!/usr/bin/env bash
# Faults under load, for longer than the test suite runs them, printing the figures:
#
# - the chaos test (crates/gantry/tests/e2e/chaos.rs) with its sequence of faults repeated
#   ROUNDS times (backend SIGKILL, backend SIGSTOP, worker SIGKILL and restart, server
#   restart, each under steady gateway traffic): per fault, how long the cluster took to
#   converge; at the end, requests answered, failed and cut;
# - the outage test (crates/gantry/tests/e2e/outage.rs) with PostgreSQL stopped for
#   OUTAGE_SECONDS: requests answered meanwhile and failed, how long until everything
#   resumed, and whether any backend was restarted.
#
#   scripts/chaos.sh            # 5 rounds, a 5-minute outage
#   scripts/chaos.sh 20 600     # 20 rounds, a 10-minute outage
#
# Needs llama-server and PostgreSQL like the suite (scripts/test.sh builds and installs
# them; this script reuses their caches).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-5}"
OUTAGE_SECONDS="${2:-300}"
GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh | tail -n 1)
export GANTRY_LLAMA_SERVER GANTRY_CHAOS_ROUNDS="$ROUNDS" GANTRY_OUTAGE_SECONDS="$OUTAGE_SECONDS"
export RUST_BACKTRACE=0
scripts/with-postgres.sh cargo nextest run -p gantry --test e2e --profile chaos \
  -E 'test(/^chaos::/) | test(/^outage::/)' --no-capture --test-threads 1 \
  2>&1 | grep --line-buffered -E '^(chaos|outage):|panicked|PASS|FAIL'
