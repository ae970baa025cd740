//! `bw-drill`: runs the flash-sale drill on the local stack and prints the report. Exit status 0 only when
//! nothing was lost, no unflagged duplicate reached Meta, no rate-limit answer was self-inflicted, and the
//! scenario's own validation rows passed (a WABA restriction's, sub-threshold noise's: docs/drill.md).

use clap::Parser;
use std::path::PathBuf;

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Breakwater flash-sale drill: real servers, every service, the Meta simulator with an outage")]
struct Args {
    /// Messages to publish.
    #[arg(long, default_value_t = 20_000)]
    messages: usize,
    /// Sender phone numbers.
    #[arg(long, default_value_t = 4)]
    senders: usize,
    /// Producer rate, messages per second.
    #[arg(long, default_value_t = 300.0)]
    rate: f64,
    /// Simulated Meta throughput per phone number, messages per second.
    #[arg(long, default_value_t = 80.0)]
    meta_mps: f64,
    /// Outage start and length, seconds after the producer starts.
    #[arg(long, default_value_t = 15)]
    outage_start: u64,
    #[arg(long, default_value_t = 20)]
    outage_length: u64,
    /// Dispatcher and replay instances.
    #[arg(long, default_value_t = 3)]
    dispatchers: usize,
    #[arg(long, default_value_t = 2)]
    replays: usize,
    /// Simulator scenario: a TOML file (as in crates/bw-meta-sim/scenarios/) or a built-in name. Replaces the
    /// built-in flash-sale outage (and --outage-start/--outage-length); its clock starts with the producer.
    /// A scenario that aims at a second WABA spreads the senders over both (waba-restricted-mid-sale.toml).
    #[arg(long, value_name = "FILE")]
    scenario: Option<String>,
    /// Chaos: kill -9 a dispatcher and a replay worker (each restarted), restart nats-server and
    /// redis-server, at times drawn from SEED (the same seed gives the same schedule).
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,
    /// Owners of the validation matrix rows (TOML with an [owners] table; default: compiled).
    #[arg(long, value_name = "FILE")]
    owners: Option<PathBuf>,
    /// Give up waiting for the system to settle (queues empty, breakers closed, alerts resolved) this long after
    /// the producer finished.
    #[arg(long, default_value_t = 300)]
    settle_timeout: u64,
    /// IANA time zone alert times are shown in next to UTC.
    #[arg(long, default_value = "America/Argentina/Buenos_Aires")]
    zone: String,
    /// Drill directory (wiped at start).
    #[arg(long, default_value = ".drill")]
    dir: PathBuf,
    /// Export every service's spans to this OTLP/HTTP traces endpoint (one trace per operation), e.g. the
    /// Jaeger of deploy/compose: http://127.0.0.1:4318/v1/traces.
    #[arg(long, value_name = "URL")]
    otlp: Option<String>,
}

fn main() {
    let args = Args::parse();
    let opts = bw_drill::DrillOptions {
        messages: args.messages,
        senders: args.senders,
        rate: args.rate,
        meta_mps: args.meta_mps,
        outage_start_s: args.outage_start,
        outage_length_s: args.outage_length,
        dispatchers: args.dispatchers,
        replays: args.replays,
        dir: args.dir.clone(),
        scenario: args.scenario.clone(),
        chaos_seed: args.chaos,
        owners: args.owners.clone(),
        zone: args.zone.clone(),
        settle_timeout_s: args.settle_timeout,
        otlp_endpoint: args.otlp.clone(),
        ..Default::default()
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    match runtime.block_on(bw_drill::run(opts)) {
        Ok(report) => {
            print!("{}", bw_drill::render::text(&report));
            let d = args.dir.display();
            println!("report: {d}/report.html, {d}/report.json, {d}/validation.md, {d}/timeline.svg");
            std::process::exit(if report.passed() { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("drill failed: {e:#}");
            std::process::exit(2);
        }
    }
}
