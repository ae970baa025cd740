//! Template category and quality signals end to end, with the dispatcher at its compiled defaults: Meta moves a
//! template to MARKETING by `template_category_update`, and its sends get marketing rules although their producer
//! calls them transactional (here `marketing_undeliverable`: none goes to a US number, each fails unsent); a
//! `message_template_quality_update` RED records the pace of the template's marketing.

use bw_breaker::template_rules::TemplateRules;
use bw_breaker::templates::ScopeKey;
use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::SimConfig;
use bw_proto::v1::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);
const A1: &str = "106540352205031";
const TEMPLATE: &str = "order_update_moved";
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

fn sim() -> SimConfig {
    crate::open_sim(&[(A1, WABA_ID)])
}

use crate::sim_event as event;

async fn send(h: &Harness, op: &str, to: &str) -> String {
    send_of(h, op, to, TEMPLATE).await
}

async fn send_of(h: &Harness, op: &str, to: &str, template: &str) -> String {
    bw_e2e::register_senders(&h.js, &[(A1, WABA_ID)]).await;
    let r = bw_client::Request::template(op, WABA_ID, A1, to, template, "es_AR")
        .param("1")
        .category(Category::Transactional)
        .build();
    let reply = h.producer().send(&r).await.expect("ingest answers");
    assert!(reply.accepted, "{}", reply.error);
    op.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_moved_to_marketing_gets_marketing_rules_and_red_records_its_pace() {
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    h.start_coordinator(&[]).await;
    let key = ScopeKey::Template { waba_id: WABA_ID.into(), language: "es_AR".into(), name: TEMPLATE.into() };
    let conn = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    let rules = TemplateRules::new(bw_breaker::RedisConn::Single(conn));

    // The notice a day ahead changes nothing; the change itself makes it marketing.
    for notice in [true, false] {
        h.sim
            .fire_event(event(serde_json::json!({
                "kind": "template_category_update", "template": TEMPLATE, "language": "es_AR",
                "new_category": "MARKETING", "notice": notice,
            })))
            .expect("fired");
    }
    let moved =
        bw_testkit::wait_until(WAIT, || async { rules.read(&key).await.map(|r| r.is_marketing()).unwrap_or(false) })
            .await;
    assert!(moved, "the coordinator recorded the new category");
    // A utility template still goes to a US number; the moved one is marketing there now.
    let control = send_of(&h, "us-utility", "+15550100001", "order_update_kept").await;
    assert!(h.wait_all(std::slice::from_ref(&control), &SENT, WAIT).await, "utility goes to the US");
    let after = send(&h, "us-after", "+15550100002").await;
    assert!(h.wait_all(std::slice::from_ref(&after), &[OperationState::Failed], WAIT).await, "marketing rules");
    let entry = h.ledger_entry(&after).await.expect("ledger").entry;
    assert!(entry.reason.contains("marketing_undeliverable"), "{}", entry.reason);
    assert!(h.sim.oracle().get(&after).is_none(), "never sent");
    let elsewhere = send(&h, "ar-after", "+5491175000001").await;
    assert!(h.wait_all(std::slice::from_ref(&elsewhere), &SENT, WAIT).await, "marketing elsewhere still goes");

    // Quality RED: the template's marketing is paced fleet-wide.
    h.sim
        .fire_event(event(serde_json::json!({
            "kind": "message_template_quality_update", "template": TEMPLATE, "language": "es_AR",
            "previous_quality_score": "YELLOW", "new_quality_score": "RED",
        })))
        .expect("fired");
    let red =
        bw_testkit::wait_until(WAIT, || async { rules.read(&key).await.map(|r| r.is_red()).unwrap_or(false) }).await;
    let r = rules.read(&key).await.expect("read");
    assert!(red, "RED recorded: {r:?}");
    assert_eq!(r.red_per_min, bw_breaker_coordinator::meta_limits::RED_MARKETING_PER_MIN);
}
