//! Scopes above a number whose pauses cover many numbers (app, WABA, token), their pause status, and the
//! account a breaker's sends use.

use crate::scripts;
use crate::types::{DenyReason, Scope};
use bw_common::classify::PauseScope;
use bw_proto::v1 as proto;

/// A scope with a pause key: the number itself, or a scope above it whose pause covers many numbers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Parent {
    /// The number alone (its own pause key, in its hash tag).
    Number(Scope),
    /// An app, by app id.
    App(String),
    /// A WABA, by id.
    Waba(String),
    /// An access token, by [`token_fingerprint`].
    Token(String),
}

impl Parent {
    /// Its Redis key.
    pub fn key(&self) -> String {
        match self {
            Parent::Number(scope) => scripts::number_pause_key(scope),
            Parent::App(id) => scripts::app_pause_key(id),
            Parent::Waba(id) => scripts::waba_pause_key(id),
            Parent::Token(fp) => scripts::token_halt_key(fp),
        }
    }

    /// Its level: number, WABA, app or token.
    pub fn level(&self) -> PauseScope {
        match self {
            Parent::Number(_) => PauseScope::PhoneNumber,
            Parent::App(_) => PauseScope::App,
            Parent::Waba(_) => PauseScope::Waba,
            Parent::Token(_) => PauseScope::Token,
        }
    }

    /// The paused scope's id (phone_number_id, WABA id, app id, token fingerprint).
    pub fn id(&self) -> &str {
        match self {
            Parent::Number(scope) => &scope.phone_number_id,
            Parent::App(id) | Parent::Waba(id) | Parent::Token(id) => id,
        }
    }

    pub(crate) fn deny_reason(&self) -> DenyReason {
        match self {
            Parent::Number(_) => DenyReason::NumberPaused,
            Parent::App(_) => DenyReason::AppPaused,
            Parent::Waba(_) => DenyReason::WabaPaused,
            Parent::Token(_) => DenyReason::TokenHalted,
        }
    }
}

/// State of a pause (of a number, WABA, app or token).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParentStatus {
    /// Unix ms until which it is paused (0: not paused, or paused until lifted: see `halted`).
    pub paused_until_unix_ms: i64,
    pub reason: String,
    /// Paused until lifted (an operator, a new token; a token halt, a WABA restriction, a number's registration).
    pub halted: bool,
    /// Meta code behind it (0: none).
    pub code: i64,
    /// Start of the pause in force, Unix ms (0: none).
    pub since_unix_ms: i64,
    /// Who set it: "answer", "webhook" or "operator" (empty: none).
    pub source: String,
    /// What ends it: "time", "probe", "operator" or "new_token" (empty: none).
    pub lift: String,
    /// Holds marketing sends only.
    pub marketing_only: bool,
}

impl ParentStatus {
    /// In force now: halted, or paused past `now_ms`.
    pub fn active(&self, now_ms: i64) -> bool {
        self.halted || self.paused_until_unix_ms > now_ms
    }

    /// The pause as the scope snapshot shows it.
    pub fn to_proto(&self, parent: &Parent) -> proto::ScopePause {
        proto::ScopePause {
            level: parent.level().label().to_string(),
            id: parent.id().to_string(),
            code: self.code,
            reason: self.reason.clone(),
            since_unix_ms: self.since_unix_ms,
            until_unix_ms: if self.halted { 0 } else { self.paused_until_unix_ms },
            lift: self.lift.clone(),
            source: self.source.clone(),
            marketing_only: self.marketing_only,
        }
    }

    pub(crate) fn from_reply(reply: &scripts::ParentReply) -> ParentStatus {
        ParentStatus {
            paused_until_unix_ms: reply.paused_until_ms,
            reason: reply.reason.clone(),
            halted: reply.halted,
            code: reply.code,
            since_unix_ms: reply.since_ms,
            source: reply.source.clone(),
            lift: reply.lift.clone(),
            marketing_only: reply.marketing,
        }
    }
}

/// Fingerprint of an access token used in Redis keys: the first 16 hex digits of its SHA-256. The token itself
/// never reaches Redis, logs or metrics.
pub fn token_fingerprint(access_token: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(access_token.as_bytes());
    hex::encode(&digest[..8])
}

/// The app and token a scope's sends use, as the dispatchers record them for the coordinator
/// ([`crate::Breaker::scope_accounts`]): the pauses above the number that cover it are these and its WABA's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeAccount {
    /// The app key of its app pause (the app id; `tok-<fingerprint>` or `default` when none is configured).
    pub app: String,
    /// The token's fingerprint, if a token is set.
    pub token_fp: Option<String>,
}

impl ScopeAccount {
    pub(crate) fn encode(&self) -> String {
        format!("{}\t{}", self.app, self.token_fp.as_deref().unwrap_or(""))
    }

    pub(crate) fn decode(value: &str) -> Option<ScopeAccount> {
        let (app, fp) = value.split_once('\t')?;
        Some(ScopeAccount { app: app.to_string(), token_fp: (!fp.is_empty()).then(|| fp.to_string()) })
    }

    /// The pauses above the number that cover `scope` under this account: its WABA, the app and the token.
    pub fn parents(&self, scope: &Scope) -> Vec<Parent> {
        let mut out = vec![Parent::Waba(scope.waba_id.clone())];
        if !self.app.is_empty() {
            out.push(Parent::App(self.app.clone()));
        }
        if let Some(fp) = &self.token_fp {
            out.push(Parent::Token(fp.clone()));
        }
        out
    }
}

/// The app and token this breaker's sends use.
#[derive(Debug, Clone, Default)]
pub(crate) struct Account {
    pub(crate) app_id: String,
    pub(crate) token_fp: Option<String>,
}

/// What this process knows of a pause above the number.
#[derive(Debug, Clone)]
pub(crate) struct ParentEntry {
    pub(crate) fetched: tokio::time::Instant,
    /// Redis time of the read.
    pub(crate) server_now_ms: i64,
    pub(crate) paused_until_ms: i64,
    pub(crate) halted: bool,
    pub(crate) marketing_only: bool,
    /// Retry-after of an untimed hold, ms (0: the configured `token_halt_retry_ms`).
    pub(crate) retry_ms: u64,
    /// End of the last pause seen (Redis ms), kept after it ended so the ramp can start there.
    pub(crate) last_end_ms: i64,
}
