//! End-to-end tests: real nats-server, redis-server, the Meta simulator, and the real services.

mod async_failures;
mod budget;
mod crash;
mod defaults;
mod dispatch;
mod examples;
mod flow;
mod fuzz;
mod held;
mod incident;
mod order;
mod outage;
mod partitions;
mod pauses;
mod permissions;
mod pooled;
mod priority;
mod quarantine;
mod redaction;
mod redis_auth;
mod resilience;
mod senders;
mod signals;
mod skeleton;
mod template_category;
mod template_signals;
mod tenant_stack;
mod tenants;
mod throughput;
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
    // The console's pages get a free port too: its default 9180 may be taken by another test's stack.
    cmd.env("BW_CONSOLE__CONSOLE__LISTEN", format!("127.0.0.1:{}", bw_testkit::free_port()));
    for service in ["INGEST", "DISPATCHER", "BREAKER_COORDINATOR", "REPLAY", "ALERTING", "CONSOLE"] {
        cmd.env(format!("BW_{service}__NATS__URL"), nats_url);
        if matches!(service, "INGEST" | "DISPATCHER" | "BREAKER_COORDINATOR" | "CONSOLE") {
            cmd.env(format!("BW_{service}__REDIS__URL"), redis_url);
        }
        if service != "INGEST" {
            cmd.env(format!("BW_{service}__ADMIN__LISTEN"), format!("127.0.0.1:{}", bw_testkit::free_port()));
        }
    }
    cmd
}

/// A simulator whose own rate and pair limits never bind (the tests watch Breakwater's signals, not Meta's limits),
/// knowing each `(phone_number_id, waba_id)`: Meta's account events are aimed by WABA.
fn open_sim(numbers: &[(&str, &str)]) -> bw_meta_sim::SimConfig {
    let mut cfg = bw_meta_sim::SimConfig::default();
    cfg.limits.throughput_mps = 1_000.0;
    cfg.limits.throughput_burst = 1_000;
    cfg.limits.pair_enabled = false;
    for (phone, waba) in numbers {
        let of = bw_meta_sim::PhoneNumberConfig { waba_id: Some(waba.to_string()), ..Default::default() };
        cfg.phone_numbers.insert(phone.to_string(), of);
    }
    cfg
}

/// A simulator event from its JSON form.
fn sim_event(value: serde_json::Value) -> bw_meta_sim::Event {
    serde_json::from_value(value).expect("a valid simulator event")
}
