//! Shared plumbing for every Breakwater service.
//!
//! What lives here: layered config loading ([`config`]), telemetry init and trace-context propagation over
//! NATS headers ([`telemetry`]), the shutdown token ([`shutdown`]), the admin server with `/livez`, `/readyz`
//! and `/metrics` ([`admin`]), NATS connection and JetStream topology ([`nats`]), the durable operation ledger
//! ([`ledger`]) and Meta error classification ([`classify`]). The `service` module ties them into the start-up
//! sequence each thin `main.rs` calls. Subject and key names live in `bw-wire`, message types in `bw-proto`.
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
pub mod lease;
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
