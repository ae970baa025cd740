//! The dispatcher: the only component that talks to Meta.
//!
//! It pulls accepted send requests from the BW_SEND work queue through four durable pull consumers, filling a
//! batch in serving order: `rh` = priority (authentication/transactional/support) replayed from the DLQ, `hi` =
//! live priority, `lo` = marketing, `rp` = marketing replayed from the DLQ; then a fifth, `dispatcher-held`, for
//! the messages the portfolio budget holds out of their lanes (`budget.rs`). Priority follows the message: a
//! marketing message waits while its sender has priority messages in the DLQ or `rh`, and a message that cannot
//! make its deadline ends EXPIRED before any call (`priority.rs`). Each message is checked against the ledger
//! (never send an operation twice) and its deadline, admitted through the Redis breaker and rate limits in one
//! round trip per batch and scope, POSTed to Meta, classified by error code, and moved to exactly one next place:
//! SENT, a delayed redelivery, the DLQ, the quarantine, or the unknown-outcome queue. Any number of instances share
//! the consumers.
//!
//! A message the limits refuse for a short while (sender or pair rate, reserve, canary budget) waits in memory
//! for the slot the admission script names and goes back to admission with the others due then (one round
//! trip per scope and round); longer waits and retries of failed sends are JetStream delayed redeliveries.
//! Messages ingest marked `keeps_order` pass the per-recipient order gate first, in the same round trip: one
//! behind an earlier waiting message to the same recipient waits for it (`order`).
//!
//! Tenancy: in registry mode (the compiled default) a message is sent only while the sender registry still
//! assigns its number to the operation's tenant (the operation key's) under the request's WABA; one whose sender
//! was removed, moved to another tenant or re-registered under another WABA after acceptance goes to the
//! quarantine (`SENDER_REVOKED`, the detail says which), never to Meta and never to the DLQ.
//!
//! Must not: resend an operation the ledger shows as accepted by Meta, retry an unknown outcome, or hold a
//! message in memory for longer than `hold_max_ms`.
//!
//! Entry point: [`run`].

mod attempt;
mod backoff;
pub mod budget;
mod config;
mod fetch;
mod gates;
mod journal;
mod late;
mod meta;
mod metrics;
mod order;
mod priority;
mod process;
mod rounds;
mod route;
mod send;
mod settle;
mod worker;

pub use config::{Config, DEFAULT_CONFIG, DispatchConfig, MetaConfig, WireGuarantee};
pub use fetch::{held_consumer, lane_consumer, partition_lane_consumer};
pub use meta::{MetaAnswer, MetaClient, build_body};

use bw_common::service::Deps;
use bw_proto::v1::OperationState;
use bw_wire::names::Lane;
use config::credentials_warning;
use fetch::{FETCH_BOUND, Parked, fetch_order, idle_wait_any, served_partitions, take_parked};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Runs the dispatcher until `shutdown` is cancelled, then finishes in-flight messages (ack or nak).
pub async fn run(cfg: Config, deps: Deps, shutdown: CancellationToken) -> anyhow::Result<()> {
    if let Some(warning) = credentials_warning(&cfg.meta) {
        tracing::warn!("{warning}");
    }
    let version = &cfg.meta.api_version;
    let today = bw_common::api_versions::today();
    match bw_common::api_versions::check(version, today, cfg.meta.allow_expired_api_version) {
        Err(refusal) => anyhow::bail!("{refusal}"),
        Ok(Some(warning)) => tracing::warn!("{warning}"),
        Ok(None) => {}
    }
    let metrics = metrics::Metrics::register(&deps.metrics);
    metrics.watch_api_version(version, shutdown.clone());
    let breaker = bw_breaker::Breaker::with_conn(deps.redis.clone(), Some(deps.nats.clone()), cfg.breaker.clone());
    breaker.register_metrics(&deps.metrics);
    // App pauses and token halts are keyed by this account (a new token is not under the old one's halt).
    breaker.set_account(&cfg.meta.app_id, &cfg.meta.access_token);
    // Fail fast without Redis while a scope is known to be OPEN; operators' changes arrive as transitions.
    breaker.follow_transitions().await?;
    let ledger = bw_common::ledger::Ledger::new(&deps.buckets);
    let registry = bw_common::registry::view_for(cfg.tenancy.mode, &deps, cfg.nats.replicas, shutdown.clone()).await?;
    if registry.is_dev() {
        tracing::info!("tenancy.mode = \"dev\": senders are not checked against the sender registry");
    }
    let meta = MetaClient::new(&cfg.meta)?;
    let ack_wait = Duration::from_millis(cfg.dispatch.ack_wait_ms);
    let partitions = served_partitions(&cfg.dispatch.partitions, deps.buckets.send);
    // Lane by lane in serving order, each lane's partitions side by side (see the fetch loop).
    let mut consumers = Vec::new();
    // The partition of each consumer (journal mode fetches only from owned ones).
    let mut consumer_partitions = Vec::new();
    for lane in Lane::ALL {
        for &partition in &partitions {
            consumer_partitions.push(partition);
            let consumer = deps
                .startup_step("lane consumer", Duration::from_secs(30), || {
                    partition_lane_consumer(&deps.js, partition, lane, ack_wait)
                })
                .await?;
            consumers.push((lane, consumer));
        }
    }
    // The held messages after every lane: `prepare` reads each one's own lane from its subject.
    for &partition in &partitions {
        consumer_partitions.push(partition);
        let consumer = deps
            .startup_step("held consumer", Duration::from_secs(30), || held_consumer(&deps.js, partition, ack_wait))
            .await?;
        consumers.push((Lane::Replay, consumer));
    }
    let instance = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    // Journal mode: the partitions' journals; the fetch loop fetches only from the partitions this instance owns.
    // Their loops stop with this future, also when it is dropped (a crash keeps the leases until they expire).
    let journal_stop = CancellationToken::new();
    let _journal_guard = journal_stop.clone().drop_guard();
    let journals = match cfg.dispatch.wire_guarantee {
        WireGuarantee::Mark => None,
        WireGuarantee::Journal => {
            let d = &cfg.dispatch;
            let jcfg = journal::JournalConfig {
                lease: Duration::from_millis(d.wire_lease_ms),
                max_group: d.journal_max_group,
                checkpoint: Duration::from_millis(d.journal_checkpoint_ms),
                max_bytes: d.journal_max_bytes,
                replicas: cfg.nats.replicas,
                bucket_max_bytes: cfg.nats.limits.service_bucket_max_bytes,
            };
            let journals = deps
                .startup_step("wire journals", Duration::from_secs(30), || {
                    journal::Journals::open(&deps.js, &partitions, &instance, jcfg.clone(), metrics.journal.clone())
                })
                .await?;
            let ledger = ledger.clone();
            let still_open: journal::StillOpen = Arc::new(move |op: String, revision: u64| {
                let ledger = ledger.clone();
                Box::pin(async move {
                    match ledger.get(&op).await {
                        Ok(Some(v)) => v.revision == revision && v.entry.state() == OperationState::Queued,
                        Ok(None) => false,
                        Err(_) => true,
                    }
                }) as futures::future::BoxFuture<'static, bool>
            });
            journals.spawn(still_open, journal_stop.clone());
            tracing::info!(partitions = ?partitions, "wire guarantee: journal (partitions fetched once owned)");
            Some(journals)
        }
    };
    let worker = Arc::new(worker::Worker {
        js: deps.js.clone(),
        send: deps.buckets.send,
        nats: deps.nats.clone(),
        ledger,
        registry,
        breaker,
        meta,
        cfg: cfg.dispatch.clone(),
        metrics,
        shutdown: shutdown.clone(),
        instance,
        backlog: priority::Backlog::new(
            deps.js.clone(),
            partitions.clone(),
            Duration::from_millis(cfg.dispatch.priority_backlog_refresh_ms),
        ),
        dlq_limit_signalled: Default::default(),
        late_allowance: Default::default(),
        late_claims: Default::default(),
        mark_lead: Default::default(),
        gates: worker::Gates::new(deps.redis.clone()).with_budget(budget::Budget::new(
            deps.redis.clone(),
            cfg.budget.clone(),
            &deps.metrics,
        )),
        journals: journals.clone(),
    });
    let tracker = TaskTracker::new();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(cfg.dispatch.max_in_flight));
    let batch_size = cfg.dispatch.batch_size;
    let idle_wait = Duration::from_millis(cfg.dispatch.idle_wait_ms.max(10));
    deps.health.set_started();
    tracing::info!(lanes = Lane::ALL.len(), partitions = ?partitions, batch_size, "dispatcher consuming");
    let per_lane = partitions.len();
    let mut turn = 0usize;

    // Long-poll pull requests left outstanding by earlier idle waits, one slot per lane: whatever arrives on any
    // lane wakes an idle dispatcher, and a request still pending when work resumes is read at the next turn.
    let mut parked: Vec<Option<Parked>> = consumers.iter().map(|_| None).collect();
    while !shutdown.is_cancelled() {
        let permits = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = in_flight.clone().acquire_many_owned(batch_size as u32) => p?,
        };
        // Journal mode: only the partitions this instance owns now (a lost one's deliveries go to its new owner).
        let serving: Vec<bool> =
            consumer_partitions.iter().map(|p| journals.as_ref().is_none_or(|j| j.owns(*p))).collect();
        let mut batch = Vec::with_capacity(batch_size);
        for (slot, (lane, _)) in parked.iter_mut().zip(&consumers) {
            if batch.len() < batch_size
                && let Some(m) = take_parked(slot)
            {
                batch.push((*lane, m));
            }
        }
        // Each lane's partitions take turns going first, so a busy partition cannot keep its neighbours' share of
        // the batch (lanes keep their serving order).
        turn = turn.wrapping_add(1);
        for (lane, consumer) in
            fetch_order(consumers.len(), per_lane, turn).filter(|i| serving[*i]).map(|i| &consumers[i])
        {
            let room = batch_size - batch.len();
            if room == 0 {
                break;
            }
            // A pull request can go unanswered while a stream or consumer leader moves (cluster node lost):
            // bound every fetch so the loop never waits on it forever.
            let fetch = async {
                match consumer.fetch().max_messages(room).messages().await {
                    Ok(mut messages) => {
                        while let Some(next) = messages.next().await {
                            match next {
                                Ok(m) => batch.push((*lane, m)),
                                Err(e) => {
                                    tracing::debug!(error = %e, "fetch ended");
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(lane = lane.token(), error = %e, "fetch failed"),
                }
            };
            // The bound is generous: a fetch abandoned while its messages are still arriving leaves them
            // delivered-but-unacked until the ack wait (30 s) redelivers them, which stalled whole batches on a
            // loaded machine when it was 2 s. A leader move answers within a few seconds anyway.
            if tokio::time::timeout(FETCH_BOUND, fetch).await.is_err() {
                tracing::warn!(lane = lane.token(), "fetch unanswered; retrying");
            }
        }
        if batch.is_empty() {
            drop(permits);
            let got = tokio::select! {
                _ = shutdown.cancelled() => None,
                got = idle_wait_any(&consumers, &serving, &mut parked, idle_wait) => got,
            };
            if let Some(m) = got {
                let permit = in_flight.clone().acquire_owned().await?;
                let worker = worker.clone();
                tracker.spawn(async move {
                    worker.process_batch(vec![m]).await;
                    drop(permit);
                });
            } else if !shutdown.is_cancelled() {
                // Owning nothing yet (journal mode), wait an idle period rather than spin.
                let nap = if serving.contains(&true) { Duration::from_millis(5) } else { idle_wait };
                tokio::time::sleep(nap).await;
            }
            continue;
        }
        let mut permits = permits;
        let used = permits.split(batch.len()).expect("batch never exceeds the permits acquired for it");
        drop(permits);
        let worker = worker.clone();
        tracker.spawn(async move {
            worker.process_batch(batch).await;
            drop(used);
        });
    }
    // A message that reached a parked request meanwhile goes back at once rather than after the ack wait.
    for slot in &mut parked {
        if let Some(m) = take_parked(slot) {
            let settle = bw_common::disposition::Settle::nak(settle::Outcome::Held, Duration::ZERO);
            bw_common::disposition::apply(&m, settle, &tracing::Span::none(), |l| worker.metrics.result(l)).await;
        }
    }

    tracker.close();
    let grace = Duration::from_millis(cfg.dispatch.shutdown_grace_ms);
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!("shutdown grace expired with messages in flight; JetStream will redeliver them");
    }
    // In-flight sends have settled: stop the journals and hand their partitions over at once.
    journal_stop.cancel();
    if let Some(journals) = &journals {
        journals.release().await;
    }
    tracing::info!("dispatcher stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_wire::names;

    fn meta(base_url: &str, token: &str) -> MetaConfig {
        let mut cfg = Config::load(None, &Default::default()).expect("compiled defaults load").meta;
        cfg.base_url = base_url.into();
        cfg.access_token = token.into();
        cfg
    }

    #[test]
    fn every_partition_of_a_lane_takes_its_turn_first_and_lanes_keep_their_order() {
        let send = names::SendPartitions::new(3);
        assert_eq!(served_partitions(&[], send), [0, 1, 2]);
        assert_eq!(served_partitions(&[2, 0, 2, 7], send), [2, 0], "configured order, once each, in range");
        let order = |turn| fetch_order(6, 3, turn).collect::<Vec<_>>();
        assert_eq!(order(0), [0, 1, 2, 3, 4, 5]);
        assert_eq!(order(1), [1, 2, 0, 4, 5, 3]);
        assert_eq!(order(2), [2, 0, 1, 5, 3, 4]);
        assert_eq!(fetch_order(4, 1, 5).collect::<Vec<_>>(), [0, 1, 2, 3], "one partition: the lanes in order");
    }

    #[test]
    fn a_dispatcher_may_only_serve_partitions_that_exist() {
        let mut env = std::collections::HashMap::new();
        env.insert("BW_DISPATCHER__NATS__SEND_PARTITIONS".to_string(), "2".to_string());
        env.insert("BW_DISPATCHER__DISPATCH__PARTITIONS".to_string(), "[1]".to_string());
        let cfg = Config::load(None, &env).expect("partition 1 of 2");
        assert_eq!(cfg.dispatch.partitions, [1]);
        env.insert("BW_DISPATCHER__DISPATCH__PARTITIONS".to_string(), "[2]".to_string());
        let err = Config::load(None, &env).expect_err("partition 2 of 2 does not exist").to_string();
        assert!(err.contains("dispatch.partitions") && err.contains("nats.send_partitions is 2"), "{err}");
    }

    #[test]
    fn the_wire_guarantee_defaults_to_the_mark_and_refuses_an_unknown_value_by_name() {
        let cfg = Config::load(None, &Default::default()).expect("compiled defaults load");
        assert_eq!(cfg.dispatch.wire_guarantee, WireGuarantee::Mark);
        assert_eq!(cfg.dispatch.wire_lease_ms, 10_000);
        assert_eq!(cfg.dispatch.journal_max_group, 256);
        assert_eq!(cfg.dispatch.journal_checkpoint_ms, 500);
        assert_eq!(cfg.dispatch.journal_max_bytes, 64 * 1024 * 1024);
        let mut env = std::collections::HashMap::new();
        env.insert("BW_DISPATCHER__DISPATCH__WIRE_GUARANTEE".to_string(), "journal".to_string());
        let cfg = Config::load(None, &env).expect("journal is a wire guarantee");
        assert_eq!(cfg.dispatch.wire_guarantee, WireGuarantee::Journal);
        env.insert("BW_DISPATCHER__DISPATCH__WIRE_GUARANTEE".to_string(), "ledger".to_string());
        let err = Config::load(None, &env).expect_err("ledger is not one").to_string();
        assert!(err.contains("wire_guarantee") && err.contains("ledger") && err.contains("journal"), "{err}");
    }

    #[test]
    fn start_up_warns_about_an_empty_or_local_token_outside_the_local_stack_without_printing_it() {
        let empty = credentials_warning(&meta("https://graph.example", "")).expect("empty token warned");
        assert!(empty.contains("empty"));
        let local = credentials_warning(&meta("https://graph.example", "local-access-token")).expect("warned");
        assert!(!local.contains("local-access-token"), "the token is never printed: {local}");
        assert_eq!(credentials_warning(&meta("http://127.0.0.1:9400", "local-access-token")), None);
        assert_eq!(credentials_warning(&meta("https://graph.example", "EAAG-real-looking")), None);
    }
}
