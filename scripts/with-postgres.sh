#!/usr/bin/env bash
# Runs a command with a throwaway PostgreSQL server and GANTRY_TEST_POSTGRES_URL set.
#
#   scripts/with-postgres.sh cargo nextest run
#
# Installs the Debian package `postgresql` when no server binaries are found, creates a
# cluster in a temporary directory on a free loopback port (as an unprivileged user when
# run as root), runs the command, and removes the cluster afterwards whatever happens.
# If GANTRY_TEST_POSTGRES_URL is already set, the command runs against that server.
set -euo pipefail

if [[ -n "${GANTRY_TEST_POSTGRES_URL:-}" ]]; then
  exec "$@"
fi

log() { echo "with-postgres: $*" >&2; }

find_pg_bin() {
  local dir
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then echo "$dir"; return 0; fi
  done
  return 1
}

if ! PG_BIN=$(find_pg_bin); then
  log "PostgreSQL server binaries not found; installing the Debian package postgresql"
  if [[ $(id -u) -ne 0 ]]; then
    log "not root: install PostgreSQL yourself (apt-get install postgresql) or set GANTRY_TEST_POSTGRES_URL"
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  PG_BIN=$(find_pg_bin) || { log "postgresql installed but initdb not found"; exit 1; }
fi

WORK=$(mktemp -d /tmp/gantry-pg.XXXXXX)
chmod 755 "$WORK"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

RUN_AS=()
if [[ $(id -u) -eq 0 ]]; then
  # initdb refuses to run as root.
  if ! id gantry-test >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin gantry-test
  fi
  chown gantry-test "$WORK"
  RUN_AS=(runuser -u gantry-test --)
fi

cleanup() {
  "${RUN_AS[@]}" "$PG_BIN/pg_ctl" -D "$WORK/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

"${RUN_AS[@]}" "$PG_BIN/initdb" -D "$WORK/data" -U postgres --auth=trust -E UTF8 --no-sync >"$WORK/initdb.log" 2>&1 \
  || { cat "$WORK/initdb.log" >&2; exit 1; }
"${RUN_AS[@]}" "$PG_BIN/pg_ctl" -D "$WORK/data" -l "$WORK/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $PORT -k $WORK -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400" \
  start >/dev/null || { cat "$WORK/server.log" >&2; exit 1; }
log "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT (data in $WORK)"

export GANTRY_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PORT/postgres"
# Tests that stop and start a server of their own (gantry-testkit's OwnPostgres) make it
# with the same binaries.
export GANTRY_TEST_PG_BIN="$PG_BIN"
set +e
"$@"
status=$?
set -e
exit $status
