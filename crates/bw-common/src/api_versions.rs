//! Graph API versions and how long each stays usable (meta-cloud-api.md §0).
//!
//! Meta does not refuse a call to an expired version: it serves it with the oldest still-usable version, so
//! behaviour changes with no error. A deployment therefore has to know the end date of the version it pins, warn
//! well before it, and refuse to start on a version that has already ended unless an operator says otherwise.

use chrono::NaiveDate;

/// Meta's versions table, newest first: (version, released, usable until). Meta lists the end of v26.0 and
/// v27.0 as "TBD"; the table uses the earliest end the lifetime rule allows (2 years after the next version's
/// release, or 2 years after its own release for the newest), the safe reading: a warning that comes early.
const TABLE: [(&str, &str, &str); 8] = [
    ("v27.0", "2026-11-04", "2028-11-04"),
    ("v26.0", "2026-07-29", "2028-11-04"),
    ("v25.0", "2026-02-18", "2028-07-29"),
    ("v24.0", "2025-10-08", "2028-02-18"),
    ("v23.0", "2025-05-29", "2027-10-08"),
    ("v22.0", "2025-01-21", "2027-05-20"),
    ("v21.0", "2024-10-02", "2027-01-21"),
    ("v20.0", "2024-05-21", "2026-09-24"),
];

/// The version the services pin by default: usable to 2028-07-29 and the one Meta's examples use (§0).
pub const DEFAULT: &str = "v25.0";

/// Warn this many days before the pinned version ends (§0: "alert 90 days before the pinned version expires").
pub const WARN_DAYS: i64 = 90;

/// What the table says about a configured version on a given day.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionStatus {
    /// Usable for `days_left` more days (the end day itself counts as usable, as Meta's "usable until").
    Usable { days_left: i64, until: NaiveDate },
    /// Ended `days_ago` days ago: Meta serves calls to it with an older behaviour.
    Expired { days_ago: i64, until: NaiveDate },
    /// Well formed (`vNN.0`) but not in the table: newer than this build knows, or older than v20.0.
    Unknown,
    /// Not a Graph version string at all (Meta answers such a path with error 100).
    Malformed,
}

/// The status of `version` on `today`.
pub fn status(version: &str, today: NaiveDate) -> VersionStatus {
    if !well_formed(version) {
        return VersionStatus::Malformed;
    }
    let Some(until) = end_of(version) else {
        return VersionStatus::Unknown;
    };
    let days = (until - today).num_days();
    if days >= 0 {
        VersionStatus::Usable { days_left: days, until }
    } else {
        VersionStatus::Expired { days_ago: -days, until }
    }
}

/// The last usable day of `version`, when the table knows it.
pub fn end_of(version: &str) -> Option<NaiveDate> {
    TABLE.iter().find(|(v, _, _)| *v == version).map(|(_, _, until)| date(until))
}

/// Today's date in UTC.
pub fn today() -> NaiveDate {
    chrono::Utc::now().date_naive()
}

/// What a service does with its configured version at start-up: `Err` refuses to start (a message for the
/// operator), `Ok(Some(_))` starts with a warning, `Ok(None)` starts quietly.
pub fn check(version: &str, today: NaiveDate, allow_expired: bool) -> Result<Option<String>, String> {
    match status(version, today) {
        VersionStatus::Malformed => {
            Err(format!("meta.api_version {version:?} is not a Graph API version such as {DEFAULT:?}"))
        }
        VersionStatus::Unknown => Ok(Some(format!(
            "meta.api_version {version} is not in this build's versions table: its end date is unknown; \
             the default is {DEFAULT}"
        ))),
        VersionStatus::Expired { until, .. } if !allow_expired => Err(format!(
            "meta.api_version {version} stopped being usable on {until}: Meta silently serves an older \
             behaviour; pin {DEFAULT} or newer (or set meta.allow_expired_api_version = true to run anyway)"
        )),
        VersionStatus::Expired { until, .. } => Ok(Some(format!(
            "meta.api_version {version} stopped being usable on {until}; running because \
             meta.allow_expired_api_version = true"
        ))),
        VersionStatus::Usable { days_left, until } if days_left < WARN_DAYS => Ok(Some(format!(
            "meta.api_version {version} stops being usable on {until}, in {days_left} days: move to {DEFAULT} or newer"
        ))),
        VersionStatus::Usable { .. } => Ok(None),
    }
}

/// Days the version stays usable, negative once it has ended; `None` when the table does not know it. This is
/// the `bw_meta_api_version_days_left` gauge.
pub fn days_left(version: &str, today: NaiveDate) -> Option<i64> {
    end_of(version).map(|until| (until - today).num_days())
}

fn well_formed(version: &str) -> bool {
    let Some(rest) = version.strip_prefix('v') else { return false };
    let Some((major, minor)) = rest.split_once('.') else { return false };
    !major.is_empty() && major.len() <= 3 && major.bytes().all(|b| b.is_ascii_digit()) && minor == "0"
}

fn date(text: &str) -> NaiveDate {
    // The table is constant and checked by the tests below.
    NaiveDate::parse_from_str(text, "%Y-%m-%d").unwrap_or(NaiveDate::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(text: &str) -> NaiveDate {
        NaiveDate::parse_from_str(text, "%Y-%m-%d").expect("date")
    }

    #[test]
    fn the_table_parses_and_is_newest_first_with_ends_after_releases() {
        for pair in TABLE.windows(2) {
            assert!(date(pair[0].1) > date(pair[1].1), "{} after {}", pair[0].0, pair[1].0);
        }
        for (v, released, until) in TABLE {
            assert!(date(released) > NaiveDate::MIN && date(until) > date(released), "{v}");
        }
    }

    #[test]
    fn the_default_is_known_and_far_from_its_end_today() {
        let VersionStatus::Usable { days_left, .. } = status(DEFAULT, day("2026-12-06")) else {
            panic!("default usable")
        };
        assert!(days_left > 365, "{days_left}");
        assert_eq!(check(DEFAULT, day("2026-12-06"), false), Ok(None));
    }

    #[test]
    fn statuses_follow_the_reference_dates() {
        assert_eq!(
            status("v21.0", day("2027-01-21")),
            VersionStatus::Usable { days_left: 0, until: day("2027-01-21") }
        );
        assert_eq!(
            status("v21.0", day("2027-01-22")),
            VersionStatus::Expired { days_ago: 1, until: day("2027-01-21") }
        );
        assert_eq!(
            status("v20.0", day("2026-12-06")),
            VersionStatus::Expired { days_ago: 73, until: day("2026-09-24") }
        );
        assert_eq!(status("v99.0", day("2026-12-06")), VersionStatus::Unknown);
        for bad in ["21.0", "v21", "v21.1", "vx.0", "", "v.0", "v21.0/../x"] {
            assert_eq!(status(bad, day("2026-12-06")), VersionStatus::Malformed, "{bad:?}");
        }
        assert_eq!(days_left("v21.0", day("2026-12-06")), Some(46));
        assert_eq!(days_left("v99.0", day("2026-12-06")), None);
    }

    #[test]
    fn start_up_refuses_an_ended_version_warns_near_the_end_and_allows_an_override() {
        let today = day("2026-12-06");
        let refused = check("v20.0", today, false).expect_err("ended");
        assert!(refused.contains("2026-09-24") && refused.contains("allow_expired_api_version"), "{refused}");
        assert!(check("v20.0", today, true).expect("allowed").is_some_and(|w| w.contains("2026-09-24")));
        let warned = check("v21.0", today, false).expect("usable").expect("a warning within 90 days");
        assert!(warned.contains("46 days") && warned.contains(DEFAULT), "{warned}");
        assert_eq!(check("v22.0", today, false), Ok(None), "v22.0 ends 2027-05-20, 165 days away");
        assert!(check("v99.0", today, false).expect("starts").is_some());
        assert!(check("latest", today, false).is_err());
    }
}
