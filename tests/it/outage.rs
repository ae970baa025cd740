//! A real outage end to end: Meta fails, the breaker trips on the error rate, sends fail fast into the DLQ
//! instead of hammering Meta, and once Meta recovers and the breaker closes, replay sends every operation exactly
//! once.

use crate::dispatch::failing;
use bw_e2e::Harness;
use bw_meta_sim::{FaultKind, SimConfig};
use bw_proto::v1::{BreakerState, BreakerTransition, OperationState};
use futures::StreamExt;
use prost::Message as _;
use std::time::Duration;

const PHONE: &str = "106540352240001";
const N: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_trips_the_breaker_diverts_to_the_dlq_and_recovery_replays_everything_once() {
    outage_round(&[]).await;
}

/// The same outage with the dispatcher's and the coordinator's breaker state on a 3-master Redis Cluster,
/// chosen by config alone (`redis.cluster_nodes`; `redis.url` points at nothing, so a single-node fallback
/// would fail): trip, fail fast, cooldown ticks, close and replay all run against the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_outage_runs_unchanged_with_the_services_on_a_redis_cluster() {
    let cluster = bw_testkit::RedisCluster::start();
    let nodes = format!("[{}]", cluster.urls().iter().map(|u| format!("\"{u}\"")).collect::<Vec<_>>().join(","));
    let nowhere = format!("redis://127.0.0.1:{}", bw_testkit::free_port());
    outage_round(&[("redis.cluster_nodes", nodes), ("redis.url", nowhere)]).await;
    // The scope's keys live on the cluster (one hash tag, so one node), and its index too.
    let mut found = 0;
    for url in cluster.urls() {
        let mut conn =
            redis::Client::open(url.as_str()).expect("url").get_multiplexed_async_connection().await.expect("node");
        let keys: Vec<String> =
            redis::cmd("KEYS").arg(format!("bw:*{PHONE}*")).query_async(&mut conn).await.expect("keys");
        found += keys.len();
    }
    assert!(found >= 2, "the scope's state and config hashes are on the cluster ({found} keys)");
}

/// Runs the outage round; `redis` overrides the Redis config of the dispatcher and the coordinator.
async fn outage_round(redis: &[(&str, String)]) {
    let mut h = Harness::start(SimConfig::default()).await;
    // Every call fails with a 503 for the first 1.5 s.
    h.sim.set_scenario(failing(
        0,
        Some(1_500),
        FaultKind::Http { status: 503, meta_body: true, code: None, after_processing: false },
    ));
    let mut transitions = h.client.subscribe(bw_wire::names::breaker_subject(PHONE)).await.expect("subscribe");
    // Breaker limits that trip and recover within a second or two (bw_e2e::FastBreaker), on both sides.
    let keys = |prefix: &str| bw_e2e::FastBreaker::default().settings(prefix);
    let (mut coordinator, mut dispatcher) = (keys("limits.default"), keys("breaker.defaults"));
    for (k, v) in redis {
        coordinator.push((k.to_string(), v.clone()));
        dispatcher.push((k.to_string(), v.clone()));
    }
    h.start_ingest(&[]).await;
    h.start_coordinator(&coordinator.iter().map(|(k, v)| (k.as_str(), v.clone())).collect::<Vec<_>>()).await;
    h.start_dispatcher(&dispatcher.iter().map(|(k, v)| (k.as_str(), v.clone())).collect::<Vec<_>>()).await;
    h.start_replay(&[
        ("replay.rate_per_s", "100".into()),
        ("replay.burst", "5".into()),
        ("replay.probe_rate_per_s", "5".into()),
    ])
    .await;

    let ops = h.submit_orders(PHONE, "outage", N).await;
    let sent = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
    if !h.wait_all(&ops, &sent, Duration::from_secs(40)).await {
        let mut states = std::collections::BTreeMap::<String, usize>::new();
        for op in &ops {
            let e = h.ledger_entry(op).await.map(|v| v.entry);
            let key = e.map(|e| format!("{} ({})", e.state().label(), e.reason)).unwrap_or_else(|| "none".into());
            *states.entry(key).or_default() += 1;
        }
        panic!("not every operation reached Meta after the recovery: {states:?}");
    }

    let oracle = h.sim.oracle();
    for op in &ops {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted exactly once");
    }
    let mut replayed = 0;
    for op in &ops {
        if h.ledger_entry(op).await.expect("entry").entry.replays > 0 {
            replayed += 1;
        }
    }
    assert!(replayed > 0, "some operations went through the DLQ and were replayed");
    // Without the breaker every one of the 60 messages would have failed at least once (up to 240 failed calls
    // with 3 retries each). How many calls were already in flight when the trip landed depends on scheduling
    // (20 are admitted at once, the burst), so the bound is "fewer failed calls than messages": some messages
    // must have failed fast into the DLQ without a call.
    let failed_calls = h.sim.counters().outcome("2");
    eprintln!("outage: {failed_calls} failed calls, {replayed} of {N} replayed from the DLQ");
    assert!(failed_calls > 0 && failed_calls < N as u64, "failed calls during the outage: {failed_calls}");

    let mut seen = Vec::new();
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(100), transitions.next()).await {
        let t = BreakerTransition::decode(msg.payload.as_ref()).expect("transition");
        seen.push((t.from(), t.to()));
    }
    assert!(seen.contains(&(BreakerState::Closed, BreakerState::Open)), "tripped on the error rate: {seen:?}");
    assert_eq!(seen.last().map(|t| t.1), Some(BreakerState::Closed), "closed after the recovery: {seen:?}");

    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &ops).await.expect("accounting");
    assert!(report.is_clean(), "{report}");
}
