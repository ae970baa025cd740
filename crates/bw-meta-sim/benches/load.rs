//! Load check for the simulator: `cargo bench -p bw-meta-sim --bench load`. Prints requests per second with
//! limits off, with every limit checked (ratio to limits off), with status webhooks to a local receiver, and how
//! many 130429 a 1,000 mps limit produces.

use bw_meta_sim::{Limits, MetaSim, SimConfig, WebhookConfig};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PHONE: &str = "106540352242922";

async fn hammer(url: &str, total: u64, concurrency: u64) -> (f64, u64, u64) {
    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build().expect("client");
    let next = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let throttled = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, next, ok, throttled) =
                (client.clone(), url.to_string(), next.clone(), ok.clone(), throttled.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return;
                    }
                    let body = json!({ "messaging_product": "whatsapp", "to": format!("+1650{:07}", i % 1_000_000),
                        "type": "text", "text": { "body": "hello" }, "biz_opaque_callback_data": format!("op-{i}") });
                    let Ok(r) = client.post(&url).bearer_auth("t").json(&body).send().await else { continue };
                    let status = r.status().as_u16();
                    let _ = r.bytes().await;
                    if status == 200 {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        throttled.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    (total as f64 / started.elapsed().as_secs_f64(), ok.load(Ordering::Relaxed), throttled.load(Ordering::Relaxed))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let total = 30_000;
    let sim = MetaSim::start(SimConfig { limits: Limits::disabled(), ..SimConfig::default() }).await?;
    let (base_rps, ok, _) = hammer(&sim.messages_url("v21.0", PHONE), total, 64).await;
    println!("limits off, no webhooks: {base_rps:>8.0} req/s ({ok} accepted)");
    sim.shutdown().await;

    // Every scope checked (number, pair, app, WABA) with budgets too large to refuse: the cost of the checks.
    let limits = Limits {
        throughput_mps: 1e9,
        throughput_burst: 1_000_000,
        pair_burst: 1_000_000,
        app_calls: Some(1_000_000_000),
        waba_calls: Some(1_000_000_000),
        ..Limits::default()
    };
    let sim = MetaSim::start(SimConfig { limits, ..SimConfig::default() }).await?;
    let (rps, ok, _) = hammer(&sim.messages_url("v21.0", PHONE), total, 64).await;
    println!(
        "every limit checked:      {rps:>8.0} req/s ({ok} accepted; {:.2} of limits off)",
        rps / base_rps.max(1.0)
    );
    sim.shutdown().await;

    let receiver = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hook = format!("http://{}/", receiver.local_addr()?);
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "ok" });
        let _ = axum::serve(receiver, app).await;
    });
    let webhook = WebhookConfig { url: Some(hook), ..WebhookConfig::default() };
    let sim = MetaSim::start(SimConfig { limits: Limits::disabled(), webhook, ..SimConfig::default() }).await?;
    let (rps, ok, _) = hammer(&sim.messages_url("v21.0", PHONE), total, 64).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while sim.webhooks_pending() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let w = sim.counters().webhooks;
    println!(
        "limits off, webhooks on:  {rps:>8.0} req/s ({ok} accepted; {} statuses in {} POSTs, {} dropped)",
        w.statuses_delivered, w.posts_ok, w.statuses_dropped
    );
    sim.shutdown().await;

    let limits = Limits { throughput_mps: 1_000.0, throughput_burst: 20, pair_enabled: false, ..Limits::default() };
    let sim = MetaSim::start(SimConfig { limits, ..SimConfig::default() }).await?;
    let (rps, ok, throttled) = hammer(&sim.messages_url("v21.0", PHONE), total, 64).await;
    println!(
        "1,000 mps limit:           {rps:>8.0} req/s ({ok} accepted, {throttled} refused, 130429 counted: {})",
        sim.counters().outcome("130429")
    );
    sim.shutdown().await;
    Ok(())
}
