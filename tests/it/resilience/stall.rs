//! The broker stops answering for a moment (nats-server descheduled on a busy machine, a host pause, SIGSTOP)
//! while the dispatcher's admitted sends wait for the ledger's on-the-wire mark before their request leaves.

use super::common::{SENT, Verdict, requests, services, submit, wait_states};
use bw_e2e::Harness;
use std::time::Duration;

const PHONE: &str = "106540352247101";
const WAIT: Duration = Duration::from_secs(90);

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill");
    assert!(status.success(), "kill {sig} {pid}");
}

/// At the compiled defaults (two dispatchers as users run them, the simulator at Meta's documented throughput:
/// 80 msg/s per number with a burst of 10, every refusal counted as limit-caused), one sender saturated with
/// 400 messages; nats-server is stopped (SIGSTOP) for 600 ms in the middle and continued.
///
/// The marks of the sends whose slots pass meanwhile all complete together when the broker wakes. Without the
/// late-send rule they would then all leave at once (28 × 130429 in this test with
/// `dispatch.late_send_tolerance_ms = 0`), a burst caused by Breakwater itself. With it they go back to
/// admission for new slots, but for the sender's small late-send allowance, which both processes share in Redis
/// (`claim_late.lua`). Proves: no 130429 at all, nothing lost, each message accepted once, and the late sends
/// went through the shared allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_held_up_by_a_stalled_broker_do_not_leave_as_one_burst_when_it_resumes() {
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    // The dispatchers check the sender registry (the compiled default).
    h.register(&[PHONE]).await;
    let mut procs = services("stall", &["dispatcher"]);
    let settings = vec![
        ("nats.url", h.nats.url()),
        ("redis.url", h.redis.url()),
        ("meta.base_url", h.sim.base_url()),
        ("meta.access_token", bw_e2e::ACCESS_TOKEN.to_string()),
    ];
    procs.spawn("dispatcher", &settings).expect("spawn dispatcher");
    procs.spawn("dispatcher", &settings).expect("spawn the second dispatcher");
    procs.wait_ready(WAIT).await.expect("dispatcher ready");

    let ops = submit(&h.producer(), requests(PHONE, "stall", 400), 64, WAIT).await;
    assert!(bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= 100 }).await, "sending");
    let nats = h.nats.pid().expect("nats-server pid");
    signal(nats, "-STOP");
    // The stall itself: the injected fault's length, not a wait for a condition.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let at_resume = h.sim.total_accepted();
    signal(nats, "-CONT");
    assert!(at_resume < 400, "the stall happened under load ({at_resume} already sent)");

    wait_states(&h.js, &h.buckets, &ops, &SENT, WAIT).await;
    let verdict = Verdict::of(&h.js, &h.buckets, &h.sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    assert!(verdict.duplicates.is_empty(), "each message accepted once: {:?}", verdict.duplicates);
    let counters = h.sim.counters();
    assert_eq!(
        (counters.outcome("130429"), counters.limit_exceeded("130429")),
        (0, 0),
        "Breakwater caused no throughput refusal: {:?}",
        counters.by_outcome
    );
    let scope = bw_breaker::Scope::new(bw_e2e::WABA_ID, PHONE);
    let mut redis =
        redis::Client::open(h.redis.url()).expect("redis url").get_multiplexed_async_connection().await.expect("redis");
    let late_at: Option<String> = redis::cmd("HGET")
        .arg(bw_breaker::scripts::state_key(&scope))
        .arg(bw_breaker::scripts::field(bw_breaker::scripts::STATE_FIELDS, "late_at").expect("late_at field"))
        .query_async(&mut redis)
        .await
        .expect("hget");
    assert!(late_at.is_some(), "the sends late after the stall asked the sender's shared allowance in Redis");
}
