//! Per-recipient order survives a kill -9 of one of two dispatcher processes mid-run (issue #14): every
//! recipient gets a sequence of messages, each submitted after ingest accepted the one before; one dispatcher
//! is killed with SIGKILL while it holds messages on the wire. Judged by the accounting check, the oracle's
//! duplicates and the oracle's acceptance order (`bw_e2e::order_violations`), at the compiled default order
//! config (transactional keeps order).

use super::common::{SENT, Verdict, dispatcher_settings, ledger, services, slow_harness, wait_states};
use bw_e2e::{WABA_ID, order_violations};
use bw_proto::v1::{OperationState, RejectReason, SendRequest};
use std::time::{Duration, Instant};

const PHONE: &str = "106540352250009";
const WAIT: Duration = Duration::from_secs(90);
const RECIPIENTS: usize = 40;
const PER_RECIPIENT: usize = 8;

fn request(r: usize, k: usize) -> SendRequest {
    bw_client::Request::template(
        &format!("k9o-{r:02}-{k}"),
        WABA_ID,
        PHONE,
        &format!("+54911{r:08}"),
        "order_update",
        "es_AR",
    )
    .param("1")
    .category(bw_proto::v1::Category::Transactional)
    .build()
}

/// Sends one recipient's messages one after the other (each after ingest accepted the previous one),
/// retrying an "unavailable" answer with the same operation id.
async fn send_in_order(client: bw_client::Client, r: usize) -> Vec<String> {
    let mut ops = Vec::new();
    for k in 0..PER_RECIPIENT {
        let req = request(r, k);
        let deadline = Instant::now() + WAIT;
        loop {
            match client.send(&req).await {
                Ok(reply) if reply.accepted => break,
                Ok(reply) if reply.reason() == RejectReason::Unavailable => {}
                Ok(reply) => panic!("{} rejected: {:?} {}", req.operation_id, reply.reason(), reply.error),
                Err(_) => {}
            }
            assert!(Instant::now() < deadline, "{} never accepted", req.operation_id);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ops.push(req.operation_id);
    }
    ops
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_holds_when_one_of_two_dispatcher_processes_is_killed_mid_run() {
    let h = slow_harness().await;
    let mut procs = services("kill-dispatcher-order", &["dispatcher"]);
    let settings = dispatcher_settings(&h.nats.url(), &h.redis.url(), &h.sim.base_url());
    let victim = procs.spawn("dispatcher", &settings).expect("spawn dispatcher");
    procs.spawn("dispatcher", &settings).expect("spawn dispatcher");
    procs.wait_ready(WAIT).await.expect("dispatchers ready");

    let producers: Vec<_> = (0..RECIPIENTS).map(|r| tokio::spawn(send_in_order(h.producer(), r))).collect();
    let total = RECIPIENTS * PER_RECIPIENT;
    assert!(
        bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= (total / 4) as u64 }).await,
        "sending started"
    );
    procs.kill9(victim);
    let at_kill = h.sim.total_accepted();
    assert!(at_kill < total as u64, "the kill happened mid-run ({at_kill} of {total} already sent)");
    let mut accepted = Vec::new();
    for p in producers {
        accepted.extend(p.await.expect("producer"));
    }

    // What the killed process had on the wire ends UNKNOWN (flagged; this test processes no status webhooks),
    // which releases the messages behind it; everything else ends SENT.
    let mut settled = SENT.to_vec();
    settled.push(OperationState::Unknown);
    wait_states(&h.js, &h.buckets, &accepted, &settled, WAIT).await;
    let oracle = h.sim.oracle();
    let verdict = Verdict::of(&h.js, &h.buckets, &oracle, &accepted).await;
    verdict.assert_nothing_lost();
    assert!(verdict.duplicates.is_empty(), "nothing was sent twice: {:?}", verdict.duplicates);
    let entries = ledger(&h.js, &h.buckets).await;
    let unknown = accepted.iter().filter(|op| entries.get(*op).is_some_and(|e| e.state() == OperationState::Unknown));
    assert!(unknown.clone().all(|op| entries[op].flagged_unknown), "unknown outcomes are flagged");
    eprintln!("killed at {at_kill} of {total}; {} unknown, {} reached Meta", unknown.count(), verdict.reached_meta);
    let violations = order_violations(&oracle, &accepted);
    assert!(violations.is_empty(), "Meta accepted later messages first: {violations:?}");
}
