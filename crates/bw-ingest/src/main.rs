//! `bw-ingest` binary: the shared start-up sequence around [`bw_ingest::run`].

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    bw_common::service::main("ingest", bw_ingest::DEFAULT_CONFIG, bw_ingest::run)
}
