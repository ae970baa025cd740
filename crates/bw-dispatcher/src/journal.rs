//! The wire journal (`dispatch.wire_guarantee = "journal"`, docs/decisions/wire-journal.md): instead of a ledger
//! write per send, each send partition's one owner appends a record naming the sends about to go on the wire.
//!
//! - [`Journals`]: every partition this dispatcher serves; a loop renews each partition's lease (KV
//!   `BW_WIRE_OWNERS`, every third of `wire_lease_ms`) and takes a partition over when it gets the lease. The
//!   fetch loop fetches only from partitions whose take-over is done ([`Journals::owns`]).
//! - [`PartJournal`]: one partition: its lease, the sequence of its last append, and its open attempts (journaled,
//!   no outcome yet). One appender task per partition takes whatever sends queued while the previous append was in
//!   flight (up to `journal_max_group`) and appends ONE record chained on the previous one
//!   (`Nats-Expected-Last-Sequence`): no send waits for a group to fill, and an append by a deposed owner fails.
//! - [`OnWire`]: the guard an append returns. Resolved once the send's outcome is durable (or the send went back
//!   unsent); dropped unresolved it leaves the attempt open and *abandoned*: a later delivery of the operation goes
//!   to BW_UNKNOWN instead of being sent again, as with an abandoned on-the-wire mark.
//!
//! Take-over: the new owner appends an OWNER record chained on the stream's last sequence (the old owner's next
//! append then fails), reads the last CHECKPOINT and the SENDS records after it, and keeps every attempt whose
//! ledger entry is still at the journaled revision as abandoned. A checkpoint lists every open attempt and the
//! highest sequence before the oldest open one, so a new owner never needs records before it.

use async_nats::jetstream::{self, context::PublishErrorKind, stream};
use bw_common::lease::{Change, Lease};
use bw_proto::v1::{WireAttempt, WireRecord, WireRecordKind};
use bw_wire::names::{WIRE_OWNERS_BUCKET, WireJournal};
use futures::future::BoxFuture;
use prost::Message as _;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

/// Whether an attempt of an operation is still open after a take-over: its ledger entry is QUEUED at the journaled
/// revision (no outcome since). Errors count as open (flagging unknown is the safe side).
pub(crate) type StillOpen = Arc<dyn Fn(String, u64) -> BoxFuture<'static, bool> + Send + Sync>;

/// Settings of the journals (from `dispatch`).
#[derive(Debug, Clone)]
pub(crate) struct JournalConfig {
    pub lease: Duration,
    pub max_group: usize,
    pub checkpoint: Duration,
    pub max_bytes: i64,
    pub replicas: usize,
    pub bucket_max_bytes: i64,
}

/// Why a send may not go on the wire now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// This dispatcher does not own the partition (never did, lost it, or was deposed by a failed append): the
    /// delivery goes back unacked for redelivery to the owner.
    NotOwner,
    /// The operation has an attempt under way in this process: a second live copy must not send.
    Live,
    /// The operation has an attempt journaled without an outcome by an owner that is gone: unknown outcome.
    Abandoned,
}

/// Counters of the journals, registered with the dispatcher's metrics.
#[derive(Clone, Default)]
pub(crate) struct JournalMetrics {
    pub appends: prometheus_client::metrics::counter::Counter,
    pub group_size: Option<prometheus_client::metrics::histogram::Histogram>,
    pub takeovers: prometheus_client::metrics::counter::Counter,
}

#[derive(Debug, Clone)]
struct Open {
    attempt: u32,
    revision: u64,
    /// Sequence of the record naming it; 0 while its append is under way.
    seq: u64,
    abandoned: bool,
}

#[derive(Default)]
struct PartState {
    /// Owned, taken over, and not deposed: appends may go.
    ready: bool,
    epoch: u64,
    /// The sequence the next append expects as the stream's last.
    last_seq: u64,
    open: HashMap<String, Open>,
    /// Open attempts per record sequence: the oldest bounds what a checkpoint covers.
    open_seqs: BTreeMap<u64, usize>,
    appended_since_checkpoint: bool,
}

impl PartState {
    fn close(&mut self, op: &str, seq: u64) {
        if self.open.get(op).is_some_and(|o| o.seq == seq) {
            self.open.remove(op);
            if seq > 0
                && let Some(n) = self.open_seqs.get_mut(&seq)
            {
                *n -= 1;
                if *n == 0 {
                    self.open_seqs.remove(&seq);
                }
            }
        }
    }

    /// The highest sequence whose attempts are all settled: just below the oldest open record.
    fn settled_through(&self) -> u64 {
        match self.open_seqs.keys().next() {
            Some(oldest) => oldest - 1,
            None => self.last_seq,
        }
    }

    fn open_attempts(&self) -> Vec<WireAttempt> {
        let mut v: Vec<WireAttempt> = self
            .open
            .iter()
            .filter(|(_, o)| o.seq > 0)
            .map(|(op, o)| WireAttempt { operation_id: op.clone(), attempt: o.attempt, ledger_revision: o.revision })
            .collect();
        v.sort_by(|a, b| a.operation_id.cmp(&b.operation_id));
        v
    }
}

struct Pending {
    attempt: WireAttempt,
    reply: oneshot::Sender<Result<u64, Refusal>>,
}

/// The journal of one send partition.
pub(crate) struct PartJournal {
    names: WireJournal,
    js: jetstream::Context,
    lease: Lease,
    cfg: JournalConfig,
    state: Mutex<PartState>,
    queue: Mutex<Vec<Pending>>,
    queued: Notify,
    metrics: JournalMetrics,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A send's journal entry: resolve it once the send's outcome is durable, or when it went back unsent.
pub(crate) struct OnWire {
    part: Arc<PartJournal>,
    op: String,
    seq: u64,
    resolved: AtomicBool,
}

impl OnWire {
    /// The attempt is settled: the next checkpoint no longer lists it.
    pub(crate) fn resolve(&self) {
        if !self.resolved.swap(true, Ordering::SeqCst) {
            lock(&self.part.state).close(&self.op, self.seq);
        }
    }
}

impl Drop for OnWire {
    // Unresolved (the outcome could not be written): the attempt stays open, and a later delivery of the
    // operation goes to BW_UNKNOWN instead of being sent again.
    fn drop(&mut self) {
        if !self.resolved.load(Ordering::SeqCst)
            && let Some(o) = lock(&self.part.state).open.get_mut(&self.op)
            && o.seq == self.seq
        {
            o.abandoned = true;
        }
    }
}

impl PartJournal {
    /// Whether appends may go now: taken over, not deposed, and the lease's local deadline not passed.
    pub(crate) fn ready(&self) -> bool {
        lock(&self.state).ready && self.lease.is_held()
    }

    /// Journals a send and waits for its record to be stored; the POST may start once this returns Ok.
    pub(crate) async fn append(self: &Arc<Self>, op: &str, attempt: u32, revision: u64) -> Result<OnWire, Refusal> {
        let (tx, rx) = oneshot::channel();
        {
            let mut state = lock(&self.state);
            if !state.ready || !self.lease.is_held() {
                return Err(Refusal::NotOwner);
            }
            if let Some(o) = state.open.get(op) {
                return Err(if o.abandoned { Refusal::Abandoned } else { Refusal::Live });
            }
            // The placeholder (seq 0) refuses a second copy while this append is under way.
            state.open.insert(op.to_string(), Open { attempt, revision, seq: 0, abandoned: false });
        }
        let attempt = WireAttempt { operation_id: op.to_string(), attempt, ledger_revision: revision };
        lock(&self.queue).push(Pending { attempt, reply: tx });
        self.queued.notify_one();
        let seq = rx.await.unwrap_or(Err(Refusal::NotOwner))?;
        Ok(OnWire { part: self.clone(), op: op.to_string(), seq, resolved: AtomicBool::new(false) })
    }

    /// A guard over an abandoned attempt of `op`, so the move to BW_UNKNOWN resolves it once it is durable.
    pub(crate) fn take_abandoned(self: &Arc<Self>, op: &str) -> Option<OnWire> {
        let state = lock(&self.state);
        let o = state.open.get(op).filter(|o| o.abandoned)?;
        Some(OnWire { part: self.clone(), op: op.to_string(), seq: o.seq, resolved: AtomicBool::new(false) })
    }

    /// Appends `record` chained on the last append; Err when the chain or the stream refused it (deposed).
    async fn publish(&self, subject: String, record: WireRecord, expected: u64) -> Result<u64, String> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Expected-Last-Sequence", expected.to_string().as_str());
        let id = format!("{}.{}.{}", self.lease.instance(), record.epoch, expected);
        headers.insert("Nats-Msg-Id", id.as_str());
        let ack = self
            .js
            .publish_with_headers(subject, headers, record.encode_to_vec().into())
            .await
            .map_err(|e| e.to_string())?
            .await;
        match ack {
            Ok(ack) => Ok(ack.sequence),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Err(format!("deposed: {e}")),
            Err(e) => Err(e.to_string()),
        }
    }

    fn record(&self, kind: WireRecordKind, epoch: u64, attempts: Vec<WireAttempt>, settled: u64) -> WireRecord {
        WireRecord {
            kind: kind as i32,
            owner: self.lease.instance().to_string(),
            epoch,
            attempts,
            settled_through: settled,
            at_unix_ms: bw_common::time::now_ms(),
        }
    }

    /// Appends one SENDS record for everything queued (up to `max_group`) and wakes its callers.
    async fn append_group(&self) -> bool {
        let group: Vec<Pending> = {
            let mut queue = lock(&self.queue);
            let n = queue.len().min(self.cfg.max_group);
            queue.drain(..n).collect()
        };
        if group.is_empty() {
            return false;
        }
        let (ready, epoch, expected) = {
            let s = lock(&self.state);
            (s.ready && self.lease.is_held(), s.epoch, s.last_seq)
        };
        let attempts: Vec<WireAttempt> = group.iter().map(|p| p.attempt.clone()).collect();
        let result = if ready {
            self.publish(self.names.sends_subject(), self.record(WireRecordKind::Sends, epoch, attempts, 0), expected)
                .await
        } else {
            Err("not the owner".to_string())
        };
        let mut state = lock(&self.state);
        match result {
            Ok(seq) => {
                state.last_seq = seq;
                state.appended_since_checkpoint = true;
                for p in &group {
                    if let Some(o) = state.open.get_mut(&p.attempt.operation_id)
                        && o.seq == 0
                    {
                        o.seq = seq;
                    }
                }
                *state.open_seqs.entry(seq).or_default() += group.len();
                drop(state);
                self.metrics.appends.inc();
                if let Some(h) = &self.metrics.group_size {
                    h.observe(group.len() as f64);
                }
                for p in group {
                    let _ = p.reply.send(Ok(seq));
                }
            }
            Err(e) => {
                // A failed append may mean another owner took over: stop appending until this instance takes
                // the partition over again (its own lease, if still its, is adopted at the next renewal).
                if state.ready {
                    tracing::warn!(stream = %self.names.stream(), error = %e, "wire journal append failed; \
                        partition given up until taken over again");
                }
                state.ready = false;
                for p in &group {
                    state.close(&p.attempt.operation_id, 0);
                }
                drop(state);
                self.lease.forget();
                for p in group {
                    let _ = p.reply.send(Err(Refusal::NotOwner));
                }
            }
        }
        true
    }

    /// Appends a checkpoint when anything was appended since the last one.
    async fn checkpoint(&self) {
        let (record, expected) = {
            let mut s = lock(&self.state);
            if !s.ready || !s.appended_since_checkpoint || !self.lease.is_held() {
                return;
            }
            s.appended_since_checkpoint = false;
            let record = self.record(WireRecordKind::Checkpoint, s.epoch, s.open_attempts(), s.settled_through());
            (record, s.last_seq)
        };
        match self.publish(self.names.checkpoint_subject(), record, expected).await {
            Ok(seq) => {
                let mut s = lock(&self.state);
                if s.last_seq == expected {
                    s.last_seq = seq;
                }
            }
            Err(e) => {
                tracing::warn!(stream = %self.names.stream(), error = %e, "wire journal checkpoint failed");
                lock(&self.state).ready = false;
                self.lease.forget();
            }
        }
    }

    /// The appender: one append at a time, the group being whatever queued meanwhile; a checkpoint every
    /// `journal_checkpoint_ms`, also under constant load.
    async fn run_appender(self: Arc<Self>, stop: CancellationToken) {
        let mut next_checkpoint = tokio::time::Instant::now() + self.cfg.checkpoint;
        while !stop.is_cancelled() {
            if tokio::time::Instant::now() >= next_checkpoint {
                self.checkpoint().await;
                next_checkpoint = tokio::time::Instant::now() + self.cfg.checkpoint;
            }
            if self.append_group().await {
                continue;
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.queued.notified() => {}
                _ = tokio::time::sleep_until(next_checkpoint) => {}
            }
        }
        let mut queue = lock(&self.queue);
        for p in queue.drain(..) {
            let _ = p.reply.send(Err(Refusal::NotOwner));
        }
    }

    /// Takes the partition over after its lease was taken: OWNER record, tail read, open attempts rebuilt.
    async fn take_over(&self, still_open: &StillOpen) -> anyhow::Result<()> {
        let epoch = self.lease.revision().unwrap_or(0);
        let mut stream = self.js.get_stream(self.names.stream()).await?;
        // Chained on the stream's last sequence: if the old owner appends first, read again and retry.
        let mut owner_seq = None;
        for _ in 0..5 {
            let last = stream.info().await?.state.last_sequence;
            let record = self.record(WireRecordKind::Owner, epoch, Vec::new(), 0);
            match self.publish(self.names.owner_subject(), record, last).await {
                Ok(seq) => {
                    owner_seq = Some(seq);
                    break;
                }
                Err(e) => tracing::debug!(stream = %self.names.stream(), error = %e, "owner record raced; again"),
            }
        }
        let owner_seq = owner_seq.ok_or_else(|| anyhow::anyhow!("cannot append the owner record"))?;
        let mut candidates: HashMap<String, (WireAttempt, u64)> = HashMap::new();
        let first = stream.info().await?.state.first_sequence;
        let mut start = first;
        if let Ok(m) = stream.get_last_raw_message_by_subject(&self.names.checkpoint_subject()).await
            && m.sequence < owner_seq
        {
            let cp = WireRecord::decode(m.payload.as_ref())?;
            for a in cp.attempts {
                candidates.insert(a.operation_id.clone(), (a, m.sequence));
            }
            start = m.sequence + 1;
        }
        for seq in start.max(first)..owner_seq {
            let Ok(m) = stream.get_raw_message(seq).await else { continue };
            if m.subject.as_str() != self.names.sends_subject() {
                continue;
            }
            for a in WireRecord::decode(m.payload.as_ref())?.attempts {
                candidates.insert(a.operation_id.clone(), (a, seq));
            }
        }
        let mut open = HashMap::new();
        let mut open_seqs: BTreeMap<u64, usize> = BTreeMap::new();
        for (op, (a, seq)) in candidates {
            if still_open(op.clone(), a.ledger_revision).await {
                open.insert(op, Open { attempt: a.attempt, revision: a.ledger_revision, seq, abandoned: true });
                *open_seqs.entry(seq).or_default() += 1;
            }
        }
        let abandoned = open.len();
        {
            let mut s = lock(&self.state);
            // Attempts of this process still under way (a re-take after a failed append) stay as they are.
            for (op, o) in std::mem::take(&mut s.open) {
                if !o.abandoned && o.seq > 0 {
                    *open_seqs.entry(o.seq).or_default() += 1;
                    open.insert(op, o);
                }
            }
            *s =
                PartState { ready: true, epoch, last_seq: owner_seq, open, open_seqs, appended_since_checkpoint: true };
        }
        self.metrics.takeovers.inc();
        tracing::info!(stream = %self.names.stream(), epoch, abandoned, "wire journal partition taken over; \
            abandoned attempts go to BW_UNKNOWN when redelivered");
        Ok(())
    }

    async fn step_lease(&self, still_open: &StillOpen) {
        let change = self.lease.step().await;
        if change == Change::Lost {
            tracing::warn!(stream = %self.names.stream(), "wire journal lease lost");
            lock(&self.state).ready = false;
            return;
        }
        let ready = lock(&self.state).ready;
        if self.lease.is_held() && (change == Change::Acquired || !ready) {
            if let Err(e) = self.take_over(still_open).await {
                tracing::warn!(stream = %self.names.stream(), error = %e, "wire journal take-over failed; retried");
                lock(&self.state).ready = false;
            }
        } else if !self.lease.is_held() && ready {
            lock(&self.state).ready = false;
        }
    }
}

/// The error of a delivery whose operation an earlier owner of the partition journaled without an outcome: it goes
/// to BW_UNKNOWN, flagged, as a delivery finding an abandoned on-the-wire mark does.
pub(crate) fn abandoned_error() -> bw_proto::v1::ErrorInfo {
    bw_proto::v1::ErrorInfo {
        details: "an earlier owner of its send partition journaled a try without an outcome; outcome unknown".into(),
        at_unix_ms: bw_common::time::now_ms(),
        ..Default::default()
    }
}

/// The crash-point hook of the resilience tests: with `BW_DISPATCHER_CRASH_POINT=<at>` the process aborts at
/// `at` (`after_journal`, `after_post`, `after_outcome`). Debug builds only.
#[cfg(debug_assertions)]
pub(crate) fn crash_point(at: &str) {
    static POINT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if POINT.get_or_init(|| std::env::var("BW_DISPATCHER_CRASH_POINT").ok()).as_deref() == Some(at) {
        eprintln!("BW_DISPATCHER_CRASH_POINT={at}: aborting");
        std::process::abort();
    }
}

/// Release builds: no crash points.
#[cfg(not(debug_assertions))]
pub(crate) fn crash_point(_at: &str) {}

/// The journals of every partition this dispatcher serves.
#[derive(Clone)]
pub(crate) struct Journals {
    parts: Arc<HashMap<usize, Arc<PartJournal>>>,
    cfg: JournalConfig,
}

/// The stream config of a partition's journal.
pub(crate) fn stream_config(names: WireJournal, cfg: &JournalConfig) -> stream::Config {
    stream::Config {
        name: names.stream(),
        description: Some("wire journal: sends about to go on the wire (dispatch.wire_guarantee = journal)".into()),
        subjects: vec![names.subjects()],
        storage: stream::StorageType::File,
        num_replicas: cfg.replicas.max(1),
        max_bytes: cfg.max_bytes,
        discard: stream::DiscardPolicy::Old,
        duplicate_window: Duration::from_secs(60),
        ..Default::default()
    }
}

impl Journals {
    /// Opens the owners bucket and each partition's journal stream (creating them if needed); owns nothing yet.
    pub(crate) async fn open(
        js: &jetstream::Context,
        partitions: &[usize],
        instance: &str,
        cfg: JournalConfig,
        metrics: JournalMetrics,
    ) -> anyhow::Result<Journals> {
        let store = bw_common::lease::open_bucket(
            js,
            WIRE_OWNERS_BUCKET,
            "wire-journal partition leases",
            cfg.lease,
            cfg.replicas,
            cfg.bucket_max_bytes,
        )
        .await?;
        let mut parts = HashMap::new();
        for &p in partitions {
            let names = WireJournal(p);
            let wanted = stream_config(names, &cfg);
            let mut stream = js.get_or_create_stream(wanted.clone()).await?;
            let have = stream.info().await?.config.clone();
            if have.max_bytes != wanted.max_bytes {
                js.update_stream(stream::Config { max_bytes: wanted.max_bytes, ..have }).await?;
            }
            let lease = Lease::new(store.clone(), names.owner_key(), instance.to_string(), cfg.lease);
            parts.insert(
                p,
                Arc::new(PartJournal {
                    names,
                    js: js.clone(),
                    lease,
                    cfg: cfg.clone(),
                    state: Mutex::new(PartState::default()),
                    queue: Mutex::new(Vec::new()),
                    queued: Notify::new(),
                    metrics: metrics.clone(),
                }),
            );
        }
        Ok(Journals { parts: Arc::new(parts), cfg })
    }

    /// Starts the appenders and the lease loop (every third of the lease) until `stop`. The leases are not given
    /// back here: a graceful stop calls [`Journals::release`] once its in-flight sends settled.
    pub(crate) fn spawn(&self, still_open: StillOpen, stop: CancellationToken) {
        for part in self.parts.values() {
            tokio::spawn(part.clone().run_appender(stop.clone()));
        }
        let parts = self.parts.clone();
        let renew = self.cfg.lease / 3;
        tokio::spawn(async move {
            let mut every = tokio::time::interval(renew);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = every.tick() => {}
                }
                let steps = parts.values().map(|p| p.step_lease(&still_open));
                futures::future::join_all(steps).await;
            }
        });
    }

    /// Gives every lease back (graceful stop, after the loops stopped), so other dispatchers take over at once.
    pub(crate) async fn release(&self) {
        for p in self.parts.values() {
            lock(&p.state).ready = false;
            p.lease.release().await;
        }
    }

    /// The journal of `partition`, when this dispatcher serves it.
    pub(crate) fn part(&self, partition: usize) -> Option<&Arc<PartJournal>> {
        self.parts.get(&partition)
    }

    /// Whether this dispatcher owns `partition` now and may fetch from it.
    pub(crate) fn owns(&self, partition: usize) -> bool {
        self.parts.get(&partition).is_some_and(|p| p.ready())
    }
}

#[cfg(test)]
mod tests;
