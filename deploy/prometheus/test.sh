#!/usr/bin/env bash
# Checks the Prometheus alert rules and runs their unit tests with promtool, and checks that every alert rule
# has at least one unit test case. Install promtool with `apt-get install -y prometheus` (Debian) if missing;
# scripts/test.sh installs it (BW_WITH_PROMTOOL=1 scripts/setup.sh) and fails when it is absent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v promtool >/dev/null 2>&1; then
    echo "promtool not found; install it with: apt-get install -y prometheus" >&2
    exit 2
fi
promtool check rules "$here/rules.yml"
promtool test rules "$here/rules_test.yml"
untested=0
for rule in $(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\).*/\1/p' "$here/rules.yml"); do
    if ! grep -Eq "^ *alertname: *${rule} *$" "$here/rules_test.yml"; then
        echo "alert rule ${rule} has no test case in rules_test.yml" >&2
        untested=1
    fi
done
if [ "$untested" = 1 ]; then exit 1; fi
echo "every alert rule in rules.yml has a test case"
