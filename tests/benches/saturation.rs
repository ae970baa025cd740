//! Saturation benchmark (issue #17): demand at 130 % of each sender's configured rate for a minute, against
//! the simulator at Meta's documented throughput (80 msg/s per number, burst 10, every refusal limit-caused).
//! Counts the 130429 answers Breakwater caused and the throughput it achieved as a share of Meta's limit.
//!
//! One run prints three rows, each on fresh servers and a fresh simulator:
//! - **breakwater**: ingest and three dispatcher processes at the compiled defaults;
//! - **breakwater, late sends allowed**: the same with `dispatch.late_send_tolerance_ms = 0` (sends whose slot
//!   passed while the process, broker or ledger stalled leave late, together: the behaviour before the rule);
//! - **raw**: the same demand POSTed straight at the simulator, no Breakwater (what a naive client causes).
//!
//! Special settings: none for the first row (compiled defaults everywhere). The second row changes the one
//! setting it names. `BW_BENCH_SECONDS` (default 60) sets the saturated minute's length; `BW_BENCH_RATE` runs
//! every row at another sender rate (`breaker.defaults.rate_per_s`, said in the output), to see what a rate
//! closer to Meta's limit costs.
//!
//! Run: `cargo build --release --bins && cargo bench -p bw-e2e --bench saturation` (BW_BIN_DIR if the binaries
//! are elsewhere than `target/release`).

use std::time::{Duration, Instant};

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WABA_ID: &str = "102290129340398";
const TOKEN: &str = "saturation-access-token";
const SECRET: &str = "saturation-app-secret";
const SENDERS: usize = 2;
const DISPATCHERS: usize = 3;
/// Demand as a share of each sender's configured rate.
const DEMAND: f64 = 1.3;

struct Row {
    name: &'static str,
    offered: usize,
    self_inflicted: u64,
    /// Messages Meta accepted per second per sender in the saturated window (after a 10 s warm-up).
    achieved_per_sender: f64,
    meta_mps: f64,
    /// Operations Meta accepted more than once.
    duplicates: usize,
    lost: usize,
}

fn sender(i: usize) -> String {
    format!("1065403522{:05}", 77_000 + i % SENDERS)
}

fn sim_config(webhook: Option<String>) -> bw_meta_sim::SimConfig {
    let mut cfg = bw_meta_sim::SimConfig {
        access_tokens: vec![TOKEN.into()],
        app_secret: SECRET.into(),
        waba_id: WABA_ID.into(),
        ..Default::default()
    };
    cfg.webhook.url = webhook;
    cfg
}

/// Accepted per second per sender between `from_ms` and `to_ms` (unix ms), from the oracle.
fn achieved(oracle: &bw_meta_sim::OracleSnapshot, ops: &[String], from_ms: u64, to_ms: u64) -> f64 {
    let n = ops
        .iter()
        .filter_map(|op| oracle.get(op))
        .filter(|e| e.first_accepted_ms >= from_ms && e.first_accepted_ms < to_ms)
        .count();
    n as f64 / ((to_ms - from_ms) as f64 / 1000.0) / SENDERS as f64
}

fn unix_ms() -> u64 {
    bw_common::time::now_ms().max(0) as u64
}

async fn breakwater(name: &'static str, rate: f64, seconds: u64, extra: &[(&str, String)]) -> Row {
    let nats = bw_testkit::NatsServer::start();
    let redis_server = bw_testkit::RedisServer::start();
    let ingest_http = format!("127.0.0.1:{}", bw_testkit::free_port());
    let sim = std::sync::Arc::new(
        bw_meta_sim::MetaSim::start(sim_config(Some(format!("http://{ingest_http}/webhooks/meta"))))
            .await
            .expect("simulator"),
    );
    let sampler = timeline(sim.clone());
    let meta_mps = bw_meta_sim::Limits::default().throughput_mps;
    let dir = std::env::temp_dir().join(format!("bw-saturation-{}-{}", std::process::id(), name.len()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut services = bw_drill::stack::Services::new(bw_drill::stack::bin_dir(), dir.join("logs"));
    services
        .spawn("ingest", &bw_e2e::ingest_process(&nats.url(), &redis_server.url(), &ingest_http, SECRET))
        .expect("bw-ingest binary (run `cargo build --release --bins` first)");
    for _ in 0..DISPATCHERS {
        let mut settings = bw_e2e::dispatcher_process(&nats.url(), &redis_server.url(), &sim.base_url(), TOKEN);
        settings.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
        services.spawn("dispatcher", &settings).expect("bw-dispatcher binary");
    }
    services.wait_ready(Duration::from_secs(60)).await.expect("services ready");
    let client = async_nats::connect(nats.url()).await.expect("nats");
    let producer = bw_client::Client::new(client.clone());

    // The producer offers DEMAND x rate per sender, evenly spaced, for `seconds`.
    let (offered, gap) = demand(rate, seconds);
    let ops: Vec<String> = (0..offered).map(|i| format!("sat-{}-{i:07}", name.len())).collect();
    let started_ms = unix_ms();
    let produced_ms = bw_e2e::paced(offered, gap, |i| {
        let (producer, request) = (producer.clone(), bw_e2e::order(&sender(i), &ops[i], i));
        async move {
            let _ = producer.send(&request).await;
        }
    })
    .await;
    let sent =
        bw_testkit::wait_until(Duration::from_secs(600), || async { sim.total_accepted() >= offered as u64 }).await;
    let oracle = sim.oracle();
    let counters = sim.counters();
    let lost = if sent { 0 } else { ops.iter().filter(|op| oracle.get(op).is_none()).count() };
    for e in counters.limit_events.iter().take(10) {
        println!(
            "  {name}: limit-caused {} at {:.1} s, sender {}, simulator loop stalled {} ms in the second before",
            e.code,
            e.at_unix_ms.saturating_sub(started_ms) as f64 / 1000.0,
            e.phone_number_id,
            e.stall_ms
        );
    }
    let (late, allowed) = late_slots(&services).await;
    println!(
        "  {name}: {late} admitted sends reached the wire more than the tolerance after their send slot and went \
         back for a new one ({allowed} admissions to send)"
    );
    services.stop_all(Duration::from_secs(10));
    sampler.0.abort();
    print_timeline(name, &sampler.1.lock().map(|s| s.clone()).unwrap_or_default());
    if std::env::var_os("BW_BENCH_KEEP").is_some() {
        println!("  {name}: service logs kept in {}", dir.join("logs").display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Row {
        name,
        offered,
        self_inflicted: counters.outcome("130429"),
        achieved_per_sender: achieved(&oracle, &ops, started_ms + 10_000, produced_ms),
        meta_mps,
        duplicates: ops.iter().filter(|op| oracle.get(op).is_some_and(|e| e.count > 1)).count(),
        lost,
    }
}

/// Summed over the dispatchers' `/metrics`: sends that missed their slot by more than the tolerance
/// (`bw_dispatch_late_slots`), and admissions to send (`bw_admission_decisions{reason="allow"|"canary"}`).
async fn late_slots(services: &bw_drill::stack::Services) -> (u64, u64) {
    let (mut late, mut allowed) = (0, 0);
    for p in services.procs.iter().filter(|p| p.service == "dispatcher") {
        let Ok(answer) = reqwest::get(format!("http://{}/metrics", p.admin)).await else { continue };
        let text = answer.text().await.unwrap_or_default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = || line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) as u64;
            if line.starts_with("bw_dispatch_late_slots") {
                late += value();
            } else if line.starts_with("bw_admission_decisions")
                && (line.contains("reason=\"allow\"") || line.contains("reason=\"canary\""))
            {
                allowed += value();
            }
        }
    }
    (late, allowed)
}

type Samples = std::sync::Arc<std::sync::Mutex<Vec<(f64, u64, u64)>>>;

/// Every half second: seconds since start, calls Meta accepted, 130429 answers so far (with BW_BENCH_TIMELINE).
fn timeline(sim: std::sync::Arc<bw_meta_sim::SimHandle>) -> (tokio::task::JoinHandle<()>, Samples) {
    let samples: Samples = Default::default();
    let into = samples.clone();
    let task = tokio::spawn(async move {
        let started = Instant::now();
        loop {
            let row = (started.elapsed().as_secs_f64(), sim.total_accepted(), sim.counters().outcome("130429"));
            if let Ok(mut s) = into.lock() {
                s.push(row);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    (task, samples)
}

fn print_timeline(name: &str, samples: &[(f64, u64, u64)]) {
    if std::env::var_os("BW_BENCH_TIMELINE").is_none() {
        return;
    }
    println!("  {name}: per half second, accepted and 130429 answers");
    for w in samples.windows(2) {
        let (t, a0, r0) = w[0];
        let (_, a1, r1) = w[1];
        println!("    {t:6.1} s  accepted {:>4}  130429 {:>4}", a1 - a0, r1 - r0);
    }
}

/// Messages offered in `seconds` at DEMAND x `rate` per sender, and the even spacing between them.
fn demand(rate: f64, seconds: u64) -> (usize, Duration) {
    let per_s = DEMAND * rate * SENDERS as f64;
    ((per_s * seconds as f64) as usize, Duration::from_secs_f64(1.0 / per_s))
}

/// The same demand POSTed straight at the simulator by a client that knows nothing of Meta's limits.
async fn raw(rate: f64, seconds: u64) -> Row {
    let sim = bw_meta_sim::MetaSim::start(sim_config(None)).await.expect("simulator");
    let http = reqwest::Client::new();
    let (offered, gap) = demand(rate, seconds);
    let ops: Vec<String> = (0..offered).map(|i| format!("raw-{i:07}")).collect();
    let started_ms = unix_ms();
    let produced_ms = bw_e2e::paced(offered, gap, |i| {
        let url = format!("{}/v23.0/{}/messages", sim.base_url(), sender(i));
        let body = serde_json::json!({
            "messaging_product": "whatsapp",
            "to": format!("5491{i:09}"),
            "type": "template",
            "biz_opaque_callback_data": ops[i],
            "template": {"name": "order_confirmation", "language": {"code": "es_AR"}},
        });
        let http = http.clone();
        async move {
            let _ = http.post(url).bearer_auth(TOKEN).json(&body).send().await;
        }
    })
    .await;
    let oracle = sim.oracle();
    Row {
        name: "raw (no Breakwater)",
        offered,
        self_inflicted: sim.counters().outcome("130429"),
        achieved_per_sender: achieved(&oracle, &ops, started_ms + 10_000, produced_ms),
        meta_mps: bw_meta_sim::Limits::default().throughput_mps,
        duplicates: 0,
        lost: ops.iter().filter(|op| oracle.get(op).is_none()).count(),
    }
}

fn main() {
    bw_common::crypto::install_crypto();
    let seconds: u64 = std::env::var("BW_BENCH_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(60).max(15);
    let compiled: bw_dispatcher::Config =
        bw_common::config::load("dispatcher", bw_dispatcher::DEFAULT_CONFIG, None, &std::collections::HashMap::new())
            .expect("compiled dispatcher defaults");
    let override_rate: Option<f64> = std::env::var("BW_BENCH_RATE").ok().and_then(|v| v.parse().ok());
    let rate = override_rate.unwrap_or(compiled.breaker.defaults.rate_per_s);
    let rate_setting: Vec<(&str, String)> =
        override_rate.map(|r| vec![("breaker.defaults.rate_per_s", r.to_string())]).unwrap_or_default();
    let mut late_allowed = rate_setting.clone();
    late_allowed.push(("dispatch.late_send_tolerance_ms", "0".to_string()));
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let rows = rt.block_on(async {
        vec![
            breakwater("breakwater", rate, seconds, &rate_setting).await,
            breakwater("breakwater, late sends allowed", rate, seconds, &late_allowed).await,
            raw(rate, seconds).await,
        ]
    });
    println!(
        "saturation benchmark: {SENDERS} senders, demand {:.0} % of the configured {rate:.0} msg/s each ({}) for \
         {seconds} s, {DISPATCHERS} dispatcher processes; one run on this machine",
        DEMAND * 100.0,
        if override_rate.is_some() { "BW_BENCH_RATE, not the compiled default" } else { "compiled default" }
    );
    println!(
        "  {:<34} {:>8} {:>16} {:>22} {:>11} {:>5}",
        "", "offered", "self-inflicted", "achieved / Meta limit", "duplicates", "lost"
    );
    for r in &rows {
        println!(
            "  {:<34} {:>8} {:>16} {:>15.1} msg/s {:>4.0}% {:>11} {:>5}",
            r.name,
            r.offered,
            r.self_inflicted,
            r.achieved_per_sender,
            r.achieved_per_sender / r.meta_mps * 100.0,
            r.duplicates,
            r.lost
        );
    }
    let ours = &rows[0];
    for other in &rows[1..] {
        println!(
            "  ratio {} / {}: self-inflicted 130429 {} vs {}, achieved throughput {:.2}x",
            ours.name,
            other.name,
            ours.self_inflicted,
            other.self_inflicted,
            ours.achieved_per_sender / other.achieved_per_sender.max(0.001)
        );
    }
}
