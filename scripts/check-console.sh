#!/usr/bin/env bash
# Type-checks the web console: its ES modules carry JSDoc types and `// @ts-check`, and
# TypeScript's compiler checks them without emitting anything (the server serves the files
# as they are; there is no build step):
#
#   scripts/check-console.sh
#
# TypeScript comes from the npm registry, pinned below, installed once into a cache
# outside the repository:
#   ${GANTRY_CACHE_DIR:-$HOME/.cache/gantry}/npm/typescript-<version>
# so a second run costs only the check (a few seconds). Needs node and npm; as root on
# Debian it installs the packages nodejs and npm when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# The compiler that checks the console. Changing it makes a new cache directory.
readonly TYPESCRIPT_VERSION="5.9.3"
readonly TSCONFIG="crates/gantry-server/src/ui/tsconfig.json"

log() { echo "check-console: $*" >&2; }
die() { log "error: $*"; exit 1; }

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "node or npm missing; installing Debian's nodejs and npm"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -qq nodejs npm >&2
  else
    die "node and npm are needed to type-check the console (Debian: apt-get install nodejs npm)"
  fi
fi

CACHE_ROOT="${GANTRY_CACHE_DIR:-$HOME/.cache/gantry}"
PREFIX="$CACHE_ROOT/npm/typescript-$TYPESCRIPT_VERSION"
TSC="$PREFIX/node_modules/typescript/bin/tsc"

ready() {
  [[ -f "$PREFIX/.complete" && -f "$TSC" ]]
}

if ! ready; then
  mkdir -p "$CACHE_ROOT/npm" || die "cannot create $CACHE_ROOT/npm"
  # Two runs starting together must not install into the same directory.
  exec 9>"$PREFIX.lock"
  flock 9 || die "cannot lock $PREFIX.lock"
  if ! ready; then
    # Installed next to the final place and moved in only when complete, so an interrupted
    # run never leaves a half-made install that looks ready.
    rm -rf "$PREFIX" "$PREFIX.tmp"
    mkdir -p "$PREFIX.tmp"
    log "installing typescript@$TYPESCRIPT_VERSION into $PREFIX"
    npm install --prefix "$PREFIX.tmp" --no-save --no-audit --no-fund --loglevel=error \
      "typescript@$TYPESCRIPT_VERSION" >&2 || die "npm install typescript@$TYPESCRIPT_VERSION failed"
    mv "$PREFIX.tmp" "$PREFIX"
    touch "$PREFIX/.complete"
  fi
fi

log "tsc $(node "$TSC" --version | sed 's/^Version //') --noEmit -p $TSCONFIG"
node "$TSC" --noEmit -p "$TSCONFIG"
log "the console's modules type-check"
