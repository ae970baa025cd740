#!/usr/bin/env bash
# Prints deploy/nats/accounts.conf for a ledger split into PARTITIONS buckets (nats.ledger_partitions) and,
# with --send N, BW_SEND split into N streams (nats.send_partitions):
# - every permission that names the ledger's bucket or the wamid links' (BW_LEDGER, BW_WAMID, their streams
#   KV_BW_LEDGER, KV_BW_WAMID) is granted for BW_LEDGER_1 … BW_LEDGER_<PARTITIONS-1> (and BW_WAMID_1 …) as well;
# - every permission that names BW_SEND or BW_DLQ or a subject of theirs (bw.outbox.v1.…, bw.dlq.v1.…) is
#   granted for BW_SEND_1 … BW_SEND_<N-1>, BW_DLQ_1 … and their subjects (bw.outbox.p1.v1.…, bw.dlq.p1.v1.…)
#   as well (the DLQ follows the send partitions), and so is every one that names the wire journal of partition 0
#   (BW_WIRE_0, bw.wire.v1.p0.…) for BW_WIRE_1 … and bw.wire.v1.p1.… (dispatch.wire_guarantee = "journal");
# each on a line of its own right after the original. Nothing else changes.
#
#   scripts/nats-accounts.sh 8 --send 4 > /etc/nats/accounts.conf
#
# The last argument is the accounts config to start from (default deploy/nats/accounts.conf; `-` reads standard
# input), so it composes with the producers' users generated from the sender registry in either order (neither
# touches what the other writes: this script never copies a producer's permission, and `bwctl senders
# nats-accounts` replaces only the lines between BEGIN PRODUCERS and END PRODUCERS):
#
#   bwctl senders nats-accounts | scripts/nats-accounts.sh 8 --send 4 - > /etc/nats/accounts.conf
#   scripts/nats-accounts.sh 8 --send 4 | bwctl senders nats-accounts --base - > /etc/nats/accounts.conf
#
# With 1 partition of each it prints the file unchanged. tests/it/permissions.rs runs the services under its
# output, and tests/it/tenants.rs under both piped together.
set -euo pipefail
usage="usage: scripts/nats-accounts.sh LEDGER_PARTITIONS [--send SEND_PARTITIONS] [accounts.conf | -]"
partitions=${1:?$usage}
shift
send=1
if [[ ${1:-} == --send ]]; then
  send=${2:?$usage}
  shift 2
fi
source_conf=${1:-"$(dirname "$0")/../deploy/nats/accounts.conf"}
for pair in "LEDGER_PARTITIONS:$partitions:nats.ledger_partitions" "SEND_PARTITIONS:$send:nats.send_partitions"; do
  IFS=: read -r what value setting <<<"$pair"
  if ! [[ $value =~ ^[0-9]+$ ]] || ((value < 1 || value > 64)); then
    echo "nats-accounts: $what must be a number from 1 to 64 ($setting), got '$value'" >&2
    exit 64
  fi
done
awk -v n="$partitions" -v s="$send" '
function copies(item, count, kind,    i, copy, out) {
  out = ""
  for (i = 1; i < count; i++) {
    copy = item
    if (kind == "ledger") {
      gsub(/BW_LEDGER\./, "BW_LEDGER_" i ".", copy)
      gsub(/BW_LEDGER"/, "BW_LEDGER_" i "\"", copy)
      gsub(/BW_WAMID\./, "BW_WAMID_" i ".", copy)
      gsub(/BW_WAMID"/, "BW_WAMID_" i "\"", copy)
    } else {
      gsub(/BW_SEND\./, "BW_SEND_" i ".", copy)
      gsub(/BW_SEND"/, "BW_SEND_" i "\"", copy)
      gsub(/BW_DLQ\./, "BW_DLQ_" i ".", copy)
      gsub(/BW_DLQ"/, "BW_DLQ_" i "\"", copy)
      gsub(/"bw\.outbox\.v1\./, "\"bw.outbox.p" i ".v1.", copy)
      gsub(/"bw\.dlq\.v1\./, "\"bw.dlq.p" i ".v1.", copy)
      gsub(/BW_WIRE_0\./, "BW_WIRE_" i ".", copy)
      gsub(/BW_WIRE_0"/, "BW_WIRE_" i "\"", copy)
      gsub(/"bw\.wire\.v1\.p0\./, "\"bw.wire.v1.p" i ".", copy)
    }
    out = out (out == "" ? "" : ", ") copy
  }
  return out
}
{ print }
$0 !~ /^[ \t]*#/ && (n > 1 || s > 1) {
  indent = $0; sub(/[^ \t].*$/, "", indent)
  out = ""; rest = $0
  while (match(rest, /"[^"]*"/)) {
    item = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
    more = ""
    if (n > 1 && item ~ /BW_(LEDGER|WAMID)[."]/) more = copies(item, n, "ledger")
    else if (s > 1 && (item ~ /BW_(SEND|DLQ)[."]/ || item ~ /^"bw\.(outbox|dlq)\.v1\./ || item ~ /BW_WIRE_0[."]/ \
      || item ~ /^"bw\.wire\.v1\.p0\./)) more = copies(item, s, "send")
    if (more != "") out = out (out == "" ? "" : ", ") more
  }
  if (out != "") print indent out ","
}' "$source_conf"
