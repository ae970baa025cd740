//! NATS connection and the JetStream topology every service relies on.
//!
//! [`ensure_topology`] creates every stream and KV bucket idempotently; every service calls it at start, so
//! any start order works. Names come from [`bw_wire::names`].

use crate::config::{NatsConfig, StreamLimits, redact_url};
use async_nats::jetstream::{self, kv, stream};
use bw_wire::names;
use std::time::Duration;

/// Connects to NATS, retrying the first connection for up to `wait`; later disconnects reconnect forever.
pub async fn connect(cfg: &NatsConfig, default_name: &str, wait: Duration) -> anyhow::Result<async_nats::Client> {
    Ok(connect_watched(cfg, default_name, wait).await?.0)
}

/// What the broker refused a connection: the last permissions violation it reported for a JetStream API request
/// or a subscription (the kinds a start-up step makes), and when. A user missing a right the service needs is a
/// deployment error that retrying cannot mend: start-up steps stop at once and name it ([`Refusals::since`]).
#[derive(Clone, Default)]
pub struct Refusals(std::sync::Arc<std::sync::Mutex<Option<(std::time::Instant, String)>>>);

impl Refusals {
    /// The last refusal reported at or after `t`.
    pub fn since(&self, t: std::time::Instant) -> Option<String> {
        let last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref().filter(|(at, _)| *at >= t).map(|(_, what)| what.clone())
    }

    pub(crate) fn note(&self, what: String) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((std::time::Instant::now(), what));
    }
}

/// Logs what the server reports to this connection; permissions violations at error level (they name a subject,
/// never a credential), and those of start-up kinds are kept in `refusals`.
fn on_event(refusals: &Refusals, event: async_nats::Event) {
    match event {
        async_nats::Event::ServerError(async_nats::ServerError::Other(what))
            if what.to_ascii_lowercase().contains("permissions violation") =>
        {
            tracing::error!(refused = %what, "NATS refused this service a permission (its user in accounts.conf)");
            if what.contains("$JS.API") || what.contains("Subscription to") {
                refusals.note(what);
            }
        }
        async_nats::Event::ServerError(e) => tracing::warn!(error = %e, "NATS server reported an error"),
        other => tracing::debug!(event = %other, "nats connection event"),
    }
}

/// [`connect`], with what the server refuses this connection ([`Refusals`]).
pub async fn connect_watched(
    cfg: &NatsConfig,
    default_name: &str,
    wait: Duration,
) -> anyhow::Result<(async_nats::Client, Refusals)> {
    let refusals = Refusals::default();
    let name = if cfg.name.is_empty() { default_name.to_string() } else { cfg.name.clone() };
    let urls: Vec<async_nats::ServerAddr> = cfg
        .url
        .split(',')
        .map(|u| u.trim().parse())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("invalid nats url `{}`: {e}", redact_url(&cfg.url)))?;
    // Credentials in the URL (`nats://user:password@host:4222`, NATS accounts) are not used by the client on
    // their own: pass them explicitly. Errors show the URL without them.
    let credentials = urls.iter().find(|u| u.has_user_pass()).and_then(|u| Some((u.username()?, u.password()?)));
    let shown = redact_url(&cfg.url);
    // A CA file that cannot be read is a deployment error: say so now instead of retrying through the budget.
    if !cfg.tls_ca_file.is_empty() {
        std::fs::metadata(&cfg.tls_ca_file)
            .map_err(|e| anyhow::anyhow!("nats.tls_ca_file `{}` cannot be read: {e}", cfg.tls_ca_file))?;
    }
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let options = match credentials {
            Some((user, password)) => async_nats::ConnectOptions::with_user_and_password(user.into(), password.into()),
            None => async_nats::ConnectOptions::new(),
        };
        let options =
            if cfg.inbox_prefix.is_empty() { options } else { options.custom_inbox_prefix(cfg.inbox_prefix.as_str()) };
        let options = if cfg.tls_ca_file.is_empty() {
            options
        } else {
            options.add_root_certificates(cfg.tls_ca_file.clone().into()).require_tls(true)
        };
        let watch = refusals.clone();
        let attempt = options
            .event_callback(move |event| {
                on_event(&watch, event);
                async {}
            })
            .name(&name)
            .connection_timeout(Duration::from_secs(2))
            .max_reconnects(None)
            .connect(urls.clone())
            .await;
        match attempt {
            Ok(client) => return Ok((client, refusals)),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "nats not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(anyhow::anyhow!("nats not reachable at {shown}: {e}")),
        }
    }
}

#[cfg(test)]
mod tls_tests {
    /// A CA file that cannot be read fails the connection at once, naming the setting.
    #[tokio::test]
    async fn an_unreadable_ca_file_is_named_at_once() {
        let cfg = crate::config::NatsConfig {
            tls_ca_file: "/nonexistent/bw-nats-ca.crt".into(),
            ..crate::config::NatsConfig::single("nats://127.0.0.1:1", "test")
        };
        let error =
            super::connect(&cfg, "test", std::time::Duration::from_secs(600)).await.err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("nats.tls_ca_file `/nonexistent/bw-nats-ca.crt` cannot be read")));
    }
}

/// Handles to the KV buckets, opened once by [`ensure_topology`].
#[derive(Clone)]
pub struct Buckets {
    /// Operation ledger, one bucket per partition (index = [`names::ledger_partition`]); read and write it
    /// through [`crate::ledger::Ledger`], which picks the partition.
    pub ledger: Vec<kv::Store>,
    /// wamid → operation id, one bucket per ledger partition (through [`crate::ledger::Ledger`]).
    pub wamid: Vec<kv::Store>,
    /// Scope states written by the coordinator.
    pub scopes: kv::Store,
    /// Webhook dedup keys.
    pub webhook_dedup: kv::Store,
    /// How BW_SEND is split, as its partition 0 records it (checked against `nats.send_partitions` by
    /// [`ensure_topology`]): every reader and writer of BW_SEND finds a sender's stream and subjects here.
    pub send: names::SendPartitions,
}

/// A work queue: a message leaves once its consumer acks it. Every one of them refuses a publish when full
/// (DiscardNew): each holds messages that must not be lost, and the writer reports the refusal (ingest answers
/// the producer, a mover naks and keeps the message where it is, a webhook gets a 503 that Meta retries).
fn work_stream(
    name: &str,
    subjects: Vec<String>,
    (max_msgs, max_bytes): (i64, i64),
    replicas: usize,
    dedup: Duration,
) -> stream::Config {
    stream::Config {
        name: name.to_string(),
        subjects,
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        discard: stream::DiscardPolicy::New,
        max_messages: max_msgs,
        max_bytes,
        num_replicas: replicas,
        duplicate_window: dedup,
        ..Default::default()
    }
}

/// A record kept for readers until its age or size limit. DiscardOld unless the caller says otherwise: at
/// the limit its oldest messages go, as they do at `max_age`.
fn kept_stream(
    name: &str,
    subjects: Vec<String>,
    (max_msgs, max_bytes): (i64, i64),
    max_age: Duration,
    replicas: usize,
) -> stream::Config {
    stream::Config {
        name: name.to_string(),
        subjects,
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        discard: stream::DiscardPolicy::Old,
        max_messages: max_msgs,
        max_bytes,
        max_age,
        num_replicas: replicas,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    }
}

/// Every stream config of the topology (used by [`ensure_topology`] and by tests), BW_SEND and BW_DLQ split into
/// `send` partitions (BW_SEND's description records how many: [`send_partitions_of`]). Each partition holds up
/// to `send_max_msgs` and `send_max_bytes` (`dlq_max_*`).
pub fn stream_configs(limits: &StreamLimits, replicas: usize, send: names::SendPartitions) -> Vec<stream::Config> {
    let day = Duration::from_secs(24 * 3600);
    let dedup = Duration::from_secs(limits.dedup_window_s.max(1));
    let send_streams = send.all().map(|partition| stream::Config {
        description: Some(send_description(partition, send.count())),
        ..work_stream(
            &names::SendPartitions::stream(partition),
            vec![names::SendPartitions::stream_subjects(partition)],
            (limits.send_max_msgs, limits.send_max_bytes),
            replicas,
            dedup,
        )
    });
    // The DLQ follows the send partitions (a sender's dead letters in the same partition number).
    let dlq_streams = send.all().map(|partition| stream::Config {
        description: Some(format!("Breakwater dead-letter partition {partition} of {}", send.count())),
        ..work_stream(
            &names::SendPartitions::dlq_stream(partition),
            vec![names::SendPartitions::dlq_all(partition)],
            (limits.dlq_max_msgs, limits.dlq_max_bytes),
            replicas,
            dedup,
        )
    });
    send_streams
        .chain(dlq_streams)
        .chain([
            work_stream(
                names::UNKNOWN_STREAM,
                vec![names::UNKNOWN_ALL.into()],
                (limits.dlq_max_msgs, limits.unknown_max_bytes),
                replicas,
                dedup,
            ),
            work_stream(
                names::WEBHOOK_STREAM,
                vec![names::WEBHOOK_SUBJECT.into()],
                (limits.send_max_msgs, limits.webhook_max_bytes),
                replicas,
                Duration::from_secs(600),
            ),
            // Quarantine keeps everything until an operator acts: DiscardNew so nothing is dropped silently.
            stream::Config {
                discard: stream::DiscardPolicy::New,
                ..kept_stream(
                    names::QUARANTINE_STREAM,
                    vec![names::QUARANTINE_ALL.into()],
                    (limits.quarantine_max_msgs, limits.quarantine_max_bytes),
                    Duration::ZERO,
                    replicas,
                )
            },
            // Inspection copies of refused input: a flood of bad requests replaces older copies instead of
            // filling the disk or refusing the producer's precise answer.
            kept_stream(
                names::REJECTED_STREAM,
                vec![names::REJECTED_ALL.into()],
                (1_000_000, limits.rejected_max_bytes),
                7 * day,
                replicas,
            ),
            // Customers' messages for the business's readers, 7 days at most: a reader further behind than the
            // byte limit loses the oldest, as one 7 days behind does. DiscardNew would stall webhook processing,
            // and with it the statuses of outbound messages, until the reader caught up.
            kept_stream(
                names::INBOUND_STREAM,
                vec![names::INBOUND_ALL.into()],
                (10_000_000, limits.inbound_max_bytes),
                7 * day,
                replicas,
            ),
            // Meta's account signals: few, and each one may hold a WABA for weeks; 30 days of them are the record
            // behind every webhook pause (`bwctl`, the runbook). DiscardOld at the byte limit, as BW_EVENTS.
            kept_stream(
                names::ACCOUNT_STREAM,
                vec![names::ACCOUNT_SUBJECTS.into()],
                (1_000_000, limits.events_max_bytes),
                30 * day,
                replicas,
            ),
            // Breaker, signal and alert events, read live by the services; a day of history is a convenience.
            kept_stream(
                names::EVENTS_STREAM,
                names::EVENTS_SUBJECTS.iter().map(|s| s.to_string()).collect(),
                (10_000_000, limits.events_max_bytes),
                day,
                replicas,
            ),
        ])
        .collect()
}

/// The description a BW_SEND partition's stream is created with; it records the partition count, which
/// [`send_partitions_of`] reads back.
fn send_description(partition: usize, partitions: usize) -> String {
    format!("Breakwater send partition {partition} of {partitions}")
}

/// The partition count BW_SEND was created with: the number in its (partition 0's) description, 1 for a stream
/// created before partitions existed (no description).
pub fn send_partitions_of(info: &stream::Info) -> Option<names::SendPartitions> {
    partitions_in(info.config.description.as_deref()).map(names::SendPartitions::new)
}

/// The count in a partition's description (`… partition <i> of <N>`); 1 without a description.
fn partitions_in(description: Option<&str>) -> Option<usize> {
    match description.unwrap_or_default() {
        "" => Some(1),
        d => d.rsplit_once(" of ").and_then(|(_, n)| n.trim().parse().ok()),
    }
}

/// Reads how BW_SEND is split from its partition 0 (tools that do not create the topology: bwctl, the drill).
pub async fn send_partitions(js: &jetstream::Context) -> anyhow::Result<names::SendPartitions> {
    let stream = js
        .get_stream(names::SEND_STREAM)
        .await
        .map_err(|e| anyhow::anyhow!("stream `{}` not found ({e}); is Breakwater running?", names::SEND_STREAM))?;
    send_partitions_of(stream.cached_info())
        .ok_or_else(|| anyhow::anyhow!("stream `{}` does not say how many send partitions exist", names::SEND_STREAM))
}

/// One dispatcher lane consumer of a BW_SEND partition, as read ([`dispatcher_lanes`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaneReading {
    /// Messages of the lane not yet delivered to any dispatcher.
    pub undelivered: u64,
    /// Pull requests dispatchers have outstanding on it (an idle dispatcher keeps one parked).
    pub waiting: u64,
    /// The last delivery to a dispatcher (unix ms), if any.
    pub last: Option<i64>,
}

/// The dispatcher lane consumers (`dispatcher-rh`, `-hi`, `-lo`, `-rp`) of one BW_SEND partition's stream: one
/// reading per consumer that exists (a lane no dispatcher has made its consumer for yet is absent). Any other
/// failure than "not found" is an error: the caller cannot tell a served partition from an unserved one.
pub async fn dispatcher_lanes(
    stream: &stream::Stream,
) -> Result<Vec<LaneReading>, jetstream::context::ConsumerInfoError> {
    use jetstream::context::ConsumerInfoErrorKind;
    let mut lanes = Vec::new();
    for lane in names::Lane::ALL {
        match stream.consumer_info(lane.dispatcher_consumer()).await {
            Ok(info) => lanes.push(LaneReading {
                undelivered: info.num_pending,
                waiting: info.num_waiting as u64,
                last: info.delivered.last_active.map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64),
            }),
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(lanes)
}

/// The stream behind a KV bucket, as the client library would create it, except for direct gets: a
/// replicated bucket (more than one replica) answers reads from its stream leader only.
///
/// Why: with direct gets every replica answers reads, and a NATS client's request goes to a replica on the
/// server it is connected to first. A follower that lags behind (after a leader change, for example when a node
/// dies) then answers that client with old revisions, again and again. Breakwater reads before each
/// compare-and-set of the ledger, the leases and the leader key; fed an old revision, every compare-and-set
/// fails, and the read that should repair it is old again, for as long as the follower lags (the NATS project
/// names turning direct gets off as the way to read-after-write on a KV). A single-replica bucket has nothing
/// to lag behind and keeps direct gets.
pub fn kv_stream_config(config: &kv::Config) -> stream::Config {
    let replicas = config.num_replicas.max(1);
    stream::Config {
        name: format!("KV_{}", config.bucket),
        description: (!config.description.is_empty()).then(|| config.description.clone()),
        subjects: vec![format!("$KV.{}.>", config.bucket)],
        max_messages_per_subject: config.history.max(1),
        max_bytes: config.max_bytes,
        max_age: config.max_age,
        max_message_size: config.max_value_size,
        storage: config.storage,
        allow_rollup: true,
        deny_delete: true,
        deny_purge: false,
        allow_direct: replicas == 1,
        num_replicas: replicas,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    }
}

/// Opens a KV bucket, creating it first if missing (see [`kv_stream_config`]); safe from many instances at
/// once. A replicated bucket that an earlier version created with direct gets is switched to leader reads
/// (a stream update; where the NATS user may not update it, a warning says what to do).
pub async fn open_bucket(js: &jetstream::Context, config: kv::Config) -> anyhow::Result<kv::Store> {
    open_bucket_watched(js, config, &|| false).await
}

/// [`open_bucket`], giving up as soon as `refused()` says the broker refused this connection a permission: each
/// refused request waits out the client's timeout, and 40 looks at two each stalled start-up for 14 minutes.
pub async fn open_bucket_watched(
    js: &jetstream::Context,
    config: kv::Config,
    refused: &(dyn Fn() -> bool + Sync),
) -> anyhow::Result<kv::Store> {
    let bucket = config.bucket.clone();
    // On a cluster a stream just created (here or by another instance starting at the same time) can answer
    // "not found" for a moment, and a cluster still electing leaders lets requests time out: look again for a
    // while.
    let mut tries = 0;
    let store = loop {
        match js.get_key_value(&bucket).await {
            Ok(store) => break store,
            Err(get_err) => {
                let created = js.create_stream(kv_stream_config(&config)).await;
                if tries >= 40 || refused() {
                    let detail = created.err().map(|e| e.to_string()).unwrap_or_else(|| get_err.to_string());
                    return Err(anyhow::anyhow!("cannot open kv bucket `{bucket}`: {detail}{}", storage_hint(&detail)));
                }
                tries += 1;
                // Right after our own create, look at once; otherwise give the cluster a moment.
                if created.is_err() || tries > 1 {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    };
    let info = store.stream.cached_info();
    if info.config.num_replicas > 1 && info.config.allow_direct {
        let mut leader_reads = info.config.clone();
        leader_reads.allow_direct = false;
        match js.update_stream(leader_reads).await {
            Ok(_) => {
                tracing::info!(bucket = %bucket, "replicated kv bucket switched to leader reads (direct gets off)");
                return js
                    .get_key_value(&bucket)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot open kv bucket `{bucket}`: {e}"));
            }
            Err(e) => tracing::warn!(
                bucket = %bucket,
                error = %e,
                "replicated kv bucket still answers reads from every replica (direct gets): a lagging replica can \
                 stall compare-and-set updates after a leader change; as an operator, set allow_direct to false on \
                 its stream once (deploy/runbooks/service-down.md)"),
        }
    }
    Ok(store)
}

/// Creates every stream and KV bucket if missing (idempotent, safe from many instances at once).
pub async fn ensure_topology(js: &jetstream::Context, cfg: &NatsConfig) -> anyhow::Result<Buckets> {
    ensure_topology_watched(js, cfg, &|| false).await
}

/// [`ensure_topology`], giving up as soon as `refused()` says the broker refused this connection a permission
/// ([`open_bucket_watched`]).
pub async fn ensure_topology_watched(
    js: &jetstream::Context,
    cfg: &NatsConfig,
    refused: &(dyn Fn() -> bool + Sync),
) -> anyhow::Result<Buckets> {
    let open_bucket = |js, config| open_bucket_watched(js, config, refused);
    let send = names::SendPartitions::new(cfg.send_partitions);
    for config in stream_configs(&cfg.limits, cfg.replicas, send) {
        let name = config.name.clone();
        let mut tries = 0;
        loop {
            match js.get_or_create_stream(config.clone()).await {
                Ok(stream) => {
                    if name == names::SEND_STREAM {
                        check_send_partitions(stream.cached_info(), send)?;
                    }
                    break;
                }
                Err(e) if tries < 20 && !refused() => {
                    tries += 1;
                    tracing::debug!(stream = %name, error = %e, "stream not ready; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(anyhow::anyhow!("cannot create stream `{name}`: {e}{}", storage_hint(&e))),
            }
        }
    }
    let partitions = cfg.ledger_partitions.max(1);
    let mut configs = bucket_configs(cfg).into_iter();
    let mut next = || configs.next().ok_or_else(|| anyhow::anyhow!("bucket_configs lists too few buckets"));
    let mut ledger = Vec::with_capacity(partitions);
    let mut wamid = Vec::with_capacity(partitions);
    for partition in 0..partitions {
        let store = open_bucket(js, next()?).await?;
        check_ledger_partitions(&store, partition, partitions)?;
        ledger.push(store);
        // The wamid links follow the ledger's partition count (checked on the ledger's bucket just above).
        wamid.push(open_bucket(js, next()?).await?);
    }
    let scopes = open_bucket(js, next()?).await?;
    let webhook_dedup = open_bucket(js, next()?).await?;
    Ok(Buckets { send, ledger, wamid, scopes, webhook_dedup })
}

/// The KV buckets of the shared topology, in the order [`ensure_topology`] opens them: each ledger partition
/// followed by its wamid links, then BW_SCOPES and BW_WEBHOOK_DEDUP. Like every bucket they refuse a write
/// when full (DiscardNew, [`kv_stream_config`]): a bucket that dropped its oldest keys would lose ledger
/// entries, links or dedup keys without a word. A full bucket still takes updates of keys it holds (history 1:
/// the new revision replaces the old one), so operations already accepted keep moving.
pub fn bucket_configs(cfg: &NatsConfig) -> Vec<kv::Config> {
    let limits = &cfg.limits;
    let kv_config = |bucket: &str, max_age: Duration, max_bytes: i64| kv::Config {
        bucket: bucket.to_string(),
        history: 1,
        max_age,
        max_bytes,
        storage: stream::StorageType::File,
        num_replicas: cfg.replicas,
        ..Default::default()
    };
    let partitions = cfg.ledger_partitions.max(1);
    let max_age = Duration::from_secs(limits.ledger_max_age_days * 24 * 3600);
    let mut out = Vec::with_capacity(2 * partitions + 2);
    for partition in 0..partitions {
        let mut config = kv_config(&names::ledger_bucket(partition), max_age, limits.ledger_max_bytes);
        config.description = ledger_description(partition, partitions);
        out.push(config);
        out.push(kv_config(&names::wamid_bucket(partition), max_age, limits.wamid_max_bytes));
    }
    out.push(kv_config(names::SCOPES_BUCKET, Duration::ZERO, limits.scopes_max_bytes));
    let dedup_age = Duration::from_secs(limits.webhook_dedup_hours * 3600);
    out.push(kv_config(names::WEBHOOK_DEDUP_BUCKET, dedup_age, limits.webhook_dedup_max_bytes));
    out
}

/// What to do about a refusal for want of storage: the server reserves each stream's `max_bytes` at creation.
fn storage_hint(e: &dyn std::fmt::Display) -> &'static str {
    if e.to_string().to_ascii_lowercase().contains("insufficient") {
        " (the NATS server cannot reserve the stream's max_bytes: the byte limits in nats.limits, the per-partition \
         ones once per partition, must fit the server's max_file_store)"
    } else {
        ""
    }
}

/// Applies the byte limit and discard policy of `wanted` to the existing stream `info` describes, when they
/// differ (a stream created before it had them, or limits changed in the config); nothing else of the stream
/// changes. Returns whether it updated. A stream already holding more than its new limit keeps what it holds;
/// with DiscardNew it refuses publishes until it drains below the limit.
pub async fn apply_stream_limits(
    js: &jetstream::Context,
    info: &stream::Info,
    wanted: &stream::Config,
) -> anyhow::Result<bool> {
    let current = &info.config;
    if current.max_bytes == wanted.max_bytes && current.discard == wanted.discard {
        return Ok(false);
    }
    let mut config = current.clone();
    config.max_bytes = wanted.max_bytes;
    config.discard = wanted.discard;
    js.update_stream(config).await.map_err(|e| {
        anyhow::anyhow!(
            "cannot set max_bytes {} on stream `{}`: {e}{}",
            wanted.max_bytes,
            current.name,
            storage_hint(&e)
        )
    })?;
    tracing::info!(
        stream = %current.name,
        max_bytes = wanted.max_bytes,
        discard = ?wanted.discard,
        "stream limits applied"
    );
    if info.state.bytes as f64 >= wanted.max_bytes as f64 {
        tracing::error!(
            stream = %current.name,
            bytes = info.state.bytes,
            max_bytes = wanted.max_bytes,
            "stream already holds more than its byte limit: new messages are refused (DiscardNew) or the oldest \
             dropped (DiscardOld) until it is under it; raise the limit in nats.limits if that is not intended"
        );
    }
    Ok(true)
}

/// What [`apply_limits`] did.
#[derive(Debug, Default)]
pub struct LimitsApplied {
    /// Streams whose byte limit or discard policy was updated.
    pub updated: Vec<String>,
    /// Streams whose update failed, with the error (the first refused permission ends the pass: each refused
    /// request waits out the client's timeout).
    pub failed: Vec<(String, String)>,
}

/// Applies `cfg.limits` (byte limits and discard policies) to every existing stream and bucket of the shared
/// topology ([`stream_configs`], [`bucket_configs`]). Only ingest calls it, at start (its NATS user may update
/// those streams); the others create streams with the limits and leave existing ones as they are. A failed
/// update is reported, not fatal: the stream keeps working as before (its discard policy unchanged), and the
/// caller says what to do. Err only when a stream cannot be read.
pub async fn apply_limits(
    js: &jetstream::Context,
    cfg: &NatsConfig,
    refused: &(dyn Fn() -> bool + Sync),
) -> anyhow::Result<LimitsApplied> {
    let send = names::SendPartitions::new(cfg.send_partitions);
    let wanted = stream_configs(&cfg.limits, cfg.replicas, send)
        .into_iter()
        .chain(bucket_configs(cfg).iter().map(kv_stream_config).collect::<Vec<_>>());
    let mut done = LimitsApplied::default();
    for config in wanted {
        let stream = js
            .get_stream(&config.name)
            .await
            .map_err(|e| anyhow::anyhow!("cannot read stream `{}`: {e}", config.name))?;
        match apply_stream_limits(js, stream.cached_info(), &config).await {
            Ok(true) => done.updated.push(config.name.clone()),
            Ok(false) => {}
            Err(e) => {
                done.failed.push((config.name.clone(), format!("{e:#}")));
                if refused() {
                    break;
                }
            }
        }
    }
    Ok(done)
}

/// The description a ledger partition's stream is created with; it records the partition count, which
/// [`ledger_partitions_of`] reads back.
fn ledger_description(partition: usize, partitions: usize) -> String {
    format!("Breakwater ledger partition {partition} of {partitions}")
}

/// The partition count a ledger bucket's stream was created with: the number in its description, 1 for a
/// bucket created before partitions existed (no description).
pub fn ledger_partitions_of(store: &kv::Store) -> Option<usize> {
    partitions_in(store.stream.cached_info().config.description.as_deref())
}

/// Refuses a send partition count other than the one BW_SEND was created with: a sender's requests would be
/// published to a partition no dispatcher reads the same way, and the priority gate and replay would count
/// another partition's backlog.
fn check_send_partitions(info: &stream::Info, configured: names::SendPartitions) -> anyhow::Result<()> {
    match send_partitions_of(info) {
        Some(found) if found == configured => Ok(()),
        found => Err(anyhow::anyhow!(
            "nats.send_partitions is {} but the stream `{}` was created for {}; every service must use the \
             partition count BW_SEND was created with (changing it: drain, then bwctl send repartition; \
             deploy/capacity.md)",
            configured.count(),
            names::SEND_STREAM,
            found.map(|n| format!("{} partition(s)", n.count())).unwrap_or_else(|| "an unknown partition count".into()),
        )),
    }
}

/// Refuses a partition count other than the one the ledger was created with: the same operation would be
/// looked for in another partition than the one holding it (taken for new, sent twice).
fn check_ledger_partitions(store: &kv::Store, partition: usize, configured: usize) -> anyhow::Result<()> {
    match ledger_partitions_of(store) {
        Some(found) if found == configured => Ok(()),
        found => Err(anyhow::anyhow!(
            "nats.ledger_partitions is {configured} but the ledger bucket `{}` was created for {}; every service \
             must use the partition count the ledger was created with (changing it needs a migration: \
             deploy/capacity.md)",
            names::ledger_bucket(partition),
            found.map(|n| format!("{n} partition(s)")).unwrap_or_else(|| "an unknown partition count".into()),
        )),
    }
}

/// Publishes and waits for the JetStream ack; returns whether the server saw it as a duplicate.
pub async fn publish_durable(
    js: &jetstream::Context,
    subject: String,
    headers: async_nats::HeaderMap,
    payload: bytes::Bytes,
) -> Result<bool, PublishError> {
    let ack = js
        .publish_with_headers(subject, headers, payload)
        .await
        .map_err(|e| PublishError(e.to_string()))?
        .await
        .map_err(|e| PublishError(e.to_string()))?;
    Ok(ack.duplicate)
}

/// A durable publish failed (stream full, broker unreachable, timeout).
#[derive(Debug, thiserror::Error)]
#[error("durable publish failed: {0}")]
pub struct PublishError(pub String);

impl PublishError {
    /// True when the stream refused the message because it reached a limit (its message count, bytes or
    /// per-subject count with discard = new, or the server's storage): JetStream's "maximum messages exceeded",
    /// "maximum bytes exceeded", "maximum messages per subject exceeded" and "insufficient resources". Such a
    /// refusal lasts until the stream is drained or its limit raised; retrying does not help.
    pub fn stream_full(&self) -> bool {
        let text = self.0.to_ascii_lowercase();
        ["maximum messages", "maximum bytes", "insufficient resources", "10077", "10047", "10023"]
            .iter()
            .any(|needle| text.contains(needle))
    }
}

#[cfg(test)]
mod partition_tests {
    use super::*;

    /// A stream created before partitions existed has no description and counts as one partition; the count
    /// written at creation reads back; anything else is unknown (and refused by the start-up checks).
    #[test]
    fn the_partition_count_reads_back_from_a_description() {
        assert_eq!(partitions_in(None), Some(1));
        assert_eq!(partitions_in(Some("")), Some(1));
        assert_eq!(partitions_in(Some(&send_description(0, 4))), Some(4));
        assert_eq!(partitions_in(Some(&ledger_description(0, 8))), Some(8));
        assert_eq!(partitions_in(Some("made by hand")), None);
        let configs = stream_configs(&StreamLimits::default(), 1, names::SendPartitions::new(3));
        let names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).take(6).collect();
        assert_eq!(names, ["BW_SEND", "BW_SEND_1", "BW_SEND_2", "BW_DLQ", "BW_DLQ_1", "BW_DLQ_2"]);
        let mut subjects: Vec<&String> = configs.iter().flat_map(|c| &c.subjects).collect();
        let all = subjects.len();
        subjects.sort();
        subjects.dedup();
        assert_eq!(subjects.len(), all, "no two streams list the same subject");
    }

    /// Every stream and bucket of the topology has a byte limit, and the discard policy chosen for it: the ones
    /// holding work that must not be lost refuse a publish when full, the records for readers drop their oldest.
    #[test]
    fn every_stream_and_bucket_has_a_byte_limit_and_its_discard_policy() {
        use stream::DiscardPolicy::{New, Old};
        let cfg = NatsConfig { ledger_partitions: 2, ..NatsConfig::single("nats://127.0.0.1:4222", "t") };
        let streams = stream_configs(&cfg.limits, 1, names::SendPartitions::new(2));
        for c in &streams {
            assert!(c.max_bytes > 0, "{}", c.name);
            let for_readers =
                [names::REJECTED_STREAM, names::INBOUND_STREAM, names::EVENTS_STREAM, names::ACCOUNT_STREAM];
            assert_eq!(c.discard, if for_readers.contains(&c.name.as_str()) { Old } else { New }, "{}", c.name);
        }
        let send = streams.iter().find(|c| c.name == "BW_SEND_1").expect("partition 1");
        assert_eq!(send.max_bytes, cfg.limits.send_max_bytes, "the limit is per partition");
        let buckets = bucket_configs(&cfg);
        assert_eq!(buckets.len(), 2 * 2 + 2, "ledger and wamid per partition, scopes, dedup");
        for b in &buckets {
            let s = kv_stream_config(b);
            assert!(s.max_bytes > 0 && s.discard == New, "{}", s.name);
        }
        assert_eq!(buckets[2].bucket, names::ledger_bucket(1));
        assert_eq!(buckets[2].max_bytes, cfg.limits.ledger_max_bytes);
        let mut limits = StreamLimits::default();
        assert!(limits.validate().is_ok());
        limits.ledger_max_bytes = -1;
        assert_eq!(
            limits.validate().expect_err("no limit"),
            "nats.limits.ledger_max_bytes must be > 0 (bytes; every stream has a byte limit)"
        );
    }
}
