//! Breaker incidents as the DLQ sees them: statistics per incident, the progress of an incident's replay
//! (KV bucket `BW_INCIDENTS`, one `IncidentProgress` per `<phone_number_id>.<incident>`), the "replayed"
//! event published once when no DLQ entry of an incident is left, holding an incident for manual release,
//! and the operator's replay of exactly one incident in per-recipient acceptance order.
//!
//! Who writes what: every replay instance and `bwctl` update a record by compare-and-set only ([`Incidents`]),
//! so any number of them can work on one incident. Finish detection ([`Incidents::finish_drained`]) runs
//! after a drain of a CLOSED scope: an incident with handled entries and none left in the scope's DLQ is marked
//! finished (CAS), its `IncidentReplayed` event is published with the message id
//! `incident.<phone>.<incident>.replayed` from the stored figures, then it is marked announced (CAS). A crash
//! in between is healed by the next check, which publishes the same bytes under the same id again (JetStream
//! drops it within the events stream's duplicate window).
//!
//! Counting: an entry counts once its move out of the DLQ is done ([`Outcome::source_done`]); a crash between
//! the move and the count can lose that one count (the move itself is never repeated). Held entries are not
//! touched at all: no ledger write, no count, they stay in the DLQ until an operator releases the incident.

use crate::OpsError;
use crate::inspect::{DlqItem, dlq_items};
use crate::moves::{Mover, Outcome, Rules};
use crate::ops::{BatchReport, Progress};
use crate::pace::TokenBucket;
use crate::scan::{delete, subject_depth};
use async_nats::jetstream::{self, kv};
use bw_common::nats::{Buckets, publish_durable};
use bw_common::time::now_ms;
use bw_proto::v1::{IncidentProgress, IncidentReplayed};
use bw_wire::names;
use futures::StreamExt;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};

/// Where one handled DLQ entry counts in its incident's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counted {
    Replayed,
    Expired,
    Quarantined,
    /// Already sent, already final or purged: a stale copy went away.
    Other,
}

impl Counted {
    /// The report column of a move's outcome; None while the entry stays in the DLQ.
    pub fn of(outcome: &Outcome) -> Option<Counted> {
        match outcome {
            Outcome::Replayed { .. } => Some(Counted::Replayed),
            Outcome::Expired => Some(Counted::Expired),
            Outcome::Quarantined(_) => Some(Counted::Quarantined),
            Outcome::AlreadyAccepted | Outcome::AlreadyFinal | Outcome::Purged => Some(Counted::Other),
            Outcome::NotYet(_) | Outcome::Changed | Outcome::Skipped(_) | Outcome::Stopped => None,
        }
    }
}

/// Counts per report column, added to a record in one compare-and-set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub replayed: u64,
    pub expired: u64,
    pub quarantined: u64,
    pub other: u64,
}

impl Counts {
    pub fn add(&mut self, c: Counted) {
        match c {
            Counted::Replayed => self.replayed += 1,
            Counted::Expired => self.expired += 1,
            Counted::Quarantined => self.quarantined += 1,
            Counted::Other => self.other += 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.replayed + self.expired + self.quarantined + self.other
    }
}

/// The report of a finished incident, from its stored progress.
pub fn report(p: &IncidentProgress) -> IncidentReplayed {
    IncidentReplayed {
        incident_id: p.incident_id.clone(),
        phone_number_id: p.phone_number_id.clone(),
        messages: p.replayed + p.expired + p.quarantined + p.other,
        replayed: p.replayed,
        expired: p.expired,
        quarantined: p.quarantined,
        other: p.other,
        started_at_unix_ms: p.started_at_unix_ms,
        finished_at_unix_ms: p.finished_at_unix_ms,
        took_ms: (p.finished_at_unix_ms - p.started_at_unix_ms).max(0),
        released_by_operator: p.released_at_unix_ms > 0,
    }
}

/// Makes sure BW_EVENTS captures `bw.incident.v1.>` (a stream created before incident events existed does not):
/// adds the subject to the stream's config when it is missing. Called by whoever publishes incident events.
pub async fn ensure_event_subjects(js: &jetstream::Context) -> Result<(), OpsError> {
    let stream = names::EVENTS_STREAM;
    let handle = js.get_stream(stream).await.map_err(|e| OpsError::nats(stream, e))?;
    let info = handle.get_info().await.map_err(|e| OpsError::nats(stream, e))?;
    let wanted = names::incident_subject(">");
    if info.config.subjects.iter().any(|s| s == &wanted || s == ">" || s == "bw.>") {
        return Ok(());
    }
    let mut config = info.config.clone();
    config.subjects.push(wanted);
    js.update_stream(config).await.map_err(|e| OpsError::nats(stream, e))?;
    Ok(())
}

/// Handle on the BW_INCIDENTS bucket. Cheap to clone.
#[derive(Clone)]
pub struct Incidents {
    store: kv::Store,
}

impl Incidents {
    /// Opens the bucket, creating it when missing with the compiled byte limit (bwctl, tests).
    pub async fn open(js: &jetstream::Context, replicas: usize) -> Result<Incidents, OpsError> {
        let max_bytes = bw_common::config::StreamLimits::default().service_bucket_max_bytes;
        Incidents::open_limited(js, replicas, max_bytes).await
    }

    /// Opens the bucket, creating it when missing (history 1; records are small and few: one per incident) with
    /// at most `max_bytes` (`nats.limits.service_bucket_max_bytes`).
    pub async fn open_limited(js: &jetstream::Context, replicas: usize, max_bytes: i64) -> Result<Incidents, OpsError> {
        let bucket = names::INCIDENTS_BUCKET;
        let config = kv::Config {
            bucket: bucket.to_string(),
            history: 1,
            max_bytes,
            num_replicas: replicas,
            ..Default::default()
        };
        let store =
            bw_common::nats::open_bucket(js, config).await.map_err(|e| OpsError::nats(bucket, format!("{e:#}")))?;
        Ok(Incidents { store })
    }

    /// The record of one incident, if any.
    pub async fn get(&self, phone: &str, incident: &str) -> Result<Option<IncidentProgress>, OpsError> {
        Ok(self.read(&names::incident_key(phone, incident)).await?.map(|(p, _)| p))
    }

    async fn read(&self, key: &str) -> Result<Option<(IncidentProgress, u64)>, OpsError> {
        let entry = self.store.entry(key).await.map_err(|e| OpsError::nats(names::INCIDENTS_BUCKET, e))?;
        Ok(match entry {
            Some(e) if e.operation == kv::Operation::Put => {
                Some((IncidentProgress::decode(e.value.as_ref()).unwrap_or_default(), e.revision))
            }
            _ => None,
        })
    }

    /// Compare-and-set loop on one record: `f` gets the current record (a fresh one when absent) and returns the
    /// next, or None to leave it. Returns the stored record.
    async fn update(
        &self,
        phone: &str,
        incident: &str,
        mut f: impl FnMut(&IncidentProgress) -> Option<IncidentProgress>,
    ) -> Result<Option<IncidentProgress>, OpsError> {
        let key = names::incident_key(phone, incident);
        for _ in 0..32 {
            let current = self.read(&key).await?;
            let base = current.as_ref().map(|(p, _)| p.clone()).unwrap_or_else(|| IncidentProgress {
                incident_id: incident.to_string(),
                phone_number_id: phone.to_string(),
                ..Default::default()
            });
            let Some(next) = f(&base) else { return Ok(current.map(|(p, _)| p)) };
            let bytes: bytes::Bytes = next.encode_to_vec().into();
            let written = match &current {
                Some((_, revision)) => self
                    .store
                    .update(&key, bytes, *revision)
                    .await
                    .map(|_| ())
                    .map_err(|e| (e.kind() == kv::UpdateErrorKind::WrongLastRevision, e.to_string())),
                None => self
                    .store
                    .create(&key, bytes)
                    .await
                    .map(|_| ())
                    .map_err(|e| (e.kind() == kv::CreateErrorKind::AlreadyExists, e.to_string())),
            };
            match written {
                Ok(()) => return Ok(Some(next)),
                Err((true, _)) => continue,
                Err((false, detail)) => return Err(OpsError::nats(names::INCIDENTS_BUCKET, detail)),
            }
        }
        Err(OpsError::nats(names::INCIDENTS_BUCKET, format!("record {key} stayed contended")))
    }

    /// Adds handled entries to an incident's report (starting its clock on the first).
    pub async fn count(&self, phone: &str, incident: &str, counts: &Counts) -> Result<(), OpsError> {
        if incident.is_empty() || counts.total() == 0 {
            return Ok(());
        }
        let now = now_ms();
        self.update(phone, incident, |cur| {
            let mut next = cur.clone();
            if next.started_at_unix_ms == 0 {
                next.started_at_unix_ms = now;
            }
            next.updated_at_unix_ms = now;
            next.replayed += counts.replayed;
            next.expired += counts.expired;
            next.quarantined += counts.quarantined;
            next.other += counts.other;
            Some(next)
        })
        .await?;
        Ok(())
    }

    /// Whether an entry of `category` of this incident is held for manual release, remembering that it is (for
    /// `bwctl dlq stats`). False once an operator released the incident.
    pub async fn hold(&self, phone: &str, incident: &str, category: &str) -> Result<bool, OpsError> {
        let stored = self
            .update(phone, incident, |cur| {
                if cur.released_at_unix_ms > 0 || cur.held_categories.iter().any(|c| c == category) {
                    return None;
                }
                let mut next = cur.clone();
                next.held_categories.push(category.to_string());
                Some(next)
            })
            .await?;
        Ok(stored.is_none_or(|p| p.released_at_unix_ms == 0))
    }

    /// Marks an incident released by an operator: replay holds none of its entries any more.
    pub async fn release(&self, phone: &str, incident: &str) -> Result<(), OpsError> {
        let now = now_ms();
        self.update(phone, incident, |cur| {
            if cur.released_at_unix_ms > 0 {
                return None;
            }
            let mut next = cur.clone();
            next.released_at_unix_ms = now;
            Some(next)
        })
        .await?;
        Ok(())
    }

    /// Every record (of one scope, or all).
    pub async fn list(&self, phone: Option<&str>) -> Result<Vec<IncidentProgress>, OpsError> {
        let mut keys = match self.store.keys().await {
            Ok(k) => k,
            Err(e) => return Err(OpsError::nats(names::INCIDENTS_BUCKET, e)),
        };
        let prefix = phone.map(|p| format!("{p}."));
        let mut wanted = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| OpsError::nats(names::INCIDENTS_BUCKET, e))?;
            if prefix.as_ref().is_none_or(|p| key.starts_with(p.as_str())) {
                wanted.push(key);
            }
        }
        let mut out = Vec::with_capacity(wanted.len());
        for key in wanted {
            if let Some((p, _)) = self.read(&key).await? {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// Finishes the incidents of a drained, CLOSED scope: each one with handled entries and none left in the
    /// scope's DLQ is marked finished, its event is published once, and it is marked announced. Returns the
    /// events published by this call (a repeated call publishes the same bytes, dropped as duplicates).
    pub async fn finish_drained(
        &self,
        js: &jetstream::Context,
        send: names::SendPartitions,
        phone: &str,
    ) -> Result<Vec<IncidentReplayed>, OpsError> {
        let open: Vec<IncidentProgress> = self
            .list(Some(phone))
            .await?
            .into_iter()
            .filter(|p| p.announced_at_unix_ms == 0 && p.started_at_unix_ms > 0)
            .collect();
        if open.is_empty() {
            return Ok(Vec::new());
        }
        let left: BTreeSet<String> =
            if subject_depth(js, &send.dlq_stream_of(phone), &send.dlq_scope_filter(phone)).await? == 0 {
                BTreeSet::new()
            } else {
                dlq_items(js, send, Some(phone)).await?.0.into_iter().map(|i| i.envelope.incident_id).collect()
            };
        let mut published = Vec::new();
        for p in open {
            if left.contains(&p.incident_id) {
                continue;
            }
            let now = now_ms();
            let Some(finished) = self
                .update(phone, &p.incident_id, |cur| {
                    if cur.finished_at_unix_ms > 0 {
                        return None;
                    }
                    let mut next = cur.clone();
                    next.finished_at_unix_ms = now;
                    Some(next)
                })
                .await?
            else {
                continue;
            };
            if finished.announced_at_unix_ms > 0 {
                continue;
            }
            let event = report(&finished);
            let headers = names::msg_id_headers(&names::incident_replayed_msg_id(phone, &p.incident_id));
            publish_durable(js, names::incident_subject(phone), headers, event.encode_to_vec().into()).await?;
            self.update(phone, &p.incident_id, |cur| {
                if cur.announced_at_unix_ms > 0 {
                    return None;
                }
                let mut next = cur.clone();
                next.announced_at_unix_ms = now_ms();
                Some(next)
            })
            .await?;
            tracing::info!(
                scope = %phone,
                incident = %p.incident_id,
                messages = event.messages,
                expired = event.expired,
                quarantined = event.quarantined,
                took_ms = event.took_ms,
                "incident replay finished"
            );
            published.push(event);
        }
        Ok(published)
    }
}

/// DLQ entries of one incident, per incident and scope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IncidentStats {
    /// Empty: entries that carry no incident.
    pub incident_id: String,
    pub scope: String,
    pub depth: u64,
    /// Entries replay holds for manual release (their category is held for this incident).
    pub held: u64,
    pub oldest_at_unix_ms: i64,
    /// Entries per category label.
    pub categories: BTreeMap<&'static str, u64>,
}

/// Groups DLQ entries by (incident, scope); `progress` (from [`Incidents::list`]) tells which are held.
pub fn dlq_incident_stats(items: &[DlqItem], progress: &[IncidentProgress]) -> Vec<IncidentStats> {
    let held: BTreeMap<(&str, &str), &IncidentProgress> = progress
        .iter()
        .filter(|p| p.released_at_unix_ms == 0)
        .map(|p| ((p.phone_number_id.as_str(), p.incident_id.as_str()), p))
        .collect();
    let mut stats: BTreeMap<(String, String), IncidentStats> = BTreeMap::new();
    for item in items {
        let scope = names::phone_of_subject(&item.subject);
        let incident = item.envelope.incident_id.as_str();
        let category = item.envelope.request.as_ref().map(|r| r.category().label()).unwrap_or("unspecified");
        let s = stats.entry((incident.to_string(), scope.to_string())).or_insert_with(|| IncidentStats {
            incident_id: incident.to_string(),
            scope: scope.to_string(),
            ..Default::default()
        });
        s.depth += 1;
        let at = item.envelope.dead_lettered_at_unix_ms;
        if at > 0 && (s.oldest_at_unix_ms == 0 || at < s.oldest_at_unix_ms) {
            s.oldest_at_unix_ms = at;
        }
        *s.categories.entry(category).or_default() += 1;
        if held.get(&(scope, incident)).is_some_and(|p| p.held_categories.iter().any(|c| c == category)) {
            s.held += 1;
        }
    }
    stats.into_values().collect()
}

/// The entries of `incident`, in the order an incident replay puts them on the lane: by original acceptance
/// (`accepted_at_unix_ms` of the request), then DLQ sequence, so each recipient's messages keep their order.
pub fn incident_entries(items: Vec<DlqItem>, incident: &str) -> Vec<DlqItem> {
    let mut selected: Vec<DlqItem> = items.into_iter().filter(|i| i.envelope.incident_id == incident).collect();
    selected.sort_by_key(|i| (i.envelope.request.as_ref().map(|r| r.accepted_at_unix_ms).unwrap_or(0), i.sequence));
    selected
}

/// What an operator's incident replay did.
#[derive(Debug, Clone, Default)]
pub struct IncidentReplay {
    pub batch: BatchReport,
    /// Events this run published (the incident finished).
    pub finished: Vec<IncidentReplayed>,
}

/// Which incident an operator replays, where, how fast.
#[derive(Debug, Clone, Copy)]
pub struct IncidentSelect<'a> {
    pub incident: &'a str,
    /// One scope, or every scope holding the incident.
    pub scope: Option<&'a str>,
    /// Entries moved per second.
    pub rate_per_s: f64,
}

/// Replays exactly the DLQ entries of the selected incident now, one at a time in [`incident_entries`] order,
/// paced, ignoring `not_before` and any hold (this is the manual release). Counts every entry in the
/// incident's report, then finishes the incident for the scopes `closed` says are CLOSED (an incident of a
/// scope still OPEN may grow).
pub async fn replay_incident(
    js: &jetstream::Context,
    buckets: &Buckets,
    incidents: &Incidents,
    select: IncidentSelect<'_>,
    closed: &(dyn Fn(&str) -> bool + Sync),
    progress: Progress<'_>,
) -> Result<IncidentReplay, OpsError> {
    let IncidentSelect { incident, scope, rate_per_s } = select;
    let (items, _) = dlq_items(js, buckets.send, scope).await?;
    let selected = incident_entries(items, incident);
    let scopes: BTreeSet<String> = selected.iter().map(|i| names::phone_of_subject(&i.subject).to_string()).collect();
    for phone in &scopes {
        incidents.release(phone, incident).await?;
    }
    let rules = Rules { honor_not_before: false, via: "operator".into(), ..Rules::default() };
    let mover = Mover::new(js.clone(), buckets, rules);
    let mut bucket = TokenBucket::new(rate_per_s, 1.0);
    let mut report =
        IncidentReplay { batch: BatchReport { selected: selected.len(), ..Default::default() }, ..Default::default() };
    for (n, item) in selected.iter().enumerate() {
        bucket.take().await;
        let op = item.envelope.request.as_ref().map(|r| r.operation_id.clone()).unwrap_or_default();
        let phone = names::phone_of_subject(&item.subject);
        match mover.replay_dlq_entry(&item.envelope, None, None).await {
            Ok(outcome) => {
                if outcome.source_done() {
                    delete(js, &names::SendPartitions::dlq_stream_of_subject(&item.subject), item.sequence).await?;
                }
                if let Some(c) = Counted::of(&outcome) {
                    let mut counts = Counts::default();
                    counts.add(c);
                    incidents.count(phone, incident, &counts).await?;
                }
                report.batch.record(&op, &outcome);
            }
            Err(e) => {
                tracing::warn!(operation_id = %op, error = %e, "incident replay of an entry failed");
                report.batch.errors += 1;
            }
        }
        progress(n + 1, selected.len());
    }
    for phone in scopes.iter().filter(|p| closed(p)) {
        report.finished.extend(incidents.finish_drained(js, buckets.send, phone).await?);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_proto::v1::{Category, DlqEnvelope, SendRequest};

    fn item(seq: u64, incident: &str, category: Category, accepted: i64) -> DlqItem {
        DlqItem {
            sequence: seq,
            subject: names::dlq_subject(category, "1001"),
            envelope: DlqEnvelope {
                incident_id: incident.into(),
                dead_lettered_at_unix_ms: 1_000 + seq as i64,
                request: Some(SendRequest {
                    operation_id: format!("op-{seq}"),
                    category: category as i32,
                    accepted_at_unix_ms: accepted,
                    ..Default::default()
                }),
                ..Default::default()
            },
        }
    }

    #[test]
    fn stats_group_by_incident_and_count_held_categories() {
        let items = [
            item(1, "inc-a", Category::Marketing, 10),
            item(2, "inc-a", Category::Transactional, 11),
            item(3, "inc-b", Category::Marketing, 12),
            item(4, "", Category::Support, 13),
        ];
        let progress = [
            IncidentProgress {
                incident_id: "inc-a".into(),
                phone_number_id: "1001".into(),
                held_categories: vec!["marketing".into()],
                ..Default::default()
            },
            IncidentProgress {
                incident_id: "inc-b".into(),
                phone_number_id: "1001".into(),
                held_categories: vec!["marketing".into()],
                released_at_unix_ms: 5,
                ..Default::default()
            },
        ];
        let stats = dlq_incident_stats(&items, &progress);
        let by: BTreeMap<&str, &IncidentStats> = stats.iter().map(|s| (s.incident_id.as_str(), s)).collect();
        assert_eq!((by["inc-a"].depth, by["inc-a"].held, by["inc-a"].oldest_at_unix_ms), (2, 1, 1_001));
        assert_eq!(by["inc-a"].categories.get("transactional"), Some(&1));
        assert_eq!((by["inc-b"].depth, by["inc-b"].held), (1, 0), "released: not held");
        assert_eq!((by[""].depth, by[""].held), (1, 0));
    }

    #[test]
    fn incident_entries_are_that_group_in_acceptance_order() {
        let items = vec![
            item(1, "inc-a", Category::Marketing, 30),
            item(2, "inc-b", Category::Marketing, 5),
            item(3, "inc-a", Category::Marketing, 10),
            item(4, "inc-a", Category::Marketing, 20),
        ];
        let ops: Vec<u64> = incident_entries(items, "inc-a").iter().map(|i| i.sequence).collect();
        assert_eq!(ops, [3, 4, 1]);
    }

    #[test]
    fn report_adds_up_and_outcomes_count_once_moved() {
        let p = IncidentProgress {
            replayed: 5,
            expired: 2,
            quarantined: 1,
            other: 1,
            started_at_unix_ms: 1_000,
            finished_at_unix_ms: 4_500,
            ..Default::default()
        };
        let r = report(&p);
        assert_eq!((r.messages, r.took_ms, r.released_by_operator), (9, 3_500, false));
        assert_eq!(Counted::of(&Outcome::Replayed { replay: 1, duplicate: true }), Some(Counted::Replayed));
        assert_eq!(Counted::of(&Outcome::NotYet(std::time::Duration::from_secs(1))), None);
        assert_eq!(Counted::of(&Outcome::Stopped), None);
    }
}
