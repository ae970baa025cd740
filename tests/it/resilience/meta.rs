//! Meta misbehaves or is flooded: requests hang past the client timeout, and a burst of messages arrives at
//! once.

use super::common::{SENT, Verdict, breaker, ledger, requests, sim, submit, wait_states};
use bw_e2e::Harness;
use bw_meta_sim::{Fault, FaultKind, Scenario, Selection, Window};
use bw_proto::v1::{LedgerEntry, OperationState};
use std::time::{Duration, Instant};

const PHONE: &str = "106540352242951";
const WAIT: Duration = Duration::from_secs(60);

/// One request in five hangs past the dispatcher's 400 ms timeout: half of those after Meta accepted the
/// message (the status webhooks later prove it was sent), half before (no status ever comes). Transactional
/// messages whose outcome stays unknown are quarantined by the reconciler's policy, never resent.
///
/// Proves: every hang becomes an operation flagged unknown; those Meta accepted end SENT (reconciled from
/// the status webhooks), the others end QUARANTINED; no operation reaches Meta twice; nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_hanging_past_the_timeout_is_reconciled_and_never_resent_blindly() {
    let mut h = Harness::start(sim(true)).await;
    h.sim.set_scenario(Scenario {
        name: "hangs".into(),
        seed: Some(11),
        selection: Selection::Deterministic,
        latency: None,
        windows: vec![Window {
            name: "hang".into(),
            start_ms: 0,
            duration_ms: None,
            error_rate: 0.2,
            faults: vec![
                Fault { kind: FaultKind::Hang { hold_ms: 1_500, accept: true }, weight: 1 },
                Fault { kind: FaultKind::Hang { hold_ms: 1_500, accept: false }, weight: 1 },
            ],
            latency: None,
            phone_number_ids: vec![],
        }],
        ..Scenario::default()
    });
    h.start_ingest(&[("reconciler.review_delay_ms", "1500".into())]).await;
    let mut settings = breaker(200);
    settings.push(("meta.request_timeout_ms", "400".into()));
    settings.push(("dispatch.unknown_review_ms", "1500".into()));
    h.start_dispatcher(&settings).await;
    let ops = submit(&h.producer(), requests(PHONE, "hang", 200), 32, WAIT).await;

    let mut settled = SENT.to_vec();
    settled.push(OperationState::Quarantined);
    wait_states(&h.js, &h.buckets, &ops, &settled, Duration::from_secs(30)).await;
    let oracle = h.sim.oracle();
    let entries = ledger(&h.js, &h.buckets).await;
    let hangs = oracle.counters.outcome("hang");
    assert_eq!(hangs, 40, "one request in five hung (deterministic selection)");
    let flagged: Vec<&LedgerEntry> =
        ops.iter().filter_map(|op| entries.get(op)).filter(|e| e.flagged_unknown).collect();
    assert_eq!(flagged.len() as u64, hangs, "every hang is an operation flagged unknown");
    for op in &ops {
        let entry = &entries[op];
        let accepted = oracle.get(op).map(|e| e.count).unwrap_or(0);
        assert!(accepted <= 1, "{op} reached Meta {accepted} times");
        if accepted == 1 {
            assert!(entry.state().is_accepted_by_meta(), "{op}: Meta accepted it, ledger says {:?}", entry.state());
        } else {
            assert_eq!(entry.state(), OperationState::Quarantined, "{op}: never accepted, so never sent");
            assert!(entry.flagged_unknown, "{op}: only an unknown outcome ends quarantined here");
        }
    }
    let quarantined = ops.iter().filter(|op| entries[*op].state() == OperationState::Quarantined).count();
    assert_eq!(quarantined, 20, "the hangs before acceptance");
    let verdict = Verdict::of(&h.js, &h.buckets, &oracle, &ops).await;
    verdict.assert_nothing_lost();
    assert!(verdict.duplicates.is_empty(), "never resent blindly: {:?}", verdict.duplicates);
}

/// A burst of 10,000 messages (100,000 when `BW_SLOW_TESTS=1`; too heavy for a 2-core CI runner on every
/// run) stored in BW_SEND at once, then drained by one dispatcher against a simulator with its limits off.
///
/// Proves: under a burst every message is sent exactly once and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_messages_is_sent_once_each_and_nothing_is_lost() {
    let n: usize = if std::env::var("BW_SLOW_TESTS").as_deref() == Ok("1") { 100_000 } else { 10_000 };
    let mut h = Harness::start(sim(false)).await;
    let mut batch = requests(PHONE, "burst", n);
    let now = bw_common::time::now_ms();
    for r in &mut batch {
        r.accepted_at_unix_ms = now;
    }
    let started = Instant::now();
    h.preload(&batch).await;
    let stored_in = started.elapsed();
    let mut settings = breaker(1_000_000);
    settings.extend([
        ("dispatch.publish_outcomes", "false".to_string()),
        ("dispatch.batch_size", "256".to_string()),
        ("dispatch.max_in_flight", "2048".to_string()),
    ]);
    let started = Instant::now();
    h.start_dispatcher(&settings).await;
    let budget = Duration::from_secs(60 + n as u64 / 100);
    assert!(
        bw_testkit::wait_until(budget, || async { h.sim.total_accepted() >= n as u64 }).await,
        "only {} of {n} sent in {budget:?}",
        h.sim.total_accepted()
    );
    let sent_in = started.elapsed();
    let ops: Vec<String> = batch.into_iter().map(|r| r.operation_id).collect();
    wait_states(&h.js, &h.buckets, &ops, &SENT, WAIT).await;
    eprintln!(
        "burst of {n}: stored in {stored_in:?}, sent in {sent_in:?} ({:.0} msg/s)",
        n as f64 / sent_in.as_secs_f64()
    );
    let verdict = Verdict::of(&h.js, &h.buckets, &h.sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    assert_eq!(verdict.reached_meta, n);
    assert!(
        verdict.duplicates.is_empty(),
        "sent once each: {:?}",
        &verdict.duplicates[..verdict.duplicates.len().min(5)]
    );
}
