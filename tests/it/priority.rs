//! Priority follows the message, and deadlines drive recovery (issue #14, parts 1 and 3), against real servers:
//! after an outage every dead-lettered priority message reaches Meta before any marketing message of its sender;
//! a promotion waits while its sender has a priority DLQ entry; an OTP that cannot make its deadline ends EXPIRED
//! without a call; the nearer deadline goes first within a batch.

use crate::dispatch::failing;
use bw_e2e::{Harness, WABA_ID, pairs};
use bw_meta_sim::{FaultKind, SimConfig};
use bw_proto::v1::{BreakerState, BreakerTransition, Category, DlqEnvelope, DlqReason, OperationState, SendRequest};
use bw_wire::names;
use futures::StreamExt;
use prost::Message as _;
use std::time::Duration;

const PHONE: &str = "106540352249001";
const WAIT: Duration = Duration::from_secs(30);
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

fn request(op: &str, i: usize, category: Category) -> SendRequest {
    let template = if category == Category::Marketing { "flash_sale" } else { "order_confirmation" };
    // Promotions go to other customers than the confirmations: per-recipient order (which would also hold a
    // promotion behind a confirmation to the same person) must not be what these tests observe.
    let customer = if category == Category::Marketing { 50_000 + i } else { i };
    bw_client::Request::template(op, WABA_ID, PHONE, &format!("+54911777{customer:05}"), template, "es_AR")
        .param("1")
        .category(category)
        .build()
}

async fn submit(h: &Harness, r: &SendRequest) {
    let reply = h.producer().send(r).await.expect("ingest answers");
    assert!(reply.accepted, "rejected: {}", reply.error);
}

async fn submit_all(h: &Harness, prefix: &str, from: usize, n: usize, category: Category) -> Vec<String> {
    let mut ops = Vec::new();
    for i in from..from + n {
        let op = format!("{prefix}-{i:04}");
        submit(h, &request(&op, i, category)).await;
        ops.push(op);
    }
    ops
}

/// Fast trips and closes, a slow sender (20/s: sends 50 ms apart, so acceptance order is unambiguous).
fn limits(prefix: &str) -> Vec<(String, String)> {
    bw_e2e::FastBreaker { rate_per_s: 20, burst: 5, canaries_per_s: 5, ..Default::default() }.settings(prefix)
}

async fn wait_closed(transitions: &mut async_nats::Subscriber) {
    let closed = tokio::time::timeout(WAIT, async {
        while let Some(msg) = transitions.next().await {
            let t = BreakerTransition::decode(msg.payload.as_ref()).expect("transition");
            if t.to() == BreakerState::Closed {
                return;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the breaker closed after the recovery");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_every_dead_lettered_priority_message_goes_before_any_marketing_one() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(failing(
        0,
        None,
        FaultKind::Http { status: 503, meta_body: true, code: None, after_processing: false },
    ));
    let mut transitions = h.client.subscribe(names::breaker_subject(PHONE)).await.expect("subscribe");
    h.start_ingest(&[]).await;
    h.start_coordinator(&pairs(&limits("limits.default"))).await;
    for _ in 0..2 {
        h.start_dispatcher(&pairs(&limits("breaker.defaults"))).await;
        h.start_replay(&[]).await;
    }

    // During the outage: order confirmations and promotions of one sender, interleaved.
    let mut priority = Vec::new();
    let mut marketing = Vec::new();
    for round in 0..4 {
        priority.extend(submit_all(&h, "order", round * 5, 5, Category::Transactional).await);
        marketing.extend(submit_all(&h, "promo", round * 5, 5, Category::Marketing).await);
    }
    let all: Vec<String> = priority.iter().chain(&marketing).cloned().collect();
    // Every order confirmation is dead-lettered. A promotion is dead-lettered too, or still waits unsent in
    // BW_SEND: while the breaker is HALF_OPEN the dispatcher does not know it is OPEN, so the priority gate
    // holds the sender's promotions (the confirmations are in the DLQ) instead of failing them into it. That
    // includes one whose first try failed and that came back for its retry while the gate held (held longer
    // with each delivery, it can keep missing the short OPEN windows of this test's breaker).
    let dead_lettered = bw_testkit::wait_until(WAIT, || async {
        for op in &all {
            let Some(v) = h.ledger_entry(op).await else { return false };
            let e = &v.entry;
            let waiting_promotion = e.category() == Category::Marketing
                && e.state() == OperationState::Queued
                && e.in_flight_since_unix_ms == 0;
            if e.state() != OperationState::Dlq && e.replays == 0 && !waiting_promotion {
                return false;
            }
        }
        true
    })
    .await;
    if !dead_lettered {
        let mut states = std::collections::BTreeMap::<String, usize>::new();
        for op in &all {
            let e = h.ledger_entry(op).await.map(|v| v.entry);
            let key = e.map(|e| format!("{} r{} ({})", e.state().label(), e.replays, e.reason)).unwrap_or_default();
            *states.entry(key).or_default() += 1;
        }
        panic!("every message of the outage went to the DLQ: {states:?}");
    }

    // Meta recovers; once the breaker is CLOSED, new promotions arrive.
    h.sim.clear_scenario();
    wait_closed(&mut transitions).await;
    let live = submit_all(&h, "promo-live", 100, 10, Category::Marketing).await;
    marketing.extend(live);

    let every: Vec<String> = priority.iter().chain(&marketing).cloned().collect();
    if !h.wait_all(&every, &SENT, Duration::from_secs(60)).await {
        let mut states = std::collections::BTreeMap::<String, usize>::new();
        for op in &every {
            let e = h.ledger_entry(op).await.map(|v| v.entry);
            let key = e.map(|e| format!("{} ({})", e.state().label(), e.reason)).unwrap_or_else(|| "none".into());
            *states.entry(key).or_default() += 1;
        }
        panic!("not everything reached Meta after the recovery: {states:?}");
    }
    let oracle = h.sim.oracle();
    let accepted = |op: &String| oracle.get(op).map(|e| e.first_accepted_ms).expect("accepted");
    for op in &every {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted exactly once");
    }
    let last_priority = priority.iter().map(accepted).max().expect("priority ops");
    let (first_promo_ms, first_promo) = marketing.iter().map(|op| (accepted(op), op)).min().expect("marketing ops");
    eprintln!("priority: last accepted at {last_priority}; marketing: first ({first_promo}) at {first_promo_ms}");
    assert!(
        last_priority < first_promo_ms,
        "{first_promo} (marketing) was accepted {} ms before the last dead-lettered priority message",
        last_priority - first_promo_ms
    );
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &every).await.expect("accounting");
    assert!(report.is_clean(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_waits_while_its_sender_has_a_priority_message_in_the_dlq() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.start_ingest(&[]).await;
    h.start_coordinator(&[]).await;
    // The gate at the dispatcher's compiled defaults (250 ms backlog refresh, 500 ms hold), sender registered.
    h.register(&[PHONE]).await;
    h.start_dispatcher_at_defaults().await;
    // The sender is known and CLOSED.
    submit(&h, &request("warm-up", 0, Category::Transactional)).await;
    assert!(h.wait_state("warm-up", &SENT, WAIT).await);

    let otp = request("otp-dlq", 1, Category::Authentication);
    put_in_dlq(&h, &otp).await;
    submit(&h, &request("promo-held", 2, Category::Marketing)).await;
    // The promotion is fetched again and again and never sent while the OTP waits in the DLQ.
    let redelivered = low_lane_deliveries_reach(&h, 3).await;
    assert!(redelivered, "the promotion was fetched three times");
    assert!(h.sim.oracle().get("promo-held").is_none(), "no promotion while a priority message waits in the dlq");
    let entry = h.ledger_entry("promo-held").await.expect("entry").entry;
    assert_eq!((entry.state(), entry.attempts), (OperationState::Queued, 0), "held back, ledger unchanged");

    // Replay takes the OTP out of the DLQ: it goes first, then the promotion.
    h.start_replay(&[]).await;
    assert!(h.wait_all(&["otp-dlq".to_string(), "promo-held".to_string()], &SENT, WAIT).await);
    let oracle = h.sim.oracle();
    let at = |op: &str| oracle.get(op).map(|e| e.first_accepted_ms).expect("accepted");
    assert!(at("otp-dlq") < at("promo-held"), "the dead-lettered OTP went before the promotion");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_waiting_in_memory_for_tokens_is_held_once_a_priority_message_reaches_the_dlq() {
    let mut h = Harness::start(SimConfig::default()).await;
    // One token a second and no reserve: every promotion after the first is refused for tokens and waits in
    // the dispatcher's memory for its turn (hold_max_ms raised from 1 s so that three of them do; the gate
    // itself runs at its compiled defaults: 250 ms backlog refresh, 500 ms hold).
    let limits = [("rate_per_s", "1"), ("burst", "1"), ("reserve_fraction", "0"), ("pair_burst", "1000")];
    let under = |prefix: &str| -> Vec<(String, String)> {
        limits.iter().map(|(k, v)| (format!("{prefix}.{k}"), v.to_string())).collect()
    };
    let mut dispatcher = under("breaker.defaults");
    dispatcher.push(("dispatch.hold_max_ms".into(), "4000".into()));
    dispatcher.push(("dispatch.ack_wait_ms".into(), "30000".into()));
    h.start_ingest(&[]).await;
    h.start_coordinator(&pairs(&under("limits.default"))).await;
    h.start_dispatcher(&pairs(&dispatcher)).await;
    let promos = submit_all(&h, "promo-wait", 0, 5, Category::Marketing).await;
    let sent = |oracle: &bw_meta_sim::OracleSnapshot| -> Vec<String> {
        promos.iter().filter(|op| oracle.get(op).is_some()).cloned().collect()
    };
    assert!(bw_testkit::wait_until(WAIT, || async { !sent(&h.sim.oracle()).is_empty() }).await, "one promotion went");

    // A priority message reaches the DLQ while the others wait in memory for their tokens.
    let otp = request("otp-while-waiting", 9, Category::Authentication);
    put_in_dlq(&h, &otp).await;
    let before: Vec<String> = sent(&h.sim.oracle());
    let waiting: Vec<String> = promos.iter().filter(|op| !before.contains(op)).cloned().collect();
    // One goes at once and the next a second later: at least three were still waiting (two of them in memory)
    // unless this step took over two seconds.
    assert!(waiting.len() >= 3, "promotions still waiting when the OTP was dead-lettered: {waiting:?}");
    // The next one's turn comes; the gate sends it back to the broker (a redelivery) instead of to Meta.
    let redelivered = low_lane_deliveries_reach(&h, promos.len() as u64 + 1).await;
    assert!(redelivered, "a waiting promotion came back through the broker");
    let oracle = h.sim.oracle();
    let early: Vec<&String> = waiting.iter().filter(|op| oracle.get(op).is_some()).collect();
    assert!(early.is_empty(), "sent while a priority message waited in the DLQ: {early:?}");

    // Replay takes the OTP out of the DLQ: it goes before every promotion that was waiting.
    h.start_replay(&[]).await;
    let mut all = waiting.clone();
    all.push(otp.operation_id.clone());
    assert!(h.wait_all(&all, &SENT, Duration::from_secs(60)).await, "everything went after the replay");
    let oracle = h.sim.oracle();
    let at = |op: &str| oracle.get(op).map(|e| e.first_accepted_ms).expect("accepted");
    for op in &waiting {
        assert!(at(&otp.operation_id) < at(op), "the dead-lettered OTP went before {op}");
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted exactly once");
    }
}

/// Waits until the dispatcher's consumer of the marketing lane (`lo`) has made `n` deliveries (redeliveries
/// included).
async fn low_lane_deliveries_reach(h: &Harness, n: u64) -> bool {
    bw_testkit::wait_until(WAIT, || async {
        let Ok(stream) = h.js.get_stream(names::SEND_STREAM).await else { return false };
        let Ok(mut consumer) = stream
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(names::Lane::Low.dispatcher_consumer())
            .await
        else {
            return false;
        };
        consumer.info().await.map(|i| i.delivered.consumer_sequence >= n).unwrap_or(false)
    })
    .await
}

/// Puts `r` in the DLQ as the dispatcher does: ledger DLQ, then the envelope on the priority class subject.
async fn put_in_dlq(h: &Harness, r: &SendRequest) {
    let entry = bw_common::ledger::entry_for(r, OperationState::Dlq);
    h.ledger.create(&entry).await.expect("ledger entry");
    let envelope = DlqEnvelope {
        request: Some(r.clone()),
        reason: DlqReason::BreakerOpen as i32,
        dead_lettered_at_unix_ms: bw_common::time::now_ms(),
        ..Default::default()
    };
    let subject = names::dlq_subject(r.category(), &r.phone_number_id);
    assert_eq!(subject, format!("bw.dlq.v1.p.{PHONE}"), "a priority entry");
    let headers = names::msg_id_headers(&format!("{}.dlq.test", r.operation_id));
    bw_common::nats::publish_durable(&h.js, subject, headers, envelope.encode_to_vec().into())
        .await
        .expect("dlq entry stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otp_whose_deadline_passes_while_its_sender_is_open_ends_expired_without_a_call() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(failing(
        0,
        None,
        FaultKind::Http { status: 503, meta_body: true, code: None, after_processing: false },
    ));
    let mut transitions = h.client.subscribe(names::breaker_subject(PHONE)).await.expect("subscribe");
    // A breaker that trips quickly and then stays OPEN for its compiled default cooldown.
    let trip = [("failure_threshold", "0.5"), ("failure_z", "0.0"), ("min_calls", "5"), ("pair_burst", "1000")];
    let coordinator: Vec<(String, String)> =
        trip.iter().map(|(k, v)| (format!("limits.default.{k}"), v.to_string())).collect();
    let dispatcher: Vec<(String, String)> =
        trip.iter().map(|(k, v)| (format!("breaker.defaults.{k}"), v.to_string())).collect();
    h.start_ingest(&[]).await;
    h.start_coordinator(&pairs(&coordinator)).await;
    h.start_dispatcher(&pairs(&dispatcher)).await;
    let orders = submit_all(&h, "trip", 0, 10, Category::Transactional).await;
    let opened = tokio::time::timeout(WAIT, async {
        while let Some(msg) = transitions.next().await {
            let t = BreakerTransition::decode(msg.payload.as_ref()).expect("transition");
            if t.to() == BreakerState::Open {
                return t.open_until_unix_ms;
            }
        }
        0
    })
    .await
    .expect("the breaker opened");
    // Every order is dead-lettered (fail-fast or retries exhausted): no call is under way any more.
    assert!(h.wait_all(&orders, &[OperationState::Dlq], WAIT).await, "the orders went to the DLQ");
    let calls_before = h.sim.counters().requests;
    let now = bw_common::time::now_ms();
    assert!(opened > now + 2_000, "OPEN for a while yet (until {opened}, now {now})");

    // The OTP's deadline falls before the breaker may reopen: it cannot make it.
    let deadline = now + (opened - now) / 2;
    let otp = bw_client::Request::template("otp-late", WABA_ID, PHONE, "+5491177700099", "otp", "es_AR")
        .param("123456")
        .category(Category::Authentication)
        .deadline_unix_ms(deadline)
        .build();
    submit(&h, &otp).await;
    assert!(h.wait_state("otp-late", &[OperationState::Expired], WAIT).await, "the OTP ended EXPIRED");
    let entry = h.ledger_entry("otp-late").await.expect("entry").entry;
    assert_eq!(entry.reason, "deadline before the sender's breaker reopens; never sent");
    assert_eq!(entry.attempts, 0, "no try was made");
    assert!(bw_common::time::now_ms() < deadline, "expired before its deadline, as soon as it could not make it");
    assert!(h.sim.oracle().get("otp-late").is_none(), "the simulator never saw it");
    assert_eq!(h.sim.counters().requests, calls_before, "the simulator never saw it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn within_a_batch_the_nearer_deadline_goes_first() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.start_ingest(&[]).await;
    let now = bw_common::time::now_ms();
    // Stored in this order on the hi lane before any dispatcher runs: the far deadline first.
    let mut ops = Vec::new();
    for (i, (op, deadline)) in
        [("otp-far", now + 120_000), ("otp-none", 0), ("otp-near", now + 60_000)].iter().enumerate()
    {
        let r = bw_client::Request::template(op, WABA_ID, PHONE, &format!("+54911777{i:05}"), "otp", "es_AR")
            .param("123456")
            .category(Category::Authentication)
            .deadline_unix_ms(*deadline)
            .build();
        submit(&h, &r).await;
        ops.push(op.to_string());
    }
    // A slow sender (2/s: sends 500 ms apart) so the order of acceptance is the order of admission.
    h.start_dispatcher(&[("breaker.defaults.rate_per_s", "2".into()), ("breaker.defaults.burst", "3".into())]).await;
    assert!(h.wait_all(&ops, &SENT, WAIT).await);
    let oracle = h.sim.oracle();
    let at = |op: &str| oracle.get(op).map(|e| e.first_accepted_ms).expect("accepted");
    assert!(at("otp-near") < at("otp-far"), "near deadline first: {} vs {}", at("otp-near"), at("otp-far"));
    assert!(at("otp-far") < at("otp-none"), "a message without a deadline goes last in its class");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_older_than_the_last_replay_is_dropped_without_a_call() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.start_ingest(&[]).await;
    // The operation went to the DLQ and replay took it out again (replay 1); a redelivered live copy turns up.
    let r = request("stale-copy", 3, Category::Transactional);
    let mut entry = bw_common::ledger::entry_for(&r, OperationState::Queued);
    entry.replays = 1;
    h.ledger.create(&entry).await.expect("ledger entry");
    let headers = names::msg_id_headers("stale-copy.live");
    bw_common::nats::publish_durable(
        &h.js,
        names::outbox_subject(names::Lane::High, PHONE),
        headers,
        r.encode_to_vec().into(),
    )
    .await
    .expect("stale copy stored");
    h.start_dispatcher_at_defaults().await;
    let consumed = bw_testkit::wait_until(WAIT, || async {
        let Ok(mut s) = h.js.get_stream(names::SEND_STREAM).await else { return false };
        s.info().await.map(|i| i.state.messages == 0).unwrap_or(false)
    })
    .await;
    assert!(consumed, "the stale copy was consumed");
    assert!(h.sim.oracle().get("stale-copy").is_none(), "the stale copy was not sent");
    assert_eq!(h.sim.counters().requests, 0, "no call at all");
    let after = h.ledger_entry("stale-copy").await.expect("entry").entry;
    assert_eq!((after.state(), after.replays), (OperationState::Queued, 1), "the newer copy still owns it");
}
