//! Scale bench of the console's pages: every page rendered from a view of 1,000 senders (each with a pause and
//! an incident) and 100,000 DLQ entries, as the handlers render it. Prints the median and the worst of 7 runs
//! per page and fails when a median exceeds 200 ms.
//!
//!   cargo bench -p bw-console --bench render --profile dev     (the figures in docs/console.md)
//!
//! What it does not include: reading the view from NATS (done in the background every refresh, never while a
//! page is served) and the network.

use bw_console::auth::Principal;
use bw_console::config::Role;
use bw_console::pages::{DlqQuery, render_dlq, render_incidents, render_op, render_overview, render_quarantine};
use bw_console::view::{DlqRow, View};
use bw_proto::v1::{
    BreakerState, BreakerTransition, IncidentProgress, LedgerEntry, OutcomeEvent, Scope, ScopePause, ScopeSnapshot,
};
use std::time::Instant;

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SENDERS: usize = 1_000;
const ENTRIES: usize = 100_000;
const LIMIT_MS: f64 = 200.0;

fn phone(i: usize) -> String {
    format!("1065403522{i:05}")
}

fn view(now: i64) -> View {
    let reasons = ["breaker_open", "retries_exhausted", "sender_paused", "rate_limited"];
    let categories = ["transactional", "marketing", "authentication", "utility"];
    let mut v = View { read_at_ms: now, read_took_ms: 900, ..View::default() };
    for i in 0..SENDERS {
        let p = phone(i);
        v.scopes.insert(
            p.clone(),
            ScopeSnapshot {
                scope: Some(Scope { waba_id: "102290129340398".into(), phone_number_id: p.clone() }),
                state: if i % 10 == 0 { BreakerState::Open } else { BreakerState::Closed } as i32,
                since_unix_ms: now - 60_000,
                incident_id: format!("{p}-1"),
                failure_rate: 0.3,
                calls_in_window: 120,
                ramp_fraction: 0.5,
                pauses: vec![ScopePause {
                    level: "number".into(),
                    id: p.clone(),
                    code: 130429,
                    reason: "throughput reached".into(),
                    since_unix_ms: now - 5_000,
                    until_unix_ms: now + 55_000,
                    lift: "time".into(),
                    source: "answer".into(),
                    marketing_only: false,
                }],
                ..Default::default()
            },
        );
        v.limits.insert(
            p.clone(),
            bw_console::view::Limits { rate_per_s: 74.0, failure_threshold: 0.25, min_calls: 20, window_ms: 60_000 },
        );
        v.incidents.push(IncidentProgress {
            incident_id: format!("{p}-1"),
            phone_number_id: p.clone(),
            started_at_unix_ms: now - 30_000,
            updated_at_unix_ms: now - 1_000,
            replayed: 40,
            held_categories: vec!["marketing".into()],
            ..Default::default()
        });
    }
    for n in 0..ENTRIES {
        let p = phone(n % SENDERS);
        v.dlq.push(DlqRow {
            sequence: n as u64 + 1,
            incident_id: format!("{p}-1"),
            scope: p,
            operation_id: format!("op-{n:08}"),
            reason: reasons[n % reasons.len()],
            category: categories[(n / 7) % categories.len()],
            recipient: "+549*******234".into(),
            payload: "template order_confirmation/es_AR (1 params)".into(),
            meta_code: 131000,
            replays: 1,
            dead_lettered_at_ms: now - (ENTRIES - n) as i64,
            deadline_ms: now + 3_600_000,
        });
    }
    v.incident_stats = {
        let items: Vec<bw_ops::incident::IncidentStats> = (0..SENDERS)
            .map(|i| bw_ops::incident::IncidentStats {
                incident_id: format!("{}-1", phone(i)),
                scope: phone(i),
                depth: (ENTRIES / SENDERS) as u64,
                held: 25,
                oldest_at_unix_ms: now - 100_000,
                categories: [("marketing", 25), ("transactional", 75)].into_iter().collect(),
            })
            .collect();
        items
    };
    v.indexed()
}

fn measure(name: &str, mut render: impl FnMut() -> String) -> (String, f64, f64, usize) {
    let mut times = Vec::new();
    let mut bytes = 0;
    for _ in 0..7 {
        let t = Instant::now();
        bytes = std::hint::black_box(render()).len();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    (name.to_string(), times[3], times[6], bytes)
}

fn main() {
    let now = bw_common::time::now_ms();
    let built = Instant::now();
    let v = view(now);
    eprintln!(
        "view of {SENDERS} senders and {} DLQ entries built and indexed in {:.0} ms",
        v.dlq.len(),
        built.elapsed().as_millis()
    );
    let op = Principal { name: "bench".into(), role: Role::Operator, signed_in: true, csrf: "x".repeat(64) };
    let transitions: Vec<BreakerTransition> = (0..50)
        .map(|i| BreakerTransition {
            from: BreakerState::Closed as i32,
            to: if i % 2 == 0 { BreakerState::Open } else { BreakerState::Closed } as i32,
            at_unix_ms: now - (50 - i) * 10_000,
            reason: "failure rate 0.40 over 120 calls".into(),
            ..Default::default()
        })
        .collect();
    let entry = LedgerEntry { operation_id: "op-00000001".into(), phone_number_id: phone(1), ..Default::default() };
    let events: Vec<OutcomeEvent> =
        (0..20).map(|i| OutcomeEvent { at_unix_ms: now - i, ..Default::default() }).collect();
    let q = |sender: Option<String>, page: Option<usize>| DlqQuery { sender, page, ..DlqQuery::default() };
    let by_reason =
        DlqQuery { reason: Some("sender_paused".into()), category: Some("marketing".into()), ..DlqQuery::default() };
    let results = vec![
        measure("overview", || render_overview(&v, &op, now)),
        measure("dlq (page 1)", || render_dlq(&v, &op, &q(None, None), 50, now)),
        measure("dlq (last page)", || render_dlq(&v, &op, &q(None, Some(2_000)), 50, now)),
        measure("dlq (one sender)", || render_dlq(&v, &op, &q(Some(phone(500)), None), 50, now)),
        measure("dlq (reason + category)", || render_dlq(&v, &op, &by_reason, 50, now)),
        measure("incidents", || render_incidents(&v, &op, now)),
        measure("quarantine", || render_quarantine(&v, &op, now)),
        measure("sender", || bw_console::sender::render(&phone(500), &v, &transitions, &op, now)),
        measure("message lookup", || render_op("op-00000001", &entry, &events, &op)),
    ];
    println!("{:<26} {:>10} {:>10} {:>10}", "page", "median ms", "worst ms", "KiB");
    let mut over = Vec::new();
    for (name, median, worst, bytes) in &results {
        println!("{name:<26} {median:>10.1} {worst:>10.1} {:>10}", bytes / 1024);
        if *median > LIMIT_MS {
            over.push(name.clone());
        }
    }
    assert!(over.is_empty(), "over {LIMIT_MS} ms: {over:?}");
}
