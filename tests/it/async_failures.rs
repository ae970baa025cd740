//! Asynchronous failures follow the same table as synchronous ones, against the simulator with ingest and the
//! dispatcher at their compiled defaults: a `failed` status with a retriable code sends the operation back as a
//! new attempt, which Meta then delivers once; a permanent code ends FAILED and nothing is sent again; an async
//! 130429 cuts the number's learned rate as a synchronous one does, an async 131049 defers a marketing message to
//! its recipient's cool-off; a failed status of an earlier attempt after the retry went out changes nothing but
//! the journey; a retried attempt's failed status that arrives before Meta's answer to that attempt waits for it
//! and settles that attempt; a webhook Meta delivers twice queues one new attempt; `bwctl op resend` sends a
//! FAILED operation again as a new attempt and refuses a delivered one.

use bw_breaker::{Breaker, BreakerConfig, Scope};
use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::{Injection, Mode, Scenario, SimConfig};
use bw_proto::v1::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
const REACHED: [OperationState; 2] = [OperationState::Delivered, OperationState::Read];

fn sim(delivered: bool) -> SimConfig {
    let mut cfg = SimConfig::default();
    cfg.limits.throughput_mps = 1_000.0;
    cfg.limits.throughput_burst = 1_000;
    cfg.limits.pair_enabled = false;
    if !delivered {
        // Statuses stop at `sent`: the retried attempt stays SENT, so a late status meets a live attempt.
        cfg.webhook.delivered_delay_ms = None;
        cfg.webhook.read_delay_ms = None;
    }
    cfg
}

/// The first send of `phone` fails asynchronously with `code` (accepted, then a `failed` status); the rest go.
fn fail_first_async(phone: &str, code: i64) -> Scenario {
    let mut injection = Injection::new(code);
    injection.name = format!("async-{code}");
    injection.mode = Some(Mode::Async);
    injection.max = Some(1);
    injection.phone_number_ids = vec![phone.to_string()];
    Scenario { name: "async-failure".into(), seed: Some(7), injections: vec![injection], ..Scenario::default() }
}

async fn submit(h: &Harness, phone: &str, op: &str) -> String {
    submit_as(h, phone, op, Category::Transactional).await
}

async fn submit_as(h: &Harness, phone: &str, op: &str, category: Category) -> String {
    bw_e2e::register_senders(&h.js, &[(phone, WABA_ID)]).await;
    let request = bw_client::Request::template(op, WABA_ID, phone, "+5491166000001", "order_confirmation", "es_AR")
        .param("1")
        .category(category)
        .build();
    let reply = h.producer().send(&request).await.expect("ingest answers");
    assert!(reply.accepted, "{}", reply.error);
    op.to_string()
}

async fn entry(h: &Harness, op: &str) -> LedgerEntry {
    h.ledger.get(op).await.expect("ledger").expect("entry").entry
}

/// Times Meta accepted `op`, how many of those acceptances it then failed, and how many copies it did not fail
/// (the oracle's count of copies that may reach the user).
fn accepted_and_failed(h: &Harness, op: &str) -> (u32, usize, u32) {
    let oracle = h.sim.oracle();
    let count = oracle.get(op).map(|e| e.count).unwrap_or(0);
    let failed = oracle.failed.iter().filter(|f| f.operation_id.as_deref() == Some(op)).count();
    let delivered = oracle.get(op).map(|e| e.delivered()).unwrap_or(0);
    (count, failed, delivered)
}

/// `bwctl op <op>`: the journey an operator reads.
async fn journey(h: &Harness, op: &str) -> String {
    let (code, out) = crate::bwctl(&h.nats.url(), &["op", op]).await;
    assert_eq!(code, 0, "{out}");
    out
}

/// The `attempts` column of the journey's `sent` rows.
fn sent_rows(journey: &str) -> Vec<u32> {
    journey
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let at = cols.iter().position(|c| *c == "sent")?;
            cols.get(at + 1)?.parse().ok()
        })
        .collect()
}

/// The first wamid Meta gave `op` (the attempt it failed).
fn first_wamid(h: &Harness, op: &str) -> String {
    h.sim.oracle().get(op).expect("accepted").wamids[0].clone()
}

async fn post_failed(h: &Harness, phone: &str, wamid: &str, op: &str, code: i64) {
    let s = serde_json::json!({
        "id": wamid, "status": "failed", "timestamp": "1750030073", "recipient_id": "5491166000001",
        "biz_opaque_callback_data": op, "errors": [{"code": code, "title": "Something went wrong"}],
    });
    assert_eq!(bw_e2e::post_webhook(&h.ingest_http, bw_e2e::status_webhook(phone, vec![s])).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_131000_is_retried_and_delivered_once() {
    const PHONE: &str = "106540352240001";
    let mut h = Harness::start(sim(true)).await;
    h.sim.set_scenario(fail_first_async(PHONE, 131000));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let op = submit(&h, PHONE, "async-transient").await;
    assert!(h.wait_state(&op, &REACHED, WAIT).await, "{:?}", entry(&h, &op).await);
    // Accepted twice, failed once: one copy reached the user (oracle count 1), and no duplicate.
    assert_eq!(accepted_and_failed(&h, &op), (2, 1, 1));
    assert!(h.sim.oracle().duplicates().is_empty());
    let e = entry(&h, &op).await;
    // Tries: the first send, its failure routed as a synchronous 131000 (a retry), the second send.
    assert_eq!((e.async_failures, e.attempts), (1, 3), "{e:?}");
    assert_ne!(e.wamid, first_wamid(&h, &op), "the delivered attempt is the new one");
    // The journey shows both attempts: the first one's sent and its failure, the second one's sent.
    let both = bw_testkit::wait_until(WAIT, || async {
        let text = journey(&h, &op).await;
        text.contains("attempt 1 failed after acceptance (131000, transient); queued as a new attempt")
            && sent_rows(&text) == [1, 3]
    })
    .await;
    assert!(both, "{}", journey(&h, &op).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_permanent_code_ends_failed_and_is_never_resent() {
    const PHONE: &str = "106540352240002";
    let mut h = Harness::start(sim(true)).await;
    h.sim.set_scenario(fail_first_async(PHONE, 131026));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let op = submit(&h, PHONE, "async-permanent").await;
    assert!(h.wait_state(&op, &[OperationState::Failed], WAIT).await, "{:?}", entry(&h, &op).await);
    let e = entry(&h, &op).await;
    assert_eq!((e.last_code, e.async_failures, e.attempts), (131026, 0, 1), "{e:?}");
    // FAILED is written by the same handler that would have queued a new attempt: nothing was queued.
    assert_eq!(accepted_and_failed(&h, &op), (1, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_130429_slows_the_number_and_the_message_is_delivered_once() {
    const PHONE: &str = "106540352240003";
    let mut h = Harness::start(sim(true)).await;
    h.sim.set_scenario(fail_first_async(PHONE, 130429));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let redis = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    let breaker = Breaker::new(Some(redis), None, BreakerConfig::default());
    let scope = Scope::new(WABA_ID, PHONE);
    let op = submit(&h, PHONE, "async-throughput").await;
    // The async 130429 is recorded as a synchronous one would be: the number's learned share of its rate drops
    // (AIMD), then recovers as sends succeed.
    let slowed = bw_testkit::wait_until(WAIT, || async {
        breaker.status(&scope).await.map(|s| s.adaptive_share < 1.0).unwrap_or(false)
    })
    .await;
    assert!(slowed, "{:?}", breaker.status(&scope).await);
    assert!(h.wait_state(&op, &REACHED, WAIT).await, "{:?}", entry(&h, &op).await);
    assert_eq!(accepted_and_failed(&h, &op), (2, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_131049_defers_the_marketing_message_to_its_recipients_cool_off() {
    const PHONE: &str = "106540352240007";
    let mut h = Harness::start(sim(true)).await;
    h.sim.set_scenario(fail_first_async(PHONE, 131049));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let op = submit_as(&h, PHONE, "async-marketing-limit", Category::Marketing).await;
    // Routed as a synchronous 131049: the DLQ until the recipient's 24 h cool-off ends, not sent again now and
    // not FAILED (Meta did not deliver it, and it may go once the cool-off is over).
    assert!(h.wait_state(&op, &[OperationState::Dlq], WAIT).await, "{:?}", entry(&h, &op).await);
    let e = entry(&h, &op).await;
    assert_eq!((e.last_code, e.async_failures), (131049, 1), "{e:?}");
    let mut dlq = h.js.get_stream(bw_wire::names::DLQ_STREAM).await.expect("BW_DLQ");
    let last = dlq.info().await.expect("info").state.last_sequence;
    let stored = dlq.get_raw_message(last).await.expect("the dead letter");
    let envelope = <DlqEnvelope as prost::Message>::decode(stored.payload.as_ref()).expect("envelope");
    let wait_ms = envelope.not_before_unix_ms - envelope.dead_lettered_at_unix_ms;
    assert!(wait_ms >= 24 * 3_600_000 - 60_000, "not before the 24 h cool-off: {wait_ms} ms");
    assert_eq!(accepted_and_failed(&h, &op), (1, 1, 0), "not sent again inside the cool-off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_failed_status_of_an_earlier_attempt_does_not_requeue() {
    const PHONE: &str = "106540352240004";
    let mut h = Harness::start(sim(false)).await;
    h.sim.set_scenario(fail_first_async(PHONE, 131000));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let op = submit(&h, PHONE, "async-late").await;
    let first = bw_testkit::wait_until(WAIT, || async { accepted_and_failed(&h, &op) == (2, 1, 1) }).await;
    assert!(first, "{:?}", accepted_and_failed(&h, &op));
    let attempt1 = first_wamid(&h, &op);
    let retried = bw_testkit::wait_until(WAIT, || async {
        let e = entry(&h, &op).await;
        e.state() == OperationState::Sent && !e.wamid.is_empty() && e.wamid != attempt1
    })
    .await;
    assert!(retried, "attempt 2 is SENT with its own wamid: {:?}", entry(&h, &op).await);
    let attempt2 = entry(&h, &op).await.wamid;

    // A failed status of an earlier attempt whose answer the dispatcher never got (a timeout after Meta
    // accepted it), so only its callback data names the operation, arrives after attempt 2 was sent, with a
    // permanent code. It is matched to its own attempt by its wamid, not to the operation's latest one:
    // recorded in the journey, and attempt 2 is neither failed nor queued again.
    post_failed(&h, PHONE, "wamid.HBgLNTQ5MTE2NjAwMDAwMRUCABEYEkxPU1RBVFRFTVBUAA==", &op, 131026).await;
    let noted = bw_testkit::wait_until(WAIT, || async {
        entry(&h, &op).await.reason.contains("failed status (131026) of an earlier attempt was recorded, not applied")
    })
    .await;
    let e = entry(&h, &op).await;
    assert!(noted, "{e:?}");
    assert_eq!((e.state(), e.wamid.as_str(), e.async_failures), (OperationState::Sent, attempt2.as_str(), 1), "{e:?}");
    assert_eq!(accepted_and_failed(&h, &op), (2, 1, 1), "nothing was sent again");

    // Meta repeats attempt 1's own failed status, late, now with a permanent code: it is attempt 1's (its wamid
    // and status were handled once), so attempt 2 stays as it is.
    post_failed(&h, PHONE, &attempt1, &op, 131026).await;
    assert!(webhooks_processed(&h).await, "ingest handled every stored webhook");
    let e = entry(&h, &op).await;
    assert_eq!((e.state(), e.wamid.as_str(), e.async_failures), (OperationState::Sent, attempt2.as_str(), 1), "{e:?}");
    assert_eq!(accepted_and_failed(&h, &op), (2, 1, 1), "nothing was sent again");
}

/// The webhook processor's consumer of BW_WEBHOOKS, and the stream's last sequence (None: not there yet).
async fn webhook_consumer(h: &Harness) -> Option<(async_nats::jetstream::consumer::Info, u64)> {
    let mut stream = h.js.get_stream(bw_wire::names::WEBHOOK_STREAM).await.ok()?;
    let last = stream.info().await.ok()?.state.last_sequence;
    let mut consumer = stream
        .get_consumer::<async_nats::jetstream::consumer::pull::Config>(bw_wire::names::WEBHOOK_CONSUMER)
        .await
        .ok()?;
    Some((consumer.info().await.ok()?.clone(), last))
}

/// BW_WEBHOOKS deliveries beyond the first of each webhook so far (the webhook consumer's redeliveries).
async fn webhook_redeliveries(h: &Harness) -> u64 {
    webhook_consumer(h)
        .await
        .map_or(0, |(i, _)| i.delivered.consumer_sequence.saturating_sub(i.delivered.stream_sequence))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_attempts_failed_status_that_overtakes_its_answer_settles_that_attempt() {
    const PHONE: &str = "106540352240008";
    let mut cfg = sim(false);
    // No `sent` statuses: the only webhooks are the failed ones, so a redelivery is the overtaking status's.
    cfg.webhook.sent_delay_ms = None;
    let mut h = Harness::start(cfg).await;
    h.sim.set_scenario(fail_first_async(PHONE, 131000));
    // Attempt 1 is answered; attempt 2's answer is held after Meta accepted it.
    h.sim.hold_answers(PHONE, 1);
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let op = submit(&h, PHONE, "async-overtaken").await;
    let held = bw_testkit::wait_until(WAIT, || async { h.sim.held_answers() == 1 }).await;
    assert!(held, "attempt 2 accepted, its answer held: {:?}", accepted_and_failed(&h, &op));
    let attempt2 = h.sim.oracle().get(&op).expect("accepted").wamids[1].clone();
    let e = entry(&h, &op).await;
    assert_eq!((e.state(), e.async_failures), (OperationState::Queued, 1), "attempt 2 is on the wire: {e:?}");
    assert_ne!(e.wamid, attempt2, "its wamid is not recorded yet");

    // Meta fails attempt 2 for good, and the status arrives before the answer that names its wamid. Taken for
    // attempt 1's it would be dropped and the operation left SENT, never delivered: it waits for its attempt.
    let before = webhook_redeliveries(&h).await;
    let s = serde_json::json!({
        "id": attempt2, "status": "failed", "timestamp": (bw_common::time::now_ms() / 1000).to_string(),
        "recipient_id": "5491166000001", "biz_opaque_callback_data": op,
        "errors": [{"code": 131026, "title": "Message undeliverable"}],
    });
    assert_eq!(bw_e2e::post_webhook(&h.ingest_http, bw_e2e::status_webhook(PHONE, vec![s])).await, 200);
    let waited = bw_testkit::wait_until(WAIT, || async { webhook_redeliveries(&h).await > before }).await;
    assert!(waited, "the status waits for its attempt's SENT write: {:?}", entry(&h, &op).await);
    assert_eq!(entry(&h, &op).await.state(), OperationState::Queued, "nothing applied meanwhile");

    h.sim.release_answers();
    let failed = h.wait_state(&op, &[OperationState::Failed], WAIT).await;
    let e = entry(&h, &op).await;
    assert!(failed, "{e:?}");
    assert_eq!((e.wamid.as_str(), e.last_code), (attempt2.as_str(), 131026), "settled as attempt 2: {e:?}");
    assert!(!e.flagged_unknown, "by the status, not by reconciling a lost answer: {e:?}");
    assert!(webhooks_processed(&h).await, "ingest handled every stored webhook");
    assert_eq!(accepted_and_failed(&h, &op), (2, 1, 1), "never sent a third time");
    assert!(h.sim.oracle().duplicates().is_empty());
}

/// Waits until ingest's webhook processor acknowledged every webhook stored in BW_WEBHOOKS.
async fn webhooks_processed(h: &Harness) -> bool {
    bw_testkit::wait_until(WAIT, || async {
        webhook_consumer(h).await.is_some_and(|(i, last)| i.ack_floor.stream_sequence >= last && i.num_ack_pending == 0)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicated_failed_webhook_queues_one_new_attempt() {
    const PHONE: &str = "106540352240005";
    let mut cfg = sim(true);
    // Meta delivers every webhook twice.
    cfg.webhook.duplicate_rate = 1.0;
    let mut h = Harness::start(cfg).await;
    h.sim.set_scenario(fail_first_async(PHONE, 131000));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let op = submit(&h, PHONE, "async-duplicate").await;
    assert!(h.wait_state(&op, &REACHED, WAIT).await, "{:?}", entry(&h, &op).await);
    let drained = bw_testkit::wait_until(WAIT, || async { h.sim.webhooks_pending() == 0 }).await;
    assert!(drained);
    // Both copies of the failed status are handled by now; one new attempt came of them.
    let e = entry(&h, &op).await;
    assert_eq!(e.async_failures, 1, "{e:?}");
    assert_eq!(accepted_and_failed(&h, &op), (2, 1, 1));
    assert!(REACHED.contains(&e.state()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resend_requeues_a_failed_operation_and_refuses_a_delivered_one() {
    const PHONE: &str = "106540352240006";
    let mut h = Harness::start(sim(true)).await;
    h.sim.set_scenario(fail_first_async(PHONE, 131026));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let op = submit(&h, PHONE, "async-resend").await;
    assert!(h.wait_state(&op, &[OperationState::Failed], WAIT).await, "{:?}", entry(&h, &op).await);
    assert_eq!(accepted_and_failed(&h, &op), (1, 1, 0));

    // The cause was fixed: the operator sends it again with a reason.
    let url = h.nats.url();
    let why = "recipient re-registered, confirmed by support";
    let (code, out) = crate::bwctl(&url, &["op", "resend", &op, "--reason", why, "--yes"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("as a new attempt (resend 1)"), "{out}");
    assert!(h.wait_state(&op, &REACHED, WAIT).await, "{:?}", entry(&h, &op).await);
    assert_eq!(accepted_and_failed(&h, &op), (2, 1, 1), "one copy reached the user");
    let e = entry(&h, &op).await;
    assert_eq!((e.resends, e.attempts), (1, 2), "{e:?}");
    let told = bw_testkit::wait_until(WAIT, || async {
        journey(&h, &op).await.contains(&format!("operator resend 1 after failed: {why}"))
    })
    .await;
    assert!(told, "{}", journey(&h, &op).await);

    // Delivered now: a resend is refused with the reason, and nothing changes.
    let (code, out) = crate::bwctl(&url, &["op", "resend", &op, "--reason", "again", "--yes"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("refused: the outcome is") && out.contains("the message reached the recipient"), "{out}");
    assert_eq!(entry(&h, &op).await.resends, 1);
    assert_eq!(accepted_and_failed(&h, &op), (2, 1, 1), "nothing was sent again");
}

/// Issue #40 item 6: an ambiguous failure (Meta holds the request past the client's timeout and never accepts
/// it) goes to BW_UNKNOWN flagged, no status comes, and the reconciler expires it by the authentication policy
/// (the compiled default). The reconciler keeps its request, so the operator can resend it: a new attempt with
/// the reason in the journey, which the simulator's oracle sees accepted and delivered once; then a resend of
/// the delivered operation is refused and nothing is sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resend_requeues_an_expired_unknown_operation_once() {
    const PHONE: &str = "106540352240007";
    let mut h = Harness::start(sim(true)).await;
    let hang = bw_meta_sim::FaultKind::Hang { hold_ms: 2_000, accept: false };
    h.sim.set_scenario(crate::dispatch::failing(0, None, hang));
    // Relaxed beside the defaults: the review comes after 1 s instead of 10 min, rechecked every 200 ms; the
    // client gives up after 500 ms instead of waiting out the hang. The policy (authentication: expire) is the
    // default.
    h.start_ingest(&[("reconciler.recheck_ms", "200".into())]).await;
    let relaxed = [("meta.request_timeout_ms", "500".into()), ("dispatch.unknown_review_ms", "1000".into())];
    h.start_dispatcher_at_defaults_but(&relaxed).await;

    let op = submit_as(&h, PHONE, "otp-unknown", Category::Authentication).await;
    assert!(h.wait_state(&op, &[OperationState::Expired], WAIT).await, "{:?}", entry(&h, &op).await);
    let e = entry(&h, &op).await;
    assert!(e.flagged_unknown, "{e:?}");
    assert_eq!(accepted_and_failed(&h, &op), (0, 0, 0), "Meta never accepted it");

    // Meta answers again; the operator resends it.
    h.sim.clear_scenario();
    let url = h.nats.url();
    let why = "OTP still valid, customer on the phone";
    let (code, out) = crate::bwctl(&url, &["op", "resend", &op, "--reason", why, "--yes"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("as a new attempt (resend 1)"), "{out}");
    assert!(h.wait_state(&op, &REACHED, WAIT).await, "{:?}", entry(&h, &op).await);
    assert_eq!(accepted_and_failed(&h, &op), (1, 0, 1), "the new attempt reached the user once");
    assert_eq!(entry(&h, &op).await.resends, 1);
    let told = bw_testkit::wait_until(WAIT, || async {
        journey(&h, &op).await.contains(&format!("operator resend 1 after expired: {why}"))
    })
    .await;
    assert!(told, "{}", journey(&h, &op).await);

    let (code, out) = crate::bwctl(&url, &["op", "resend", &op, "--reason", "again", "--yes"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("the message reached the recipient"), "{out}");
    assert_eq!(accepted_and_failed(&h, &op), (1, 0, 1), "nothing was sent again");
}
