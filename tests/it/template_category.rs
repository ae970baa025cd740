//! A template Meta moved to MARKETING (`template_category_update`) is marketing from intake on, at the compiled
//! defaults: ingest puts it on the marketing lane whatever category its producer gave, its ledger entry and the
//! feed say why, and it is sent once. A template Meta did not move keeps its lane. With Redis down the
//! producer's category stands (ingest cannot read the move; the dispatcher applies it once it can).

use bw_breaker::template_rules::TemplateRules;
use bw_breaker::templates::ScopeKey;
use bw_e2e::{Harness, WABA_ID};
use bw_proto::v1::*;
use bw_wire::names::Lane;
use prost::Message as _;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);
const A1: &str = "106540352205032";
const MOVED: &str = "shipping_update_moved";
const MOVED_LATER: &str = "login_code_moved";
const KEPT: &str = "shipping_update_kept";
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

async fn send(h: &Harness, op: &str, template: &str, category: Category) -> IntakeReply {
    let r = bw_client::Request::template(op, WABA_ID, A1, "+5491175000002", template, "es_AR")
        .param("1")
        .category(category)
        .build();
    h.producer().send(&r).await.expect("ingest answers")
}

async fn move_to_marketing(h: &Harness, rules: &TemplateRules, template: &str) {
    h.sim
        .fire_event(crate::sim_event(serde_json::json!({
            "kind": "template_category_update", "template": template, "language": "es_AR",
            "new_category": "MARKETING",
        })))
        .expect("fired");
    let key = ScopeKey::Template { waba_id: WABA_ID.into(), language: "es_AR".into(), name: template.into() };
    let moved =
        bw_testkit::wait_until(WAIT, || async { rules.read(&key).await.map(|r| r.is_marketing()).unwrap_or(false) })
            .await;
    assert!(moved, "the coordinator recorded {template} as MARKETING");
}

/// The lane an operation's request was stored on in BW_SEND, and the category stored with it.
async fn stored(h: &Harness, op: &str) -> (Lane, Category) {
    let stream = h.js.get_stream(h.buckets.send.stream_of(A1)).await.expect("BW_SEND");
    for lane in [Lane::High, Lane::Low] {
        let subject = h.buckets.send.outbox_subject(lane, A1);
        let Ok(raw) = stream.get_last_raw_message_by_subject(&subject).await else { continue };
        let request = SendRequest::decode(raw.payload).expect("a SendRequest");
        if bw_wire::tenancy::split_operation_key(&request.operation_id).1 == op {
            return (lane, request.category());
        }
    }
    panic!("{op} is on no live lane of BW_SEND");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_moved_to_marketing_takes_the_marketing_lane_at_intake_and_says_why() {
    let mut h = Harness::start(crate::open_sim(&[(A1, WABA_ID)])).await;
    h.register(&[A1]).await;
    h.start_ingest(&[]).await;
    h.start_coordinator(&[]).await;
    let conn = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    let rules = TemplateRules::new(bw_breaker::RedisConn::Single(conn));
    move_to_marketing(&h, &rules, MOVED).await;

    // Stored before any dispatcher runs: the lane is ingest's choice.
    let kept = send(&h, "kept-1", KEPT, Category::Transactional).await;
    assert!(kept.accepted, "{}", kept.error);
    assert_eq!(stored(&h, "kept-1").await, (Lane::High, Category::Transactional), "a template Meta left alone");
    let moved = send(&h, "moved-1", MOVED, Category::Transactional).await;
    assert!(moved.accepted, "{}", moved.error);
    assert_eq!(stored(&h, "moved-1").await, (Lane::Low, Category::Marketing), "the marketing lane");

    let entry = h.ledger_entry("moved-1").await.expect("ledger").entry;
    assert_eq!(entry.category(), Category::Marketing);
    assert!(entry.reason.contains("template_category_update") && entry.reason.contains(MOVED), "{}", entry.reason);
    assert!(entry.reason.ends_with("instead of transactional"), "{}", entry.reason);
    // The producer reads it in the feed: the accepted event carries the category and the reason.
    let producer = h.producer();
    let accepted = bw_testkit::wait_until(WAIT, || async {
        producer.status(A1, "moved-1").await.is_ok_and(|s| {
            s.journey.iter().any(|e| {
                e.kind() == OutcomeKind::Accepted
                    && e.category() == Category::Marketing
                    && e.reason.contains("template_category_update")
            })
        })
    })
    .await;
    assert!(accepted, "{:?}", producer.status(A1, "moved-1").await);

    h.start_dispatcher_at_defaults().await;
    let ops = ["kept-1".to_string(), "moved-1".to_string()];
    assert!(h.wait_all(&ops, &SENT, WAIT).await, "both sent");
    let oracle = h.sim.oracle();
    for op in &ops {
        assert_eq!(oracle.get(op).expect("accepted by Meta").count, 1, "{op} sent once");
    }

    // Redis down: an authentication template (no order set needed) keeps the producer's category and lane.
    move_to_marketing(&h, &rules, MOVED_LATER).await;
    h.redis.stop();
    let otp = send(&h, "otp-1", MOVED_LATER, Category::Authentication).await;
    assert!(otp.accepted, "{}", otp.error);
    let entry = h.ledger_entry("otp-1").await.expect("ledger").entry;
    assert_eq!(entry.category(), Category::Authentication, "{}", entry.reason);
    assert!(!entry.reason.contains("template_category_update"), "{}", entry.reason);
}
