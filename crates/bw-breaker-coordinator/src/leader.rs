//! Leadership of the coordinator fleet: one lease in the JetStream KV bucket [`COORDINATOR_LEADER_BUCKET`].
//!
//! Any number of coordinators may run. Exactly one of them, the holder of the lease, runs the loops that
//! write: cooldown ticks, BW_SCOPES snapshots and the per-scope config hashes in Redis. The others serve the
//! admin API (whose breaker actions go through the same Lua scripts, so they are safe on any instance), count
//! the transition events they receive, learn scopes, and try to take the lease.
//!
//! The lease is the key [`COORDINATOR_LEADER_KEY`] in a bucket whose `max_age` is the lease length: the holder
//! rewrites it (compare-and-set on its revision) every `leader_renew_ms`; when it stops (crash, partition), the server
//! drops the entry `leader_lease_ms` after the last renewal and the next `create` by another instance wins.
//! Expiry runs on the NATS server's clock, so the instances' wall clocks play no part. A graceful stop
//! deletes the entry, so the next instance takes over at its next attempt.
//!
//! An instance considers itself the leader only until `leader_lease_ms` after it *sent* its last successful
//! renewal (a monotonic local deadline, never later than the server's expiry), so two instances acting at once
//! needs a process stalled past that deadline in the middle of a write. Even then nothing is applied twice:
//! every breaker transition is decided inside a Lua script on the Redis state (`tick_scope.lua` moves an OPEN
//! scope only once), and snapshots and config hashes are whole-value rewrites the next leader repeats.

use async_nats::jetstream::{self, kv};
use bw_wire::names::{COORDINATOR_LEADER_BUCKET, COORDINATOR_LEADER_KEY};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// What one [`Leadership::step`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
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

/// The lease handle of one coordinator instance.
pub(crate) struct Leadership {
    store: kv::Store,
    instance: String,
    lease: Duration,
    held: Mutex<Option<Held>>,
}

fn lock(m: &Mutex<Option<Held>>) -> std::sync::MutexGuard<'_, Option<Held>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Leadership {
    /// Opens (creating if needed) the lease bucket; an existing bucket with another `max_age` or `max_bytes` is
    /// updated to `lease` and `max_bytes`, so a changed `leader_lease_ms` applies.
    pub(crate) async fn open(
        js: &jetstream::Context,
        instance: String,
        lease: Duration,
        replicas: usize,
        max_bytes: i64,
    ) -> anyhow::Result<Leadership> {
        let config = kv::Config {
            bucket: COORDINATOR_LEADER_BUCKET.to_string(),
            description: "breaker-coordinator leader lease".to_string(),
            history: 1,
            max_age: lease,
            max_bytes,
            num_replicas: replicas.max(1),
            ..Default::default()
        };
        let store = bw_common::nats::open_bucket(js, config).await?;
        // A bucket created with another lease length (or none of a byte limit) keeps them until updated.
        let info = store.stream.cached_info();
        if info.config.max_age != lease || info.config.max_bytes != max_bytes {
            let mut cfg = info.config.clone();
            cfg.max_age = lease;
            cfg.max_bytes = max_bytes;
            cfg.duplicate_window = lease.min(cfg.duplicate_window.max(Duration::from_millis(100)));
            if let Err(e) = js.update_stream(cfg).await {
                tracing::warn!(error = %e, "cannot update the lease length of the leader bucket");
            }
        }
        Ok(Leadership { store, instance, lease, held: Mutex::new(None) })
    }

    /// This instance's id (the value it writes under [`COORDINATOR_LEADER_KEY`]).
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// Whether this instance holds the lease now (its local deadline has not passed).
    pub(crate) fn is_leader(&self) -> bool {
        lock(&self.held).as_ref().and_then(|h| h.valid_until).is_some_and(|until| Instant::now() < until)
    }

    /// The instance id holding the lease, as NATS has it.
    pub(crate) async fn holder(&self) -> Option<String> {
        match self.store.entry(COORDINATOR_LEADER_KEY).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put => Some(String::from_utf8_lossy(&e.value).into_owned()),
            _ => None,
        }
    }

    /// Renews the lease when held, else tries to take it. Call every `leader_renew_ms`.
    pub(crate) async fn step(&self) -> Change {
        let sent = Instant::now();
        let revision = lock(&self.held).as_ref().map(|h| h.revision);
        match revision {
            Some(revision) => {
                match self.store.update(COORDINATOR_LEADER_KEY, self.instance.clone().into(), revision).await {
                    Ok(revision) => {
                        *lock(&self.held) = Some(Held { revision, valid_until: Some(sent + self.lease) });
                        Change::Same
                    }
                    Err(e) => {
                        // Unsure whether the renewal landed: keep acting until the local deadline only, then try
                        // to take the lease again (it may still be ours, see `acquire`).
                        let still_valid = self.is_leader();
                        tracing::warn!(error = %e, still_valid, "coordinator lease renewal failed");
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
                }
            }
            None => match self.acquire(sent).await {
                true => Change::Acquired,
                false => Change::Same,
            },
        }
    }

    /// The revision of the lease entry when it names this instance.
    async fn adopt(&self) -> Option<u64> {
        match self.store.entry(COORDINATOR_LEADER_KEY).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put && e.value.as_ref() == self.instance.as_bytes() => {
                Some(e.revision)
            }
            _ => None,
        }
    }

    async fn acquire(&self, sent: Instant) -> bool {
        let revision = match self.store.create(COORDINATOR_LEADER_KEY, self.instance.clone().into()).await {
            Ok(revision) => Some(revision),
            // Still ours from before (a renewal whose answer was lost): renew it under its current revision.
            Err(_) => match self.adopt().await {
                Some(revision) => {
                    self.store.update(COORDINATOR_LEADER_KEY, self.instance.clone().into(), revision).await.ok()
                }
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
    pub(crate) async fn release(&self) {
        let revision = lock(&self.held).take().map(|h| h.revision);
        if let Some(revision) = revision
            && let Err(e) = self.store.delete_expect_revision(COORDINATOR_LEADER_KEY, Some(revision)).await
        {
            tracing::warn!(error = %e, "cannot release the coordinator lease; it expires by itself");
        }
    }
}
