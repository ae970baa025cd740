//! Classification of Meta Cloud API answers by error code (never by title; HTTP status only as a fallback).
//!
//! The table follows `meta-cloud-api.md` §2.3: transient errors are retried and count toward the breaker;
//! rate limits pause their own scope and never count as health failures; permanent message errors are
//! quarantined; credential and account errors pause the sender and raise an alert.

use serde::Deserialize;

/// Which limit a rate-limit error belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateScope {
    /// 130429: the phone number's throughput.
    PhoneNumber,
    /// 131056: one sender to one recipient.
    Pair,
    /// 131048: spam / quality restriction on the number; pause for minutes.
    Spam,
    /// 80007 / 80008: the WABA's budget.
    Waba,
    /// 4: the app's call budget.
    App,
}

impl RateScope {
    /// Default fleet-wide pause for this scope when Meta gives no hint, milliseconds.
    pub fn default_pause_ms(self) -> u64 {
        match self {
            RateScope::PhoneNumber => 1_000,
            RateScope::Pair => 6_000,
            RateScope::Spam => 10 * 60_000,
            RateScope::Waba => 60_000,
            RateScope::App => 60_000,
        }
    }

    /// Short label for metrics and reasons.
    pub fn label(self) -> &'static str {
        match self {
            RateScope::PhoneNumber => "throughput",
            RateScope::Pair => "pair",
            RateScope::Spam => "spam",
            RateScope::Waba => "waba",
            RateScope::App => "app",
        }
    }
}

/// What an error means for the message and the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retry with backoff; counts toward the breaker.
    Transient,
    /// Back off the given scope fleet-wide; not a health failure; does not use up retries.
    RateLimit(RateScope),
    /// Permanent for this message or recipient: quarantine, never retry.
    Permanent,
    /// Credentials or account fault: pause the sender, keep messages in the DLQ, alert.
    Credentials,
}

impl ErrorClass {
    /// Short label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::RateLimit(_) => "rate_limit",
            ErrorClass::Permanent => "permanent",
            ErrorClass::Credentials => "credentials",
        }
    }
}

/// Classifies a Meta error code.
pub fn classify_code(code: i64) -> ErrorClass {
    use ErrorClass::*;
    match code {
        1 | 2 | 131000 | 131016 | 131057 | 133004 | 2494100 => Transient,
        130429 => RateLimit(RateScope::PhoneNumber),
        131056 => RateLimit(RateScope::Pair),
        131048 => RateLimit(RateScope::Spam),
        80007 | 80008 => RateLimit(RateScope::Waba),
        4 | 17 | 32 | 613 => RateLimit(RateScope::App),
        0
        | 3
        | 10
        | 190
        | 200..=299
        | 368
        | 131005
        | 131031
        | 131042
        | 131045
        | 131063
        | 131064
        | 131037
        | 133000
        | 133010
        | 133016 => Credentials,
        _ => Permanent,
    }
}

/// Classifies an HTTP answer whose body had no parseable Meta error.
pub fn classify_http_status(status: u16) -> ErrorClass {
    match status {
        429 => ErrorClass::RateLimit(RateScope::PhoneNumber),
        401 | 403 => ErrorClass::Credentials,
        408 | 500..=599 => ErrorClass::Transient,
        _ => ErrorClass::Permanent,
    }
}

/// Meta's error object (`{"error": {...}}`).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct MetaError {
    #[serde(default)]
    pub message: String,
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub code: i64,
    #[serde(default)]
    pub error_subcode: Option<i64>,
    #[serde(default)]
    pub error_data: Option<MetaErrorData>,
    #[serde(default)]
    pub fbtrace_id: String,
}

/// `error.error_data`.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct MetaErrorData {
    #[serde(default)]
    pub details: String,
}

#[derive(Deserialize)]
struct Envelope {
    error: MetaError,
}

/// Parses a Meta error body; None when the body is not one (e.g. an HTML 502 from a proxy).
pub fn parse_error_body(body: &[u8]) -> Option<MetaError> {
    serde_json::from_slice::<Envelope>(body).ok().map(|e| e.error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorClass::*;

    #[test]
    fn code_table() {
        let check = |code, expect| assert_eq!(classify_code(code), expect, "code {code}");
        for code in [131000, 2, 1, 131016, 133004, 131057, 2494100] {
            check(code, Transient);
        }
        check(130429, RateLimit(RateScope::PhoneNumber));
        check(131056, RateLimit(RateScope::Pair));
        check(131048, RateLimit(RateScope::Spam));
        check(80007, RateLimit(RateScope::Waba));
        check(4, RateLimit(RateScope::App));
        for code in [190, 10, 200, 250, 368, 131031, 0, 131042] {
            check(code, Credentials);
        }
        for code in [100, 131008, 131009, 131026, 131047, 132000, 132001, 131049, 130472, 132015] {
            check(code, Permanent);
        }
    }

    #[test]
    fn http_fallback_and_body_parsing() {
        assert_eq!(classify_http_status(503), Transient);
        assert_eq!(classify_http_status(429), RateLimit(RateScope::PhoneNumber));
        assert_eq!(classify_http_status(401), Credentials);
        assert_eq!(classify_http_status(400), Permanent);
        let body = br#"{"error":{"message":"(#130429) Rate limit hit","type":"OAuthException","code":130429,
            "error_data":{"messaging_product":"whatsapp","details":"Cloud API message throughput has been reached."},
            "error_subcode":2494055,"fbtrace_id":"Az8or2yhqkZfEZ-_4Qn_Bam"}}"#;
        let err = parse_error_body(body).expect("meta error parses");
        assert_eq!(err.code, 130429);
        assert_eq!(err.fbtrace_id, "Az8or2yhqkZfEZ-_4Qn_Bam");
        assert!(err.error_data.expect("data").details.contains("throughput"));
        assert!(parse_error_body(b"<html>502 Bad Gateway</html>").is_none());
    }
}
