//! Template pacing end to end, with the dispatcher at its compiled defaults (meta-cloud-api.md §3.5). A paced
//! template's sends are answered `message_status: held_for_quality_assessment`: such a message is HELD in the
//! ledger (not failed, never resent) until Meta's status webhooks move it on. When Meta releases it, it is sent
//! and delivered once. When Meta pauses the template instead, the PAUSED webhook holds the template at once: Meta's
//! drop of each held message (failed 132015) becomes a new attempt that waits in the template's quarantine scope
//! with the template's new messages, none of which Meta accepts, and APPROVED sends each once more.

use bw_breaker::templates::{ScopeKey, TemplateHolds};
use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::SimConfig;
use bw_proto::v1::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);
const A1: &str = "106540352205021";
const TEMPLATE: &str = "promo_paced";
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

fn sim() -> SimConfig {
    crate::open_sim(&[(A1, WABA_ID)])
}

use crate::sim_event as event;

async fn send(h: &Harness, prefix: &str, n: usize, first: usize) -> Vec<String> {
    bw_e2e::register_senders(&h.js, &[(A1, WABA_ID)]).await;
    let mut ops = Vec::new();
    for i in 0..n {
        let op = format!("{prefix}-{i:03}");
        let to = format!("+5491176{:06}", first + i);
        let r = bw_client::Request::template(&op, WABA_ID, A1, &to, TEMPLATE, "es_AR")
            .param("1")
            .category(Category::Transactional)
            .build();
        let reply = h.producer().send(&r).await.expect("ingest answers");
        assert!(reply.accepted, "{}", reply.error);
        ops.push(op);
    }
    ops
}

fn pacing(action: &str) -> bw_meta_sim::Event {
    event(serde_json::json!({
        "kind": "template_pacing", "template": TEMPLATE, "language": "es_AR", "action": action,
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_send_is_its_own_state_until_meta_releases_it() {
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    h.sim.fire_event(pacing("hold")).expect("fired");

    let ops = send(&h, "paced", 4, 0).await;
    assert!(h.wait_all(&ops, &[OperationState::Held], WAIT).await, "Meta holds them: HELD in the ledger");
    for op in &ops {
        let entry = h.ledger_entry(op).await.expect("ledger").entry;
        assert!(!entry.wamid.is_empty(), "{op}: accepted, with its wamid");
        assert!(entry.reason.starts_with("held_for_quality_assessment"), "{op}: {}", entry.reason);
        assert_eq!(entry.attempts, 1, "{op}: one try");
    }

    // Meta releases them: their statuses follow and each was sent once.
    h.sim.fire_event(pacing("release")).expect("fired");
    assert!(h.wait_all(&ops, &SENT, WAIT).await, "released messages move on to sent / delivered");
    let oracle = h.sim.oracle();
    for op in &ops {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted exactly once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pacing_pause_holds_the_template_at_once_and_approval_sends_each_once() {
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    h.start_coordinator(&[]).await;
    let key = ScopeKey::Template { waba_id: WABA_ID.into(), language: "es_AR".into(), name: TEMPLATE.into() };
    let conn = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    let holds = TemplateHolds::new(bw_breaker::RedisConn::Single(conn));

    h.sim.fire_event(pacing("hold")).expect("fired");
    let paced = send(&h, "paced", 4, 0).await;
    assert!(h.wait_all(&paced, &[OperationState::Held], WAIT).await, "held by Meta");

    // Bad feedback: Meta pauses the template during pacing (a manual unpause is needed) and drops the held ones.
    h.sim
        .fire_event(event(serde_json::json!({
            "kind": "message_template_status_update", "template": TEMPLATE, "language": "es_AR",
            "event": "PAUSED", "title": "RATE_LIMITING_PAUSE", "waba_id": WABA_ID,
        })))
        .expect("fired");
    let held = bw_testkit::wait_until(WAIT, || async { holds.read(&key).await.ok().flatten().is_some() }).await;
    assert!(held, "the PAUSED webhook held the template");
    let later = send(&h, "later", 6, 100).await;
    let all: Vec<String> = paced.iter().chain(&later).cloned().collect();
    assert!(h.wait_all(&all, &[OperationState::Quarantined], WAIT).await, "every message waits in the scope");
    // A dispatcher trusts its read of a hold for a second, so a send in that second may still meet the paused
    // template at Meta: refused with 132015 (never accepted, not charged) and held then, as the webhook would.
    for op in &later {
        assert!(h.sim.oracle().get(op).is_none(), "{op} never accepted by Meta while paused");
    }

    // Meta unpauses it: each message is sent once more (the dropped ones: a new attempt, not a duplicate).
    h.sim
        .fire_event(event(serde_json::json!({
            "kind": "message_template_status_update", "template": TEMPLATE, "language": "es_AR",
            "event": "APPROVED", "title": "UNPAUSE", "waba_id": WABA_ID,
        })))
        .expect("fired");
    assert!(h.wait_all(&all, &SENT, WAIT).await, "released and sent");
    let oracle = h.sim.oracle();
    for op in &later {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted exactly once");
    }
    for op in &paced {
        let e = oracle.get(op).expect("accepted");
        assert_eq!((e.count, e.failed), (2, 1), "{op}: dropped by Meta once, then sent once");
    }
}
