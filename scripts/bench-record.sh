# Sourced by the scripts/bench-*.sh, never run on its own: each benchmark run also writes
# everything it prints (stdout and stderr, as they appear on the terminal) to a file of
# its own under bench/results/, named by the UTC date and time, headed by the commit it
# ran on, the settings it was given and the machine. A figure quoted in the docs can then
# name the run it came from, and the run's whole output stays with the repository.
#
#   source "$(dirname "$0")/bench-record.sh"
#   bench_record NAME "$@"      # first thing in the script, before it changes directory
#
# bench_record runs the script again with its output going through `tee` and exits with
# the script's status; in that run (and in any run it starts, such as the re-run under
# scripts/with-postgres.sh) BENCH_RESULTS_FILE is set, and bench_record returns at once.

# Benchmark builds (the dist profile: fat LTO, one codegen unit) go to a target directory
# outside the repository unless CARGO_TARGET_DIR says otherwise, so they neither fill the
# checkout's disk nor churn the debug build's artefacts.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${GANTRY_CACHE_DIR:-$HOME/.cache/gantry}/bench-target}"

# Prints `NAME=value` for each setting a benchmark reads from the environment.
bench_record_settings() {
  local name
  for name in $(compgen -e | sort); do
    case $name in
      BENCH_RESULTS_FILE) ;;
      BENCH_* | CARGO_TARGET_DIR | TOKIO_WORKER_THREADS | RUST_LOG) printf '%s=%q ' "$name" "${!name}" ;;
      # A database URL may carry a password: say only that one was given.
      GANTRY_TEST_POSTGRES_URL) printf '%s=(set) ' "$name" ;;
    esac
  done
}

bench_record() { # bench_record NAME [the script's arguments…]
  local name=$1
  shift
  [[ -z "${BENCH_RESULTS_FILE:-}" ]] || return 0
  local script root now commit file status
  script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
  root="$(cd "$(dirname "$script")/.." && pwd)"
  now=$(date -u +%s)
  file="$root/bench/results/$(date -u -d "@$now" +%F)-$name-$(date -u -d "@$now" +%H%M%S).txt"
  mkdir -p "$root/bench/results"
  commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
  # Uncommitted changes to tracked files make the build something no commit names.
  if [[ $commit != unknown ]] && ! git -C "$root" diff --quiet HEAD -- 2>/dev/null; then
    commit="$commit-dirty"
  fi
  {
    echo "# $name benchmark, $(date -u -d "@$now" '+%F %T') UTC, commit $commit"
    echo "# command: $(bench_record_settings)scripts/$(basename "$script")$(printf ' %q' "$@")"
    echo "# machine: $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -n 1))," \
      "$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo) memory," \
      "$(uname -sr), host $(hostname)"
  } >"$file"
  echo "bench: this run's output also goes to ${file#"$root"/}" >&2
  export BENCH_RESULTS_FILE="$file"
  # `tee -i`: an interrupt stops the benchmark, whose clean-up still prints, not the copy.
  local stderr_copy
  exec {stderr_copy}> >(tee -ai "$file" >&2)
  local stderr_copy_pid=$!
  set +e
  "$script" "$@" 2>&"$stderr_copy" | tee -ai "$file"
  status=${PIPESTATUS[0]}
  # The copy of stderr ends when its last writer closes it: wait until it has written all.
  exec {stderr_copy}>&-
  wait "$stderr_copy_pid" 2>/dev/null
  exit "$status"
}
