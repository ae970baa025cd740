//! Capacity benchmark: what one message costs each component, measured on real processes, and what that
//! means for a fleet (the capacity model in `deploy/capacity.md` is written from this output).
//!
//! One run: nats-server (JetStream, monitoring on) and redis-server from bw-testkit, the Meta simulator in this
//! process (limits off, status webhooks on: sent, delivered, read for every message, as Meta sends them), and
//! the real `bw-ingest` and `bw-dispatcher` binaries as their own processes. A producer sends N messages
//! through the NATS intake; the run ends when Meta accepted all of them and ingest has processed every status
//! webhook. Counters are read before and after: CPU time per process (`/proc/<pid>/stat`), messages and bytes
//! through nats-server (`/varz`), JetStream API requests (`/jsz`), messages stored per stream (each is one
//! durable write, KV puts included), and commands Redis processed (`INFO stats`, and per command from `INFO
//! commandstats`: script calls are the round trips, fewer where calls share a pipeline).
//!
//! Special settings (said here, as the brief asks): the dispatcher's sender rate is raised to 500/s per number
//! and the load spread over 20 numbers, so the compiled per-number rate (80 mps, Meta's default) does not cap
//! the measurement; every other setting is the compiled default.
//!
//! Run: `cargo build --release --bins && cargo bench -p bw-e2e --bench capacity` (BW_BENCH_N messages,
//! default 10,000; BW_BIN_DIR if the binaries are elsewhere than `target/release`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WABA_ID: &str = "102290129340398";
const TOKEN: &str = "capacity-access-token";
const SECRET: &str = "capacity-app-secret";
const SENDERS: usize = 20;
/// The model's fleet: a BSP with 1,000 numbers at 80 messages per second each.
const FLEET_MPS: f64 = 80_000.0;

async fn get_json(url: &str) -> serde_json::Value {
    reqwest::get(url).await.expect("monitoring answers").json().await.expect("json")
}

#[derive(Debug, Default, Clone)]
struct Counters {
    cpu: BTreeMap<&'static str, f64>,
    nats_in_msgs: f64,
    nats_in_bytes: f64,
    nats_out_msgs: f64,
    js_api: f64,
    stored: BTreeMap<String, f64>,
    redis_commands: f64,
    /// Calls per Redis command (`INFO commandstats`): the scripts' calls (EVALSHA) are the round trips, the rest
    /// ran inside them or were sent on their own.
    redis_calls: BTreeMap<String, f64>,
}

async fn read_counters(
    pids: &[(&'static str, u32)],
    monitor: &str,
    js: &async_nats::jetstream::Context,
    redis: &mut redis::aio::MultiplexedConnection,
) -> Counters {
    let varz = get_json(&format!("{monitor}/varz")).await;
    let jsz = get_json(&format!("{monitor}/jsz")).await;
    let num = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let mut stored = BTreeMap::new();
    let mut names = js.stream_names();
    use futures::StreamExt;
    while let Some(Ok(name)) = names.next().await {
        if let Ok(mut s) = js.get_stream(&name).await
            && let Ok(info) = s.info().await
        {
            stored.insert(name, info.state.last_sequence as f64);
        }
    }
    let info: String = redis::cmd("INFO").arg("stats").query_async(redis).await.expect("redis info");
    let redis_commands = info
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    let redis_calls = bw_e2e::redis_command_calls(redis).await;
    Counters {
        redis_calls,
        cpu: pids.iter().map(|(name, pid)| (*name, bw_e2e::cpu_seconds(*pid))).collect(),
        nats_in_msgs: num(&varz["in_msgs"]),
        nats_in_bytes: num(&varz["in_bytes"]),
        nats_out_msgs: num(&varz["out_msgs"]),
        js_api: num(&jsz["api"]["total"]).max(num(&varz["jetstream"]["stats"]["api"]["total"])),
        stored,
        redis_commands,
    }
}

fn main() {
    bw_common::crypto::install_crypto();
    let n: usize = std::env::var("BW_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(run(n));
}

async fn run(n: usize) {
    let monitor_port = bw_testkit::free_port();
    let nats = bw_testkit::NatsServer::start_with_args(vec!["-m".into(), monitor_port.to_string()]);
    let monitor = format!("http://127.0.0.1:{monitor_port}");
    let redis_server = bw_testkit::RedisServer::start();
    let ingest_http = format!("127.0.0.1:{}", bw_testkit::free_port());
    let mut sim_cfg = bw_meta_sim::SimConfig {
        limits: bw_meta_sim::Limits::disabled(),
        access_tokens: vec![TOKEN.into()],
        app_secret: SECRET.into(),
        waba_id: WABA_ID.into(),
        ..Default::default()
    };
    sim_cfg.webhook.url = Some(format!("http://{ingest_http}/webhooks/meta"));
    let sim = bw_meta_sim::MetaSim::start(sim_cfg).await.expect("simulator");

    let dir = tempfile_dir();
    let mut services = bw_drill::stack::Services::new(bw_drill::stack::bin_dir(), dir.join("logs"));
    let ingest = services
        .spawn("ingest", &bw_e2e::ingest_process(&nats.url(), &redis_server.url(), &ingest_http, SECRET))
        .expect("bw-ingest binary (run `cargo build --release --bins` first)");
    let mut settings = bw_e2e::dispatcher_process(&nats.url(), &redis_server.url(), &sim.base_url(), TOKEN);
    settings.push(("breaker.defaults.rate_per_s", "500".into()));
    let dispatcher = services.spawn("dispatcher", &settings).expect("bw-dispatcher binary");
    services.wait_ready(Duration::from_secs(30)).await.expect("services ready");
    let pids: Vec<(&'static str, u32)> = vec![
        ("ingest", services.procs[ingest].pid().expect("ingest runs")),
        ("dispatcher", services.procs[dispatcher].pid().expect("dispatcher runs")),
        ("nats-server", nats.pid().expect("nats runs")),
        ("redis-server", redis_server.pid().expect("redis runs")),
        ("simulator + producer", std::process::id()),
    ];
    let client = async_nats::connect(nats.url()).await.expect("nats");
    let js = async_nats::jetstream::new(client.clone());
    let mut redis =
        redis::Client::open(redis_server.url()).expect("url").get_multiplexed_async_connection().await.expect("redis");

    let before = read_counters(&pids, &monitor, &js, &mut redis).await;
    let started = Instant::now();
    let producer = bw_client::Client::new(client.clone());
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let permit = permits.clone().acquire_owned().await.expect("permit");
        let producer = producer.clone();
        tasks.spawn(async move {
            let sender = format!("1065403522{:05}", i % SENDERS);
            let request = bw_e2e::order(&sender, &format!("cap-{i:07}"), i);
            let reply = producer.send(&request).await;
            drop(permit);
            matches!(reply, Ok(r) if r.accepted)
        });
        while tasks.try_join_next().is_some() {}
    }
    let mut refused = 0;
    while let Some(ok) = tasks.join_next().await {
        if !matches!(ok, Ok(true)) {
            refused += 1;
        }
    }
    assert_eq!(refused, 0, "ingest accepted every message");
    // Done when Meta accepted all, every status webhook was delivered and ingest processed them all.
    let processed = bw_testkit::wait_until(Duration::from_secs(900), || async {
        if sim.total_accepted() < n as u64 || sim.counters().webhooks.statuses_delivered < 3 * n as u64 {
            return false;
        }
        let Ok(stream) = js.get_stream(bw_wire::names::WEBHOOK_STREAM).await else { return false };
        let Ok(mut consumer) = stream
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(bw_wire::names::WEBHOOK_CONSUMER)
            .await
        else {
            return false;
        };
        consumer.info().await.is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
    })
    .await;
    let took = started.elapsed().as_secs_f64();
    assert!(processed, "every message sent and every status processed");
    let after = read_counters(&pids, &monitor, &js, &mut redis).await;
    services.stop_all(Duration::from_secs(10));

    let per = |a: f64, b: f64| (a - b) / n as f64;
    println!(
        "capacity benchmark: {n} messages, {SENDERS} senders, 3 status webhooks each, one run on this machine ({took:.1} s, {:.0} msg/s end to end)",
        n as f64 / took
    );
    println!("  CPU per message, and cores for {FLEET_MPS:.0} msg/s (1,000 numbers x 80 mps) at that cost:");
    let mut service_cores = 0.0;
    for (name, _) in &pids {
        let ms = per(after.cpu[name], before.cpu[name]) * 1000.0;
        let cores = ms / 1000.0 * FLEET_MPS;
        if matches!(*name, "ingest" | "dispatcher") {
            service_cores += cores;
        }
        println!("    {name:<22} {ms:>7.3} ms  -> {cores:>6.1} cores");
    }
    println!("    Breakwater services    {service_cores:>15.1} cores in all (ingest + dispatcher)");
    println!(
        "  NATS per message: {:.1} messages in, {:.1} out, {:.0} bytes in; {:.1} JetStream API requests",
        per(after.nats_in_msgs, before.nats_in_msgs),
        per(after.nats_out_msgs, before.nats_out_msgs),
        per(after.nats_in_bytes, before.nats_in_bytes),
        per(after.js_api, before.js_api)
    );
    let mut writes = 0.0;
    let mut by_stream = Vec::new();
    for (stream, last) in &after.stored {
        let w = per(*last, before.stored.get(stream).copied().unwrap_or(0.0));
        if w > 0.0005 {
            writes += w;
            by_stream.push(format!("{stream} {w:.2}"));
        }
    }
    println!("  durable JetStream writes per message: {writes:.2} ({})", by_stream.join(", "));
    println!(
        "  at {FLEET_MPS:.0} msg/s: {:.0} JetStream writes/s, {:.0} MB/s into NATS",
        writes * FLEET_MPS,
        per(after.nats_in_bytes, before.nats_in_bytes) * FLEET_MPS / 1e6
    );
    let redis_per = per(after.redis_commands, before.redis_commands);
    println!(
        "  Redis commands per message: {redis_per:.2} -> {:.0} commands/s at {FLEET_MPS:.0} msg/s",
        redis_per * FLEET_MPS
    );
    let mut calls: Vec<(f64, &String)> = after
        .redis_calls
        .iter()
        .map(|(name, c)| (per(*c, before.redis_calls.get(name).copied().unwrap_or(0.0)), name))
        .filter(|(c, _)| *c > 0.005)
        .collect();
    calls.sort_by(|a, b| b.0.total_cmp(&a.0));
    let scripts: f64 = calls.iter().filter(|(_, n)| matches!(n.as_str(), "evalsha" | "eval")).map(|(c, _)| c).sum();
    println!(
        "  Redis script calls per message (the round trips, fewer where calls share a pipeline): {scripts:.2}; calls per message by command: {}",
        calls.iter().map(|(c, n)| format!("{n} {c:.2}")).collect::<Vec<_>>().join(", ")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("bw-capacity-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}
