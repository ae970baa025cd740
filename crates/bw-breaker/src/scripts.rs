//! The Lua scripts of `lua/` (each prefixed with `scope_prelude.lua`), their typed invocations, the parsing
//! of their replies, and the Rust mirror of the codes and field names the prelude defines (CODE, OUT, PAUSE, F,
//! P, PF). The test `scripts::lua_definitions_match_the_rust_ones` loads the prelude into a real Redis and checks
//! both sides agree. Every call is one EVALSHA (`Script::invoke_async` reloads the script on NOSCRIPT, e.g.
//! after a Redis restart).

use crate::error::BreakerError;
use crate::types::{AdmitItem, DenyReason, OutcomeItem, OutcomeKind, Scope, TrafficClass};
use bw_common::classify::RateScope;
use bw_proto::v1::BreakerState;
use redis::{Script, Value};
use std::sync::LazyLock;

/// The shared prelude (definitions and functions) every script is prefixed with.
pub const PRELUDE: &str = include_str!("../../../lua/scope_prelude.lua");

macro_rules! scope_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../../lua/scope_prelude.lua"),
                "\n",
                include_str!(concat!("../../../lua/", $file))
            ))
        })
    };
}

pub(crate) static ADMIT_SEND: LazyLock<Script> = scope_script!("admit_send.lua");
pub(crate) static RECORD_OUTCOMES: LazyLock<Script> = scope_script!("record_outcomes.lua");
pub(crate) static TICK_SCOPE: LazyLock<Script> = scope_script!("tick_scope.lua");
pub(crate) static READ_SCOPE: LazyLock<Script> = scope_script!("read_scope.lua");
pub(crate) static FORCE_BREAKER: LazyLock<Script> = scope_script!("force_breaker.lua");
pub(crate) static OBSERVE_USAGE: LazyLock<Script> = scope_script!("observe_usage.lua");
pub(crate) static PARENT_PAUSE: LazyLock<Script> = scope_script!("parent_pause.lua");
pub(crate) static ORDER_REGISTER: LazyLock<Script> = scope_script!("order_register.lua");
pub(crate) static ORDER_RELEASE: LazyLock<Script> = scope_script!("order_release.lua");
pub(crate) static CLAIM_LATE: LazyLock<Script> = scope_script!("claim_late.lua");
pub(crate) static POOL_EVIDENCE: LazyLock<Script> = scope_script!("pool_evidence.lua");
pub(crate) static POOL_TRIP: LazyLock<Script> = scope_script!("pool_trip.lua");

/// Every script, for pre-loading and for the test that runs each against a real Redis.
pub fn all_scripts() -> [(&'static str, &'static Script); 12] {
    [
        ("admit_send", &ADMIT_SEND),
        ("record_outcomes", &RECORD_OUTCOMES),
        ("tick_scope", &TICK_SCOPE),
        ("read_scope", &READ_SCOPE),
        ("force_breaker", &FORCE_BREAKER),
        ("observe_usage", &OBSERVE_USAGE),
        ("parent_pause", &PARENT_PAUSE),
        ("order_register", &ORDER_REGISTER),
        ("order_release", &ORDER_RELEASE),
        ("claim_late", &CLAIM_LATE),
        ("pool_evidence", &POOL_EVIDENCE),
        ("pool_trip", &POOL_TRIP),
    ]
}

/// Decision codes of `admit_send.lua` (table CODE of the prelude).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    Allow = 0,
    Canary = 1,
    BreakerOpen = 2,
    ForcedOpen = 3,
    Paused = 4,
    SenderRate = 5,
    PairRate = 6,
    Reserve = 7,
    Throttled = 8,
    CanaryBudget = 9,
    SpamPaused = 10,
    RecipientDeferred = 11,
    RegistrationPaused = 12,
    OrderWait = 13,
    NumberPaused = 14,
}

impl Code {
    /// Every code.
    pub const ALL: [Code; 15] = [
        Code::Allow,
        Code::Canary,
        Code::BreakerOpen,
        Code::ForcedOpen,
        Code::Paused,
        Code::SenderRate,
        Code::PairRate,
        Code::Reserve,
        Code::Throttled,
        Code::CanaryBudget,
        Code::SpamPaused,
        Code::RecipientDeferred,
        Code::RegistrationPaused,
        Code::OrderWait,
        Code::NumberPaused,
    ];

    /// Its name in the prelude's CODE table.
    pub fn lua_name(self) -> &'static str {
        match self {
            Code::Allow => "allow",
            Code::Canary => "canary",
            Code::BreakerOpen => "breaker_open",
            Code::ForcedOpen => "forced_open",
            Code::Paused => "paused",
            Code::SenderRate => "sender_rate",
            Code::PairRate => "pair_rate",
            Code::Reserve => "reserve",
            Code::Throttled => "throttled",
            Code::CanaryBudget => "canary_budget",
            Code::SpamPaused => "spam_paused",
            Code::RecipientDeferred => "recipient_deferred",
            Code::RegistrationPaused => "registration_paused",
            Code::OrderWait => "order_wait",
            Code::NumberPaused => "number_paused",
        }
    }

    pub fn from_i64(code: i64) -> Option<Code> {
        Code::ALL.into_iter().find(|c| *c as i64 == code)
    }

    /// The refusal a code stands for (None for allow / canary).
    pub fn deny_reason(self) -> Option<DenyReason> {
        Some(match self {
            Code::Allow | Code::Canary => return None,
            Code::BreakerOpen => DenyReason::BreakerOpen,
            Code::ForcedOpen => DenyReason::ForcedOpen,
            Code::Paused => DenyReason::Paused,
            Code::SenderRate => DenyReason::SenderRate,
            Code::PairRate => DenyReason::PairRate,
            Code::Reserve => DenyReason::Reserve,
            Code::Throttled => DenyReason::Throttled,
            Code::CanaryBudget => DenyReason::CanaryBudget,
            Code::SpamPaused => DenyReason::SpamPaused,
            Code::RecipientDeferred => DenyReason::RecipientDeferred,
            Code::RegistrationPaused => DenyReason::RegistrationPaused,
            Code::OrderWait => DenyReason::OrderWait,
            Code::NumberPaused => DenyReason::NumberPaused,
        })
    }
}

/// Outcome kinds of `record_outcomes.lua` (table OUT of the prelude): (name, kind).
pub const OUT: &[(&str, &str)] = &[
    ("success", "s"),
    ("transient", "t"),
    ("permanent", "x"),
    ("credentials", "c"),
    ("pair", "rr"),
    ("throughput", "r:throughput"),
    ("spam", "r:spam"),
    ("registration", "r:registration"),
    ("deferred", "d"),
    ("neutral", "n"),
];

/// Pause kinds stored in the state hash (table PAUSE of the prelude): (name, number).
pub const PAUSE_KINDS: &[(&str, i64)] = &[("rate_limit", 1), ("spam", 2), ("credentials", 3), ("registration", 4)];

/// Fields of a scope's state hash (table F of the prelude): (name, field). The window ring fields are prefixes
/// followed by the slot number.
pub const STATE_FIELDS: &[(&str, &str)] = &[
    ("state", "st"),
    ("since", "since"),
    ("incident", "inc"),
    ("open_until", "ou"),
    ("streak", "streak"),
    ("trips", "trips"),
    ("half_open_successes", "hs"),
    ("canary_second", "cs"),
    ("canary_count", "cc"),
    ("ramp_start", "rc"),
    ("ramp_ms", "rm"),
    ("rate_limit_streak", "rl"),
    ("paused_until", "pu"),
    ("pause_reason", "pr"),
    ("pause_kind", "pk"),
    ("tokens", "tk"),
    ("tokens_at", "tt"),
    ("slow_tat", "lo"),
    ("usage", "us"),
    ("usage_at", "ua"),
    ("no_usage_at", "nv"),
    ("adaptive", "ar"),
    ("adaptive_cut_at", "ad"),
    ("adaptive_before_cut", "ab"),
    ("adaptive_last_cut", "ak"),
    ("next_slot", "ns"),
    ("fast_count", "ft"),
    ("fast_since", "fs"),
    ("fast_evidence", "fe"),
    ("fast_keys", "fk"),
    ("throttle_probe", "tq"),
    ("late_tokens", "lk"),
    ("late_at", "la"),
    ("older_priority_waiting", "hw"),
    ("line_p", "wp"),
    ("line_h", "wh"),
    ("line_m", "wm"),
    ("line_r", "wr"),
    ("win_bucket", "wn"),
    ("win_calls", "wc"),
    ("win_fails", "wf"),
];

/// Fields of a pair hash (table P of the prelude).
pub const PAIR_FIELDS: &[(&str, &str)] =
    &[("tat", "t"), ("backoffs", "x"), ("backoff_until", "b"), ("marketing_deferred", "md")];

/// Fields of a pause hash (table PF of the prelude).
pub const PARENT_FIELDS: &[(&str, &str)] = &[
    ("paused_until", "pu"),
    ("reason", "pr"),
    ("halted", "h"),
    ("code", "c"),
    ("since", "s"),
    ("source", "o"),
    ("lift", "l"),
    ("length", "n"),
    ("probe_at", "pa"),
    ("marketing", "m"),
    ("retry", "rt"),
];

/// The field of one of the tables above by name (panics in tests only: the names are constants).
pub fn field(table: &[(&'static str, &'static str)], name: &str) -> Option<&'static str> {
    table.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

fn out(name: &str) -> &'static str {
    field(OUT, name).unwrap_or("n")
}

/// Redis key of a scope's config hash (written by the coordinator).
pub fn cfg_key(scope: &Scope) -> String {
    bw_wire::names::scope_key(&scope.waba_id, &scope.phone_number_id, "cfg")
}

/// Redis key of a scope's state hash.
pub fn state_key(scope: &Scope) -> String {
    bw_wire::names::scope_key(&scope.waba_id, &scope.phone_number_id, "state")
}

/// Redis key of a (scope, recipient) pair hash (GCRA, 131056 back-off, 131049 deferral).
pub fn pair_key(scope: &Scope, recipient_key: &str) -> String {
    bw_wire::names::scope_key(&scope.waba_id, &scope.phone_number_id, &format!("pair:{recipient_key}"))
}

/// Redis key of a (scope, recipient) order set (`lua/order_register.lua`): same hash tag as the scope.
pub fn order_key(scope: &Scope, recipient_key: &str) -> String {
    bw_wire::names::scope_key(&scope.waba_id, &scope.phone_number_id, &format!("ord:{recipient_key}"))
}

/// Redis hash of the account each scope is sent with: field `waba:phone` ([`Scope::index_member`]), value
/// `<app key>\t<token fingerprint>` (written by the dispatchers' breakers, read by the coordinator). Not
/// scope-tagged: one key, never touched by the scripts.
pub const SCOPE_ACCOUNTS_KEY: &str = "bw:scope-accounts";

/// Key of a number's own pause (registration, display name, authentication probe...): the scope's hash tag, so
/// `admit_send.lua` reads it in the admission call.
pub fn number_pause_key(scope: &Scope) -> String {
    bw_wire::names::scope_key(&scope.waba_id, &scope.phone_number_id, "pause")
}

/// Key of an app's pause (codes 4, 17, 32, 613), own hash tag.
pub fn app_pause_key(app_id: &str) -> String {
    format!("bw:{{app:{app_id}}}:pause")
}

/// Key of a WABA's pause (80007 / 80008, 368, 131031, 131042, 131063, 131064), own hash tag.
pub fn waba_pause_key(waba_id: &str) -> String {
    format!("bw:{{waba:{waba_id}}}:pause")
}

/// Key of a token's halt (190, 0 with an auth subcode, permission codes), own hash tag; `fingerprint` is
/// [`crate::token_fingerprint`].
pub fn token_halt_key(fingerprint: &str) -> String {
    format!("bw:{{tok:{fingerprint}}}:halt")
}

/// Key of the pooled fast-trip evidence of every number sent with one access token (`lua/pool_evidence.lua`),
/// own hash tag; `fingerprint` is [`crate::token_fingerprint`].
pub fn token_pool_key(fingerprint: &str) -> String {
    format!("bw:{{tok:{fingerprint}}}:pool")
}

/// Key of the pooled evidence when no token is set: per app key, own hash tag.
pub fn app_pool_key(app_key: &str) -> String {
    format!("bw:{{app:{app_key}}}:pool")
}

fn class_code(class: TrafficClass) -> &'static str {
    match class {
        TrafficClass::Priority => "p",
        TrafficClass::OlderPriority => "h",
        TrafficClass::Marketing => "m",
        TrafficClass::Replay => "r",
    }
}

pub(crate) fn admit_invocation(
    scope: &Scope,
    defaults: &str,
    rand: f64,
    parent_ended_ms: i64,
    items: &[AdmitItem],
    operation_ids: &[String],
) -> redis::ScriptInvocation<'static> {
    let mut inv = ADMIT_SEND.prepare_invoke();
    inv.key(cfg_key(scope)).key(state_key(scope));
    inv.arg(defaults).arg(&scope.phone_number_id).arg(rand).arg(parent_ended_ms);
    for item in items {
        inv.key(pair_key(scope, &item.recipient_key));
        inv.arg(class_code(item.class));
    }
    for (i, item) in items.iter().enumerate() {
        inv.key(order_key(scope, &item.recipient_key));
        inv.arg(operation_ids.get(i).map(String::as_str).unwrap_or(""));
    }
    inv.key(number_pause_key(scope));
    inv.key(throughput_key(scope));
    inv
}

/// The kind and pause the scope script records for an outcome. Pauses of a scope (number, WABA, app, token) are
/// recorded on their own keys (`parent_pause.lua`), never in the scope's breaker window.
pub(crate) fn outcome_arg(kind: OutcomeKind) -> (&'static str, u64) {
    match kind {
        OutcomeKind::Success => (out("success"), 0),
        OutcomeKind::Transient | OutcomeKind::Unavailable => (out("transient"), 0),
        OutcomeKind::Permanent => (out("permanent"), 0),
        OutcomeKind::Pause(_) => (out("neutral"), 0),
        OutcomeKind::RateLimited { scope: RateScope::Pair, .. } => (out("pair"), 0),
        OutcomeKind::RateLimited { scope: RateScope::PhoneNumber, pause_ms } => (out("throughput"), pause_ms),
        OutcomeKind::RateLimited { scope: RateScope::Spam, pause_ms } => (out("spam"), pause_ms),
        OutcomeKind::RateLimited { scope: RateScope::Recipient, pause_ms } => (out("deferred"), pause_ms),
        OutcomeKind::RateLimited { scope: RateScope::Waba | RateScope::App | RateScope::Flow, .. } => {
            (out("neutral"), 0)
        }
    }
}

pub(crate) fn record_invocation(
    scope: &Scope,
    defaults: &str,
    rand: f64,
    outcomes: &[OutcomeItem],
    releases: &[crate::types::OrderRelease],
) -> redis::ScriptInvocation<'static> {
    let mut inv = RECORD_OUTCOMES.prepare_invoke();
    inv.key(cfg_key(scope)).key(state_key(scope));
    inv.arg(defaults).arg(&scope.phone_number_id).arg(rand);
    for item in outcomes {
        inv.key(pair_key(scope, &item.recipient_key));
        let (kind, pause_ms) = outcome_arg(item.kind);
        inv.arg(kind).arg(pause_ms).arg(if item.canary { "1" } else { "0" });
    }
    for r in releases {
        inv.key(order_key(scope, &r.recipient_key));
        inv.arg(&r.operation_id);
    }
    inv
}

pub(crate) fn release_invocation(
    scope: &Scope,
    releases: &[crate::types::OrderRelease],
) -> redis::ScriptInvocation<'static> {
    let mut inv = ORDER_RELEASE.prepare_invoke();
    for r in releases {
        inv.key(order_key(scope, &r.recipient_key));
        inv.arg(&r.operation_id);
    }
    inv
}

pub(crate) fn register_invocation(
    scope: &Scope,
    recipient_key: &str,
    operation_id: &str,
    ttl_ms: u64,
) -> redis::ScriptInvocation<'static> {
    let mut inv = ORDER_REGISTER.prepare_invoke();
    inv.key(order_key(scope, recipient_key)).arg(operation_id).arg(ttl_ms.max(1));
    inv
}

pub(crate) fn scope_invocation(
    script: &'static Script,
    scope: &Scope,
    defaults: &str,
) -> redis::ScriptInvocation<'static> {
    let mut inv = script.prepare_invoke();
    inv.key(cfg_key(scope)).key(state_key(scope)).key(number_pause_key(scope));
    inv.arg(defaults).arg(&scope.phone_number_id);
    inv
}

/// What `parent_pause.lua` is asked to write (modes "pause" and "halt"; "read" and "clear" take none of it).
#[derive(Debug, Clone, Default)]
pub(crate) struct PauseArgs {
    /// pause: its length; halt: the key's lifetime.
    pub ms: u64,
    pub reason: String,
    pub code: i64,
    pub source: &'static str,
    pub lift: &'static str,
    pub marketing: bool,
    /// pause with lift "probe": the longest pause; halt: the retry-after of held sends.
    pub extra_ms: u64,
}

pub(crate) fn parent_invocation(key: &str, mode: &str, args: &PauseArgs) -> redis::ScriptInvocation<'static> {
    let mut inv = PARENT_PAUSE.prepare_invoke();
    inv.key(key)
        .arg(mode)
        .arg(args.ms)
        .arg(&args.reason)
        .arg(args.code)
        .arg(if args.source.is_empty() { "answer" } else { args.source })
        .arg(if args.lift.is_empty() { "time" } else { args.lift })
        .arg(u8::from(args.marketing))
        .arg(args.extra_ms);
    inv
}

/// A reply read field by field.
pub(crate) struct Reply {
    values: Vec<Value>,
    at: usize,
}

impl Reply {
    pub(crate) fn new(value: Value) -> Result<Reply, BreakerError> {
        match value {
            Value::Array(values) => Ok(Reply { values, at: 0 }),
            other => Err(BreakerError::BadReply(format!("expected an array, got {other:?}"))),
        }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.values.len().saturating_sub(self.at)
    }

    fn next(&mut self) -> Result<&Value, BreakerError> {
        let v = self.values.get(self.at).ok_or_else(|| BreakerError::BadReply("reply too short".into()))?;
        self.at += 1;
        Ok(v)
    }

    pub(crate) fn int(&mut self) -> Result<i64, BreakerError> {
        match self.next()? {
            Value::Int(i) => Ok(*i),
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .map(|f| f as i64)
                .ok_or_else(|| BreakerError::BadReply("expected an integer".into())),
            Value::Nil => Ok(0),
            other => Err(BreakerError::BadReply(format!("expected an integer, got {other:?}"))),
        }
    }

    pub(crate) fn string(&mut self) -> Result<String, BreakerError> {
        match self.next()? {
            Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Ok(s.clone()),
            Value::Int(i) => Ok(i.to_string()),
            Value::Nil => Ok(String::new()),
            other => Err(BreakerError::BadReply(format!("expected a string, got {other:?}"))),
        }
    }

    pub(crate) fn float(&mut self) -> Result<f64, BreakerError> {
        let s = self.string()?;
        s.parse::<f64>().map_err(|_| BreakerError::BadReply(format!("expected a number, got `{s}`")))
    }
}

/// The head every scope script answers with.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub state: BreakerState,
    pub incident_id: String,
    pub open_until_ms: i64,
    pub calls: u64,
    pub failures: u64,
    pub now_ms: i64,
}

pub(crate) fn state_from_code(code: i64) -> BreakerState {
    BreakerState::try_from(code as i32).unwrap_or(BreakerState::Closed)
}

pub(crate) fn head(reply: &mut Reply) -> Result<Head, BreakerError> {
    Ok(Head {
        state: state_from_code(reply.int()?),
        incident_id: reply.string()?,
        open_until_ms: reply.int()?,
        calls: reply.int()?.max(0) as u64,
        failures: reply.int()?.max(0) as u64,
        now_ms: reply.int()?,
    })
}

/// A transition as the scripts report it.
#[derive(Debug, Clone)]
pub(crate) struct RawTransition {
    pub from: BreakerState,
    pub to: BreakerState,
    pub at_ms: i64,
    pub reason: String,
    pub incident_id: String,
}

pub(crate) fn transitions(reply: &mut Reply) -> Result<Vec<RawTransition>, BreakerError> {
    let mut out = Vec::new();
    while reply.remaining() >= 5 {
        out.push(RawTransition {
            from: state_from_code(reply.int()?),
            to: state_from_code(reply.int()?),
            at_ms: reply.int()?,
            reason: reply.string()?,
            incident_id: reply.string()?,
        });
    }
    Ok(out)
}

/// The snapshot part of read_scope / tick_scope / force_breaker replies (after the head).
#[derive(Debug, Clone)]
pub(crate) struct SnapshotTail {
    pub since_ms: i64,
    pub paused_until_ms: i64,
    pub pause_reason: String,
    pub ramp_fraction: f64,
    pub trips: u32,
    pub tokens: f64,
    pub usage_percent: u32,
    pub trip_streak: u32,
    pub adaptive_share: f64,
    pub visibility: i64,
    pub next_slot_wait_ms: u64,
}

pub(crate) fn snapshot_tail(reply: &mut Reply) -> Result<SnapshotTail, BreakerError> {
    Ok(SnapshotTail {
        since_ms: reply.int()?,
        paused_until_ms: reply.int()?,
        pause_reason: reply.string()?,
        ramp_fraction: reply.float()?,
        trips: reply.int()?.clamp(0, i64::from(u32::MAX)) as u32,
        tokens: reply.float()?,
        usage_percent: reply.int()?.clamp(0, 1000) as u32,
        trip_streak: reply.int()?.clamp(0, i64::from(u32::MAX)) as u32,
        adaptive_share: reply.float()?,
        visibility: reply.int()?,
        next_slot_wait_ms: reply.int()?.max(0) as u64,
    })
}

/// Reply of `parent_pause.lua`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParentReply {
    pub now_ms: i64,
    pub paused_until_ms: i64,
    pub reason: String,
    pub halted: bool,
    pub code: i64,
    pub since_ms: i64,
    pub source: String,
    pub lift: String,
    pub marketing: bool,
    pub retry_ms: u64,
}

pub(crate) fn parent_reply(value: Value) -> Result<ParentReply, BreakerError> {
    let mut reply = Reply::new(value)?;
    Ok(ParentReply {
        now_ms: reply.int()?,
        paused_until_ms: reply.int()?,
        reason: reply.string()?,
        halted: reply.int()? == 1,
        code: reply.int()?,
        since_ms: reply.int()?,
        source: reply.string()?,
        lift: reply.string()?,
        marketing: reply.int()? == 1,
        retry_ms: reply.int()?.max(0) as u64,
    })
}

/// The number's pause as `append_number_pause` (prelude) reports it after a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NumberPauseTail {
    pub paused_until_ms: i64,
    pub halted: bool,
    pub reason: String,
    pub code: i64,
    pub since_ms: i64,
    pub source: String,
    pub lift: String,
    pub marketing: bool,
}

pub(crate) fn number_pause_tail(reply: &mut Reply) -> Result<NumberPauseTail, BreakerError> {
    Ok(NumberPauseTail {
        paused_until_ms: reply.int()?,
        halted: reply.int()? == 1,
        reason: reply.string()?,
        code: reply.int()?,
        since_ms: reply.int()?,
        source: reply.string()?,
        lift: reply.string()?,
        marketing: reply.int()? == 1,
    })
}

/// Key of a number's throughput hash: the scope's hash tag, so `admit_send.lua` reads it.
pub fn throughput_key(scope: &Scope) -> String {
    bw_wire::names::scope_key(&scope.waba_id, &scope.phone_number_id, "tput")
}

impl DenyReason {
    /// The `admit_send.lua` code of this reason; None for the reasons decided in Rust (the local fallback and
    /// the parent pauses, which live outside the scope's hash slot).
    pub fn lua_code(self) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.deny_reason() == Some(self))
    }
}
