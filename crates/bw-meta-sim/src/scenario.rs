//! Fault scenarios: time windows (offsets from the moment the scenario is set) with an error rate, a weighted
//! mix of faults, added latency, and an optional phone-number filter; status windows (webhooks delayed or
//! dropped); token events (a token expires or is revoked at an offset); optional limits that replace the
//! configured ones while the scenario is active; targeted error injections (`[[injections]]`: a code aimed at a
//! number, WABA, token, template, recipient, type or category, sync or async; see [`crate::inject`] and
//! `scenarios/error-codes.toml`); and account events (`[[events]]`: the webhooks of reference §4.5 and what they
//! change; see [`crate::events`] and `scenarios/account-signals.toml`).
//!
//! Parsing is strict: an unknown key anywhere (scenario, window, fault, latency, limits, token event) is an
//! error that names the key and the keys allowed there. TOML format (see `scenarios/flash-sale-outage.toml`
//! and `scenarios/mixed-ambiguous.toml`):
//!
//! ```toml
//! name = "flash-sale-outage"
//! seed = 42                    # optional; fixes every random choice when requests are sequential
//! selection = "random"         # or "deterministic": exact error counts (every 1/rate-th request) and
//!                              # smooth weighted round-robin over the fault mix
//! latency = { kind = "fixed", ms = 5 }          # optional base latency for every request
//!
//! [limits]                     # optional: replaces the configured `Limits` while this scenario is active
//! app_calls = 600              # e.g. an app-level budget (code 4); see `Limits` for every key
//!
//! [[token_events]]             # optional: from at_ms on, every call with this token fails on every number
//! token = "sim-token"          # or "*" for every token
//! at_ms = 20000
//! code = 190                   # 190 (expired, the default) or 0 (AuthException: invalidated)
//!
//! retry_after_s = 2           # optional: injected throttling errors carry Retry-After (Meta sends none)
//!
//! [[injections]]               # optional: see `inject` for every key
//! code = 368
//! waba_ids = ["102290129340398"]
//! start_ms = 10000
//! duration_ms = 30000
//!
//! [[events]]                   # optional: see `events` for every kind
//! at_ms = 20000
//! kind = "message_template_status_update"
//! template = "flash_sale"
//! event = "PAUSED"
//!
//! [[status_windows]]           # optional: statuses of messages accepted in the window come late or never
//! start_ms = 5000
//! duration_ms = 30000          # omit: open-ended
//! delay_ms = 5000              # on top of the configured webhook delays
//! drop_rate = 0.0              # share of accepted messages whose statuses are never sent
//! phone_number_ids = []        # optional filter
//!
//! [[windows]]
//! name = "outage"
//! start_ms = 10000             # offset from scenario start
//! duration_ms = 30000          # omit: until the scenario is replaced
//! error_rate = 0.28            # share of requests in the window that get a fault
//! phone_number_ids = ["1234"]  # optional filter
//! latency = { kind = "normal", mean_ms = 400, stddev_ms = 150 }  # or uniform{min_ms,max_ms}, fixed{ms}
//! faults = [
//!   { kind = "http", status = 503, meta_body = true, weight = 1 },  # code defaults per status
//!   { kind = "bodiless", status = 502, page = "plain", after_processing = true },  # 502 after acceptance
//!   { kind = "error", code = 130429 },                              # Meta error with its usual HTTP status
//!   { kind = "hang", hold_ms = 5000, accept = true },               # hold the request, then drop it
//!   { kind = "reset", after_processing = true },                    # drop the connection without answering
//!   { kind = "ok_unparseable", body = "truncated" },                # accepted, 200 with a body no parser reads
//!   { kind = "async_failure", code = 131026 },                      # 200, then a `failed` status webhook
//! ]
//! ```
//!
//! A full outage is a window with `error_rate = 1.0`; recovery is the end of the window.

use crate::events::Event;
use crate::ids::Rng;
use crate::inject::{Call, Injection};
use crate::limits::Limits;
use serde::{Deserialize, Deserializer, Serialize};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A fault schedule. Construct in Rust or parse with [`Scenario::from_toml`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub name: String,
    /// Seed for the scenario's RNG (fault draws, latency); default 1.
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub selection: Selection,
    /// Latency added to every request, in or out of windows.
    #[serde(default)]
    pub latency: Option<Latency>,
    #[serde(default)]
    pub windows: Vec<Window>,
    /// Replaces the configured limits while this scenario is active (missing keys take Meta's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Tokens that expire or are revoked at an offset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_events: Vec<TokenEvent>,
    /// Windows in which status webhooks are delayed or dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub status_windows: Vec<StatusWindow>,
    /// Injected throttling errors (130429, 131056, 131048, 4, 80007, 80008) carry `Retry-After` with this many
    /// seconds (in the format `limits.retry_after` picks; seconds when it is `none`). Meta sends none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// Error codes aimed at a number, WABA, token, template or recipient (see [`crate::inject`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injections: Vec<Injection>,
    /// Account, template, user and inbound webhooks at offsets (see [`crate::events`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
}

/// From `at_ms` on, every request that carries `token` fails with `code` (190 or 0) on every number.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TokenEvent {
    /// The bearer token, or `*` for every token.
    pub token: String,
    #[serde(default)]
    pub at_ms: u64,
    /// 190 (access token expired, the default) or 0 (AuthException: the token was invalidated).
    #[serde(default = "code_190")]
    pub code: i64,
}

fn code_190() -> i64 {
    190
}

/// How faults are picked inside a window.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Each request fails with probability `error_rate`; the fault is drawn by weight.
    #[default]
    Random,
    /// Request n fails when floor((n+1)·rate) > floor(n·rate); the fault is chosen by smooth weighted
    /// round-robin. Counts are exact whatever the concurrency.
    Deterministic,
}

/// One time window of a scenario.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Window {
    #[serde(default)]
    pub name: String,
    pub start_ms: u64,
    /// None: open-ended.
    #[serde(default)]
    pub duration_ms: Option<u64>,
    #[serde(default)]
    pub error_rate: f64,
    #[serde(default)]
    pub faults: Vec<Fault>,
    #[serde(default)]
    pub latency: Option<Latency>,
    /// Only requests for these phone_number_ids are affected; empty: all.
    #[serde(default)]
    pub phone_number_ids: Vec<String>,
}

/// A time window in which the status webhooks of accepted messages arrive late or not at all.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StatusWindow {
    #[serde(default)]
    pub name: String,
    pub start_ms: u64,
    /// None: open-ended.
    #[serde(default)]
    pub duration_ms: Option<u64>,
    /// Only messages sent from these phone_number_ids are affected; empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phone_number_ids: Vec<String>,
    /// Statuses of messages accepted in the window are sent this much later than configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Share of the messages accepted in the window whose statuses are never sent (counted in
    /// `webhooks.statuses_withheld`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drop_rate: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn covers(start_ms: u64, duration_ms: Option<u64>, ids: &[String], now: u64, phone_number_id: &str) -> bool {
    let active = now >= start_ms && duration_ms.is_none_or(|len| now < start_ms.saturating_add(len));
    active && (ids.is_empty() || ids.iter().any(|p| p == phone_number_id))
}

impl Window {
    /// A window from `start_ms` (None: open-ended) with no faults or effects.
    pub fn new(name: &str, start_ms: u64, duration_ms: Option<u64>) -> Window {
        Window {
            name: name.to_string(),
            start_ms,
            duration_ms,
            error_rate: 0.0,
            faults: vec![],
            latency: None,
            phone_number_ids: vec![],
        }
    }
}

/// One entry of a window's fault mix.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Fault {
    #[serde(flatten)]
    pub kind: FaultKind,
    pub weight: u32,
}

/// Strict parsing: `weight` plus the keys of the fault's `kind`, nothing else (serde's `flatten` would
/// silently ignore unknown keys).
impl<'de> Deserialize<'de> for Fault {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fault, D::Error> {
        use serde::de::Error as _;
        let mut v = serde_json::Value::deserialize(d)?;
        let Some(map) = v.as_object_mut() else {
            return Err(D::Error::custom("a fault must be a table like { kind = \"error\", code = 131000 }"));
        };
        let weight = match map.remove("weight") {
            None => 1,
            Some(w) => w
                .as_u64()
                .and_then(|w| u32::try_from(w).ok())
                .ok_or_else(|| D::Error::custom(format!("fault weight must be a non-negative integer, not {w}")))?,
        };
        let kind = serde_json::from_value::<FaultKind>(v).map_err(|e| D::Error::custom(format!("fault: {e}")))?;
        Ok(Fault { kind, weight })
    }
}

/// What a fault does to a request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FaultKind {
    /// An HTTP error status (500/502/503/504...). With `meta_body`, Meta's error JSON with `code` (default per
    /// status: 500→131000, 502→1, 503→2, 504→133004); without, a bodiless HTML gateway page.
    /// `after_processing`: the message was accepted before the error (recorded in the oracle; the client cannot
    /// tell, which is the ambiguous case of reference §2.2 and §5).
    Http {
        status: u16,
        #[serde(default)]
        meta_body: bool,
        #[serde(default)]
        code: Option<i64>,
        #[serde(default)]
        after_processing: bool,
    },
    /// A bodiless HTTP error (a proxy in front of Meta): a `page` (HTML, plain text or empty) that no client can
    /// read a Meta code from. `after_processing`: the message was accepted first (the ambiguous case).
    Bodiless {
        status: u16,
        #[serde(default)]
        page: Page,
        #[serde(default)]
        after_processing: bool,
    },
    /// A Meta error code with its usual HTTP status (throttle codes use the configured throttle status),
    /// optionally overridden. Throttle codes carry Retry-After when the scenario sets `retry_after_s`.
    Error {
        code: i64,
        #[serde(default)]
        http_status: Option<u16>,
        #[serde(default)]
        subcode: Option<i64>,
    },
    /// Hold the request open for `hold_ms` (past the client's timeout), then drop the connection.
    /// `accept`: the message was accepted before the hang (unknown outcome for the client).
    Hang {
        hold_ms: u64,
        #[serde(default)]
        accept: bool,
    },
    /// Drop the connection without a response. `after_processing`: the message was accepted first.
    Reset {
        #[serde(default)]
        after_processing: bool,
    },
    /// Accept (200) and later report `failed` with `code` in a status webhook (e.g. 131049, 131026).
    AsyncFailure { code: i64 },
    /// Accept, then answer HTTP 200 with a body no JSON parser reads (`truncated` JSON, `empty`, or an `html`
    /// page): the client knows nothing was refused but has no wamid.
    OkUnparseable {
        #[serde(default)]
        body: Garbled,
    },
}

impl FaultKind {
    /// An HTTP error before processing: Meta's JSON body, or a bodiless HTML page.
    pub fn http(status: u16, meta_body: bool) -> FaultKind {
        FaultKind::Http { status, meta_body, code: None, after_processing: false }
    }

    /// A bodiless HTTP error after the message was accepted.
    pub fn http_after_accept(status: u16, page: Page) -> FaultKind {
        FaultKind::Bodiless { status, page, after_processing: true }
    }

    /// A Meta error code with its catalog status.
    pub fn error(code: i64) -> FaultKind {
        FaultKind::Error { code, http_status: None, subcode: None }
    }

    /// Whether the message is accepted (recorded in the oracle) before this fault's answer.
    pub fn accepts(&self) -> bool {
        match self {
            FaultKind::Http { after_processing, .. }
            | FaultKind::Bodiless { after_processing, .. }
            | FaultKind::Reset { after_processing } => *after_processing,
            FaultKind::Hang { accept, .. } => *accept,
            FaultKind::Error { .. } => false,
            FaultKind::AsyncFailure { .. } | FaultKind::OkUnparseable { .. } => true,
        }
    }

    /// Whether the client never gets a parseable 200 for a message this fault lets through.
    pub fn hides_acceptance(&self) -> bool {
        self.accepts() && !matches!(self, FaultKind::AsyncFailure { .. })
    }
}

/// The body of a bodiless HTTP error.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Page {
    /// `<html><body><h1>503 Service Unavailable</h1></body></html>` (a load balancer's page).
    #[default]
    Html,
    /// `503 Service Unavailable` as text/plain.
    Plain,
    /// No body at all.
    Empty,
}

/// The body of a 200 that cannot be parsed.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Garbled {
    /// The success JSON cut off in the middle, as application/json.
    #[default]
    Truncated,
    /// Content-Length 0.
    Empty,
    /// An HTML page.
    Html,
}

/// Added latency.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Latency {
    Fixed {
        ms: u64,
    },
    Uniform {
        min_ms: u64,
        max_ms: u64,
    },
    /// Normal-ish (sum of uniforms), clamped at 0.
    Normal {
        mean_ms: f64,
        stddev_ms: f64,
    },
}

impl Latency {
    pub fn sample(&self, rng: &Rng) -> Duration {
        let ms = match *self {
            Latency::Fixed { ms } => ms as f64,
            Latency::Uniform { min_ms, max_ms } => {
                let (lo, hi) = (min_ms.min(max_ms) as f64, min_ms.max(max_ms) as f64);
                lo + rng.next_f64() * (hi - lo)
            }
            Latency::Normal { mean_ms, stddev_ms } => {
                // Irwin–Hall with 12 uniforms: mean 6, variance 1.
                let z: f64 = (0..12).map(|_| rng.next_f64()).sum::<f64>() - 6.0;
                (mean_ms + z * stddev_ms).max(0.0)
            }
        };
        Duration::from_micros((ms * 1000.0) as u64)
    }
}

/// Invalid scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The parser's message (line, column, the offending key and the keys allowed there).
    #[error("scenario is not valid toml: {0}")]
    Toml(String),
    #[error("scenario is not valid json: {0}")]
    Json(String),
    #[error("cannot read scenario file `{path}`: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("window `{window}`: {problem}")]
    Invalid { window: String, problem: String },
    #[error(
        "unknown built-in scenario `{0}` (known: flash-sale-outage, mixed-ambiguous, error-codes, \
         account-signals, normal)"
    )]
    UnknownBuiltin(String),
    #[error("scenario limits: {0}")]
    Limits(String),
    #[error("status window `{window}`: {problem}")]
    StatusWindow { window: String, problem: String },
    #[error("token_events[{index}]: {problem}")]
    Token { index: usize, problem: String },
    #[error("injection `{injection}`: {problem}")]
    Injection { injection: String, problem: String },
    #[error("event `{event}`: {problem}")]
    Event { event: String, problem: String },
}

impl Scenario {
    /// No faults.
    pub fn normal() -> Scenario {
        Scenario { name: "normal".into(), ..Scenario::default() }
    }

    /// Normal, then from `start` for `length` 28% of requests fail with an even mix of 503 (Meta body) and
    /// 130429, with extra latency; then recovery.
    pub fn flash_sale_outage(start: Duration, length: Duration) -> Scenario {
        Scenario {
            name: "flash-sale-outage".into(),
            seed: Some(42),
            selection: Selection::Random,
            latency: None,
            windows: vec![Window {
                name: "outage".into(),
                start_ms: start.as_millis() as u64,
                duration_ms: Some(length.as_millis() as u64),
                error_rate: 0.28,
                faults: vec![
                    Fault { kind: FaultKind::http(503, true), weight: 1 },
                    Fault { kind: FaultKind::error(130429), weight: 1 },
                ],
                latency: Some(Latency::Normal { mean_ms: 120.0, stddev_ms: 40.0 }),
                ..Window::new("outage", 0, None)
            }],
            ..Scenario::default()
        }
    }

    /// A full outage: every request gets a bodiless 503 from `start` for `length`.
    pub fn outage(start: Duration, length: Duration) -> Scenario {
        Scenario {
            name: "outage".into(),
            windows: vec![Window {
                name: "outage".into(),
                start_ms: start.as_millis() as u64,
                duration_ms: Some(length.as_millis() as u64),
                error_rate: 1.0,
                faults: vec![Fault { kind: FaultKind::http(503, false), weight: 1 }],
                ..Window::new("outage", 0, None)
            }],
            ..Scenario::default()
        }
    }

    /// A built-in scenario by name: `flash-sale-outage` (outage at 10 s for 30 s), `mixed-ambiguous`,
    /// `error-codes`, `account-signals`, `flash-sale-past-the-limit` (the shipped `scenarios/<name>.toml`), `normal`.
    pub fn builtin(name: &str) -> Result<Scenario, ScenarioError> {
        match name {
            "flash-sale-outage" => Ok(Scenario::flash_sale_outage(Duration::from_secs(10), Duration::from_secs(30))),
            "mixed-ambiguous" => Scenario::from_toml(include_str!("../scenarios/mixed-ambiguous.toml")),
            "error-codes" => Scenario::from_toml(include_str!("../scenarios/error-codes.toml")),
            "account-signals" => Scenario::from_toml(include_str!("../scenarios/account-signals.toml")),
            "flash-sale-past-the-limit" => {
                Scenario::from_toml(include_str!("../scenarios/flash-sale-past-the-limit.toml"))
            }
            "normal" => Ok(Scenario::normal()),
            other => Err(ScenarioError::UnknownBuiltin(other.to_string())),
        }
    }

    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Toml(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    pub fn from_json(text: &[u8]) -> Result<Scenario, ScenarioError> {
        let s: Scenario = serde_json::from_slice(text).map_err(|e| ScenarioError::Json(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// A built-in name, or a path to a TOML file.
    pub fn load(name_or_path: &str) -> Result<Scenario, ScenarioError> {
        if let Ok(s) = Scenario::builtin(name_or_path) {
            return Ok(s);
        }
        let text = std::fs::read_to_string(name_or_path)
            .map_err(|source| ScenarioError::Io { path: name_or_path.to_string(), source })?;
        Scenario::from_toml(&text)
    }

    pub fn validate(&self) -> Result<(), ScenarioError> {
        if let Some(l) = &self.limits {
            l.validate().map_err(ScenarioError::Limits)?;
        }
        for (i, inj) in self.injections.iter().enumerate() {
            inj.validate()
                .map_err(|problem| ScenarioError::Injection { injection: injection_name(inj, i), problem })?;
        }
        for (i, ev) in self.events.iter().enumerate() {
            ev.kind.validate().map_err(|problem| ScenarioError::Event { event: event_name(ev, i), problem })?;
        }
        for (i, t) in self.token_events.iter().enumerate() {
            if t.token.is_empty() {
                return Err(ScenarioError::Token {
                    index: i,
                    problem: "token must not be empty (use \"*\" for every token)".into(),
                });
            }
            if ![0, 190].contains(&t.code) {
                return Err(ScenarioError::Token {
                    index: i,
                    problem: format!("code must be 190 or 0, not {}", t.code),
                });
            }
        }
        for (i, w) in self.status_windows.iter().enumerate() {
            let label = if w.name.is_empty() { format!("#{}", i + 1) } else { w.name.clone() };
            let bad = |problem: String| ScenarioError::StatusWindow { window: label.clone(), problem };
            if !(0.0..=1.0).contains(&w.drop_rate) {
                return Err(bad(format!("drop_rate must be between 0 and 1, not {}", w.drop_rate)));
            }
            if w.duration_ms == Some(0) {
                return Err(bad("duration_ms must be positive (omit it for an open-ended window)".into()));
            }
            if w.delay_ms.is_none() && w.drop_rate == 0.0 {
                return Err(bad("set delay_ms or drop_rate (a status window without either does nothing)".into()));
            }
        }
        for (i, w) in self.windows.iter().enumerate() {
            let label = if w.name.is_empty() { format!("#{}", i + 1) } else { w.name.clone() };
            let bad = |problem: String| ScenarioError::Invalid { window: label.clone(), problem };
            if !(0.0..=1.0).contains(&w.error_rate) {
                return Err(bad(format!("error_rate must be between 0 and 1, not {}", w.error_rate)));
            }
            if w.duration_ms == Some(0) {
                return Err(bad("duration_ms must be positive (omit it for an open-ended window)".into()));
            }
            if w.error_rate > 0.0 && w.faults.iter().all(|f| f.weight == 0) {
                return Err(bad("error_rate > 0 needs at least one fault with weight > 0".into()));
            }
            for f in &w.faults {
                match f.kind {
                    FaultKind::Http { status, .. } | FaultKind::Bodiless { status, .. }
                        if !(400..=599).contains(&status) =>
                    {
                        return Err(bad(format!(
                            "{} fault status must be 4xx or 5xx, not {status}",
                            kind_name(&f.kind)
                        )));
                    }
                    FaultKind::Error { http_status: Some(status), .. } if !(400..=599).contains(&status) => {
                        return Err(bad(format!("error fault http_status must be 4xx or 5xx, not {status}")));
                    }
                    FaultKind::Hang { hold_ms: 0, .. } => return Err(bad("hang fault needs hold_ms > 0".into())),
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// The counter key of an injection: its name, or `#<index>`.
pub fn injection_name(inj: &Injection, index: usize) -> String {
    if inj.name.is_empty() { format!("#{index}") } else { inj.name.clone() }
}

/// The label of an event: its name, or `#<index> <kind>`.
pub fn event_name(ev: &Event, index: usize) -> String {
    if ev.name.is_empty() { format!("#{index} {}", ev.kind.kind_name()) } else { ev.name.clone() }
}

/// A scenario that is running: its clock and per-window counters.
#[derive(Debug)]
pub struct Active {
    pub scenario: Scenario,
    pub started: Instant,
    pub rng: Rng,
    windows: Vec<WindowState>,
    /// Accepted-message draws per status window (deterministic mode).
    status_seen: Vec<AtomicU64>,
    /// Per injection: matching calls seen (deterministic draws), calls picked (for `max`).
    injections: Vec<(AtomicU64, AtomicU64)>,
}

/// An injection picked for a call.
#[derive(Debug, Clone)]
pub struct Picked {
    pub injection: Injection,
    /// Its counter key.
    pub name: String,
}

#[derive(Debug)]
struct WindowState {
    seen: AtomicU64,
    /// Smooth weighted round-robin current weights (deterministic mode).
    swrr: Mutex<Vec<i64>>,
}

/// What the scenario decided for one request.
#[derive(Debug, Clone, Default)]
pub struct Decision {
    pub latency: Duration,
    pub fault: Option<FaultKind>,
    /// Name of the window that produced the fault.
    pub window: Option<String>,
    /// Extra delay for the status webhooks of this message, if accepted.
    pub status_delay: Duration,
    /// Never send the status webhooks of this message, if accepted.
    pub drop_statuses: bool,
}

impl Active {
    pub fn start(scenario: Scenario) -> Active {
        let windows = scenario
            .windows
            .iter()
            .map(|w| WindowState { seen: AtomicU64::new(0), swrr: Mutex::new(vec![0; w.faults.len()]) })
            .collect();
        let status_seen = scenario.status_windows.iter().map(|_| AtomicU64::new(0)).collect();
        let injections = scenario.injections.iter().map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect();
        let rng = Rng::new(scenario.seed.unwrap_or(1));
        Active { scenario, started: Instant::now(), rng, windows, status_seen, injections }
    }

    /// Whether any injection could apply (the caller skips building a [`Call`] otherwise).
    pub fn has_injections(&self) -> bool {
        !self.scenario.injections.is_empty()
    }

    /// The first injection, in file order, that is active now, targets the call, is under its `max`, and fires
    /// by its rate. Each injection that targets the call counts it as seen, so deterministic rates are exact per
    /// injection.
    pub fn pick_injection(&self, call: &Call<'_>) -> Option<Picked> {
        let now = self.elapsed_ms();
        for (i, (inj, (seen, picked))) in self.scenario.injections.iter().zip(&self.injections).enumerate() {
            if !inj.active_at(now) || !inj.targets(call) {
                continue;
            }
            if inj.max.is_some_and(|max| picked.load(Ordering::Relaxed) >= max) {
                continue;
            }
            if !self.fires(seen, inj.rate) {
                continue;
            }
            if let Some(max) = inj.max
                && picked.fetch_add(1, Ordering::Relaxed) >= max
            {
                continue;
            }
            return Some(Picked { injection: inj.clone(), name: injection_name(inj, i) });
        }
        None
    }

    pub fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Random: a draw below `rate`; deterministic: request n fires when floor((n+1)·rate) > floor(n·rate).
    fn fires(&self, seen: &AtomicU64, rate: f64) -> bool {
        match self.scenario.selection {
            Selection::Random => self.rng.next_f64() < rate,
            Selection::Deterministic => {
                let n = seen.fetch_add(1, Ordering::Relaxed);
                ((n + 1) as f64 * rate).floor() > (n as f64 * rate).floor()
            }
        }
    }

    /// The code (190 or 0) every call with `token` fails with now, if a token event has fired for it.
    pub fn token_fault(&self, token: &str) -> Option<i64> {
        let now = self.elapsed_ms();
        self.scenario
            .token_events
            .iter()
            .find(|t| now >= t.at_ms && (t.token == "*" || t.token == token))
            .map(|t| t.code)
    }

    /// Decides latency, fault and status-webhook effects for a request to `phone_number_id` now.
    pub fn decide(&self, phone_number_id: &str) -> Decision {
        let now = self.elapsed_ms();
        let mut d = Decision::default();
        if let Some(l) = &self.scenario.latency {
            d.latency += l.sample(&self.rng);
        }
        for (w, seen) in self.scenario.status_windows.iter().zip(&self.status_seen) {
            if !covers(w.start_ms, w.duration_ms, &w.phone_number_ids, now, phone_number_id) {
                continue;
            }
            if let Some(ms) = w.delay_ms {
                d.status_delay += Duration::from_millis(ms);
            }
            if w.drop_rate > 0.0 && !d.drop_statuses {
                d.drop_statuses = self.fires(seen, w.drop_rate);
            }
        }
        for (w, state) in self.scenario.windows.iter().zip(&self.windows) {
            if !covers(w.start_ms, w.duration_ms, &w.phone_number_ids, now, phone_number_id) {
                continue;
            }
            if let Some(l) = &w.latency {
                d.latency += l.sample(&self.rng);
            }
            if d.fault.is_some() || w.faults.is_empty() {
                continue;
            }
            let fire = self.fires(&state.seen, w.error_rate);
            if fire {
                let idx = match self.scenario.selection {
                    Selection::Random => pick_weighted(&w.faults, self.rng.next_u64()),
                    Selection::Deterministic => pick_swrr(&w.faults, &state.swrr),
                };
                d.fault = idx.map(|i| w.faults[i].kind.clone());
                d.window = Some(w.name.clone());
            }
        }
        d
    }
}

fn kind_name(kind: &FaultKind) -> &'static str {
    match kind {
        FaultKind::Http { .. } => "http",
        FaultKind::Bodiless { .. } => "bodiless",
        FaultKind::Error { .. } => "error",
        FaultKind::Hang { .. } => "hang",
        FaultKind::Reset { .. } => "reset",
        FaultKind::AsyncFailure { .. } => "async_failure",
        FaultKind::OkUnparseable { .. } => "ok_unparseable",
    }
}

fn pick_weighted(faults: &[Fault], r: u64) -> Option<usize> {
    let total: u64 = faults.iter().map(|f| u64::from(f.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut x = r % total;
    for (i, f) in faults.iter().enumerate() {
        if x < u64::from(f.weight) {
            return Some(i);
        }
        x -= u64::from(f.weight);
    }
    None
}

fn pick_swrr(faults: &[Fault], current: &Mutex<Vec<i64>>) -> Option<usize> {
    let mut cur = current.lock().unwrap_or_else(|e| e.into_inner());
    let total: i64 = faults.iter().map(|f| i64::from(f.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut best = 0;
    for (i, f) in faults.iter().enumerate() {
        cur[i] += i64::from(f.weight);
        if cur[i] > cur[best] {
            best = i;
        }
    }
    cur[best] -= total;
    Some(best)
}

#[cfg(test)]
mod tests;
