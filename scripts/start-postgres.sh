#!/usr/bin/env bash
# Start a throw-away PostgreSQL server on loopback for the history tests; print its URL.
#
#   export FEDWEAVE_TEST_PG_URL="$(scripts/start-postgres.sh)"   # start (or reuse) and get the URL
#   scripts/start-postgres.sh stop                               # stop it
#
# Idempotent: when the server already runs it only prints the URL. Installs Debian's
# postgresql package when no server binaries are found (needs root and apt). Runs the server
# as the "postgres" user when started as root, in its own data folder, never touching the
# system cluster. Durability is switched off (fsync=off): test data only.
#
# Environment (defaults): FEDWEAVE_PG_PORT (5433), FEDWEAVE_PG_DIR (/tmp/fedweave-pg),
# FEDWEAVE_PG_USER (fedweave), FEDWEAVE_PG_PASSWORD (fedweave), FEDWEAVE_PG_DB (fedweave_test).
set -euo pipefail

PORT="${FEDWEAVE_PG_PORT:-5433}"
DATA="${FEDWEAVE_PG_DIR:-/tmp/fedweave-pg}"
DB_USER="${FEDWEAVE_PG_USER:-fedweave}"
DB_PASSWORD="${FEDWEAVE_PG_PASSWORD:-fedweave}"
DB_NAME="${FEDWEAVE_PG_DB:-fedweave_test}"
URL="postgresql+psycopg://${DB_USER}:${DB_PASSWORD}@127.0.0.1:${PORT}/${DB_NAME}"

log() { echo "start-postgres: $*" >&2; }

find_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
BIN="$(find_bin)"
if [[ -z "$BIN" || ! -x "$BIN/initdb" ]]; then
    log "installing postgresql with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y postgresql >&2
    BIN="$(find_bin)"
fi
[[ -x "$BIN/pg_ctl" ]] || { log "no PostgreSQL server binaries found"; exit 1; }

if [[ "$(id -u)" == 0 ]]; then
    as_pg() { runuser -u postgres -- "$@"; }
    OWNER=postgres
else
    as_pg() { "$@"; }
    OWNER="$(id -un)"
fi

if [[ "${1:-start}" == "stop" ]]; then
    if [[ -f "$DATA/postmaster.pid" ]]; then
        as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2
    else
        log "not running ($DATA)"
    fi
    exit 0
fi

if [[ ! -f "$DATA/PG_VERSION" ]]; then
    log "initialising a cluster in $DATA"
    mkdir -p "$DATA"
    chown "$OWNER" "$DATA"
    chmod 700 "$DATA"
    as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --no-instructions >&2
fi

if as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    log "already running on 127.0.0.1:$PORT"
else
    log "starting on 127.0.0.1:$PORT (log: $DATA/server.log)"
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 \
        -o "-p $PORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$DATA \
            -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
            -c max_connections=200" start >&2
fi

psql_admin() { as_pg "$BIN/psql" -h "$DATA" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }
if [[ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$DB_USER'")" != 1 ]]; then
    psql_admin -c "CREATE ROLE \"$DB_USER\" LOGIN PASSWORD '$DB_PASSWORD'" >&2
fi
if [[ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]]; then
    psql_admin -c "CREATE DATABASE \"$DB_NAME\" OWNER \"$DB_USER\"" >&2
fi
echo "$URL"
