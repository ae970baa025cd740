//! Changing the partition counts of a stopped deployment: the ledger's (`nats.ledger_partitions`, `bwctl ledger
//! repartition --to M`, [`repartition_ledger`]) and BW_SEND's and the DLQ's (`nats.send_partitions`, `bwctl send
//! repartition --to M`, [`repartition_send`], which needs them drained).
//!
//! The ledger:
//!
//! An operation's ledger entry lives in partition FNV-1a(operation id) mod N, and a wamid link in that of its
//! key (`bw_wire::names::ledger_partition`), so a new count moves most entries. Entries stay for
//! `ledger_max_age_days`, so the ledger cannot be drained like BW_SEND: they are copied into their new
//! partition, then removed from the old one. Every service must be stopped first; the steps, each safe to run
//! again after a crash:
//!
//! 1. Checks: the feed publisher has published every ledger revision (its `feed-publisher` consumer on each
//!    partition has nothing pending), else the tool stops (start ingest alone until it catches up).
//! 2. Partition 0's description is set to say a repartition is under way: its count no longer reads as a
//!    number, so any service started meanwhile refuses to start instead of looking for entries in the wrong
//!    partition. The feed publisher's consumers are deleted, so that ingest, when it starts again, creates them
//!    at the end of each stream and does not publish the moved entries a second time.
//! 3. The missing partitions' buckets are created (the replicas and the maximum age of partition 0).
//! 4. Every entry of every existing partition (ledger and wamid links) whose new partition differs is put there
//!    (overwriting an earlier run's copy) and then purged from its old partition. A moved entry's age restarts:
//!    it is kept up to `ledger_max_age_days` from the move.
//! 5. Every partition's description is set to the new count, then the partitions past it (now empty) are
//!    deleted. From here the services start with `nats.ledger_partitions = M` and refuse any other number.
//!
//! The NATS user running it needs rights none of `deploy/nats/accounts.conf`'s users has (create, update and
//! delete streams, purge, delete consumers): an administrator's.

use crate::OpsError;
use async_nats::jetstream::{self, kv, stream};
use bw_wire::names;
use futures::StreamExt;
use std::collections::BTreeMap;

/// What a repartition did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Repartitioned {
    /// The count the ledger had (as partition 0 recorded it; None when a repartition was under way).
    pub from: Option<usize>,
    /// The new count.
    pub to: usize,
    /// Ledger entries moved to another partition.
    pub entries_moved: u64,
    /// Wamid links moved to another partition.
    pub links_moved: u64,
    /// Entries and links already in their partition.
    pub kept: u64,
    /// Buckets created and deleted.
    pub created: Vec<String>,
    pub deleted: Vec<String>,
}

/// Why a repartition did not start.
#[derive(Debug, thiserror::Error)]
pub enum RepartitionError {
    #[error("the partition count must be between 1 and {max}, got {0}", max = names::MAX_LEDGER_PARTITIONS)]
    Count(usize),
    #[error(
        "the feed publisher has not published every ledger revision yet ({0}); start ingest alone until \
         `nats consumer info <stream> feed-publisher` shows nothing pending, stop it, and run this again"
    )]
    FeedBehind(String),
    #[error(transparent)]
    Ops(#[from] OpsError),
}

/// Description of partition 0 while a repartition to `to` is under way: its count does not parse, so every
/// service refuses to start (`bw_common::nats::ledger_partitions_of`).
fn under_way(to: usize) -> String {
    format!("Breakwater ledger partition 0: repartition to {to} under way; start no service until it is done")
}

/// The name of every stream of the account.
async fn stream_names(js: &jetstream::Context) -> Result<Vec<String>, OpsError> {
    let mut listing = js.stream_names();
    let mut out = Vec::new();
    while let Some(name) = listing.next().await {
        out.push(name.map_err(|e| OpsError::nats("stream names", e))?);
    }
    Ok(out)
}

/// Every ledger (or wamid) partition bucket among `streams`, by index (names from `bucket_of`).
fn existing(streams: &[String], bucket_of: fn(usize) -> String) -> BTreeMap<usize, String> {
    let mut out = BTreeMap::new();
    for i in 0..names::MAX_LEDGER_PARTITIONS.max(1) * 2 {
        let bucket = bucket_of(i);
        if streams.iter().any(|s| *s == format!("KV_{bucket}")) {
            out.insert(i, bucket);
        }
    }
    out
}

/// Sets a stream's description (a stream update; nothing else changes).
async fn describe(js: &jetstream::Context, stream_name: &str, description: String) -> Result<(), OpsError> {
    let handle = js.get_stream(stream_name).await.map_err(|e| OpsError::nats(stream_name, e))?;
    let mut config: stream::Config = handle.cached_info().config.clone();
    if config.description.as_deref() == Some(description.as_str()) {
        return Ok(());
    }
    config.description = Some(description);
    js.update_stream(config).await.map_err(|e| OpsError::nats(stream_name, e))?;
    Ok(())
}

/// Moves every entry of `stores` (index → bucket) whose partition under `to` differs; returns (moved, kept).
async fn move_entries(
    js: &jetstream::Context,
    stores: &BTreeMap<usize, kv::Store>,
    to: usize,
) -> Result<(u64, u64), OpsError> {
    let (mut moved, mut kept) = (0, 0);
    for (&from, store) in stores {
        let mut keys = store.keys().await.map_err(|e| OpsError::nats(&store.name, e))?;
        let mut all = Vec::new();
        while let Some(key) = keys.next().await {
            all.push(key.map_err(|e| OpsError::nats(&store.name, e))?);
        }
        let stream = js.get_stream(&store.stream_name).await.map_err(|e| OpsError::nats(&store.stream_name, e))?;
        for key in all {
            let target = names::ledger_partition(&key, to);
            if target == from {
                kept += 1;
                continue;
            }
            let Some(value) = store.get(&key).await.map_err(|e| OpsError::nats(&store.name, e))? else { continue };
            let destination = &stores[&target];
            destination.put(&key, value).await.map_err(|e| OpsError::nats(&destination.name, e))?;
            // A purge of the subject, not a KV delete: no tombstone is left behind in the old partition.
            stream
                .purge()
                .filter(format!("$KV.{}.{key}", store.name))
                .await
                .map_err(|e| OpsError::nats(&store.stream_name, e))?;
            moved += 1;
        }
    }
    Ok((moved, kept))
}

/// Repartitions the ledger and the wamid links of a stopped deployment to `to` partitions (module docs).
pub async fn repartition_ledger(js: &jetstream::Context, to: usize) -> Result<Repartitioned, RepartitionError> {
    if !(1..=names::MAX_LEDGER_PARTITIONS).contains(&to) {
        return Err(RepartitionError::Count(to));
    }
    let streams = stream_names(js).await?;
    let (ledger_buckets, wamid_buckets) =
        (existing(&streams, names::ledger_bucket), existing(&streams, names::wamid_bucket));
    let first = js.get_key_value(names::LEDGER_BUCKET).await.map_err(|e| OpsError::nats(names::LEDGER_BUCKET, e))?;
    let from = bw_common::nats::ledger_partitions_of(&first);
    // 1. The feed publisher is caught up on every partition (a consumer already deleted by an earlier run is
    //    fine).
    let mut ledger_streams = Vec::new();
    for bucket in ledger_buckets.values() {
        use jetstream::context::ConsumerInfoErrorKind;
        let stream_name = format!("KV_{bucket}");
        let stream = js.get_stream(&stream_name).await.map_err(|e| OpsError::nats(&stream_name, e))?;
        match stream.consumer_info(names::FEED_CONSUMER).await {
            Ok(info) if info.num_pending > 0 || info.num_ack_pending > 0 => {
                return Err(RepartitionError::FeedBehind(format!(
                    "{stream_name}: {} revisions not delivered, {} not acknowledged",
                    info.num_pending, info.num_ack_pending
                )));
            }
            Ok(_) => {}
            Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {}
            Err(e) => return Err(OpsError::nats(&stream_name, e).into()),
        }
        ledger_streams.push(stream);
    }
    // 2. Lock out the services, then let the feed publisher start afresh after the move.
    describe(js, &first.stream_name, under_way(to)).await?;
    for stream in &ledger_streams {
        // Missing already (an earlier run): nothing to delete.
        let _ = stream.delete_consumer(names::FEED_CONSUMER).await;
    }
    // 3. The new partitions, shaped like partition 0.
    let base = first.stream.cached_info().config.clone();
    let mut report = Repartitioned { from, to, ..Default::default() };
    let mut ledgers: BTreeMap<usize, kv::Store> = BTreeMap::new();
    let mut links: BTreeMap<usize, kv::Store> = BTreeMap::new();
    for (kind, buckets, stores) in [("ledger", &ledger_buckets, &mut ledgers), ("wamid", &wamid_buckets, &mut links)] {
        let bucket_of = if kind == "ledger" { names::ledger_bucket } else { names::wamid_bucket };
        let mut wanted: Vec<usize> = buckets.keys().copied().collect();
        wanted.extend(0..to);
        wanted.sort();
        wanted.dedup();
        for i in wanted {
            let bucket = bucket_of(i);
            let store = match js.get_key_value(&bucket).await {
                Ok(store) => store,
                Err(_) => {
                    let config = kv::Config {
                        bucket: bucket.clone(),
                        history: 1,
                        max_age: base.max_age,
                        // Partition 0's byte limit for the ledger; ingest applies nats.limits at its next start.
                        max_bytes: match (kind, base.max_bytes) {
                            ("ledger", b) if b > 0 => b,
                            ("ledger", _) => bw_common::config::StreamLimits::default().ledger_max_bytes,
                            _ => bw_common::config::StreamLimits::default().wamid_max_bytes,
                        },
                        storage: base.storage,
                        num_replicas: base.num_replicas,
                        description: if kind == "ledger" {
                            format!("Breakwater ledger partition {i} of {to}")
                        } else {
                            String::new()
                        },
                        ..Default::default()
                    };
                    report.created.push(bucket.clone());
                    bw_common::nats::open_bucket(js, config).await.map_err(|e| OpsError::nats(&bucket, e))?
                }
            };
            stores.insert(i, store);
        }
    }
    // 4. Every entry to its partition under the new count.
    let (moved, kept) = move_entries(js, &ledgers, to).await?;
    report.entries_moved = moved;
    report.kept += kept;
    let (moved, kept) = move_entries(js, &links, to).await?;
    report.links_moved = moved;
    report.kept += kept;
    // 5. The new count in every remaining partition (partition 0 last: it unlocks the services), then the
    //    empty partitions past it go.
    for (&i, store) in ledgers.iter().filter(|(i, _)| **i < to).rev() {
        describe(js, &store.stream_name, format!("Breakwater ledger partition {i} of {to}")).await?;
    }
    for (kind, stores) in [("ledger", &ledgers), ("wamid", &links)] {
        for (&i, store) in stores.iter().filter(|(i, _)| **i >= to) {
            js.delete_key_value(&store.name).await.map_err(|e| OpsError::nats(&store.name, e))?;
            report.deleted.push(store.name.clone());
            tracing::info!(kind, partition = i, bucket = %store.name, "empty partition deleted");
        }
    }
    Ok(report)
}

/// What a send repartition did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SendRepartitioned {
    /// The count BW_SEND had.
    pub from: usize,
    /// The new count.
    pub to: usize,
    /// The streams deleted (all empty) and created.
    pub deleted: Vec<String>,
    pub created: Vec<String>,
}

/// Why a send repartition did not start.
#[derive(Debug, thiserror::Error)]
pub enum SendRepartitionError {
    #[error("the partition count must be between 1 and {max}, got {0}", max = names::MAX_SEND_PARTITIONS)]
    Count(usize),
    #[error(
        "{0} still holds {1} message(s): stop ingest, let the dispatchers and replay drain every BW_SEND and BW_DLQ \
         partition (bwctl partitions; entries held for manual release need bwctl dlq replay or purge), then stop \
         every service and run this again"
    )]
    NotEmpty(String, u64),
    #[error(transparent)]
    Ops(#[from] OpsError),
}

/// Changes the send partition count (`nats.send_partitions`, BW_SEND and BW_DLQ) of a drained, stopped
/// deployment: refuses unless every BW_SEND and BW_DLQ partition stream is empty, then deletes them and creates
/// `to` partitions of each with the limits and replicas the old partition 0 had. Nothing can be lost: accepted
/// messages are only in these streams while QUEUED or DLQ, and all of them are empty. Safe to run again: a
/// missing stream is created, an existing empty one is replaced. Services then start with
/// `nats.send_partitions = to` (their durable consumers are recreated on the new streams).
pub async fn repartition_send(js: &jetstream::Context, to: usize) -> Result<SendRepartitioned, SendRepartitionError> {
    use names::SendPartitions;
    if !(1..=names::MAX_SEND_PARTITIONS).contains(&to) {
        return Err(SendRepartitionError::Count(to));
    }
    let all = stream_names(js).await?;
    let is_partition = |name: &str, base: &str| {
        name == base
            || name
                .strip_prefix(base)
                .and_then(|rest| rest.strip_prefix('_'))
                .is_some_and(|i| i.parse::<usize>().is_ok())
    };
    let mut existing: Vec<String> =
        all.into_iter().filter(|n| is_partition(n, names::SEND_STREAM) || is_partition(n, names::DLQ_STREAM)).collect();
    existing.sort();
    // Every partition empty, and the shape (limits, replicas) of the old partition 0 of each kind.
    let mut shapes: BTreeMap<&str, stream::Config> = BTreeMap::new();
    let mut from = 1;
    for name in &existing {
        let handle = js.get_stream(name).await.map_err(|e| OpsError::nats(name, e))?;
        let info = handle.cached_info();
        if info.state.messages > 0 {
            return Err(SendRepartitionError::NotEmpty(name.clone(), info.state.messages));
        }
        if name == names::SEND_STREAM {
            from = bw_common::nats::send_partitions_of(info).map(|p| p.count()).unwrap_or(1);
            shapes.insert(names::SEND_STREAM, info.config.clone());
        } else if name == names::DLQ_STREAM {
            shapes.insert(names::DLQ_STREAM, info.config.clone());
        }
    }
    let mut report = SendRepartitioned { from, to, ..Default::default() };
    // The new layout, shaped like the old partition 0 (or the compiled limits where there was none).
    let replicas = shapes.get(names::SEND_STREAM).map(|c| c.num_replicas).unwrap_or(1);
    let wanted = bw_common::nats::stream_configs(&Default::default(), replicas, SendPartitions::new(to));
    let wanted: Vec<stream::Config> = wanted
        .into_iter()
        .filter(|c| is_partition(&c.name, names::SEND_STREAM) || is_partition(&c.name, names::DLQ_STREAM))
        .map(|mut c| {
            let base = if is_partition(&c.name, names::SEND_STREAM) { names::SEND_STREAM } else { names::DLQ_STREAM };
            if let Some(old) = shapes.get(base) {
                c.max_messages = old.max_messages;
                if old.max_bytes > 0 {
                    c.max_bytes = old.max_bytes;
                }
                c.duplicate_window = old.duplicate_window;
                c.storage = old.storage;
            }
            c
        })
        .collect();
    // Partition 0 of BW_SEND last: it records the count the services check.
    for name in existing.iter().rev() {
        js.delete_stream(name).await.map_err(|e| OpsError::nats(name, e))?;
        report.deleted.push(name.clone());
    }
    for config in wanted.iter().rev() {
        js.create_stream(config.clone()).await.map_err(|e| OpsError::nats(&config.name, e))?;
        report.created.push(config.name.clone());
    }
    report.deleted.sort();
    report.created.sort();
    Ok(report)
}
