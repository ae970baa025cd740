//! Breakwater breaker-coordinator: the authority for per-scope breaker and rate-limit config, and the keeper of
//! every scope's current state.
//!
//! It writes each scope's config hash into Redis (from its config or a hot-reloaded limits file), ticks every
//! known scope so an OPEN breaker moves to HALF_OPEN when its cooldown ends even without traffic, keeps the
//! current `ScopeSnapshot` of every scope in the KV bucket BW_SCOPES (with every pause that holds the scope: its
//! number's own, its WABA's, and its app's and token's as the dispatchers recorded them), counts trips from the
//! transition events every instance publishes on `bw.breaker.v1.*`, and serves the admin API (list, force
//! open/closed, clear, reset, reload, throughput) on the admin port; its state-changing routes need an operator
//! token ([`admin`]). [`Coordinator`] (`coordinator.rs`) holds the state; `snapshots.rs` ticks and stores,
//! `loops.rs` runs the lease, events, signals, discovery and ticks.
//!
//! Any number of coordinators may run, in one model: **a leader elected through a JetStream KV lease**
//! ([`leader`]). The lease holder runs the ticks and is the only writer of the config hashes and snapshots;
//! the others serve the admin API, count the trip events their share of the queue group receives, learn
//! scopes, and take the lease within about `leader_lease_ms` + `leader_renew_ms` (4 s at the defaults) when the
//! leader dies, at once when it stops gracefully. No transition is ever applied twice whoever ticks: every
//! transition is decided by a Lua script on the Redis state (an OPEN scope moves to HALF_OPEN once), so even
//! two instances ticking at once (a stalled leader past its lease) publish each transition once.
//!
//! When Redis loses its data (restart without persistence, failover to an empty replica) the leader notices the missing
//! epoch key (`bw_wire::names::COORDINATOR_EPOCH_KEY`) before it writes any snapshot, and re-applies the FORCED_OPEN
//! overrides the last BW_SCOPES snapshots record (see `Coordinator::store_checked`).
//!
//! What it must not do: change breaker state other than through the `bw-breaker` scripts. Entry point: [`run`].

pub mod account;
pub mod admin;
pub mod config;
pub mod coordinator;
pub mod leader;
mod loops;
pub mod meta_limits;
mod metrics;
mod snapshots;

pub use config::{Config, DEFAULT_CONFIG};
pub use coordinator::Coordinator;

use bw_common::service::Deps;
use tokio_util::sync::CancellationToken;

/// Runs the coordinator: mounts the breaker API on the admin server, then runs the loops until `shutdown`.
pub async fn run(cfg: Config, deps: Deps, shutdown: CancellationToken) -> anyhow::Result<()> {
    let coordinator = Coordinator::new(cfg, &deps)?;
    deps.admin.mount(admin::router(coordinator.clone()), coordinator.operator_gate().clone());
    deps.health.set_started();
    coordinator.run(shutdown).await
}
