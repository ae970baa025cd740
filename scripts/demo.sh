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
# The operator console (read only, no key needed) on the drill's NATS while the drill runs: started when the drill
# says where its nats-server is, stopped when the drill ends. BW_DEMO_CONSOLE sets its address.
console_listen="${BW_DEMO_CONSOLE:-127.0.0.1:9180}"
console_bin="${BW_DEMO_CONSOLE_BIN:-target/release/bw-console}"
drill_bin="${BW_DEMO_DRILL_BIN:-target/release/bw-drill}"
set +e
"$drill_bin" "$@" | {
  console_pid=""
  trap 'if [ -n "$console_pid" ]; then kill "$console_pid" 2>/dev/null; fi' EXIT
  trap 'exit 130' INT TERM
  while IFS= read -r line; do
    printf '%s\n' "$line"
    if [ -z "$console_pid" ] && [[ "$line" =~ ^nats-server\ (nats://[^ ]+) ]]; then
      mkdir -p .drill
      BW_CONSOLE__NATS__URL="${BASH_REMATCH[1]}" BW_CONSOLE__REDIS__URL="" BW_CONSOLE__ADMIN__LISTEN="127.0.0.1:0" \
        BW_CONSOLE__CONSOLE__LISTEN="$console_listen" BW_CONSOLE__AUTH__VIEWERS_WITHOUT_KEY=true \
        "$console_bin" >.drill/console.log 2>&1 &
      console_pid=$!
      echo "operator console (read only): http://$console_listen/  (log .drill/console.log)"
    fi
  done
}
exit "${PIPESTATUS[0]}"
