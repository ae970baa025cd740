//! The pooled fast trip end to end (lua/pool_evidence.lua), against the simulator with the dispatcher at its
//! compiled defaults: an outage of every number of one token trips them all, the pool among them (its evidence
//! is the sum of theirs, so it reaches its bound before any one number's own); one number failing while three
//! healthy numbers on the same token keep sending trips that number only. No timings: the tests wait for states.

use bw_e2e::Harness;
use bw_meta_sim::{Fault, FaultKind, Scenario, Selection, SimConfig, Window};
use bw_proto::v1::{BreakerState, BreakerTransition, OperationState};
use futures::StreamExt;
use prost::Message as _;
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

fn sim() -> SimConfig {
    let mut cfg = SimConfig::default();
    cfg.limits.throughput_mps = 1_000.0;
    cfg.limits.throughput_burst = 1_000;
    cfg.limits.pair_enabled = false;
    cfg
}

/// Every request of `phones` answered 503 with Meta's error body (a transient failure), from now on.
fn failing(phones: &[&str]) -> Scenario {
    let fault = FaultKind::Http { status: 503, meta_body: true, code: None, after_processing: false };
    Scenario {
        name: "token-outage".into(),
        seed: Some(7),
        selection: Selection::Deterministic,
        windows: vec![Window {
            error_rate: 1.0,
            faults: vec![Fault { kind: fault, weight: 1 }],
            phone_number_ids: phones.iter().map(|p| p.to_string()).collect(),
            ..Window::new("outage", 0, None)
        }],
        ..Scenario::default()
    }
}

/// Submits `n` orders per number, interleaved across `phones` (as traffic of one token arrives), each to a
/// recipient of its own; the operation ids per number.
async fn submit(h: &Harness, phones: &[&str], prefix: &str, n: usize) -> Vec<Vec<String>> {
    h.register(phones).await;
    let producer = h.producer();
    let mut ops = vec![Vec::new(); phones.len()];
    for i in 0..n {
        for (p, phone) in phones.iter().enumerate() {
            let op = format!("{prefix}-{p}-{i:03}");
            let reply = producer.send(&bw_e2e::order(phone, &op, p * 1_000 + i)).await.expect("ingest answers");
            assert!(reply.accepted, "{}", reply.error);
            ops[p].push(op);
        }
    }
    ops
}

/// Breaker transitions of every number, as the services publish them.
struct Transitions {
    sub: async_nats::Subscriber,
    seen: BTreeMap<String, Vec<BreakerTransition>>,
}

impl Transitions {
    async fn follow(h: &Harness) -> Transitions {
        let sub = h.client.subscribe(bw_wire::names::breaker_subject("*")).await.expect("subscribe");
        Transitions { sub, seen: BTreeMap::new() }
    }

    /// Reads what arrived within `quiet` of the last event.
    async fn drain(&mut self, quiet: Duration) {
        while let Ok(Some(msg)) = tokio::time::timeout(quiet, self.sub.next()).await {
            let t = BreakerTransition::decode(msg.payload.as_ref()).expect("transition");
            let phone = t.scope.as_ref().map(|s| s.phone_number_id.clone()).unwrap_or_default();
            self.seen.entry(phone).or_default().push(t);
        }
    }

    /// The reasons of `phone`'s trips (CLOSED -> OPEN).
    fn trips(&self, phone: &str) -> Vec<String> {
        self.seen
            .get(phone)
            .map(|v| {
                v.iter()
                    .filter(|t| t.from() == BreakerState::Closed && t.to() == BreakerState::Open)
                    .map(|t| t.reason.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits until every one of `phones` tripped, reading events as they come.
    async fn wait_trips(&mut self, phones: &[&str]) -> bool {
        let deadline = tokio::time::Instant::now() + WAIT;
        while tokio::time::Instant::now() < deadline {
            if phones.iter().all(|p| !self.trips(p).is_empty()) {
                return true;
            }
            self.drain(Duration::from_millis(200)).await;
        }
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_wide_outage_trips_every_number_of_the_token() {
    const PHONES: [&str; 4] = ["106540352270001", "106540352270002", "106540352270003", "106540352270004"];
    let mut h = Harness::start(sim()).await;
    h.sim.set_scenario(failing(&PHONES));
    let mut transitions = Transitions::follow(&h).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let ops = submit(&h, &PHONES, "wide", 40).await;
    assert!(transitions.wait_trips(&PHONES).await, "every number trips: {:?}", transitions.seen);
    let reasons: Vec<String> = PHONES.iter().flat_map(|p| transitions.trips(p)).collect();
    eprintln!("token-wide outage, trips: {reasons:?}");
    // At 100 % failures the pool holds every number's evidence, so it reaches its bound before the second
    // failing number's own evidence can: at least one number is opened by the pool.
    assert!(reasons.iter().any(|r| r.contains("pooled fast trip")), "{reasons:?}");
    // Nothing is lost meanwhile: every operation waits in the DLQ for the replay after the outage.
    let all: Vec<String> = ops.into_iter().flatten().collect();
    assert!(h.wait_all(&all, &[OperationState::Dlq], WAIT).await, "every operation waits in the DLQ");
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &all).await.expect("accounting");
    assert!(report.is_clean(), "{report}");
    assert_eq!(h.sim.oracle().total_accepted(), 0, "Meta accepted nothing during the outage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_number_among_healthy_ones_on_the_token_trips_alone() {
    const BAD: &str = "106540352271001";
    const HEALTHY: [&str; 3] = ["106540352271002", "106540352271003", "106540352271004"];
    let mut h = Harness::start(sim()).await;
    h.sim.set_scenario(failing(&[BAD]));
    let mut transitions = Transitions::follow(&h).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let phones = [BAD, HEALTHY[0], HEALTHY[1], HEALTHY[2]];
    let ops = submit(&h, &phones, "one", 40).await;
    assert!(transitions.wait_trips(&[BAD]).await, "the failing number trips: {:?}", transitions.seen);
    let healthy_ops: Vec<String> = ops[1..].iter().flatten().cloned().collect();
    assert!(h.wait_all(&healthy_ops, &SENT, WAIT).await, "the healthy numbers keep sending");
    // More traffic on the healthy numbers after the trip: still sent, still CLOSED.
    let more = submit(&h, &HEALTHY, "more", 20).await;
    let more: Vec<String> = more.into_iter().flatten().collect();
    assert!(h.wait_all(&more, &SENT, WAIT).await, "the healthy numbers keep sending after the trip");
    transitions.drain(Duration::from_millis(500)).await;
    for phone in HEALTHY {
        assert!(!transitions.seen.contains_key(phone), "{phone} changed state: {:?}", transitions.seen.get(phone));
    }
    let oracle = h.sim.oracle();
    for op in healthy_ops.iter().chain(&more) {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted exactly once");
    }
}
