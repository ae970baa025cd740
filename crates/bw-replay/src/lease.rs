//! Scope leases in the KV bucket `BW_REPLAY_LEASES`: one replay instance drains a scope at a time, so the
//! per-scope replay rate holds however many instances run. A lease is `<instance>|<expires unix ms>`, taken and
//! renewed with compare-and-set; an instance that dies simply stops renewing and the lease expires.

use async_nats::jetstream::{self, kv};
use bw_common::time::now_ms;
use bw_wire::names::REPLAY_LEASE_BUCKET;

/// Lease handle of one instance.
#[derive(Clone)]
pub struct Leases {
    store: kv::Store,
    instance: String,
    ttl_ms: i64,
}

/// A held lease.
#[derive(Debug, Clone, Copy)]
pub struct Held {
    revision: u64,
    renew_at_ms: i64,
}

impl Held {
    /// Whether it is time to renew.
    pub fn due(&self) -> bool {
        now_ms() >= self.renew_at_ms
    }
}

fn parse(value: &[u8]) -> (String, i64) {
    let text = String::from_utf8_lossy(value);
    match text.rsplit_once('|') {
        Some((holder, expires)) => (holder.to_string(), expires.parse().unwrap_or(0)),
        None => (String::new(), 0),
    }
}

impl Leases {
    /// Opens (creating if needed) the lease bucket, of at most `max_bytes` (one small key per draining scope).
    pub async fn open(
        js: &jetstream::Context,
        instance: String,
        ttl_ms: u64,
        replicas: usize,
        max_bytes: i64,
    ) -> anyhow::Result<Leases> {
        let config = kv::Config {
            bucket: REPLAY_LEASE_BUCKET.to_string(),
            history: 1,
            max_bytes,
            num_replicas: replicas,
            ..Default::default()
        };
        let store = bw_common::nats::open_bucket(js, config).await?;
        Ok(Leases { store, instance, ttl_ms: ttl_ms as i64 })
    }

    fn value(&self, expires_ms: i64) -> bytes::Bytes {
        format!("{}|{expires_ms}", self.instance).into()
    }

    fn held(&self, revision: u64) -> Held {
        Held { revision, renew_at_ms: now_ms() + self.ttl_ms / 3 }
    }

    /// Takes the lease of `scope` if it is free, expired or already ours.
    pub async fn acquire(&self, scope: &str) -> anyhow::Result<Option<Held>> {
        let expires = now_ms() + self.ttl_ms;
        let current = self.store.entry(scope).await.map_err(|e| anyhow::anyhow!("lease read failed: {e}"))?;
        let revision = match current {
            Some(e) if e.operation == kv::Operation::Put => {
                let (holder, until) = parse(&e.value);
                if holder != self.instance && until > now_ms() {
                    return Ok(None);
                }
                self.store.update(scope, self.value(expires), e.revision).await.ok()
            }
            _ => self.store.create(scope, self.value(expires)).await.ok(),
        };
        Ok(revision.map(|r| self.held(r)))
    }

    /// Extends a held lease; None when it was lost (another instance took it after it expired).
    pub async fn renew(&self, scope: &str, held: Held) -> Option<Held> {
        let expires = now_ms() + self.ttl_ms;
        self.store.update(scope, self.value(expires), held.revision).await.ok().map(|r| self.held(r))
    }

    /// Gives a lease back so another instance can take the scope at once.
    pub async fn release(&self, scope: &str, held: Held) {
        let _ = self.store.update(scope, self.value(0), held.revision).await;
    }
}
