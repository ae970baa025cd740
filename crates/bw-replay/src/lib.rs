//! Breakwater replay: drains each scope's dead-letter queue back into BW_SEND while the scope's breaker is
//! CLOSED. Priority follows the message: a scope's priority entries (authentication, transactional, support;
//! `bw.dlq.v1.p.<phone>`) go first, onto the `rh` lane, as soon as the breaker closes (`priority_soak_ms`),
//! where the dispatcher admits them as priority traffic; its marketing entries (`bw.dlq.v1.m.<phone>`) go after
//! the soak onto the `rp` lane, paced so they only ever use a sender's spare rate.
//!
//! How: a KV watch on BW_SCOPES (no per-message polling) keeps one worker task per scope. A worker starts
//! draining once its breaker has been CLOSED for the (priority) soak time, no pause holds the scope (its number's,
//! its WABA's, its app's or its token's: the snapshot lists each, `ScopeSnapshot.pauses`; a marketing-only pause
//! holds the marketing entries alone), and it holds the scope's lease (one
//! instance drains a scope at a time; N instances share the scopes). It pulls the scope's DLQ through the
//! durable consumers `replay-p-<phone>` then `replay-m-<phone>`, paces with a token bucket that starts empty and
//! a bound on the lane's depth, and hands each entry to `bw_ops::moves::Mover`, which checks deadline, ledger,
//! 24 h window and the replay limit before it publishes with the msg id `<operation_id>.r<n>` (no duplicates on
//! redelivery) onto the lane of the entry's category. The dispatcher admits an `rp` message with
//! `TrafficClass::Replay`, an `rh` one with `TrafficClass::OlderPriority` (priority, served before live priority traffic).
//! Incidents (`incident`): entries of a breaker incident whose category is in `replay.hold_categories` stay in
//! the DLQ until an operator releases the incident; each drain counts what it did per incident in BW_INCIDENTS,
//! and after a drain of a CLOSED scope an incident with nothing left gets its "replayed" event, once.
//!
//! Tenancy: in registry mode (the compiled default) an entry is replayed only while the sender registry still
//! assigns its number (or its failover target's) to the operation's tenant under the request's WABA; otherwise
//! it goes to the quarantine (`SENDER_REVOKED`), never back to a lane.
//!
//! What it must not do: talk to Meta, or send anything whose ledger entry says Meta accepted it.
//! Entry point: [`run`].

pub mod config;
mod ctx;
mod incident;
pub mod lease;
pub mod metrics;
mod stats;
mod worker;

pub use config::Config;
use ctx::Ctx;
pub use ctx::ScopeView;

use anyhow::Context as _;
use bw_common::service::Deps;
use bw_ops::moves::{Mover, Rules};
use bw_proto::v1::ScopeSnapshot;
use futures::StreamExt;
use prost::Message;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Compiled default configuration (every key documented).
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Runs replay until `shutdown` is cancelled.
pub async fn run(cfg: Config, deps: Deps, shutdown: CancellationToken) -> anyhow::Result<()> {
    cfg.validate().map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let instance = if cfg.replay.instance_id.is_empty() {
        format!("replay-{:016x}", rand_id())
    } else {
        cfg.replay.instance_id.clone()
    };
    let bucket_bytes = cfg.nats.limits.service_bucket_max_bytes;
    let leases =
        lease::Leases::open(&deps.js, instance.clone(), cfg.replay.lease_ttl_ms, cfg.nats.replicas, bucket_bytes)
            .await
            .context("failed to open the replay lease bucket")?;
    let incidents = bw_ops::incident::Incidents::open_limited(&deps.js, cfg.nats.replicas, bucket_bytes)
        .await
        .context("failed to open the incident bucket")?;
    bw_ops::incident::ensure_event_subjects(&deps.js).await.context("failed to add incident events to BW_EVENTS")?;
    let rules = Rules {
        max_replays: cfg.replay.max_replays,
        window_ms: (cfg.replay.window_hours * 3600 * 1000) as i64,
        // The worker decides not-before itself, before any ledger read (`worker::not_before_wait`: a sender
        // pause's recheck hint ends with the pause), so the move does not check it again.
        honor_not_before: false,
        via: "replay".into(),
    };
    let grace = Duration::from_millis(cfg.replay.shutdown_grace_ms);
    let registry = bw_common::registry::view_for(cfg.tenancy.mode, &deps, cfg.nats.replicas, shutdown.clone()).await?;
    let mover = Mover::new(deps.js.clone(), &deps.buckets, rules);
    let mover = if registry.is_dev() {
        tracing::info!("tenancy.mode = \"dev\": DLQ entries' senders are not checked against the sender registry");
        mover
    } else {
        mover.with_registry(registry)
    };
    let ctx = Arc::new(Ctx {
        mover,
        js: deps.js.clone(),
        leases,
        incidents,
        metrics: metrics::Metrics::register(&deps.metrics),
        views: RwLock::new(HashMap::new()),
        depths: watch::Sender::new(Default::default()),
        shutdown: shutdown.clone(),
        cfg,
    });
    let tracker = TaskTracker::new();
    tracker.spawn(stats::poll(ctx.clone()).instrument(tracing::info_span!("replay.stats")));

    let mut scope_watch = watch_scopes(&deps.buckets.scopes).await?;
    deps.health.set_started();
    tracing::info!(instance = %instance, "replay started");
    let mut workers: HashMap<String, watch::Sender<ScopeView>> = HashMap::new();
    loop {
        let item = tokio::select! {
            _ = shutdown.cancelled() => break,
            item = scope_watch.next() => item,
        };
        match item {
            Some(Ok(entry)) => {
                let view = match entry.operation {
                    async_nats::jetstream::kv::Operation::Put => match ScopeSnapshot::decode(entry.value.as_ref()) {
                        Ok(s) => ScopeView::from_snapshot(&s),
                        Err(_) => {
                            tracing::warn!(scope = %entry.key, "undecodable scope snapshot; treating the scope as not replayable");
                            ScopeView::default()
                        }
                    },
                    _ => ScopeView::default(),
                };
                if let Ok(mut views) = ctx.views.write() {
                    views.insert(entry.key.clone(), view.clone());
                }
                match workers.get(&entry.key) {
                    Some(tx) => {
                        let _ = tx.send(view);
                    }
                    None => {
                        let (tx, rx) = watch::channel(view);
                        workers.insert(entry.key.clone(), tx);
                        let span = tracing::info_span!("replay.scope", scope = %entry.key);
                        tracker.spawn(worker::scope_worker(ctx.clone(), entry.key.clone(), rx).instrument(span));
                    }
                }
            }
            Some(Err(e)) => tracing::warn!(error = %e, "scope watch error"),
            None => {
                tracing::warn!("scope watch ended; watching again");
                tokio::time::sleep(Duration::from_millis(500)).await;
                match watch_scopes(&deps.buckets.scopes).await {
                    Ok(w) => scope_watch = w,
                    Err(e) => tracing::warn!(error = format!("{e:#}"), "cannot watch scopes yet"),
                }
            }
        }
    }
    drop(workers);
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(grace_ms = grace.as_millis() as u64, "shutdown grace expired with replay tasks still running");
    }
    Ok(())
}

async fn watch_scopes(store: &async_nats::jetstream::kv::Store) -> anyhow::Result<async_nats::jetstream::kv::Watch> {
    store.watch_with_history(">").await.context("cannot watch the BW_SCOPES bucket")
}

fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.write_u32(std::process::id());
    h.finish()
}
