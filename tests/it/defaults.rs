//! Meta's limits at the compiled default configuration: the dispatcher as users run it, the simulator at
//! Meta's documented limits (pair: one message per 6 s to a user, burst 45), which answers every refusal it
//! causes as limit-caused (not injected), so a self-inflicted 131056 cannot hide. Ingest and the dispatcher check
//! the sender registry (the compiled default tenancy); the senders are registered to the tenant `default`.

use bw_e2e::{Harness, WABA_ID};
use bw_proto::v1::{Category, OperationState};
use std::time::Duration;

const PHONE: &str = "106540352247001";

/// A storm to one customer (an order flow that sends many updates at once): 41 messages in a row, one more
/// than the default pair burst (40). The first 40 go at once, the 41st waits for the pair's 6 s slot; Meta
/// never answers 131056, and each is accepted exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_storm_at_defaults_draws_no_131056_and_paces_past_the_burst() {
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    h.register(&[PHONE]).await;
    h.start_ingest(&[("tenancy.mode", "registry".into())]).await;
    h.start_dispatcher_at_defaults().await;
    let producer = h.producer();
    let mut ops = Vec::new();
    for i in 0..41 {
        let op = format!("storm-{i:02}");
        let request = bw_client::Request::template(&op, WABA_ID, PHONE, "+5491155550777", "order_update", "es_AR")
            .param(&i.to_string())
            .category(Category::Transactional)
            .build();
        let reply = producer.send(&request).await.expect("ingest answers");
        assert!(reply.accepted, "rejected: {}", reply.error);
        ops.push(op);
    }
    let sent = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
    assert!(h.wait_all(&ops, &sent, Duration::from_secs(60)).await, "every message of the storm reached Meta");
    let counters = h.sim.counters();
    assert_eq!(counters.outcome("131056"), 0, "no 131056 at all: {:?}", counters.by_outcome);
    assert_eq!(counters.limit_exceeded("131056"), 0);
    let oracle = h.sim.oracle();
    let mut times: Vec<u64> = ops
        .iter()
        .map(|op| {
            let e = oracle.get(op).expect("accepted");
            assert_eq!(e.count, 1, "{op} accepted once");
            e.first_accepted_ms
        })
        .collect();
    times.sort_unstable();
    // 40 within the burst, the 41st at least one emission interval (6 s) after the first, as Meta's GCRA needs.
    let spread = times[40] - times[0];
    assert!(spread >= 6_000 - 50, "the 41st waited for the pair's slot (came {spread} ms after the first)");
}

/// Meta answering ambiguously after accepting, at the compiled defaults (10 s request timeout, 30 s ack wait):
/// bodiless 500/502/503, resets and hangs after acceptance, and unparseable 200s, then an app-wide call limit
/// (code 4). Nothing is lost, nothing that may have been accepted is resent blindly: every operation Meta
/// accepted twice went through BW_UNKNOWN (flagged), every ambiguous answer was reconciled from its status
/// webhook to SENT or later, and what the app limit refused waits in the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_answers_and_an_app_limit_at_defaults_lose_nothing_and_resend_nothing_blindly() {
    let scenario = bw_meta_sim::Scenario::from_toml(
        r#"
name = "mixed-ambiguous-short"
seed = 11
selection = "random"

[[windows]]
name = "ambiguous-after-acceptance"
start_ms = 0
duration_ms = 4000
error_rate = 0.2
faults = [
  { kind = "bodiless", status = 500, after_processing = true, page = "html", weight = 2 },
  { kind = "bodiless", status = 502, after_processing = true, page = "plain", weight = 1 },
  { kind = "bodiless", status = 503, after_processing = true, page = "empty", weight = 1 },
  { kind = "reset", after_processing = true, weight = 2 },
  { kind = "hang", hold_ms = 12000, accept = true, weight = 1 },
  { kind = "ok_unparseable", body = "truncated", weight = 1 },
]

[[windows]]
name = "app-call-limit"
start_ms = 4000
duration_ms = 2000
error_rate = 1.0
faults = [{ kind = "error", code = 4 }]
"#,
    )
    .expect("scenario parses");
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    let phones: Vec<String> = (0..4).map(|n| format!("10654035224710{n}")).collect();
    h.register(&phones.iter().map(String::as_str).collect::<Vec<_>>()).await;
    h.start_ingest(&[("tenancy.mode", "registry".into())]).await;
    h.start_dispatcher_at_defaults().await;
    h.sim.set_scenario(scenario);
    let mut ops = Vec::new();
    // 120 messages over about 6 s, to distinct customers of four senders, through both windows.
    for chunk in 0..12 {
        for i in 0..10 {
            let n = chunk * 10 + i;
            let phone = format!("10654035224710{}", n % 4);
            let op = format!("ambiguous-{n:03}");
            let request = bw_client::Request::template(
                &op,
                WABA_ID,
                &phone,
                &format!("+54911556{n:05}"),
                "order_confirmation",
                "es_AR",
            )
            .param("1")
            .category(Category::Transactional)
            .build();
            let reply = h.producer().send(&request).await.expect("ingest answers");
            assert!(reply.accepted, "rejected: {}", reply.error);
            ops.push(op);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Settled: reached Meta (reconciled where the answer was ambiguous), or parked in the DLQ by the app-wide
    // limit or a breaker the failures tripped (no replay runs here; the DLQ is the right place).
    let settled = [OperationState::Sent, OperationState::Delivered, OperationState::Read, OperationState::Dlq];
    let done = h.wait_all(&ops, &settled, Duration::from_secs(120)).await;
    let mut states = std::collections::BTreeMap::<String, usize>::new();
    let mut flagged = std::collections::BTreeSet::new();
    for op in &ops {
        let e = h.ledger_entry(op).await.expect("entry").entry;
        *states.entry(format!("{} {}", e.state().label(), e.last_code)).or_default() += 1;
        if e.flagged_unknown {
            flagged.insert(op.clone());
        }
        // In the DLQ only for the app limit, or because the ambiguous failures tripped its sender's breaker
        // (then it carries the incident): never for a resend decision.
        if e.state() == OperationState::Dlq {
            assert!(
                e.last_code == 4 || !e.incident_id.is_empty(),
                "{op} dead-lettered by the app limit or an open breaker only ({}, code {})",
                e.reason,
                e.last_code
            );
        }
    }
    assert!(done, "every operation settled: {states:?}");
    let counters = h.sim.counters();
    let injected = counters.injected.values().sum::<u64>();
    assert!(injected > 0, "the scenario injected faults: {:?}", counters.injected);
    let oracle = h.sim.oracle();
    assert!(oracle.plain_duplicates().is_empty(), "a 200 was never followed by a resend");
    for d in oracle.duplicates() {
        let op = d.operation_id.clone().unwrap_or_default();
        assert!(flagged.contains(&op), "{op} was accepted twice without going through BW_UNKNOWN");
    }
    assert!(!flagged.is_empty(), "some answers were ambiguous and went through BW_UNKNOWN");
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &ops).await.expect("accounting");
    assert!(report.is_clean(), "{report}");
}

/// A dispatcher configured with a Graph API version past its end (v20.0 ended 2026-09-24) refuses to start, with
/// the fix in the message; the override starts it, and it sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_api_version_is_refused_at_start_unless_overridden() {
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    let ended = [("meta.api_version", "v20.0".to_string())];
    let refused = h.start_dispatcher_at_defaults_but(&ended).await;
    let err = h.stop(refused).await.expect_err("an ended version is refused");
    let text = format!("{err:#}");
    assert!(text.contains("v20.0") && text.contains("meta.allow_expired_api_version = true"), "{text}");

    h.start_ingest(&[]).await;
    h.register(&[PHONE]).await;
    let overridden = [("meta.api_version", "v20.0".to_string()), ("meta.allow_expired_api_version", "true".into())];
    h.start_dispatcher_at_defaults_but(&overridden).await;
    let reply = h
        .producer()
        .send(
            &bw_client::Request::template("ended-1", WABA_ID, PHONE, "+5491166000001", "order_confirmation", "es_AR")
                .param("1")
                .category(Category::Transactional)
                .build(),
        )
        .await
        .expect("ingest answers");
    assert!(reply.accepted, "{}", reply.error);
    let sent = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
    assert!(h.wait_all(&["ended-1".to_string()], &sent, Duration::from_secs(60)).await, "the override sends");
}
