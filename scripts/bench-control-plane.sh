#!/usr/bin/env bash
# Control-plane load benchmark, run by hand (never by the test suite): one real
# `gantry server` against N simulated workers with 8 simulated GPUs each, on SQLite and on
# PostgreSQL.
#
#   scripts/bench-control-plane.sh                                # N=1000, both databases
#   BENCH_WORKERS="1000 10000" BENCH_DATABASES=sqlite scripts/bench-control-plane.sh
#   BENCH_INSTANCES=2000 BENCH_CYCLES=1000 scripts/bench-control-plane.sh   # a quick run
#
# What it does:
#   1. builds `gantry` and gantry-bench's `control-plane-load` (profile BENCH_PROFILE,
#      default dist: the figures are only meaningful from the shipped build);
#   2. raises the open-file limit to its hard limit (every simulated worker holds an
#      assignment watch: one socket in the load process and one in the server);
#   3. for each database in BENCH_DATABASES and each N in BENCH_WORKERS: starts
#      `gantry server` on a free loopback port with a fresh data directory (and, for
#      PostgreSQL, a fresh database on a throwaway server from scripts/with-postgres.sh,
#      or on GANTRY_TEST_POSTGRES_URL), bootstraps the admin with --bootstrap-password,
#      and runs `control-plane-load` against it. The load process's simulated workers are
#      TEST DOUBLES of the worker agent: tasks that register, heartbeat every 15 s (spread
#      over the interval), hold their assignment watches and report their instances
#      `starting` and `running` — no backend runs anywhere;
#   4. prints the tool's figures as it goes, then one summary block per run, and the
#      server's warnings and errors grouped by message (e.g. "watch stream fell behind").
#
# The phases and their figures (see crates/gantry-bench/src/control_plane/mod.rs):
#   a. registration, then heartbeat latency p50/p99 and server CPU (% of a core) and RSS
#      over BENCH_WINDOW seconds (targets at 10,000 workers: p99 ≤ 10 ms, ≤ 25 % of a
#      core, ≤ 200 MB);
#   b. BENCH_INSTANCES (M) instances held pending, released at once: time until all are
#      placed (target ≤ 2 s) and running; then a 100-replica model on the loaded cluster;
#   c. p50/p99 of worker and instance list pages (per_page=100; target p99 ≤ 20 ms);
#   e. BENCH_CYCLES create → placed → delete cycles: median RSS over the first 1,000 against
#      the median over the last 1,000 (target within 20 %);
#   d. workers that left `ready` during the run while their heartbeats were on time
#      (target 0).
#
# Everything runs on this machine: the server, its database and the load process share
# the CPUs, and the load process's CPU is printed next to the server's.
#
# Environment: BENCH_WORKERS (N values, default "1000"), BENCH_DATABASES (default
# "sqlite postgres"), BENCH_PROFILE (default dist, the shipped build), BENCH_KEEP=1 (keep each run's data
# directory and logs under /tmp, and its database on GANTRY_TEST_POSTGRES_URL),
# GANTRY_TEST_POSTGRES_URL (an existing PostgreSQL), and
# everything control-plane-load reads: BENCH_CLUSTERS (K, default 1: the fleet and the
# models split over K clusters), BENCH_INSTANCES (M, default 10000),
# BENCH_REPLICAS (per model, default 100), BENCH_WINDOW (seconds, default 30),
# BENCH_CYCLES (default 10000), BENCH_CHURN_CONCURRENCY (default 16),
# BENCH_LIST_REQUESTS (default 1000), BENCH_REGISTER_RATE (per second, default 250),
# BENCH_SERVER_LIST (1: also refresh the server list every interval like the real agent,
# the default; 0: heartbeats only), BENCH_PHASE_TIMEOUT (seconds, default 300),
# BENCH_LOG (the tool's log filter, default warn), BENCH_SERVER_LOG (the server's
# log_level, default warn; `warn,gantry_server::controllers=debug` adds a line per control
# and placement pass with where its time went).
set -euo pipefail
# The run's whole output also goes to bench/results/ (scripts/bench-record.sh).
source "$(dirname "$0")/bench-record.sh"
bench_record control-plane "$@"
cd "$(dirname "$0")/.."

WORKERS="${BENCH_WORKERS:-1000}"
DATABASES="${BENCH_DATABASES:-sqlite postgres}"
PROFILE="${BENCH_PROFILE:-dist}"
log() { echo "bench-control-plane: $*" >&2; }
die() { log "error: $*"; exit 1; }

for db in $DATABASES; do
  [[ $db == sqlite || $db == postgres ]] || die "BENCH_DATABASES: unknown database $db (sqlite, postgres)"
done
if [[ " $DATABASES " == *" postgres "* && -z "${GANTRY_TEST_POSTGRES_URL:-}" ]]; then
  exec scripts/with-postgres.sh "$0" "$@"
fi

log "building gantry and control-plane-load (profile $PROFILE)"
# The same packages as the other bench scripts build, so that switching between them
# does not rebuild (and re-link with fat LTO) what another one built.
cargo build -q --profile "$PROFILE" -p gantry -p gantry-bench -p gantry-gguf --bins --example write-tiny-model
target_dir="${CARGO_TARGET_DIR:-target}"
dir=$target_dir/$PROFILE
[[ "$PROFILE" = dev ]] && dir=$target_dir/debug
GANTRY="$dir/gantry"
LOAD="$dir/control-plane-load"
[[ -x "$GANTRY" && -x "$LOAD" ]] || die "binaries not found under $dir"

ulimit -n "$(ulimit -Hn)"
log "open-file limit $(ulimit -n)"

PSQL=$(command -v psql || ls /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -1 || true)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

SERVER_PID=
WORK=
cleanup() {
  if [[ -n "$SERVER_PID" ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=
  fi
  if [[ -n "$WORK" && "${BENCH_KEEP:-0}" != 1 ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

run_one() { # run_one DATABASE WORKERS
  local db=$1 n=$2 port url password=bench-password-1 args=()
  WORK=$(mktemp -d /tmp/gantry-bench-cp.XXXXXX)
  port=$(free_port)
  url="http://127.0.0.1:$port"
  if [[ $db == postgres ]]; then
    [[ -n "$PSQL" ]] || die "psql not found"
    local name="gantry_bench_$(date +%s)_$RANDOM"
    "$PSQL" -q "$GANTRY_TEST_POSTGRES_URL" -c "CREATE DATABASE $name" >/dev/null
    args=(--database-url "${GANTRY_TEST_POSTGRES_URL%/*}/$name"
      --jwt-secret "$(python3 -c 'import secrets; print(secrets.token_hex(32))')")
  fi
  "$GANTRY" server --data-dir "$WORK/data" --host 127.0.0.1 --port "$port" \
    --bootstrap-password "$password" --log-level "${BENCH_SERVER_LOG:-warn}" "${args[@]}" 2>"$WORK/server.log" &
  SERVER_PID=$!
  for _ in $(seq 300); do
    curl -fsS -o /dev/null "$url/readyz" 2>/dev/null && [[ -s "$WORK/data/registration_token" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; die "the server exited"; }
    sleep 0.1
  done
  curl -fsS -o /dev/null "$url/readyz" || die "the server at $url did not become ready"
  log "run: database $db, N=$n workers, server $url (pid $SERVER_PID), data in $WORK"
  local status=0
  BENCH_URL="$url" BENCH_ADMIN_PASSWORD="$password" \
    BENCH_REGISTRATION_TOKEN="$(cat "$WORK/data/registration_token")" \
    BENCH_SERVER_PID="$SERVER_PID" BENCH_DATABASE="$db" BENCH_WORKERS="$n" \
    BENCH_CLK_TCK="$(getconf CLK_TCK)" \
    "$LOAD" 2>"$WORK/load.log" || status=$?
  if ((status != 0)); then
    tail -20 "$WORK/load.log" >&2
    log "control-plane-load failed (exit $status)"
  fi
  echo "--- server log, database $db, N=$n: warnings and errors by message ---"
  python3 - "$WORK/server.log" <<'EOF'
import collections, re, sys
counts = collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"\b(WARN|ERROR)\b\s+(?:\S+:\s+)?(.*)", line)
    if not m:
        continue
    # The message without its key=value fields.
    message = re.split(r"\s\w+=", m.group(2), maxsplit=1)[0].strip()
    counts[(m.group(1), message[:120])] += 1
for (level, message), n in counts.most_common(15):
    print(f"{n:>8}  {level:<5} {message}")
if not counts:
    print("       0  (no warnings or errors)")
EOF
  echo "--- load process: $(grep -c WARN "$WORK/load.log" || true) warnings ---"
  grep -E 'WARN|ERROR' "$WORK/load.log" | sed -E 's/^\S+\s+//' | cut -c1-160 | sort | uniq -c | sort -rn | head -5 || true
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
  if [[ $db == postgres && "${BENCH_KEEP:-0}" != 1 ]]; then
    "$PSQL" -q "$GANTRY_TEST_POSTGRES_URL" -c "DROP DATABASE IF EXISTS ${name} WITH (FORCE)" >/dev/null || true
  fi
  if [[ "${BENCH_KEEP:-0}" != 1 ]]; then rm -rf "$WORK"; fi
  WORK=
  return "$status"
}

failed=0
for db in $DATABASES; do
  for n in $WORKERS; do
    run_one "$db" "$n" || failed=1
  done
done
exit "$failed"
