//! The durable operation ledger: one JetStream KV entry per accepted operation (bucket BW_LEDGER, or one bucket
//! per partition with `nats.ledger_partitions` > 1: `BW_LEDGER`, `BW_LEDGER_1`, …, by operation id).
//!
//! It is the single source of truth for "where is operation X" and for idempotency: an operation that Meta
//! accepted is never sent again. Every write is a compare-and-set on the entry's revision, and
//! [`transition_allowed`] keeps the state machine monotonic (a late "sent" never overwrites "read", nothing
//! Meta accepted goes back to a queue).

use crate::nats::Buckets;
use async_nats::jetstream::kv;
use bw_proto::v1::{LedgerEntry, OperationState, SendRequest};
use futures::StreamExt;
use prost::Message;

/// Ledger failures. All are retryable from the caller's point of view (the broker is unreachable or busy).
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    #[error("ledger entry `{0}` is corrupt")]
    Corrupt(String),
    #[error("ledger entry `{0}` kept changing under compare-and-set")]
    Contended(String),
}

/// An entry with the KV revision it was read at.
#[derive(Debug, Clone)]
pub struct Versioned {
    pub entry: LedgerEntry,
    pub revision: u64,
}

fn rank(state: OperationState) -> u8 {
    match state {
        // Held by Meta (template pacing) comes before sent: Meta's release moves it on, nothing moves it back.
        OperationState::Held => 1,
        OperationState::Sent => 2,
        OperationState::Delivered => 3,
        OperationState::Read => 4,
        OperationState::Failed => 5,
        _ => 0,
    }
}

/// Whether the ledger may move from `from` to `to`.
///
/// Invariants: states Meta accepted (sent, delivered, read, failed) only move forward among themselves
/// (sent < delivered < read; failed is terminal) and never back to a queue; expired only moves to a state a
/// status webhook proves (Meta did send it); every other state may move anywhere (queued ↔ dlq ↔ quarantined ↔ unknown as the pipeline works on it).
pub fn transition_allowed(from: OperationState, to: OperationState) -> bool {
    if from == to {
        return true;
    }
    if from.is_accepted_by_meta() {
        return to.is_accepted_by_meta() && rank(to) > rank(from) && from != OperationState::Failed;
    }
    if from == OperationState::Expired {
        // An unknown outcome expired by policy can still be proven sent by a late status webhook: record the
        // truth. Nothing is ever sent because of this move.
        return to.is_accepted_by_meta();
    }
    true
}

/// A fresh ledger entry for `request` in `state`, carrying the request's identity fields.
pub fn entry_for(request: &SendRequest, state: OperationState) -> LedgerEntry {
    let mut entry = LedgerEntry {
        operation_id: request.operation_id.clone(),
        waba_id: request.waba_id.clone(),
        phone_number_id: request.phone_number_id.clone(),
        category: request.category,
        accepted_at_unix_ms: request.accepted_at_unix_ms,
        deadline_unix_ms: request.deadline_unix_ms,
        ..Default::default()
    };
    entry.set_state(state);
    entry
}

/// Handle to the ledger buckets. Cheap to clone.
#[derive(Clone)]
pub struct Ledger {
    /// One bucket per partition ([`bw_wire::names::ledger_partition`]).
    stores: std::sync::Arc<[kv::Store]>,
    /// The wamid links, as many partitions as the ledger, by link key.
    wamid: std::sync::Arc<[kv::Store]>,
}

impl Ledger {
    /// Wraps the buckets opened by [`crate::nats::ensure_topology`].
    pub fn new(buckets: &Buckets) -> Ledger {
        Ledger { stores: buckets.ledger.clone().into(), wamid: buckets.wamid.clone().into() }
    }

    /// The bucket of the partition holding `operation_id`.
    fn store(&self, operation_id: &str) -> &kv::Store {
        partition_of(&self.stores, operation_id)
    }

    /// The bucket of the partition holding the link of `key` (a [`wamid_key`]).
    fn wamid_store(&self, key: &str) -> &kv::Store {
        partition_of(&self.wamid, key)
    }

    /// Reads an entry.
    pub async fn get(&self, operation_id: &str) -> Result<Option<Versioned>, LedgerError> {
        let entry =
            self.store(operation_id).entry(operation_id).await.map_err(|e| LedgerError::Unavailable(e.to_string()))?;
        match entry {
            Some(e) if e.operation == kv::Operation::Put => {
                let decoded = LedgerEntry::decode(e.value.as_ref())
                    .map_err(|_| LedgerError::Corrupt(operation_id.to_string()))?;
                Ok(Some(Versioned { entry: decoded, revision: e.revision }))
            }
            _ => Ok(None),
        }
    }

    /// Creates the entry of a newly accepted operation. Returns false when it already existed (a producer
    /// retry), leaving the existing entry untouched.
    pub async fn create(&self, entry: &LedgerEntry) -> Result<bool, LedgerError> {
        match self.store(&entry.operation_id).create(&entry.operation_id, entry.encode_to_vec().into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(LedgerError::Unavailable(e.to_string())),
        }
    }

    /// Compare-and-set update. `f` sees the current entry (None if absent) and returns the new one, or None to
    /// leave it as is. Transitions that [`transition_allowed`] refuses are skipped (returns the current entry).
    /// Returns the entry as stored afterwards.
    pub async fn update<F>(&self, operation_id: &str, f: F) -> Result<Option<LedgerEntry>, LedgerError>
    where
        F: FnMut(Option<&LedgerEntry>) -> Option<LedgerEntry>,
    {
        self.update_from(operation_id, None, f).await
    }

    /// Like [`Ledger::update`], starting from an entry already read (saves a round trip when it is current).
    pub async fn update_from<F>(
        &self,
        operation_id: &str,
        known: Option<Versioned>,
        f: F,
    ) -> Result<Option<LedgerEntry>, LedgerError>
    where
        F: FnMut(Option<&LedgerEntry>) -> Option<LedgerEntry>,
    {
        Ok(self.update_versioned(operation_id, known, f).await?.map(|v| v.entry))
    }

    /// Like [`Ledger::update_from`], returning the stored entry with its new revision (for a later
    /// compare-and-set without another read).
    pub async fn update_versioned<F>(
        &self,
        operation_id: &str,
        known: Option<Versioned>,
        f: F,
    ) -> Result<Option<Versioned>, LedgerError>
    where
        F: FnMut(Option<&LedgerEntry>) -> Option<LedgerEntry>,
    {
        self.write(operation_id, known, f, transition_allowed).await
    }

    /// Queues an operation Meta accepted again as a new attempt: the one write that may move SENT or FAILED back
    /// to QUEUED. Only two callers: ingest, when a `failed` status of the operation's current attempt carries a
    /// code that is not final (Meta did not deliver it: `bw-ingest/src/asyncfail.rs`), and an operator's
    /// `bwctl op resend`. `f` decides under compare-and-set; delivered and read stay terminal whatever it says.
    pub async fn reopen<F>(&self, operation_id: &str, f: F) -> Result<Option<Versioned>, LedgerError>
    where
        F: FnMut(Option<&LedgerEntry>) -> Option<LedgerEntry>,
    {
        self.write(operation_id, None, f, reopen_allowed).await
    }

    async fn write<F>(
        &self,
        operation_id: &str,
        known: Option<Versioned>,
        mut f: F,
        allowed: fn(OperationState, OperationState) -> bool,
    ) -> Result<Option<Versioned>, LedgerError>
    where
        F: FnMut(Option<&LedgerEntry>) -> Option<LedgerEntry>,
    {
        let mut known = known;
        for _ in 0..16 {
            let current = match known.take() {
                Some(k) => Some(k),
                None => self.get(operation_id).await?,
            };
            let Some(mut next) = f(current.as_ref().map(|v| &v.entry)) else {
                return Ok(current);
            };
            if let Some(cur) = &current {
                let from = cur.entry.state();
                if !allowed(from, next.state()) {
                    return Ok(current);
                }
            }
            next.operation_id = operation_id.to_string();
            next.updated_at_unix_ms = crate::time::now_ms();
            let bytes: bytes::Bytes = next.encode_to_vec().into();
            let result = match &current {
                Some(cur) => self
                    .store(operation_id)
                    .update(operation_id, bytes, cur.revision)
                    .await
                    .map_err(|e| (e.kind() == kv::UpdateErrorKind::WrongLastRevision, e.to_string())),
                None => self
                    .store(operation_id)
                    .create(operation_id, bytes)
                    .await
                    .map_err(|e| (e.kind() == kv::CreateErrorKind::AlreadyExists, e.to_string())),
            };
            match result {
                Ok(revision) => return Ok(Some(Versioned { entry: next, revision })),
                Err((true, _)) => continue,
                Err((false, msg)) => return Err(LedgerError::Unavailable(msg)),
            }
        }
        Err(LedgerError::Contended(operation_id.to_string()))
    }

    /// Moves an operation to `state` (keeping every other field), if the transition is allowed.
    pub async fn set_state(
        &self,
        operation_id: &str,
        state: OperationState,
        reason: &str,
    ) -> Result<Option<LedgerEntry>, LedgerError> {
        self.update(operation_id, |cur| {
            let mut next = cur.cloned().unwrap_or_default();
            next.set_state(state);
            next.reason = reason.to_string();
            Some(next)
        })
        .await
    }

    /// Remembers which operation a wamid belongs to.
    pub async fn link_wamid(&self, wamid: &str, operation_id: &str) -> Result<(), LedgerError> {
        let key = wamid_key(wamid);
        self.wamid_store(&key)
            .put(key.as_str(), operation_id.to_string().into())
            .await
            .map(|_| ())
            .map_err(|e| LedgerError::Unavailable(e.to_string()))
    }

    /// Remembers which operation and which attempt a wamid belongs to, with the request that attempt sent: a
    /// `failed` status of that wamid is matched to its own attempt, and a new attempt (an asynchronous failure
    /// that Meta did not deliver, an operator's resend) sends the same request again. The dispatcher writes it
    /// after each accepted send (`dispatch.wamid_link`); BW_SEND no longer holds the request then.
    pub async fn link_attempt(&self, wamid: &str, link: &WamidLink) -> Result<(), LedgerError> {
        let key = wamid_key(wamid);
        self.wamid_store(&key)
            .put(key.as_str(), link.encode().into())
            .await
            .map(|_| ())
            .map_err(|e| LedgerError::Unavailable(e.to_string()))
    }

    /// The link of a wamid, if known ([`Ledger::link_attempt`]; a link written from a status alone holds the
    /// operation only).
    pub async fn wamid_link(&self, wamid: &str) -> Result<Option<WamidLink>, LedgerError> {
        let key = wamid_key(wamid);
        let value =
            self.wamid_store(&key).get(key.as_str()).await.map_err(|e| LedgerError::Unavailable(e.to_string()))?;
        Ok(value.map(|v| WamidLink::decode(&v)))
    }

    /// Remembers which operation a wamid belongs to unless that is already known: a KV create, which the
    /// server refuses without storing anything when the key exists. Status webhooks call this for every
    /// status, so the link costs one durable write per message, not one per status.
    pub async fn link_wamid_once(&self, wamid: &str, operation_id: &str) -> Result<(), LedgerError> {
        let key = wamid_key(wamid);
        match self.wamid_store(&key).create(key.as_str(), operation_id.to_string().into()).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == async_nats::jetstream::kv::CreateErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(LedgerError::Unavailable(e.to_string())),
        }
    }

    /// The operation a wamid belongs to, if known.
    pub async fn operation_for_wamid(&self, wamid: &str) -> Result<Option<String>, LedgerError> {
        Ok(self.wamid_link(wamid).await?.map(|l| l.operation_id))
    }

    /// Every operation id in the ledger (for accounting; reads every partition's whole bucket).
    pub async fn operation_ids(&self) -> Result<Vec<String>, LedgerError> {
        let mut out = Vec::new();
        for store in self.stores.iter() {
            let mut keys = store.keys().await.map_err(|e| LedgerError::Unavailable(e.to_string()))?;
            while let Some(key) = keys.next().await {
                out.push(key.map_err(|e| LedgerError::Unavailable(e.to_string()))?);
            }
        }
        Ok(out)
    }

    /// Every entry in the ledger (for accounting and reports).
    pub async fn entries(&self) -> Result<Vec<LedgerEntry>, LedgerError> {
        let mut out = Vec::new();
        for id in self.operation_ids().await? {
            if let Some(v) = self.get(&id).await? {
                out.push(v.entry);
            }
        }
        Ok(out)
    }
}

/// The bucket of `partitions` that holds `key` ([`bw_wire::names::ledger_partition`]).
fn partition_of<'a>(partitions: &'a [kv::Store], key: &str) -> &'a kv::Store {
    &partitions[bw_wire::names::ledger_partition(key, partitions.len())]
}

/// Where a wamid belongs: its operation, the attempt that sent it (0: unknown, a link written from a status),
/// and that attempt's request (encoded `SendRequest`; empty when unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WamidLink {
    pub operation_id: String,
    pub attempt: u32,
    pub request: Vec<u8>,
}

impl WamidLink {
    /// `<operation key>` alone (a link from a status, and every link written before attempts were kept), or
    /// `<operation key>\n<attempt>\n<request bytes>`. An operation key never holds a newline.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = format!("{}\n{}\n", self.operation_id, self.attempt).into_bytes();
        out.extend_from_slice(&self.request);
        out
    }

    pub fn decode(bytes: &[u8]) -> WamidLink {
        let mut parts = bytes.splitn(3, |b| *b == b'\n');
        let operation_id = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let attempt = parts.next().and_then(|a| std::str::from_utf8(a).ok()?.parse().ok()).unwrap_or(0);
        let request = parts.next().map(<[u8]>::to_vec).unwrap_or_default();
        WamidLink { operation_id, attempt, request }
    }

    /// The request of the attempt, if the link holds one that decodes.
    pub fn send_request(&self) -> Option<SendRequest> {
        (!self.request.is_empty()).then(|| SendRequest::decode(self.request.as_slice()).ok()).flatten()
    }
}

/// [`transition_allowed`], plus the new attempt of an operation Meta accepted and did not deliver (SENT or
/// FAILED back to QUEUED), or an operator's resend of an unknown outcome expired by policy (EXPIRED back to
/// QUEUED): [`Ledger::reopen`]. DELIVERED and READ never move back: the message reached a device.
pub fn reopen_allowed(from: OperationState, to: OperationState) -> bool {
    use OperationState::{Expired, Failed, Held, Queued, Sent};
    matches!((from, to), (Sent | Held | Failed | Expired, Queued)) || transition_allowed(from, to)
}

/// The pseudo-wamid under which the reconciler keeps the request of an operation it expired with its outcome
/// unknown (no wamid came back, so no link holds it): `bwctl op resend` reads it there (issue #40 item 6). A
/// real wamid never starts with `unknown-outcome:`.
pub fn unknown_outcome_link(operation_key: &str) -> String {
    format!("unknown-outcome:{operation_key}")
}

/// The key of a wamid's link to its operation in the wamid bucket: wamids hold characters KV keys refuse ('+',
/// '/', '='), so they are keyed by their hex sha256. Also what ingest logs in place of a wamid, which encodes
/// the recipient's number.
pub fn wamid_key(wamid: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(wamid.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use OperationState::*;

    #[test]
    fn a_reopen_never_moves_a_delivered_message_back() {
        for from in [Sent, Failed, Expired] {
            assert!(reopen_allowed(from, Queued), "{from:?}");
            assert!(!transition_allowed(from, Queued), "only a reopen moves {from:?} back");
        }
        for from in [Delivered, Read] {
            assert!(!reopen_allowed(from, Queued), "{from:?} is terminal");
        }
    }

    #[test]
    fn a_wamid_link_holds_its_attempt_and_request_and_reads_old_links() {
        let request = SendRequest { operation_id: "crm/op-1".into(), ..Default::default() };
        let link = WamidLink { operation_id: "crm/op-1".into(), attempt: 2, request: request.encode_to_vec() };
        let back = WamidLink::decode(&link.encode());
        assert_eq!(back, link);
        assert_eq!(back.send_request(), Some(request));
        // A link written from a status (or before attempts were kept) is the bare operation key.
        let old = WamidLink::decode(b"crm/op-1");
        assert_eq!((old.operation_id.as_str(), old.attempt, old.send_request()), ("crm/op-1", 0, None));
    }

    #[test]
    fn transitions_are_monotonic_once_meta_accepted() {
        let check = |from, to, expect| assert_eq!(transition_allowed(from, to), expect, "{from:?} -> {to:?}");
        check(Queued, Sent, true);
        check(Queued, Dlq, true);
        check(Dlq, Queued, true);
        check(Unknown, Sent, true);
        check(Unknown, Dlq, true);
        check(Sent, Delivered, true);
        check(Delivered, Read, true);
        check(Sent, Read, true);
        check(Read, Delivered, false);
        check(Read, Sent, false);
        check(Sent, Queued, false);
        check(Sent, Dlq, false);
        check(Delivered, Failed, true);
        check(Failed, Read, false);
        check(Expired, Queued, false);
        check(Expired, Dlq, false);
        check(Expired, Delivered, true);
        check(Sent, Sent, true);
    }
}
