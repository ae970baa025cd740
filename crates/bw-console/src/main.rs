//! `bw-console` binary: the shared start-up sequence around [`bw_console::run`].

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    bw_common::service::main("console", bw_console::DEFAULT_CONFIG, bw_console::run)
}
