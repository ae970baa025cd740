#!/usr/bin/env bash
# Checks the Prometheus alert rules and runs their unit tests with promtool.
# Install promtool with `apt-get install -y prometheus` (Debian) if it is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v promtool >/dev/null 2>&1; then
    echo "promtool not found; install it with: apt-get install -y prometheus" >&2
    exit 2
fi
promtool check rules "$here/rules.yml"
promtool test rules "$here/rules_test.yml"
