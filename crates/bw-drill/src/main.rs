//! `bw-drill`: runs the flash-sale drill on the local stack and prints the report. Exit status 0 only when
//! nothing was lost and no unflagged duplicate reached Meta.

use clap::Parser;
use std::path::PathBuf;

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
    /// Drill directory (wiped at start).
    #[arg(long, default_value = ".drill")]
    dir: PathBuf,
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
        ..Default::default()
    };
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    match runtime.block_on(bw_drill::run(opts)) {
        Ok(report) => {
            print!("{}", bw_drill::report::text(&report));
            println!(
                "report: {}/report.html, {}/report.json, {}/timeline.svg",
                args.dir.display(),
                args.dir.display(),
                args.dir.display()
            );
            std::process::exit(if report.passed() { 0 } else { 1 });
        }
        Err(e) => {
            eprintln!("drill failed: {e:#}");
            std::process::exit(2);
        }
    }
}
