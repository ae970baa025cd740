//! Throughput follows Meta, end to end with the dispatcher at its compiled defaults: the simulator's
//! `phone_number_quality_update` `THROUGHPUT_UPGRADE` webhook goes through ingest (stored, published on
//! BW_ACCOUNT) to the coordinator, which records the number's new limit in Redis; the admission every dispatcher
//! runs then spaces that number's sends for 1,000 x 0.925 = 925 per second instead of 74, and only that number's.
//! Inbound messages ingest forwards are counted against the same number's throughput, and a coexistence
//! number's app echo against the user's pair.

use bw_breaker::throughput::{Throughput, UPGRADED_MPS};
use bw_breaker::{AdmitItem, Breaker, Scope, TrafficClass};
use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::SimConfig;
use bw_proto::v1::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);
const A1: &str = "106540352205011";
const A2: &str = "106540352205012";
const OTHER_WABA: &str = "102290129340778";
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

fn sim() -> SimConfig {
    crate::open_sim(&[(A1, WABA_ID), (A2, OTHER_WABA)])
}

async fn submit(h: &Harness, waba: &str, phone: &str, prefix: &str, n: usize) -> Vec<String> {
    bw_e2e::register_senders(&h.js, &[(phone, waba)]).await;
    let mut ops = Vec::new();
    for i in 0..n {
        let op = format!("{prefix}-{i:03}");
        let r =
            bw_client::Request::template(&op, waba, phone, &format!("+5491166{i:06}"), "order_confirmation", "es_AR")
                .param("1")
                .category(Category::Transactional)
                .build();
        let reply = h.producer().send(&r).await.expect("ingest answers");
        assert!(reply.accepted, "{}", reply.error);
        ops.push(op);
    }
    ops
}

async fn redis(h: &Harness) -> bw_common::redis_conn::RedisConn {
    let conn = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    bw_common::redis_conn::RedisConn::Single(conn)
}

/// The dispatcher's compiled breaker configuration.
fn dispatcher_breaker() -> bw_breaker::BreakerConfig {
    bw_dispatcher::Config::load(None, &Default::default()).expect("compiled dispatcher config").breaker
}

/// The spacing of the number's send slots the admission gives now (the same script every dispatcher runs).
async fn slot_gap_ms(breaker: &Breaker, scope: &Scope) -> f64 {
    let item = AdmitItem { recipient_key: "probe".into(), class: TrafficClass::Priority };
    let admission = breaker.admit(scope, &[item]).await;
    assert!(!admission.degraded, "answered by Redis");
    admission.slot_gap_ms
}

use crate::sim_event as event;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throughput_upgrade_webhook_raises_the_dispatchers_rate_for_that_number_only() {
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    h.start_coordinator(&[]).await;
    let (a1, a2) = (Scope::new(WABA_ID, A1), Scope::new(OTHER_WABA, A2));

    // The coordinator learns the numbers from the dispatcher's first sends (and writes their config hashes).
    let warm = [submit(&h, WABA_ID, A1, "a1", 3).await, submit(&h, OTHER_WABA, A2, "a2", 3).await].concat();
    assert!(h.wait_all(&warm, &SENT, WAIT).await, "the first sends went out");
    let conn = redis(&h).await;
    let known = bw_testkit::wait_until(WAIT, || async {
        let mut c = conn.clone();
        let keys = [bw_breaker::scripts::cfg_key(&a1), bw_breaker::scripts::cfg_key(&a2)];
        redis::cmd("EXISTS").arg(&keys).query_async::<u32>(&mut c).await.ok() == Some(2)
    })
    .await;
    assert!(known, "the coordinator knows both numbers");
    let cfg = dispatcher_breaker();
    let breaker = Breaker::with_conn(Some(conn.clone()), None, cfg.clone());
    let before = slot_gap_ms(&breaker, &a1).await;
    let other_before = slot_gap_ms(&breaker, &a2).await;

    // Meta's webhook names the number by its display phone only; the coordinator finds the WABA's one number.
    h.sim
        .fire_event(event(serde_json::json!({
            "name": "upgrade", "kind": "phone_number_quality_update", "phone_number_id": A1,
            "event": "THROUGHPUT_UPGRADE",
        })))
        .expect("fired");
    let tput = Throughput::new(conn.clone(), Duration::from_secs(1), &cfg.defaults);
    let recorded =
        bw_testkit::wait_until(WAIT, || async { tput.read(&a1).await.map(|s| s.mps).unwrap_or(0) == UPGRADED_MPS })
            .await;
    let state = tput.read(&a1).await.expect("read");
    assert!(recorded, "the coordinator recorded the upgrade: {state:?}");
    assert_eq!(state.event, "THROUGHPUT_UPGRADE");
    assert_eq!(tput.read(&a2).await.expect("read").mps, 0, "the other number is not upgraded");

    // The admission the dispatchers run now spaces A1's slots 12.5 times closer: 925 per second for 74, the same
    // margin under Meta's new limit as under its default; A2 stays where it was. (Both readings go through the
    // same script at the same moment's factors, so their ratio is the configured rates' ratio.)
    let after = slot_gap_ms(&breaker, &a1).await;
    let ratio = before / after;
    assert!((ratio - 925.0 / 74.0).abs() < 0.05, "A1: {before} ms -> {after} ms, ratio {ratio}");
    assert!(after >= 1000.0 / f64::from(UPGRADED_MPS), "never above Meta's 1,000 per second: {after} ms");
    let other_after = slot_gap_ms(&breaker, &a2).await;
    assert!((other_before - other_after).abs() < 0.01, "A2 unchanged: {other_before} -> {other_after}");
    assert_eq!(bw_breaker::throughput::configured_rate(&cfg.defaults, state.mps), 925.0);

    // Inbound messages the webhook processor forwards count against the number's throughput.
    for i in 0..4 {
        h.sim
            .fire_event(event(serde_json::json!({
                "kind": "inbound", "phone_number_id": A1, "from": format!("+54911660{i:05}"),
            })))
            .expect("fired");
    }
    let counted =
        bw_testkit::wait_until(WAIT, || async { tput.read(&a1).await.map(|s| s.inbound_total).unwrap_or(0) == 4 })
            .await;
    assert!(counted, "4 inbound messages counted: {:?}", tput.read(&a1).await);
    // A message the business sent from the WhatsApp Business app (coexistence) takes a slot of that user's pair.
    const USER: &str = "+5491166999999";
    h.sim
        .fire_event(event(serde_json::json!({
            "kind": "smb_message_echoes", "phone_number_id": A1, "to": USER, "text": "from the app",
        })))
        .expect("fired");
    let pair = bw_breaker::scripts::pair_key(&a1, &bw_common::mask::recipient_key(USER));
    let echoed = bw_testkit::wait_until(WAIT, || async {
        let mut c = conn.clone();
        redis::cmd("HGET").arg(&pair).arg("t").query_async::<Option<i64>>(&mut c).await.ok().flatten().is_some()
    })
    .await;
    assert!(echoed, "the echo took a slot of the pair");
    // Sends after the upgrade go out once each.
    let after_ops = submit(&h, WABA_ID, A1, "a1-after", 5).await;
    assert!(h.wait_all(&after_ops, &SENT, WAIT).await, "sent after the upgrade");
    for op in &after_ops {
        assert_eq!(h.sim.oracle().get(op).expect("accepted").count, 1, "{op} sent once");
    }
}
