//! Leadership of the coordinator fleet: one lease in the JetStream KV bucket [`COORDINATOR_LEADER_BUCKET`].
//!
//! Any number of coordinators may run. Exactly one of them, the holder of the lease, runs the loops that
//! write: cooldown ticks, BW_SCOPES snapshots and the per-scope config hashes in Redis. The others serve the
//! admin API (whose breaker actions go through the same Lua scripts, so they are safe on any instance), count
//! the transition events they receive, learn scopes, and try to take the lease.
//!
//! The lease is the key [`COORDINATOR_LEADER_KEY`], held through [`bw_common::lease::Lease`] (renewed every
//! `leader_renew_ms`, expiring `leader_lease_ms` after the last renewal on the NATS server's clock).
//!
//! An instance considers itself the leader only until `leader_lease_ms` after it *sent* its last successful
//! renewal (a monotonic local deadline, never later than the server's expiry), so two instances acting at once
//! needs a process stalled past that deadline in the middle of a write. Even then nothing is applied twice:
//! every breaker transition is decided inside a Lua script on the Redis state (`tick_scope.lua` moves an OPEN
//! scope only once), and snapshots and config hashes are whole-value rewrites the next leader repeats.

use async_nats::jetstream;
use bw_wire::names::{COORDINATOR_LEADER_BUCKET, COORDINATOR_LEADER_KEY};
use std::time::Duration;

pub(crate) use bw_common::lease::{Change, Lease as Leadership};

/// Opens (creating if needed) the leader bucket, its `max_age` the lease length, and this instance's handle.
pub(crate) async fn open(
    js: &jetstream::Context,
    instance: String,
    lease: Duration,
    replicas: usize,
    max_bytes: i64,
) -> anyhow::Result<Leadership> {
    let store = bw_common::lease::open_bucket(
        js,
        COORDINATOR_LEADER_BUCKET,
        "breaker-coordinator leader lease",
        lease,
        replicas,
        max_bytes,
    )
    .await?;
    Ok(Leadership::new(store, COORDINATOR_LEADER_KEY, instance, lease))
}
