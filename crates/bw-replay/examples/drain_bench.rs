//! Drain benchmark: fills one sender's DLQ with N entries (default 125,000), runs the real replay service with
//! a configured rate, and measures how fast entries reach the replay lane, as a fraction of the configured
//! rate, plus the worst 1-second window (a window above rate + burst is what would risk 130429 at Meta).
//!
//! Two modes run back to back: `lane` (no lane-depth bound, nothing consuming the lane) and `dispatch` (a
//! stand-in dispatcher consumes the lane at the sender rate and the lane-depth bound is on). Meta, the
//! breaker and the real dispatcher are not in this loop. Usage:
//! `cargo run --release -p bw-replay --example drain_bench -- [N] [RATE_PER_S]`.
#![expect(clippy::disallowed_methods, reason = "the bench plays the dispatcher: it drains the replay lanes itself")]

use bw_common::config::NatsConfig;
use bw_common::ledger::Ledger;
use bw_common::service::Deps;
use bw_common::time::now_ms;
use bw_ops::pace::TokenBucket;
use bw_ops::scan::subject_depth;
use bw_proto::v1::*;
use bw_testkit::NatsServer;
use bw_wire::names;
use futures::StreamExt;
use prost::Message;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PHONE: &str = "1001";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(125_000);
    let rate: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1_000.0);
    for mode in ["lane", "dispatch"] {
        let nats = NatsServer::start();
        let cfg = NatsConfig::single(nats.url(), "");
        let deps = Deps::connect("bench", &cfg, None, Duration::from_secs(10)).await?;
        let fill = Instant::now();
        fill_dlq(&deps, n).await?;
        println!("[{mode}] filled {n} dlq entries (+ledger) in {:.1} s", fill.elapsed().as_secs_f64());
        let snapshot = ScopeSnapshot {
            scope: Some(Scope { waba_id: "9".into(), phone_number_id: PHONE.into() }),
            state: BreakerState::Closed as i32,
            ..Default::default()
        };
        deps.buckets.scopes.put(PHONE, snapshot.encode_to_vec().into()).await?;
        let burst = (rate / 20.0).max(1.0);
        let depth = if mode == "lane" { 0 } else { (rate / 2.0).max(10.0) as u64 };
        let env: HashMap<String, String> = [
            ("NATS__URL", nats.url()),
            ("ADMIN__LISTEN", "127.0.0.1:0".into()),
            ("REPLAY__SOAK_MS", "0".into()),
            ("REPLAY__RATE_PER_S", rate.to_string()),
            ("REPLAY__BURST", burst.to_string()),
            ("REPLAY__MAX_LANE_DEPTH", depth.to_string()),
            ("REPLAY__MAX_IN_FLIGHT", "64".into()),
            ("REPLAY__BATCH_SIZE", "256".into()),
            ("TELEMETRY__LOG_LEVEL", "warn".into()),
        ]
        .into_iter()
        .map(|(k, v)| (format!("BW_REPLAY__{k}"), v))
        .collect();
        let cfg: bw_replay::Config = bw_common::config::load("replay", bw_replay::DEFAULT_CONFIG, None, &env)?;
        let token = CancellationToken::new();
        let dispatcher = if mode == "dispatch" {
            Some(tokio::spawn(fake_dispatcher(deps.clone(), rate, token.clone())))
        } else {
            None
        };
        let start = Instant::now();
        let service = tokio::spawn(bw_replay::run(cfg, deps.clone(), token.clone()));
        // Poll the DLQ depth once a second until it is empty.
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let left = subject_depth(&deps.js, names::DLQ_STREAM, &names::dlq_scope_filter(PHONE)).await?;
            if left == 0 {
                break;
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        token.cancel();
        let _ = service.await;
        let consumed = match dispatcher {
            Some(d) => d.await.unwrap_or(0),
            None => 0,
        };
        let times = lane_times(&deps, mode == "dispatch").await?;
        let (first, last) = (times.first().copied().unwrap_or(0), times.last().copied().unwrap_or(0));
        let span_s = ((last - first) as f64 / 1000.0).max(0.001);
        let achieved = (times.len().saturating_sub(1)) as f64 / span_s;
        let worst = worst_window(&times, 1_000);
        println!(
            "[{mode}] drained {n} in {elapsed:.1} s; lane publishes {} over {span_s:.1} s = {achieved:.0}/s = {:.1}% of {rate}/s; \
             worst 1 s window {worst} (limit rate+burst = {:.0}); windows over limit: {}; stand-in dispatcher consumed {consumed}",
            times.len(),
            100.0 * achieved / rate,
            rate + burst,
            windows_over(&times, 1_000, (rate + burst) as usize),
        );
    }
    Ok(())
}

async fn fill_dlq(deps: &Deps, n: usize) -> anyhow::Result<()> {
    let ledger = Ledger::new(&deps.buckets);
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..n)
        .map(|i| {
            let ledger = ledger.clone();
            let js = deps.js.clone();
            async move {
                let op = format!("bench-{i}");
                let req = SendRequest {
                    operation_id: op.clone(),
                    waba_id: "9".into(),
                    phone_number_id: PHONE.into(),
                    recipient: "+5491155551234".into(),
                    category: Category::Marketing as i32,
                    payload: Some(send_request::Payload::Template(TemplatePayload {
                        name: "order".into(),
                        language: "en_US".into(),
                        ..Default::default()
                    })),
                    ..Default::default()
                };
                let mut e =
                    LedgerEntry { operation_id: op.clone(), phone_number_id: PHONE.into(), ..Default::default() };
                e.set_state(OperationState::Dlq);
                ledger.create(&e).await?;
                let env = DlqEnvelope { request: Some(req), dead_lettered_at_unix_ms: now_ms(), ..Default::default() };
                js.publish(names::dlq_subject(bw_proto::v1::Category::Marketing, PHONE), env.encode_to_vec().into())
                    .await?
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(512)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Consumes the replay lane at `rate` per second (acking), like a dispatcher whose sender has that spare rate.
async fn fake_dispatcher(deps: Deps, rate: f64, token: CancellationToken) -> usize {
    let Ok(stream) = deps.js.get_stream(names::SEND_STREAM).await else { return 0 };
    let config = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some("bench-dispatcher".into()),
        filter_subject: names::Lane::Replay.filter(),
        max_ack_pending: 100_000,
        ..Default::default()
    };
    let Ok(consumer) = stream.get_or_create_consumer("bench-dispatcher", config).await else { return 0 };
    let mut bucket = TokenBucket::new(rate, (rate / 20.0).max(1.0));
    let mut consumed = 0;
    while !token.is_cancelled() {
        let Ok(mut batch) = consumer.fetch().max_messages(64).expires(Duration::from_millis(100)).messages().await
        else {
            continue;
        };
        while let Some(Ok(msg)) = batch.next().await {
            bucket.take().await;
            let _ = msg.ack().await;
            consumed += 1;
        }
    }
    consumed
}

/// Times (Unix ms) entries entered the replay lane: the stream's own timestamps when nothing consumed the
/// lane, else the ledger update time of each replay (written just before its publish).
async fn lane_times(deps: &Deps, consumed: bool) -> anyhow::Result<Vec<i64>> {
    let mut times: Vec<i64> = if consumed {
        bw_ops::account::ledger_entries(&deps.js, &deps.buckets)
            .await?
            .into_iter()
            .filter(|e| e.replays > 0)
            .map(|e| e.updated_at_unix_ms)
            .collect()
    } else {
        bw_ops::scan::scan_stream(&deps.js, names::SEND_STREAM, &names::outbox_subject(names::Lane::Replay, PHONE))
            .await?
            .into_iter()
            .map(|m| (m.time.unix_timestamp_nanos() / 1_000_000) as i64)
            .collect()
    };
    times.sort();
    Ok(times)
}

fn worst_window(times: &[i64], window_ms: i64) -> usize {
    let (mut worst, mut j) = (0, 0);
    for i in 0..times.len() {
        while times[i] - times[j] >= window_ms {
            j += 1;
        }
        worst = worst.max(i - j + 1);
    }
    worst
}

fn windows_over(times: &[i64], window_ms: i64, limit: usize) -> usize {
    let (mut over, mut j) = (0, 0);
    for i in 0..times.len() {
        while times[i] - times[j] >= window_ms {
            j += 1;
        }
        if i - j + 1 > limit {
            over += 1;
        }
    }
    over
}
