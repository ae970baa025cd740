//! How times and runbook links are written in notifications.
//!
//! Times are shown twice: in UTC and in the configured display zone, as `DD/MM/YYYY HH:MM:SS` (24 h) with the
//! zone written out, e.g. `01/12/2026 14:03:05 America/Argentina/Buenos_Aires (UTC-03:00)`.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;

/// Parses an IANA zone name.
pub fn parse_zone(name: &str) -> Result<Tz, String> {
    name.parse::<Tz>()
        .map_err(|_| format!("unknown time zone `{name}` (use an IANA name such as America/Argentina/Buenos_Aires)"))
}

fn instant(unix_ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(unix_ms).single().unwrap_or_default()
}

/// `01/12/2026 17:03:05 UTC`.
pub fn format_utc(unix_ms: i64) -> String {
    format!("{} UTC", instant(unix_ms).format("%d/%m/%Y %H:%M:%S"))
}

/// `01/12/2026 14:03:05 America/Argentina/Buenos_Aires (UTC-03:00)`.
pub fn format_local(unix_ms: i64, zone: Tz) -> String {
    let local = instant(unix_ms).with_timezone(&zone);
    format!("{} {} (UTC{})", local.format("%d/%m/%Y %H:%M:%S"), zone.name(), local.format("%:z"))
}

/// RFC 3339 in UTC with milliseconds (PagerDuty `timestamp`).
pub(crate) fn rfc3339(unix_ms: i64) -> String {
    instant(unix_ms).to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Link to a runbook file (`meta-down.md`) under the configured base, or `deploy/runbooks/` when empty.
pub(crate) fn runbook_url(base: &str, file: &str) -> String {
    let base = if base.is_empty() { "deploy/runbooks" } else { base.trim_end_matches('/') };
    format!("{base}/{file}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(unix_ms: i64, zone: &str, expect_local: &str, expect_utc: &str) {
        let tz = parse_zone(zone).expect("valid zone");
        assert_eq!(format_local(unix_ms, tz), expect_local);
        assert_eq!(format_utc(unix_ms), expect_utc);
    }

    #[test]
    fn formats_utc_and_display_zone() {
        // 2026-12-01T17:03:05Z
        let t = 1_796_144_585_000;
        assert_eq!(rfc3339(t), "2026-12-01T17:03:05.000Z");
        check(
            t,
            "America/Argentina/Buenos_Aires",
            "01/12/2026 14:03:05 America/Argentina/Buenos_Aires (UTC-03:00)",
            "01/12/2026 17:03:05 UTC",
        );
        check(t, "UTC", "01/12/2026 17:03:05 UTC (UTC+00:00)", "01/12/2026 17:03:05 UTC");
        // Crosses midnight and uses a positive, non-whole-hour offset.
        check(t, "Asia/Kolkata", "01/12/2026 22:33:05 Asia/Kolkata (UTC+05:30)", "01/12/2026 17:03:05 UTC");
        check(
            t + 7 * 3_600_000,
            "Asia/Kolkata",
            "02/12/2026 05:33:05 Asia/Kolkata (UTC+05:30)",
            "02/12/2026 00:03:05 UTC",
        );
    }

    #[test]
    fn rejects_unknown_zones_and_builds_runbook_links() {
        assert!(parse_zone("Mars/Olympus").is_err());
        assert_eq!(runbook_url("", "meta-down.md"), "deploy/runbooks/meta-down.md");
        assert_eq!(runbook_url("https://wiki.example/rb/", "meta-down.md"), "https://wiki.example/rb/meta-down.md");
    }
}
