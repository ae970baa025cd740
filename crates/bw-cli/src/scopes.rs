//! `bwctl scopes`: every scope's breaker state (BW_SCOPES), then every pause that holds one, then each business
//! portfolio's messaging-limit budget (`budget.rs`, from the breaker's Redis), then the numbers' stated throughput
//! and the templates paced while RED (`limits.rs`).

use crate::fmt;
use bw_common::nats::Buckets;
use bw_common::time::now_ms;
use bw_ops::ops;
use std::io::Write;

/// `bwctl scopes`.
pub(crate) async fn scopes(buckets: &Buckets, redis_url: &str, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let now = now_ms();
    let snapshots = ops::scope_snapshots(buckets).await?;
    let limit_scopes: Vec<bw_breaker::Scope> = snapshots
        .iter()
        .filter_map(|(phone, s)| s.scope.as_ref().map(|x| bw_breaker::Scope::new(x.waba_id.clone(), phone.clone())))
        .collect();
    let pauses: Vec<Vec<String>> =
        snapshots.iter().flat_map(|(phone, s)| s.pauses.iter().map(move |p| pause_row(phone, p))).collect();
    let rows: Vec<Vec<String>> = snapshots
        .into_iter()
        .map(|(phone, s)| {
            let held: Vec<String> = s
                .pauses
                .iter()
                .map(|p| if p.code == 0 { p.level.clone() } else { format!("{}:{}", p.level, p.code) })
                .collect();
            let state = format!("{:?}", s.state()).to_ascii_uppercase();
            let paused = if s.paused_until_unix_ms > now { fmt::utc(s.paused_until_unix_ms) } else { "-".into() };
            vec![
                phone,
                s.scope.map(|x| x.waba_id).unwrap_or_default(),
                state,
                fmt::utc(s.since_unix_ms),
                if s.since_unix_ms > 0 { fmt::age(now - s.since_unix_ms) } else { "-".into() },
                format!("{:.3}", s.failure_rate),
                s.calls_in_window.to_string(),
                format!("{:.2}", if s.ramp_fraction > 0.0 { s.ramp_fraction } else { 1.0 }),
                if s.incident_id.is_empty() { "-".into() } else { s.incident_id },
                paused,
                if held.is_empty() { "-".into() } else { held.join(",") },
            ]
        })
        .collect();
    let header =
        ["SCOPE", "WABA", "STATE", "SINCE", "FOR", "FAIL-RATE", "CALLS", "RAMP", "INCIDENT", "PAUSED-UNTIL", "PAUSES"];
    write!(out, "{}", fmt::table(&header, &rows))?;
    if !pauses.is_empty() {
        writeln!(out)?;
        let header = ["SCOPE", "LEVEL", "ID", "CODE", "SINCE", "UNTIL", "LIFT", "SOURCE", "REASON"];
        write!(out, "{}", fmt::table(&header, &pauses))?;
    }
    crate::budget::show(redis_url, out).await?;
    crate::limits::show_all(redis_url, &limit_scopes, out).await?;
    Ok(0)
}

/// One row of the pause table of `bwctl scopes`.
fn pause_row(phone: &str, p: &bw_proto::v1::ScopePause) -> Vec<String> {
    vec![
        phone.to_string(),
        p.level.clone(),
        p.id.clone(),
        if p.code == 0 { "-".into() } else { p.code.to_string() },
        fmt::utc(p.since_unix_ms),
        if p.until_unix_ms > 0 { fmt::utc(p.until_unix_ms) } else { "until lifted".into() },
        p.lift.clone() + if p.marketing_only { " (marketing only)" } else { "" },
        p.source.clone(),
        p.reason.clone(),
    ]
}
