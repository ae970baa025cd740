//! Keys, sessions and CSRF tokens: who is asking, and may they act (the HTTP handlers are in `auth`).
//!
//! Keys mode: keys are configured by their sha256 (hex), never in clear, as the intake's are. A presented key
//! (the sign-in form, or `Authorization: Bearer <key>`) is hashed and compared with every configured hash in
//! constant time without an early exit. Signing in creates a random session id kept in memory (an `HttpOnly`,
//! `SameSite=Strict` cookie); a restart signs everyone out. Proxy mode: the configured header names the user,
//! set by an authenticating reverse proxy; `proxy_operators` get the operator role.
//!
//! CSRF: every state-changing form carries a token derived from a per-process secret and the session (or the
//! proxy user); a POST without the matching token is refused, so another site cannot make a signed-in
//! browser act. `SameSite=Strict` is the second fence.

use crate::config::{AuthConfig, AuthMode, Role};
use axum::http::{HeaderMap, header};
use sha2::Digest;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// The session cookie's name.
pub const COOKIE: &str = "bw_console_session";

/// Someone the console recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key's configured name, the proxy's user, or `anonymous`.
    pub name: String,
    pub role: Role,
    /// Whether they signed in (or came through the proxy): only then may they hold the operator role.
    pub signed_in: bool,
    /// The CSRF token their forms carry (empty for anonymous viewers, who cannot act).
    pub csrf: String,
}

impl Principal {
    pub fn may_act(&self) -> bool {
        self.signed_in && self.role == Role::Operator
    }
}

struct Session {
    name: String,
    role: Role,
    expires: Instant,
}

struct Key {
    name: String,
    hash: [u8; 32],
    role: Role,
}

/// Keys, sessions and the CSRF secret.
pub struct Auth {
    mode: AuthMode,
    viewers_without_key: bool,
    proxy_header: String,
    proxy_operators: Vec<String>,
    ttl: Duration,
    keys: Vec<Key>,
    sessions: Mutex<HashMap<String, Session>>,
    secret: [u8; 32],
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(bytes).into()
}

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

impl Auth {
    pub fn new(cfg: &AuthConfig) -> anyhow::Result<Auth> {
        let mut keys = Vec::new();
        for k in &cfg.keys {
            let bytes = hex::decode(k.sha256.trim()).map_err(|_| anyhow::anyhow!("auth.keys `{}`: not hex", k.name))?;
            let hash: [u8; 32] =
                bytes.try_into().map_err(|_| anyhow::anyhow!("auth.keys `{}`: not a sha256", k.name))?;
            keys.push(Key { name: k.name.clone(), hash, role: k.role });
        }
        if cfg.mode == AuthMode::Keys && keys.is_empty() {
            tracing::warn!("auth.keys is empty: nobody can sign in to the console");
        }
        Ok(Auth {
            mode: cfg.mode,
            viewers_without_key: cfg.viewers_without_key,
            proxy_header: cfg.proxy_user_header.to_ascii_lowercase(),
            proxy_operators: cfg.proxy_operators.clone(),
            ttl: Duration::from_secs(cfg.session_ttl_s),
            keys,
            sessions: Mutex::new(HashMap::new()),
            secret: rand::random(),
        })
    }

    /// The configured key matching `presented`, compared with every key in constant time.
    fn key(&self, presented: &str) -> Option<(String, Role)> {
        let hash = sha256(presented.trim().as_bytes());
        let mut found = None;
        for k in &self.keys {
            if bool::from(k.hash.ct_eq(&hash)) {
                found = Some((k.name.clone(), k.role));
            }
        }
        found
    }

    fn csrf_for(&self, subject: &str) -> String {
        let mut h = sha2::Sha256::new();
        h.update(self.secret);
        h.update(b"|csrf|");
        h.update(subject.as_bytes());
        hex::encode(h.finalize())
    }

    /// Whether `token` is the CSRF token of `p`.
    pub fn csrf_ok(&self, p: &Principal, token: &str) -> bool {
        !p.csrf.is_empty() && bool::from(p.csrf.as_bytes().ct_eq(token.as_bytes()))
    }

    /// Who sent `headers`, or None when the console must ask for a key first.
    pub fn principal(&self, headers: &HeaderMap) -> Option<Principal> {
        let anonymous =
            || Principal { name: "anonymous".into(), role: Role::Viewer, signed_in: false, csrf: String::new() };
        match self.mode {
            AuthMode::Proxy => {
                let user = headers.get(self.proxy_header.as_str()).and_then(|v| v.to_str().ok()).map(str::trim);
                match user.filter(|u| !u.is_empty() && u.len() <= 128 && !u.chars().any(char::is_control)) {
                    Some(u) => Some(Principal {
                        name: u.to_string(),
                        role: if self.proxy_operators.iter().any(|o| o == u) { Role::Operator } else { Role::Viewer },
                        signed_in: true,
                        csrf: self.csrf_for(&format!("proxy:{u}")),
                    }),
                    None if self.viewers_without_key => Some(anonymous()),
                    None => None,
                }
            }
            AuthMode::Keys => {
                if let Some(bearer) = headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                {
                    return self.key(bearer).map(|(name, role)| Principal {
                        csrf: self.csrf_for(&format!("key:{name}")),
                        name,
                        role,
                        signed_in: true,
                    });
                }
                if let Some(id) = cookie(headers, COOKIE) {
                    let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
                    let now = Instant::now();
                    sessions.retain(|_, s| s.expires > now);
                    if let Some(s) = sessions.get(&id) {
                        return Some(Principal {
                            name: s.name.clone(),
                            role: s.role,
                            signed_in: true,
                            csrf: self.csrf_for(&format!("session:{id}")),
                        });
                    }
                }
                self.viewers_without_key.then(anonymous)
            }
        }
    }

    /// Signs in with `presented`: the new session's id.
    pub(crate) fn sign_in(&self, presented: &str) -> Option<String> {
        let (name, role) = self.key(presented)?;
        let id = random_hex();
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.insert(id.clone(), Session { name, role, expires: Instant::now() + self.ttl });
        Some(id)
    }

    pub(crate) fn sign_out(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE) {
            self.sessions.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }
}

/// The value of cookie `name`.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyConfig;

    fn auth(viewers: bool) -> Auth {
        Auth::new(&AuthConfig {
            mode: AuthMode::Keys,
            viewers_without_key: viewers,
            proxy_user_header: "x-forwarded-user".into(),
            proxy_operators: vec![],
            session_ttl_s: 60,
            keys: vec![KeyConfig {
                name: "alice".into(),
                sha256: hex::encode(sha256(b"s3cret-key")),
                role: Role::Operator,
            }],
        })
        .expect("auth")
    }

    #[test]
    fn the_proxy_header_names_the_user_and_its_role() {
        let a = Auth::new(&AuthConfig {
            mode: AuthMode::Proxy,
            viewers_without_key: false,
            proxy_user_header: "X-Forwarded-User".into(),
            proxy_operators: vec!["bob".into()],
            session_ttl_s: 60,
            keys: vec![],
        })
        .expect("auth");
        assert!(a.principal(&HeaderMap::new()).is_none(), "no header, no viewers: refused");
        let as_user = |u: &str| {
            let mut h = HeaderMap::new();
            h.insert("x-forwarded-user", u.parse().expect("header"));
            a.principal(&h).expect("a user")
        };
        let (bob, eve) = (as_user("bob"), as_user("eve"));
        assert!(bob.may_act() && !eve.may_act(), "only proxy_operators act");
        assert_ne!(bob.csrf, eve.csrf, "each user has its own CSRF token");
        assert!(!a.csrf_ok(&bob, &eve.csrf));
    }

    #[test]
    fn keys_sessions_and_csrf() {
        let a = auth(false);
        assert!(a.principal(&HeaderMap::new()).is_none(), "no key, no viewers: ask for one");
        assert!(a.sign_in("wrong").is_none());
        let id = a.sign_in("s3cret-key").expect("signed in");
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, format!("other=1; {COOKIE}={id}").parse().expect("header"));
        let p = a.principal(&h).expect("session");
        assert!(p.may_act());
        assert!(a.csrf_ok(&p, &p.csrf.clone()));
        assert!(!a.csrf_ok(&p, "nope"));
        let anon = auth(true).principal(&HeaderMap::new()).expect("viewer");
        assert!(!anon.may_act());
        assert!(!a.csrf_ok(&anon, ""), "an empty token never passes");
    }
}
