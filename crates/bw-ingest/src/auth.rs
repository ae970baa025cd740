//! Producer API keys of the HTTP intake.
//!
//! Keys are configured by their sha256 (hex), never in clear, each with the senders it may send for: a list of
//! phone_number_ids and/or WABA ids (`"*"` means any). A presented key (`Authorization: Bearer <key>` or
//! `X-Api-Key: <key>`) is hashed and compared with every configured hash in constant time (`subtle`), without
//! an early exit, so timing tells nothing about which key or how much of it matched.
//!
//! Compiled default: `auth = "required"` with no key configured, so the HTTP intake refuses every request
//! (401) until an operator configures one. The local stack, the drill and the tests configure a key.

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
    /// Phone number ids this key may send for (`"*"`: any).
    #[serde(default, deserialize_with = "crate::secret::id_list")]
    pub phone_number_ids: Vec<String>,
    /// WABA ids this key may send for (`"*"`: any of their numbers).
    #[serde(default, deserialize_with = "crate::secret::id_list")]
    pub waba_ids: Vec<String>,
}

impl std::fmt::Debug for ApiKeyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeyConfig")
            .field("sha256", &"<redacted>")
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
    /// A valid key not allowed for the request's sender (403).
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
    phones: Vec<String>,
    wabas: Vec<String>,
}

impl Principal {
    /// True when this key may send for (or read the operations of) this sender.
    pub(crate) fn may_use(&self, waba_id: &str, phone_number_id: &str) -> bool {
        if self.name.is_none() {
            return true;
        }
        let hit = |list: &[String], id: &str| list.iter().any(|x| x == "*" || (!id.is_empty() && x == id));
        hit(&self.phones, phone_number_id) || hit(&self.wabas, waba_id)
    }
}

/// The configured keys.
#[derive(Clone)]
pub(crate) struct Keys {
    mode: AuthMode,
    keys: Vec<Key>,
}

impl Keys {
    /// Checks and loads the configured keys (a precise error names the key, never its hash).
    pub(crate) fn new(mode: AuthMode, configured: &BTreeMap<String, ApiKeyConfig>) -> Result<Keys, String> {
        let mut keys = Vec::new();
        for (name, k) in configured {
            let bytes = hex::decode(k.sha256.trim())
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| format!("intake.api_keys.{name}.sha256 must be 64 hex characters (a sha256)"))?;
            if k.phone_number_ids.is_empty() && k.waba_ids.is_empty() {
                return Err(format!("intake.api_keys.{name} must list phone_number_ids or waba_ids (\"*\" for any)"));
            }
            let ids_ok = |ids: &[String]| ids.iter().all(|i| i == "*" || crate::validate::is_digits(i));
            if !ids_ok(&k.phone_number_ids) || !ids_ok(&k.waba_ids) {
                return Err(format!("intake.api_keys.{name}: ids must be digits or \"*\""));
            }
            keys.push(Key {
                name: name.clone(),
                hash: bytes,
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
            return Ok(Principal { name: None, phones: Vec::new(), wabas: Vec::new() });
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
            Some(k) => Ok(Principal { name: Some(k.name.clone()), phones: k.phones.clone(), wabas: k.wabas.clone() }),
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

    fn keys() -> Keys {
        let mut map = BTreeMap::new();
        map.insert(
            "crm".to_string(),
            ApiKeyConfig { sha256: key_sha256("k-crm"), phone_number_ids: vec!["2002".into()], waba_ids: vec![] },
        );
        map.insert(
            "ops".to_string(),
            ApiKeyConfig { sha256: key_sha256("k-ops"), phone_number_ids: vec![], waba_ids: vec!["1001".into()] },
        );
        Keys::new(AuthMode::Required, &map).expect("valid keys")
    }

    #[test]
    fn keys_authenticate_and_scope() {
        let k = keys();
        assert_eq!(k.authenticate(None).expect_err("missing"), Refusal::MissingKey);
        assert_eq!(k.authenticate(Some("  ")).expect_err("blank"), Refusal::MissingKey);
        assert_eq!(k.authenticate(Some("k-crm2")).expect_err("unknown"), Refusal::UnknownKey);
        let crm = k.authenticate(Some("k-crm")).expect("crm");
        assert_eq!(crm.name.as_deref(), Some("crm"));
        assert!(crm.may_use("9", "2002"));
        assert!(!crm.may_use("1001", "2003"));
        let ops = k.authenticate(Some("k-ops")).expect("ops");
        assert!(ops.may_use("1001", "7777") && !ops.may_use("1002", "2002"));
        let open = Keys::new(AuthMode::Disabled, &BTreeMap::new()).expect("empty");
        assert!(open.authenticate(None).expect("disabled").may_use("1", "2"));
    }

    #[test]
    fn bad_key_config_is_a_precise_error() {
        let mut map = BTreeMap::new();
        map.insert(
            "a".to_string(),
            ApiKeyConfig { sha256: "zz".into(), phone_number_ids: vec!["1".into()], waba_ids: vec![] },
        );
        assert!(Keys::new(AuthMode::Required, &map).err().is_some_and(|e| e.contains("api_keys.a.sha256")));
        map.insert(
            "a".to_string(),
            ApiKeyConfig { sha256: key_sha256("x"), phone_number_ids: vec![], waba_ids: vec![] },
        );
        assert!(Keys::new(AuthMode::Required, &map).err().is_some_and(|e| e.contains("must list")));
    }
}
