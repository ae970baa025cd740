//! What the drill does: [`DrillOptions`], and the live view's lines.

use std::path::PathBuf;

/// What the drill does.
#[derive(Debug, Clone)]
pub struct DrillOptions {
    /// Messages the producer publishes.
    pub messages: usize,
    /// Sender phone numbers the load is spread over.
    pub senders: usize,
    /// Producer rate, messages per second.
    pub rate: f64,
    /// Outstanding producer requests.
    pub concurrency: usize,
    /// Simulated Meta throughput per phone number (msg/s); Breakwater is configured a little under it.
    pub meta_mps: f64,
    /// When the outage starts and how long it lasts, seconds after the producer starts.
    pub outage_start_s: u64,
    pub outage_length_s: u64,
    /// Service instances.
    pub dispatchers: usize,
    pub replays: usize,
    pub ingests: usize,
    /// Where the servers' data, logs and the report go (wiped first).
    pub dir: PathBuf,
    /// Give up waiting for the system to settle this long after the producer finished.
    pub settle_timeout_s: u64,
    /// Print the live view.
    pub live: bool,
    /// A simulator scenario file (TOML, as in `crates/bw-meta-sim/scenarios/`) or built-in name; None: the
    /// flash-sale outage at `outage_start_s` for `outage_length_s`. Its clock starts with the producer.
    pub scenario: Option<String>,
    /// `--chaos SEED`: kill -9 a dispatcher and a replay worker, restart nats-server and redis-server, at times
    /// drawn from the seed. Server restarts block their thread: run the drill on a multi-thread runtime.
    pub chaos_seed: Option<u64>,
    /// Owners of the validation matrix rows (TOML, table `[owners]`); None: the compiled defaults.
    pub owners: Option<PathBuf>,
    /// IANA zone alert times are shown in next to UTC.
    pub zone: String,
    /// `--otlp URL`: every service exports its spans (one trace per operation) to this OTLP/HTTP traces
    /// endpoint (`telemetry.otlp_endpoint`), e.g. deploy/compose's Jaeger at `http://127.0.0.1:4318/v1/traces`.
    pub otlp_endpoint: Option<String>,
}

impl Default for DrillOptions {
    fn default() -> Self {
        DrillOptions {
            messages: 20_000,
            senders: 4,
            rate: 300.0,
            concurrency: 256,
            meta_mps: 80.0,
            outage_start_s: 15,
            outage_length_s: 20,
            dispatchers: 3,
            replays: 2,
            ingests: 1,
            dir: PathBuf::from(".drill"),
            settle_timeout_s: 300,
            live: true,
            scenario: None,
            chaos_seed: None,
            owners: None,
            zone: "America/Argentina/Buenos_Aires".into(),
            otlp_endpoint: None,
        }
    }
}

/// Prints `line` when the live view is on.
pub(crate) fn say(opts: &DrillOptions, line: &str) {
    if opts.live {
        println!("{line}");
    }
}
