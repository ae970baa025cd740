//! The portfolio messaging-limit budget end to end (issue #36 item 2), dispatcher at its compiled defaults against
//! the simulator, which fails messages past a portfolio's tier as Meta does (accepted, then a `failed` status):
//! a portfolio at the 2K tier sends 2,000 new recipients and holds the next 1,000 with their reason, none failing
//! at Meta; authentication within the reserve goes while marketing is held, and a tier rise (Meta's
//! `business_capability_update`) releases the held messages, each sent once; an inbound message opens the
//! recipient's service window, so a template to them does not count.

use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::{FailureCause, PortfolioConfig, SimConfig, Tier};
use bw_proto::v1::*;
use bw_wire::names::{self, Lane};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);
const PHONE: &str = "106540352206001";
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
const HELD_PREFIX: &str = "held: portfolio messaging limit";

/// The simulator's default business portfolio (every number's, unless configured otherwise).
fn portfolio() -> String {
    SimConfig::default().business_id
}

fn sim(tier: &str) -> SimConfig {
    let mut cfg = SimConfig::default();
    cfg.limits.throughput_mps = 1_000.0;
    cfg.limits.throughput_burst = 1_000;
    cfg.limits.pair_enabled = false;
    cfg.portfolios.insert(portfolio(), PortfolioConfig { tier: Tier::parse(tier).expect("tier"), waba_ids: vec![] });
    cfg
}

/// Starts ingest, a dispatcher at its compiled defaults and the coordinator, and registers the sender with its
/// portfolio.
async fn stack(tier: &str) -> Harness {
    let mut h = Harness::start(sim(tier)).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    h.start_coordinator(&[]).await;
    let registry = bw_common::registry::Registry::open(&h.js, 1).await.expect("registry");
    let record = SenderRecord {
        phone_number_id: PHONE.into(),
        waba_id: WABA_ID.into(),
        tenant: bw_wire::tenancy::DEFAULT_TENANT.into(),
        portfolio_id: portfolio(),
        updated_at_unix_ms: bw_common::time::now_ms(),
    };
    registry.add(&record).await.expect("registered");
    h
}

fn request(op: &str, to: usize, category: Category) -> SendRequest {
    let (name, param) = match category {
        Category::Authentication => ("otp_code", "123456"),
        Category::Marketing => ("flash_sale", "40%"),
        _ => ("order_confirmation", "1"),
    };
    bw_client::Request::template(op, WABA_ID, PHONE, &format!("+5491180{to:06}"), name, "es_AR")
        .param(param)
        .category(category)
        .build()
}

/// Submits the requests through ingest, a few at a time; every one must be accepted.
async fn submit(h: &Harness, requests: Vec<SendRequest>) -> Vec<String> {
    let ops: Vec<String> = requests.iter().map(|r| r.operation_id.clone()).collect();
    let producer = h.producer();
    let mut tasks = tokio::task::JoinSet::new();
    for r in requests {
        let p = producer.clone();
        tasks.spawn(async move { p.send(&r).await.map(|reply| reply.accepted) });
        while tasks.len() >= 32 {
            assert!(tasks.join_next().await.expect("task").expect("join").expect("answer"), "accepted");
        }
    }
    while let Some(r) = tasks.join_next().await {
        assert!(r.expect("join").expect("answer"), "accepted");
    }
    ops
}

/// Operations whose ledger entry is QUEUED with the budget's reason.
async fn held(h: &Harness, ops: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for op in ops {
        if let Some(v) = h.ledger_entry(op).await
            && v.entry.state() == OperationState::Queued
            && v.entry.reason.starts_with(HELD_PREFIX)
        {
            out.push(op.clone());
        }
    }
    out
}

async fn sent(h: &Harness, ops: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for op in ops {
        if h.ledger_entry(op).await.is_some_and(|v| SENT.contains(&v.entry.state())) {
            out.push(op.clone());
        }
    }
    out
}

fn nothing_failed_at_meta(h: &Harness) {
    let c = h.sim.counters();
    assert_eq!(c.async_failed_for(FailureCause::Limit, 131048), 0, "no message failed at Meta for the limit");
    assert!(c.portfolio_limited.is_empty(), "{:?}", c.portfolio_limited);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portfolio_at_the_2k_tier_sends_2000_new_recipients_and_holds_1000_with_their_reason() {
    let h = stack("TIER_2K").await;
    let requests: Vec<SendRequest> =
        (0..3_000).map(|i| request(&format!("tier2k-{i:04}"), i, Category::Transactional)).collect();
    let ops = submit(&h, requests).await;

    let settled = bw_testkit::wait_until(WAIT * 2, || async {
        sent(&h, &ops).await.len() == 2_000 && held(&h, &ops).await.len() == 1_000
    })
    .await;
    let (sent_ops, held_ops) = (sent(&h, &ops).await, held(&h, &ops).await);
    assert!(settled, "2,000 sent and 1,000 held: {} sent, {} held", sent_ops.len(), held_ops.len());
    let entry = h.ledger_entry(&held_ops[0]).await.expect("entry").entry;
    let portfolio = portfolio();
    assert!(entry.reason.contains(&format!("portfolio {portfolio}")), "{}", entry.reason);
    assert!(entry.reason.contains("2000 of 2000"), "{}", entry.reason);
    assert!(!entry.reason.contains("+549"), "no phone number in the reason");
    assert_eq!(entry.attempts, 0, "a held message never reached Meta");
    let oracle = h.sim.oracle();
    for op in &sent_ops {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted once");
    }
    for op in &held_ops {
        assert!(oracle.get(op).is_none(), "{op} never sent");
    }
    assert_eq!(h.sim.total_accepted(), 2_000);
    nothing_failed_at_meta(&h);
    // The operator sees it too: the portfolio's row under `bwctl scopes`.
    let redis_url = h.redis.url();
    let (code, out) = crate::bwctl(&h.nats.url(), &["--redis-url", &redis_url, "scopes"]).await;
    assert_eq!(code, 0);
    let row = out.lines().find(|l| l.starts_with(&portfolio)).unwrap_or_default();
    assert!(row.contains("2000 (100%)") && row.contains("graph TIER_2K"), "{out}");
    assert!(row.contains("all classes held"), "{out}");
    assert!(!out.contains("+549"), "no number in clear: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_within_the_reserve_goes_while_marketing_is_held_and_a_tier_rise_releases_it() {
    // A tier of 20 users: marketing may reach 18, the last 2 are reserved for authentication and utility.
    let h = stack("20").await;
    let marketing: Vec<SendRequest> =
        (0..30).map(|i| request(&format!("mkt-{i:02}"), i, Category::Marketing)).collect();
    let marketing = submit(&h, marketing).await;
    let first = bw_testkit::wait_until(WAIT, || async {
        sent(&h, &marketing).await.len() == 18 && held(&h, &marketing).await.len() == 12
    })
    .await;
    assert!(first, "marketing stops at the reserve: {} sent", sent(&h, &marketing).await.len());
    let reason = h.ledger_entry(&held(&h, &marketing).await[0]).await.expect("entry").entry.reason;
    assert!(reason.contains("marketing may use 18"), "{reason}");

    let otps: Vec<SendRequest> =
        (0..2).map(|i| request(&format!("otp-{i}"), 100 + i, Category::Authentication)).collect();
    let otps = submit(&h, otps).await;
    assert!(h.wait_all(&otps, &SENT, WAIT).await, "OTPs within the reserve are not held");
    let over = submit(&h, vec![request("otp-over", 200, Category::Authentication)]).await;
    let over_held = bw_testkit::wait_until(WAIT, || async { held(&h, &over).await.len() == 1 }).await;
    assert!(over_held, "past the whole limit even an OTP waits");
    assert_eq!(held(&h, &marketing).await.len(), 12, "marketing stays held");

    // Meta raises the portfolio to 2,000: every held message goes out, once.
    let up: bw_meta_sim::Event = serde_json::from_value(serde_json::json!({
        "name": "tier-2k", "kind": "business_capability_update", "max_daily_conversations_per_business": "TIER_2K",
    }))
    .expect("event");
    h.sim.fire_event(up).expect("fired");
    let all: Vec<String> = marketing.iter().chain(&otps).chain(&over).cloned().collect();
    assert!(h.wait_all(&all, &SENT, WAIT).await, "the tier rise released every held message");
    let oracle = h.sim.oracle();
    for op in &all {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted once");
    }
    nothing_failed_at_meta(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbound_message_opens_the_window_so_that_recipient_does_not_count() {
    let h = stack("3").await;
    let writer = 50;
    let from = format!("+5491180{writer:06}");
    h.sim.inject_inbound(PHONE, &from, "Ana", "hola").expect("inbound webhook sent");
    let redis = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    let budget = bw_breaker::budget::PortfolioBudget::new(bw_breaker::RedisConn::Single(redis));
    let rk = bw_common::mask::recipient_key(&from);
    let open = bw_testkit::wait_until(WAIT, || async { budget.window_open(PHONE, &rk).await.unwrap_or(false) }).await;
    assert!(open, "ingest recorded the window");

    let requests: Vec<SendRequest> =
        [0, 1, 2, writer].into_iter().map(|i| request(&format!("win-{i}"), i, Category::Transactional)).collect();
    let ops = submit(&h, requests).await;
    assert!(h.wait_all(&ops, &SENT, WAIT).await, "3 new users and the one in its window: all sent");
    let fourth = submit(&h, vec![request("win-new", 3, Category::Transactional)]).await;
    let over = bw_testkit::wait_until(WAIT, || async { held(&h, &fourth).await.len() == 1 }).await;
    assert!(over, "a 4th new user is held");
    let state = budget.read(&portfolio(), 250).await.expect("read");
    assert_eq!((state.used, state.limit, state.source.as_str()), (3, 3, "graph"), "{state:?}");
    nothing_failed_at_meta(&h);
}

/// Pending deliveries of a durable consumer of BW_SEND (partition 0): delivered and not yet acked.
async fn ack_pending(h: &Harness, consumer: &str) -> usize {
    let stream = h.js.get_stream(names::SendPartitions::stream(0)).await.expect("BW_SEND");
    let mut c: async_nats::jetstream::consumer::PullConsumer = stream.get_consumer(consumer).await.expect("consumer");
    c.info().await.expect("consumer info").num_ack_pending
}

/// The compiled defaults: a flash sale past the portfolio's limit leaves its lane. The held marketing waits on the
/// held consumer, not in the marketing lane's pending set (whose 50,000 would otherwise stop the lane), an OTP goes
/// meanwhile, and once Meta raises the tier every held message is sent, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_marketing_waits_out_of_its_lane_and_goes_once_when_the_budget_frees() {
    let h = stack("20").await;
    let sale: Vec<SendRequest> = (0..60).map(|i| request(&format!("sale-{i:02}"), i, Category::Marketing)).collect();
    let sale = submit(&h, sale).await;
    let first = bw_testkit::wait_until(WAIT, || async {
        sent(&h, &sale).await.len() == 18 && held(&h, &sale).await.len() == 42
    })
    .await;
    assert!(first, "18 sent, 42 held: {} sent, {} held", sent(&h, &sale).await.len(), held(&h, &sale).await.len());
    let lane_clear =
        bw_testkit::wait_until(WAIT, || async { ack_pending(&h, Lane::Low.dispatcher_consumer()).await == 0 }).await;
    assert!(lane_clear, "held messages leave the lane's pending set");
    let parked = bw_testkit::wait_until(WAIT, || async { ack_pending(&h, names::HELD_CONSUMER).await == 42 }).await;
    assert!(parked, "the held consumer has them: {}", ack_pending(&h, names::HELD_CONSUMER).await);

    let otp = submit(&h, vec![request("sale-otp", 100, Category::Authentication)]).await;
    assert!(h.wait_all(&otp, &SENT, WAIT).await, "an OTP within the reserve goes while the sale is held");

    let up: bw_meta_sim::Event = serde_json::from_value(serde_json::json!({
        "name": "tier-2k", "kind": "business_capability_update", "max_daily_conversations_per_business": "TIER_2K",
    }))
    .expect("event");
    h.sim.fire_event(up).expect("fired");
    assert!(h.wait_all(&sale, &SENT, WAIT).await, "the tier rise released every held message");
    let oracle = h.sim.oracle();
    for op in sale.iter().chain(&otp) {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted once");
    }
    nothing_failed_at_meta(&h);
}

/// A held backlog larger than the lane's pending cap. Relaxed beside the default test above: the marketing lane's
/// consumer is created with a cap of 10 (the default is 50,000, too many for a test) before the dispatcher binds
/// to it. 30 held messages do not stop the lane: a marketing message to a recipient in its service window (not
/// counted) on the same lane still goes, and so does an OTP; all go once after the tier rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_backlog_past_the_lane_cap_does_not_stop_the_lanes_other_messages() {
    const CAP: i64 = 10;
    let mut h = Harness::start(sim("20")).await;
    h.start_ingest(&[]).await;
    let stream = h.js.get_stream(names::SendPartitions::stream(0)).await.expect("BW_SEND");
    let lane = Lane::Low;
    let config = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some(lane.dispatcher_consumer().into()),
        filter_subject: names::SendPartitions::lane_filter(0, lane),
        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        max_deliver: -1,
        max_ack_pending: CAP,
        ..Default::default()
    };
    stream.get_or_create_consumer(lane.dispatcher_consumer(), config).await.expect("lane consumer with a small cap");
    h.start_dispatcher_at_defaults().await;
    h.start_coordinator(&[]).await;
    let registry = bw_common::registry::Registry::open(&h.js, 1).await.expect("registry");
    let record = SenderRecord {
        phone_number_id: PHONE.into(),
        waba_id: WABA_ID.into(),
        tenant: bw_wire::tenancy::DEFAULT_TENANT.into(),
        portfolio_id: portfolio(),
        updated_at_unix_ms: bw_common::time::now_ms(),
    };
    registry.add(&record).await.expect("registered");

    let sale: Vec<SendRequest> = (0..48).map(|i| request(&format!("cap-{i:02}"), i, Category::Marketing)).collect();
    let sale = submit(&h, sale).await;
    let first = bw_testkit::wait_until(WAIT, || async {
        sent(&h, &sale).await.len() == 18 && held(&h, &sale).await.len() == 30
    })
    .await;
    assert!(first, "18 sent, 30 held: {} sent, {} held", sent(&h, &sale).await.len(), held(&h, &sale).await.len());

    // A customer who wrote in: marketing to them does not count, so it goes on the same lane.
    let writer = 500;
    h.sim.inject_inbound(PHONE, &format!("+5491180{writer:06}"), "Ana", "hola").expect("inbound webhook sent");
    let redis = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    let budget = bw_breaker::budget::PortfolioBudget::new(bw_breaker::RedisConn::Single(redis));
    let rk = bw_common::mask::recipient_key(&format!("+5491180{writer:06}"));
    let open = bw_testkit::wait_until(WAIT, || async { budget.window_open(PHONE, &rk).await.unwrap_or(false) }).await;
    assert!(open, "ingest recorded the window");
    let reply = submit(&h, vec![request("cap-window", writer, Category::Marketing)]).await;
    assert!(h.wait_all(&reply, &SENT, WAIT).await, "the lane's other marketing goes past 30 held, cap 10");
    let otp = submit(&h, vec![request("cap-otp", 900, Category::Authentication)]).await;
    assert!(h.wait_all(&otp, &SENT, WAIT).await, "an OTP goes");
    assert_eq!(held(&h, &sale).await.len(), 30, "the sale stays held");

    let up: bw_meta_sim::Event = serde_json::from_value(serde_json::json!({
        "name": "tier-2k", "kind": "business_capability_update", "max_daily_conversations_per_business": "TIER_2K",
    }))
    .expect("event");
    h.sim.fire_event(up).expect("fired");
    assert!(h.wait_all(&sale, &SENT, WAIT).await, "the tier rise released every held message");
    let oracle = h.sim.oracle();
    for op in sale.iter().chain(&reply).chain(&otp) {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted once");
    }
    nothing_failed_at_meta(&h);
}
