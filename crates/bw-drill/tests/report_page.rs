//! The report page renders in headless Chromium with every section and without horizontal overflow, at a
//! desktop and a narrow width, with long content (summaries, many codes, chaos marks).

mod common;

use bw_drill::chart::{self, Sample};
use bw_drill::errors::{CodeCount, ErrorSplit, SplitSource};
use bw_drill::model::{AlertRow, DrillReport, Header, Mark, MarkKind, SenderRow};
use bw_drill::validation;

fn report() -> DrillReport {
    let mut r = DrillReport {
        requested: 20_000,
        accepted: 20_000,
        sent: 19_990,
        read: 10,
        senders: 4,
        sender_rate: 72.0,
        meta_mps: 80.0,
        meta_requests: 25_000,
        oracle_accepted: 20_000,
        peak_sent_per_s: 290.0,
        breaker_trips: 4,
        time_to_trip_s: Some(0.7),
        time_to_close_s: Some(5.4),
        replay_drain_s: Some(21.1),
        zone: "America/Argentina/Buenos_Aires".into(),
        ..Default::default()
    };
    r.errors = ErrorSplit {
        codes: ["130429", "131056", "2", "http_503", "reset", "131000", "80007", "4"]
            .iter()
            .map(|k| CodeCount {
                key: k.to_string(),
                total: 123_456,
                injected: 123_000,
                self_inflicted: 0,
                rate_limit: ["130429", "131056", "80007", "4"].contains(k),
            })
            .collect(),
        source: SplitSource::Scenario,
    };
    r.per_sender = (0..4)
        .map(|i| SenderRow {
            sender: format!("10654035224290{i}"),
            accepted_by_meta: 5_000,
            sent: 5_000,
            dlq_moves: 1_234,
            rate_limited: 12,
            error_answers: 40,
            trips: 1,
            final_breaker: "Closed".into(),
        })
        .collect();
    r.journey.categories = ["authentication", "transactional", "support", "marketing"]
        .iter()
        .map(|c| bw_drill::journey::CategoryRow {
            category: c.to_string(),
            messages: 20_000,
            accepted_by_meta: 19_990,
            expired: 10,
            quarantined: 3,
            delay_p50_s: Some(61.8),
            delay_p99_s: Some(170.5),
            dead_lettered: 6_324,
            dead_lettered_delay_p50_s: Some(62.0),
            dead_lettered_delay_p99_s: Some(169.8),
            last_dead_lettered_after_recovery_s: Some(68.7),
            order_violations: 1_234,
        })
        .collect();
    let t0 = 1_796_120_236_674;
    r.alerts = (0..4)
        .map(|i| AlertRow {
            dedup_key: format!("breaker_open.10654035224290{i}"),
            rule: "breaker_open".into(),
            severity: "warning".into(),
            scope: format!("102290129340398/10654035224290{i}"),
            summary: format!(
                "breaker OPEN for sender 102290129340398/10654035224290{i}: failure rate 0.051 over 138 calls \
                 (failure rate 5% over 138 calls); sends go to the DLQ — averyveryverylongwordwithoutanybreaks{}",
                "x".repeat(120)
            ),
            started_at_unix_ms: t0 + i * 1000,
            resolved_at_unix_ms: if i == 3 { 0 } else { t0 + 9_000 },
        })
        .collect();
    r.header = Header {
        environment: "local stack, linux x86_64 with 2 CPUs; nats-server: v2.15.1; redis-server 7.0.15".into(),
        version: "v0.1.0-42-gdeadbee-dirty (bw-drill 0.0.0)".into(),
        started_utc: "01/12/2026 10:17:12 UTC (2026-12-01T10:17:12Z)".into(),
        load: "20000 messages over 4 senders at 300 msg/s".into(),
        duration_s: 120.0,
        scenario: format!("custom ({}): outage 3.0-8.0 s at 28% [2, 130429]", "/a/very/long/path/".repeat(12)),
        expected: "all accepted; 0 lost".into(),
        observed: "all accepted; 0 lost".into(),
        ..Default::default()
    };
    r.marks = vec![
        Mark { t: 15.0, label: "outage starts (28% errors)".into(), kind: MarkKind::Outage },
        Mark { t: 35.0, label: "outage ends: Meta recovers".into(), kind: MarkKind::Recovery },
        Mark { t: 20.0, label: "kill -9 dispatcher-1".into(), kind: MarkKind::Chaos },
        Mark { t: 27.0, label: "restart nats-server".into(), kind: MarkKind::Chaos },
    ];
    r.chaos = vec![(20.0, "kill -9 dispatcher-1".into()), (27.0, "restart nats-server".into())];
    let owners = validation::parse_owners(validation::DEFAULT_OWNERS).expect("owners");
    r.validation = validation::rows(&r, &owners);
    r
}

#[test]
fn report_page_renders_every_section_without_horizontal_overflow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = report();
    let samples: Vec<Sample> = (0..=120)
        .map(|i| Sample {
            t: f64::from(i),
            sent_per_s: 200.0 + f64::from(i % 7) * 10.0,
            error_rate: if (15..35).contains(&i) { 0.28 } else { 0.0 },
            errors_per_s: if (15..35).contains(&i) { 60.0 } else { 0.0 },
            scopes_open: u32::from((16..40).contains(&i)) * 4,
            scopes_half_open: 0,
            dlq_depth: if i > 15 { 6_000u64.saturating_sub(u64::from(i as u32) * 40) } else { 0 },
        })
        .collect();
    let svg = chart::render(&samples, &r.marks, "Breakwater drill");
    let page = dir.path().join("report.html");
    std::fs::write(&page, bw_drill::html::page(&r, &svg)).expect("write page");
    for width in [1280, 800] {
        let shot = dir.path().join(format!("report-{width}.png"));
        let dom = common::render(&page, width, &shot);
        common::assert_readable(&dom, width);
        // The alert times in UTC and in the display zone, DD/MM/YYYY 24 h, zone written out.
        assert!(dom.contains("01/12/2026 10:17:16 UTC"), "UTC time at {width}px");
        assert!(dom.contains("01/12/2026 07:17:16 America/Argentina/Buenos_Aires (UTC-03:00)"), "local time");
        assert!(dom.contains("still firing"));
        assert!(dom.contains("<tr id=\"v-logs\">") && dom.contains("<tr id=\"v-quotas\">"));
    }
}
