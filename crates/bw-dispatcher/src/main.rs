//! `bw-dispatcher` binary: the shared start-up sequence around [`bw_dispatcher::run`].

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    bw_common::service::main("dispatcher", bw_dispatcher::DEFAULT_CONFIG, bw_dispatcher::run)
}
