//! The Lua scripts of `lua/` (each prefixed with `scope_prelude.lua`), their typed invocations and the parsing
//! of their replies. Every call is one EVALSHA (`Script::invoke_async` reloads the script on NOSCRIPT, e.g.
//! after a Redis restart).

use crate::{AdmitItem, BreakerError, OutcomeItem, OutcomeKind, Scope, TrafficClass};
use bw_common::classify::RateScope;
use bw_common::proto::BreakerState;
use redis::{Script, Value};
use std::sync::LazyLock;

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

/// Every script, for pre-loading and for the test that runs each against a real Redis.
pub fn all_scripts() -> [(&'static str, &'static Script); 6] {
    [
        ("admit_send", &ADMIT_SEND),
        ("record_outcomes", &RECORD_OUTCOMES),
        ("tick_scope", &TICK_SCOPE),
        ("read_scope", &READ_SCOPE),
        ("force_breaker", &FORCE_BREAKER),
        ("observe_usage", &OBSERVE_USAGE),
    ]
}

/// Redis key of a scope's config hash (written by the coordinator).
pub fn cfg_key(scope: &Scope) -> String {
    bw_common::names::scope_key(&scope.waba_id, &scope.phone_number_id, "cfg")
}

/// Redis key of a scope's state hash.
pub fn state_key(scope: &Scope) -> String {
    bw_common::names::scope_key(&scope.waba_id, &scope.phone_number_id, "state")
}

/// Redis key of a (scope, recipient) pair limiter.
pub fn pair_key(scope: &Scope, recipient_key: &str) -> String {
    bw_common::names::scope_key(&scope.waba_id, &scope.phone_number_id, &format!("pair:{recipient_key}"))
}

fn class_code(class: TrafficClass) -> &'static str {
    match class {
        TrafficClass::Priority => "p",
        TrafficClass::Marketing => "m",
        TrafficClass::Replay => "r",
    }
}

pub(crate) fn admit_invocation(
    scope: &Scope,
    defaults: &str,
    rand: f64,
    items: &[AdmitItem],
) -> redis::ScriptInvocation<'static> {
    let mut inv = ADMIT_SEND.prepare_invoke();
    inv.key(cfg_key(scope)).key(state_key(scope));
    inv.arg(defaults).arg(&scope.phone_number_id).arg(rand);
    for item in items {
        inv.key(pair_key(scope, &item.recipient_key));
        inv.arg(class_code(item.class));
    }
    inv
}

pub(crate) fn record_invocation(
    scope: &Scope,
    defaults: &str,
    rand: f64,
    outcomes: &[OutcomeItem],
) -> redis::ScriptInvocation<'static> {
    let mut inv = RECORD_OUTCOMES.prepare_invoke();
    inv.key(cfg_key(scope)).key(state_key(scope));
    inv.arg(defaults).arg(&scope.phone_number_id).arg(rand);
    for item in outcomes {
        inv.key(pair_key(scope, &item.recipient_key));
        let (kind, pause_ms) = match item.kind {
            OutcomeKind::Success => ("s".to_string(), 0),
            OutcomeKind::Transient => ("t".to_string(), 0),
            OutcomeKind::Permanent => ("x".to_string(), 0),
            OutcomeKind::Credentials { pause_ms } => ("c".to_string(), pause_ms),
            OutcomeKind::RateLimited { scope: RateScope::Pair, pause_ms } => ("rr".to_string(), pause_ms),
            OutcomeKind::RateLimited { scope, pause_ms } => (format!("r:{}", scope.label()), pause_ms),
        };
        inv.arg(kind).arg(pause_ms).arg(if item.canary { "1" } else { "0" });
    }
    inv
}

pub(crate) fn scope_invocation(
    script: &'static Script,
    scope: &Scope,
    defaults: &str,
) -> redis::ScriptInvocation<'static> {
    let mut inv = script.prepare_invoke();
    inv.key(cfg_key(scope)).key(state_key(scope));
    inv.arg(defaults).arg(&scope.phone_number_id);
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
    })
}
