//! Each refusal pauses its own scope and nothing wider, against the simulator, with the dispatcher at its
//! compiled defaults: one number's 133010 holds that number while another number on the same token keeps
//! sending; a 368 holds its WABA's numbers while another WABA keeps sending; a bodiless 403 pauses the one
//! number briefly and probes, never the token; and replay waits for a WABA pause instead of replaying an
//! incident into it (no POISON), then sends every entry once the pause is lifted.

use bw_breaker::{Breaker, BreakerConfig, Parent, PauseEnd, PauseSource, PauseSpec, Scope};
use bw_common::classify::PauseScope;
use bw_common::nats::publish_durable;
use bw_e2e::{ACCESS_TOKEN, Harness, WABA_ID};
use bw_meta_sim::{Fault, FaultKind, Page, Scenario, Selection, SimConfig, Window};
use bw_proto::v1::*;
use bw_wire::names;
use prost::Message as _;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
/// A second WABA of the same business (same app, same token).
const OTHER_WABA: &str = "102290129340777";
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

fn sim() -> SimConfig {
    let mut cfg = SimConfig::default();
    cfg.limits.throughput_mps = 1_000.0;
    cfg.limits.throughput_burst = 1_000;
    cfg.limits.pair_enabled = false;
    cfg
}

/// Every request of `phones` answered with `fault`, from now on.
fn faulty(phones: &[&str], fault: FaultKind) -> Scenario {
    Scenario {
        name: "scoped-fault".into(),
        seed: Some(11),
        selection: Selection::Deterministic,
        windows: vec![Window {
            error_rate: 1.0,
            faults: vec![Fault { kind: fault, weight: 1 }],
            phone_number_ids: phones.iter().map(|p| p.to_string()).collect(),
            ..Window::new("fault", 0, None)
        }],
        ..Scenario::default()
    }
}

fn order(waba: &str, phone: &str, op: &str, i: usize) -> SendRequest {
    bw_client::Request::template(op, waba, phone, &format!("+5491166{i:06}"), "order_confirmation", "es_AR")
        .param("1")
        .category(Category::Transactional)
        .build()
}

/// Submits `n` orders from `phone` of `waba` through ingest (the sender registered to the tenant `default`
/// first: the dispatcher at its defaults checks the registry); their operation ids.
async fn submit(h: &Harness, waba: &str, phone: &str, prefix: &str, n: usize, first: usize) -> Vec<String> {
    bw_e2e::register_senders(&h.js, &[(phone, waba)]).await;
    let mut ops = Vec::new();
    for i in 0..n {
        let op = format!("{prefix}-{i:03}");
        let reply = h.producer().send(&order(waba, phone, &op, first + i)).await.expect("ingest answers");
        assert!(reply.accepted, "{}", reply.error);
        ops.push(op);
    }
    ops
}

async fn test_breaker(h: &Harness) -> Breaker {
    let redis = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    Breaker::new(Some(redis), None, BreakerConfig::default())
}

async fn pause_of(h: &Harness, parent: &Parent) -> bw_breaker::ParentStatus {
    test_breaker(h).await.parent_status(parent).await.expect("pause read")
}

fn token() -> Parent {
    Parent::Token(bw_breaker::token_fingerprint(ACCESS_TOKEN))
}

/// How many of `ops` Meta accepted (the simulator's oracle).
fn accepted(h: &Harness, ops: &[String]) -> usize {
    let oracle = h.sim.oracle();
    ops.iter().filter(|op| oracle.get(op).is_some()).count()
}

/// The DLQ entries of `ops`.
async fn dlq_entries(h: &Harness, ops: &[String]) -> Vec<DlqEnvelope> {
    let mut out = Vec::new();
    for m in bw_ops::scan::scan_stream(&h.js, names::DLQ_STREAM, "bw.dlq.>").await.expect("scan") {
        let env = DlqEnvelope::decode(m.payload.as_ref()).expect("envelope");
        if env.request.as_ref().is_some_and(|r| ops.contains(&r.operation_id)) {
            out.push(env);
        }
    }
    out
}

async fn dlq_reasons(h: &Harness, ops: &[String]) -> Vec<DlqReason> {
    dlq_entries(h, ops).await.iter().map(DlqEnvelope::reason).collect()
}

/// A 368 restriction of a WABA that holds until lifted.
fn waba_held_until_lifted(source: PauseSource) -> PauseSpec {
    PauseSpec { scope: PauseScope::Waba, code: 368, end: PauseEnd::Lifted, marketing_only: false, source }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_numbers_133010_pauses_that_number_while_another_on_the_token_keeps_sending() {
    const PAUSED: &str = "106540352201001";
    const HEALTHY: &str = "106540352201002";
    let mut h = Harness::start(sim()).await;
    h.sim.set_scenario(faulty(&[PAUSED], FaultKind::error(133010)));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let first = submit(&h, WABA_ID, PAUSED, "reg-a", 5, 0).await;
    assert!(h.wait_all(&first, &[OperationState::Dlq], WAIT).await, "the unregistered number's messages wait");
    let number = pause_of(&h, &Parent::Number(Scope::new(WABA_ID, PAUSED))).await;
    assert!(number.halted && number.code == 133010 && number.lift == "operator", "{number:?}");
    let refused = h.sim.counters().outcome("133010");
    assert!(refused >= 1, "Meta answered 133010");

    // Its later messages never reach Meta; the other number of the same WABA and token sends every one.
    let later = submit(&h, WABA_ID, PAUSED, "reg-b", 10, 100).await;
    let healthy = submit(&h, WABA_ID, HEALTHY, "ok", 20, 200).await;
    assert!(h.wait_all(&healthy, &SENT, WAIT).await, "the other number on the token keeps sending");
    assert!(h.wait_all(&later, &[OperationState::Dlq], WAIT).await);
    assert_eq!(h.sim.counters().outcome("133010"), refused, "nothing more reached Meta from the paused number");
    assert_eq!(accepted(&h, &later), 0);
    let reasons = dlq_reasons(&h, &later).await;
    assert!(reasons.len() == 10 && reasons.iter().all(|r| *r == DlqReason::SenderPaused), "{reasons:?}");
    // Nothing wider than the number: neither the WABA nor the token.
    assert!(!pause_of(&h, &Parent::Waba(WABA_ID.into())).await.active(0));
    assert!(!pause_of(&h, &token()).await.active(0), "133010 never halts the token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_368_on_one_waba_leaves_the_other_waba_untouched() {
    const A1: &str = "106540352202001";
    const A2: &str = "106540352202002";
    const B1: &str = "106540352202003";
    let mut h = Harness::start(sim()).await;
    h.sim.set_scenario(faulty(&[A1], FaultKind::error(368)));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let first = submit(&h, WABA_ID, A1, "a1", 3, 0).await;
    assert!(h.wait_all(&first, &[OperationState::Dlq], WAIT).await);
    let waba = pause_of(&h, &Parent::Waba(WABA_ID.into())).await;
    assert!(waba.halted && waba.code == 368 && waba.source == "answer", "{waba:?}");

    let same_waba = submit(&h, WABA_ID, A2, "a2", 10, 100).await;
    let other_waba = submit(&h, OTHER_WABA, B1, "b1", 20, 200).await;
    assert!(h.wait_all(&other_waba, &SENT, WAIT).await, "the other WABA keeps sending");
    assert!(h.wait_all(&same_waba, &[OperationState::Dlq], WAIT).await, "the restricted WABA's other number waits");
    assert_eq!(accepted(&h, &same_waba), 0, "nothing of the restricted WABA reached Meta");
    assert_eq!(accepted(&h, &other_waba), 20);
    assert!(!pause_of(&h, &Parent::Waba(OTHER_WABA.into())).await.active(0));
    assert!(!pause_of(&h, &token()).await.active(0), "368 never halts the token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bodiless_403_pauses_the_number_briefly_and_probes_and_never_halts_the_token() {
    const PROXIED: &str = "106540352203001";
    const HEALTHY: &str = "106540352203002";
    let mut h = Harness::start(sim()).await;
    let proxy_403 = FaultKind::Bodiless { status: 403, page: Page::Empty, after_processing: false };
    h.sim.set_scenario(faulty(&[PROXIED], proxy_403));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let refused = submit(&h, WABA_ID, PROXIED, "proxied", 5, 0).await;
    let number = Parent::Number(Scope::new(WABA_ID, PROXIED));
    let paused = bw_testkit::wait_until(WAIT, || async { pause_of(&h, &number).await.lift == "probe" }).await;
    assert!(paused, "{:?}", pause_of(&h, &number).await);
    let healthy = submit(&h, WABA_ID, HEALTHY, "healthy", 20, 100).await;
    assert!(h.wait_all(&healthy, &SENT, WAIT).await, "the token still sends for the other number");
    assert!(!pause_of(&h, &token()).await.active(0), "a bodiless 403 never halts the token");
    assert!(!pause_of(&h, &Parent::Waba(WABA_ID.into())).await.active(0));

    // The proxy lets requests through again: after the pause one send probes, and then every message goes.
    h.sim.clear_scenario();
    assert!(h.wait_all(&refused, &SENT, Duration::from_secs(180)).await, "the probe reopened the number");
    let oracle = h.sim.oracle();
    assert!(refused.iter().all(|op| oracle.get(op).is_some_and(|e| e.count == 1)), "each accepted once");
}

/// Seeds one DLQ entry of a breaker incident (ledger DLQ, envelope with the incident), its sender registered to
/// the tenant `default`.
async fn seed_dlq(h: &Harness, request: &SendRequest, incident: &str) {
    bw_e2e::register_senders(&h.js, &[(request.phone_number_id.as_str(), request.waba_id.as_str())]).await;
    let entry = bw_common::ledger::entry_for(request, OperationState::Dlq);
    h.ledger
        .update(&request.operation_id, |_| Some(LedgerEntry { incident_id: incident.into(), ..entry.clone() }))
        .await
        .expect("ledger");
    let env = DlqEnvelope {
        request: Some(request.clone()),
        reason: DlqReason::BreakerOpen as i32,
        incident_id: incident.into(),
        dead_lettered_at_unix_ms: bw_common::time::now_ms(),
        ..Default::default()
    };
    publish_durable(
        &h.js,
        names::dlq_subject(request.category(), &request.phone_number_id),
        names::msg_id_headers(&format!("{}.seed", request.operation_id)),
        env.encode_to_vec().into(),
    )
    .await
    .expect("dlq publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_waits_for_a_waba_pause_and_replays_the_incident_once_it_lifts_with_no_poison() {
    const PAUSED: &str = "106540352204001";
    const CONTROL: &str = "106540352204002";
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    // The incident's entries wait in the DLQ of a sender whose WABA is restricted (368), with a control sender
    // of another WABA beside it.
    let breaker = test_breaker(&h).await;
    breaker.pause(&Parent::Waba(WABA_ID.into()), waba_held_until_lifted(PauseSource::Answer)).await.expect("pause");
    let mut paused_ops = Vec::new();
    for i in 0..8 {
        let r = order(WABA_ID, PAUSED, &format!("inc-{i}"), i);
        seed_dlq(&h, &r, "106540352204001-1").await;
        paused_ops.push(r.operation_id);
    }
    let mut control_ops = Vec::new();
    for i in 0..8 {
        let r = order(OTHER_WABA, CONTROL, &format!("ctl-{i}"), 100 + i);
        seed_dlq(&h, &r, "106540352204002-1").await;
        control_ops.push(r.operation_id);
    }
    h.start_coordinator(&[]).await;
    h.start_replay(&[]).await;
    let shown = bw_testkit::wait_until(WAIT, || async {
        let Ok(Some(v)) = h.buckets.scopes.get(PAUSED).await else { return false };
        ScopeSnapshot::decode(v.as_ref()).is_ok_and(|s| s.pauses.iter().any(|p| p.level == "waba" && p.code == 368))
    })
    .await;
    assert!(shown, "the coordinator puts the WABA's pause in the sender's snapshot");

    // Replay drains the control sender; the paused one's entries stay where they are, not replayed once.
    assert!(h.wait_all(&control_ops, &SENT, WAIT).await, "the other WABA's incident is replayed");
    for op in &paused_ops {
        let entry = h.ledger_entry(op).await.expect("ledger").entry;
        assert_eq!((entry.state(), entry.replays), (OperationState::Dlq, 0), "{op} waits untouched");
    }
    assert_eq!(accepted(&h, &paused_ops), 0);

    // The restriction is lifted: every entry goes out, once, and nothing became POISON.
    breaker.clear_parent(&Parent::Waba(WABA_ID.into())).await.expect("lift");
    assert!(h.wait_all(&paused_ops, &SENT, WAIT).await, "replayed once the pause lifted");
    let oracle = h.sim.oracle();
    assert!(paused_ops.iter().all(|op| oracle.get(op).is_some_and(|e| e.count == 1)), "each sent once");
    for op in &paused_ops {
        assert_eq!(h.ledger_entry(op).await.expect("ledger").entry.replays, 1, "{op}: one replay, no bounce");
    }
    let quarantined =
        bw_ops::scan::scan_stream(&h.js, names::QUARANTINE_STREAM, "bw.quarantine.>").await.expect("scan");
    assert!(quarantined.is_empty(), "no POISON: {} quarantined", quarantined.len());
}

/// A pause that lasts until lifted dead-letters its messages with a recheck hint of `token_halt_retry_ms`
/// (10 minutes at the defaults) as their not-before. Once the pause is lifted, replay sends them without waiting
/// out that hint: each once, none into the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_held_until_a_lift_go_out_once_it_lifts_not_at_the_recheck_hint() {
    const HELD: &str = "106540352205001";
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    let breaker = test_breaker(&h).await;
    let held = waba_held_until_lifted(PauseSource::Operator);
    breaker.pause(&Parent::Waba(WABA_ID.into()), held).await.expect("pause");
    let ops = submit(&h, WABA_ID, HELD, "held", 5, 0).await;
    assert!(h.wait_all(&ops, &[OperationState::Dlq], WAIT).await, "held by the pause");
    let hint = bw_common::time::now_ms() + 5 * 60 * 1000;
    let entries = dlq_entries(&h, &ops).await;
    assert_eq!(entries.len(), ops.len());
    for env in entries {
        assert_eq!(env.reason(), DlqReason::SenderPaused);
        assert!(env.not_before_unix_ms > hint, "the compiled recheck hint is minutes away");
    }
    assert_eq!(accepted(&h, &ops), 0);

    h.start_coordinator(&[]).await;
    h.start_replay(&[]).await;
    breaker.clear_parent(&Parent::Waba(WABA_ID.into())).await.expect("lift");
    // Bounded well below the hint: replay's own recheck (replay.hold_recheck_ms, 30 s) is the longest wait left.
    assert!(h.wait_all(&ops, &SENT, Duration::from_secs(150)).await, "sent once the pause lifted");
    let oracle = h.sim.oracle();
    assert!(ops.iter().all(|op| oracle.get(op).is_some_and(|e| e.count == 1)), "each sent once");
    assert_eq!(h.sim.counters().outcome("368"), 0, "nothing was sent into the pause");
}
