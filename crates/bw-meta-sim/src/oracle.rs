//! The oracle: every message the simulator accepted (keyed by operation id from `biz_opaque_callback_data`,
//! or by wamid when none was set), how often, and counters of requests by outcome.
//!
//! Tests compare it with what the system under test believes: `count > 1` is a duplicate send. Duplicates are
//! split by what the client could know when it sent again ([`DuplicateKind`]): if every earlier acceptance was
//! hidden from it (no parseable 200: a reset, hang or bodiless 5xx after acceptance, or a garbled 200), the
//! resend followed an ambiguous answer (`after_ambiguous`); if it had a 200 for an earlier acceptance and sent
//! again anyway, it is a `plain` duplicate, a bug with no excuse.
//!
//! "Hidden" is what the simulator did: a client that times out on a slow but complete 200 (its own timeout
//! below the scenario latency) counts as acknowledged here.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

/// One accepted message (or operation accepted several times).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OracleEntry {
    /// `biz_opaque_callback_data` of the send; None when the client set none.
    pub operation_id: Option<String>,
    pub phone_number_id: String,
    /// `+549*******234`, or `US.*****************918` for a send to a user id the simulator has no phone for.
    pub recipient_masked: String,
    /// First 16 hex of sha256(digits): the same as `bw_common::mask::recipient_key`.
    pub recipient_key: String,
    /// One wamid per acceptance.
    pub wamids: Vec<String>,
    pub first_accepted_ms: u64,
    /// Position of the first acceptance among all of this simulator's acceptances (1, 2, ...): the exact order in
    /// which Meta accepted messages, where `first_accepted_ms` can tie.
    #[serde(default)]
    pub first_accept_seq: u64,
    pub last_accepted_ms: u64,
    /// Times accepted; > 1 means the message was sent more than once.
    pub count: u32,
    /// Acceptances whose answer the client never received (reset or hang after processing).
    pub unacknowledged: u32,
    /// One per acceptance, in order: whether the client got a parseable 200 for it.
    #[serde(default)]
    pub acknowledged: Vec<bool>,
    /// `text`, `template`, ...
    pub message_type: String,
    /// Acceptances Meta then failed with a `failed` status: no copy of those reached the user, so sending the
    /// operation again after one is a new attempt, not a duplicate.
    #[serde(default)]
    pub failed: u32,
}

/// Why an operation was accepted more than once.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DuplicateKind {
    /// Every acceptance before the last was hidden from the client: it could know the earlier outcome was
    /// ambiguous (and should have flagged it rather than resent blindly).
    AfterAmbiguous,
    /// The client had a 200 for an earlier acceptance and sent again.
    Plain,
}

impl OracleEntry {
    /// Acceptances that were not failed afterwards: the copies that may reach the user (1 for a message that
    /// failed asynchronously once and was then sent again).
    pub fn delivered(&self) -> u32 {
        self.count.saturating_sub(self.failed)
    }

    /// None when at most one acceptance was not failed afterwards.
    pub fn duplicate_kind(&self) -> Option<DuplicateKind> {
        if self.delivered() < 2 {
            return None;
        }
        let saw_a_200 = if self.acknowledged.len() == self.count as usize {
            self.acknowledged[..self.acknowledged.len() - 1].iter().any(|acked| *acked)
        } else {
            // A dump from before `acknowledged` existed: only the count of hidden acceptances is known.
            self.unacknowledged + 1 < self.count
        };
        if saw_a_200 { Some(DuplicateKind::Plain) } else { Some(DuplicateKind::AfterAmbiguous) }
    }
}

/// The duplicates of a snapshot, by kind (operation ids, or `wamid:<first wamid>` without one).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DuplicateReport {
    /// Operations accepted more than once.
    pub total: u64,
    /// Of those: the client could know the earlier acceptance was ambiguous.
    pub after_ambiguous: u64,
    /// Of those: the client had a 200 and sent again.
    pub plain: u64,
    pub after_ambiguous_ids: Vec<String>,
    pub plain_ids: Vec<String>,
}

/// A point-in-time copy of the oracle.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct OracleSnapshot {
    /// Sorted by operation id, then first acceptance.
    pub messages: Vec<OracleEntry>,
    pub counters: Counters,
    /// Computed from `messages` when the snapshot is taken.
    #[serde(default)]
    pub duplicates: DuplicateReport,
    /// Accepted messages Meta then failed (a `failed` status was scheduled), in order, with the code and why
    /// (first [`EVENTS_KEPT`]); the counts are in `counters.async_failed`.
    #[serde(default)]
    pub failed: Vec<FailedMessage>,
}

/// Why an accepted message failed later.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FailureCause {
    /// A scenario injection or `async_failure` fault.
    Injected,
    /// The configured `webhook.fail_recipients`.
    Configured,
    /// Account state a webhook announced or Meta's fixed rules: a user who stopped marketing (131050),
    /// marketing to a US number, a free-form message outside the service window (131047).
    Account,
    /// The portfolio messaging limit past its tier.
    Limit,
}

impl FailureCause {
    pub fn key(self) -> &'static str {
        match self {
            FailureCause::Injected => "injected",
            FailureCause::Configured => "configured",
            FailureCause::Account => "account",
            FailureCause::Limit => "limit",
        }
    }
}

/// One message accepted and failed later.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FailedMessage {
    pub operation_id: Option<String>,
    pub wamid: String,
    pub phone_number_id: String,
    pub code: i64,
    pub cause: FailureCause,
    /// The injection's name for an injected failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub injection: Option<String>,
}

impl OracleSnapshot {
    pub fn get(&self, operation_id: &str) -> Option<&OracleEntry> {
        self.messages.iter().find(|e| e.operation_id.as_deref() == Some(operation_id))
    }

    /// Sum of `count` over all entries: total acceptances.
    pub fn total_accepted(&self) -> u64 {
        self.messages.iter().map(|e| u64::from(e.count)).sum()
    }

    /// Entries of which more than one accepted copy was not failed afterwards.
    pub fn duplicates(&self) -> Vec<&OracleEntry> {
        self.messages.iter().filter(|e| e.delivered() > 1).collect()
    }

    /// Duplicates whose earlier acceptances the client never saw a 200 for.
    pub fn duplicates_after_ambiguous(&self) -> Vec<&OracleEntry> {
        self.messages.iter().filter(|e| e.duplicate_kind() == Some(DuplicateKind::AfterAmbiguous)).collect()
    }

    /// Duplicates sent again after a 200.
    pub fn plain_duplicates(&self) -> Vec<&OracleEntry> {
        self.messages.iter().filter(|e| e.duplicate_kind() == Some(DuplicateKind::Plain)).collect()
    }
}

fn duplicate_report(messages: &[OracleEntry]) -> DuplicateReport {
    let mut r = DuplicateReport::default();
    for e in messages {
        let Some(kind) = e.duplicate_kind() else { continue };
        let id = e.operation_id.clone().unwrap_or_else(|| format!("wamid:{}", e.wamids.first().map_or("", |w| w)));
        r.total += 1;
        match kind {
            DuplicateKind::AfterAmbiguous => {
                r.after_ambiguous += 1;
                r.after_ambiguous_ids.push(id);
            }
            DuplicateKind::Plain => {
                r.plain += 1;
                r.plain_ids.push(id);
            }
        }
    }
    r
}

/// Why the simulator gave an answer, for [`Counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The request itself: success, validation or authentication answers.
    Request,
    /// The scenario (a window's fault, a token event) or an admin call (token revoked) produced it.
    Injected,
    /// The client exceeded a modelled limit (self-inflicted): 130429, 131056, 4, 80007/80008, and the
    /// portfolio messaging limit when it fails synchronously.
    Limit,
    /// Account state the simulator announced by webhook (a restricted or banned WABA, a paused template, a number
    /// in maintenance) or a send Meta refuses by its fixed rules (131062): the sender ignored a signal.
    Account,
}

/// Requests by outcome. Keys: `"200"`, Meta codes as text (`"130429"`, `"131056"`, `"190"`, `"100"`...),
/// `"http_503"` for bodiless HTTP errors, `"reset"`, `"hang"`, `"200_unparseable"`; plus webhook delivery
/// counters. `injected` and `limit_exceeded` split the same keys by cause (see the [`admin`](crate::admin)
/// header): `by_outcome[k] = injected[k] + limit_exceeded[k] + answers to the request itself`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Counters {
    pub requests: u64,
    pub by_outcome: BTreeMap<String, u64>,
    /// Answers the scenario or an admin call injected, by outcome key.
    #[serde(default)]
    pub injected: BTreeMap<String, u64>,
    /// Answers caused by the client exceeding a limit, by outcome key.
    #[serde(default)]
    pub limit_exceeded: BTreeMap<String, u64>,
    /// Answers caused by announced account state, by outcome key (see [`Source::Account`]).
    #[serde(default)]
    pub account_state: BTreeMap<String, u64>,
    /// Failed statuses scheduled for accepted messages, by code (every cause).
    #[serde(default)]
    pub async_failed: BTreeMap<String, u64>,
    /// Of those, by cause (`injected`, `configured`, `account`, `limit`) then code.
    #[serde(default)]
    pub async_failed_by_cause: BTreeMap<String, BTreeMap<String, u64>>,
    /// Calls each scenario injection answered (sync) or failed (async), by injection name (`#<index>` unnamed).
    #[serde(default)]
    pub injections: BTreeMap<String, u64>,
    /// Calls by API version: `"v21.0"`, or `"v20.0->v21.0"` for an expired version served by the oldest usable
    /// one, or `"unknown"` for a path that is no version.
    #[serde(default)]
    pub api_versions: BTreeMap<String, u64>,
    /// Messages failed (or refused) for the portfolio messaging limit, by portfolio.
    #[serde(default)]
    pub portfolio_limited: BTreeMap<String, u64>,
    /// Template sends answered `held_for_quality_assessment` (template pacing).
    #[serde(default)]
    pub held_for_quality: u64,
    /// Messages accepted whose acceptance the client was not shown (reset, hang, bodiless 5xx, garbled 200).
    #[serde(default)]
    pub accepted_unacknowledged: u64,
    pub webhooks: WebhookCounters,
    /// The first [`EVENTS_KEPT`] limit-caused answers, in order, with the simulator's own loop stall just before
    /// each: where a self-inflicted answer came from.
    #[serde(default)]
    pub limit_events: Vec<LimitEvent>,
    /// The first [`EVENTS_KEPT`] stalls of the simulator's own event loop longer than [`STALL_REPORTED_MS`].
    #[serde(default)]
    pub loop_stalls: Vec<LoopStall>,
}

/// How many limit events and loop stalls [`Counters`] keeps (the counts go on).
pub const EVENTS_KEPT: usize = 1000;
/// Loop stalls at least this long are listed in [`Counters::loop_stalls`].
pub const STALL_REPORTED_MS: u64 = 50;

/// One answer caused by the client exceeding a limit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LimitEvent {
    pub at_unix_ms: u64,
    pub phone_number_id: String,
    /// Outcome key: `"130429"`, `"131056"`, `"4"`, `"80007"`.
    pub code: String,
    /// The longest stall of the simulator's event loop in the second before this answer, ms. Requests a client
    /// sent evenly during a stall reach the limiter together when it ends, so a limit answer right after a long
    /// stall may be the simulator's own bunching rather than the client's.
    pub stall_ms: u64,
}

/// A stretch in which the simulator's event loop did not run (the machine's CPUs were busy elsewhere).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LoopStall {
    /// When the loop ran again.
    pub at_unix_ms: u64,
    pub ms: u64,
}

impl Counters {
    pub fn outcome(&self, key: &str) -> u64 {
        self.by_outcome.get(key).copied().unwrap_or(0)
    }

    /// Answers with `key` the scenario or an admin call injected.
    pub fn injected(&self, key: &str) -> u64 {
        self.injected.get(key).copied().unwrap_or(0)
    }

    /// Answers with `key` caused by a limit the client exceeded.
    pub fn limit_exceeded(&self, key: &str) -> u64 {
        self.limit_exceeded.get(key).copied().unwrap_or(0)
    }

    /// Answers with `key` caused by announced account state.
    pub fn account_state(&self, key: &str) -> u64 {
        self.account_state.get(key).copied().unwrap_or(0)
    }

    /// Failed statuses scheduled with `code` (every cause).
    pub fn async_failed(&self, code: i64) -> u64 {
        self.async_failed.get(&code.to_string()).copied().unwrap_or(0)
    }

    /// Failed statuses scheduled with `code` for `cause`.
    pub fn async_failed_for(&self, cause: FailureCause, code: i64) -> u64 {
        self.async_failed_by_cause.get(cause.key()).and_then(|m| m.get(&code.to_string())).copied().unwrap_or(0)
    }

    /// Calls the injection `name` hit.
    pub fn injection(&self, name: &str) -> u64 {
        self.injections.get(name).copied().unwrap_or(0)
    }
}

/// Webhook delivery counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct WebhookCounters {
    /// Status updates scheduled (one per status, duplicates included).
    pub statuses_scheduled: u64,
    /// POSTs answered 200.
    pub posts_ok: u64,
    /// POST attempts that failed (non-200 or transport error) and were retried or dropped.
    pub post_failures: u64,
    /// Status updates delivered in a 200-answered POST.
    pub statuses_delivered: u64,
    /// Status updates given up after the last retry, or refused because the queue was full.
    pub statuses_dropped: u64,
    /// Inbound customer messages delivered.
    pub inbound_delivered: u64,
    /// Statuses a scenario status window withheld (`drop_rate`): never scheduled, never sent.
    #[serde(default)]
    pub statuses_withheld: u64,
    /// Statuses a scenario status window delayed (`delay_ms`).
    #[serde(default)]
    pub statuses_delayed: u64,
    /// Other webhooks delivered, by field (`account_update`, `messages` for value-level errors, ...).
    #[serde(default)]
    pub fields_delivered: BTreeMap<String, u64>,
    /// Other webhooks given up after the last retry.
    #[serde(default)]
    pub fields_dropped: u64,
}

const SHARDS: usize = 16;

/// The live oracle.
#[derive(Debug)]
pub struct Oracle {
    hasher: RandomState,
    shards: Vec<Mutex<HashMap<String, OracleEntry>>>,
    counters: Mutex<Counters>,
    accepts: std::sync::atomic::AtomicU64,
    /// Every acceptance, repeats included (what [`OracleSnapshot::total_accepted`] sums), kept apart so that a
    /// caller polling for progress does not copy every entry each time.
    accepted_total: std::sync::atomic::AtomicU64,
    /// The longest loop stall of the last second: (when it ended, unix ms; how long, ms).
    recent_stall: Mutex<(u64, u64)>,
    failed: Mutex<Vec<FailedMessage>>,
}

impl Default for Oracle {
    fn default() -> Self {
        Oracle::new()
    }
}

/// What the handler knows about an acceptance.
pub struct Acceptance<'a> {
    pub operation_id: Option<&'a str>,
    pub phone_number_id: &'a str,
    pub to: &'a str,
    pub wamid: &'a str,
    pub message_type: &'a str,
    /// The client will not see the 200.
    pub unacknowledged: bool,
}

impl Oracle {
    pub fn new() -> Oracle {
        Oracle {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            counters: Mutex::new(Counters::default()),
            accepts: std::sync::atomic::AtomicU64::new(0),
            accepted_total: std::sync::atomic::AtomicU64::new(0),
            recent_stall: Mutex::new((0, 0)),
            failed: Mutex::new(Vec::new()),
        }
    }

    /// The event loop ran `lag_ms` later than it asked to (see `MetaSim::start`'s loop watch).
    pub fn note_loop_lag(&self, lag_ms: u64) {
        let now = crate::ids::now_ms();
        {
            let mut recent = lock(&self.recent_stall);
            if lag_ms >= recent.1 || now.saturating_sub(recent.0) > 1000 {
                *recent = (now, lag_ms);
            }
        }
        if lag_ms >= STALL_REPORTED_MS {
            let mut c = lock(&self.counters);
            if c.loop_stalls.len() < EVENTS_KEPT {
                c.loop_stalls.push(LoopStall { at_unix_ms: now, ms: lag_ms });
            }
        }
    }

    /// Records one limit-caused answer (counted by [`Oracle::count_as`] with [`Source::Limit`]).
    pub fn record_limit(&self, code: &str, phone_number_id: &str) {
        let now = crate::ids::now_ms();
        let (at, ms) = *lock(&self.recent_stall);
        let stall_ms = if now.saturating_sub(at) <= 1000 { ms } else { 0 };
        let mut c = lock(&self.counters);
        if c.limit_events.len() < EVENTS_KEPT {
            c.limit_events.push(LimitEvent {
                at_unix_ms: now,
                phone_number_id: phone_number_id.to_string(),
                code: code.to_string(),
                stall_ms,
            });
        }
    }

    pub fn record_accept(&self, a: Acceptance<'_>) {
        let key = match a.operation_id {
            Some(op) => format!("op:{op}"),
            None => format!("wamid:{}", a.wamid),
        };
        let now = crate::ids::now_ms();
        let shard = (self.hasher.hash_one(&key) as usize) % SHARDS;
        let mut map = lock(&self.shards[shard]);
        let entry = map.entry(key).or_insert_with(|| OracleEntry {
            operation_id: a.operation_id.map(str::to_string),
            phone_number_id: a.phone_number_id.to_string(),
            recipient_masked: if crate::ids::is_user_id(a.to) {
                crate::ids::mask_user_id(a.to)
            } else {
                crate::ids::mask_phone(a.to)
            },
            recipient_key: crate::ids::recipient_key(a.to),
            wamids: Vec::with_capacity(1),
            first_accepted_ms: now,
            first_accept_seq: self.accepts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1,
            last_accepted_ms: now,
            count: 0,
            unacknowledged: 0,
            acknowledged: Vec::with_capacity(1),
            message_type: a.message_type.to_string(),
            failed: 0,
        });
        entry.wamids.push(a.wamid.to_string());
        entry.acknowledged.push(!a.unacknowledged);
        entry.last_accepted_ms = now;
        entry.count += 1;
        self.accepted_total.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if a.unacknowledged {
            entry.unacknowledged += 1;
        }
        drop(map);
        if a.unacknowledged {
            lock(&self.counters).accepted_unacknowledged += 1;
        }
    }

    /// Counts one request by its outcome key, as an answer to the request itself.
    pub fn count(&self, outcome: &str) {
        self.count_as(outcome, Source::Request);
    }

    /// Counts one request by its outcome key and cause.
    pub fn count_as(&self, outcome: &str, source: Source) {
        let mut c = lock(&self.counters);
        c.requests += 1;
        bump(&mut c.by_outcome, outcome);
        match source {
            Source::Request => {}
            Source::Injected => bump(&mut c.injected, outcome),
            Source::Limit => bump(&mut c.limit_exceeded, outcome),
            Source::Account => bump(&mut c.account_state, outcome),
        }
    }

    /// Records an accepted message that will fail with `code` (always after its [`Oracle::record_accept`]).
    pub fn record_failure(&self, f: FailedMessage) {
        let code = f.code.to_string();
        let key = match &f.operation_id {
            Some(op) => format!("op:{op}"),
            None => format!("wamid:{}", f.wamid),
        };
        let shard = (self.hasher.hash_one(&key) as usize) % SHARDS;
        if let Some(entry) = lock(&self.shards[shard]).get_mut(&key) {
            entry.failed += 1;
        }
        {
            let mut c = lock(&self.counters);
            bump(&mut c.async_failed, &code);
            bump(c.async_failed_by_cause.entry(f.cause.key().to_string()).or_default(), &code);
            if let Some(name) = &f.injection {
                bump(&mut c.injections, name);
            }
        }
        let mut failed = lock(&self.failed);
        if failed.len() < EVENTS_KEPT {
            failed.push(f);
        }
    }

    /// Counts one call an injection answered synchronously.
    pub fn count_injection(&self, name: &str) {
        bump(&mut lock(&self.counters).injections, name);
    }

    /// Counts one call by its API version key.
    pub fn count_version(&self, key: &str) {
        bump(&mut lock(&self.counters).api_versions, key);
    }

    /// Counts one template send held by pacing.
    pub fn count_held(&self) {
        lock(&self.counters).held_for_quality += 1;
    }

    /// Counts one message failed or refused for the messaging limit of `portfolio`.
    pub fn count_portfolio_limited(&self, portfolio: &str) {
        bump(&mut lock(&self.counters).portfolio_limited, portfolio);
    }

    pub fn webhooks(&self, f: impl FnOnce(&mut WebhookCounters)) {
        f(&mut lock(&self.counters).webhooks);
    }

    pub fn counters(&self) -> Counters {
        lock(&self.counters).clone()
    }

    /// Total acceptances so far, repeats included: the snapshot's `total_accepted` without copying the entries.
    pub fn total_accepted(&self) -> u64 {
        self.accepted_total.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn snapshot(&self) -> OracleSnapshot {
        let mut messages: Vec<OracleEntry> =
            self.shards.iter().flat_map(|s| lock(s).values().cloned().collect::<Vec<_>>()).collect();
        messages.sort_by(|a, b| {
            (a.operation_id.as_deref(), a.first_accepted_ms, &a.wamids).cmp(&(
                b.operation_id.as_deref(),
                b.first_accepted_ms,
                &b.wamids,
            ))
        });
        let duplicates = duplicate_report(&messages);
        OracleSnapshot { messages, counters: self.counters(), duplicates, failed: lock(&self.failed).clone() }
    }

    pub fn clear(&self) {
        for s in &self.shards {
            lock(s).clear();
        }
        *lock(&self.counters) = Counters::default();
        lock(&self.failed).clear();
        self.accepted_total.store(0, std::sync::atomic::Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn bump(map: &mut BTreeMap<String, u64>, key: &str) {
    match map.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            map.insert(key.to_string(), 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_counted_per_operation() {
        let o = Oracle::new();
        let accept = |op: Option<&str>, wamid: &str, unack: bool| {
            o.record_accept(Acceptance {
                operation_id: op,
                phone_number_id: "p",
                to: "+5491155551234",
                wamid,
                message_type: "text",
                unacknowledged: unack,
            })
        };
        accept(Some("op-1"), "w1", false);
        accept(Some("op-1"), "w2", true);
        accept(Some("op-2"), "w3", false);
        accept(None, "w4", false);
        o.count("200");
        o.count("200");
        o.count("130429");
        let snap = o.snapshot();
        assert_eq!(snap.messages.len(), 3);
        assert_eq!(snap.total_accepted(), 4);
        let e = snap.get("op-1").expect("op-1 recorded");
        assert_eq!((e.count, e.unacknowledged, e.wamids.len()), (2, 1, 2));
        assert_eq!(e.recipient_masked, "+549*******234");
        assert_eq!(snap.duplicates().len(), 1);
        assert_eq!(e.acknowledged, vec![true, false]);
        assert_eq!(e.duplicate_kind(), Some(DuplicateKind::Plain), "resent after a 200");
        assert_eq!((snap.duplicates.total, snap.duplicates.plain, snap.duplicates.after_ambiguous), (1, 1, 0));
        accept(Some("op-3"), "w5", true);
        accept(Some("op-3"), "w6", true);
        accept(Some("op-3"), "w7", false);
        let snap = o.snapshot();
        assert_eq!(snap.get("op-3").and_then(OracleEntry::duplicate_kind), Some(DuplicateKind::AfterAmbiguous));
        assert_eq!(snap.duplicates.after_ambiguous_ids, vec!["op-3".to_string()]);
        assert_eq!(snap.duplicates_after_ambiguous().len(), 1);
        assert_eq!(snap.plain_duplicates().len(), 1);
        assert_eq!(snap.counters.accepted_unacknowledged, 3);
        // Entries read from an older dump (no `acknowledged`) fall back on the count of hidden acceptances.
        let old = |count, unacknowledged| OracleEntry { acknowledged: vec![], count, unacknowledged, ..e.clone() };
        assert_eq!(old(2, 1).duplicate_kind(), Some(DuplicateKind::AfterAmbiguous));
        assert_eq!(old(3, 1).duplicate_kind(), Some(DuplicateKind::Plain));
        assert_eq!(snap.counters.outcome("200"), 2);
        assert_eq!(snap.counters.outcome("130429"), 1);
        assert_eq!(snap.counters.requests, 3);
        o.clear();
        assert_eq!(o.snapshot(), OracleSnapshot::default());
    }

    #[test]
    fn a_resend_after_an_async_failure_is_not_a_duplicate() {
        let o = Oracle::new();
        let accept = |wamid: &str| {
            o.record_accept(Acceptance {
                operation_id: Some("op-1"),
                phone_number_id: "p",
                to: "+5491155551234",
                wamid,
                message_type: "text",
                unacknowledged: false,
            })
        };
        let fail = |wamid: &str| {
            o.record_failure(FailedMessage {
                operation_id: Some("op-1".into()),
                wamid: wamid.into(),
                phone_number_id: "p".into(),
                code: 131000,
                cause: FailureCause::Injected,
                injection: None,
            })
        };
        accept("w1");
        fail("w1");
        accept("w2");
        let snap = o.snapshot();
        let e = snap.get("op-1").expect("recorded");
        assert_eq!((e.count, e.failed, e.delivered()), (2, 1, 1));
        assert!(snap.duplicates().is_empty() && snap.duplicates.total == 0, "{:?}", snap.duplicates);
        // A third acceptance that Meta does not fail is a second copy at the user: a duplicate.
        accept("w3");
        assert_eq!(o.snapshot().duplicates().len(), 1);
    }
}
