//! Classification of Meta Cloud API answers: one table, one pure function. [`classify`] turns (code, subcode,
//! HTTP status, sync or async) into a [`Classification`]: the class (what happens to the message), the scope
//! the answer is about (what to pause), whether and when a retry may help, the pause when Meta gives no hint,
//! and whether the messages it hits belong in the quarantine.
//!
//! The table is `meta-cloud-api.md` §2.3 "Pause scope by error code", one arm per row there; the table test
//! below has one row per code of it. Meta says to branch on the code (§2.1): the HTTP status decides only when
//! no Meta error body came (a proxy's page, §2.2), and the subcode only for code 0, the one code whose meaning
//! depends on it. Where the reference is uncertain the arm takes the safe reading and says so.
//!
//! Classes: transient errors are retried and count toward the health breaker; rate limits feed their scope's
//! limiter and never count as health failures; holds pause their scope (token, app, WABA or phone number, and
//! only it) until a known end, a probe, or a person lifts them; permanent errors are never retried for this
//! message; unclassified codes are never retried blindly and go to a person.

use serde::Deserialize;

/// How the answer arrived (§2.1): the HTTP response of `POST /messages`, or a `failed` status webhook after
/// Meta accepted the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    Sync,
    Async,
}

/// Which limit a rate-limit error belongs to (§2.3, §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
}

impl RateScope {
    /// Default pause for this scope when Meta gives no hint, milliseconds.
    pub fn default_pause_ms(self) -> u64 {
        match self {
            RateScope::PhoneNumber => 1_000,
            RateScope::Pair => 1_000,
            RateScope::Spam => 10 * MINUTE_MS,
            RateScope::Waba => MINUTE_MS,
            RateScope::App => MINUTE_MS,
            RateScope::Recipient => 24 * HOUR_MS,
            RateScope::Flow => HOUR_MS,
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
        }
    }

    /// The scope of the limit.
    pub fn scope(self) -> PauseScope {
        match self {
            RateScope::PhoneNumber | RateScope::Spam => PauseScope::PhoneNumber,
            RateScope::Pair => PauseScope::Pair,
            RateScope::Waba => PauseScope::Waba,
            RateScope::App => PauseScope::App,
            RateScope::Recipient => PauseScope::Recipient,
            RateScope::Flow => PauseScope::Flow,
        }
    }
}

/// What an answer means for the message and the sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Meta says "try again" and the message was not created: retry with backoff; counts toward the breaker.
    Transient,
    /// Back off the given scope fleet-wide; not a health failure; does not use up retries.
    RateLimit(RateScope),
    /// An account, permission or configuration fault of the [`Classification::scope`] (token, app, WABA or phone
    /// number): pause that scope, and only it, until its end, a probe, or a person lifts it; the message waits.
    /// Never a health failure.
    Hold,
    /// Permanent for this message (or its recipient, template or Flow): never retried.
    Permanent,
    /// A code this table does not know: a person looks at it; never retried blindly, never a health failure.
    Unclassified,
}

impl ErrorClass {
    /// Short label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::RateLimit(_) => "rate_limit",
            ErrorClass::Hold => "hold",
            ErrorClass::Permanent => "permanent",
            ErrorClass::Unclassified => "unclassified",
        }
    }
}

/// What an answer is about: the scope to pause (§2.3 "Scope").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PauseScope {
    /// The access token: every number sending with it.
    Token,
    /// The app: every WABA on it.
    App,
    /// One WhatsApp Business Account: every number of it.
    Waba,
    /// One business phone number.
    PhoneNumber,
    /// One number to one recipient.
    Pair,
    /// One recipient (of any sender of the tenant).
    Recipient,
    /// One template (name + language).
    Template,
    /// One Flow.
    Flow,
    /// This message only.
    Message,
    /// Meta itself: the health breaker of the number that saw it.
    Global,
}

impl PauseScope {
    /// Short label for metrics, logs and `bwctl`.
    pub fn label(self) -> &'static str {
        match self {
            PauseScope::Token => "token",
            PauseScope::App => "app",
            PauseScope::Waba => "waba",
            PauseScope::PhoneNumber => "number",
            PauseScope::Pair => "pair",
            PauseScope::Recipient => "recipient",
            PauseScope::Template => "template",
            PauseScope::Flow => "flow",
            PauseScope::Message => "message",
            PauseScope::Global => "global",
        }
    }

    /// The scopes a hold pauses in Redis (one key each, `bw-breaker`), widest first.
    pub const HELD: [PauseScope; 4] = [PauseScope::Token, PauseScope::App, PauseScope::Waba, PauseScope::PhoneNumber];

    /// Parses [`PauseScope::label`] back.
    pub fn from_label(label: &str) -> Option<PauseScope> {
        [
            PauseScope::Token,
            PauseScope::App,
            PauseScope::Waba,
            PauseScope::PhoneNumber,
            PauseScope::Pair,
            PauseScope::Recipient,
            PauseScope::Template,
            PauseScope::Flow,
            PauseScope::Message,
            PauseScope::Global,
        ]
        .into_iter()
        .find(|s| s.label() == label)
    }
}

/// Which messages of the scope the answer concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Only {
    /// Every message of the scope.
    All,
    /// Marketing messages only (recipient × marketing, WABA × marketing).
    Marketing,
    /// Messages to the recipient's country only (WABA × country, 130497).
    Country,
}

/// Whether sending the message again can succeed (§2.3 "Retry").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retry {
    /// Never: the same message gets the same answer.
    No,
    /// Yes, with backoff (transient).
    Yes,
    /// Only after a wait (the scope's pause), or once the cause is fixed.
    Later,
    /// The message may already have been accepted (5xx or 2xx without Meta's body): never resent blindly.
    Ambiguous,
}

/// How long the scope is paused when Meta's answer carries no hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pause {
    /// Nothing is paused.
    None,
    /// For this many milliseconds.
    For(u64),
    /// For this many milliseconds, then one send probes: another such answer pauses again, twice as long (up to
    /// [`PROBE_PAUSE_MAX_MS`]); anything else lets the scope go on.
    Probe(u64),
    /// Until lifted: by a person (`bwctl pause lift`), a new access token (token scope) or Meta's webhook saying
    /// so. The key behind it expires after a week, which makes the next send a probe.
    UntilLifted,
}

/// What an answer means: the result of [`classify`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Classification {
    pub class: ErrorClass,
    pub scope: PauseScope,
    pub only: Only,
    pub retry: Retry,
    /// The pause of `scope` when Meta's answer carries no hint ([`Classification::pause_ms`]).
    pub pause: Pause,
    /// The messages it hits belong in the quarantine (held by scope, released by an operator or a webhook):
    /// unclassified codes and template codes.
    pub quarantine: bool,
}

impl Classification {
    const fn row(class: ErrorClass, scope: PauseScope, retry: Retry, pause: Pause) -> Classification {
        Classification { class, scope, only: Only::All, retry, pause, quarantine: false }
    }

    const fn only(self, only: Only) -> Classification {
        Classification { only, ..self }
    }

    const fn quarantined(self) -> Classification {
        Classification { quarantine: true, ..self }
    }

    /// The pause length in ms for this answer: Meta's hint (Retry-After, `estimated_time_to_regain_access`) when
    /// present and not zero, else the default. None when nothing is paused or the pause lasts until lifted.
    pub fn pause_ms(&self, hint_ms: Option<u64>) -> Option<u64> {
        match self.pause {
            Pause::None | Pause::UntilLifted => None,
            Pause::For(ms) | Pause::Probe(ms) => Some(hint_ms.filter(|h| *h > 0).unwrap_or(ms)),
        }
    }

    /// The scope a hold or a rate limit pauses in Redis (token, app, WABA or phone number), if any.
    pub fn paused_scope(&self) -> Option<PauseScope> {
        let pauses = match self.class {
            ErrorClass::Hold => true,
            ErrorClass::Transient => self.pause != Pause::None,
            _ => false,
        };
        (pauses && PauseScope::HELD.contains(&self.scope)).then_some(self.scope)
    }

    /// An authentication or permission refusal (the `credentials` signal and alert): a token hold, or a refusal
    /// of the token that only probes (a bodiless 401/403, code 0 without an auth subcode).
    pub fn credentials(&self) -> bool {
        self.class == ErrorClass::Hold
            && (self.scope == PauseScope::Token || matches!(self.pause, Pause::Probe(ms) if ms == AUTH_PROBE_MS))
    }
}

const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 3_600_000;

/// First pause of a number refused by an authentication answer that may not be about the token (a bodiless
/// 401/403 from a proxy, code 0 without an auth subcode): brief, then a probe.
pub const AUTH_PROBE_MS: u64 = 30_000;
/// Longest pause of a probing scope after repeated refusals (each doubles the last).
pub const PROBE_PAUSE_MAX_MS: u64 = 10 * MINUTE_MS;

/// Graph API authentication subcodes (Graph "Handling Errors": 458 app not installed, 459 user checkpointed,
/// 460 password changed, 463 expired, 464 unconfirmed user, 467 invalid token, 492 invalid session). Code 0 halts
/// the token only with one of these: Meta's code 0 is a catch-all AuthException, and the subcode is deprecated
/// (§2.1), so without it the safe reading pauses the one number and probes rather than stopping every number.
pub const AUTH_SUBCODES: [i64; 7] = [458, 459, 460, 463, 464, 467, 492];

/// Classifies one answer of Meta (or of something in front of it). `code` is the Meta error code, None when no
/// Meta error body came; `http_status` is 0 for an asynchronous failure.
pub fn classify(code: Option<i64>, subcode: Option<i64>, http_status: u16, channel: Channel) -> Classification {
    use ErrorClass::*;
    use PauseScope as S;
    use Retry::*;
    let row = Classification::row;
    let Some(code) = code else {
        return without_body(http_status, channel);
    };
    match code {
        // ---- Token and app ----
        // "0 | AuthException: token expired/invalidated, or user blocked all apps | TOKEN": only with an auth
        // subcode (AUTH_SUBCODES); else the number pauses briefly and probes.
        0 if subcode.is_some_and(|s| AUTH_SUBCODES.contains(&s)) => row(Hold, S::Token, No, Pause::UntilLifted),
        0 => row(Hold, S::PhoneNumber, Later, Pause::Probe(AUTH_PROBE_MS)),
        // "190 | Access token expired | TOKEN"; "3 | Capability or permission issue | TOKEN"; "10 | Permission
        // not granted/removed"; "200–299 | Permission not granted/removed"; "131005 | Permission (Cloud API)".
        190 | 3 | 10 | 200..=299 | 131005 => row(Hold, S::Token, No, Pause::UntilLifted),
        // "4 | App reached its API call rate limit | APP"; "17, 32, 613 | Generic Graph throttles | TOKEN/APP": the
        // app (one app per token here, so the narrower of the two).
        4 | 17 | 32 | 613 => rate(RateScope::App),
        // ---- WABA and portfolio ----
        // "80007 | WABA reached its rate limit | WABA"; "80008 | Business Management API BUC limit | WABA". The
        // hint `estimated_time_to_regain_access` sets the pause when present; without one, a minute (whether
        // 80007 on /messages is a 24 h quota is unconfirmed: each repeat answer pauses again, at the WABA only).
        80007 | 80008 => rate(RateScope::Waba),
        // "368 | WABA restricted or disabled for a policy violation | WABA"; "131031 | WABA restricted/disabled
        // | WABA": a hard stop of that WABA's numbers until Meta lifts it (`account_update`) or a person does.
        368 | 131031 => row(Hold, S::Waba, No, Pause::UntilLifted),
        // "130497 | WABA may not message users in that country | WABA × country": nothing pauses a country
        // here, so the message alone fails (the narrowest reading; every other country keeps flowing).
        130497 => row(Permanent, S::Waba, No, Pause::None).only(Only::Country),
        // "131042 | Payment method problem | WABA": every message is billable (§7), so the whole WABA holds.
        131042 => row(Hold, S::Waba, No, Pause::UntilLifted),
        // "131063 | Marketing template while marketing is disabled on Cloud API | WABA × marketing": utility and
        // authentication keep flowing.
        131063 => row(Hold, S::Waba, No, Pause::UntilLifted).only(Only::Marketing),
        // "131064 | Messaging limit for template-classification violations; lifted after the enforcement period
        // | WABA": time-boxed, probed hourly unless a hint or an `account_update` expiration says when.
        131064 => row(Hold, S::Waba, Later, Pause::Probe(HOUR_MS)),
        // ---- Business phone number ----
        // "33 | Business phone number deleted | NUMBER"; "131045 | Registration error | NUMBER"; "133010 | Not
        // registered | NUMBER"; "133000 | Previous deregistration failed | NUMBER"; "131037 | 555 number without
        // an approved display name | NUMBER": until the number is fixed.
        33 | 131045 | 133010 | 133000 | 131037 => row(Hold, S::PhoneNumber, No, Pause::UntilLifted),
        // "133015 | Number recently deleted; deletion not complete | Later (5 min) | NUMBER".
        133015 => row(Hold, S::PhoneNumber, Later, Pause::For(5 * MINUTE_MS)),
        // "133016 | Register/deregister attempt limit | Later | NUMBER": no end is given; 10 min, then a probe.
        133016 => row(Hold, S::PhoneNumber, Later, Pause::Probe(10 * MINUTE_MS)),
        // "130429 | Cloud API message throughput reached | NUMBER (limiter)".
        130429 => rate(RateScope::PhoneNumber),
        // "131048 | Spam rate limit | NUMBER (limiter)": minutes at least.
        131048 => rate(RateScope::Spam),
        // "131057 | Business account in maintenance mode | Yes (~1 min) | NUMBER"; "2494100 | Account in
        // maintenance mode | Yes (minutes) | NUMBER": transient (they count toward the breaker, §8), and the
        // number pauses ~60 s so its other messages do not meet the same answer meanwhile.
        131057 | 2494100 => row(Transient, S::PhoneNumber, Yes, Pause::For(MINUTE_MS)),
        // ---- Pair, template and Flow ----
        // "131056 | Too many messages from this number to the same recipient | PAIR (limiter)".
        131056 => rate(RateScope::Pair),
        // "132000 | Variable count does not match"; "132012 | Parameter format"; "132018 | Parameter validation":
        // TEMPLATE (mapping): the producer's mapping, per message.
        132000 | 132012 | 132018 => row(Permanent, S::Template, No, Pause::None),
        // "132001 | Template missing in that language, or not approved"; "132007 | Template content violates a
        // policy"; "132016 | Paused too often, now disabled": quarantine the template (§8 lists 132007 with
        // them; the issue names three, the reference four: the safe reading holds all four).
        132001 | 132007 | 132016 => row(Permanent, S::Template, No, Pause::None).quarantined(),
        // "132015 | Template paused for low quality | Later | TEMPLATE": auto-unpause after 3 h (6 h the 2nd time).
        132015 => row(Permanent, S::Template, Later, Pause::For(3 * HOUR_MS)).quarantined(),
        // "132068 | Flow is blocked | FLOW".
        132068 => row(Permanent, S::Flow, No, Pause::None),
        // "132069 | Flow throttled: 10 messages in the last hour | FLOW (limiter)".
        132069 => rate(RateScope::Flow),
        // ---- Recipient and message ----
        // "131026 | Undeliverable | RECIPIENT"; "131047 | Re-engagement: > 24 h since the user replied | RECIPIENT
        // (window)"; "130403 | Business has blocked this user | RECIPIENT".
        131026 | 131047 | 130403 => row(Permanent, S::Recipient, No, Pause::None),
        // "131049 | Per-user marketing limit | Later (≥ 24 h) | RECIPIENT × marketing".
        131049 => rate(RateScope::Recipient).only(Only::Marketing),
        // "131050 | User stopped marketing messages | RECIPIENT × marketing"; "130472 | User in Meta's marketing
        // experiment | RECIPIENT × marketing".
        131050 | 130472 => row(Permanent, S::Recipient, No, Pause::None).only(Only::Marketing),
        // "131021 | Sender and recipient are the same"; "131062 | BSUID recipient not supported"; "100 | Invalid
        // parameter"; "131008 | Required parameter missing"; "131009 | Parameter value invalid (MSG; NUMBER if the
        // phone number ID is wrong)": the message (a wrong number ID fails every message of the number one by one,
        // which is loud but pauses nothing healthy); "131051 | Unsupported message type"; "131053 | Media upload
        // failed"; "132005 | Hydrated text too long"; "135000 | Unknown error with request parameters".
        131021 | 131062 | 100 | 131008 | 131009 | 131051 | 131053 | 132005 | 135000 => {
            row(Permanent, S::Message, No, Pause::None)
        }
        // "131052 | Could not download media the user sent | inbound webhook": never an answer to a send; if one
        // says so, the message alone failed.
        131052 => row(Permanent, S::Message, No, Pause::None),
        // ---- Transient (health breaker) ----
        // "1 | API Unknown"; "2 | API Service: downtime or overload"; "131000 | Unknown error (try again)";
        // "131016 | Service temporarily unavailable"; "133004 | Server temporarily unavailable".
        1 | 2 | 131000 | 131016 | 133004 => row(Transient, S::Global, Yes, Pause::None),
        // A code the table does not know: nothing wider than the message pauses (its scope is unknown, and a
        // number pause would let one payload's odd answer stop a healthy number's traffic); the quarantine holds
        // its messages by code until a person looks, so one code cannot loop.
        _ => row(Unclassified, S::Message, No, Pause::None).quarantined(),
    }
}

/// "— | Timeout, reset, 5xx without body | Ambiguous | GLOBAL", and the refusals of something in front of Meta.
fn without_body(http_status: u16, channel: Channel) -> Classification {
    use PauseScope as S;
    let row = Classification::row;
    match (channel, http_status) {
        // A failed status without a code: Meta did not say why; a person looks.
        (Channel::Async, _) => row(ErrorClass::Unclassified, S::Message, Retry::No, Pause::None).quarantined(),
        // Throttled by something in front of Meta: the number's limiter.
        (Channel::Sync, 429) => rate(RateScope::PhoneNumber),
        // A bodiless 401/403 comes from a proxy or gateway as often as from Meta: it proves nothing about the
        // token, so it pauses the one number briefly and probes; it never halts the token.
        (Channel::Sync, 401 | 403) => row(ErrorClass::Hold, S::PhoneNumber, Retry::Later, Pause::Probe(AUTH_PROBE_MS)),
        // May have been accepted: never resent blindly (§2.2, §5).
        (Channel::Sync, s) if s >= 500 || (200..300).contains(&s) => {
            row(ErrorClass::Transient, S::Global, Retry::Ambiguous, Pause::None)
        }
        // Any other refusal without Meta's body: a person looks.
        (Channel::Sync, _) => row(ErrorClass::Unclassified, S::Message, Retry::No, Pause::None).quarantined(),
    }
}

fn rate(scope: RateScope) -> Classification {
    let retry = match scope {
        RateScope::PhoneNumber | RateScope::Pair => Retry::Yes,
        _ => Retry::Later,
    };
    Classification::row(ErrorClass::RateLimit(scope), scope.scope(), retry, Pause::For(scope.default_pause_ms()))
}

/// The class of a synchronous answer with Meta error `code` (no subcode): [`classify`]'s class.
pub fn classify_code(code: i64) -> ErrorClass {
    classify(Some(code), None, 0, Channel::Sync).class
}

/// Meta's error object (`{"error": {...}}`).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct MetaError {
    #[serde(default)]
    pub message: String,
    #[serde(default, rename = "type")]
    pub kind: String,
    /// None when the body has no code (then it is not read as one: a missing code must not read as code 0).
    #[serde(default)]
    pub code: Option<i64>,
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

/// Parses a Meta error body; None when the body is not one (e.g. an HTML 502 from a proxy, or an `error` object
/// without a code).
pub fn parse_error_body(body: &[u8]) -> Option<MetaError> {
    serde_json::from_slice::<Envelope>(body).ok().map(|e| e.error).filter(|e| e.code.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Channel::{Async, Sync};
    use ErrorClass::*;
    use PauseScope as S;

    const H: u64 = 3_600_000;
    const M: u64 = 60_000;

    /// A row: code, the channel it arrives on, then what it must mean (the last column: quarantine).
    type Row = (i64, Channel, ErrorClass, PauseScope, Only, Retry, Pause, bool);

    /// One row per code of meta-cloud-api.md §2.3, in its order and under its headings.
    #[rustfmt::skip]
    const TABLE: &[Row] = &[
        // Token and app
        (190,     Sync,  Hold,                            S::Token,       Only::All,       Retry::No,    Pause::UntilLifted, false),
        (3,       Sync,  Hold,                            S::Token,       Only::All,       Retry::No,    Pause::UntilLifted, false),
        (10,      Sync,  Hold,                            S::Token,       Only::All,       Retry::No,    Pause::UntilLifted, false),
        (200,     Sync,  Hold,                            S::Token,       Only::All,       Retry::No,    Pause::UntilLifted, false),
        (250,     Sync,  Hold,                            S::Token,       Only::All,       Retry::No,    Pause::UntilLifted, false),
        (299,     Sync,  Hold,                            S::Token,       Only::All,       Retry::No,    Pause::UntilLifted, false),
        (131005,  Sync,  Hold,                            S::Token,       Only::All,       Retry::No,    Pause::UntilLifted, false),
        (4,       Sync,  RateLimit(RateScope::App),       S::App,         Only::All,       Retry::Later, Pause::For(M),      false),
        (17,      Sync,  RateLimit(RateScope::App),       S::App,         Only::All,       Retry::Later, Pause::For(M),      false),
        (32,      Sync,  RateLimit(RateScope::App),       S::App,         Only::All,       Retry::Later, Pause::For(M),      false),
        (613,     Sync,  RateLimit(RateScope::App),       S::App,         Only::All,       Retry::Later, Pause::For(M),      false),
        // WABA and portfolio
        (80007,   Sync,  RateLimit(RateScope::Waba),      S::Waba,        Only::All,       Retry::Later, Pause::For(M),      false),
        (80008,   Sync,  RateLimit(RateScope::Waba),      S::Waba,        Only::All,       Retry::Later, Pause::For(M),      false),
        (368,     Sync,  Hold,                            S::Waba,        Only::All,       Retry::No,    Pause::UntilLifted, false),
        (131031,  Sync,  Hold,                            S::Waba,        Only::All,       Retry::No,    Pause::UntilLifted, false),
        (130497,  Sync,  Permanent,                       S::Waba,        Only::Country,   Retry::No,    Pause::None,        false),
        (131042,  Sync,  Hold,                            S::Waba,        Only::All,       Retry::No,    Pause::UntilLifted, false),
        (131063,  Sync,  Hold,                            S::Waba,        Only::Marketing, Retry::No,    Pause::UntilLifted, false),
        (131064,  Sync,  Hold,                            S::Waba,        Only::All,       Retry::Later, Pause::Probe(H),    false),
        // Business phone number
        (33,      Sync,  Hold,                            S::PhoneNumber, Only::All,       Retry::No,    Pause::UntilLifted, false),
        (131045,  Sync,  Hold,                            S::PhoneNumber, Only::All,       Retry::No,    Pause::UntilLifted, false),
        (133010,  Sync,  Hold,                            S::PhoneNumber, Only::All,       Retry::No,    Pause::UntilLifted, false),
        (133000,  Sync,  Hold,                            S::PhoneNumber, Only::All,       Retry::No,    Pause::UntilLifted, false),
        (133015,  Sync,  Hold,                            S::PhoneNumber, Only::All,       Retry::Later, Pause::For(5 * M),  false),
        (133016,  Sync,  Hold,                            S::PhoneNumber, Only::All,       Retry::Later, Pause::Probe(10 * M), false),
        (131037,  Sync,  Hold,                            S::PhoneNumber, Only::All,       Retry::No,    Pause::UntilLifted, false),
        (130429,  Sync,  RateLimit(RateScope::PhoneNumber), S::PhoneNumber, Only::All,     Retry::Yes,   Pause::For(1_000),  false),
        (131048,  Sync,  RateLimit(RateScope::Spam),      S::PhoneNumber, Only::All,       Retry::Later, Pause::For(10 * M), false),
        (131057,  Sync,  Transient,                       S::PhoneNumber, Only::All,       Retry::Yes,   Pause::For(M),      false),
        (2494100, Sync,  Transient,                       S::PhoneNumber, Only::All,       Retry::Yes,   Pause::For(M),      false),
        // Pair, template and Flow
        (131056,  Sync,  RateLimit(RateScope::Pair),      S::Pair,        Only::All,       Retry::Yes,   Pause::For(1_000),  false),
        (132000,  Sync,  Permanent,                       S::Template,    Only::All,       Retry::No,    Pause::None,        false),
        (132001,  Sync,  Permanent,                       S::Template,    Only::All,       Retry::No,    Pause::None,        true),
        (132005,  Sync,  Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        (132007,  Sync,  Permanent,                       S::Template,    Only::All,       Retry::No,    Pause::None,        true),
        (132012,  Sync,  Permanent,                       S::Template,    Only::All,       Retry::No,    Pause::None,        false),
        (132015,  Async, Permanent,                       S::Template,    Only::All,       Retry::Later, Pause::For(3 * H),  true),
        (132016,  Sync,  Permanent,                       S::Template,    Only::All,       Retry::No,    Pause::None,        true),
        (132018,  Sync,  Permanent,                       S::Template,    Only::All,       Retry::No,    Pause::None,        false),
        (132068,  Sync,  Permanent,                       S::Flow,        Only::All,       Retry::No,    Pause::None,        false),
        (132069,  Sync,  RateLimit(RateScope::Flow),      S::Flow,        Only::All,       Retry::Later, Pause::For(H),      false),
        // Recipient and message
        (131026,  Async, Permanent,                       S::Recipient,   Only::All,       Retry::No,    Pause::None,        false),
        (131047,  Async, Permanent,                       S::Recipient,   Only::All,       Retry::No,    Pause::None,        false),
        (131049,  Async, RateLimit(RateScope::Recipient), S::Recipient,   Only::Marketing, Retry::Later, Pause::For(24 * H), false),
        (131050,  Async, Permanent,                       S::Recipient,   Only::Marketing, Retry::No,    Pause::None,        false),
        (130472,  Async, Permanent,                       S::Recipient,   Only::Marketing, Retry::No,    Pause::None,        false),
        (130403,  Sync,  Permanent,                       S::Recipient,   Only::All,       Retry::No,    Pause::None,        false),
        (131021,  Sync,  Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        (131062,  Sync,  Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        (100,     Sync,  Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        (131008,  Sync,  Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        (131009,  Sync,  Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        (131051,  Sync,  Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        (131053,  Async, Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        (135000,  Sync,  Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        (131052,  Async, Permanent,                       S::Message,     Only::All,       Retry::No,    Pause::None,        false),
        // Transient (health breaker)
        (1,       Sync,  Transient,                       S::Global,      Only::All,       Retry::Yes,   Pause::None,        false),
        (2,       Sync,  Transient,                       S::Global,      Only::All,       Retry::Yes,   Pause::None,        false),
        (131000,  Async, Transient,                       S::Global,      Only::All,       Retry::Yes,   Pause::None,        false),
        (131016,  Sync,  Transient,                       S::Global,      Only::All,       Retry::Yes,   Pause::None,        false),
        (133004,  Sync,  Transient,                       S::Global,      Only::All,       Retry::Yes,   Pause::None,        false),
        // Codes no row names: nothing wider than the message pauses, and a person looks (quarantine).
        (5,       Sync,  Unclassified,                    S::Message,     Only::All,       Retry::No,    Pause::None,        true),
        (131999,  Async, Unclassified,                    S::Message,     Only::All,       Retry::No,    Pause::None,        true),
        (2494101, Sync,  Unclassified,                    S::Message,     Only::All,       Retry::No,    Pause::None,        true),
    ];

    #[test]
    fn one_row_per_code_of_the_reference_table() {
        for &(code, channel, class, scope, only, retry, pause, quarantine) in TABLE {
            let expected = Classification { class, scope, only, retry, pause, quarantine };
            assert_eq!(classify(Some(code), None, 400, channel), expected, "code {code} ({channel:?})");
            // Meta says not to branch on the HTTP status (§2.2): with a code, the status never matters.
            for status in [0, 200, 401, 403, 429, 500, 503] {
                assert_eq!(classify(Some(code), None, status, channel), expected, "code {code} with HTTP {status}");
            }
            assert_eq!(classify_code(code), class, "classify_code({code})");
        }
        let codes: std::collections::HashSet<i64> = TABLE.iter().map(|r| r.0).collect();
        assert_eq!(codes.len(), TABLE.len(), "one row per code");
    }

    /// Every code of the reference's §2.3 table (the "Code" column, ranges by their ends) has a row above and is
    /// classified (not left unclassified).
    #[test]
    fn the_table_covers_every_code_of_the_reference() {
        let reference = [
            0, 190, 3, 10, 200, 299, 131005, 4, 17, 32, 613, 80007, 80008, 368, 131031, 130497, 131042, 131063, 131064,
            33, 131045, 133010, 133000, 133015, 133016, 131037, 130429, 131048, 131057, 2494100, 131056, 132000,
            132001, 132005, 132007, 132012, 132015, 132016, 132018, 132068, 132069, 131026, 131047, 131049, 131050,
            130472, 130403, 131021, 131062, 100, 131008, 131009, 131051, 131053, 135000, 131052, 1, 2, 131000, 131016,
            133004,
        ];
        for code in reference {
            assert_ne!(classify_code(code), Unclassified, "code {code} is in the reference table");
            assert!(code == 0 || TABLE.iter().any(|r| r.0 == code), "code {code} has no row in the table test");
        }
    }

    #[test]
    fn code_0_halts_the_token_only_with_an_auth_subcode() {
        for sub in AUTH_SUBCODES {
            let c = classify(Some(0), Some(sub), 401, Sync);
            assert_eq!((c.class, c.scope, c.pause), (Hold, S::Token, Pause::UntilLifted), "subcode {sub}");
            assert!(c.credentials());
        }
        for sub in [None, Some(2494055), Some(33)] {
            let c = classify(Some(0), sub, 401, Sync);
            assert_eq!((c.class, c.scope, c.pause), (Hold, S::PhoneNumber, Pause::Probe(AUTH_PROBE_MS)), "{sub:?}");
            assert!(c.credentials(), "still an authentication refusal to alert on");
        }
    }

    #[test]
    fn answers_without_a_meta_body() {
        let c = |status, channel| classify(None, None, status, channel);
        // A bodiless 401/403 pauses the number briefly and probes; it never halts the token.
        for status in [401, 403] {
            let got = c(status, Sync);
            assert_eq!((got.class, got.scope, got.pause), (Hold, S::PhoneNumber, Pause::Probe(AUTH_PROBE_MS)));
            assert_eq!(got.paused_scope(), Some(S::PhoneNumber));
        }
        assert_eq!(c(429, Sync).class, RateLimit(RateScope::PhoneNumber));
        for status in [500, 502, 503, 504, 200] {
            assert_eq!((c(status, Sync).class, c(status, Sync).retry), (Transient, Retry::Ambiguous), "{status}");
        }
        for status in [400, 404, 405, 409] {
            let got = c(status, Sync);
            assert_eq!((got.class, got.scope, got.quarantine), (Unclassified, S::Message, true), "{status}");
        }
        assert_eq!(c(0, Async).class, Unclassified, "a failed status without a code");
    }

    #[test]
    fn hints_set_the_pause_length_when_present() {
        let waba = classify(Some(80007), None, 429, Sync);
        assert_eq!(waba.pause_ms(None), Some(60_000));
        assert_eq!(waba.pause_ms(Some(0)), Some(60_000), "a zero hint is no hint");
        assert_eq!(waba.pause_ms(Some(1_800_000)), Some(1_800_000));
        assert_eq!(classify(Some(368), None, 403, Sync).pause_ms(Some(5_000)), None, "until lifted");
        assert_eq!(classify(Some(131064), None, 400, Sync).pause_ms(Some(120_000)), Some(120_000));
        assert_eq!(classify(Some(131026), None, 400, Sync).pause_ms(Some(5_000)), None, "nothing paused");
    }

    #[test]
    fn which_answers_pause_a_scope_in_redis() {
        let paused = |code| classify(Some(code), None, 400, Sync).paused_scope();
        assert_eq!(paused(190), Some(S::Token));
        assert_eq!(paused(368), Some(S::Waba));
        assert_eq!(paused(133010), Some(S::PhoneNumber));
        assert_eq!(paused(131057), Some(S::PhoneNumber), "maintenance: transient and a number pause");
        assert_eq!(paused(131000), None);
        assert_eq!(paused(80007), None, "rate limits pause through their limiter");
        assert_eq!(paused(131026), None);
        assert_eq!(paused(424242), None);
        assert!(classify(Some(190), None, 401, Sync).credentials());
        assert!(!classify(Some(368), None, 403, Sync).credentials());
        assert!(!classify(Some(133010), None, 400, Sync).credentials());
    }

    #[test]
    fn body_parsing() {
        let body = br#"{"error":{"message":"(#130429) Rate limit hit","type":"OAuthException","code":130429,
            "error_data":{"messaging_product":"whatsapp","details":"Cloud API message throughput has been reached."},
            "error_subcode":2494055,"fbtrace_id":"Az8or2yhqkZfEZ-_4Qn_Bam"}}"#;
        let err = parse_error_body(body).expect("meta error parses");
        assert_eq!(err.code, Some(130429));
        assert_eq!(err.error_subcode, Some(2494055));
        assert_eq!(err.fbtrace_id, "Az8or2yhqkZfEZ-_4Qn_Bam");
        assert!(err.error_data.expect("data").details.contains("throughput"));
        assert!(parse_error_body(b"<html>502 Bad Gateway</html>").is_none());
        assert!(parse_error_body(br#"{"error":{"message":"no code here"}}"#).is_none(), "a missing code is not 0");
        assert_eq!(parse_error_body(br#"{"error":{"code":0,"type":"OAuthException"}}"#).and_then(|e| e.code), Some(0));
    }
}
