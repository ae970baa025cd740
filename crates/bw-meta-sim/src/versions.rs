//! Graph API versions (reference §0) and what Meta does with each.
//!
//! A version in [`VERSIONS`] whose end date has not passed is served as asked. A call to an expired version
//! (one in the table past its end date, or any `vN.M` older than the table) is **served by the oldest
//! still-usable version, not rejected** (Meta's Platform Versioning, quoted in §0): the answer is the same
//! 200 or error as for that version, with no error about the version. The simulator says which version served
//! the call in the `facebook-api-version` response header, as Graph does (a Graph header the reference does not
//! mention), and counts the call in `Counters::api_versions` under `"v20.0->v21.0"` so tests can tell.
//! A version newer than the newest in the table, or a path segment that is not `vN.M`, is not a version:
//! Graph reads it as an object id and answers "Unsupported post request" (code 100, subcode 33).
//!
//! "Today" is the system clock unless `SimConfig::api_date` pins it (tests pin it so that they do not change
//! meaning when a version expires).

/// One row of reference §0: (version, released, usable until; None = TBD).
pub const VERSIONS: &[(&str, &str, Option<&str>)] = &[
    ("v27.0", "2026-11-04", None),
    // TBD at Meta; by the lifetime rule 2028-11-04 (inference in the reference). Usable for the simulator.
    ("v26.0", "2026-07-29", None),
    ("v25.0", "2026-02-18", Some("2028-07-29")),
    ("v24.0", "2025-10-08", Some("2028-02-18")),
    ("v23.0", "2025-05-29", Some("2027-10-08")),
    ("v22.0", "2025-01-21", Some("2027-05-20")),
    ("v21.0", "2024-10-02", Some("2027-01-21")),
    ("v20.0", "2024-05-21", Some("2026-09-24")),
];

/// How a call's version is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// A usable version, served as asked.
    AsAsked(String),
    /// An expired version, served by the oldest still-usable one (the second field).
    Remapped { asked: String, served: String },
    /// Not a Graph version at all (malformed, or newer than the newest).
    Unknown,
}

/// Days since 1970-01-01 of a `YYYY-MM-DD` date; None when malformed.
pub fn days(date: &str) -> Option<i64> {
    let mut it = date.split('-');
    let (y, m, d) = (it.next()?.parse::<i64>().ok()?, it.next()?.parse::<i64>().ok()?, it.next()?.parse::<i64>().ok()?);
    if it.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Civil date to days (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// `vN.M` → (N, M).
fn parse(version: &str) -> Option<(u32, u32)> {
    let rest = version.strip_prefix('v')?;
    let (major, minor) = rest.split_once('.')?;
    let ok = |s: &str| !s.is_empty() && s.len() <= 3 && s.bytes().all(|b| b.is_ascii_digit());
    if !ok(major) || !ok(minor) {
        return None;
    }
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Whether the table row `(end)` is still usable on `today` (days since the epoch). A version is usable
/// through its end date.
fn usable(end: Option<&str>, today: i64) -> bool {
    end.and_then(days).is_none_or(|end| today <= end)
}

/// The oldest version in the table still usable on `today`.
pub fn oldest_usable(today: i64) -> &'static str {
    VERSIONS.iter().rev().find(|(_, _, end)| usable(*end, today)).map_or(VERSIONS[0].0, |(v, _, _)| v)
}

/// How a call to `version` is served on `today` (days since the epoch).
pub fn resolve(version: &str, today: i64) -> Served {
    let Some(asked) = parse(version) else {
        return Served::Unknown;
    };
    let newest = parse(VERSIONS[0].0).unwrap_or((0, 0));
    if asked > newest {
        return Served::Unknown;
    }
    match VERSIONS.iter().find(|(v, _, _)| *v == version) {
        Some((v, _, end)) if usable(*end, today) => Served::AsAsked((*v).to_string()),
        _ => Served::Remapped { asked: version.to_string(), served: oldest_usable(today).to_string() },
    }
}

/// Days since the epoch now, or of `pinned` (`YYYY-MM-DD`).
pub fn today(pinned: Option<&str>) -> i64 {
    if let Some(d) = pinned.and_then(days) {
        return d;
    }
    (crate::ids::now_ms() / 86_400_000) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_versions_resolve_as_the_reference_says() {
        assert_eq!(days("1970-01-01"), Some(0));
        assert_eq!(days("2026-12-06"), Some(20_793));
        assert_eq!(days("2026-13-01"), None);
        let today = days("2026-12-06").expect("date");
        assert_eq!(resolve("v21.0", today), Served::AsAsked("v21.0".into()), "usable to 2027-01-21");
        assert_eq!(resolve("v27.0", today), Served::AsAsked("v27.0".into()));
        assert_eq!(
            resolve("v20.0", today),
            Served::Remapped { asked: "v20.0".into(), served: "v21.0".into() },
            "expired 2026-09-24: served by the oldest usable version"
        );
        assert_eq!(resolve("v2.3", today), Served::Remapped { asked: "v2.3".into(), served: "v21.0".into() });
        assert_eq!(resolve("v28.0", today), Served::Unknown, "newer than the newest");
        assert_eq!(resolve("latest", today), Served::Unknown);
        assert_eq!(resolve("v21", today), Served::Unknown);
        let later = days("2027-01-22").expect("date");
        assert_eq!(resolve("v21.0", later), Served::Remapped { asked: "v21.0".into(), served: "v22.0".into() });
        assert_eq!(resolve("v21.0", days("2027-01-21").expect("date")), Served::AsAsked("v21.0".into()));
    }
}
