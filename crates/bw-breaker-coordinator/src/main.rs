//! `bw-breaker-coordinator` binary: the shared service skeleton around [`bw_breaker_coordinator::run`], which
//! mounts its breaker API on the skeleton's admin server.

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    bw_common::service::main("breaker-coordinator", bw_breaker_coordinator::DEFAULT_CONFIG, bw_breaker_coordinator::run)
}
