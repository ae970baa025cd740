//! End-to-end tests: real nats-server, redis-server, the Meta simulator, and the real services.

mod async_failures;
mod crash;
mod defaults;
mod dispatch;
mod examples;
mod flow;
mod fuzz;
mod incident;
mod order;
mod outage;
mod partitions;
mod pauses;
mod permissions;
mod priority;
mod quarantine;
mod redaction;
mod redis_auth;
mod resilience;
mod senders;
mod signals;
mod skeleton;
mod tenant_stack;
mod tenants;
mod tracing;
mod user_ids;

/// Runs `bwctl <args>` in-process against `nats_url` (the CLI's own parser and `run`), returning its exit code
/// and output; panics when the command cannot run at all.
async fn bwctl(nats_url: &str, args: &[&str]) -> (i32, String) {
    use clap::Parser as _;
    let mut argv = vec!["bwctl", "--nats-url", nats_url];
    argv.extend_from_slice(args);
    let cli = bw_cli::Cli::try_parse_from(argv).expect("arguments parse");
    let mut out = Vec::new();
    // Boxed: the CLI's future is large, and a test's own future runs on the thread's stack.
    let code = Box::pin(bw_cli::run(cli, &mut out)).await.unwrap_or_else(|e| panic!("bwctl {args:?}: {e:#}"));
    (code, String::from_utf8(out).expect("utf8"))
}

/// A `bw-stack` process (every service in one process, the real binary) aimed at these servers, with every
/// listener on a free port and ingest's admin on `ingest_admin`, its output in `log` (RUST_LOG unset, so the
/// compiled log level). Add arguments (`--with-simulator`, `--otlp`) and spawn it.
fn stack_command(nats_url: &str, redis_url: &str, ingest_admin: &str, log: &std::path::Path) -> std::process::Command {
    let bin = bw_drill::stack::bin_dir().join("bw-stack");
    assert!(bin.exists(), "{} missing: scripts/test.sh builds the binaries first", bin.display());
    let log = std::fs::File::create(log).expect("log file");
    let mut cmd = std::process::Command::new(bin);
    cmd.env_remove("RUST_LOG")
        .env("BW_INGEST__HTTP__LISTEN", format!("127.0.0.1:{}", bw_testkit::free_port()))
        .env("BW_INGEST__ADMIN__LISTEN", ingest_admin)
        .stdout(log.try_clone().expect("log file"))
        .stderr(log);
    for service in ["INGEST", "DISPATCHER", "BREAKER_COORDINATOR", "REPLAY", "ALERTING"] {
        cmd.env(format!("BW_{service}__NATS__URL"), nats_url);
        if matches!(service, "INGEST" | "DISPATCHER" | "BREAKER_COORDINATOR") {
            cmd.env(format!("BW_{service}__REDIS__URL"), redis_url);
        }
        if service != "INGEST" {
            cmd.env(format!("BW_{service}__ADMIN__LISTEN"), format!("127.0.0.1:{}", bw_testkit::free_port()));
        }
    }
    cmd
}
