//! Quarantine scopes and per-recipient marketing gates, against the simulator, with the dispatcher at its
//! compiled defaults (issue #40 items 5 and 7): a template paused by 132015 holds its messages unsent while other
//! templates flow, and `bwctl quarantine release` sends each held message once; an unclassified code quarantines
//! by code without a replay loop; 131049 holds marketing to that recipient from every sender of the tenant while
//! a utility message flows; 131050 makes later marketing to the user fail fast; marketing to +1 fails fast.
//!
//! The codes are answered synchronously (`Mode::Sync`), which tests the dispatcher's answer path alone. Meta reports
//! 131049 and 131050 in `failed` status webhooks (the reference lists them as asynchronous); those reach the same
//! gates once asynchronous failures re-enter the dispatcher (#40 item 3), and need a test of their own there.

use bw_common::nats::publish_durable;
use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::inject::{Injection, Mode, TemplateRef};
use bw_meta_sim::{Scenario, SimConfig};
use bw_proto::v1::*;
use bw_wire::names;
use prost::Message as _;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

fn sim() -> SimConfig {
    let mut cfg = SimConfig::default();
    cfg.limits.throughput_mps = 1_000.0;
    cfg.limits.throughput_burst = 1_000;
    cfg.limits.pair_enabled = false;
    cfg
}

fn scenario(injections: Vec<Injection>) -> Scenario {
    Scenario { name: "gates".into(), seed: Some(7), injections, ..Scenario::default() }
}

fn template(phone: &str, op: &str, to: &str, name: &str, category: Category) -> SendRequest {
    bw_client::Request::template(op, WABA_ID, phone, to, name, "es_AR").param("1").category(category).build()
}

async fn submit(h: &Harness, requests: &[SendRequest]) -> Vec<String> {
    let mut ops = Vec::new();
    for r in requests {
        bw_e2e::register_senders(&h.js, &[(r.phone_number_id.as_str(), WABA_ID)]).await;
        let reply = h.producer().send(r).await.expect("ingest answers");
        assert!(reply.accepted, "{}", reply.error);
        ops.push(r.operation_id.clone());
    }
    ops
}

fn accepted(h: &Harness, ops: &[String]) -> usize {
    let oracle = h.sim.oracle();
    ops.iter().filter(|op| oracle.get(op).is_some()).count()
}

async fn quarantine_entries(h: &Harness) -> Vec<QuarantineEntry> {
    let msgs = bw_ops::scan::scan_stream(&h.js, names::QUARANTINE_STREAM, "bw.quarantine.>").await.expect("scan");
    msgs.iter().filter_map(|m| QuarantineEntry::decode(m.payload.as_ref()).ok()).collect()
}

async fn reason(h: &Harness, op: &str) -> String {
    h.ledger_entry(op).await.map(|v| v.entry.reason).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_paused_by_132015_holds_its_messages_while_others_flow_then_release_sends_each_once() {
    const PHONE: &str = "106540352207001";
    let mut h = Harness::start(sim()).await;
    // Meta pauses the template: only the first call gets 132015; any later call reaching Meta would be accepted,
    // so an accepted held message would show a leak.
    let mut paused = Injection::new(132015);
    paused.templates = vec![TemplateRef { name: "promo_flash".into(), language: Some("es_AR".into()) }];
    paused.max = Some(1);
    paused.mode = Some(Mode::Sync);
    h.sim.set_scenario(scenario(vec![paused]));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let first =
        submit(&h, &[template(PHONE, "promo-000", "+5491166000000", "promo_flash", Category::Transactional)]).await;
    assert!(h.wait_all(&first, &[OperationState::Quarantined], WAIT).await, "the paused template's message waits");
    let scope = format!("tpl:{WABA_ID}:es_AR:promo_flash");

    let held: Vec<SendRequest> = (1..=5)
        .map(|i| {
            template(
                PHONE,
                &format!("promo-{i:03}"),
                &format!("+54911660000{i:02}"),
                "promo_flash",
                Category::Transactional,
            )
        })
        .collect();
    let others: Vec<SendRequest> = (0..10)
        .map(|i| {
            template(
                PHONE,
                &format!("order-{i:03}"),
                &format!("+54911670000{i:02}"),
                "order_update",
                Category::Transactional,
            )
        })
        .collect();
    let held = submit(&h, &held).await;
    let others = submit(&h, &others).await;
    assert!(h.wait_all(&others, &SENT, WAIT).await, "other templates keep flowing");
    assert!(h.wait_all(&held, &[OperationState::Quarantined], WAIT).await, "later messages of it are held");
    assert_eq!(h.sim.counters().outcome("132015"), 1, "nothing more of the paused template reached Meta");
    assert_eq!(accepted(&h, &held), 0);
    let entries = quarantine_entries(&h).await;
    let all: Vec<String> = first.iter().chain(&held).cloned().collect();
    for op in &all {
        let e = entries.iter().find(|e| e.request.as_ref().is_some_and(|r| &r.operation_id == op)).expect("entry");
        assert_eq!(e.scope_key, scope, "held under the template's scope");
        assert_eq!(e.reason(), QuarantineReason::TemplateHeld);
        let why = reason(&h, op).await;
        assert!(why.contains("promo_flash") && why.contains("132015"), "the producer's feed says why: {why}");
    }

    // The operator lists the scope and releases it: each held message goes out exactly once.
    let redis = h.redis.url();
    let (code, out) = crate::bwctl(&h.nats.url(), &["--redis-url", &redis, "quarantine", "ls"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&scope) && out.contains("more"), "the scope, held for 132015's 3 h: {out}");
    assert!(!out.contains("+54911"), "no phone number in the listing: {out}");
    let (code, out) =
        crate::bwctl(&h.nats.url(), &["--redis-url", &redis, "quarantine", "release", "--scope", &scope]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hold lifted"), "{out}");
    assert!(h.wait_all(&all, &SENT, WAIT).await, "released messages are sent");
    let oracle = h.sim.oracle();
    assert!(all.iter().all(|op| oracle.get(op).is_some_and(|e| e.count == 1)), "each sent once");
    assert!(quarantine_entries(&h).await.iter().all(|e| e.scope_key != scope), "the scope is empty");

    // A second release of the now empty scope is refused with a clear error; so is a malformed key.
    let cli = |args: Vec<String>| {
        use clap::Parser as _;
        let mut argv =
            vec!["bwctl".to_string(), "--nats-url".into(), h.nats.url(), "--redis-url".into(), redis.clone()];
        argv.extend(args);
        bw_cli::Cli::try_parse_from(argv).expect("arguments parse")
    };
    let mut sink = Vec::new();
    let again = cli(vec!["quarantine".into(), "release".into(), "--scope".into(), scope.clone()]);
    let err = Box::pin(bw_cli::run(again, &mut sink)).await.expect_err("nothing held");
    assert!(format!("{err:#}").contains("no quarantine scope"), "{err:#}");
    let bad = cli(vec![
        "quarantine".into(),
        "drop".into(),
        "--scope".into(),
        "+5491166000001".into(),
        "--reason".into(),
        "x".into(),
    ]);
    let err = Box::pin(bw_cli::run(bad, &mut sink)).await.expect_err("not a scope key");
    let err = format!("{err:#}");
    assert!(err.contains("scope key") && !err.contains("5491166000001"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unclassified_code_quarantines_by_code_without_a_replay_loop() {
    const PHONE: &str = "106540352207002";
    let mut h = Harness::start(sim()).await;
    let mut odd = Injection::new(424242);
    odd.phone_number_ids = vec![PHONE.into()];
    odd.mode = Some(Mode::Sync);
    h.sim.set_scenario(scenario(vec![odd]));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    // Replay drains the scopes the coordinator snapshots (BW_SCOPES), as in production.
    h.start_coordinator(&[]).await;
    h.start_replay(&[]).await;

    let reqs: Vec<SendRequest> = (0..3)
        .map(|i| {
            template(
                PHONE,
                &format!("odd-{i:03}"),
                &format!("+54911680000{i:02}"),
                "order_update",
                Category::Transactional,
            )
        })
        .collect();
    let ops = submit(&h, &reqs).await;
    assert!(h.wait_all(&ops, &[OperationState::Quarantined], WAIT).await);

    // An entry an older dispatcher left in the DLQ as unclassified moves to the quarantine, never replayed.
    let legacy = template(PHONE, "odd-legacy", "+5491168000099", "order_update", Category::Transactional);
    bw_e2e::register_senders(&h.js, &[(PHONE, WABA_ID)]).await;
    h.ledger
        .update(&legacy.operation_id, |_| Some(bw_common::ledger::entry_for(&legacy, OperationState::Dlq)))
        .await
        .expect("ledger");
    let env = DlqEnvelope {
        request: Some(legacy.clone()),
        reason: DlqReason::Unclassified as i32,
        last_error: Some(ErrorInfo { meta_code: 424242, ..Default::default() }),
        dead_lettered_at_unix_ms: bw_common::time::now_ms(),
        ..Default::default()
    };
    let subject = names::dlq_subject(legacy.category(), &legacy.phone_number_id);
    publish_durable(&h.js, subject, names::msg_id_headers("odd-legacy.seed"), env.encode_to_vec().into())
        .await
        .expect("seed");
    let legacy_op = vec![legacy.operation_id.clone()];
    assert!(h.wait_all(&legacy_op, &[OperationState::Quarantined], WAIT).await, "moved, not replayed");

    let entries = quarantine_entries(&h).await;
    let all: Vec<String> = ops.iter().chain(&legacy_op).cloned().collect();
    for op in &all {
        let e = entries.iter().find(|e| e.request.as_ref().is_some_and(|r| &r.operation_id == op)).expect("entry");
        assert_eq!((e.reason(), e.scope_key.as_str()), (QuarantineReason::Unclassified, "code:424242"), "{op}");
    }
    assert!(entries.iter().all(|e| e.reason() != QuarantineReason::Poison), "no POISON");
    assert_eq!(h.sim.counters().outcome("424242"), 3, "each refused message reached Meta once; the legacy one never");
    assert_eq!(accepted(&h, &all), 0);
    // Still there, and still not re-sent, once replay has had every chance to pick them up again.
    let dlq = bw_ops::scan::scan_stream(&h.js, names::DLQ_STREAM, "bw.dlq.>").await.expect("scan");
    assert!(dlq.is_empty(), "nothing of the scope waits in the DLQ for a replay");
    assert_eq!(h.sim.counters().outcome("424242"), 3);

    // An operator sees the scope, with its code and its four messages, and no phone number.
    let (code, out) = crate::bwctl(&h.nats.url(), &["--redis-url", &h.redis.url(), "quarantine", "ls"]).await;
    assert_eq!(code, 0, "{out}");
    let row = out.lines().find(|l| l.contains("code:424242")).unwrap_or_else(|| panic!("scope listed: {out}"));
    assert!(row.contains("unclassified") && row.contains(" 4 "), "{row}");
    assert!(!out.contains("+54911"), "no phone number in the listing: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_131049_holds_marketing_to_that_recipient_from_every_sender_while_utility_flows() {
    const FIRST: &str = "106540352207003";
    const SECOND: &str = "106540352207004";
    const TO: &str = "+5491169000001";
    let mut h = Harness::start(sim()).await;
    let mut limit = Injection::new(131049);
    limit.recipients = vec![TO.into()];
    limit.mode = Some(Mode::Sync);
    limit.max = Some(1);
    h.sim.set_scenario(scenario(vec![limit]));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let first = submit(&h, &[template(FIRST, "mkt-1", TO, "promo_flash", Category::Marketing)]).await;
    assert!(h.wait_all(&first, &[OperationState::Dlq], WAIT).await, "the first marketing message cools off");
    // Another sender of the same tenant: its marketing to the same recipient waits too, unsent; a utility
    // message from the first sender (behind the held marketing message in its order chain) flows.
    let second = submit(&h, &[template(SECOND, "mkt-2", TO, "promo_flash", Category::Marketing)]).await;
    let utility = submit(&h, &[template(FIRST, "util-1", TO, "order_update", Category::Transactional)]).await;
    assert!(h.wait_all(&utility, &SENT, WAIT).await, "a utility message to the recipient is not held");
    assert!(h.wait_all(&second, &[OperationState::Dlq], WAIT).await, "marketing from another sender waits");
    assert_eq!(h.sim.counters().outcome("131049"), 1, "no retry inside the cool-off reached Meta");
    assert_eq!(accepted(&h, &first) + accepted(&h, &second), 0);
    let dlq = bw_ops::scan::scan_stream(&h.js, names::DLQ_STREAM, "bw.dlq.>").await.expect("scan");
    assert_eq!(dlq.len(), 2, "both marketing messages wait in the DLQ, nothing else");
    for m in dlq {
        let env = DlqEnvelope::decode(m.payload.as_ref()).expect("envelope");
        assert_eq!(env.reason(), DlqReason::RecipientDeferred);
        assert!(env.not_before_unix_ms > bw_common::time::now_ms() + 23 * 3_600_000, "a day's cool-off");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_131050_makes_later_marketing_fail_fast_and_us_marketing_is_never_sent() {
    const PHONE: &str = "106540352207005";
    const OTHER: &str = "106540352207006";
    const TO: &str = "+5491169000002";
    const US: &str = "+12125550123";
    let mut h = Harness::start(sim()).await;
    let mut stopped = Injection::new(131050);
    stopped.recipients = vec![TO.into()];
    stopped.mode = Some(Mode::Sync);
    h.sim.set_scenario(scenario(vec![stopped]));
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;

    let first = submit(&h, &[template(PHONE, "stop-1", TO, "promo_flash", Category::Marketing)]).await;
    assert!(h.wait_all(&first, &[OperationState::Quarantined], WAIT).await, "131050 is final for that message");
    let later = submit(&h, &[template(OTHER, "stop-2", TO, "promo_flash", Category::Marketing)]).await;
    assert!(h.wait_all(&later, &[OperationState::Failed], WAIT).await, "later marketing fails fast");
    let why = reason(&h, &later[0]).await;
    assert!(why.contains("131050") && why.contains("without sending"), "{why}");
    assert_eq!(h.sim.counters().outcome("131050"), 1, "the later one never reached Meta");

    let us = submit(&h, &[template(PHONE, "us-1", US, "promo_flash", Category::Marketing)]).await;
    let us_utility = submit(&h, &[template(PHONE, "us-2", US, "order_update", Category::Transactional)]).await;
    assert!(h.wait_all(&us, &[OperationState::Failed], WAIT).await, "US marketing fails fast");
    assert!(h.wait_all(&us_utility, &SENT, WAIT).await, "non-marketing to the US still goes");
    let why = reason(&h, &us[0]).await;
    assert!(why.contains("+1") && !why.contains("2125550123"), "{why}");
    assert_eq!(accepted(&h, &us), 0, "never sent");
    assert!(bw_ops::scan::scan_stream(&h.js, names::DLQ_STREAM, "bw.dlq.>").await.expect("scan").is_empty());
}
