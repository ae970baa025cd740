//! `bwctl ledger migrate-tenants`: ledger entries written before tenants existed move under their tenant's
//! operation key.
//!
//! Before tenants the ledger key was the bare operation id. The idempotency key is now (tenant, operation id)
//! (`bw_wire::tenancy::operation_key`): the bare id for the tenant `default`, `<tenant>/<id>` for the others.
//! An old entry whose sender the registry assigns to another tenant would not be found by that tenant's status
//! query, and a retry of its id would be accepted as new. [`migrate_tenants`] moves each such entry:
//!
//! 1. Refuses, changing nothing, while BW_SEND, BW_DLQ (every partition), BW_UNKNOWN or BW_QUARANTINE holds any
//!    message of an affected sender: those messages carry the old id and would find no entry after the move.
//!    Let them drain (or replay / purge them) first.
//! 2. Per entry: the entry is written under the new key (a compare-and-set that keeps the more advanced state
//!    when an earlier, interrupted run already wrote it), the wamid links naming the old id are re-pointed, then
//!    the old key is deleted only at the revision that was copied. A status webhook that changed the old entry
//!    in between makes the delete fail, and the entry is copied again.
//!
//! Entries of senders owned by `default`, of unregistered senders, and keys already carrying a tenant are left
//! alone, so the command is safe to run again at any time. Run it once every affected sender is registered,
//! best with ingest stopped or the affected producers paused: a status for a moved operation that names the old
//! id in its callback data finds the entry through the re-pointed wamid link only.

use crate::OpsError;
use crate::scan::subject_counts;
use async_nats::jetstream::{self, kv};
use bw_common::ledger::{Ledger, LedgerError};
use bw_common::nats::Buckets;
use bw_common::registry::{Registry, RegistryError};
use bw_wire::names;
use bw_wire::tenancy;
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What a migration did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// Entries moved to a tenant key, per tenant.
    pub moved: BTreeMap<String, u64>,
    /// Wamid links re-pointed to a moved entry.
    pub links: u64,
    /// Bare-key entries of senders owned by `default`: their key is already right.
    pub default_tenant: u64,
    /// Bare-key entries of senders not in the registry: left alone (register the sender and run again).
    pub unregistered: u64,
    /// Entries already under a tenant key.
    pub keyed: u64,
    /// Entries that could not be decoded, left alone (`bwctl op <id>` shows them).
    pub corrupt: Vec<String>,
}

impl Migrated {
    /// Entries moved in all.
    pub fn moved_total(&self) -> u64 {
        self.moved.values().sum()
    }
}

/// Why a migration did not run (nothing changed) or stopped (run it again).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(
        "{stream} holds {messages} message(s) of sender {phone} (tenant `{tenant}`), which carry operation ids \
         from before tenants: let them drain (BW_SEND), be replayed or purged (bwctl dlq / quarantine), or be \
         resolved (BW_UNKNOWN), then run this again; nothing was changed"
    )]
    Busy { stream: String, phone: String, tenant: String, messages: u64 },
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Ops(#[from] OpsError),
    #[error("ledger entry `{0}` kept changing while it was moved; run this again")]
    Contended(String),
}

/// One entry to move.
struct Move {
    old: String,
    new: String,
    tenant: String,
}

/// Moves every bare-key ledger entry of a sender owned by a tenant other than `default` to its tenant key
/// (module docs). `buckets` are the deployment's (every ledger, wamid and send partition).
pub async fn migrate_tenants(
    js: &jetstream::Context,
    buckets: &Buckets,
    registry: &Registry,
) -> Result<Migrated, MigrateError> {
    let owners: HashMap<String, String> =
        registry.list().await?.into_iter().map(|r| (r.phone_number_id, r.tenant)).collect();
    let ledger = Ledger::new(buckets);
    let mut report = Migrated::default();
    let mut moves = Vec::new();
    let mut affected: BTreeMap<String, String> = BTreeMap::new();
    let mut ids = ledger.operation_ids().await?;
    ids.sort();
    for id in ids {
        if id.contains('/') {
            report.keyed += 1;
            continue;
        }
        let entry = match ledger.get(&id).await {
            Ok(Some(v)) => v.entry,
            Ok(None) => continue,
            Err(LedgerError::Corrupt(_)) => {
                report.corrupt.push(id);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        match owners.get(&entry.phone_number_id) {
            None => report.unregistered += 1,
            Some(tenant) if tenant == tenancy::DEFAULT_TENANT => report.default_tenant += 1,
            Some(tenant) => {
                affected.insert(entry.phone_number_id.clone(), tenant.clone());
                moves.push(Move { new: tenancy::operation_key(tenant, &id), old: id, tenant: tenant.clone() });
            }
        }
    }
    if moves.is_empty() {
        return Ok(report);
    }
    refuse_while_busy(js, buckets, &affected).await?;
    let links = links_to(buckets, moves.iter().map(|m| m.old.as_str()).collect()).await?;
    for m in &moves {
        let targets = links.get(m.old.as_str()).map(Vec::as_slice).unwrap_or_default();
        if move_entry(&ledger, buckets, m, targets, &mut report.links).await? {
            *report.moved.entry(m.tenant.clone()).or_default() += 1;
        }
    }
    Ok(report)
}

/// Refuses while a work stream holds a message of an affected sender (the last token of every subject of
/// these streams is the sender).
async fn refuse_while_busy(
    js: &jetstream::Context,
    buckets: &Buckets,
    affected: &BTreeMap<String, String>,
) -> Result<(), MigrateError> {
    let mut streams: Vec<String> = buckets.send.streams().collect();
    streams.extend(buckets.send.dlq_streams());
    streams.extend([names::UNKNOWN_STREAM.to_string(), names::QUARANTINE_STREAM.to_string()]);
    for stream in streams {
        for (subject, messages) in subject_counts(js, &stream, ">").await? {
            let phone = subject.rsplit('.').next().unwrap_or_default();
            if messages > 0
                && let Some(tenant) = affected.get(phone)
            {
                return Err(MigrateError::Busy { stream, phone: phone.to_string(), tenant: tenant.clone(), messages });
            }
        }
    }
    Ok(())
}

/// The wamid links (partition, link key) naming each of `ops`: one pass over every link bucket.
async fn links_to<'a>(
    buckets: &Buckets,
    ops: BTreeSet<&'a str>,
) -> Result<HashMap<&'a str, Vec<(usize, String)>>, OpsError> {
    let mut out: HashMap<&str, Vec<(usize, String)>> = HashMap::new();
    for (partition, store) in buckets.wamid.iter().enumerate() {
        let mut keys = store.keys().await.map_err(|e| OpsError::nats(&store.name, e))?;
        let mut all = Vec::new();
        while let Some(key) = keys.next().await {
            all.push(key.map_err(|e| OpsError::nats(&store.name, e))?);
        }
        for key in all {
            let Some(value) = store.get(&key).await.map_err(|e| OpsError::nats(&store.name, e))? else { continue };
            if let Some(op) = ops.get(String::from_utf8_lossy(&value).as_ref()) {
                out.entry(op).or_default().push((partition, key));
            }
        }
    }
    Ok(out)
}

/// Moves one entry (module docs, step 2); false when its old key was already gone (an earlier run moved it).
async fn move_entry(
    ledger: &Ledger,
    buckets: &Buckets,
    m: &Move,
    links: &[(usize, String)],
    relinked: &mut u64,
) -> Result<bool, MigrateError> {
    let old_store = &buckets.ledger[names::ledger_partition(&m.old, buckets.ledger.len())];
    for _ in 0..16 {
        let Some(old) = ledger.get(&m.old).await? else { return Ok(false) };
        let mut copy = old.entry.clone();
        copy.operation_id = m.new.clone();
        // A state the new key already holds beyond the old one (an interrupted run, then a status through the
        // re-pointed link) is kept: the ledger's transitions only move forward.
        ledger.update(&m.new, |_| Some(copy.clone())).await?;
        for (partition, key) in links {
            let store = &buckets.wamid[*partition];
            let entry = store.entry(key.as_str()).await.map_err(|e| OpsError::nats(&store.name, e))?;
            if let Some(e) = entry.filter(|e| e.operation == kv::Operation::Put && e.value.as_ref() == m.old.as_bytes())
            {
                // At the revision read: a link written meanwhile is not overwritten.
                if store.update(key.as_str(), m.new.clone().into(), e.revision).await.is_ok() {
                    *relinked += 1;
                }
            }
        }
        match old_store.delete_expect_revision(m.old.as_str(), Some(old.revision)).await {
            Ok(()) => {
                tracing::info!(from = %m.old, to = %m.new, "ledger entry moved to its tenant key");
                return Ok(true);
            }
            // Changed since it was read: copy it again.
            Err(e) if e.kind() == kv::DeleteErrorKind::WrongLastRevision => {}
            Err(e) => return Err(OpsError::nats(&old_store.name, e).into()),
        }
    }
    Err(MigrateError::Contended(m.old.clone()))
}
