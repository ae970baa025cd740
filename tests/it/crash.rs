//! Horizontal scaling and crash safety of the dispatcher: two instances share the load, one dies mid-run,
//! and the accounting check proves nothing was lost.

use bw_e2e::Harness;
use bw_meta_sim::{Latency, Scenario, SimConfig};
use bw_proto::v1::OperationState;
use std::time::Duration;

const PHONE: &str = "106540352242923";

fn slow_meta() -> Scenario {
    // Every call takes ~20 ms so work is in flight when an instance dies.
    Scenario { name: "slow".into(), latency: Some(Latency::Fixed { ms: 20 }), ..Scenario::default() }
}

fn unlimited() -> SimConfig {
    let mut cfg = SimConfig::default();
    cfg.limits.throughput_mps = 1_000.0;
    cfg.limits.throughput_burst = 1_000;
    cfg
}

async fn settled(h: &Harness, ops: &[String]) -> bool {
    let done = [OperationState::Sent, OperationState::Delivered, OperationState::Read, OperationState::Unknown];
    h.wait_all(ops, &done, Duration::from_secs(60)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_share_the_load_and_send_each_message_once() {
    let mut h = Harness::start(unlimited()).await;
    h.sim.set_scenario(slow_meta());
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    h.start_dispatcher(&[]).await;
    h.start_dispatcher(&[]).await;
    let ops = h.submit_orders(PHONE, "share", 300).await;
    assert!(settled(&h, &ops).await, "all sent");
    let oracle = h.sim.oracle();
    for op in &ops {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} sent exactly once");
    }
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &ops).await.expect("accounting");
    assert_eq!(report.lost_count(), 0, "{:?}", report.lost);
    assert!(report.is_clean(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_killed_under_load_loses_nothing() {
    let mut h = Harness::start(unlimited()).await;
    h.sim.set_scenario(slow_meta());
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    let victim = h.start_dispatcher(&[("dispatch.ack_wait_ms", "3000".into())]).await;
    h.start_dispatcher(&[("dispatch.ack_wait_ms", "3000".into())]).await;
    let ops = h.submit_orders(PHONE, "kill", 400).await;
    // Kill one instance while it holds unacknowledged messages.
    assert!(bw_testkit::wait_until(Duration::from_secs(20), || async { h.sim.total_accepted() >= 50 }).await);
    h.abort(victim);
    assert!(settled(&h, &ops).await, "the surviving dispatcher finished everything");
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &ops).await.expect("accounting");
    assert_eq!(report.lost_count(), 0, "{:?}", report.lost);
    let oracle = h.sim.oracle();
    for op in &ops {
        let count = oracle.get(op).map(|e| e.count).unwrap_or(0);
        let entry = h.ledger_entry(op).await.expect("entry").entry;
        // What the killed instance had on the wire is reconciled, never resent: nothing reaches Meta twice,
        // and an operation whose outcome died with the instance is flagged unknown.
        assert!(count <= 1, "{op} reached Meta {count} times");
        if entry.state() == OperationState::Unknown {
            assert!(entry.flagged_unknown, "{op}");
        } else {
            assert_eq!(count, 1, "{op} is {:?} so Meta must have it once", entry.state());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_in_flight_messages() {
    let mut h = Harness::start(unlimited()).await;
    h.sim.set_scenario(Scenario {
        name: "slow".into(),
        latency: Some(Latency::Fixed { ms: 200 }),
        ..Scenario::default()
    });
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    let d = h.start_dispatcher(&[]).await;
    let ops = h.submit_orders(PHONE, "drain", 100).await;
    assert!(bw_testkit::wait_until(Duration::from_secs(20), || async { h.sim.counters().requests >= 10 }).await);
    h.stop(d).await.expect("run returns Ok on shutdown");
    // Every call that reached Meta before the stop was finished and recorded: nothing Meta accepted is left
    // looking queued (which would make it look unsent), and nothing unsent looks sent.
    let oracle = h.sim.oracle();
    for op in &ops {
        let state = h.ledger_entry(op).await.expect("entry").entry.state();
        let accepted = oracle.get(op).map(|e| e.count).unwrap_or(0);
        match state {
            OperationState::Sent => assert_eq!(accepted, 1, "{op}"),
            OperationState::Queued => assert_eq!(accepted, 0, "{op} still queued, never sent"),
            other => panic!("{op} in unexpected state {other:?}"),
        }
    }
    // A new instance picks up the rest.
    h.start_dispatcher(&[]).await;
    assert!(settled(&h, &ops).await);
}
