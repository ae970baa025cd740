//! Wall-clock helpers and the one way times are written for people. Breaker and rate decisions never use
//! these: they use Redis server time.
//!
//! Notifications and reports show a time twice: in UTC and in a display zone, as `DD/MM/YYYY HH:MM:SS`
//! (24 h) with the zone written out, e.g. `01/12/2026 14:03:05 America/Argentina/Buenos_Aires (UTC-03:00)`.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
pub use chrono_tz::Tz;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

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

/// RFC 3339 in UTC with milliseconds: `2026-12-01T17:03:05.000Z`.
pub fn rfc3339_ms(unix_ms: i64) -> String {
    instant(unix_ms).to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// RFC 3339 in UTC to the second: `2026-12-01T17:03:05Z`.
pub fn rfc3339(unix_ms: i64) -> String {
    instant(unix_ms).to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `2026-12-01 17:03:05Z`, the short UTC form of tables.
pub fn utc_short(unix_ms: i64) -> String {
    instant(unix_ms).format("%Y-%m-%d %H:%M:%SZ").to_string()
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
        assert_eq!(rfc3339_ms(t), "2026-12-01T17:03:05.000Z");
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
        assert!(parse_zone("Mars/Olympus").is_err());
    }

    #[test]
    fn short_and_rfc3339_forms_match_the_civil_calendar() {
        assert_eq!(utc_short(1_700_000_000_000), "2023-11-14 22:13:20Z");
        assert_eq!(utc_short(951_782_400_000), "2000-02-29 00:00:00Z");
        // Sub-second parts are cut, not rounded; before 1970 counts down.
        assert_eq!(rfc3339(1_700_000_000_999), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    }
}
