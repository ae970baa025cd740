//! DLQ replay benchmark, end to end (issue: DLQ and replay). One sender's dead-letter queue of N messages
//! (default 125,000) is drained by the replay service through the dispatcher to the Meta simulator, with the
//! sender configured at R msg/s (default 1,000: Meta's upgraded tier; the simulator enforces R / 0.95 like Meta
//! would). Prints the achieved rate as a fraction of the configured rate and the rate-limit errors (130429,
//! 131056) the drain caused at Meta. Target: above 90 % and zero.
//!
//! Meta documents no burst size for its throughput limit. The simulator is given 50 ms of it (BW_BENCH_META_BURST,
//! default 50 messages) and the breaker half of that (BW_BENCH_BURST, default 25): a sender's burst must stay
//! well under Meta's tolerance, because admitted sends reach Meta with some scheduling jitter.
//!
//! Run: `cargo bench -p bw-e2e --bench replay_drain` (BW_BENCH_N and BW_BENCH_RATE change N and R;
//! BW_BENCH_VERBOSE=1 prints progress every 2 s; BW_BENCH_IDLE sets the dispatcher's idle wait, ms).

use bw_e2e::{Harness, WABA_ID};
use bw_proto::v1::{BreakerState, Category, DlqEnvelope, DlqReason, OperationState, Scope, ScopeSnapshot};
use bw_wire::names;
use prost::Message as _;
use std::time::{Duration, Instant};

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PHONE: &str = "106540352247777";

fn main() {
    bw_common::crypto::install_crypto();
    let n: usize = std::env::var("BW_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(125_000);
    let rate: f64 = std::env::var("BW_BENCH_RATE").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000.0);
    let meta_burst: u32 = std::env::var("BW_BENCH_META_BURST").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let burst: u32 = std::env::var("BW_BENCH_BURST").ok().and_then(|v| v.parse().ok()).unwrap_or(25);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async move {
        let mut sim = bw_meta_sim::SimConfig::default();
        sim.limits.throughput_mps = rate / 0.95;
        sim.limits.throughput_burst = meta_burst;
        sim.webhook.sent_delay_ms = None;
        sim.webhook.delivered_delay_ms = None;
        sim.webhook.read_delay_ms = None;
        let mut h = Harness::start(sim).await;

        // The outage left N messages in the sender's DLQ.
        let started = Instant::now();
        let mut acks = Vec::with_capacity(4096);
        let mut creates = tokio::task::JoinSet::new();
        for i in 0..n {
            let mut request = bw_client::Request::template(&format!("drain-{i:07}"), WABA_ID, PHONE, &format!("+5491{i:09}"), "order_confirmation", "es_AR")
                .param("1")
                .category(Category::Marketing)
                .build();
            request.accepted_at_unix_ms = bw_common::time::now_ms();
            let ledger = h.ledger.clone();
            let entry = bw_common::ledger::entry_for(&request, OperationState::Dlq);
            creates.spawn(async move { ledger.create(&entry).await.expect("ledger") });
            while creates.len() > 512 {
                creates.join_next().await;
            }
            let envelope = DlqEnvelope { request: Some(request), reason: DlqReason::BreakerOpen as i32, incident_id: "bench".into(), ..Default::default() };
            acks.push(h.js.publish(names::dlq_subject(bw_proto::v1::Category::Marketing, PHONE), envelope.encode_to_vec().into()).await.expect("publish"));
            if acks.len() == 4096 {
                for a in acks.drain(..) {
                    a.await.expect("ack");
                }
            }
        }
        for a in acks.drain(..) {
            a.await.expect("ack");
        }
        while creates.join_next().await.is_some() {}
        println!("loaded {n} DLQ entries in {:.1} s", started.elapsed().as_secs_f64());

        h.start_dispatcher(&[
            ("breaker.defaults.rate_per_s", format!("{rate}")),
            ("breaker.defaults.burst", burst.to_string()),
            ("breaker.defaults.ramp_ms", "0".into()),
            ("dispatch.publish_outcomes", "false".into()),
            ("dispatch.idle_wait_ms", std::env::var("BW_BENCH_IDLE").unwrap_or("50".into())),
        ])
        .await;
        h.start_replay(&[("replay.rate_per_s", format!("{rate}")), ("replay.burst", burst.to_string()), ("replay.max_lane_depth", "64".into())]).await;
        // The breaker is CLOSED: replay may start.
        let snapshot = ScopeSnapshot {
            scope: Some(Scope { waba_id: WABA_ID.into(), phone_number_id: PHONE.into() }),
            state: BreakerState::Closed as i32,
            ..Default::default()
        };
        h.buckets.scopes.put(PHONE, snapshot.encode_to_vec().into()).await.expect("scope snapshot");

        let t0 = Instant::now();
        let mut first: Option<Instant> = None;
        let verbose = std::env::var("BW_BENCH_VERBOSE").is_ok();
        let (mut last_print, mut last_accepted) = (Instant::now(), 0u64);
        loop {
            let accepted = h.sim.total_accepted();
            if accepted > 0 && first.is_none() {
                first = Some(Instant::now());
            }
            if verbose && last_print.elapsed() >= Duration::from_secs(2) {
                let lane = bw_ops::scan::subject_depth(&h.js, names::SEND_STREAM, &names::outbox_subject(names::Lane::Replay, PHONE)).await.unwrap_or(0);
                let dlq = bw_ops::scan::subject_depth(&h.js, names::DLQ_STREAM, &names::dlq_scope_filter(PHONE)).await.unwrap_or(0);
                let rate = (accepted - last_accepted) as f64 / last_print.elapsed().as_secs_f64();
                let limited = h.sim.counters().outcome("130429");
                println!("  t={:>5.1}s accepted {accepted} ({rate:.0}/s) replay lane {lane} dlq {dlq} 130429 so far {limited}", t0.elapsed().as_secs_f64());
                (last_print, last_accepted) = (Instant::now(), accepted);
            }
            if accepted >= n as u64 || t0.elapsed() > Duration::from_secs(n as u64 / (rate as u64).max(1) * 3 + 60) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let took = first.map(|f| f.elapsed()).unwrap_or_default().as_secs_f64().max(0.001);
        let oracle = h.sim.oracle();
        let counters = h.sim.counters();
        let accepted = oracle.total_accepted();
        let achieved = accepted as f64 / took;
        println!("replay drain, one sender configured at {rate:.0} msg/s (Meta limit {:.0}), {n} DLQ messages", rate / 0.95);
        println!("  drained {accepted} in {took:.1} s = {achieved:.0} msg/s = {:.1}% of the configured rate", achieved / rate * 100.0);
        println!(
            "  rate-limit errors caused at Meta: 130429 x{}, 131056 x{}; duplicates at Meta: {}",
            counters.outcome("130429"),
            counters.outcome("131056"),
            oracle.duplicates().len()
        );
    });
}
