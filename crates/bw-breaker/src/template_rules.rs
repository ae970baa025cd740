//! What Meta said of a template beyond its status, and what the dispatcher does with it (meta-cloud-api.md §4.5,
//! `lua/template_rules.lua`): a template Meta moved to MARKETING (`template_category_update`) is sent under
//! marketing rules whatever category its producer gave; a template whose quality is RED
//! (`message_template_quality_update`) has its marketing paced fleet-wide at a few sends per minute until its
//! rating recovers. Keyed by the template's quarantine scope (`tpl:<waba>:<language>:<name>`), never a phone.

use crate::error::{BreakerError, RedisConn, invoke};
use crate::templates::ScopeKey;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

static TEMPLATE_RULES: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../lua/template_rules.lua")));

/// How long a process trusts a read of a template's rules (as [`crate::templates`] trusts a hold's).
const READ_CACHE: Duration = Duration::from_millis(1_000);

/// Meta's category and quality of a template, and the pace of its marketing while RED.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// MARKETING, UTILITY, AUTHENTICATION; empty when Meta said nothing.
    pub category: String,
    /// GREEN, YELLOW, RED, UNKNOWN; empty when Meta said nothing.
    pub quality: String,
    /// Sends per minute of its marketing while RED (0: not paced).
    pub red_per_min: u32,
}

impl Rules {
    /// Meta moved the template to MARKETING: marketing rules apply to every send of it.
    pub fn is_marketing(&self) -> bool {
        self.category == "MARKETING"
    }

    /// Its marketing is paced (quality RED).
    pub fn is_red(&self) -> bool {
        self.quality == "RED" && self.red_per_min > 0
    }
}

type ReadCache = Arc<Mutex<HashMap<String, (Instant, Rules)>>>;

/// Templates' rules over Redis. Cheap to clone.
#[derive(Clone)]
pub struct TemplateRules {
    conn: RedisConn,
    cache: ReadCache,
}

/// Redis key of a template's rules (the quarantine scopes' hash tag).
pub fn rules_key(key: &ScopeKey) -> String {
    format!("bw:{{qs}}:rules:{key}")
}

impl TemplateRules {
    pub fn new(conn: RedisConn) -> TemplateRules {
        TemplateRules { conn, cache: Arc::default() }
    }

    async fn call(&self, key: &ScopeKey, args: &[&str]) -> Result<(Rules, u64), BreakerError> {
        let mut inv = TEMPLATE_RULES.prepare_invoke();
        inv.key(rules_key(key));
        for a in args {
            inv.arg(*a);
        }
        let mut reply = crate::scripts::Reply::new(invoke(&self.conn, &inv).await?)?;
        let rules = Rules {
            category: reply.string()?,
            quality: reply.string()?,
            red_per_min: u32::try_from(reply.int()?.max(0)).unwrap_or(u32::MAX),
        };
        let retry_ms = reply.int()?.max(0) as u64;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(key.to_string(), (Instant::now(), rules.clone()));
        Ok((rules, retry_ms))
    }

    /// Records Meta's category of the template.
    pub async fn set_category(&self, key: &ScopeKey, category: &str) -> Result<Rules, BreakerError> {
        Ok(self.call(key, &["category", category]).await?.0)
    }

    /// Records Meta's quality of the template; while RED its marketing goes at `red_per_min`.
    pub async fn set_quality(&self, key: &ScopeKey, quality: &str, red_per_min: u32) -> Result<Rules, BreakerError> {
        Ok(self.call(key, &["quality", quality, &red_per_min.to_string()]).await?.0)
    }

    /// The template's rules, from Redis.
    pub async fn read(&self, key: &ScopeKey) -> Result<Rules, BreakerError> {
        Ok(self.call(key, &["read"]).await?.0)
    }

    /// The template's rules, trusting this process's read of the last second (the per-message check).
    pub async fn read_cached(&self, key: &ScopeKey) -> Result<Rules, BreakerError> {
        let cached = {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.get(&key.to_string()).filter(|(at, _)| at.elapsed() < READ_CACHE).map(|(_, r)| r.clone())
        };
        match cached {
            Some(r) => Ok(r),
            None => self.read(key).await,
        }
    }

    /// Takes a slot of a RED template's marketing pace: 0 when the send may go now, else the ms to wait.
    pub async fn take(&self, key: &ScopeKey) -> Result<u64, BreakerError> {
        Ok(self.call(key, &["take"]).await?.1)
    }
}
