//! `bw-alerting` binary: the shared start-up sequence (config, telemetry, NATS, admin server) around
//! [`bw_alerting::run`].

fn main() {
    bw_common::service::main("alerting", bw_alerting::DEFAULT_CONFIG, bw_alerting::run)
}
