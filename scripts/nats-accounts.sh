#!/usr/bin/env bash
# Prints deploy/nats/accounts.conf for a ledger split into PARTITIONS buckets (nats.ledger_partitions): every
# permission that names the ledger's bucket or the wamid links' (BW_LEDGER, BW_WAMID, their streams KV_BW_LEDGER,
# KV_BW_WAMID) is granted for BW_LEDGER_1 … BW_LEDGER_<PARTITIONS-1> (and BW_WAMID_1 …) as well, on a line of
# its own right after the original. Nothing else changes.
#
#   scripts/nats-accounts.sh 8 > /etc/nats/accounts.conf
#
# With 1 partition it prints the file unchanged. tests/it/permissions.rs runs the services under its output.
set -euo pipefail
partitions=${1:?usage: scripts/nats-accounts.sh PARTITIONS [accounts.conf]}
source_conf=${2:-"$(dirname "$0")/../deploy/nats/accounts.conf"}
if ! [[ $partitions =~ ^[0-9]+$ ]] || ((partitions < 1 || partitions > 64)); then
  echo "nats-accounts: PARTITIONS must be a number from 1 to 64 (nats.ledger_partitions), got '$partitions'" >&2
  exit 64
fi
awk -v n="$partitions" '
{ print }
n > 1 && $0 !~ /^[ \t]*#/ && /BW_(LEDGER|WAMID)[."]/ {
  indent = $0; sub(/[^ \t].*$/, "", indent)
  out = ""; rest = $0
  while (match(rest, /"[^"]*"/)) {
    item = substr(rest, RSTART, RLENGTH); rest = substr(rest, RSTART + RLENGTH)
    if (item !~ /BW_(LEDGER|WAMID)[."]/) continue
    for (i = 1; i < n; i++) {
      copy = item
      gsub(/BW_LEDGER\./, "BW_LEDGER_" i ".", copy)
      gsub(/BW_LEDGER"/, "BW_LEDGER_" i "\"", copy)
      gsub(/BW_WAMID\./, "BW_WAMID_" i ".", copy)
      gsub(/BW_WAMID"/, "BW_WAMID_" i "\"", copy)
      out = out (out == "" ? "" : ", ") copy
    }
  }
  if (out != "") print indent out ","
}' "$source_conf"
