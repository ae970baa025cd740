//! bw-replay against a real nats-server: replay only while CLOSED and exactly once (two instances), the
//! checks before sending, poison, pacing, the lane-depth bound, and an operator replay racing the service.
//! Replay runs at the compiled default tenancy (the sender registry): the test senders are registered to the
//! tenant `default` ([`register_senders`]), so their operation keys are the bare ids.
#![expect(clippy::disallowed_methods, reason = "the test reads a lane as a dispatcher would and settles what it read")]

use bw_common::config::NatsConfig;
use bw_common::ledger::Ledger;
use bw_common::nats::publish_durable;
use bw_common::service::Deps;
use bw_common::time::now_ms;
use bw_ops::scan::{scan_stream, subject_depth};
use bw_proto::v1::*;
use bw_testkit::{NatsServer, wait_until};
use bw_wire::names;
use futures::StreamExt;
use prost::Message;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const PHONE: &str = "1001";
/// The failover tests' secondary sender.
const SECONDARY: &str = "2002";
const WAIT: Duration = Duration::from_secs(20);

struct Replay {
    token: CancellationToken,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Replay {
    async fn stop(self) {
        self.token.cancel();
        let result = tokio::time::timeout(Duration::from_secs(15), self.handle).await;
        assert!(matches!(result, Ok(Ok(Ok(())))), "replay did not stop cleanly: {result:?}");
    }
}

async fn deps(nats: &NatsServer) -> Deps {
    let cfg = NatsConfig::single(nats.url(), "");
    Deps::connect("replay-test", &cfg, None, Duration::from_secs(10)).await.expect("connect")
}

/// Registers the test senders (WABA 9) to the tenant `default`, as `bwctl senders add` does.
async fn register_senders(deps: &Deps) {
    let registry = bw_common::registry::Registry::open(&deps.js, 1).await.expect("registry");
    for phone in [PHONE, SECONDARY] {
        let record = SenderRecord {
            phone_number_id: phone.into(),
            waba_id: "9".into(),
            tenant: bw_wire::tenancy::DEFAULT_TENANT.into(),
            ..Default::default()
        };
        registry.add(&record).await.expect("registered");
    }
}

/// Starts replay with the test senders registered first.
async fn start(nats: &NatsServer, overrides: &[(&str, &str)]) -> Replay {
    register_senders(&deps(nats).await).await;
    launch(nats, overrides).await
}

/// Starts replay with the registry as it is.
async fn start_unregistered(nats: &NatsServer) -> Replay {
    launch(nats, &[]).await
}

async fn launch(nats: &NatsServer, overrides: &[(&str, &str)]) -> Replay {
    let mut env: HashMap<String, String> = [
        ("NATS__URL", nats.url().as_str()),
        ("ADMIN__LISTEN", "127.0.0.1:0"),
        ("REPLAY__SOAK_MS", "0"),
        ("REPLAY__IDLE_MS", "50"),
        ("REPLAY__FETCH_WAIT_MS", "100"),
        ("REPLAY__STATS_INTERVAL_MS", "200"),
        ("REPLAY__LEASE_TTL_MS", "3000"),
        ("REPLAY__RATE_PER_S", "1000"),
        ("REPLAY__BURST", "20"),
        ("REPLAY__MAX_LANE_DEPTH", "0"),
    ]
    .iter()
    .map(|(k, v)| (format!("BW_REPLAY__{k}"), v.to_string()))
    .collect();
    for (k, v) in overrides {
        env.insert(format!("BW_REPLAY__{k}"), v.to_string());
    }
    let cfg: bw_replay::Config =
        bw_common::config::load("replay", bw_replay::DEFAULT_CONFIG, None, &env).expect("test config");
    let deps = deps(nats).await;
    let token = CancellationToken::new();
    let handle = tokio::spawn(bw_replay::run(cfg, deps, token.clone()));
    Replay { token, handle }
}

/// A marketing template (its DLQ entries are replayed onto the rp lane, paced to spare rate).
fn template(op: &str) -> SendRequest {
    SendRequest {
        operation_id: op.into(),
        waba_id: "9".into(),
        phone_number_id: PHONE.into(),
        recipient: "+5491155551234".into(),
        category: Category::Marketing as i32,
        payload: Some(send_request::Payload::Template(TemplatePayload {
            name: "order".into(),
            language: "en_US".into(),
            ..Default::default()
        })),
        accepted_at_unix_ms: now_ms(),
        ..Default::default()
    }
}

fn text(op: &str, last_inbound_ms: i64) -> SendRequest {
    SendRequest {
        payload: Some(send_request::Payload::Text(TextPayload { body: "hello".into(), preview_url: false })),
        customer_last_inbound_unix_ms: last_inbound_ms,
        ..template(op)
    }
}

async fn set_ledger(deps: &Deps, req: &SendRequest, state: OperationState, replays: u32) {
    let mut e = LedgerEntry {
        operation_id: req.operation_id.clone(),
        phone_number_id: req.phone_number_id.clone(),
        replays,
        ..Default::default()
    };
    e.set_state(state);
    Ledger::new(&deps.buckets).update(&req.operation_id, |_| Some(e.clone())).await.expect("ledger");
}

async fn put_dlq(deps: &Deps, req: SendRequest, replays: u32, not_before: i64) {
    set_ledger(deps, &req, OperationState::Dlq, replays).await;
    let op = req.operation_id.clone();
    let req_category = req.category();
    let env = DlqEnvelope {
        request: Some(req),
        reason: DlqReason::BreakerOpen as i32,
        replay_attempts: replays,
        not_before_unix_ms: not_before,
        dead_lettered_at_unix_ms: now_ms(),
        ..Default::default()
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, format!("{op}.dlq{replays}").as_str());
    publish_durable(&deps.js, names::dlq_subject(req_category, PHONE), headers, env.encode_to_vec().into())
        .await
        .expect("dlq");
}

async fn set_scope(deps: &Deps, state: BreakerState, since_ms: i64) {
    let snapshot = ScopeSnapshot {
        scope: Some(Scope { waba_id: "9".into(), phone_number_id: PHONE.into() }),
        state: state as i32,
        since_unix_ms: since_ms,
        updated_at_unix_ms: now_ms(),
        ..Default::default()
    };
    deps.buckets.scopes.put(PHONE, snapshot.encode_to_vec().into()).await.expect("scope");
}

/// (operation id, msg id, stored at unix ms) of every message in the replay lane.
async fn rp_lane(deps: &Deps) -> Vec<(String, String, i64)> {
    lane(deps, names::Lane::Replay).await
}

/// (operation id, msg id, stored at unix ms) of every message of PHONE in `lane`.
async fn lane(deps: &Deps, lane: names::Lane) -> Vec<(String, String, i64)> {
    scan_stream(&deps.js, names::SEND_STREAM, &names::outbox_subject(lane, PHONE))
        .await
        .expect("scan")
        .into_iter()
        .map(|m| {
            let op = SendRequest::decode(m.payload.as_ref()).expect("request").operation_id;
            let id = m.headers.get(async_nats::header::NATS_MESSAGE_ID).map(|v| v.to_string()).unwrap_or_default();
            (op, id, (m.time.unix_timestamp_nanos() / 1_000_000) as i64)
        })
        .collect()
}

async fn dlq_depth(deps: &Deps) -> u64 {
    subject_depth(&deps.js, names::DLQ_STREAM, &names::dlq_scope_filter(PHONE)).await.expect("depth")
}

async fn rp_depth(deps: &Deps) -> u64 {
    subject_depth(&deps.js, names::SEND_STREAM, &names::outbox_subject(names::Lane::Replay, PHONE))
        .await
        .expect("depth")
}

async fn ledger(deps: &Deps, op: &str) -> LedgerEntry {
    Ledger::new(&deps.buckets).get(op).await.expect("ledger").expect("entry").entry
}

fn assert_exactly_once(lane: &[(String, String, i64)], expected: &BTreeSet<String>) {
    let ops: Vec<&String> = lane.iter().map(|(op, _, _)| op).collect();
    let unique: BTreeSet<String> = ops.iter().map(|s| s.to_string()).collect();
    assert_eq!(ops.len(), unique.len(), "an operation appears twice in the replay lane");
    assert_eq!(&unique, expected);
}

#[tokio::test]
async fn replays_only_while_closed_and_exactly_once_across_two_instances() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    let expected: BTreeSet<String> = (0..30).map(|i| format!("op-{i}")).collect();
    for op in &expected {
        put_dlq(&deps, template(op), 0, 0).await;
    }
    set_scope(&deps, BreakerState::Open, now_ms()).await;
    let a = start(&nats, &[("REPLAY__INSTANCE_ID", "a")]).await;
    let b = start(&nats, &[("REPLAY__INSTANCE_ID", "b")]).await;
    // Nothing may move while OPEN; give both instances several idle cycles to prove it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(rp_lane(&deps).await.is_empty(), "replayed while the breaker was OPEN");
    assert_eq!(dlq_depth(&deps).await, 30);

    set_scope(&deps, BreakerState::Closed, now_ms()).await;
    assert!(wait_until(WAIT, || async { dlq_depth(&deps).await == 0 && rp_lane(&deps).await.len() >= 30 }).await);
    let lane = rp_lane(&deps).await;
    assert_exactly_once(&lane, &expected);
    for (op, msg_id, _) in &lane {
        assert_eq!(msg_id, &format!("{op}.r1"));
        let e = ledger(&deps, op).await;
        assert_eq!((e.state(), e.replays), (OperationState::Queued, 1), "{op}");
    }
    a.stop().await;
    b.stop().await;
    assert_eq!(rp_lane(&deps).await.len(), 30, "nothing replayed twice after the drain");
    let report = bw_ops::account::account(&deps.js, &deps.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn checks_before_sending_expire_skip_quarantine_delay_and_poison() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    let day = 24 * 3600 * 1000;
    let mut late = template("expired-1");
    late.deadline_unix_ms = now_ms() - 1;
    put_dlq(&deps, late, 0, 0).await;
    put_dlq(&deps, template("sent-1"), 0, 0).await;
    set_ledger(&deps, &template("sent-1"), OperationState::Sent, 0).await;
    put_dlq(&deps, text("window-1", now_ms() - day - 60_000), 0, 0).await;
    put_dlq(&deps, text("fresh-text-1", now_ms() - 60_000), 0, 0).await;
    let mut old_template = template("template-1");
    old_template.customer_last_inbound_unix_ms = now_ms() - 3 * day;
    put_dlq(&deps, old_template, 0, 0).await;
    put_dlq(&deps, template("poison-1"), 5, 0).await;
    let not_before = now_ms() + 1_500;
    put_dlq(&deps, template("later-1"), 2, not_before).await;

    let mut signals = deps.nats.subscribe(names::signal_subject("poison")).await.expect("subscribe");
    set_scope(&deps, BreakerState::Closed, 0).await;
    let replay = start(&nats, &[]).await;
    assert!(wait_until(WAIT, || async { dlq_depth(&deps).await == 0 }).await, "dlq not drained");

    let lane = rp_lane(&deps).await;
    let expected: BTreeSet<String> = ["fresh-text-1", "template-1", "later-1"].iter().map(|s| s.to_string()).collect();
    assert_exactly_once(&lane, &expected);
    let later = lane.iter().find(|(op, _, _)| op == "later-1").expect("later-1 replayed");
    assert_eq!(later.1, "later-1.r3");
    assert!(later.2 >= not_before - 50, "replayed {} ms before not_before", not_before - later.2);

    assert_eq!(ledger(&deps, "expired-1").await.state(), OperationState::Expired);
    assert_eq!(ledger(&deps, "sent-1").await.state(), OperationState::Sent);
    assert_eq!(ledger(&deps, "window-1").await.state(), OperationState::Quarantined);
    assert_eq!(ledger(&deps, "poison-1").await.state(), OperationState::Quarantined);
    let (quarantined, _) = bw_ops::inspect::quarantine_items(&deps.js, Some(PHONE)).await.expect("quarantine");
    let reasons: BTreeSet<(String, QuarantineReason)> = quarantined
        .iter()
        .map(|q| (q.entry.request.as_ref().expect("request").operation_id.clone(), q.entry.reason()))
        .collect();
    assert_eq!(
        reasons,
        [("poison-1".to_string(), QuarantineReason::Poison), ("window-1".to_string(), QuarantineReason::WindowClosed)]
            .into_iter()
            .collect()
    );
    let signal =
        tokio::time::timeout(Duration::from_secs(5), signals.next()).await.expect("poison signal").expect("msg");
    let signal = Signal::decode(signal.payload.as_ref()).expect("signal");
    assert_eq!((signal.kind.as_str(), signal.operation_id.as_str()), ("poison", "poison-1"));
    replay.stop().await;
    let report = bw_ops::account::account(&deps.js, &deps.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn pacing_holds_under_the_configured_rate() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    for i in 0..50 {
        put_dlq(&deps, template(&format!("op-{i}")), 0, 0).await;
    }
    set_scope(&deps, BreakerState::Closed, 0).await;
    let (rate, burst) = (20.0, 2.0);
    let replay = start(&nats, &[("REPLAY__RATE_PER_S", "20"), ("REPLAY__BURST", "2")]).await;
    assert!(wait_until(WAIT, || async { rp_lane(&deps).await.len() == 50 }).await);
    replay.stop().await;
    let times: Vec<i64> = rp_lane(&deps).await.into_iter().map(|(_, _, t)| t).collect();
    // 5 ms of clock granularity of slack.
    bw_testkit::check_pacing(&times, rate, burst, 5.0).expect("replay kept to its rate");
}

#[tokio::test]
async fn replay_lane_stays_shallow_while_the_dispatcher_drains_it() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    for i in 0..20 {
        put_dlq(&deps, template(&format!("op-{i}")), 0, 0).await;
    }
    set_scope(&deps, BreakerState::Closed, 0).await;
    let replay = start(&nats, &[("REPLAY__MAX_LANE_DEPTH", "5")]).await;
    assert!(wait_until(WAIT, || async { rp_depth(&deps).await == 5 }).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rp_depth(&deps).await, 5, "lane deeper than its bound");
    assert_eq!(dlq_depth(&deps).await, 15);

    // Play the dispatcher: consume the replay lane, checking its depth as it goes.
    let stream = deps.js.get_stream(names::SEND_STREAM).await.expect("stream");
    let consumer = stream
        .get_or_create_consumer(
            names::Lane::Replay.dispatcher_consumer(),
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some(names::Lane::Replay.dispatcher_consumer().into()),
                filter_subject: names::Lane::Replay.filter(),
                ..Default::default()
            },
        )
        .await
        .expect("consumer");
    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < 20 && tokio::time::Instant::now() < deadline {
        assert!(rp_depth(&deps).await <= 5, "lane deeper than its bound");
        let mut batch =
            consumer.fetch().max_messages(2).expires(Duration::from_millis(200)).messages().await.expect("fetch");
        while let Some(Ok(msg)) = batch.next().await {
            seen.insert(SendRequest::decode(msg.payload.as_ref()).expect("request").operation_id);
            msg.double_ack().await.expect("ack");
        }
    }
    assert_eq!(seen.len(), 20);
    replay.stop().await;
}

#[tokio::test]
async fn breaker_opening_midway_stops_replay_and_closing_resumes_it() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    let expected: BTreeSet<String> = (0..40).map(|i| format!("op-{i}")).collect();
    for op in &expected {
        put_dlq(&deps, template(op), 0, 0).await;
    }
    set_scope(&deps, BreakerState::Closed, 0).await;
    let replay = start(&nats, &[("REPLAY__RATE_PER_S", "10"), ("REPLAY__BURST", "1")]).await;
    assert!(wait_until(WAIT, || async { rp_lane(&deps).await.len() >= 5 }).await);
    set_scope(&deps, BreakerState::Open, now_ms()).await;
    let at_open = rp_lane(&deps).await.len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after = rp_lane(&deps).await.len();
    assert!(after <= at_open + 2, "kept replaying after OPEN: {at_open} -> {after}");
    assert!(after < 40);
    set_scope(&deps, BreakerState::Closed, now_ms()).await;
    assert!(wait_until(WAIT, || async { rp_lane(&deps).await.len() >= 40 && dlq_depth(&deps).await == 0 }).await);
    replay.stop().await;
    assert_exactly_once(&rp_lane(&deps).await, &expected);
}

#[tokio::test]
async fn operator_replay_alongside_the_service_does_not_duplicate() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    let expected: BTreeSet<String> = (0..60).map(|i| format!("op-{i}")).collect();
    for op in &expected {
        put_dlq(&deps, template(op), 0, 0).await;
    }
    set_scope(&deps, BreakerState::Closed, 0).await;
    let replay = start(&nats, &[("REPLAY__RATE_PER_S", "100")]).await;
    let mut noop = |_: usize, _: usize| {};
    let report = bw_ops::ops::replay_dlq_now(&deps.js, &deps.buckets, Some(PHONE), &|_| true, 1_000, 200.0, &mut noop)
        .await
        .expect("operator replay");
    assert_eq!(report.errors, 0, "{report:?}");
    assert!(wait_until(WAIT, || async { dlq_depth(&deps).await == 0 }).await);
    replay.stop().await;
    assert_exactly_once(&rp_lane(&deps).await, &expected);
    let report = bw_ops::account::account(&deps.js, &deps.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn failover_moves_eligible_categories_to_the_secondary_sender() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    for i in 0..5 {
        let mut order = template(&format!("tx-{i}"));
        order.category = Category::Transactional as i32;
        put_dlq(&deps, order, 0, 0).await;
        put_dlq(&deps, template(&format!("mkt-{i}")), 0, 0).await;
    }
    set_scope(&deps, BreakerState::Open, now_ms() - 5_000).await;
    let secondary = ScopeSnapshot {
        scope: Some(Scope { waba_id: "9".into(), phone_number_id: SECONDARY.into() }),
        state: BreakerState::Closed as i32,
        ..Default::default()
    };
    deps.buckets.scopes.put(SECONDARY, secondary.encode_to_vec().into()).await.expect("scope");
    let replay = start(
        &nats,
        &[
            ("FAILOVER__ENABLED", "true"),
            ("FAILOVER__OPEN_FOR_MS", "1000"),
            ("FAILOVER__CATEGORIES", "[\"transactional\"]"),
            ("FAILOVER__SECONDARIES__1001__WABA_ID", "9"),
            ("FAILOVER__SECONDARIES__1001__PHONE_NUMBER_ID", SECONDARY),
        ],
    )
    .await;
    let secondary_lane = || async {
        scan_stream(&deps.js, names::SEND_STREAM, &names::outbox_subject(names::Lane::PriorityReplay, SECONDARY))
            .await
            .expect("scan")
            .into_iter()
            .map(|m| SendRequest::decode(m.payload.as_ref()).expect("request"))
            .collect::<Vec<_>>()
    };
    assert!(wait_until(WAIT, || async { secondary_lane().await.len() >= 5 }).await);
    replay.stop().await;
    let moved = secondary_lane().await;
    let ops: BTreeSet<String> = moved.iter().map(|r| r.operation_id.clone()).collect();
    assert_eq!(ops, (0..5).map(|i| format!("tx-{i}")).collect::<BTreeSet<_>>());
    assert!(moved.iter().all(|r| r.phone_number_id == SECONDARY));
    assert_eq!(ledger(&deps, "tx-0").await.phone_number_id, SECONDARY);
    assert!(rp_lane(&deps).await.is_empty(), "nothing through the OPEN primary");
    assert!(lane(&deps, names::Lane::PriorityReplay).await.is_empty(), "nothing through the OPEN primary");
    assert_eq!(dlq_depth(&deps).await, 5, "marketing stays in the primary's DLQ");
    let report = bw_ops::account::account(&deps.js, &deps.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn half_open_replays_only_a_trickle_of_canaries() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    for i in 0..20 {
        put_dlq(&deps, template(&format!("probe-{i}")), 0, 0).await;
    }
    set_scope(&deps, BreakerState::HalfOpen, now_ms()).await;
    let r = start(&nats, &[("REPLAY__PROBE_RATE_PER_S", "5"), ("REPLAY__PROBE_MAX_LANE_DEPTH", "2")]).await;
    // With no live traffic the canaries that can close the breaker must come from the DLQ: some move...
    assert!(
        wait_until(WAIT, || async { !rp_lane(&deps).await.is_empty() }).await,
        "no canary replayed while HALF_OPEN"
    );
    // ...but never more than the probe cap waits in the lane (no dispatcher consumes it here).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(rp_lane(&deps).await.len(), 2, "HALF_OPEN replay stays within the probe lane cap");
    assert_eq!(dlq_depth(&deps).await, 18);
    r.stop().await;
}

fn order(op: &str) -> SendRequest {
    let mut r = template(op);
    r.category = Category::Transactional as i32;
    r
}

#[tokio::test]
async fn priority_entries_are_replayed_first_onto_their_own_lane_without_the_soak() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    // Promotions were dead-lettered first; the order confirmations after them.
    for i in 0..10 {
        put_dlq(&deps, template(&format!("promo-{i}")), 0, 0).await;
    }
    for i in 0..10 {
        put_dlq(&deps, order(&format!("order-{i}")), 0, 0).await;
    }
    // The breaker just closed; replay runs with its compiled soak (30 s) and priority soak (0).
    set_scope(&deps, BreakerState::Closed, now_ms()).await;
    let r = start(&nats, &[("REPLAY__SOAK_MS", "30000")]).await;
    assert!(
        wait_until(WAIT, || async { lane(&deps, names::Lane::PriorityReplay).await.len() == 10 }).await,
        "every order confirmation went back onto the rh lane"
    );
    assert!(lane(&deps, names::Lane::PriorityReplay).await.iter().all(|(op, ..)| op.starts_with("order-")));
    assert!(rp_lane(&deps).await.is_empty(), "promotions wait for the soak");
    assert_eq!(dlq_depth(&deps).await, 10, "the promotions are still in the dlq");
    r.stop().await;

    // Without a soak both classes go, priority first: new order confirmations dead-lettered after the
    // promotions still go before them.
    for i in 10..20 {
        put_dlq(&deps, order(&format!("order-{i}")), 0, 0).await;
    }
    let r = start(&nats, &[]).await;
    assert!(wait_until(WAIT, || async { rp_lane(&deps).await.len() == 10 }).await);
    r.stop().await;
    let first_promo = rp_lane(&deps).await.iter().map(|(.., at)| *at).min().expect("promotions");
    let orders = lane(&deps, names::Lane::PriorityReplay).await;
    assert_eq!(orders.len(), 20);
    let last_order = orders.iter().map(|(.., at)| *at).max().expect("orders");
    assert!(last_order <= first_promo, "priority entries were replayed before marketing ones");
    let report = bw_ops::account::account(&deps.js, &deps.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
}

/// The deadlock a CI drill found: a marketing drain waiting for room in a full rp lane, while the dispatcher holds
/// that lane's promotions back because the sender has a priority entry in the DLQ, would wait for ever. At the
/// compiled lane depth, a priority entry dead-lettered while the rp lane is full still goes onto the rh lane.
#[tokio::test]
async fn a_priority_entry_dead_lettered_while_the_marketing_lane_is_full_still_goes_first() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    let compiled: bw_replay::Config =
        bw_common::config::load("replay", bw_replay::DEFAULT_CONFIG, None, &HashMap::new()).expect("defaults");
    let depth = compiled.replay.max_lane_depth;
    assert!(depth > 0, "the compiled replay lane is bounded");
    for i in 0..depth + 20 {
        put_dlq(&deps, template(&format!("promo-{i}")), 0, 0).await;
    }
    set_scope(&deps, BreakerState::Closed, now_ms() - 60_000).await;
    let depth_s = depth.to_string();
    // No dispatcher drains the lanes: the rp lane fills to its bound and stays full.
    let r = start(&nats, &[("REPLAY__MAX_LANE_DEPTH", depth_s.as_str())]).await;
    assert!(wait_until(WAIT, || async { rp_depth(&deps).await == depth }).await, "the rp lane filled");
    assert_eq!(dlq_depth(&deps).await, 20, "the rest of the promotions wait for room");

    put_dlq(&deps, order("order-late"), 0, 0).await;
    assert!(
        wait_until(WAIT, || async { lane(&deps, names::Lane::PriorityReplay).await.len() == 1 }).await,
        "the priority entry went onto the rh lane although the rp lane stayed full"
    );
    assert_eq!(rp_depth(&deps).await, depth, "the marketing lane kept its bound");
    assert_eq!(ledger(&deps, "order-late").await.state(), OperationState::Queued);
    r.stop().await;
}

#[tokio::test]
async fn an_entry_whose_sender_left_the_registry_is_quarantined_not_replayed() {
    let nats = NatsServer::start();
    let deps = deps(&nats).await;
    register_senders(&deps).await;
    put_dlq(&deps, template("gone-1"), 0, 0).await;
    let mut other = template("crm/moved-1");
    other.operation_id = bw_wire::tenancy::operation_key("crm", "moved-1");
    put_dlq(&deps, other, 0, 0).await;
    // After acceptance the number left the registry, then came back registered to the tenant `default`: the
    // default tenant's entry is replayed, the CRM's is not (its number is now another tenant's).
    let registry = bw_common::registry::Registry::open(&deps.js, 1).await.expect("registry");
    assert!(registry.remove(PHONE).await.expect("removed"));
    set_scope(&deps, BreakerState::Closed, 0).await;
    let replay = start(&nats, &[]).await;
    assert!(wait_until(WAIT, || async { dlq_depth(&deps).await == 0 }).await, "dlq not drained");
    replay.stop().await;
    let lane = rp_lane(&deps).await;
    assert_exactly_once(&lane, &["gone-1".to_string()].into_iter().collect());
    let key = bw_wire::tenancy::operation_key("crm", "moved-1");
    let entry = ledger(&deps, &key).await;
    assert_eq!(entry.state(), OperationState::Quarantined);
    assert_eq!(
        entry.reason,
        format!("not sent: phone_number_id {PHONE} is now registered to another tenant than the operation's")
    );
    let (quarantined, _) = bw_ops::inspect::quarantine_items(&deps.js, Some(PHONE)).await.expect("quarantine");
    let reasons: Vec<(String, QuarantineReason)> = quarantined
        .iter()
        .map(|q| (q.entry.request.as_ref().expect("request").operation_id.clone(), q.entry.reason()))
        .collect();
    assert_eq!(reasons, vec![(key, QuarantineReason::SenderRevoked)]);

    // Removed for good: the next entry is quarantined as unregistered.
    assert!(registry.remove(PHONE).await.expect("removed"));
    put_dlq(&deps, template("gone-2"), 0, 0).await;
    let replay = start_unregistered(&nats).await;
    assert!(wait_until(WAIT, || async { dlq_depth(&deps).await == 0 }).await, "dlq not drained");
    replay.stop().await;
    let entry = ledger(&deps, "gone-2").await;
    assert_eq!(entry.state(), OperationState::Quarantined);
    assert!(entry.reason.contains("is no longer in the sender registry"), "{}", entry.reason);
    assert_exactly_once(&rp_lane(&deps).await, &["gone-1".to_string()].into_iter().collect());
    let report = bw_ops::account::account(&deps.js, &deps.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
}
