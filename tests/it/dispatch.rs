//! Every row of the dispatcher's classification table, against the simulator, with real NATS and Redis.

use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::{Fault, FaultKind, Scenario, Selection, SimConfig, Window};
use bw_proto::v1::{Category, DlqEnvelope, DlqReason, OperationState, QuarantineEntry, SendRequest, Signal};
use bw_wire::names;
use futures::StreamExt;
use prost::Message as _;
use std::time::Duration;

const PHONE: &str = "106540352242922";
const WAIT: Duration = Duration::from_secs(20);

fn order(op: &str, i: usize) -> SendRequest {
    bw_client::Request::template(op, WABA_ID, PHONE, &format!("+54911555{:05}", i), "order_confirmation", "es_AR")
        .param("1234")
        .category(Category::Transactional)
        .build()
}

pub(crate) fn failing(start_ms: u64, duration_ms: Option<u64>, kind: FaultKind) -> Scenario {
    Scenario {
        name: "test".into(),
        seed: Some(7),
        selection: Selection::Deterministic,
        latency: None,
        windows: vec![Window {
            name: "fail".into(),
            start_ms,
            duration_ms,
            error_rate: 1.0,
            faults: vec![Fault { kind, weight: 1 }],
            latency: None,
            phone_number_ids: vec![],
        }],
        ..Scenario::default()
    }
}

async fn submit(h: &Harness, request: &SendRequest) {
    let reply = h.producer().send(request).await.expect("ingest answers");
    assert!(reply.accepted, "rejected: {}", reply.error);
}

async fn stream_payloads(h: &Harness, stream: &str) -> Vec<bytes::Bytes> {
    let mut out = Vec::new();
    let mut s = h.js.get_stream(stream).await.expect("stream");
    let info = s.info().await.expect("info");
    for seq in info.state.first_sequence..=info.state.last_sequence {
        if let Ok(m) = s.get_raw_message(seq).await {
            out.push(m.payload);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_are_retried_with_backoff_then_sent_once() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(failing(
        0,
        Some(1_500),
        FaultKind::Http { status: 503, meta_body: true, code: None, after_processing: false },
    ));
    h.start_ingest(&[]).await;
    // Retries at least 600 ms apart, so the 3 retries outlast the 1.5 s of 503s (the harness's 100..500 ms would
    // spend all 4 tries inside it now that the pair limit no longer holds the 3rd send to one recipient for 6 s).
    h.start_dispatcher(&[("dispatch.retry_base_ms", "600".into()), ("dispatch.retry_cap_ms", "1000".into())]).await;
    submit(&h, &order("retry-1", 1)).await;
    assert!(
        h.wait_state("retry-1", &[OperationState::Sent, OperationState::Delivered, OperationState::Read], WAIT).await
    );
    let entry = h.ledger_entry("retry-1").await.expect("entry").entry;
    assert!(entry.attempts >= 2, "at least one failed try before success, got {}", entry.attempts);
    assert_eq!(h.sim.oracle().get("retry-1").expect("accepted").count, 1);
    assert!(h.sim.counters().outcome("2") >= 1, "the simulator answered 503/code 2 first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_exhaust_three_retries_into_the_dlq() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(failing(0, None, FaultKind::Error { code: 131000, http_status: None, subcode: None }));
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    submit(&h, &order("exhaust-1", 1)).await;
    assert!(h.wait_state("exhaust-1", &[OperationState::Dlq], WAIT).await, "{:?}", h.ledger_entry("exhaust-1").await);
    let entry = h.ledger_entry("exhaust-1").await.expect("entry").entry;
    assert_eq!(entry.attempts, 4, "one try and three automatic retries");
    let dlq = stream_payloads(&h, names::DLQ_STREAM).await;
    assert_eq!(dlq.len(), 1);
    let env = DlqEnvelope::decode(dlq[0].as_ref()).expect("envelope");
    assert_eq!(env.reason(), DlqReason::RetriesExhausted);
    assert_eq!(env.last_error.expect("last error").meta_code, 131000);
    assert_eq!(env.request.expect("request").operation_id, "exhaust-1");
    assert_eq!(h.sim.counters().outcome("131000"), 4, "exactly four calls reached Meta");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_errors_are_quarantined_with_the_reason_and_never_retried() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(failing(0, None, FaultKind::Error { code: 131026, http_status: None, subcode: None }));
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    submit(&h, &order("perm-1", 1)).await;
    assert!(h.wait_state("perm-1", &[OperationState::Quarantined], WAIT).await);
    let q = stream_payloads(&h, names::QUARANTINE_STREAM).await;
    assert_eq!(q.len(), 1);
    let entry = QuarantineEntry::decode(q[0].as_ref()).expect("entry");
    assert_eq!(entry.error.expect("error").meta_code, 131026);
    assert_eq!(h.sim.counters().outcome("131026"), 1, "never retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_hold_the_message_without_using_up_retries() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(failing(0, Some(1_500), FaultKind::Error { code: 130429, http_status: None, subcode: None }));
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    submit(&h, &order("rl-1", 1)).await;
    assert!(h.wait_state("rl-1", &[OperationState::Sent, OperationState::Delivered, OperationState::Read], WAIT).await);
    let entry = h.ledger_entry("rl-1").await.expect("entry").entry;
    assert_eq!(entry.transient_failures, 0);
    assert_eq!(entry.attempts, 1, "rate-limited tries do not count as attempts");
    assert_eq!(h.sim.oracle().get("rl-1").expect("accepted").count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_errors_keep_the_message_in_the_dlq_and_raise_a_signal() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(failing(0, None, FaultKind::Error { code: 190, http_status: None, subcode: None }));
    let mut signals = h.client.subscribe(names::signal_subject("credentials")).await.expect("subscribe");
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    submit(&h, &order("cred-1", 1)).await;
    assert!(h.wait_state("cred-1", &[OperationState::Dlq], WAIT).await);
    let dlq = stream_payloads(&h, names::DLQ_STREAM).await;
    assert_eq!(DlqEnvelope::decode(dlq[0].as_ref()).expect("envelope").reason(), DlqReason::Credentials);
    let signal = tokio::time::timeout(WAIT, signals.next()).await.expect("signal in time").expect("signal");
    let signal = Signal::decode(signal.payload.as_ref()).expect("signal decodes");
    assert_eq!(signal.meta_code, 190);
    assert_eq!(signal.phone_number_id, PHONE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_never_resent_and_a_status_webhook_resolves_it() {
    let mut h = Harness::start(SimConfig::default()).await;
    // Meta accepts the message, then the connection hangs past the client timeout.
    h.sim.set_scenario(failing(0, Some(5_000), FaultKind::Hang { hold_ms: 3_000, accept: true }));
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[("meta.request_timeout_ms", "500".into())]).await;
    submit(&h, &order("unknown-1", 1)).await;
    assert!(
        h.wait_state(
            "unknown-1",
            &[OperationState::Unknown, OperationState::Sent, OperationState::Delivered, OperationState::Read],
            WAIT
        )
        .await
    );
    // The simulator's status webhooks prove it was sent: the reconciler resolves it without a resend.
    assert!(
        h.wait_state("unknown-1", &[OperationState::Sent, OperationState::Delivered, OperationState::Read], WAIT).await
    );
    // The dispatcher's timeout may land after the webhook; either way the operation ends flagged.
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            h.ledger_entry("unknown-1")
                .await
                .is_some_and(|v| v.entry.flagged_unknown && v.entry.state().is_accepted_by_meta())
        })
        .await,
        "the operation ends sent and flagged as once unknown: {:?}",
        h.ledger_entry("unknown-1").await
    );
    assert_eq!(h.sim.oracle().get("unknown-1").expect("accepted").count, 1, "never resent blindly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_meta_accepted_is_never_sent_again() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    let request = order("idem-1", 1);
    submit(&h, &request).await;
    assert!(
        h.wait_state("idem-1", &[OperationState::Sent, OperationState::Delivered, OperationState::Read], WAIT).await
    );
    // A stray copy (a redelivery, a replay, a producer retry past the dedup window) lands in BW_SEND again.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "idem-1-stray-copy");
    bw_common::nats::publish_durable(
        &h.js,
        names::outbox_subject(names::Lane::High, PHONE),
        headers,
        request.encode_to_vec().into(),
    )
    .await
    .expect("stray copy stored");
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            let mut s = h.js.get_stream(names::SEND_STREAM).await.expect("stream");
            s.info().await.map(|i| i.state.messages == 0).unwrap_or(false)
        })
        .await,
        "the stray copy was consumed"
    );
    assert_eq!(h.sim.oracle().get("idem-1").expect("accepted").count, 1, "sent exactly once");
    // A producer retry of the same operation id is answered as a duplicate and stores nothing.
    let reply = h.producer().send(&request).await.expect("answer");
    assert!(reply.accepted && reply.duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_message_is_not_sent_and_ends_expired() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.start_ingest(&[]).await;
    let mut request = order("otp-expired", 1);
    request.category = Category::Authentication as i32;
    request.deadline_unix_ms = bw_common::time::now_ms() + 300;
    submit(&h, &request).await;
    tokio::time::sleep(Duration::from_millis(400)).await; // let the deadline pass while no dispatcher runs
    h.start_dispatcher(&[]).await;
    assert!(h.wait_state("otp-expired", &[OperationState::Expired], WAIT).await);
    assert!(h.sim.oracle().get("otp-expired").is_none(), "never reached Meta");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_traffic_is_served_before_marketing() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.start_ingest(&[]).await;
    for i in 0..20 {
        let mut r = order(&format!("promo-{i}"), i);
        r.category = Category::Marketing as i32;
        submit(&h, &r).await;
    }
    for i in 0..5 {
        submit(&h, &order(&format!("txn-{i}"), 100 + i)).await;
    }
    // One message at a time makes the service order visible.
    h.start_dispatcher(&[("dispatch.batch_size", "1".into()), ("dispatch.max_in_flight", "1".into())]).await;
    assert!(bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= 25 }).await, "all sent");
    let oracle = h.sim.oracle();
    let first_promo =
        (0..20).filter_map(|i| oracle.get(&format!("promo-{i}"))).map(|e| e.first_accepted_ms).min().expect("promos");
    let last_txn =
        (0..5).filter_map(|i| oracle.get(&format!("txn-{i}"))).map(|e| e.first_accepted_ms).max().expect("txns");
    assert!(last_txn <= first_promo, "every transactional message went before any marketing one");
}

/// Sends of one class when the sender's bucket is short of tokens: the refused messages wait in the dispatcher
/// for their slot (one delivery each, no trip through the broker) and reach Meta under the sender's rate.
async fn paced_from_memory(lane: names::Lane, class: &str) {
    let mut h = Harness::start(SimConfig::default()).await;
    let (n, rate, burst) = (40u64, 40.0, 5.0);
    for i in 0..n as usize {
        let request = order(&format!("{class}-{i}"), i);
        h.ledger.create(&bw_common::ledger::entry_for(&request, OperationState::Queued)).await.expect("ledger");
        h.js.publish(names::outbox_subject(lane, PHONE), request.encode_to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    h.start_dispatcher(&[
        ("breaker.defaults.rate_per_s", rate.to_string()),
        ("breaker.defaults.burst", burst.to_string()),
        ("breaker.defaults.ramp_ms", "0".into()),
        ("dispatch.hold_max_ms", "2500".into()),
    ])
    .await;
    assert!(bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= n }).await, "all {n} sent");
    let oracle = h.sim.oracle();
    let times: Vec<i64> =
        (0..n).filter_map(|i| oracle.get(&format!("{class}-{i}"))).map(|e| e.first_accepted_ms as i64).collect();
    assert_eq!(times.len() as u64, n);
    assert!(oracle.duplicates().is_empty());
    assert_eq!(h.sim.counters().outcome("130429"), 0, "no self-inflicted throughput errors");
    // 20 ms of slack for the jitter between admission and arrival (sent all at once, 40 would arrive within a
    // few ms).
    bw_testkit::check_pacing(&times, rate, burst, 20.0).expect("sends kept to the sender's rate");
    // Every message was delivered to the dispatcher once: the refusals waited in memory, not in the broker.
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        h.js.get_stream(names::SEND_STREAM)
            .await
            .expect("stream")
            .get_consumer(lane.dispatcher_consumer())
            .await
            .expect("consumer");
    let info = consumer.info().await.expect("consumer info");
    assert_eq!(info.delivered.consumer_sequence, n, "deliveries of {n} messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_short_of_sender_tokens_wait_in_memory_for_their_slot() {
    paced_from_memory(names::Lane::High, "txn").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_sends_wait_in_memory_for_spare_rate() {
    paced_from_memory(names::Lane::Replay, "rp").await;
}

/// Two live copies of one operation (a producer retry after the dedup window, or a replayed copy) in one batch:
/// both pass the ledger check before either is marked, so both race for the on-the-wire mark. Only the
/// delivery whose compare-and-set set the mark sends; the other leaves without a call (to BW_UNKNOWN,
/// flagged), and Meta sees the operation once. (A copy fetched after the mark landed is caught earlier, by the
/// ledger check itself.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_deliveries_of_one_operation_send_it_once() {
    let mut h = Harness::start(SimConfig::default()).await;
    let mut slow = failing(0, None, FaultKind::Error { code: 131000, http_status: None, subcode: None });
    slow.windows.clear();
    slow.latency = Some(bw_meta_sim::Latency::Fixed { ms: 1_500 });
    h.sim.set_scenario(slow);
    h.start_ingest(&[]).await;
    let request = order("twin-1", 1);
    submit(&h, &request).await;
    // The second copy: the same operation under another message id, as the dedup window no longer knows it.
    h.js.publish_with_headers(
        names::outbox_subject(names::Lane::High, PHONE),
        names::msg_id_headers("twin-1.copy"),
        request.encode_to_vec().into(),
    )
    .await
    .expect("publish")
    .await
    .expect("stored");
    // The pair limit (same recipient) and the start-up ramp would space the two copies apart; lift them so both
    // are admitted in one round and meet at the mark.
    let no_pair_limit = [
        ("breaker.defaults.pair_burst", "1000".to_string()),
        ("breaker.defaults.ramp_ms", "0".to_string()),
        ("breaker.defaults.burst", "20".to_string()),
    ];
    h.start_dispatcher(&no_pair_limit).await;
    let done = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
    assert!(h.wait_state("twin-1", &done, WAIT).await, "the operation was sent");
    // Both copies are settled once BW_SEND is empty.
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            let mut s = h.js.get_stream(names::SEND_STREAM).await.expect("stream");
            s.info().await.map(|i| i.state.messages == 0).unwrap_or(false)
        })
        .await,
        "both copies settled"
    );
    let oracle = h.sim.oracle();
    assert_eq!(oracle.get("twin-1").map(|e| e.count), Some(1), "accepted by Meta exactly once");
    assert_eq!(h.sim.counters().outcome("200"), 1, "exactly one call reached Meta");
    let entry = h.ledger_entry("twin-1").await.expect("entry").entry;
    assert!(entry.flagged_unknown, "the copy that lost the mark went through BW_UNKNOWN, flagged");
    assert_eq!(stream_payloads(&h, names::UNKNOWN_STREAM).await.len(), 1, "one copy left to reconciliation");
}

/// A full DLQ refuses the dead-letter move: the message stays queued in BW_SEND (nothing lost), the sender's
/// `dlq_limit` signal is raised, and once the limit is raised the move completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_dlq_keeps_the_message_queued_and_raises_the_dlq_limit_signal() {
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(failing(0, None, FaultKind::Error { code: 190, http_status: None, subcode: None }));
    let mut signals = h.client.subscribe(names::signal_subject("dlq_limit")).await.expect("subscribe");
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    let limit = |max_messages: i64| {
        let js = h.js.clone();
        async move {
            let mut stream = js.get_stream(names::DLQ_STREAM).await.expect("dlq");
            let mut config = stream.info().await.expect("info").config.clone();
            config.max_messages = max_messages;
            js.update_stream(config).await.expect("limit the dlq");
        }
    };
    limit(1).await;
    submit(&h, &order("full-1", 1)).await;
    assert!(h.wait_state("full-1", &[OperationState::Dlq], WAIT).await);
    submit(&h, &order("full-2", 2)).await;
    let signal = tokio::time::timeout(WAIT, signals.next()).await.expect("signal in time").expect("signal");
    let signal = Signal::decode(signal.payload.as_ref()).expect("signal decodes");
    assert_eq!((signal.kind.as_str(), signal.phone_number_id.as_str()), ("dlq_limit", PHONE));
    assert!(signal.detail.contains(names::DLQ_STREAM), "{}", signal.detail);
    assert!(!signal.detail.contains("+54911"), "no recipient in the signal");
    let entry = h.ledger_entry("full-2").await.expect("entry").entry;
    assert_eq!(entry.state(), OperationState::Queued, "the refused move left the message queued");
    assert_eq!(stream_payloads(&h, names::DLQ_STREAM).await.len(), 1);

    limit(-1).await;
    assert!(h.wait_state("full-2", &[OperationState::Dlq], WAIT).await, "the move completes once there is room");
    let report = bw_ops::account::account(&h.js, &h.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
}
