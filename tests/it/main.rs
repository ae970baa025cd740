//! End-to-end tests: real nats-server, redis-server, the Meta simulator, and the real services.

mod crash;
mod defaults;
mod dispatch;
mod examples;
mod flow;
mod fuzz;
mod incident;
mod order;
mod outage;
mod permissions;
mod priority;
mod redaction;
mod resilience;
mod skeleton;
mod tracing;

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
