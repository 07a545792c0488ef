#!/usr/bin/env bash
# Creates (once) a Python virtual environment with the official `openai` client,
# Playwright (driving Debian's chromium for the console's browser test), the official
# `huggingface_hub` and `modelscope` clients, moto's S3-compatible server (`moto_server`,
# for the `s3` model source) and Schemathesis (`st`, the API fuzz test), pinned below,
# and prints the path of its python as the last line of stdout. Progress goes to stderr. The gateway tests run OpenAI's own client
# against the gateway with it, and gantry-testkit's hub double is checked by running
# `huggingface_hub`'s downloads against it:
#
#   GANTRY_PYTHON=$(scripts/python-env.sh | tail -1) cargo nextest run -p gantry-server
#   GANTRY_PYTHON=$(scripts/python-env.sh | tail -1) cargo nextest run -p gantry-testkit
#
# The environment is cached outside the repository at
#   ${GANTRY_CACHE_DIR:-$HOME/.cache/gantry}/venv-<hash of the requirements below>
# so a second run costs nothing, and changing a pin makes a new one. Needs python3 with the
# venv module (Debian: python3-venv, installed here when run as root and it is missing).
set -euo pipefail

# What the environment holds. Changing this text changes the cache key.
readonly REQUIREMENTS="openai==3.54.0 playwright==1.65.2 huggingface_hub==2.4.0 modelscope==1.40.2 moto[s3,server]==5.2.5 schemathesis==4.32.5"

log() { echo "python-env: $*" >&2; }
die() { log "error: $*"; exit 1; }

CACHE_ROOT="${GANTRY_CACHE_DIR:-$HOME/.cache/gantry}"
HASH=$(printf '%s\n' "$REQUIREMENTS" | sha256sum | cut -c1-16)
VENV="$CACHE_ROOT/venv-$HASH"
PYTHON="$VENV/bin/python"

ready() {
  [[ -x "$PYTHON" && -f "$VENV/.complete" ]] && "$PYTHON" -c 'import openai, playwright.sync_api, huggingface_hub, modelscope, moto.server, schemathesis' >/dev/null 2>&1
}

if ready; then
  echo "$PYTHON"
  exit 0
fi

mkdir -p "$CACHE_ROOT" || die "cannot create $CACHE_ROOT"
# Two test runs starting together must not build into the same directory.
exec 9>"$VENV.lock"
flock 9 || die "cannot lock $VENV.lock"
if ready; then
  echo "$PYTHON"
  exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 not found; install it (Debian: apt-get install python3 python3-venv)"
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "python3 has no venv module; installing Debian's python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -qq python3-venv >&2
  else
    die "python3 has no venv module; install python3-venv"
  fi
fi

# Build next to the final place and move it in only when complete, so a failed or
# interrupted run never leaves a half-made environment that looks ready.
rm -rf "$VENV" "$VENV.tmp"
log "creating $VENV with $REQUIREMENTS"
python3 -m venv "$VENV.tmp" >&2 || die "python3 -m venv failed"
"$VENV.tmp/bin/python" -m pip install --quiet --disable-pip-version-check $REQUIREMENTS >&2 ||
  die "pip install $REQUIREMENTS failed"
mv "$VENV.tmp" "$VENV"
# A venv's scripts name its directory; the interpreter itself does not care where it lives,
# and the tests only run `python -c`, so the move is safe.
touch "$VENV/.complete"
ready || die "the new environment cannot import openai, playwright, huggingface_hub, modelscope, moto and schemathesis"
log "ready: $PYTHON ($("$PYTHON" -c 'import openai, huggingface_hub; print("openai", openai.__version__, "huggingface_hub", huggingface_hub.__version__)'))"
echo "$PYTHON"
