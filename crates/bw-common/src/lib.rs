//! Shared plumbing for every Breakwater service.
//!
//! What lives here: layered config loading ([`config`]), telemetry init and trace-context propagation over
//! NATS headers ([`telemetry`]), the shutdown token ([`shutdown`]), the admin server with `/livez`, `/readyz`
//! and `/metrics` ([`admin`]), NATS connection and JetStream topology ([`nats`]), the durable operation ledger
//! ([`ledger`]), Meta error classification ([`classify`]), and every subject, stream and key name
//! ([`names`]). The `service` module ties them into the start-up sequence each thin `main.rs` calls.
//!
//! What must not live here: service logic. Services depend on this crate, never on each other.

pub mod admin;
pub mod api_versions;
pub mod attempts;
pub mod classify;
pub mod config;
pub mod crypto;
pub mod disposition;
pub mod jitter;
pub mod ledger;
pub mod mask;
pub mod moves;
pub mod nats;
pub mod redis_conn;
pub mod registry;
pub mod service;
pub mod shutdown;
pub mod telemetry;
pub mod time;

pub use bw_proto::v1 as proto;
/// The wire names and tenancy names live in the leaf crate `bw-wire` (so `bw-client` links them alone); every
/// service reaches them here.
pub use bw_wire::{names, tenancy};

/// The two innermost causes of an error, outermost first joined by ` <- ` (an HTTP client's error chain: the
/// outer layers repeat the URL and add nothing).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.into_iter().rev().take(2).collect::<Vec<_>>().join(" <- ")
}
