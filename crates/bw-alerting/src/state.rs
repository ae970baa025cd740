//! Alert states in the KV bucket [`STATE_BUCKET`], changed only by compare-and-set.
//!
//! This is what makes firing and resolving idempotent across any number of instances: for one dedup key,
//! exactly one instance wins each create/update, and only the winner notifies. Resolved alerts stay as
//! tombstones (with `resolved_at`), so a late or redelivered event older than the resolution is ignored.

use crate::model::{AlertStateExt as _, Firing, STATE_BUCKET, dedup_key};
use async_nats::jetstream::{self, kv};
use bw_proto::v1::AlertState;
use bw_proto::v1::{Alert, AlertStatus, Severity};
use futures::TryStreamExt;
use prost::Message;
use std::time::Duration;

/// What a state operation changed (the winner of the CAS gets a change to notify).
#[derive(Debug, Clone)]
pub(crate) enum Change {
    Fired(AlertState),
    Escalated(AlertState),
    Resolved(AlertState),
    Unchanged,
}

/// Why a state operation failed (after retrying CAS conflicts).
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    #[error("alert state `{key}` unavailable: {detail}")]
    Unavailable { key: String, detail: String },
}

/// Handle to the alert state bucket.
#[derive(Clone)]
pub(crate) struct StateStore {
    kv: kv::Store,
}

const CAS_TRIES: usize = 8;

impl StateStore {
    /// Opens (creating if missing) the state bucket, of at most `max_bytes`.
    pub(crate) async fn open(
        js: &jetstream::Context,
        replicas: usize,
        ttl: Duration,
        max_bytes: i64,
    ) -> anyhow::Result<StateStore> {
        let config = kv::Config {
            bucket: STATE_BUCKET.to_string(),
            history: 1,
            max_age: ttl,
            max_bytes,
            storage: jetstream::stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        let kv = bw_common::nats::open_bucket(js, config).await?;
        Ok(StateStore { kv })
    }

    async fn read(&self, key: &str) -> Result<Option<(AlertState, u64)>, StateError> {
        let entry =
            self.kv.entry(key).await.map_err(|e| StateError::Unavailable { key: key.into(), detail: e.to_string() })?;
        Ok(match entry {
            Some(e) if e.operation == kv::Operation::Put => {
                // An undecodable value is overwritten by the next CAS rather than blocking the key forever.
                let state = AlertState::decode(e.value).unwrap_or_default();
                Some((state, e.revision))
            }
            Some(e) => Some((AlertState::default(), e.revision)),
            None => None,
        })
    }

    async fn write(&self, key: &str, state: &AlertState, revision: Option<u64>) -> bool {
        let value = bytes::Bytes::from(state.encode_to_vec());
        match revision {
            None => self.kv.create(key, value).await.is_ok(),
            Some(rev) => self.kv.update(key, value, rev).await.is_ok(),
        }
    }

    /// Fires `f` unless it is already firing (then escalates when `f` is more severe, and refreshes
    /// `last_seen` at most every `touch_every_ms`), or unless it was resolved after `f` happened.
    pub(crate) async fn fire(
        &self,
        f: &Firing,
        individual: &(dyn Fn() -> bool + Send + Sync),
        runbook_url: &str,
        now_ms: i64,
        touch_every_ms: i64,
    ) -> Result<Change, StateError> {
        let key = dedup_key(f.rule, &f.target);
        for _ in 0..CAS_TRIES {
            let current = self.read(&key).await?;
            let (next, revision, change) = match current {
                Some((state, rev)) if state.is_firing() => {
                    let mut next = state.clone();
                    let alert = next.alert.get_or_insert_with(Alert::default);
                    if f.severity as i32 > state.severity() as i32 {
                        alert.severity = f.severity as i32;
                        alert.summary = f.summary.clone();
                        merge_labels(alert, &f.labels);
                        next.last_seen_unix_ms = now_ms;
                        (next.clone(), Some(rev), Change::Escalated(next))
                    } else if now_ms - state.last_seen_unix_ms >= touch_every_ms {
                        next.last_seen_unix_ms = now_ms;
                        (next, Some(rev), Change::Unchanged)
                    } else {
                        return Ok(Change::Unchanged);
                    }
                }
                Some((state, rev)) => {
                    let resolved_at = state.alert.as_ref().map(|a| a.resolved_at_unix_ms).unwrap_or(0);
                    if state.alert.is_some() && f.at_unix_ms <= resolved_at {
                        return Ok(Change::Unchanged);
                    }
                    let next = new_state(f, &key, individual(), runbook_url, now_ms);
                    (next.clone(), Some(rev), Change::Fired(next))
                }
                None => {
                    let next = new_state(f, &key, individual(), runbook_url, now_ms);
                    (next.clone(), None, Change::Fired(next))
                }
            };
            if self.write(&key, &next, revision).await {
                return Ok(change);
            }
        }
        Err(StateError::Unavailable { key, detail: "too many concurrent updates".into() })
    }

    /// Raises a firing alert to `severity` (no-op if not firing or already at least that severe).
    pub(crate) async fn escalate(&self, key: &str, severity: Severity, summary: &str) -> Result<Change, StateError> {
        for _ in 0..CAS_TRIES {
            let Some((state, rev)) = self.read(key).await? else {
                return Ok(Change::Unchanged);
            };
            if !state.is_firing() || state.severity() as i32 >= severity as i32 {
                return Ok(Change::Unchanged);
            }
            let mut next = state;
            if let Some(alert) = next.alert.as_mut() {
                alert.severity = severity as i32;
                alert.summary = summary.to_string();
            }
            if self.write(key, &next, Some(rev)).await {
                return Ok(Change::Escalated(next));
            }
        }
        Err(StateError::Unavailable { key: key.into(), detail: "too many concurrent updates".into() })
    }

    /// Resolves `key` as of `at_ms`. A resolution older than the firing is stale and ignored. With
    /// `tombstone_if_missing`, a resolution of an unknown key is remembered so an older firing event that
    /// arrives later (another instance, redelivery) does not fire.
    pub(crate) async fn resolve(
        &self,
        key: &str,
        at_ms: i64,
        tombstone_if_missing: bool,
    ) -> Result<Change, StateError> {
        for _ in 0..CAS_TRIES {
            let (next, revision, change) = match self.read(key).await? {
                Some((state, rev)) if state.is_firing() => {
                    let mut next = state;
                    let alert = next.alert.get_or_insert_with(Alert::default);
                    if at_ms < alert.started_at_unix_ms {
                        return Ok(Change::Unchanged);
                    }
                    alert.status = AlertStatus::Resolved as i32;
                    alert.resolved_at_unix_ms = at_ms;
                    (next.clone(), Some(rev), Change::Resolved(next))
                }
                Some((state, rev)) => {
                    let resolved_at = state.alert.as_ref().map(|a| a.resolved_at_unix_ms).unwrap_or(0);
                    if !tombstone_if_missing || at_ms <= resolved_at {
                        return Ok(Change::Unchanged);
                    }
                    (tombstone(key, at_ms), Some(rev), Change::Unchanged)
                }
                None if tombstone_if_missing => (tombstone(key, at_ms), None, Change::Unchanged),
                None => return Ok(Change::Unchanged),
            };
            if self.write(key, &next, revision).await {
                return Ok(change);
            }
        }
        Err(StateError::Unavailable { key: key.into(), detail: "too many concurrent updates".into() })
    }

    /// Every state in the bucket (firing and resolved), for the periodic checks.
    pub(crate) async fn all(&self) -> Result<Vec<(String, AlertState)>, StateError> {
        let unavailable = |e: String| StateError::Unavailable { key: "*".into(), detail: e };
        let keys: Vec<String> = match self.kv.keys().await {
            Ok(keys) => keys.try_collect().await.map_err(|e| unavailable(e.to_string()))?,
            Err(e) => return Err(unavailable(e.to_string())),
        };
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some((state, _)) = self.read(&key).await?
                && state.alert.is_some()
            {
                out.push((key, state));
            }
        }
        Ok(out)
    }
}

fn merge_labels(alert: &mut Alert, labels: &[(String, String)]) {
    for (k, v) in labels {
        alert.labels.insert(k.clone(), v.clone());
    }
}

fn new_state(f: &Firing, key: &str, individual: bool, runbook_url: &str, now_ms: i64) -> AlertState {
    let mut alert = Alert {
        dedup_key: key.to_string(),
        rule: f.rule.name().to_string(),
        severity: f.severity as i32,
        status: AlertStatus::Firing as i32,
        scope: f.scope.clone(),
        summary: f.summary.clone(),
        runbook_url: runbook_url.to_string(),
        started_at_unix_ms: f.at_unix_ms,
        resolved_at_unix_ms: 0,
        labels: Default::default(),
    };
    merge_labels(&mut alert, &f.labels);
    AlertState { alert: Some(alert), last_seen_unix_ms: now_ms, individual }
}

fn tombstone(key: &str, at_ms: i64) -> AlertState {
    AlertState {
        alert: Some(Alert {
            dedup_key: key.to_string(),
            status: AlertStatus::Resolved as i32,
            resolved_at_unix_ms: at_ms,
            ..Default::default()
        }),
        last_seen_unix_ms: 0,
        individual: false,
    }
}
