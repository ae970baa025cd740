//! Producer API keys of the HTTP intake.
//!
//! Keys are configured by their sha256 (hex), never in clear, each with its tenant: the key acts for that tenant
//! alone, on the numbers the sender registry assigns to it (never on what a request says). A key may be narrowed
//! further to some of the tenant's numbers: phone_number_ids and/or the numbers of WABA ids, as the registry
//! records them (`"*"` or both lists empty: every number of the tenant). A presented key (`Authorization: Bearer
//! <key>` or `X-Api-Key: <key>`) is hashed and compared with every configured hash in constant time (`subtle`), without
//! an early exit, so timing tells nothing about which key or how much of it matched.
//!
//! Compiled default: `auth = "required"` with no key configured, so the HTTP intake refuses every request
//! (401) until an operator configures one. The local stack, the drill and the tests configure a key.

use bw_wire::tenancy::{DEFAULT_TENANT, TenancyMode};
use serde::Deserialize;
use sha2::Digest;
use std::collections::BTreeMap;
use subtle::ConstantTimeEq;

/// Whether the HTTP intake needs a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every request needs a configured key (the compiled default).
    Required,
    /// No key needed, every sender allowed (local experiments only; warned about at start-up).
    Disabled,
}

/// One producer key as configured.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// Hex sha256 of the key (`printf %s "$KEY" | sha256sum`).
    pub sha256: String,
    /// The tenant the key acts for (required with `tenancy.mode = "registry"`; dev mode: `default`).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Narrowing: phone number ids of the tenant this key may use (`"*"`: any).
    #[serde(default, deserialize_with = "crate::secret::id_list")]
    pub phone_number_ids: Vec<String>,
    /// Narrowing: WABA ids whose numbers of the tenant this key may use (`"*"`: any).
    #[serde(default, deserialize_with = "crate::secret::id_list")]
    pub waba_ids: Vec<String>,
}

impl std::fmt::Debug for ApiKeyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeyConfig")
            .field("sha256", &"<redacted>")
            .field("tenant", &self.tenant)
            .field("phone_number_ids", &self.phone_number_ids)
            .field("waba_ids", &self.waba_ids)
            .finish()
    }
}

/// The sha256 hex of a key, as it goes into the config.
pub fn key_sha256(key: &str) -> String {
    hex::encode(sha2::Sha256::digest(key.as_bytes()))
}

#[derive(Clone)]
struct Key {
    name: String,
    hash: [u8; 32],
    tenant: String,
    phones: Vec<String>,
    wabas: Vec<String>,
}

/// Why a request was refused before validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No key presented (401).
    MissingKey,
    /// A key that matches none configured (401).
    UnknownKey,
    /// A valid key whose narrowing leaves out the request's sender, a number of its own tenant (403).
    Forbidden,
}

impl Refusal {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::MissingKey => "missing_key",
            Refusal::UnknownKey => "unknown_key",
            Refusal::Forbidden => "forbidden_sender",
        }
    }
}

/// A key that passed authentication.
#[derive(Debug, Clone)]
pub(crate) struct Principal {
    /// The configured name of the key (`None` when authentication is disabled).
    pub name: Option<String>,
    /// The key's tenant (`None` when authentication is disabled: whoever owns the number).
    tenant: Option<String>,
    phones: Vec<String>,
    wabas: Vec<String>,
}

impl Principal {
    /// The tenant this key acts for (None: authentication disabled).
    pub(crate) fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// True when the key's narrowing lets it use (or read the operations of) a number of its tenant;
    /// `registered_waba` is the number's WABA as the registry records it, never the request's.
    pub(crate) fn narrowed_to(&self, phone_number_id: &str, registered_waba: &str) -> bool {
        if self.name.is_none() || (self.phones.is_empty() && self.wabas.is_empty()) {
            return true;
        }
        let hit = |list: &[String], id: &str| list.iter().any(|x| x == "*" || (!id.is_empty() && x == id));
        hit(&self.phones, phone_number_id) || hit(&self.wabas, registered_waba)
    }
}

/// The configured keys.
#[derive(Clone)]
pub(crate) struct Keys {
    mode: AuthMode,
    keys: Vec<Key>,
}

impl Keys {
    /// Checks and loads the configured keys (a precise error names the key, never its hash). In dev mode every
    /// key acts for the tenant `default`, which owns every number there.
    pub(crate) fn new(
        mode: AuthMode,
        configured: &BTreeMap<String, ApiKeyConfig>,
        tenancy: TenancyMode,
    ) -> Result<Keys, String> {
        let mut keys = Vec::new();
        for (name, k) in configured {
            let bytes = hex::decode(k.sha256.trim())
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| format!("intake.api_keys.{name}.sha256 must be 64 hex characters (a sha256)"))?;
            let tenant = match (k.tenant.as_deref(), tenancy) {
                (Some(t), _) if !bw_wire::tenancy::valid_tenant(t) => {
                    return Err(format!(
                        "intake.api_keys.{name}.tenant must be 1..=32 characters of [a-z0-9-], starting and ending \
                         with a letter or digit"
                    ));
                }
                (_, TenancyMode::Dev) => DEFAULT_TENANT.to_string(),
                (Some(t), TenancyMode::Registry) => t.to_string(),
                (None, TenancyMode::Registry) => {
                    return Err(format!(
                        "intake.api_keys.{name}.tenant is required (tenancy.mode = \"registry\"): the tenant whose \
                         registered numbers the key sends for"
                    ));
                }
            };
            let ids_ok = |ids: &[String]| ids.iter().all(|i| i == "*" || crate::validate::is_digits(i));
            if !ids_ok(&k.phone_number_ids) || !ids_ok(&k.waba_ids) {
                return Err(format!("intake.api_keys.{name}: ids must be digits or \"*\""));
            }
            keys.push(Key {
                name: name.clone(),
                hash: bytes,
                tenant,
                phones: k.phone_number_ids.clone(),
                wabas: k.waba_ids.clone(),
            });
        }
        Ok(Keys { mode, keys })
    }

    pub(crate) fn mode(&self) -> AuthMode {
        self.mode
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Authenticates a presented key (None when absent).
    pub(crate) fn authenticate(&self, presented: Option<&str>) -> Result<Principal, Refusal> {
        if self.mode == AuthMode::Disabled {
            return Ok(Principal { name: None, tenant: None, phones: Vec::new(), wabas: Vec::new() });
        }
        let Some(presented) = presented.map(str::trim).filter(|k| !k.is_empty()) else {
            return Err(Refusal::MissingKey);
        };
        let hash: [u8; 32] = sha2::Sha256::digest(presented.as_bytes()).into();
        let mut found: Option<&Key> = None;
        for key in &self.keys {
            // Every configured key is compared; the match is selected without branching on the bytes.
            let eq: bool = key.hash.ct_eq(&hash).into();
            if eq && found.is_none() {
                found = Some(key);
            }
        }
        match found {
            Some(k) => Ok(Principal {
                name: Some(k.name.clone()),
                tenant: Some(k.tenant.clone()),
                phones: k.phones.clone(),
                wabas: k.wabas.clone(),
            }),
            None => Err(Refusal::UnknownKey),
        }
    }
}

/// The key presented in the headers: `Authorization: Bearer <key>`, else `X-Api-Key`.
pub(crate) fn presented_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sha: &str, tenant: Option<&str>, phones: &[&str], wabas: &[&str]) -> ApiKeyConfig {
        ApiKeyConfig {
            sha256: sha.to_string(),
            tenant: tenant.map(str::to_string),
            phone_number_ids: phones.iter().map(|p| p.to_string()).collect(),
            waba_ids: wabas.iter().map(|w| w.to_string()).collect(),
        }
    }

    fn keys() -> Keys {
        let mut map = BTreeMap::new();
        map.insert("crm".to_string(), key(&key_sha256("k-crm"), Some("crm"), &["2002"], &[]));
        map.insert("ops".to_string(), key(&key_sha256("k-ops"), Some("crm"), &[], &["1001"]));
        map.insert("all".to_string(), key(&key_sha256("k-all"), Some("shop"), &[], &[]));
        Keys::new(AuthMode::Required, &map, TenancyMode::Registry).expect("valid keys")
    }

    #[test]
    fn keys_authenticate_and_narrow_within_their_tenant() {
        let k = keys();
        assert_eq!(k.authenticate(None).expect_err("missing"), Refusal::MissingKey);
        assert_eq!(k.authenticate(Some("  ")).expect_err("blank"), Refusal::MissingKey);
        assert_eq!(k.authenticate(Some("k-crm2")).expect_err("unknown"), Refusal::UnknownKey);
        let crm = k.authenticate(Some("k-crm")).expect("crm");
        assert_eq!((crm.name.as_deref(), crm.tenant()), (Some("crm"), Some("crm")));
        assert!(crm.narrowed_to("2002", "9"));
        assert!(!crm.narrowed_to("2003", "1001"));
        let ops = k.authenticate(Some("k-ops")).expect("ops");
        assert!(ops.narrowed_to("7777", "1001") && !ops.narrowed_to("2002", "1002"));
        let all = k.authenticate(Some("k-all")).expect("all");
        assert_eq!(all.tenant(), Some("shop"));
        assert!(all.narrowed_to("1", "2"), "no narrowing: every number of the tenant");
        let open = Keys::new(AuthMode::Disabled, &BTreeMap::new(), TenancyMode::Registry).expect("empty");
        let anyone = open.authenticate(None).expect("disabled");
        assert!(anyone.narrowed_to("1", "2") && anyone.tenant().is_none());
    }

    #[test]
    fn bad_key_config_is_a_precise_error() {
        let mut map = BTreeMap::new();
        map.insert("a".to_string(), key("zz", Some("crm"), &["1"], &[]));
        let err =
            |map: &BTreeMap<String, ApiKeyConfig>| Keys::new(AuthMode::Required, map, TenancyMode::Registry).err();
        assert!(err(&map).is_some_and(|e| e.contains("api_keys.a.sha256")));
        map.insert("a".to_string(), key(&key_sha256("x"), None, &["1"], &[]));
        assert!(err(&map).is_some_and(|e| e.contains("api_keys.a.tenant is required")), "{:?}", err(&map));
        map.insert("a".to_string(), key(&key_sha256("x"), Some("Not A Tenant"), &[], &[]));
        assert!(err(&map).is_some_and(|e| e.contains("api_keys.a.tenant must be")));
        map.insert("a".to_string(), key(&key_sha256("x"), Some("crm"), &["+1"], &[]));
        assert!(err(&map).is_some_and(|e| e.contains("ids must be digits")));
        // Dev mode: no tenant needed; every key acts for `default`.
        map.insert("a".to_string(), key(&key_sha256("x"), None, &[], &[]));
        let dev = Keys::new(AuthMode::Required, &map, TenancyMode::Dev).expect("dev keys");
        assert_eq!(dev.authenticate(Some("x")).expect("key").tenant(), Some(DEFAULT_TENANT));
    }
}
