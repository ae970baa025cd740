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
pub mod disposition;
pub mod jitter;
pub mod ledger;
pub mod mask;
pub mod moves;
pub mod names;
pub mod nats;
pub mod redis_conn;
pub mod registry;
pub mod service;
pub mod shutdown;
pub mod telemetry;
pub mod tenancy;
pub mod time;

pub use bw_proto::v1 as proto;

/// The allocator of every Breakwater binary, and of the tests and benchmarks that link this crate (so a
/// benchmark measures what the services run). glibc's malloc and free took about 30 % of the CPU of the
/// pipeline benchmark's process (dispatcher and simulator) in `perf`: thousands of small allocations per message
/// (protobuf, headers, spans, futures) freed on other worker threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
