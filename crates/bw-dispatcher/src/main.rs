//! `bw-dispatcher` binary: the shared start-up sequence around [`bw_dispatcher::run`].

fn main() {
    bw_common::service::main("dispatcher", bw_dispatcher::DEFAULT_CONFIG, bw_dispatcher::run)
}
