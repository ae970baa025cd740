//! Small drills in CI against the real binaries (`cargo build --bins` first): real nats-server and
//! redis-server, every service as its own process, the simulator in the drill process.
//!
//! One test runs them one after the other (two drills at once on a small machine would measure the machine):
//! first a drill with a scenario file (a short outage injecting 503 and 130429), which must lose nothing and
//! send nothing twice unflagged, split its rate-limit answers into injected and self-inflicted, give the
//! verdict those figures call for, and write every report section, readable in headless Chromium; then the same load with `--chaos SEED` (kill -9 a dispatcher and a
//! replay worker, restart nats-server and redis-server), which must still lose nothing and send nothing twice
//! unflagged, with each chaos event on the timeline.

mod common;

use serde_json::Value;
use std::path::Path;
use std::process::Command;

const SCENARIO: &str = r#"
name = "ci-short-outage"
seed = 7
selection = "random"

[[windows]]
name = "outage"
start_ms = 3000
duration_ms = 5000
error_rate = 0.5
latency = { kind = "normal", mean_ms = 60.0, stddev_ms = 20.0 }
faults = [
  { kind = "http", status = 503, meta_body = true, weight = 1 },
  { kind = "error", code = 130429, weight = 1 },
]
"#;

fn drill(dir: &Path, extra: &[&str]) -> (i32, Value, String) {
    let out = Command::new(common::drill_bin())
        .args(["--messages", "2500", "--rate", "200", "--senders", "4", "--dispatchers", "2", "--replays", "2"])
        .args(["--settle-timeout", "180", "--dir"])
        .arg(dir)
        .args(extra)
        .env("BW_BIN_DIR", bw_drill::stack::bin_dir())
        .current_dir(common::repo_root())
        .output()
        .expect("run bw-drill");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = std::fs::read_to_string(dir.join("report.json"))
        .unwrap_or_else(|e| panic!("no report.json ({e}); stdout tail:\n{}\nstderr:\n{stderr}", tail(&stdout)));
    let json: Value = serde_json::from_str(&text).expect("report.json is JSON");
    (out.status.code().unwrap_or(-1), json, stdout)
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn n(v: &Value, path: &str) -> u64 {
    path.split('.').fold(v, |v, k| &v[k]).as_u64().unwrap_or_else(|| panic!("{path} is not a number: {v}"))
}

fn assert_nothing_lost(r: &Value, out: &str) {
    assert_eq!(n(r, "accepted") + n(r, "rejected") + n(r, "unanswered"), 2500, "{}", tail(out));
    assert!(n(r, "accepted") > 0);
    assert_eq!(n(r, "lost"), 0, "lost: {}", tail(out));
    assert_eq!(n(r, "in_two_places"), 0);
    assert_eq!(n(r, "duplicates.unflagged"), 0, "unflagged duplicates: {}", tail(out));
    // Every accepted operation ended in a place the accounting knows.
    let placed = ["sent", "delivered", "read", "failed", "in_dlq", "quarantined", "expired", "unknown", "queued"]
        .iter()
        .map(|k| n(r, k))
        .sum::<u64>();
    assert_eq!(placed, n(r, "accepted"), "{}", tail(out));
    // The per-category figures cover every accepted operation, and only what Meta accepted has a delay.
    let categories = r["journey"]["categories"].as_array().expect("journey categories");
    let sum = |k: &str| categories.iter().map(|c| c[k].as_u64().expect("count")).sum::<u64>();
    assert_eq!(sum("messages"), n(r, "accepted"), "{}", tail(out));
    assert!(sum("accepted_by_meta") <= sum("messages"));
    assert!(categories.iter().any(|c| c["category"] == "authentication" && c["delay_p99_s"].is_number()));
}

fn assert_report_files(dir: &Path, r: &Value) {
    let html = std::fs::read_to_string(dir.join("report.html")).expect("report.html");
    for id in ["header", "summary", "timeline", "errors", "categories", "senders", "alerts", "validation"] {
        assert!(html.contains(&format!("<section id=\"{id}\"")), "section {id}");
    }
    assert!(!html.contains("<link") && !html.contains("src=\"http"), "self-contained page");
    let md = std::fs::read_to_string(dir.join("validation.md")).expect("validation.md");
    let rows = r["validation"].as_array().expect("validation rows");
    let keys: Vec<&str> = rows.iter().filter_map(|v| v["row"].as_str()).collect();
    assert_eq!(
        keys,
        [
            "quotas",
            "windows",
            "bursts",
            "headers",
            "limiters",
            "queues",
            "retries",
            "order",
            "recovery",
            "dedup",
            "cache",
            "webhooks",
            "alerts",
            "logs",
            "waba_scope",
            "waba_rate",
            "waba_held",
            "noise",
            "budget_reserve",
            "budget_order"
        ]
    );
    // This outage restricts no WABA, is no sub-threshold noise and announces no tier: those rows are pending and
    // PASS ignores them.
    let scenario_row = |k: &str| k.starts_with("waba_") || k.starts_with("budget_") || k == "noise";
    for row in rows.iter().filter(|v| v["row"].as_str().is_some_and(scenario_row)) {
        assert_eq!((row["status"].as_str(), row["required"].as_bool()), (Some("pending"), Some(false)), "{row}");
    }
    for row in rows {
        let status = row["status"].as_str().expect("status");
        assert!(["passed", "failed", "pending"].contains(&status));
        assert!(md.contains(&format!("| {} |", row["row"].as_str().expect("row"))));
        assert!(!row["owner"].as_str().expect("owner").is_empty());
    }
    // Rows the drill cannot measure are pending, never passed.
    for key in ["headers", "cache"] {
        assert_eq!(rows.iter().find(|v| v["row"] == key).map(|v| v["status"].clone()), Some("pending".into()));
    }
    for h in ["environment", "version", "started_utc", "load", "expected", "observed"] {
        assert!(!r["header"][h].as_str().unwrap_or_default().is_empty(), "header {h}");
    }
    assert!(md.contains("- Version: ") && md.contains("- Date and time (UTC): "));
    // The timeline is in the JSON too.
    assert!(r["timeline"]["samples"].as_array().is_some_and(|s| s.len() >= 5));
    // No full recipient number or secret anywhere in the report.
    let json = r.to_string();
    assert!(!json.contains("drill-access-token") && !json.contains("drill-app-secret"));
    assert!(!html.contains("+549115"));
}

/// Every error code's answers are split exactly into injected and self-inflicted.
fn assert_split(r: &Value) {
    let codes = r["errors"].as_array().expect("errors by code");
    for c in codes {
        assert_eq!(n(c, "injected") + n(c, "self_inflicted"), n(c, "total"), "{c}");
    }
    let rate_limit = |f: &str| codes.iter().filter(|c| c["rate_limit"] == true).map(|c| n(c, f)).sum::<u64>();
    assert_eq!(rate_limit("injected"), n(r, "rate_limit.injected"));
    assert_eq!(rate_limit("self_inflicted"), n(r, "rate_limit.self_inflicted"));
}

/// PASS (and exit status 0) exactly when 0 lost, 0 unflagged duplicates and 0 self-inflicted rate-limit
/// answers. Self-inflicted answers are reported, not assumed away: on a starved machine admitted sends can
/// reach Meta bunched up (see the final report of the obs branch), and the verdict must then say FAIL.
fn assert_verdict(r: &Value, code: i32) {
    let pass = n(r, "lost") == 0 && n(r, "duplicates.unflagged") == 0 && n(r, "rate_limit.self_inflicted") == 0;
    assert_eq!(r["passed"], pass, "verdict follows the three figures");
    assert_eq!(code, if pass { 0 } else { 1 }, "exit status follows the verdict");
    if !pass {
        eprintln!("note: {} self-inflicted rate-limit answers in this run", n(r, "rate_limit.self_inflicted"));
    }
}

fn marks(r: &Value, kind: &str) -> usize {
    r["timeline"]["marks"].as_array().map_or(0, |m| m.iter().filter(|m| m["kind"] == kind).count())
}

#[test]
fn small_drills_without_and_with_chaos_lose_nothing_and_report_every_section() {
    let work = tempfile::tempdir().expect("tempdir");
    let scenario = work.path().join("ci-short-outage.toml");
    std::fs::write(&scenario, SCENARIO).expect("write scenario");

    // 1. The scenario file, no chaos: a plain PASS.
    let dir = work.path().join("plain");
    let scenario_arg = scenario.to_str().expect("utf-8 path");
    let (code, r, out) = drill(&dir, &["--scenario", scenario_arg]);
    assert_nothing_lost(&r, &out);
    assert_split(&r);
    assert!(n(&r, "rate_limit.injected") > 0, "the scenario injects 130429: {}", tail(&out));
    assert!(r["errors"].as_array().is_some_and(|e| e.iter().any(|c| c["code"] == "2" && n(c, "injected") > 0)));
    assert_verdict(&r, code);
    assert!(r["header"]["scenario"].as_str().is_some_and(|s| s.contains("ci-short-outage")));
    assert_eq!((marks(&r, "outage"), marks(&r, "recovery"), marks(&r, "chaos")), (1, 1, 0));
    assert!(n(&r, "breaker_trips") > 0, "the outage trips breakers: {}", tail(&out));
    let alerts = r["alerts"].as_array().expect("alerts");
    assert!(alerts.iter().any(|a| a["rule"] == "breaker_open"), "breaker_open alerts seen");
    for a in alerts.iter().filter(|a| a["rule"] == "breaker_open") {
        let fired = a["fired"]["local"].as_str().expect("fired local");
        assert!(fired.ends_with("America/Argentina/Buenos_Aires (UTC-03:00)"), "{fired}");
        assert!(a["resolved"]["utc"].as_str().is_some_and(|s| s.ends_with(" UTC")), "resolved by itself: {a}");
    }
    assert_report_files(&dir, &r);
    for row in ["queues", "dedup", "retries", "alerts", "logs"] {
        let v = r["validation"].as_array().and_then(|v| v.iter().find(|v| v["row"] == row).cloned());
        assert_eq!(
            v.as_ref().map(|v| v["status"].clone()),
            Some("passed".into()),
            "{row}: {v:?}\nwhat held the run: {:#}\n{}",
            r["unsettled"],
            tail(&out)
        );
    }
    for width in [1280, 800] {
        let dom = common::render(&dir.join("report.html"), width, &dir.join(format!("report-{width}.png")));
        common::assert_readable(&dom, width);
    }

    // 2. The built-in flash-sale outage with chaos: nothing lost, nothing sent twice unflagged.
    let dir = work.path().join("chaos");
    let (code, r, out) = drill(&dir, &["--outage-start", "3", "--outage-length", "5", "--chaos", "11"]);
    assert_nothing_lost(&r, &out);
    assert_split(&r);
    assert_verdict(&r, code);
    let chaos: Vec<String> =
        r["chaos"].as_array().expect("chaos").iter().filter_map(|c| c["event"].as_str().map(String::from)).collect();
    for event in ["kill -9 dispatcher-", "kill -9 replay-", "restart nats-server", "restart redis-server"] {
        assert!(chaos.iter().any(|c| c.starts_with(event)), "{event} missing from {chaos:?}");
    }
    assert_eq!(chaos.iter().filter(|c| c.starts_with("start ")).count(), 2, "both killed processes restarted");
    assert_eq!(marks(&r, "chaos"), 4, "each chaos event on the timeline");
    assert_report_files(&dir, &r);
    // The schedule is the seed's: the same seed gives the same events in the same order.
    let planned: Vec<String> = bw_drill::chaos::schedule(11, 2500.0 / 200.0 * 0.15, 2500.0 / 200.0 * 0.85, 2, 2)
        .iter()
        .map(|e| e.kind.label())
        .collect();
    let happened: Vec<String> = chaos.iter().filter(|c| !c.starts_with("start ")).cloned().collect();
    assert_eq!(happened, planned);
}

#[test]
fn bad_arguments_are_precise_errors_before_anything_starts() {
    let work = tempfile::tempdir().expect("tempdir");
    let bad_scenario = work.path().join("bad.toml");
    std::fs::write(&bad_scenario, "name = \"x\"\n[[windows]]\nstart_ms = 0\nerror_rate = 2.0\n").expect("write");
    let owners = work.path().join("owners.toml");
    std::fs::write(&owners, "[owners]\nquota = \"me\"\n").expect("write");
    let dir = work.path().join("drill");
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    for (args, expect) in [
        (vec!["--scenario".to_string(), path(&bad_scenario)], "scenario `"),
        (vec!["--scenario".to_string(), path(&work.path().join("missing.toml"))], "missing.toml"),
        (vec!["--owners".to_string(), path(&owners)], "unknown row `quota`"),
        (vec!["--zone".to_string(), "Mars/Olympus".to_string()], "Mars/Olympus"),
    ] {
        let out = Command::new(common::drill_bin()).args(&args).arg("--dir").arg(&dir).output().expect("run bw-drill");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!dir.exists(), "nothing started for {args:?}");
    }
}
