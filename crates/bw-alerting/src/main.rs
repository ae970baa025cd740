//! `bw-alerting` binary: the shared start-up sequence (config, telemetry, NATS, admin server) around
//! [`bw_alerting::run`].

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    bw_common::service::main("alerting", bw_alerting::DEFAULT_CONFIG, bw_alerting::run)
}
