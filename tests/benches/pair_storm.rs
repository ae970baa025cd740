//! Pair-storm benchmark (issue #17): many messages in a row to one customer (an order flow that sends every
//! update at once), against the simulator at Meta's documented pair limit (one message per 6 s to a user,
//! bursts of up to 45 borrowed; every refusal it causes is limit-caused, never injected).
//!
//! Each storm size runs two rows, each on fresh servers and a fresh simulator:
//! - **breakwater**: ingest and one dispatcher at the compiled defaults (pair burst 40, then one per 6 s);
//! - **naive client**: the same messages POSTed straight at the simulator, all at once, each one resent 1 s
//!   after any refusal until Meta takes it (what a client without a pair limiter does).
//!
//! Printed per row: the 131056 answers (the target: none beyond the first), the time from the first
//! request to the last acceptance, and messages accepted more than once. Storm sizes: 12 (the case,
//! inside Meta's burst) and 50 (past it). Special settings: none (compiled defaults).
//!
//! Run: `cargo bench -p bw-e2e --bench pair_storm` (about 3 minutes: past the burst, one message per 6 s).

use bw_e2e::{ACCESS_TOKEN, Harness, WABA_ID};
use bw_proto::v1::{Category, OperationState};
use std::time::Duration;

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PHONE: &str = "106540352247101";
const RECIPIENT: &str = "+5491155550777";
const SIZES: [usize; 2] = [12, 50];

struct Row {
    name: &'static str,
    messages: usize,
    refusals: u64,
    /// First request to last acceptance, seconds.
    seconds: f64,
    duplicates: usize,
    lost: usize,
}

fn ops(run: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("storm-{run}-{i:02}")).collect()
}

/// Seconds from `start_ms` to the last first acceptance of `ops`, duplicates and missing operations.
fn delivery(oracle: &bw_meta_sim::OracleSnapshot, ops: &[String], start_ms: u64) -> (f64, usize, usize) {
    let accepted: Vec<_> = ops.iter().filter_map(|op| oracle.get(op)).collect();
    let last = accepted.iter().map(|e| e.first_accepted_ms).max().unwrap_or(start_ms);
    let duplicates = accepted.iter().filter(|e| e.count > 1).count();
    (last.saturating_sub(start_ms) as f64 / 1000.0, duplicates, ops.len() - accepted.len())
}

fn unix_ms() -> u64 {
    bw_common::time::now_ms().max(0) as u64
}

async fn breakwater(n: usize) -> Row {
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    h.register(&[PHONE]).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    let producer = h.producer();
    let ops = ops("bw", n);
    let start = unix_ms();
    for (i, op) in ops.iter().enumerate() {
        let request = bw_client::Request::template(op, WABA_ID, PHONE, RECIPIENT, "order_update", "es_AR")
            .param(&i.to_string())
            .category(Category::Transactional)
            .build();
        let reply = producer.send(&request).await.expect("ingest answers");
        assert!(reply.accepted, "rejected: {}", reply.error);
    }
    let sent = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
    // Past the burst one message per 6 s, plus room for a slow machine.
    let within = Duration::from_secs(60 + 6 * n as u64);
    assert!(h.wait_all(&ops, &sent, within).await, "every message of the storm reached Meta");
    let (seconds, duplicates, lost) = delivery(&h.sim.oracle(), &ops, start);
    Row { name: "breakwater", messages: n, refusals: h.sim.counters().outcome("131056"), seconds, duplicates, lost }
}

async fn naive(n: usize) -> Row {
    let cfg = bw_meta_sim::SimConfig { access_tokens: vec![ACCESS_TOKEN.into()], ..Default::default() };
    let sim = bw_meta_sim::MetaSim::start(cfg).await.expect("simulator");
    let http = reqwest::Client::new();
    let ops = ops("naive", n);
    let url = format!("{}/v23.0/{PHONE}/messages", sim.base_url());
    let start = unix_ms();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, op) in ops.iter().enumerate() {
        let (http, url, op) = (http.clone(), url.clone(), op.clone());
        tasks.spawn(async move {
            let body = serde_json::json!({
                "messaging_product": "whatsapp",
                "to": RECIPIENT,
                "type": "template",
                "biz_opaque_callback_data": op,
                "template": {"name": "order_update", "language": {"code": "es_AR"},
                    "components": [{"type": "body", "parameters": [{"type": "text", "text": i.to_string()}]}]},
            });
            for _ in 0..600 {
                let answer = http.post(&url).bearer_auth(ACCESS_TOKEN).json(&body).send().await;
                if answer.is_ok_and(|a| a.status().is_success()) {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let (seconds, duplicates, lost) = delivery(&sim.oracle(), &ops, start);
    Row { name: "naive client", messages: n, refusals: sim.counters().outcome("131056"), seconds, duplicates, lost }
}

fn main() {
    bw_common::crypto::install_crypto();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let rows: Vec<(Row, Row)> = rt.block_on(async {
        let mut rows = Vec::new();
        for n in SIZES {
            rows.push((breakwater(n).await, naive(n).await));
        }
        rows
    });
    println!(
        "pair-storm benchmark: messages in a row to one recipient, simulator at Meta's pair limit (1 per 6 s, burst \
         45), Breakwater at the compiled defaults; one run on this machine"
    );
    println!(
        "  {:<14} {:>9} {:>22} {:>20} {:>11} {:>5}",
        "", "messages", "131056 answers", "time to deliver", "duplicates", "lost"
    );
    for (ours, theirs) in &rows {
        for r in [ours, theirs] {
            println!(
                "  {:<14} {:>9} {:>22} {:>18.1} s {:>11} {:>5}",
                r.name, r.messages, r.refusals, r.seconds, r.duplicates, r.lost
            );
        }
        println!(
            "  ratio at {}: 131056 {} vs {}; time to deliver {:.2}x the naive client's",
            ours.messages,
            ours.refusals,
            theirs.refusals,
            ours.seconds / theirs.seconds.max(0.001)
        );
    }
}
