//! Webhook acknowledgement benchmark: signed Meta status deliveries POSTed by N concurrent clients to a real
//! ingest (signature check + durable JetStream store before the 200), next to a raw JetStream
//! publish-with-ack loop with the same payload size and concurrency, measured in the same run.
//!
//! Run: `cargo run --release -p bw-ingest --example webhook_bench` (env: BENCH_CLIENTS=32, BENCH_SECS=12,
//! BENCH_PROCESS=0|1 to also run the webhook processor in the same process). Prints numbers; asserts nothing.

use bw_common::service::Deps;
use bw_ingest::{Listeners, webhook};
use hdrhistogram::Histogram;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SECRET: &str = "bench-secret";

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn status_body(client: u64, n: u64) -> String {
    serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398",
        "changes": [{"field": "messages", "value": {"messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922"},
            "statuses": [{"id": format!("wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJ{client}x{n}"), "status": "delivered",
                "timestamp": "1750030073", "recipient_id": "16505551234",
                "biz_opaque_callback_data": format!("bench-{client}-{n}"),
                "pricing": {"billable": true, "pricing_model": "PMP", "type": "regular", "category": "utility"}}]}}]}]})
    .to_string()
}

struct Result {
    count: u64,
    secs: f64,
    hist: Histogram<u64>,
}

impl Result {
    fn rate(&self) -> f64 {
        self.count as f64 / self.secs
    }

    fn print(&self, name: &str) {
        println!(
            "{name:<28} {:>9.0} /s   p50 {:>7.2} ms   p99 {:>7.2} ms   p99.9 {:>7.2} ms   ({} ok in {:.1} s)",
            self.rate(),
            self.hist.value_at_quantile(0.50) as f64 / 1000.0,
            self.hist.value_at_quantile(0.99) as f64 / 1000.0,
            self.hist.value_at_quantile(0.999) as f64 / 1000.0,
            self.count,
            self.secs
        );
    }
}

/// Runs `clients` loops of `op` for `secs`, collecting per-call latency in microseconds.
async fn drive<F, Fut>(clients: u64, secs: u64, op: F) -> Result
where
    F: Fn(u64, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let failures = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (op, failures) = (op.clone(), failures.clone());
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
            let mut n = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                if op(c, n).await {
                    let _ = hist.record(t.elapsed().as_micros() as u64);
                } else {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
            }
            hist
        }));
    }
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds");
    for t in tasks {
        if let Ok(h) = t.await {
            let _ = hist.add(h);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let failed = failures.load(Ordering::Relaxed);
    if failed > 0 {
        println!("  ({failed} calls failed)");
    }
    Result { count: hist.len(), secs, hist }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    bw_common::crypto::install_crypto();
    let clients = env_or("BENCH_CLIENTS", 32);
    let secs = env_or("BENCH_SECS", 12);
    let process = env_or("BENCH_PROCESS", 0) == 1;
    let server = bw_testkit::NatsServer::start();
    let mut cfg = bw_ingest::Config::load(None, &Default::default())?;
    cfg.nats.url = server.url();
    cfg.webhook.app_secret = SECRET.into();
    cfg.webhook.process = process;
    cfg.reconciler.enabled = false;
    cfg.intake.nats_enabled = false;
    let deps = Deps::connect("ingest", &cfg.nats, None, Duration::from_secs(10)).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/webhooks/meta", listener.local_addr()?);
    let token = CancellationToken::new();
    let js = deps.js.clone();
    let service =
        tokio::spawn(bw_ingest::run_on(cfg, deps, Listeners { http: listener, webhook: None }, token.clone()));

    let body_len = status_body(0, 0).len();
    println!(
        "webhook ack benchmark: {clients} concurrent clients, {secs} s per phase, body {body_len} bytes, processor {}",
        if process { "on" } else { "off" }
    );
    let http = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(clients as usize).build()?;
    // Warm up connections and the stream.
    let warm = http.clone();
    let warm_url = url.clone();
    drive(clients, 1, move |c, n| {
        let (http, url) = (warm.clone(), warm_url.clone());
        async move {
            let body = status_body(c + 10_000, n);
            let sig = webhook::sign(SECRET.as_bytes(), body.as_bytes());
            http.post(&url).header("X-Hub-Signature-256", sig).body(body).send().await.is_ok_and(|r| r.status() == 200)
        }
    })
    .await;

    let ingest = drive(clients, secs, move |c, n| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let body = status_body(c, n);
            let sig = webhook::sign(SECRET.as_bytes(), body.as_bytes());
            http.post(&url).header("X-Hub-Signature-256", sig).body(body).send().await.is_ok_and(|r| r.status() == 200)
        }
    })
    .await;

    // Same durability, same size, no HTTP and no signature: the floor set by JetStream on this machine.
    let raw_stream = async_nats::jetstream::stream::Config {
        name: "BENCH_RAW".into(),
        subjects: vec!["bench.raw".into()],
        storage: async_nats::jetstream::stream::StorageType::File,
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    };
    js.get_or_create_stream(raw_stream).await?;
    let payload: bytes::Bytes = vec![b'x'; body_len + 90].into();
    let raw = drive(clients, secs, move |c, n| {
        let (js, payload) = (js.clone(), payload.clone());
        async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("{c}-{n}").as_str());
            match js.publish_with_headers("bench.raw", headers, payload).await {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await;

    println!();
    ingest.print("webhook POST → 200 (stored)");
    raw.print("raw JetStream publish+ack");
    println!("ratio webhook/raw throughput: {:.2}", ingest.rate() / raw.rate());
    println!(
        "ratio webhook/raw p50 latency: {:.2}",
        ingest.hist.value_at_quantile(0.5) as f64 / raw.hist.value_at_quantile(0.5).max(1) as f64
    );
    token.cancel();
    let _ = service.await;
    Ok(())
}
