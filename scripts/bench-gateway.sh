#!/usr/bin/env bash
# Load benchmark of the gateway, run by hand (never by the tests): how many requests a
# second it passes and what latency it adds, next to nginx doing the same job, as two
# load generators see it.
#
#   scripts/bench-gateway.sh                  # 10 s per measurement, wrk and oha
#   BENCH_CLIENT=oha BENCH_DURATION=30 scripts/bench-gateway.sh
#
# What it does:
#   1. builds gantry and the benchmark responder with the shipped profile (dist);
#   2. installs nginx-light, wrk and GNU time from Debian when they are missing (needs
#      root), and oha 1.16 with `cargo install` into ~/.cache/gantry/oha (once; skipped
#      when that version is there);
#   3. starts `openai-responder` (crates/gantry-bench): a TEST DOUBLE that answers every
#      chat completion at once with a fixed small JSON (with usage), or a few SSE chunks
#      for "stream": true — no model, so the proxies are what is measured;
#   4. starts nginx as a reverse proxy to it (upstream keepalive, proxy_buffering off);
#   5. starts `gantry server` on a fresh data directory, registers a fake worker through
#      the API, creates a model and reports its one instance running at the responder's
#      address, so the gateway routes to it;
#   6. for each load generator (wrk, oha), at concurrency 64 and 8, non-streaming and
#      streaming, loads the responder directly, through nginx and through the gateway
#      (taking turns in an order that turns by one each time, 3 times each), and prints
#      the medians of requests/s, the ratio to direct, the p50/p99 latency each proxy
#      adds, the CPU time each target spends per request, the responder's behind it,
#      the load generator's own, the whole machine's (the kernel included: what the
#      throughput of a machine this busy comes down to), how busy the machine's CPUs
#      were (below 100 %, every process waited at times), and the TCP segments the
#      machine sent per request; at the end, gateway/nginx for every mode and client
#      against the target (at least 1).
#
# Both load generators count a response when its last byte is in (wrk at the end of the
# message its parser reads, oha when the body's last frame is read), and neither counts
# a failed one as a success here: a run with errors is marked. What they do differ in is
# what a response costs them to read: wrk reads whatever a wake-up brings, so it pays per
# TCP segment; oha (hyper) hands each HTTP chunk from the connection's task to the
# request's, so it pays per chunk. Everything runs on this machine, so that cost comes
# out of the proxies' share of the CPUs: a proxy that sends a stream in more segments
# (nginx: head and body, then the last chunk) looks slower to wrk, one that sends it in
# more chunks looks slower to oha. The "client us/req" column shows it; compare the proxies with
# each other, under both clients, and not with other machines.
#
# Environment: BENCH_CLIENT (the load generators: "wrk oha", the default, or one of
# them), BENCH_DURATION (seconds per run, default 10), BENCH_CONCURRENCY (default
# "64 8"), BENCH_THREADS (wrk threads and oha worker threads, default 2), BENCH_REPEAT
# (runs per target, taking turns; the medians are printed; default 3), CARGO_TARGET_DIR
# (as for cargo),
# BENCH_PERF (a directory: instead of the comparison, profile the gateway and nginx with
# `perf record -g` under each load of the first BENCH_CLIENT and write each profile and
# its top symbols there, with the context switches, CPU migrations and system calls per
# request of the proxy and of the responder behind it),
# BENCH_BARE (1: also measure `proxy-shape`, an EXPERIMENT in crates/gantry-bench/examples:
# a bare proxy of these requests with nothing else, on one multi-thread runtime
# (`bare-mt`) and on one current-thread runtime per thread (`bare-pc`)),
# BENCH_ROUTES (1: also define a model route `bench-route` whose one target is the bench
# model, so the gateway's route table is not empty), BENCH_MODEL (the `model` the load
# sends: `bench`, the default, or `bench-route` with BENCH_ROUTES=1 to measure requests
# through a route), BENCH_STREAMS (a number N: instead of the comparison, open N streaming requests through
# the gateway at once — the responder pausing BENCH_CHUNK_MS, default 200, before each
# event — with `stream-load`, which prints failed streams and the server's RSS before,
# at its peak and BENCH_SETTLE seconds, default 10, after, for BENCH_ROUNDS rounds,
# default 3), BENCH_PROFILE (the cargo profile to build and run, default dist, the shipped build;
# `dist-debug` keeps line tables for perf's reports), BENCH_GANTRY_PROFILE (gantry's own
# profile when it differs, the load's tools staying on BENCH_PROFILE: `dev` measures what
# the README's `cargo run` builds), BENCH_GANTRY_BIN (a gantry binary built elsewhere,
# another commit's say, instead of building one), BENCH_ALLOCS (1: instead of the
# comparison, count the gateway's calls into the allocator per request under each load,
# with uprobes on mimalloc's entry points; needs perf and root).
set -euo pipefail
# The run's whole output also goes to bench/results/ (scripts/bench-record.sh).
source "$(dirname "$0")/bench-record.sh"
bench_record gateway "$@"
cd "$(dirname "$0")/.."

DURATION="${BENCH_DURATION:-10}"
CONCURRENCY="${BENCH_CONCURRENCY:-64 8}"
CLIENTS="${BENCH_CLIENT:-wrk oha}"
CLIENT_THREADS="${BENCH_THREADS:-2}"
REPEAT="${BENCH_REPEAT:-3}"
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
PROFILE="${BENCH_PROFILE:-dist}"

log() { echo "bench-gateway: $*" >&2; }
die() { log "error: $*"; exit 1; }

# --- tools -----------------------------------------------------------------------------
for client in $CLIENTS; do
  [[ $client == wrk || $client == oha ]] || die "BENCH_CLIENT: unknown load generator $client (wrk, oha)"
done
need=()
command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || need+=(nginx-light)
[[ " $CLIENTS " == *" wrk "* ]] && { command -v wrk >/dev/null 2>&1 || need+=(wrk); }
[[ -x /usr/bin/time ]] || need+=(time)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if ((${#need[@]})); then
  [[ $(id -u) -eq 0 ]] || die "missing ${need[*]}; install them (apt-get install ${need[*]}) or run as root"
  log "installing ${need[*]} from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -qq --no-install-recommends "${need[@]}" >&2
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
# oha is not in Debian's stable release: one version, built once from crates.io into a
# cache outside the repository (its build, in a temporary directory, takes minutes).
OHA_ROOT="${GANTRY_CACHE_DIR:-$HOME/.cache/gantry}/oha"
OHA="$OHA_ROOT/bin/oha"
if [[ " $CLIENTS " == *" oha "* ]] && ! "$OHA" --version 2>/dev/null | grep -q '^oha 1\.16\.'; then
  log "installing oha 1.16 into $OHA_ROOT (cargo install, once)"
  env -u CARGO_TARGET_DIR cargo install oha --version '~1.16' --locked --root "$OHA_ROOT" >&2
fi

GANTRY_PROFILE="${BENCH_GANTRY_PROFILE:-$PROFILE}"
# Cargo puts the dev profile's build in target/debug.
profile_dir() { if [[ $1 == dev ]]; then echo debug; else echo "$1"; fi; }
log "building gantry ($GANTRY_PROFILE) and openai-responder ($PROFILE)"
examples=(--example write-tiny-model)
[[ -n "${BENCH_BARE:-}" ]] && examples+=(--example proxy-shape)
cargo build --profile "$PROFILE" -p gantry -p gantry-bench -p gantry-gguf --bins "${examples[@]}" >&2
[[ $GANTRY_PROFILE == "$PROFILE" ]] || cargo build --profile "$GANTRY_PROFILE" -p gantry --bin gantry >&2
GANTRY="${BENCH_GANTRY_BIN:-$TARGET_DIR/$(profile_dir "$GANTRY_PROFILE")/gantry}"
RESPONDER="$TARGET_DIR/$PROFILE/openai-responder"
WRITE_MODEL="$TARGET_DIR/$PROFILE/examples/write-tiny-model"
[[ -x "$GANTRY" && -x "$RESPONDER" && -x "$WRITE_MODEL" ]] || die "$PROFILE binaries not found under $TARGET_DIR/$PROFILE"

# --- processes -------------------------------------------------------------------------
WORK=$(mktemp -d /tmp/gantry-bench.XXXXXX)
PIDS=()
BARE=() # mode:port:pid of each proxy-shape (BENCH_BARE)
cleanup() {
  for bare in "${BARE[@]}"; do kill "${bare##*:}" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # wait_http URL
  for _ in $(seq 1 200); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  die "$1 did not answer"
}

CHUNK_MS=0
if [[ -n "${BENCH_STREAMS:-}" ]]; then
  CHUNK_MS="${BENCH_CHUNK_MS:-200}"
  # A descriptor per client connection and per upstream connection, in every process.
  ulimit -n "$(ulimit -Hn)"
fi
RESPONDER_PORT=$(free_port)
"$RESPONDER" --port "$RESPONDER_PORT" --threads 2 --chunk-interval-ms "$CHUNK_MS" 2>"$WORK/responder.log" &
PIDS+=($!)
wait_http "http://127.0.0.1:$RESPONDER_PORT/health"

NGINX_PORT=$(free_port)
mkdir -p "$WORK/nginx"
cat >"$WORK/nginx/nginx.conf" <<EOF
daemon off;
worker_processes auto;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/client_body;
  proxy_temp_path $WORK/nginx/proxy;
  client_max_body_size 32m;
  upstream responder {
    server 127.0.0.1:$RESPONDER_PORT;
    keepalive 256;
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://responder;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" &
PIDS+=($!)
wait_http "http://127.0.0.1:$NGINX_PORT/health"

if [[ -n "${BENCH_BARE:-}" ]]; then
  for mode in multi percore; do
    port=$(free_port)
    "$TARGET_DIR/$PROFILE/examples/proxy-shape" --port "$port" --upstream "127.0.0.1:$RESPONDER_PORT" --mode "$mode" &
    BARE+=("$mode:$port:$!")
    wait_http "http://127.0.0.1:$port/health"
  done
fi

GANTRY_PORT=$(free_port)
ADMIN_PASSWORD="bench-password-1"
"$GANTRY" server --data-dir "$WORK/gantry" --host 127.0.0.1 --port "$GANTRY_PORT" \
  --bootstrap-password "$ADMIN_PASSWORD" --log-level warn 2>"$WORK/gantry.log" &
PIDS+=($!)
BASE="http://127.0.0.1:$GANTRY_PORT"
wait_http "$BASE/healthz"

# --- a fake worker and one running instance at the responder ---------------------------
api() { # api METHOD PATH TOKEN [JSON]
  local args=(-fsS -X "$1" "$BASE$2" -H "Authorization: Bearer $3")
  [[ $# -ge 4 ]] && args+=(-H "Content-Type: application/json" -d "$4")
  curl "${args[@]}" || die "$1 $2 failed"
}
field() { python3 -c "import json,sys; v=json.load(sys.stdin)$1; print(v)"; }

ADMIN=$(curl -fsS "$BASE/auth/login" -H 'Content-Type: application/json' \
  -d "{\"username\":\"admin\",\"password\":\"$ADMIN_PASSWORD\"}" | field "['token']")
KEY=$(api POST /api/v1/api-keys "$ADMIN" '{"name":"bench"}' | field "['key']")
REGISTRATION=$(cat "$WORK/gantry/registration_token")
WORKER=$(api POST /api/v1/workers/register "$REGISTRATION" '{"name":"bench-worker","labels":{},"address":"127.0.0.1:1",
  "status":{"gpus":[{"index":0,"name":"Simulated GPU","uuid":"SIM-0","memory_total":85899345920,"memory_used":0,
  "utilization":null,"temperature":null,"simulated":true}],"system":{"cpu_count":2,"load_average":0,"memory_total":1,
  "memory_available":1,"disk_free":1,"os":"linux","hostname":"bench"},"backends":["llama.cpp"]}}')
WORKER_ID=$(echo "$WORKER" | field "['worker']['id']")
CREDENTIAL=$(echo "$WORKER" | field "['credential']")
# A real (tiny) GGUF file as the model's source, so that the scheduler's analysis of it
# succeeds and the scheduler leaves the model alone during the run.
"$WRITE_MODEL" "$WORK/tiny.gguf" >&2
MODEL_ID=$(api POST /api/v1/models "$ADMIN" \
  "{\"name\":\"bench\",\"source\":{\"type\":\"local_path\",\"path\":\"$WORK/tiny.gguf\"},\"backend\":\"llama.cpp\",\"replicas\":1}" | field "['id']")
INSTANCE_ID=$(api GET "/api/v1/model-instances?model_id=$MODEL_ID" "$ADMIN" | field "['items'][0]['id']")
api PATCH "/api/v1/model-instances/$INSTANCE_ID" "$ADMIN" "{\"worker_id\":$WORKER_ID,\"gpu_indexes\":[0]}" >/dev/null
api POST "/api/v1/worker/instances/$INSTANCE_ID/state" "$CREDENTIAL" \
  "{\"state\":\"running\",\"port\":$RESPONDER_PORT,\"address\":\"127.0.0.1:$RESPONDER_PORT\"}" >/dev/null
for _ in $(seq 1 100); do
  api GET /v1/models "$KEY" | grep -q '"bench"' && break
  sleep 0.05
done
api GET /v1/models "$KEY" | grep -q '"bench"' || die "the gateway does not route to the bench model"
MODEL_NAME="${BENCH_MODEL:-bench}"
if [[ -n "${BENCH_ROUTES:-}" ]]; then
  api POST /api/v1/model-routes "$ADMIN" '{"name":"bench-route","targets":[{"model":"bench"}]}' >/dev/null
  for _ in $(seq 1 100); do
    api GET /v1/models "$KEY" | grep -q '"bench-route"' && break
    sleep 0.05
  done
fi
# The heartbeat that keeps the fake worker ready for the whole run.
( while sleep 5; do curl -fsS -o /dev/null -X POST "$BASE/api/v1/worker/heartbeat" -H "Authorization: Bearer $CREDENTIAL" || true; done ) &
PIDS+=($!)

# --- measurements ----------------------------------------------------------------------
for mode in plain stream; do
  stream=false
  [[ $mode == stream ]] && stream=true
  # One request for both load generators: the same method, headers and body.
  body="{\"model\":\"$MODEL_NAME\",\"messages\":[{\"role\":\"user\",\"content\":\"Say something short.\"}],\"max_tokens\":16,\"stream\":$stream}"
  printf '%s' "$body" >"$WORK/$mode.json"
  cat >"$WORK/$mode.lua" <<EOF
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $KEY"
EOF
done

load() { # load CLIENT MODE CONCURRENCY SECONDS URL [THREADS] -> the client's report; its CPU time (user system, s) in $WORK/load.time
  local client=$1 mode=$2 conc=$3 seconds=$4 url="$5/v1/chat/completions" threads=${6:-$CLIENT_THREADS}
  case $client in
    wrk)
      /usr/bin/time -o "$WORK/load.time" -f '%U %S' \
        wrk -t"$threads" -c"$conc" -d"${seconds}s" --latency -s "$WORK/$mode.lua" "$url"
      ;;
    oha)
      /usr/bin/time -o "$WORK/load.time" -f '%U %S' \
        "$OHA" --no-tui --output-format json -z "${seconds}s" -c "$conc" --worker-threads "$threads" \
        -m POST -T application/json -H "Authorization: Bearer $KEY" -D "$WORK/$mode.json" "$url"
      ;;
  esac
}

# The load generator's report as "requests/s p50-ms p99-ms requests errors": requests
# are the successful (2xx) ones, and only they make the requests/s; errors names what
# else happened (0: nothing).
summarize() { # summarize CLIENT < report
  python3 "$WORK/summarize.py" "$1"
}
cat >"$WORK/summarize.py" <<'EOF'
import json, re, sys

client, out = sys.argv[1], sys.stdin.read()
if client == "wrk":
    def ms(v):  # wrk prints 812.00us, 1.23ms, 1.05s
        n, u = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", v).groups()
        return float(n) * {"us": 0.001, "ms": 1, "s": 1000, "m": 60000}[u]
    requests = int(re.search(r"^\s*(\d+) requests in", out, re.M).group(1))
    seconds = float(re.search(r"requests in ([0-9.]+)s", out).group(1))
    # wrk counts a status of 400 or more here, and still in its requests/s.
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket = re.search(r"Socket errors: (.*)", out)
    errors = [f"status>399:{bad.group(1)}"] if bad else []
    errors += ["socket:" + socket.group(1).replace(" ", "")] if socket else []
    good = requests - (int(bad.group(1)) if bad else 0)
    p50 = ms(re.search(r"^\s*50%\s+(\S+)", out, re.M).group(1))
    p99 = ms(re.search(r"^\s*99%\s+(\S+)", out, re.M).group(1))
else:
    report = json.loads(out)
    codes = report["statusCodeDistribution"]
    good = sum(n for code, n in codes.items() if code.startswith("2"))
    seconds = report["summary"]["total"]
    errors = [f"status-{code}:{n}" for code, n in codes.items() if not code.startswith("2")]
    # A request still in flight when the time is up is aborted: the clock's doing.
    errors += [f"{e.replace(' ', '-')}:{n}" for e, n in report["errorDistribution"].items()
               if e != "aborted due to deadline"]
    p50 = report["latencyPercentiles"]["p50"] * 1000
    p99 = report["latencyPercentiles"]["p99"] * 1000
print(f"{good / seconds:.2f} {p50:.3f} {p99:.3f} {good} {','.join(errors) or 0}")
EOF

# A request through each target must succeed before anything is measured.
for url in "http://127.0.0.1:$RESPONDER_PORT" "http://127.0.0.1:$NGINX_PORT" "$BASE"; do
  curl -fsS -o /dev/null "$url/v1/chat/completions" -H "Authorization: Bearer $KEY" \
    -H 'Content-Type: application/json' -d '{"model":"bench","messages":[]}' || die "a test request to $url failed"
done

CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { # cpu_ticks PID... -> user+system clock ticks of every thread of the processes
  local total=0 task fields
  for pid in "$@"; do
    for task in /proc/"$pid"/task/*; do
      fields=($(sed 's/.*) //' "$task/stat" 2>/dev/null)) || continue
      ((${#fields[@]} > 12)) && total=$((total + fields[11] + fields[12]))
    done
  done
  echo "$total"
}

machine_ticks() { # busy clock ticks of the whole machine (every CPU, every process, interrupts)
  awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat
}
tcp_segments() { # TCP segments the machine has sent
  awk '$1 == "Tcp:" && $2 ~ /^[0-9]/ {print $12; exit}' /proc/net/snmp
}

run() { # run CLIENT MODE CONCURRENCY URL PID... -> "rps p50 p99 cpu-us-per-request backend-cpu-us-per-request client-cpu-us-per-request machine-cpu-us-per-request segments-per-request errors"
  local client=$1 mode=$2 conc=$3 url=$4 report before after backend_before backend_after machine_before machine_after segments_before segments_after
  shift 4
  before=$(cpu_ticks "$@")
  backend_before=$(cpu_ticks "${PIDS[0]}")
  machine_before=$(machine_ticks)
  segments_before=$(tcp_segments)
  report=$(load "$client" "$mode" "$conc" "$DURATION" "$url")
  segments_after=$(tcp_segments)
  machine_after=$(machine_ticks)
  after=$(cpu_ticks "$@")
  backend_after=$(cpu_ticks "${PIDS[0]}")
  local rps p50 p99 requests errors client_cpu
  read -r rps p50 p99 requests errors <<<"$(summarize "$client" <<<"$report")"
  client_cpu=$(awk 'END {print $1 + $2}' "$WORK/load.time")
  python3 -c "
n = max($requests, 1)
per = lambda ticks: ticks / $CLK_TCK * 1e6 / n
print(f'$rps $p50 $p99 {per($after - $before):.1f} {per($backend_after - $backend_before):.1f} {$client_cpu * 1e6 / n:.1f} {per($machine_after - $machine_before):.1f} {($segments_after - $segments_before) / n:.2f} $errors')
"
}

NGINX_WORKERS=($(pgrep -P "${PIDS[1]}")) || die "no nginx worker processes"
GANTRY_PID="${PIDS[2]}"
if [[ -n "${BENCH_STREAMS:-}" ]]; then
  log "opening $BENCH_STREAMS streams at once through the gateway (responder pauses ${CHUNK_MS} ms before each event)"
  "$TARGET_DIR/$PROFILE/stream-load" --url "$BASE" --key "$KEY" --model bench \
    --streams "$BENCH_STREAMS" --server-pid "$GANTRY_PID" --settle-s "${BENCH_SETTLE:-10}" \
    --rounds "${BENCH_ROUNDS:-3}"
  exit $?
fi
if [[ -n "${BENCH_ALLOCS:-}" ]]; then
  command -v perf >/dev/null 2>&1 || die "BENCH_ALLOCS needs perf (apt-get install linux-perf)"
  # Rust's allocations reach mimalloc through these (gantry's global allocator); C code
  # is not inlined into Rust, so every call is seen.
  alloc_symbols=(mi_malloc_aligned mi_zalloc_aligned mi_realloc_aligned mi_free)
  perf probe -q -d 'probe_gantry:*' 2>/dev/null || true
  for symbol in "${alloc_symbols[@]}"; do
    perf probe -q -x "$GANTRY" --add "$symbol" >&2 || die "cannot place a uprobe on $symbol in $GANTRY"
  done
  trap 'perf probe -q -d "probe_gantry:*" 2>/dev/null || true; cleanup' EXIT
  events=$(printf 'probe_gantry:%s,' "${alloc_symbols[@]}")
  alloc_client=${CLIENTS%% *}
  log "allocator calls per request through the gateway ($alloc_client, ${DURATION}s per mode; $GANTRY)"
  for conc in $CONCURRENCY; do
    for mode in plain stream; do
      load "$alloc_client" "$mode" "$conc" 1 "$BASE" 1 >/dev/null
      perf stat -x, -e "${events%,}" -p "$GANTRY_PID" -o "$WORK/allocs.csv" -- sleep "$DURATION" 2>/dev/null &
      stat_pid=$!
      read -r rps _ _ requests _ <<<"$(load "$alloc_client" "$mode" "$conc" "$DURATION" "$BASE" | summarize "$alloc_client")"
      wait "$stat_pid" || true
      per_request=$(awk -F, -v n="${requests:-0}" 'n > 0 && $1 ~ /^[0-9]+$/ {sub("probe_gantry:", "", $3); printf "%s%s %.2f", sep, $3, $1 / n; sep=", "}' "$WORK/allocs.csv")
      log "$mode c$conc: $rps req/s; per request: ${per_request:-no counts}"
    done
  done
  exit 0
fi
if [[ -n "${BENCH_PERF:-}" ]]; then
  command -v perf >/dev/null 2>&1 || die "BENCH_PERF needs perf (apt-get install linux-perf)"
  mkdir -p "$BENCH_PERF"
  perf_client=${CLIENTS%% *}
  for conc in $CONCURRENCY; do
    for mode in plain stream; do
      for target in gateway nginx; do
        if [[ $target == gateway ]]; then url=$BASE; pids=$GANTRY_PID; else url="http://127.0.0.1:$NGINX_PORT"; pids=$(IFS=,; echo "${NGINX_WORKERS[*]}"); fi
        load "$perf_client" "$mode" "$conc" 1 "$url" 1 >/dev/null
        data="$BENCH_PERF/$target-$mode-$conc.data"
        perf record -q -F 1999 -g -p "$pids" -o "$data" -- sleep "$DURATION" 2>/dev/null &
        perf_pid=$!
        # Beside the profile, the counts of what costs a process its CPU besides its own
        # code: context switches, moves between CPUs, system calls.
        perf stat -x, -e context-switches,cpu-migrations,raw_syscalls:sys_enter -p "$pids" \
          -o "${data%.data}.stat.csv" -- sleep "$DURATION" 2>/dev/null &
        stat_pid=$!
        # The same counts for the responder behind the proxy.
        perf stat -x, -e context-switches,cpu-migrations,raw_syscalls:sys_enter -p "${PIDS[0]}" \
          -o "${data%.data}.backend.stat.csv" -- sleep "$DURATION" 2>/dev/null &
        backend_stat_pid=$!
        read -r rps _ _ requests _ <<<"$(load "$perf_client" "$mode" "$conc" "$DURATION" "$url" | summarize "$perf_client")"
        wait "$perf_pid" || true
        wait "$stat_pid" || true
        wait "$backend_stat_pid" || true
        perf report -i "$data" --no-children --sort dso,symbol --stdio 2>/dev/null | grep -v '^#' | grep -E '^ +[0-9]' | head -60 >"${data%.data}.top.txt" || true
        per_request=$(awk -F, -v n="${requests:-0}" 'n > 0 && $1 ~ /^[0-9.]+$/ {printf "%s%.2f %s", sep, $1 / n, $3; sep=", "}' "${data%.data}.stat.csv" 2>/dev/null)
        backend_per_request=$(awk -F, -v n="${requests:-0}" 'n > 0 && $1 ~ /^[0-9.]+$/ {printf "%s%.2f %s", sep, $1 / n, $3; sep=", "}' "${data%.data}.backend.stat.csv" 2>/dev/null)
        log "$target $mode c$conc ($perf_client): $rps req/s; per request: ${per_request:-no perf stat}; responder behind it: ${backend_per_request:-no perf stat}; profile $data, top symbols ${data%.data}.top.txt"
      done
    done
  done
  exit 0
fi
log "measuring: ${DURATION}s per run, $REPEAT repetitions (medians shown), load generators: $CLIENTS ($CLIENT_THREADS threads each), $(nproc) CPUs"
log "cpu us/req: user+system CPU time of the target (responder, nginx workers, gantry) per request; backend us/req: the responder's, behind it;"
log "client us/req: the load generator's; machine us/req: busy CPU time of the whole machine (the kernel included); busy %: of all its CPUs' time;"
log "segs/req: TCP segments sent on the machine"
printf '%-6s %-7s %5s %-8s %11s %7s %9s %9s %9s %9s %11s %14s %14s %14s %6s %8s %s\n' client mode conc target 'req/s' ratio 'p50 ms' 'p99 ms' '+p50 ms' '+p99 ms' 'cpu us/req' 'backend us/req' 'client us/req' 'machine us/req' 'busy %' 'segs/req' errors
: >"$WORK/ratios"
for client in $CLIENTS; do
  for conc in $CONCURRENCY; do
    for mode in plain stream; do
      # Warm every path (connection pools, caches) before timing it.
      for url in "http://127.0.0.1:$RESPONDER_PORT" "http://127.0.0.1:$NGINX_PORT" "$BASE"; do
        load "$client" "$mode" "$conc" 1 "$url" 1 >/dev/null
      done
      # The targets take turns, REPEAT times, so a slow spell of the machine hits them
      # alike, and the order turns by one each time, so no target always runs in the same
      # place (right after the direct run, say); each line below is the median of its
      # target's runs.
      targets=(direct nginx gateway)
      for bare in "${BARE[@]}"; do
        [[ $mode == plain ]] && targets+=("$bare") # it forwards content-length answers only
      done
      : >"$WORK/runs"
      for ((rep = 0; rep < REPEAT; rep++)); do
        for ((i = 0; i < ${#targets[@]}; i++)); do
          target=${targets[(i + rep) % ${#targets[@]}]}
          case $target in
            direct) echo "direct $(run "$client" "$mode" "$conc" "http://127.0.0.1:$RESPONDER_PORT" "${PIDS[0]}")" ;;
            nginx) echo "nginx $(run "$client" "$mode" "$conc" "http://127.0.0.1:$NGINX_PORT" "${NGINX_WORKERS[@]}")" ;;
            gateway) echo "gateway $(run "$client" "$mode" "$conc" "$BASE" "$GANTRY_PID")" ;;
            *)
              IFS=: read -r shape port pid <<<"$target"
              name=bare-mt
              [[ $shape == percore ]] && name=bare-pc
              echo "$name $(run "$client" "$mode" "$conc" "http://127.0.0.1:$port" "$pid")"
              ;;
          esac
        done >>"$WORK/runs"
      done
      python3 - "$client" "$mode" "$conc" "$WORK/runs" "$WORK/ratios" <<'EOF'
import os, statistics, sys
client, mode, conc, path, ratios = sys.argv[1:]
runs = {}
for line in open(path):
    target, *values, err = line.split()
    runs.setdefault(target, []).append(([float(v) for v in values], err))
med = {t: [statistics.median(r[0][i] for r in rs) for i in range(8)] + [",".join(sorted({r[1] for r in rs}))]
       for t, rs in runs.items()}
d_rps, d_p50, d_p99 = med["direct"][:3]
# How busy the machine's CPUs were, from the medians: below 100 % the load was not
# limited by CPU alone (every process waited at times).
cpus = os.cpu_count() or 1
busy = lambda rps, machine: rps * machine / (cpus * 1e6) * 100
for target, (rps, p50, p99, cpu, backend, load, machine, segments, err) in med.items():
    added = (f"{'-':>9} {'-':>9}" if target == "direct" else f"{p50 - d_p50:>+9.3f} {p99 - d_p99:>+9.3f}")
    print(f"{client:<6} {mode:<7} {conc:>5} {target:<8} {rps:>11.0f} {rps / d_rps:>7.2f} {p50:>9.3f} {p99:>9.3f} {added} {cpu:>11.1f} {backend:>14.1f} {load:>14.1f} {machine:>14.1f} {busy(rps, machine):>6.0f} {segments:>8.2f} {err}")
ratio = med["gateway"][0] / med["nginx"][0]
cpu_ratio = med["gateway"][3] / max(med["nginx"][3], 0.1)
print(f"{client:<6} {mode:<7} {conc:>5} gateway/nginx: throughput {ratio:.2f}, cpu per request {cpu_ratio:.2f}")
clean = med["gateway"][8] == "0" and med["nginx"][8] == "0"
with open(ratios, "a") as f:
    f.write(f"{mode} {conc} {client} {ratio:.2f} {'ok' if clean else 'errors'}\n")
EOF
    done
  done
done
# Every mode under every load generator against the target: at least nginx's requests/s.
python3 - "$WORK/ratios" <<'EOF'
import sys
print("\ngateway/nginx requests/s (target: at least 1.00)")
for line in open(sys.argv[1]):
    mode, conc, client, ratio, clean = line.split()
    verdict = "met" if float(ratio) >= 1 else "missed"
    if clean != "ok":
        verdict = "not valid: a run had errors"
    print(f"{mode:<7} {conc:>5} {client:<4} {ratio:>5}  {verdict}")
EOF
log "gateway counters after the run:"
curl -fsS "$BASE/metrics" | grep -E '^gantry_gateway_(requests_total|errors_total)' >&2 || true
