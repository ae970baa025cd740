//! Quarantine scopes and their holds (`lua/template_holds.lua`).
//!
//! A quarantine scope is what a group of held messages waits on, released or dropped together:
//! - a template, keyed (WABA, language, name): 132001, 132007, 132015 and 132016 hold every message of it, unsent,
//!   while other templates flow (meta-cloud-api.md §2.3, scope TEMPLATE);
//! - an unclassified code, keyed by the code: its messages wait for a person instead of being replayed one by one.
//!
//! Scope keys never hold a phone number or any personal data, so they may be logged, shown and alerted on.
//! Held state lives in Redis and changes only in the Lua script (one key per scope, hash tag `{qs}`).

use crate::error::{BreakerError, RedisConn, invoke};
use bw_proto::v1::SendRequest;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

pub(crate) static TEMPLATE_HOLDS: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../lua/template_holds.lua")));

/// How long a process trusts a read of a hold before asking Redis again. A hold another process records is
/// seen within this time; a message sent meanwhile is refused by Meta with the same code and held then.
const READ_CACHE: Duration = Duration::from_millis(1_000);

/// The scope a quarantined message is held under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScopeKey {
    /// One template of one WABA in one language.
    Template { waba_id: String, language: String, name: String },
    /// Every message Meta refused with this unclassified code.
    Code(i64),
}

impl ScopeKey {
    /// The scope of a message refused with `code`: its template when the code is about the template and the
    /// message is a template; otherwise the code.
    pub fn of(request: &SendRequest, code: i64, template_scope: bool) -> ScopeKey {
        match &request.payload {
            Some(bw_proto::v1::send_request::Payload::Template(t)) if template_scope => ScopeKey::Template {
                waba_id: request.waba_id.clone(),
                language: t.language.clone(),
                name: t.name.clone(),
            },
            _ => ScopeKey::Code(code),
        }
    }

    /// The template scope of a message, if it is a template message (what the dispatcher checks before a send).
    pub fn template_of(request: &SendRequest) -> Option<ScopeKey> {
        match &request.payload {
            Some(bw_proto::v1::send_request::Payload::Template(_)) => Some(ScopeKey::of(request, 0, true)),
            _ => None,
        }
    }

    /// Whether this is a template scope (held in Redis; a code scope only groups entries).
    pub fn is_template(&self) -> bool {
        matches!(self, ScopeKey::Template { .. })
    }

    /// The Redis key of this scope's hold.
    pub fn hold_key(&self) -> String {
        format!("bw:{{qs}}:hold:{self}")
    }

    /// Parses a scope key as [`std::fmt::Display`] writes it ("tpl:<waba>:<language>:<name>" or "code:<code>"),
    /// with a precise error for anything else (the text is never echoed: it may be a mistyped phone number).
    pub fn parse(text: &str) -> Result<ScopeKey, String> {
        let usage = "a scope key is `tpl:<waba_id>:<language>:<template name>` or `code:<meta code>` \
                     (as `bwctl quarantine ls` prints it)";
        if let Some(code) = text.strip_prefix("code:") {
            return match code.parse::<i64>() {
                Ok(c) if c >= 0 && !code.starts_with('+') => Ok(ScopeKey::Code(c)),
                _ => Err(format!("the code of a `code:` scope must be a non-negative number; {usage}")),
            };
        }
        let Some(rest) = text.strip_prefix("tpl:") else {
            return Err(format!("unknown scope kind; {usage}"));
        };
        let mut parts = rest.splitn(3, ':');
        let (waba, language, name) = (parts.next(), parts.next(), parts.next());
        let (Some(waba), Some(language), Some(name)) = (waba, language, name) else {
            return Err(format!("a template scope has three parts; {usage}"));
        };
        if waba.is_empty() || waba.len() > 32 || !waba.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("the WABA id of a template scope is 1 to 32 digits; {usage}"));
        }
        let lang_ok = (2..=16).contains(&language.len())
            && language.bytes().all(|b| b.is_ascii_alphabetic() || b == b'_' || b == b'-');
        if !lang_ok {
            return Err(format!("the language of a template scope looks like `en_US`; {usage}"));
        }
        let name_ok = (1..=512).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !name_ok {
            return Err(format!("a template name is 1 to 512 letters, digits, `_`, `-` or `.`; {usage}"));
        }
        Ok(ScopeKey::Template { waba_id: waba.into(), language: language.into(), name: name.into() })
    }
}

impl std::fmt::Display for ScopeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScopeKey::Template { waba_id, language, name } => write!(f, "tpl:{waba_id}:{language}:{name}"),
            ScopeKey::Code(code) => write!(f, "code:{code}"),
        }
    }
}

/// A hold in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// The Meta code that started it.
    pub code: i64,
    pub since_ms: i64,
    /// When it lapses by itself (0: held until released).
    pub until_ms: i64,
}

/// This process's recent reads of holds, by scope key: when read, and what was there.
type ReadCache = Arc<Mutex<HashMap<String, (Instant, Option<Hold>)>>>;

/// The holds of quarantine scopes, over Redis. Cheap to clone.
#[derive(Clone)]
pub struct TemplateHolds {
    conn: RedisConn,
    cache: ReadCache,
}

impl TemplateHolds {
    pub fn new(conn: RedisConn) -> TemplateHolds {
        TemplateHolds { conn, cache: Arc::default() }
    }

    async fn call(&self, key: &ScopeKey, mode: &str, code: i64, ms: u64) -> Result<Option<Hold>, BreakerError> {
        let mut inv = TEMPLATE_HOLDS.prepare_invoke();
        inv.key(key.hold_key()).arg(mode).arg(code).arg(ms);
        let value = invoke(&self.conn, &inv).await?;
        let hold = parse_reply(value)?;
        if mode != "release" {
            self.remember(key, hold);
        } else {
            self.remember(key, None);
        }
        Ok(hold)
    }

    fn remember(&self, key: &ScopeKey, hold: Option<Hold>) {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(key.to_string(), (Instant::now(), hold));
    }

    /// Holds `key` for `ms` (0: until released), started by Meta's `code`. Never shortens a hold.
    pub async fn hold(&self, key: &ScopeKey, code: i64, ms: u64) -> Result<Hold, BreakerError> {
        self.call(key, "hold", code, ms).await?.ok_or_else(|| BreakerError::BadReply("hold not recorded".into()))
    }

    /// The hold of `key` now (None: not held), from Redis.
    pub async fn read(&self, key: &ScopeKey) -> Result<Option<Hold>, BreakerError> {
        self.call(key, "read", 0, 0).await
    }

    /// The hold of `key`, trusting this process's read of the last second (the per-message check).
    pub async fn read_cached(&self, key: &ScopeKey) -> Result<Option<Hold>, BreakerError> {
        let cached = {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.get(&key.to_string()).filter(|(at, _)| at.elapsed() < READ_CACHE).map(|(_, h)| *h)
        };
        match cached {
            Some(Some(h)) if h.until_ms > 0 && h.until_ms <= bw_common::time::now_ms() => Ok(None),
            Some(h) => Ok(h),
            None => self.read(key).await,
        }
    }

    /// Ends the hold of `key`; returns the hold that was in force (None: there was none).
    pub async fn release(&self, key: &ScopeKey) -> Result<Option<Hold>, BreakerError> {
        self.call(key, "release", 0, 0).await
    }

    /// Ends the hold of `key` and returns once no process can still trust a read of it from before (twice
    /// [`READ_CACHE`]: a read in flight at the release is remembered just after it). A release must wait for
    /// this before it re-queues the held messages: a dispatcher that still trusted its read would quarantine
    /// them again, and the release would end with them held.
    pub async fn release_everywhere(&self, key: &ScopeKey) -> Result<Option<Hold>, BreakerError> {
        let was = self.release(key).await?;
        tokio::time::sleep(2 * READ_CACHE).await;
        Ok(was)
    }
}

fn parse_reply(value: redis::Value) -> Result<Option<Hold>, BreakerError> {
    let mut reply = crate::scripts::Reply::new(value)?;
    let held = reply.int()?;
    let (code, since_ms, until_ms) = (reply.int()?, reply.int()?, reply.int()?);
    Ok((held == 1).then_some(Hold { code, since_ms, until_ms }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_proto::v1::{TemplatePayload, TextPayload, send_request::Payload};

    fn template(name: &str) -> SendRequest {
        SendRequest {
            waba_id: "100".into(),
            phone_number_id: "200".into(),
            recipient: "+5491155551234".into(),
            payload: Some(Payload::Template(TemplatePayload {
                name: name.into(),
                language: "en_US".into(),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn scope_keys_name_the_template_or_the_code_never_the_recipient() {
        let key = ScopeKey::of(&template("order_update"), 132015, true);
        assert_eq!(key.to_string(), "tpl:100:en_US:order_update");
        assert_eq!(ScopeKey::of(&template("order_update"), 424242, false).to_string(), "code:424242");
        let text = SendRequest {
            payload: Some(Payload::Text(TextPayload { body: "hi".into(), ..Default::default() })),
            ..template("x")
        };
        assert_eq!(ScopeKey::of(&text, 132015, true), ScopeKey::Code(132015));
        assert_eq!(ScopeKey::template_of(&text), None);
        assert!(!key.hold_key().contains("5491155551234"));
        assert_eq!(key.hold_key(), "bw:{qs}:hold:tpl:100:en_US:order_update");
    }

    #[test]
    fn parse_round_trips_and_refuses_anything_else_without_echoing_it() {
        for key in [ScopeKey::of(&template("promo_v2"), 0, true), ScopeKey::Code(424242)] {
            assert_eq!(ScopeKey::parse(&key.to_string()), Ok(key));
        }
        for bad in [
            "+5491155551234",
            "tpl:100:en_US",
            "tpl:abc:en_US:promo",
            "tpl:100:e:promo",
            "tpl:100:en_US:promo code",
            "code:-1",
            "code:+5491155551234",
            "code:",
            "",
        ] {
            let err = ScopeKey::parse(bad).expect_err(bad);
            assert!(!err.contains("5491155551234"), "the error never echoes the input: {err}");
            assert!(err.contains("scope key"), "{err}");
        }
    }
}
