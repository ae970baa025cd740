//! `bw-replay` binary: the shared start-up sequence around [`bw_replay::run`].

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    bw_common::service::main("replay", bw_replay::DEFAULT_CONFIG, bw_replay::run)
}
