//! The drill's last phase: what held a run that did not settle, the accounting check, the simulator's oracle,
//! the log scan, then the report built ([`crate::report`]) and written ([`crate::render`]).

use crate::drive::Drive;
use crate::model::{DrillReport, Header, LogScan, MarkKind};
use crate::observe::Live;
use crate::options::{DrillOptions, say};
use crate::setup::{ACCESS_TOKEN, APP_SECRET, OPERATOR_TOKEN, Plan, RAMP_MS, REDIS_PASSWORD, Stack};
use crate::{errors, render, report, stuck};
use bw_common::time::{format_utc, rfc3339};
use std::time::Duration;

/// Collects the evidence, stops the services and the simulator, and builds and writes the report.
pub(crate) async fn finish(plan: &Plan, mut stack: Stack, mut drive: Drive, live: Live) -> anyhow::Result<DrillReport> {
    let (opts, scenario, owners) = (&plan.opts, &plan.scenario, &plan.owners);
    let Live { js, buckets, observed, started, watchers, .. } = live;
    let (js, buckets) = (&js, &buckets);
    // A run that did not settle says what held it, read while the services still run.
    let mut unsettled = if drive.settled {
        Vec::new()
    } else {
        let states = observed.lock().await.states.clone();
        stuck::diagnose(js, &buckets.scopes, &stack.redis_cfg, &stack.senders, &states).await
    };
    let produced = drive.producer.await?;
    let accounting = bw_ops::account::account_expected(js, buckets, &produced.accepted).await?;
    let entries = bw_ops::account::ledger_entries(js, buckets).await?;
    if !drive.settled {
        unsettled.extend(stuck::waiting_entries(&entries));
    }
    let oracle = stack.sim.oracle();
    let sim_counters = stack.sim.counters();
    let counters = serde_json::to_value(&sim_counters)?;
    stack.services.stop_all(Duration::from_secs(10));
    let log_scan = scan_logs(&stack.dir.join("logs"));
    for w in watchers {
        w.abort();
    }
    // The watcher tasks may still hold their handles for a moment after abort: take the data, not the Arc.
    let observed = std::mem::take(&mut *observed.lock().await);
    let duration_s = started.elapsed().as_secs_f64();
    let recovery_marks = drive.marks.iter().filter(|m| m.kind == MarkKind::Recovery).count();
    if recovery_marks == 0 && scenario.windows.is_empty() {
        say(opts, "scenario has no fault windows: no outage or recovery marks");
    }
    let header = Header {
        environment: environment(opts),
        version: version(),
        started_utc: format!("{} ({})", format_utc(stack.wall_start), rfc3339(stack.wall_start)),
        started_unix_ms: stack.wall_start,
        load: format!(
            "{} messages over {} senders at {:.0} msg/s (Meta allows {:.0} msg/s per sender; Breakwater runs each at {:.1}){}",
            opts.messages,
            opts.senders,
            opts.rate,
            opts.meta_mps,
            stack.sender_rate,
            opts.chaos_seed.map(|s| format!("; chaos seed {s}")).unwrap_or_default()
        ),
        duration_s,
        scenario: scenario_text(scenario, opts.scenario.as_deref()),
        expected: format!(
            "all {} accepted; 0 lost; 0 unflagged duplicates; 0 self-inflicted rate-limit answers",
            opts.messages
        ),
        observed: String::new(),
        settled: drive.settled,
    };
    drive.marks.sort_by(|a, b| a.t.total_cmp(&b.t));
    let report = report::build(report::Inputs {
        opts,
        produced: &produced,
        accounting: &accounting,
        entries: &entries,
        oracle: &oracle,
        observed: &observed,
        drained_at: drive.drained_at,
        max_dlq: drive.max_dlq,
        unsettled,
        sender_rate: stack.sender_rate,
        ramp_ms: RAMP_MS,
        ramp_start: bw_breaker::ScopeLimits::default().ramp_start,
        counters: &counters,
        webhooks: sim_counters.webhooks.clone(),
        scenario,
        samples: &drive.samples,
        marks: drive.marks,
        chaos: drive.chaos_log,
        log_scan,
        header,
        sender_waba: &stack.sender_waba,
        lifts: &drive.lifts,
        owners,
        zone: opts.zone.clone(),
    });
    render::write(&stack.dir, &report, &drive.samples, &observed)?;
    let _ = stack.sim.dump(&stack.dir.join("meta-sim-oracle.json"));
    stack.sim.shutdown().await;
    Ok(report)
}

fn scenario_text(scenario: &bw_meta_sim::Scenario, given: Option<&str>) -> String {
    let windows: Vec<String> = scenario
        .windows
        .iter()
        .map(|w| {
            let codes: Vec<String> = w.faults.iter().filter_map(|f| errors::fault_key(&f.kind)).collect();
            format!(
                "{} {:.1}-{} s at {:.0}% [{}]",
                if w.name.is_empty() { "window" } else { &w.name },
                w.start_ms as f64 / 1000.0,
                w.duration_ms
                    .map(|d| format!("{:.1}", (w.start_ms + d) as f64 / 1000.0))
                    .unwrap_or_else(|| "end".into()),
                w.error_rate * 100.0,
                codes.join(", ")
            )
        })
        .collect();
    format!(
        "{} ({}): {}",
        if scenario.name.is_empty() { "unnamed" } else { &scenario.name },
        given.unwrap_or("built-in, from --outage-start/--outage-length"),
        if windows.is_empty() { "no fault windows".to_string() } else { windows.join("; ") }
    )
}

fn command_line(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program).args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn environment(opts: &DrillOptions) -> String {
    let nats_bin = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".into());
    let nats = command_line(&nats_bin, &["--version"]).unwrap_or_else(|| "nats-server (version unknown)".into());
    let redis = command_line("redis-server", &["--version"])
        .and_then(|v| v.split_whitespace().find(|w| w.starts_with("v=")).map(|w| format!("redis-server {}", &w[2..])))
        .unwrap_or_else(|| "redis-server (version unknown)".into());
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!(
        "local stack, {} {} with {cpus} CPUs; {nats}; {redis}; {} dispatchers, {} replay workers, {} ingest, 1 coordinator, 1 alerting (each its own process); Meta simulator in the drill process",
        std::env::consts::OS,
        std::env::consts::ARCH,
        opts.dispatchers,
        opts.replays,
        opts.ingests.max(1)
    )
}

fn version() -> String {
    // The working directory's repository, else the one this binary was built from.
    command_line("git", &["describe", "--always", "--dirty", "--tags"])
        .or_else(|| {
            command_line("git", &["-C", env!("CARGO_MANIFEST_DIR"), "describe", "--always", "--dirty", "--tags"])
        })
        .map(|d| format!("{d} (bw-drill {})", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| format!("bw-drill {} (git describe unavailable)", env!("CARGO_PKG_VERSION")))
}

/// Scans every service log for a full recipient number of the drill (`549115` followed by digits), the
/// access token, the app secret and the Redis password.
fn scan_logs(dir: &std::path::Path) -> Option<LogScan> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut scan = LogScan::default();
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
        scan.files += 1;
        scan.bytes += text.len() as u64;
        scan.findings += [ACCESS_TOKEN, APP_SECRET, REDIS_PASSWORD, OPERATOR_TOKEN]
            .iter()
            .map(|s| text.matches(s).count())
            .sum::<usize>();
        scan.findings += text
            .match_indices("549115")
            .filter(|(i, _)| text[i + 6..].chars().take(7).filter(char::is_ascii_digit).count() == 7)
            .count();
    }
    Some(scan)
}
