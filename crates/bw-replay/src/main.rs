//! `bw-replay` binary: the shared start-up sequence around [`bw_replay::run`].

fn main() {
    bw_common::service::main("replay", bw_replay::DEFAULT_CONFIG, bw_replay::run)
}
