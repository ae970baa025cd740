//! Tenants: who may send as which sender, and whose operations are whose.
//!
//! A tenant is one producer (a CRM, a shop, one client business of a Solution Provider). The sender registry
//! (`bw_common::registry`) says which tenant owns each phone number. Every name that separates tenants is built
//! here: the operation key (the idempotency key is (tenant, operation id)), the feed subjects, the reply inbox
//! prefix and the feed consumer name, so the services and the generated NATS permissions agree by construction.
//!
//! Invariant: the tenant [`DEFAULT_TENANT`] keys its operations by the bare operation id (the layout from
//! before tenants existed); every other tenant's key is `<tenant>/<id>`. `/` is not allowed in a producer's
//! operation id, so the two forms never collide.

use serde::Deserialize;

/// The tenant of dev mode, and the owner of ledger entries written before tenants existed.
pub const DEFAULT_TENANT: &str = "default";

/// Separates the tenant from the producer's id in an operation key (never part of a producer's id).
const KEY_SEPARATOR: char = '/';

/// How a service decides who owns a sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TenancyMode {
    /// Senders must be in the registry (`bwctl senders add`); each belongs to one tenant. The compiled default.
    #[default]
    Registry,
    /// Dev mode: one tenant, [`DEFAULT_TENANT`], owns every number; nothing needs registering. For the local
    /// stack and experiments only: any producer may send as any number.
    Dev,
}

/// The `[tenancy]` section shared by ingest, the dispatcher and replay.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TenancyConfig {
    #[serde(default)]
    pub mode: TenancyMode,
}

/// True when `tenant` is 1..=32 characters of `[a-z0-9-]`, starting and ending with a letter or digit: safe as
/// a NATS subject token, a KV key part, a consumer name part and a NATS user name part.
pub fn valid_tenant(tenant: &str) -> bool {
    let b = tenant.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// The ledger key (and the operation id inside Breakwater) of a producer's operation id.
pub fn operation_key(tenant: &str, operation_id: &str) -> String {
    if tenant == DEFAULT_TENANT { operation_id.to_string() } else { format!("{tenant}{KEY_SEPARATOR}{operation_id}") }
}

/// The tenant and the producer's operation id of an operation key ([`operation_key`]'s inverse).
pub fn split_operation_key(key: &str) -> (&str, &str) {
    match key.split_once(KEY_SEPARATOR) {
        Some((tenant, op)) => (tenant, op),
        None => (DEFAULT_TENANT, key),
    }
}

/// True when `id` is a valid operation id: 1..=128 chars of `[A-Za-z0-9_=.-]`, not starting or ending with
/// `.` and without `..` (it is used verbatim as a KV key and a JetStream message id).
pub fn valid_operation_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'=' | b'.' | b'-'))
        && !id.starts_with('.')
        && !id.ends_with('.')
        && !id.contains("..")
}

/// True when `key` is a valid operation key: a valid operation id, or `<valid tenant>/<valid operation id>`.
pub fn valid_operation_key(key: &str) -> bool {
    match key.split_once(KEY_SEPARATOR) {
        Some((tenant, op)) => tenant != DEFAULT_TENANT && valid_tenant(tenant) && valid_operation_id(op),
        None => valid_operation_id(key),
    }
}

/// The inbox prefix of a tenant's NATS connections (`_INBOX_<tenant>`, without the trailing dot, as the
/// clients' `inbox_prefix` options take it). Its users may subscribe only below it.
pub fn inbox_prefix(tenant: &str) -> String {
    format!("_INBOX_{tenant}")
}

/// Whether ingest may publish its reply to `reply` for a request of `tenant`. In registry mode only below the
/// tenant's own inbox prefix; in dev mode below `_INBOX.` or any `_INBOX_<tenant>.`. Never anything else: the
/// requester names the reply subject, and ingest's user may publish to internal subjects (the ledger's KV).
pub fn reply_allowed(mode: TenancyMode, tenant: &str, reply: &str) -> bool {
    let own = format!("{}.", inbox_prefix(tenant));
    let under = |prefix: &str| reply.len() > prefix.len() && reply.starts_with(prefix) && token_safe(reply);
    match mode {
        TenancyMode::Registry => under(&own),
        TenancyMode::Dev => {
            under("_INBOX.")
                || reply
                    .strip_prefix("_INBOX_")
                    .and_then(|rest| rest.split_once('.'))
                    .is_some_and(|(t, tail)| valid_tenant(t) && !tail.is_empty() && token_safe(reply))
        }
    }
}

/// No wildcard, empty token or white space: a literal subject.
fn token_safe(subject: &str) -> bool {
    !subject.contains(['*', '>', ' ', '\t', '\r', '\n']) && !subject.split('.').any(str::is_empty)
}

/// The first token of a refused reply subject, for logs and metrics: the rest may name another tenant's
/// operation or a phone number.
pub fn subject_head(subject: &str) -> &str {
    subject.split('.').next().unwrap_or("")
}

/// The feed subject of one revision of an operation.
pub fn feed_subject(tenant: &str, phone_number_id: &str, operation_id: &str) -> String {
    format!("bw.feed.v1.{tenant}.{phone_number_id}.{operation_id}")
}

/// The feed subject of an operation of the tenant [`DEFAULT_TENANT`] written before tenants existed.
pub fn feed_subject_before_tenants(phone_number_id: &str, operation_id: &str) -> String {
    format!("bw.feed.v1.{phone_number_id}.{operation_id}")
}

/// The feed filter of every operation of a tenant.
pub fn feed_filter(tenant: &str) -> String {
    format!("bw.feed.v1.{tenant}.>")
}

/// The feed filter of one sender of a tenant.
pub fn feed_sender_filter(tenant: &str, phone_number_id: &str) -> String {
    format!("bw.feed.v1.{tenant}.{phone_number_id}.>")
}

/// The one durable consumer on BW_FEED a tenant's NATS user may create and read (NATS permissions match whole
/// tokens only, so the name is fixed per tenant rather than a prefix).
pub fn feed_consumer(tenant: &str) -> String {
    format!("feed-{tenant}")
}

/// The NATS user name of a tenant's producer connections in the generated accounts config.
pub fn nats_user(tenant: &str) -> String {
    format!("producer-{tenant}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids() {
        for ok in ["a", "order-123", "op_1.x=2", &"x".repeat(128)] {
            assert!(valid_operation_id(ok), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "a b", "a/b", "ü", &"x".repeat(129), "a*", "a>"] {
            assert!(!valid_operation_id(bad), "{bad}");
        }
    }

    #[test]
    fn tenants_are_safe_tokens() {
        for ok in ["default", "crm", "shop-42", "a", "0x"] {
            assert!(valid_tenant(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "Crm", "a.b", "a/b", "a*", "a>", "a b", &"x".repeat(33)] {
            assert!(!valid_tenant(bad), "{bad}");
        }
    }

    #[test]
    fn operation_keys_round_trip_and_never_collide() {
        assert_eq!(operation_key(DEFAULT_TENANT, "order-1"), "order-1");
        assert_eq!(operation_key("crm", "order-1"), "crm/order-1");
        assert_ne!(operation_key("crm", "order-1"), operation_key("shop", "order-1"));
        assert_ne!(operation_key("crm", "order-1"), operation_key(DEFAULT_TENANT, "order-1"));
        for (tenant, op) in [("crm", "a.b"), (DEFAULT_TENANT, "x"), ("shop-2", "o=1")] {
            let key = operation_key(tenant, op);
            assert_eq!(split_operation_key(&key), (tenant, op));
            assert!(valid_operation_key(&key), "{key}");
        }
        // A key naming the default tenant explicitly would be a second key for the same operation.
        for bad in ["default/x", "Crm/x", "crm/", "/x", "crm/a/b", "crm/a..b", ""] {
            assert!(!valid_operation_key(bad), "{bad}");
        }
    }

    #[test]
    fn replies_go_only_to_the_requesters_inbox() {
        use TenancyMode::*;
        assert!(reply_allowed(Registry, "crm", "_INBOX_crm.abc.1"));
        for bad in [
            "_INBOX.abc",
            "_INBOX_shop.abc",
            "_INBOX_crm.",
            "_INBOX_crm",
            "_INBOX_crm.a.*",
            "_INBOX_crm.a..b",
            "$KV.BW_LEDGER.op-1",
            "bw.outbox.v1.hi.1",
            "_INBOX_crmx.a",
        ] {
            assert!(!reply_allowed(Registry, "crm", bad), "{bad}");
        }
        assert!(reply_allowed(Dev, DEFAULT_TENANT, "_INBOX.abc.def"));
        assert!(reply_allowed(Dev, DEFAULT_TENANT, "_INBOX_producer-crm.abc"));
        for bad in ["$KV.BW_LEDGER.op-1", "$JS.API.STREAM.DELETE.BW_SEND", "bw.feed.v1.x", "_INBOX.", "_INBOX.>"] {
            assert!(!reply_allowed(Dev, DEFAULT_TENANT, bad), "{bad}");
        }
        assert_eq!(subject_head("$KV.BW_LEDGER.op-1"), "$KV");
    }
}
