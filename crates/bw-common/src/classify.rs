//! Classification of Meta Cloud API answers by error code (never by title; HTTP status only as a fallback).
//!
//! The table follows `meta-cloud-api.md` §2.3: transient errors are retried and count toward the breaker;
//! rate limits pause their own scope and never count as health failures; permanent message errors are
//! quarantined; credential and account errors pause the sender and raise an alert.

use serde::Deserialize;

/// Which limit a rate-limit error belongs to (meta-cloud-api.md §2.3, §3, §6).
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
    /// 4 (and the generic Graph throttles 17, 32, 613): the app's call budget, across every number on the app.
    App,
    /// 131049: Meta limits marketing to this recipient; wait at least 24 h.
    Recipient,
    /// 132069: a Flow was sent 10 times in the last hour.
    Flow,
    /// 133016: register / deregister attempts of the number.
    Registration,
}

impl RateScope {
    /// Default pause for this scope when Meta gives no hint, milliseconds.
    pub fn default_pause_ms(self) -> u64 {
        match self {
            RateScope::PhoneNumber => 1_000,
            RateScope::Pair => 1_000,
            RateScope::Spam => 10 * 60_000,
            RateScope::Waba => 60_000,
            RateScope::App => 60_000,
            RateScope::Recipient => 24 * 3_600_000,
            RateScope::Flow => 3_600_000,
            RateScope::Registration => 10 * 60_000,
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
            RateScope::Recipient => "recipient",
            RateScope::Flow => "flow",
            RateScope::Registration => "registration",
        }
    }
}

/// What an error means for the message and the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Meta says "try again" and the message was not created: retry with backoff; counts toward the breaker.
    Transient,
    /// Back off the given scope fleet-wide; not a health failure; does not use up retries.
    RateLimit(RateScope),
    /// Permanent for this message or recipient: quarantine, never retry.
    Permanent,
    /// Credentials or account fault: halt the token's numbers, keep messages in the DLQ, alert.
    Credentials,
    /// A code this table does not know: a person looks at it (DLQ with reason "unclassified" and an alert);
    /// never retried blindly, never quarantined after one try.
    Unclassified,
}

impl ErrorClass {
    /// Short label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::RateLimit(_) => "rate_limit",
            ErrorClass::Permanent => "permanent",
            ErrorClass::Credentials => "credentials",
            ErrorClass::Unclassified => "unclassified",
        }
    }
}

/// Classifies a Meta error code (meta-cloud-api.md §2.3 and "More codes that matter to a sender").
pub fn classify_code(code: i64) -> ErrorClass {
    use ErrorClass::*;
    match code {
        1 | 2 | 131000 | 131016 | 131057 | 133004 | 2494100 => Transient,
        130429 => RateLimit(RateScope::PhoneNumber),
        131056 => RateLimit(RateScope::Pair),
        131048 => RateLimit(RateScope::Spam),
        131049 => RateLimit(RateScope::Recipient),
        80007 | 80008 => RateLimit(RateScope::Waba),
        4 | 17 | 32 | 613 => RateLimit(RateScope::App),
        132069 => RateLimit(RateScope::Flow),
        133016 => RateLimit(RateScope::Registration),
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
        | 133010 => Credentials,
        100 | 130403 | 130472 | 130497 | 131008 | 131009 | 131021 | 131026 | 131047 | 131050 | 131051 | 131053
        | 132000 | 132001 | 132005 | 132007 | 132012 | 132015 | 132016 | 132068 | 135000 => Permanent,
        _ => Unclassified,
    }
}

/// Classifies an HTTP error answer whose body had no parseable Meta error, for statuses that say the request
/// was refused before it was processed. 5xx and 2xx without a Meta body are not classified here: they may
/// have been accepted (meta-cloud-api.md §2.2, §5) and are unknown outcomes.
pub fn classify_http_status(status: u16) -> ErrorClass {
    match status {
        429 => ErrorClass::RateLimit(RateScope::PhoneNumber),
        401 | 403 => ErrorClass::Credentials,
        _ => ErrorClass::Unclassified,
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
        for code in [100, 131008, 131009, 131026, 131047, 132000, 132001, 130472, 132015, 131050, 130403] {
            check(code, Permanent);
        }
        check(131049, RateLimit(RateScope::Recipient));
        check(132069, RateLimit(RateScope::Flow));
        check(133016, RateLimit(RateScope::Registration));
        check(80008, RateLimit(RateScope::Waba));
        for code in [5, 999, 131999, 2494101] {
            check(code, Unclassified);
        }
    }

    #[test]
    fn http_fallback_and_body_parsing() {
        assert_eq!(classify_http_status(429), RateLimit(RateScope::PhoneNumber));
        assert_eq!(classify_http_status(401), Credentials);
        assert_eq!(classify_http_status(400), Unclassified);
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
