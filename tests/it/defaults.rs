//! Meta's limits at the compiled default configuration: the dispatcher as users run it, the simulator at
//! Meta's documented limits (pair: one message per 6 s to a user, burst 45), which answers every refusal it
//! causes as limit-caused (not injected), so a self-inflicted 131056 cannot hide.

use bw_common::proto::{Category, OperationState};
use bw_e2e::{Harness, WABA_ID};
use std::time::Duration;

const PHONE: &str = "106540352247001";

/// A storm to one customer (an order flow that sends many updates at once): 41 messages in a row, one more
/// than the default pair burst (40). The first 40 go at once, the 41st waits for the pair's 6 s slot; Meta
/// never answers 131056, and each is accepted exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_storm_at_defaults_draws_no_131056_and_paces_past_the_burst() {
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    let producer = h.producer();
    let mut ops = Vec::new();
    for i in 0..41 {
        let op = format!("storm-{i:02}");
        let request = bw_client::Request::template(&op, WABA_ID, PHONE, "+5491155550777", "order_update", "es_AR")
            .param(&i.to_string())
            .category(Category::Transactional)
            .build();
        let reply = producer.send(&request).await.expect("ingest answers");
        assert!(reply.accepted, "rejected: {}", reply.error);
        ops.push(op);
    }
    let sent = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
    assert!(h.wait_all(&ops, &sent, Duration::from_secs(60)).await, "every message of the storm reached Meta");
    let counters = h.sim.counters();
    assert_eq!(counters.outcome("131056"), 0, "no 131056 at all: {:?}", counters.by_outcome);
    assert_eq!(counters.limit_exceeded("131056"), 0);
    let oracle = h.sim.oracle();
    let mut times: Vec<u64> = ops
        .iter()
        .map(|op| {
            let e = oracle.get(op).expect("accepted");
            assert_eq!(e.count, 1, "{op} accepted once");
            e.first_accepted_ms
        })
        .collect();
    times.sort_unstable();
    // 40 within the burst, the 41st at least one emission interval (6 s) after the first, as Meta's GCRA needs.
    let spread = times[40] - times[0];
    assert!(spread >= 6_000 - 50, "the 41st waited for the pair's slot (came {spread} ms after the first)");
}
