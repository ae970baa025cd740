//! Quarantine scopes (`QuarantineEntry.scope_key`): the messages held together because of their template
//! ("tpl:<waba>:<language>:<name>", 132001 / 132007 / 132015 / 132016) or of a code Breakwater does not know
//! ("code:<code>"), listed, released and dropped together (`bwctl quarantine ls|release|drop`).
//!
//! The hold itself (a template's, in Redis) is not this crate's: [`release_scope`] is handed the lift as a future
//! (`bw_breaker::templates::TemplateHolds::release`), so this crate stays free of Redis.
//!
//! For the account-signals work: when a `message_template_status_update` webhook says APPROVED, REINSTATED or
//! UNPAUSED for a template, call [`release_scope`] with the template's scope key
//! (`bw_breaker::templates::ScopeKey::Template { waba_id, language, name }.to_string()`) and the hold's release
//! as `lift`. It is safe to call twice or alongside an operator's release: every move is a ledger
//! compare-and-set with a deterministic message id, so each held message is re-queued exactly once.

use crate::OpsError;
use crate::inspect::{QuarantineItem, quarantine_items, quarantine_reason_label};
use crate::moves::{Mover, Outcome, Rules};
use crate::ops::{BatchReport, Progress};
use crate::pace::TokenBucket;
use crate::scan::delete;
use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_proto::v1::OperationState;
use bw_wire::names;
use std::collections::BTreeMap;

/// One quarantine scope as `bwctl quarantine ls` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeSummary {
    pub scope_key: String,
    /// Entries held under it.
    pub entries: u64,
    /// The reason label of its entries ("template_held", "unclassified").
    pub reason: &'static str,
    /// The last Meta code seen on its entries.
    pub meta_code: i64,
    /// When its oldest entry was quarantined, Unix ms.
    pub oldest_unix_ms: i64,
}

/// What a release did.
#[derive(Debug, Clone, Default)]
pub struct ScopeRelease {
    /// Whether a hold was in force (and is now lifted).
    pub hold_lifted: bool,
    /// The re-queued messages (outcome "replayed"), and what was left.
    pub report: BatchReport,
    /// How many passes over the quarantine it took until one found nothing of the scope.
    pub passes: u32,
}

/// The quarantine scopes with entries now, by scope key.
pub async fn scopes(js: &jetstream::Context) -> Result<Vec<ScopeSummary>, OpsError> {
    let (items, _) = quarantine_items(js, None).await?;
    let mut out: BTreeMap<String, ScopeSummary> = BTreeMap::new();
    for item in items.iter().filter(|i| !i.entry.scope_key.is_empty()) {
        let s = out.entry(item.entry.scope_key.clone()).or_insert_with(|| ScopeSummary {
            scope_key: item.entry.scope_key.clone(),
            reason: quarantine_reason_label(item.entry.reason()),
            oldest_unix_ms: i64::MAX,
            ..Default::default()
        });
        s.entries += 1;
        s.oldest_unix_ms = s.oldest_unix_ms.min(item.entry.quarantined_at_unix_ms);
        if let Some(e) = &item.entry.error
            && e.meta_code != 0
        {
            s.meta_code = e.meta_code;
        }
    }
    Ok(out.into_values().collect())
}

async fn of_scope(js: &jetstream::Context, scope_key: &str) -> Result<Vec<QuarantineItem>, OpsError> {
    let (items, _) = quarantine_items(js, None).await?;
    Ok(items.into_iter().filter(|i| i.entry.scope_key == scope_key).collect())
}

/// The most passes a release makes over the quarantine (each after the previous pass's moves).
const MAX_PASSES: u32 = 10;

/// Releases a quarantine scope: lifts its hold (`lift`, resolving to whether one was in force), then re-queues
/// every message held under `scope_key`, each exactly once (paced at `rate_per_s`).
///
/// A message can race into the quarantine during a release: a dispatcher read the hold just before `lift` and
/// quarantines the message after the first pass listed the entries. The hold is lifted first, so no message is
/// held after it; the release then passes over the quarantine again until one pass finds nothing of the scope
/// (at least two passes), so a message whose move was in flight is picked up by the next pass, never stranded.
pub async fn release_scope<L>(
    js: &jetstream::Context,
    buckets: &Buckets,
    scope_key: &str,
    lift: L,
    rate_per_s: f64,
    progress: Progress<'_>,
) -> Result<ScopeRelease, OpsError>
where
    L: std::future::Future<Output = Result<bool, String>>,
{
    let hold_lifted = lift.await.map_err(|e| OpsError::nats("quarantine scope hold", e))?;
    let mover =
        Mover::new(js.clone(), buckets, Rules { honor_not_before: false, via: "operator".into(), ..Rules::default() });
    let mut bucket = TokenBucket::new(rate_per_s, (rate_per_s / 10.0).max(1.0));
    let mut release = ScopeRelease { hold_lifted, ..Default::default() };
    let mut done = 0usize;
    while release.passes < MAX_PASSES {
        release.passes += 1;
        let items = of_scope(js, scope_key).await?;
        if items.is_empty() && release.passes >= 2 {
            break;
        }
        release.report.selected += items.len();
        for item in &items {
            bucket.take().await;
            let op = item.entry.request.as_ref().map(|r| r.operation_id.clone()).unwrap_or_default();
            match mover.replay_quarantined(item).await {
                Ok(outcome) => {
                    if outcome.source_done() {
                        delete(js, names::QUARANTINE_STREAM, item.sequence).await?;
                    }
                    release.report.record(&op, &outcome);
                }
                Err(e) => {
                    tracing::warn!(operation_id = %op, error = %e, "quarantine scope release failed");
                    release.report.errors += 1;
                }
            }
            done += 1;
            progress(done, release.report.selected);
        }
    }
    Ok(release)
}

/// Drops a quarantine scope: every message held under it ends FAILED with `reason` in its ledger entry (what the
/// producer's feed and `bwctl op` show), and its entry goes. The hold, if any, stays: the template is still bad.
pub async fn drop_scope(
    js: &jetstream::Context,
    buckets: &Buckets,
    scope_key: &str,
    reason: &str,
    progress: Progress<'_>,
) -> Result<BatchReport, OpsError> {
    let items = of_scope(js, scope_key).await?;
    let ledger = bw_common::ledger::Ledger::new(buckets);
    let mut report = BatchReport { selected: items.len(), ..Default::default() };
    let why = format!("dropped by operator from quarantine scope {scope_key}: {reason}");
    for (n, item) in items.iter().enumerate() {
        let op = item.entry.request.as_ref().map(|r| r.operation_id.clone()).unwrap_or_default();
        let outcome = if op.is_empty() {
            Outcome::Purged
        } else {
            let stored = ledger
                .update(&op, |cur| {
                    let cur = cur?;
                    if cur.state() != OperationState::Quarantined {
                        return None;
                    }
                    let mut next = cur.clone();
                    next.set_state(OperationState::Failed);
                    next.reason = why.clone();
                    Some(next)
                })
                .await?;
            match stored.map(|e| e.state()) {
                Some(OperationState::Failed) => Outcome::Purged,
                Some(s) if s.is_accepted_by_meta() => Outcome::AlreadyAccepted,
                Some(s) if s.is_final() => Outcome::AlreadyFinal,
                Some(s) => Outcome::Skipped(format!("ledger says {}; not dropped", s.label())),
                None => Outcome::Purged,
            }
        };
        if outcome.source_done() {
            delete(js, names::QUARANTINE_STREAM, item.sequence).await?;
        }
        report.record(&op, &outcome);
        progress(n + 1, items.len());
    }
    Ok(report)
}
