//! Accounting: proves every accepted operation is in exactly one place or in a final state.
//!
//! It reads every ledger entry and the contents of BW_SEND, BW_DLQ, BW_QUARANTINE and BW_UNKNOWN without
//! consuming anything, then compares: the ledger state says where an operation must be (QUEUED → BW_SEND,
//! DLQ → BW_DLQ, QUARANTINED → BW_QUARANTINE, UNKNOWN → BW_UNKNOWN, final states → nowhere).
//!
//! A live system moves messages while they are read, so one pass can see an operation "between" two places.
//! When the first pass finds anything, a second pass runs and only findings seen in both are reported; on a
//! quiet system (after a drill) the report is exact.

use crate::OpsError;
use crate::scan::scan_stream;
use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_proto::v1::{DlqEnvelope, LedgerEntry, OperationState, QuarantineEntry, SendRequest, UnknownOutcome};
use bw_wire::names;
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};

/// One operation that is not where the ledger says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub operation_id: String,
    /// Ledger state label, None when there is no ledger entry.
    pub ledger_state: Option<&'static str>,
    /// Streams holding it (a stream appears twice when it holds two copies).
    pub found_in: Vec<&'static str>,
}

/// The result of [`account`].
#[derive(Debug, Clone, Default)]
pub struct AccountingReport {
    /// Ledger entries read.
    pub ledger_entries: u64,
    /// Ledger entries per state label.
    pub per_state: BTreeMap<&'static str, u64>,
    /// Messages read per stream.
    pub stream_messages: BTreeMap<&'static str, u64>,
    /// The ledger says QUEUED/DLQ/QUARANTINED/UNKNOWN but no stream holds the operation, or a producer got it
    /// accepted and the ledger has no entry.
    pub lost: Vec<Finding>,
    /// More than one copy across (or within) the streams.
    pub in_two_places: Vec<Finding>,
    /// In a stream that contradicts the ledger (including a final state with a copy left in a stream).
    pub misplaced: Vec<Finding>,
    /// In a stream with no ledger entry.
    pub unaccounted: Vec<Finding>,
    /// Stream messages that did not decode: (stream, sequence).
    pub undecodable: Vec<(&'static str, u64)>,
}

impl AccountingReport {
    /// Number of lost operations (the figure that must be zero).
    pub fn lost_count(&self) -> usize {
        self.lost.len()
    }

    /// True when nothing is lost, doubled, misplaced or unaccounted.
    pub fn is_clean(&self) -> bool {
        self.lost.is_empty()
            && self.in_two_places.is_empty()
            && self.misplaced.is_empty()
            && self.unaccounted.is_empty()
    }

    fn keys(list: &[Finding]) -> HashSet<&str> {
        list.iter().map(|f| f.operation_id.as_str()).collect()
    }

    /// Keeps only the findings that `earlier` also had (same kind, same operation).
    fn confirmed_by(mut self, earlier: &AccountingReport) -> AccountingReport {
        let keep = |list: &mut Vec<Finding>, prev: &[Finding]| {
            let prev = Self::keys(prev);
            list.retain(|f| prev.contains(f.operation_id.as_str()));
        };
        keep(&mut self.lost, &earlier.lost);
        keep(&mut self.in_two_places, &earlier.in_two_places);
        keep(&mut self.misplaced, &earlier.misplaced);
        keep(&mut self.unaccounted, &earlier.unaccounted);
        self
    }
}

/// Where an operation in `state` must be, or None for final states.
pub fn expected_stream(state: OperationState) -> Option<&'static str> {
    match state {
        OperationState::Queued => Some(names::SEND_STREAM),
        OperationState::Dlq => Some(names::DLQ_STREAM),
        OperationState::Quarantined => Some(names::QUARANTINE_STREAM),
        OperationState::Unknown => Some(names::UNKNOWN_STREAM),
        _ => None,
    }
}

/// Compares ledger entries with the stream contents. Pure.
pub fn reconcile(
    ledger: &[LedgerEntry],
    locations: &HashMap<String, Vec<&'static str>>,
    producer_accepted: &[String],
) -> AccountingReport {
    let mut report = AccountingReport { ledger_entries: ledger.len() as u64, ..Default::default() };
    let mut in_ledger = HashSet::with_capacity(ledger.len());
    for entry in ledger {
        let state = entry.state();
        in_ledger.insert(entry.operation_id.as_str());
        *report.per_state.entry(state.label()).or_default() += 1;
        let found: Vec<&'static str> = locations.get(&entry.operation_id).cloned().unwrap_or_default();
        let finding = || Finding {
            operation_id: entry.operation_id.clone(),
            ledger_state: Some(state.label()),
            found_in: found.clone(),
        };
        let expected = expected_stream(state);
        if found.is_empty() {
            if expected.is_some() || state == OperationState::Unspecified {
                report.lost.push(finding());
            }
        } else if found.len() > 1 {
            report.in_two_places.push(finding());
        } else if expected != Some(found[0]) {
            report.misplaced.push(finding());
        }
    }
    for (op, found) in locations {
        if !in_ledger.contains(op.as_str()) {
            report.unaccounted.push(Finding { operation_id: op.clone(), ledger_state: None, found_in: found.clone() });
        }
    }
    for op in producer_accepted {
        if !in_ledger.contains(op.as_str()) && !locations.contains_key(op) {
            report.lost.push(Finding { operation_id: op.clone(), ledger_state: None, found_in: Vec::new() });
        }
    }
    for list in [&mut report.lost, &mut report.in_two_places, &mut report.misplaced, &mut report.unaccounted] {
        list.sort_by(|a, b| a.operation_id.cmp(&b.operation_id));
    }
    report
}

/// Accounting of everything in the ledger. Zero lost is checked by `report.lost_count() == 0`.
pub async fn account(js: &jetstream::Context, buckets: &Buckets) -> Result<AccountingReport, OpsError> {
    account_expected(js, buckets, &[]).await
}

/// Accounting that also checks a producer's list of accepted operation ids: any missing from the ledger (and
/// from every stream) counts as lost.
pub async fn account_expected(
    js: &jetstream::Context,
    buckets: &Buckets,
    producer_accepted: &[String],
) -> Result<AccountingReport, OpsError> {
    let first = one_pass(js, buckets, producer_accepted).await?;
    if first.is_clean() {
        return Ok(first);
    }
    let second = one_pass(js, buckets, producer_accepted).await?;
    Ok(second.confirmed_by(&first))
}

async fn one_pass(
    js: &jetstream::Context,
    buckets: &Buckets,
    producer_accepted: &[String],
) -> Result<AccountingReport, OpsError> {
    let ledger = ledger_entries(js, buckets).await?;
    let mut locations: HashMap<String, Vec<&'static str>> = HashMap::new();
    let mut counts = BTreeMap::new();
    let mut undecodable = Vec::new();
    for stream in [names::SEND_STREAM, names::DLQ_STREAM, names::QUARANTINE_STREAM, names::UNKNOWN_STREAM] {
        // BW_SEND and BW_DLQ count as one place each however many partitions they have: every partition's
        // stream is read.
        let physical: Vec<String> = match stream {
            names::SEND_STREAM => buckets.send.streams().collect(),
            names::DLQ_STREAM => buckets.send.dlq_streams().collect(),
            other => vec![other.to_string()],
        };
        let mut messages = Vec::new();
        for name in physical {
            messages.extend(scan_stream(js, &name, ">").await?);
        }
        counts.insert(stream, messages.len() as u64);
        for m in messages {
            let op = if m.headers.get(bw_wire::names::UNDECODABLE_HEADER).is_some() {
                None
            } else {
                operation_of(stream, m.payload.as_ref())
            };
            match op {
                Some(op) => locations.entry(op).or_default().push(stream),
                None => undecodable.push((stream, m.sequence)),
            }
        }
    }
    let mut report = reconcile(&ledger, &locations, producer_accepted);
    report.stream_messages = counts;
    report.undecodable = undecodable;
    Ok(report)
}

/// The operation id held by a message of `stream`, None when it does not decode.
pub fn operation_of(stream: &str, payload: &[u8]) -> Option<String> {
    let op = match stream {
        names::SEND_STREAM => SendRequest::decode(payload).ok().map(|r| r.operation_id),
        names::DLQ_STREAM => DlqEnvelope::decode(payload).ok().and_then(|e| e.request).map(|r| r.operation_id),
        names::QUARANTINE_STREAM => {
            QuarantineEntry::decode(payload).ok().and_then(|e| e.request).map(|r| r.operation_id)
        }
        names::UNKNOWN_STREAM => UnknownOutcome::decode(payload).ok().and_then(|e| e.request).map(|r| r.operation_id),
        _ => None,
    }?;
    (!op.is_empty()).then_some(op)
}

/// Every live ledger entry of every partition, read straight from each bucket's stream in parallel (deleted
/// keys skipped).
pub async fn ledger_entries(js: &jetstream::Context, buckets: &Buckets) -> Result<Vec<LedgerEntry>, OpsError> {
    let mut out = Vec::new();
    for store in &buckets.ledger {
        out.extend(partition_entries(js, store).await?);
    }
    Ok(out)
}

async fn partition_entries(
    js: &jetstream::Context,
    store: &async_nats::jetstream::kv::Store,
) -> Result<Vec<LedgerEntry>, OpsError> {
    let status = store.status().await.map_err(|e| OpsError::nats(&store.name, e))?;
    let stream = status.info.config.name.clone();
    let prefix = format!("$KV.{}.", store.name);
    let messages = scan_stream(js, &stream, &format!("{prefix}>")).await?;
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let deleted = m.headers.get("KV-Operation").map(|v| matches!(v.as_str(), "DEL" | "PURGE")).unwrap_or(false);
        if deleted {
            continue;
        }
        let key = m.subject.strip_prefix(prefix.as_str()).unwrap_or_default().to_string();
        match LedgerEntry::decode(m.payload.as_ref()) {
            Ok(mut entry) => {
                if entry.operation_id.is_empty() {
                    entry.operation_id = key;
                }
                out.push(entry);
            }
            // A corrupt entry still names an accepted operation: report it with an unspecified state.
            Err(_) => out.push(LedgerEntry { operation_id: key, ..Default::default() }),
        }
    }
    Ok(out)
}

impl std::fmt::Display for AccountingReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "ledger entries   {:>10}", self.ledger_entries)?;
        for (state, n) in &self.per_state {
            writeln!(f, "  {state:<14} {n:>10}")?;
        }
        for (stream, n) in &self.stream_messages {
            writeln!(f, "{stream:<16} {n:>10} messages")?;
        }
        for (label, list) in [
            ("lost", &self.lost),
            ("in_two_places", &self.in_two_places),
            ("misplaced", &self.misplaced),
            ("unaccounted", &self.unaccounted),
        ] {
            writeln!(f, "{label:<16} {:>10}", list.len())?;
            for finding in list.iter().take(20) {
                writeln!(
                    f,
                    "  {:<40} ledger={:<12} found_in=[{}]",
                    finding.operation_id,
                    finding.ledger_state.unwrap_or("-"),
                    finding.found_in.join(",")
                )?;
            }
            if list.len() > 20 {
                writeln!(f, "  ... and {} more", list.len() - 20)?;
            }
        }
        writeln!(f, "undecodable      {:>10}", self.undecodable.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(op: &str, state: OperationState) -> LedgerEntry {
        let mut e = LedgerEntry { operation_id: op.into(), ..Default::default() };
        e.set_state(state);
        e
    }

    #[test]
    fn reconcile_finds_every_kind_of_problem() {
        use OperationState::*;
        let ledger = vec![
            entry("ok-queued", Queued),
            entry("ok-sent", Sent),
            entry("ok-dlq", Dlq),
            entry("lost-dlq", Dlq),
            entry("twice", Queued),
            entry("wrong-place", Quarantined),
            entry("stale-copy", Delivered),
        ];
        let locations: HashMap<String, Vec<&'static str>> = [
            ("ok-queued", vec![names::SEND_STREAM]),
            ("ok-dlq", vec![names::DLQ_STREAM]),
            ("twice", vec![names::SEND_STREAM, names::DLQ_STREAM]),
            ("wrong-place", vec![names::DLQ_STREAM]),
            ("stale-copy", vec![names::SEND_STREAM]),
            ("stray", vec![names::UNKNOWN_STREAM]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let accepted = vec!["ok-sent".to_string(), "never-stored".to_string()];
        let report = reconcile(&ledger, &locations, &accepted);
        let ids = |l: &[Finding]| l.iter().map(|f| f.operation_id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&report.lost), ["lost-dlq", "never-stored"]);
        assert_eq!(ids(&report.in_two_places), ["twice"]);
        assert_eq!(ids(&report.misplaced), ["stale-copy", "wrong-place"]);
        assert_eq!(ids(&report.unaccounted), ["stray"]);
        assert_eq!(report.lost_count(), 2);
        assert_eq!(report.per_state.get("queued"), Some(&2));
        assert!(!report.is_clean());
        let clean = reconcile(
            &ledger[..3],
            &locations.iter().filter(|(k, _)| k.starts_with("ok")).map(|(k, v)| (k.clone(), v.clone())).collect(),
            &[],
        );
        assert!(clean.is_clean(), "{clean}");
    }
}
