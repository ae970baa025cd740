//! A lease on one key of a JetStream KV bucket: at most one instance believes it holds it at a time.
//!
//! The bucket's `max_age` is the lease length: the holder rewrites its key (compare-and-set on its revision) more
//! often than that; when it stops (crash, partition), the server drops the entry one lease after the last renewal
//! and the next `create` by another instance wins. Expiry runs on the NATS server's clock, so the instances' wall
//! clocks play no part. A graceful stop deletes the entry, so the next instance takes over at its next attempt.
//!
//! An instance considers itself the holder only until one lease after it *sent* its last successful renewal (a
//! monotonic local deadline, never later than the server's expiry). Users: the coordinator's leadership and the
//! dispatcher's wire-journal partitions.

use async_nats::jetstream::{self, kv};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// What one [`Lease::step`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// This instance took the lease.
    Acquired,
    /// This instance held the lease and lost it (another took it, or it could not be renewed in time).
    Lost,
    /// Nothing changed.
    Same,
}

#[derive(Debug, Default)]
struct Held {
    revision: u64,
    valid_until: Option<Instant>,
}

/// One instance's handle on the lease `key` in `store`.
pub struct Lease {
    store: kv::Store,
    key: String,
    instance: String,
    lease: Duration,
    held: Mutex<Option<Held>>,
}

fn lock(m: &Mutex<Option<Held>>) -> std::sync::MutexGuard<'_, Option<Held>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Opens (creating if needed) a lease bucket whose `max_age` is `lease`; an existing bucket with another `max_age`
/// or `max_bytes` is updated, so a changed lease length applies.
pub async fn open_bucket(
    js: &jetstream::Context,
    bucket: &str,
    description: &str,
    lease: Duration,
    replicas: usize,
    max_bytes: i64,
) -> anyhow::Result<kv::Store> {
    let config = kv::Config {
        bucket: bucket.to_string(),
        description: description.to_string(),
        history: 1,
        max_age: lease,
        max_bytes,
        num_replicas: replicas.max(1),
        ..Default::default()
    };
    let store = crate::nats::open_bucket(js, config).await?;
    // A bucket created with another lease length (or none of a byte limit) keeps them until updated.
    let info = store.stream.cached_info();
    if info.config.max_age != lease || info.config.max_bytes != max_bytes {
        let mut cfg = info.config.clone();
        cfg.max_age = lease;
        cfg.max_bytes = max_bytes;
        cfg.duplicate_window = lease.min(cfg.duplicate_window.max(Duration::from_millis(100)));
        if let Err(e) = js.update_stream(cfg).await {
            tracing::warn!(%bucket, error = %e, "cannot update the lease length of a lease bucket");
        }
    }
    Ok(store)
}

impl Lease {
    /// A handle on `key` in `store` (a bucket from [`open_bucket`] with the same `lease`); nothing is written yet.
    pub fn new(store: kv::Store, key: impl Into<String>, instance: String, lease: Duration) -> Lease {
        Lease { store, key: key.into(), instance, lease, held: Mutex::new(None) }
    }

    /// This instance's id (the value it writes under its key).
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The key this lease is on.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether this instance holds the lease now (its local deadline has not passed).
    pub fn is_held(&self) -> bool {
        self.valid_until().is_some_and(|until| Instant::now() < until)
    }

    /// The local deadline of the holding, when held.
    pub fn valid_until(&self) -> Option<Instant> {
        lock(&self.held).as_ref().and_then(|h| h.valid_until)
    }

    /// The KV revision of the holding: it grows at every take-over, so it serves as the holder's epoch.
    pub fn revision(&self) -> Option<u64> {
        lock(&self.held).as_ref().map(|h| h.revision)
    }

    /// The instance id holding the lease, as NATS has it.
    pub async fn holder(&self) -> Option<String> {
        match self.store.entry(&self.key).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put => Some(String::from_utf8_lossy(&e.value).into_owned()),
            _ => None,
        }
    }

    /// Renews the lease when held, else tries to take it. Call several times per lease length.
    pub async fn step(&self) -> Change {
        let sent = Instant::now();
        let revision = lock(&self.held).as_ref().map(|h| h.revision);
        match revision {
            Some(revision) => match self.store.update(&self.key, self.instance.clone().into(), revision).await {
                Ok(revision) => {
                    *lock(&self.held) = Some(Held { revision, valid_until: Some(sent + self.lease) });
                    Change::Same
                }
                Err(e) => {
                    // Unsure whether the renewal landed: keep acting until the local deadline only, then try
                    // to take the lease again (it may still be ours, see `acquire`).
                    let still_valid = self.is_held();
                    tracing::warn!(key = %self.key, error = %e, still_valid, "lease renewal failed");
                    if still_valid {
                        match self.adopt().await {
                            Some(revision) => {
                                let mut held = lock(&self.held);
                                if let Some(h) = held.as_mut() {
                                    h.revision = revision;
                                }
                                Change::Same
                            }
                            None if self.holder().await.is_some_and(|h| h != self.instance) => {
                                *lock(&self.held) = None;
                                Change::Lost
                            }
                            None => Change::Same,
                        }
                    } else {
                        *lock(&self.held) = None;
                        Change::Lost
                    }
                }
            },
            None => match self.acquire(sent).await {
                true => Change::Acquired,
                false => Change::Same,
            },
        }
    }

    /// Drops the holding locally (a fenced write failed: another instance has taken over).
    pub fn forget(&self) {
        *lock(&self.held) = None;
    }

    /// The revision of the lease entry when it names this instance.
    async fn adopt(&self) -> Option<u64> {
        match self.store.entry(&self.key).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put && e.value.as_ref() == self.instance.as_bytes() => {
                Some(e.revision)
            }
            _ => None,
        }
    }

    async fn acquire(&self, sent: Instant) -> bool {
        let revision = match self.store.create(&self.key, self.instance.clone().into()).await {
            Ok(revision) => Some(revision),
            // Still ours from before (a renewal whose answer was lost): renew it under its current revision.
            Err(_) => match self.adopt().await {
                Some(revision) => self.store.update(&self.key, self.instance.clone().into(), revision).await.ok(),
                None => None,
            },
        };
        match revision {
            Some(revision) => {
                *lock(&self.held) = Some(Held { revision, valid_until: Some(sent + self.lease) });
                true
            }
            None => false,
        }
    }

    /// Gives the lease back (graceful stop) so another instance takes over at its next attempt.
    pub async fn release(&self) {
        let revision = lock(&self.held).take().map(|h| h.revision);
        if let Some(revision) = revision
            && let Err(e) = self.store.delete_expect_revision(&self.key, Some(revision)).await
        {
            tracing::warn!(key = %self.key, error = %e, "cannot release a lease; it expires by itself");
        }
    }
}
