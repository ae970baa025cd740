//! `bw-console` binary: the shared start-up sequence around [`bw_console::run`].

fn main() {
    bw_common::service::main("console", bw_console::DEFAULT_CONFIG, bw_console::run)
}
