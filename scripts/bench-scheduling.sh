#!/usr/bin/env bash
# Scheduling latency benchmark, run by hand (never by the test suite): how long after
# `POST /api/v1/models` a model's instance is `scheduled`, on `gantry start` (one server
# and its worker, embedded SQLite), over 100 creations one after the other.
#
#   scripts/bench-scheduling.sh              # 100 creations
#   BENCH_CREATIONS=500 scripts/bench-scheduling.sh
#
# It builds `gantry` and gantry-bench's `scheduling-latency` (profile BENCH_PROFILE,
# default dist, the shipped build), starts `gantry start` on a free loopback port with a fresh data
# directory, logs in as admin, and runs `scheduling-latency`, which prints
#   create → scheduled over N creations: p50 … ms, p90 … ms, p99 … ms, max … ms
# The script exits non-zero when p50 is above 20 ms or p99 above 50 ms (the targets).
set -euo pipefail
# The run's whole output also goes to bench/results/ (scripts/bench-record.sh).
source "$(dirname "$0")/bench-record.sh"
bench_record scheduling "$@"
cd "$(dirname "$0")/.."

CREATIONS="${BENCH_CREATIONS:-100}"
PROFILE="${BENCH_PROFILE:-dist}"
log() { echo "bench-scheduling: $*" >&2; }

log "building gantry and scheduling-latency (profile $PROFILE)"
# The same packages as the other bench scripts build, so that switching between them
# does not rebuild (and re-link with fat LTO) what another one built.
cargo build -q --profile "$PROFILE" -p gantry -p gantry-bench -p gantry-gguf --bins --example write-tiny-model
dir=$CARGO_TARGET_DIR/$PROFILE
[[ "$PROFILE" = dev ]] && dir=$CARGO_TARGET_DIR/debug

data=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$dir/gantry" start --data-dir "$data" --host 127.0.0.1 --port "$port" \
  --simulate-gpus 1x80GiB >"$data/gantry.log" 2>&1 &
gantry_pid=$!
trap 'kill "$gantry_pid" 2>/dev/null; wait "$gantry_pid" 2>/dev/null; rm -rf "$data"' EXIT
url="http://127.0.0.1:$port"
for _ in $(seq 100); do
  curl -sf "$url/readyz" >/dev/null 2>&1 && [[ -s "$data/initial_admin_password" ]] && break
  sleep 0.2
done
password=$(cat "$data/initial_admin_password")
token=$(curl -sf "$url/auth/login" -H 'content-type: application/json' \
  -d "{\"username\":\"admin\",\"password\":\"$password\"}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
token=$(curl -sf "$url/auth/change-password" -H "authorization: Bearer $token" \
  -H 'content-type: application/json' \
  -d "{\"current_password\":\"$password\",\"new_password\":\"bench-password-1\"}" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
# Wait for the worker to be ready.
for _ in $(seq 100); do
  curl -sf "$url/api/v1/workers" -H "authorization: Bearer $token" | grep -q '"state":"ready"' && break
  sleep 0.2
done
mkdir -p "$data/models"
: >"$data/models/bench.bin"

log "$CREATIONS creations against $url"
summary=$(GANTRY_URL="$url" GANTRY_TOKEN="$token" BENCH_MODEL_PATH="$data/models/bench.bin" \
  "$dir/scheduling-latency" "$CREATIONS")
echo "$summary"
p50=$(sed -E 's/.*p50 ([0-9.]+) ms.*/\1/' <<<"$summary")
p99=$(sed -E 's/.*p99 ([0-9.]+) ms.*/\1/' <<<"$summary")
if python3 -c "import sys; sys.exit(0 if $p50 <= 20 and $p99 <= 50 else 1)"; then
  log "within the targets (p50 ≤ 20 ms, p99 ≤ 50 ms)"
else
  log "outside the targets (p50 ≤ 20 ms, p99 ≤ 50 ms)"
  exit 1
fi
