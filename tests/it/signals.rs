//! Meta's account signals end to end, with the dispatcher at its compiled defaults: the simulator restricts one
//! WABA by an `account_update` webhook; ingest stores and publishes it, the coordinator pauses that WABA until
//! the restriction's `expiration`, so its numbers send nothing Meta would refuse while the other WABA keeps
//! sending, and every held message goes out once, after the expiration. A template PAUSED webhook holds that
//! template's messages unsent while another template flows, and APPROVED releases each once; a user's
//! `user_preferences` stop fails later marketing to that user without Meta refusing it, and resume lifts it. An
//! unknown field is answered 200, published with its keys and kept raw.

use bw_breaker::{Breaker, BreakerConfig, Parent};
use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::SimConfig;
use bw_proto::v1::account_signal::Kind;
use bw_proto::v1::*;
use bw_wire::names;
use prost::Message as _;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);
/// A second WABA of the same business (same app, same token).
const OTHER_WABA: &str = "102290129340777";
const A1: &str = "106540352205001";
const B1: &str = "106540352205002";
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
/// The restriction lasts this long: long enough to submit the restricted WABA's messages well before it ends
/// on a loaded machine (the test checks it did).
const RESTRICTED_MS: u64 = 30_000;

/// The simulator restricts by WABA: it must know B1 is of the other one.
fn sim() -> SimConfig {
    crate::open_sim(&[(A1, WABA_ID), (B1, OTHER_WABA)])
}

async fn submit(h: &Harness, waba: &str, phone: &str, prefix: &str, n: usize, first: usize) -> Vec<String> {
    bw_e2e::register_senders(&h.js, &[(phone, waba)]).await;
    let mut ops = Vec::new();
    for i in 0..n {
        let op = format!("{prefix}-{i:03}");
        let r = bw_client::Request::template(
            &op,
            waba,
            phone,
            &format!("+5491177{:06}", first + i),
            "order_confirmation",
            "es_AR",
        )
        .param("1")
        .category(Category::Transactional)
        .build();
        let reply = h.producer().send(&r).await.expect("ingest answers");
        assert!(reply.accepted, "{}", reply.error);
        ops.push(op);
    }
    ops
}

async fn waba_pause(h: &Harness, waba: &str) -> bw_breaker::ParentStatus {
    let redis = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    let breaker = Breaker::new(Some(redis), None, BreakerConfig::default());
    breaker.parent_status(&Parent::Waba(waba.into())).await.expect("pause read")
}

use crate::sim_event as event;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_restriction_pauses_only_its_waba_until_the_expiration() {
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    h.start_coordinator(&[]).await;
    h.start_replay(&[]).await;

    h.sim
        .fire_event(event(serde_json::json!({
            "name": "restricted", "kind": "account_update", "event": "ACCOUNT_RESTRICTION",
            "restriction_type": "RESTRICTED_BIZ_INITIATED_MESSAGING", "expires_in_ms": RESTRICTED_MS,
            "waba_id": WABA_ID,
        })))
        .expect("fired");
    let paused = bw_testkit::wait_until(WAIT, || async {
        let p = waba_pause(&h, WABA_ID).await;
        p.source == "webhook" && p.paused_until_unix_ms > bw_common::time::now_ms()
    })
    .await;
    let pause = waba_pause(&h, WABA_ID).await;
    assert!(paused, "the webhook paused the WABA: {pause:?}");
    assert_eq!(pause.reason, "Meta account_update RESTRICTED_BIZ_INITIATED_MESSAGING");
    let until = pause.paused_until_unix_ms;

    let held = submit(&h, WABA_ID, A1, "held", 10, 0).await;
    let other = submit(&h, OTHER_WABA, B1, "other", 20, 100).await;
    assert!(
        bw_common::time::now_ms() < until,
        "the restricted WABA's messages were submitted before the expiration (else this test proves nothing)"
    );
    assert!(h.wait_all(&other, &SENT, WAIT).await, "the other WABA keeps sending");
    assert!(!waba_pause(&h, OTHER_WABA).await.active(0), "the other WABA is not paused");

    // After the expiration every held message goes out once, and none before it.
    assert!(h.wait_all(&held, &SENT, WAIT + Duration::from_millis(RESTRICTED_MS)).await, "sent after the expiration");
    let oracle = h.sim.oracle();
    for op in &held {
        let e = oracle.get(op).expect("accepted");
        assert_eq!(e.count, 1, "{op} sent once");
        // The pause's end is Redis's clock, the oracle's the simulator's: the same host clock here.
        assert!(e.first_accepted_ms as i64 >= until - 1_000, "{op} accepted at {} before {until}", e.first_accepted_ms);
    }
    assert_eq!(h.sim.counters().account_state("368"), 0, "nothing reached Meta while it was restricted");
    // They waited in their lane (a pause shorter than the dispatcher's `long_pause_ms`) or in the DLQ, from
    // which replay sends them once the pause is over: never more than one replay, no bounce.
    for op in &held {
        assert!(h.ledger_entry(op).await.expect("ledger").entry.replays <= 1, "{op}: at most one replay");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_field_is_answered_200_published_and_kept_raw() {
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.sim
        .fire_event(event(serde_json::json!({
            "kind": "raw", "field": "business_username_update", "waba_id": WABA_ID,
            "value": {"status": "approved", "username": "@shop"},
        })))
        .expect("fired");
    let delivered = bw_testkit::wait_until(WAIT, || async {
        h.sim.counters().webhooks.fields_delivered.get("business_username_update") == Some(&1)
    })
    .await;
    assert!(delivered, "ingest answered 200: {:?}", h.sim.counters().webhooks);
    let stream = h.js.get_stream(names::ACCOUNT_STREAM).await.expect("BW_ACCOUNT");
    let subject = names::account_subject("business_username_update", WABA_ID);
    let published =
        bw_testkit::wait_until(WAIT, || async { stream.get_last_raw_message_by_subject(&subject).await.is_ok() }).await;
    assert!(published, "published on {subject}");
    let msg = stream.get_last_raw_message_by_subject(&subject).await.expect("signal");
    let signal = AccountSignal::decode(msg.payload.as_ref()).expect("AccountSignal");
    assert!(matches!(&signal.kind, Some(Kind::Unknown(u)) if u.value_keys == ["status", "username"]), "{signal:?}");
    let rejected = h.js.get_stream(names::REJECTED_STREAM).await.expect("BW_REJECTED");
    let kept = rejected
        .get_last_raw_message_by_subject(&names::rejected_subject(bw_ingest::signals::REJECTED_SOURCE))
        .await
        .expect("kept raw");
    let kept = RejectedRequest::decode(kept.payload.as_ref()).expect("RejectedRequest");
    assert!(String::from_utf8_lossy(&kept.raw).contains("approved"));
}

async fn template_hold(h: &Harness, key: &bw_breaker::templates::ScopeKey) -> Option<bw_breaker::templates::Hold> {
    let redis = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    bw_breaker::templates::TemplateHolds::new(bw_breaker::RedisConn::Single(redis)).read(key).await.expect("hold read")
}

fn template_send(op: &str, to: &str, name: &str, category: Category) -> SendRequest {
    bw_client::Request::template(op, WABA_ID, A1, to, name, "es_AR").param("1").category(category).build()
}

async fn send_all(h: &Harness, requests: &[SendRequest]) -> Vec<String> {
    bw_e2e::register_senders(&h.js, &[(A1, WABA_ID)]).await;
    let mut ops = Vec::new();
    for r in requests {
        let reply = h.producer().send(r).await.expect("ingest answers");
        assert!(reply.accepted, "{}", reply.error);
        ops.push(r.operation_id.clone());
    }
    ops
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_template_webhook_holds_its_messages_and_approved_releases_each_once() {
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    h.start_coordinator(&[]).await;
    let key = bw_breaker::templates::ScopeKey::Template {
        waba_id: WABA_ID.into(),
        language: "es_AR".into(),
        name: "promo_flash".into(),
    };

    // Meta pauses the template (its webhook spells the language `es-AR`; the simulator then refuses its sends
    // with 132015, so a message that reached Meta would show in that counter).
    h.sim
        .fire_event(event(serde_json::json!({
            "kind": "message_template_status_update", "template": "promo_flash", "language": "es_AR",
            "event": "PAUSED", "title": "FIRST_PAUSE", "waba_id": WABA_ID,
        })))
        .expect("fired");
    let held_by_webhook = bw_testkit::wait_until(WAIT, || async { template_hold(&h, &key).await.is_some() }).await;
    let hold = template_hold(&h, &key).await;
    assert!(held_by_webhook, "the webhook held the template's scope");
    let hold = hold.expect("held");
    assert_eq!((hold.code, hold.until_ms), (132015, 0), "held as a 132015 answer would, until released");

    let mk = |prefix: &str, name: &str, n: usize, first: usize| -> Vec<SendRequest> {
        (0..n)
            .map(|i| {
                template_send(
                    &format!("{prefix}-{i:03}"),
                    &format!("+5491178{:06}", first + i),
                    name,
                    Category::Transactional,
                )
            })
            .collect()
    };
    let held = send_all(&h, &mk("paused", "promo_flash", 5, 0)).await;
    let before = send_all(&h, &mk("flowing", "order_update", 10, 100)).await;
    assert!(h.wait_all(&before, &SENT, WAIT).await, "another template flows while it is held");
    assert!(h.wait_all(&held, &[OperationState::Quarantined], WAIT).await, "the paused template's messages wait");
    assert_eq!(h.sim.counters().outcome("132015"), 0, "none of them reached Meta");
    let scope = key.to_string();
    let entries = bw_ops::scan::scan_stream(&h.js, names::QUARANTINE_STREAM, "bw.quarantine.>").await.expect("scan");
    let entries: Vec<QuarantineEntry> =
        entries.iter().filter_map(|m| QuarantineEntry::decode(m.payload.as_ref()).ok()).collect();
    for op in &held {
        let e = entries.iter().find(|e| e.request.as_ref().is_some_and(|r| &r.operation_id == op)).expect("entry");
        assert_eq!(e.scope_key, scope, "{op} held under the template's scope");
    }

    // Meta approves it again: the hold goes and every held message is sent exactly once, with no operator.
    h.sim
        .fire_event(event(serde_json::json!({
            "kind": "message_template_status_update", "template": "promo_flash", "language": "es_AR",
            "event": "APPROVED", "title": "UNPAUSE", "waba_id": WABA_ID,
        })))
        .expect("fired");
    let after = send_all(&h, &mk("flowing-after", "order_update", 10, 200)).await;
    assert!(h.wait_all(&held, &SENT, WAIT).await, "released messages are sent");
    assert!(h.wait_all(&after, &SENT, WAIT).await, "the other template still flows");
    assert!(template_hold(&h, &key).await.is_none(), "the hold is lifted");
    let oracle = h.sim.oracle();
    for op in held.iter().chain(&before).chain(&after) {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted exactly once");
    }
    assert_eq!(h.sim.counters().outcome("132015"), 0);
    let left = bw_ops::scan::scan_stream(&h.js, names::QUARANTINE_STREAM, "bw.quarantine.>").await.expect("scan");
    assert!(left.is_empty(), "the scope is empty: {} entries left", left.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_stop_fails_later_marketing_fast_and_resume_lets_it_go() {
    const TO: &str = "+5491179000001";
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    h.start_coordinator(&[]).await;
    bw_e2e::register_senders(&h.js, &[(A1, WABA_ID)]).await;
    let redis = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    let marketing = bw_breaker::recipient::RecipientMarketing::new(bw_breaker::RedisConn::Single(redis));
    let rk = bw_common::mask::recipient_key(TO);
    let suppressed = || async { marketing.read(bw_wire::tenancy::DEFAULT_TENANT, &rk).await.expect("read") };

    h.sim
        .fire_event(event(serde_json::json!({
            "kind": "user_preferences", "phone_number_id": A1, "user": TO, "value": "stop",
        })))
        .expect("fired");
    let stopped = bw_testkit::wait_until(WAIT, || async { suppressed().await.suppressed_code == 131050 }).await;
    assert!(stopped, "the stop suppressed marketing to the user: {:?}", suppressed().await);

    let promo = send_all(&h, &[template_send("pref-mkt-1", TO, "promo_flash", Category::Marketing)]).await;
    let utility = send_all(&h, &[template_send("pref-util-1", TO, "order_update", Category::Transactional)]).await;
    assert!(h.wait_all(&promo, &[OperationState::Failed], WAIT).await, "marketing to the user fails fast");
    assert!(h.wait_all(&utility, &SENT, WAIT).await, "non-marketing to the user still goes");
    assert_eq!(h.sim.counters().outcome("131050"), 0, "Meta never had to refuse it");
    assert!(h.sim.oracle().get(&promo[0]).is_none(), "never sent");

    h.sim
        .fire_event(event(serde_json::json!({
            "kind": "user_preferences", "phone_number_id": A1, "user": TO, "value": "resume",
        })))
        .expect("fired");
    let resumed = bw_testkit::wait_until(WAIT, || async { suppressed().await.suppressed_code == 0 }).await;
    assert!(resumed, "the resume lifted the suppression");
    let again = send_all(&h, &[template_send("pref-mkt-2", TO, "promo_flash", Category::Marketing)]).await;
    assert!(h.wait_all(&again, &SENT, WAIT).await, "marketing goes again after the resume");
    assert_eq!(h.sim.oracle().get(&again[0]).map(|e| e.count), Some(1));
}
