//! `bwctl` binary: parses the command line and runs [`bw_cli::run`]; exit code 2 means accounting found
//! lost operations, 3 that a purge was not confirmed, 1 any other failure.

use clap::Parser;

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = bw_cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bwctl: cannot start runtime: {e}");
            std::process::exit(70);
        }
    };
    let code = runtime.block_on(async {
        let mut out = std::io::stdout();
        match bw_cli::run(cli, &mut out).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("bwctl: {e:#}");
                1
            }
        }
    });
    std::process::exit(code)
}
