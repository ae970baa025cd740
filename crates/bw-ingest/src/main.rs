//! `bw-ingest` binary: the shared start-up sequence around [`bw_ingest::run`].

fn main() {
    bw_common::service::main("ingest", bw_ingest::DEFAULT_CONFIG, bw_ingest::run)
}
