//! Operator batch actions (what `bwctl` runs): replay now from the DLQ or the quarantine, and purge.
//!
//! They read entries without consuming (so they coexist with the replay service's consumers), move each one
//! with [`Mover`] (same ledger compare-and-set and msg ids as the service, so running an action twice, or
//! alongside the service, sends nothing twice), and delete the source message only once the move is done.

use crate::OpsError;
use crate::inspect::{DlqItem, QuarantineItem, dlq_items, quarantine_items};
use crate::moves::{Mover, Outcome, Rules};
use crate::pace::TokenBucket;
use crate::scan::delete;
use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_proto::v1::{QuarantineReason, ScopeSnapshot};
use bw_wire::names;
use futures::StreamExt;
use prost::Message;
use std::collections::BTreeMap;

/// What a batch action did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Entries selected.
    pub selected: usize,
    /// Entries per outcome label ("replayed", "already_sent", "purged", "skipped", ...).
    pub outcomes: BTreeMap<&'static str, u64>,
    /// Entries left in place, with the reason (operation id, reason).
    pub left: Vec<(String, String)>,
    /// Entries whose move failed (broker trouble); they stay in place.
    pub errors: u64,
}

impl BatchReport {
    /// Counts one entry's outcome (and why it was left, when it was).
    pub fn record(&mut self, op: &str, outcome: &Outcome) {
        *self.outcomes.entry(outcome.label()).or_default() += 1;
        match outcome {
            Outcome::Skipped(why) => self.left.push((op.to_string(), why.clone())),
            Outcome::Changed => self.left.push((op.to_string(), "changed meanwhile; try again".into())),
            Outcome::NotYet(_) | Outcome::Stopped => self.left.push((op.to_string(), "not yet".into())),
            _ => {}
        }
    }
}

/// Which quarantine entries an action applies to. Empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct QuarantineFilter {
    pub scope: Option<String>,
    pub reason: Option<QuarantineReason>,
    pub operation_ids: Vec<String>,
}

impl QuarantineFilter {
    fn matches(&self, item: &QuarantineItem) -> bool {
        let op = item.entry.request.as_ref().map(|r| r.operation_id.as_str()).unwrap_or("");
        self.reason.is_none_or(|r| item.entry.reason() == r)
            && (self.operation_ids.is_empty() || self.operation_ids.iter().any(|id| id == op))
    }
}

/// Called after each entry with (done, selected).
pub type Progress<'a> = &'a mut (dyn FnMut(usize, usize) + Send);

fn operator_rules() -> Rules {
    Rules { honor_not_before: false, via: "operator".into(), ..Rules::default() }
}

fn op_of(request: Option<&bw_proto::v1::SendRequest>) -> String {
    request.map(|r| r.operation_id.clone()).unwrap_or_default()
}

/// Current breaker snapshot of every scope in BW_SCOPES.
pub async fn scope_snapshots(buckets: &Buckets) -> Result<BTreeMap<String, ScopeSnapshot>, OpsError> {
    let mut keys = buckets.scopes.keys().await.map_err(|e| OpsError::nats(names::SCOPES_BUCKET, e))?;
    let mut out = BTreeMap::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| OpsError::nats(names::SCOPES_BUCKET, e))?;
        if let Some(value) = buckets.scopes.get(&key).await.map_err(|e| OpsError::nats(names::SCOPES_BUCKET, e))? {
            out.insert(key, ScopeSnapshot::decode(value.as_ref()).unwrap_or_default());
        }
    }
    Ok(out)
}

/// Replays DLQ entries now (oldest first, at most `limit`, paced at `rate_per_s`), ignoring `not_before`.
/// Deadline, ledger, window and the replay limit still apply. `allow` picks the scopes (by phone_number_id).
pub async fn replay_dlq_now(
    js: &jetstream::Context,
    buckets: &Buckets,
    scope: Option<&str>,
    allow: &(dyn Fn(&str) -> bool + Sync),
    limit: usize,
    rate_per_s: f64,
    progress: Progress<'_>,
) -> Result<BatchReport, OpsError> {
    let (items, _) = dlq_items(js, buckets.send, scope).await?;
    let selected: Vec<DlqItem> =
        items.into_iter().filter(|i| allow(bw_wire::names::phone_of_subject(&i.subject))).take(limit).collect();
    let mover = Mover::new(js.clone(), buckets, operator_rules());
    let mut bucket = TokenBucket::new(rate_per_s, (rate_per_s / 10.0).max(1.0));
    let mut report = BatchReport { selected: selected.len(), ..Default::default() };
    for (n, item) in selected.iter().enumerate() {
        bucket.take().await;
        let op = op_of(item.envelope.request.as_ref());
        match mover.replay_dlq_entry(&item.envelope, None, None).await {
            Ok(outcome) => {
                if outcome.source_done() {
                    delete(js, &names::SendPartitions::dlq_stream_of_subject(&item.subject), item.sequence).await?;
                }
                report.record(&op, &outcome);
            }
            Err(e) => {
                tracing::warn!(operation_id = %op, error = %e, "replay failed");
                report.errors += 1;
            }
        }
        progress(n + 1, selected.len());
    }
    Ok(report)
}

/// Replays quarantined entries now (operator decision: the replay limit does not apply).
pub async fn replay_quarantine_now(
    js: &jetstream::Context,
    buckets: &Buckets,
    filter: &QuarantineFilter,
    limit: usize,
    rate_per_s: f64,
    progress: Progress<'_>,
) -> Result<BatchReport, OpsError> {
    let (items, _) = quarantine_items(js, filter.scope.as_deref()).await?;
    let selected: Vec<QuarantineItem> = items.into_iter().filter(|i| filter.matches(i)).take(limit).collect();
    let mover = Mover::new(js.clone(), buckets, operator_rules());
    let mut bucket = TokenBucket::new(rate_per_s, (rate_per_s / 10.0).max(1.0));
    let mut report = BatchReport { selected: selected.len(), ..Default::default() };
    for (n, item) in selected.iter().enumerate() {
        bucket.take().await;
        let op = op_of(item.entry.request.as_ref());
        match mover.replay_quarantined(item).await {
            Ok(outcome) => {
                if outcome.source_done() {
                    delete(js, names::QUARANTINE_STREAM, item.sequence).await?;
                }
                report.record(&op, &outcome);
            }
            Err(e) => {
                tracing::warn!(operation_id = %op, error = %e, "quarantine replay failed");
                report.errors += 1;
            }
        }
        progress(n + 1, selected.len());
    }
    Ok(report)
}

/// Purges DLQ entries: each operation ends EXPIRED with reason "purged by operator from dlq", then the entry
/// is deleted. Undecodable entries are deleted too (they hold no accepted operation).
pub async fn purge_dlq(
    js: &jetstream::Context,
    buckets: &Buckets,
    scope: Option<&str>,
    limit: usize,
    progress: Progress<'_>,
) -> Result<BatchReport, OpsError> {
    let (items, bad) = dlq_items(js, buckets.send, scope).await?;
    let selected: Vec<DlqItem> = items.into_iter().take(limit).collect();
    let mover = Mover::new(js.clone(), buckets, operator_rules());
    let total = selected.len() + bad.len();
    let mut report = BatchReport { selected: total, ..Default::default() };
    for (n, item) in selected.iter().enumerate() {
        let op = op_of(item.envelope.request.as_ref());
        let outcome = mover.purge_dlq(item).await?;
        if outcome.source_done() {
            delete(js, &names::SendPartitions::dlq_stream_of_subject(&item.subject), item.sequence).await?;
        }
        report.record(&op, &outcome);
        progress(n + 1, total);
    }
    for (n, b) in bad.iter().enumerate() {
        delete(js, &b.stream, b.sequence).await?;
        *report.outcomes.entry("undecodable_deleted").or_default() += 1;
        progress(selected.len() + n + 1, total);
    }
    Ok(report)
}

/// Purges quarantine entries: each operation ends EXPIRED with reason "purged by operator from quarantined".
pub async fn purge_quarantine(
    js: &jetstream::Context,
    buckets: &Buckets,
    filter: &QuarantineFilter,
    limit: usize,
    progress: Progress<'_>,
) -> Result<BatchReport, OpsError> {
    let (items, _) = quarantine_items(js, filter.scope.as_deref()).await?;
    let selected: Vec<QuarantineItem> = items.into_iter().filter(|i| filter.matches(i)).take(limit).collect();
    let mover = Mover::new(js.clone(), buckets, operator_rules());
    let mut report = BatchReport { selected: selected.len(), ..Default::default() };
    for (n, item) in selected.iter().enumerate() {
        let op = op_of(item.entry.request.as_ref());
        let outcome = mover.purge_quarantined(item).await?;
        if outcome.source_done() {
            delete(js, names::QUARANTINE_STREAM, item.sequence).await?;
        }
        report.record(&op, &outcome);
        progress(n + 1, selected.len());
    }
    Ok(report)
}
