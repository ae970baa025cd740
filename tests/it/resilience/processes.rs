//! kill -9 of real service processes (the binaries, not in-process tasks): a dispatcher under load, and a
//! replay worker in the middle of draining a dead-letter queue.

use super::common::{
    SENT, Verdict, breaker, dispatcher_settings, ledger, requests, services, sim, slow_harness, submit, wait_states,
};
use bw_breaker::{Breaker, BreakerConfig, Forced, Scope};
use bw_e2e::{Harness, WABA_ID};
use bw_proto::v1::OperationState;
use futures::StreamExt;
use std::time::Duration;

const PHONE: &str = "106540352242931";
const WAIT: Duration = Duration::from_secs(60);

/// Two dispatcher processes share 600 messages; one is killed with SIGKILL while it holds unacknowledged
/// messages. The survivor (with the killed one's messages redelivered after the ack wait) finishes them all.
///
/// Proves: nothing lost (accounting), every message reached Meta. A message the killed process had already
/// POSTed but not yet recorded is sent again by the survivor: that is the one duplicate a SIGKILL can cause
/// (the dispatcher keeps no "request on the wire" mark in the ledger), so duplicates are counted and bounded
/// by the killed process's in-flight limit rather than forbidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_process_killed_under_load_loses_nothing() {
    let h = slow_harness().await;
    let mut procs = services("kill-dispatcher", &["dispatcher"]);
    let mut settings = dispatcher_settings(&h.nats.url(), &h.redis.url(), &h.sim.base_url());
    const IN_FLIGHT: usize = 32;
    settings.push(("dispatch.max_in_flight", IN_FLIGHT.to_string()));
    settings.push(("dispatch.batch_size", "16".into()));
    let victim = procs.spawn("dispatcher", &settings).expect("spawn dispatcher");
    procs.spawn("dispatcher", &settings).expect("spawn dispatcher");
    procs.wait_ready(WAIT).await.expect("dispatchers ready");

    let ops = submit(&h.producer(), requests(PHONE, "k9d", 600), 64, WAIT).await;
    assert!(bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= 150 }).await, "sending started");
    procs.kill9(victim);
    let at_kill = h.sim.total_accepted();
    assert!(at_kill < 600, "the kill happened under load ({at_kill} already sent)");

    // What the killed process had on the wire ends UNKNOWN (flagged, waiting for a status webhook, which this
    // test does not process); everything else ends SENT.
    let mut settled = SENT.to_vec();
    settled.push(OperationState::Unknown);
    wait_states(&h.js, &h.buckets, &ops, &settled, WAIT).await;
    let verdict = Verdict::of(&h.js, &h.buckets, &h.sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    let entries = ledger(&h.js, &h.buckets).await;
    let unknown: Vec<&String> =
        ops.iter().filter(|op| entries.get(*op).is_some_and(|e| e.state() == OperationState::Unknown)).collect();
    assert!(unknown.len() <= IN_FLIGHT, "at most what the killed process had in flight is unknown: {}", unknown.len());
    assert!(unknown.iter().all(|op| entries[*op].flagged_unknown), "unknown outcomes are flagged");
    assert!(
        verdict.reached_meta + unknown.len() >= ops.len(),
        "every message reached Meta or waits for reconciliation"
    );
    assert!(
        verdict.duplicates.is_empty(),
        "nothing the killed process had on the wire was sent again: {:?}",
        verdict.duplicates
    );
}

/// An operator's breaker handle on the test's Redis (what the coordinator's admin API does).
async fn operator_breaker(h: &Harness) -> Breaker {
    let nats_cfg = bw_common::config::NatsConfig::single(h.nats.url(), "e2e-operator");
    let redis_cfg =
        bw_common::config::RedisConfig { timeout_ms: 1000, ..bw_common::config::RedisConfig::single(h.redis.url()) };
    let deps = bw_common::service::Deps::connect("e2e-operator", &nats_cfg, Some(&redis_cfg), Duration::from_secs(10))
        .await
        .expect("operator connects");
    Breaker::with_conn(deps.redis, Some(deps.nats), BreakerConfig::default())
}

/// The instance id holding an unexpired replay lease, if any.
async fn lease_holder(h: &Harness) -> Option<String> {
    let kv = h.js.get_key_value(bw_wire::names::REPLAY_LEASE_BUCKET).await.ok()?;
    let mut keys = kv.keys().await.ok()?;
    let now = bw_common::time::now_ms();
    while let Some(Ok(key)) = keys.next().await {
        if let Ok(Some(value)) = kv.get(&key).await {
            let text = String::from_utf8_lossy(&value).to_string();
            if let Some((holder, until)) = text.rsplit_once('|')
                && until.parse::<i64>().unwrap_or(0) > now
            {
                return Some(holder.to_string());
            }
        }
    }
    None
}

/// A forced-open breaker sends 400 messages to the DLQ; once it is cleared, two replay processes drain the
/// DLQ into the replay lane (one holds the scope's lease). The lease holder is killed with SIGKILL mid-drain;
/// its lease expires and the other instance finishes the drain.
///
/// Proves: nothing lost, every message sent exactly once (replay publishes with `<op>.r<n>` message ids and
/// checks the ledger, so the entries the killed process had fetched but not acknowledged are not doubled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_process_killed_mid_drain_leaves_the_rest_to_the_other() {
    let mut h = Harness::start(sim(false)).await;
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    h.start_dispatcher(&breaker(400)).await;
    let mut procs = services("kill-replay", &["replay", "breaker-coordinator"]);
    procs
        .spawn(
            "breaker-coordinator",
            &[
                ("nats.url", h.nats.url()),
                ("redis.url", h.redis.url()),
                ("coordinator.tick_ms", "100".into()),
                ("coordinator.scope_discovery_ms", "200".into()),
                ("coordinator.snapshot_refresh_ms", "500".into()),
                ("limits.default.rate_per_s", "400".into()),
                ("limits.default.burst", "80".into()),
                ("limits.default.min_calls", "1000000".into()),
                ("limits.default.fast_trip_failures", "0".into()),
                ("limits.default.ramp_ms", "0".into()),
                ("limits.default.pair_burst", "1000".into()),
            ],
        )
        .expect("spawn coordinator");
    let replay = |i: usize| {
        vec![
            ("nats.url", h.nats.url()),
            ("tenancy.mode", "dev".to_string()),
            ("replay.instance_id", format!("replay-{i}")),
            ("replay.soak_ms", "200".to_string()),
            ("replay.rate_per_s", "100".to_string()),
            ("replay.burst", "5".to_string()),
            ("replay.idle_ms", "100".to_string()),
            ("replay.fetch_wait_ms", "200".to_string()),
            ("replay.lease_ttl_ms", "2000".to_string()),
            ("replay.ack_wait_ms", "2000".to_string()),
            ("replay.max_lane_depth", "0".to_string()),
            ("replay.batch_size", "16".to_string()),
            ("replay.max_in_flight", "8".to_string()),
        ]
    };
    let replays = [
        procs.spawn("replay", &replay(0)).expect("spawn replay"),
        procs.spawn("replay", &replay(1)).expect("spawn replay"),
    ];
    procs.wait_ready(WAIT).await.expect("coordinator and replays ready");

    let operator = operator_breaker(&h).await;
    let scope = Scope::new(WABA_ID, PHONE);
    operator.force(&scope, Forced::Open).await.expect("forced open");
    let ops = submit(&h.producer(), requests(PHONE, "k9r", 400), 64, WAIT).await;
    wait_states(&h.js, &h.buckets, &ops, &[OperationState::Dlq], WAIT).await;
    assert_eq!(h.sim.total_accepted(), 0, "nothing reached Meta while forced open");

    operator.force(&scope, Forced::Clear).await.expect("override cleared");
    assert!(bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= 60 }).await, "replay started draining");
    let holder = lease_holder(&h).await.expect("a replay instance holds the scope's lease while draining");
    let victim = if holder == "replay-0" { replays[0] } else { replays[1] };
    procs.kill9(victim);
    let at_kill = h.sim.total_accepted();
    assert!(at_kill < 400, "killed mid-drain ({at_kill} of 400 already replayed)");

    wait_states(&h.js, &h.buckets, &ops, &SENT, WAIT).await;
    let verdict = Verdict::of(&h.js, &h.buckets, &h.sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    assert_eq!(verdict.reached_meta, ops.len());
    assert!(verdict.duplicates.is_empty(), "replay never doubles a send: {:?}", verdict.duplicates);
    let survivor = if victim == replays[0] { "replay-1" } else { "replay-0" };
    eprintln!("killed {holder} after {at_kill} replayed; {survivor} finished the drain");
}
