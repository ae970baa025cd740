//! The stream-state rules (quarantine growth, unknown-outcome backlog, DLQ age) and the breaker alert healing
//! itself from a scope snapshot, each against real JetStream state. Thresholds are the compiled defaults where
//! a test can reach them in seconds; where a default is a half-hour age or a ten-minute window, a relaxed
//! variant runs beside the default one and says so.
#![expect(clippy::disallowed_methods, reason = "the test settles a message as a consumer that stopped would")]

use crate::harness::{Receiver, Service, publish};
use bw_proto::v1::{BreakerState, BreakerTransition, Scope, ScopeSnapshot};
use bw_testkit::{NatsServer, wait_until};
use bw_wire::names;
use prost::Message;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn has(sinks: &Receiver, key: &str, status: &str) -> bool {
    sinks.find("webhook", |b| b["dedup_key"] == key && b["status"] == status).is_some()
}

async fn put(js: &async_nats::jetstream::Context, subject: String, n: usize) {
    for i in 0..n {
        js.publish(subject.clone(), format!("m{i}").into_bytes().into()).await.expect("publish").await.expect("ack");
    }
}

#[tokio::test]
async fn quarantine_growth_fires_at_the_default_threshold_and_not_below_it() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    // Compiled defaults: 100 new quarantined messages within 10 minutes.
    let svc = Service::start(&nats, &sinks, &[]).await;
    let js = &svc.deps.js;
    // Growth counts from the instance's first look at the stream: quarantine only after it (on a busy machine
    // the first poll can come after some of the 99, which then count as history and the 100th fires nothing).
    assert!(wait_until(WAIT, || async { svc.metric("bw_alert_polls_total") >= 1.0 }).await, "first poll");
    put(js, names::quarantine_subject("6001"), 99).await;
    // 99 is below the threshold: once two full polls ran after the 99th was in, nothing has fired.
    assert!(wait_until(WAIT, || async { svc.metric_with("bw_stream_messages", "BW_QUARANTINE") == 99.0 }).await);
    let polls = svc.metric("bw_alert_polls_total");
    assert!(wait_until(WAIT, || async { svc.metric("bw_alert_polls_total") >= polls + 2.0 }).await);
    assert_eq!(svc.metric_with("bw_alerts_fired_total", "quarantine_growth"), 0.0);
    assert!(!has(&sinks, "quarantine_growth.fleet", "firing"), "99 new quarantined messages are below 100");
    put(js, names::quarantine_subject("6002"), 1).await;
    assert!(wait_until(WAIT, || async { has(&sinks, "quarantine_growth.fleet", "firing") }).await);
    let alert = sinks.find("webhook", |b| b["dedup_key"] == "quarantine_growth.fleet").expect("alert");
    assert_eq!(alert["labels"]["growth"], "100");
    assert_eq!(alert["severity"], "warning");
    assert_eq!(alert["runbook_url"], "https://runbooks.test/quality-restrictions.md");
    svc.stop().await;
}

#[tokio::test]
async fn quarantine_growth_resolves_once_a_full_window_passes_without_growth() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    // Relaxed beside the default test above: a 2 s window instead of 10 minutes, threshold 3.
    let svc = Service::start(
        &nats,
        &sinks,
        &[("RULES__QUARANTINE_GROWTH_WINDOW_MS", "2000"), ("RULES__QUARANTINE_GROWTH_THRESHOLD", "3")],
    )
    .await;
    // Growth counts from the instance's first look at the stream: quarantine only after it (a message
    // quarantined before the first poll is history, not growth).
    assert!(wait_until(WAIT, || async { svc.metric("bw_alert_polls_total") >= 1.0 }).await, "first poll");
    put(&svc.deps.js, names::quarantine_subject("6101"), 3).await;
    assert!(wait_until(WAIT, || async { has(&sinks, "quarantine_growth.fleet", "firing") }).await);
    // Nothing more is quarantined (the messages stay in the stream): the growth, not the depth, is the signal.
    assert!(wait_until(WAIT, || async { has(&sinks, "quarantine_growth.fleet", "resolved") }).await);
    assert_eq!(svc.metric_with("bw_stream_messages", "BW_QUARANTINE"), 3.0);
    svc.stop().await;
}

#[tokio::test]
async fn unknown_backlog_fires_at_the_default_count_and_resolves_when_reconciled() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    // Compiled defaults: 100 messages in BW_UNKNOWN.
    let svc = Service::start(&nats, &sinks, &[]).await;
    let js = &svc.deps.js;
    put(js, names::unknown_subject("7001"), 100).await;
    assert!(wait_until(WAIT, || async { has(&sinks, "unknown_backlog.fleet", "firing") }).await);
    let alert = sinks.find("webhook", |b| b["dedup_key"] == "unknown_backlog.fleet").expect("alert");
    assert_eq!(alert["labels"]["backlog"], "100");
    assert_eq!(alert["runbook_url"], "https://runbooks.test/unknown-outcomes.md");
    // The reconciler empties it: the alert resolves by itself.
    js.get_stream(names::UNKNOWN_STREAM).await.expect("stream").purge().await.expect("purge");
    assert!(wait_until(WAIT, || async { has(&sinks, "unknown_backlog.fleet", "resolved") }).await);
    assert_eq!(sinks.count_where("webhook", |b| b["dedup_key"] == "unknown_backlog.fleet"), 2, "fire, resolve");
    svc.stop().await;
}

#[tokio::test]
async fn a_single_old_unknown_outcome_fires_the_backlog_by_age() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    // Relaxed: the default age is 30 minutes; 1 s here. The default count (100) stays, so only age can fire.
    let svc = Service::start(&nats, &sinks, &[("RULES__UNKNOWN_OLDEST_AGE_S", "1")]).await;
    put(&svc.deps.js, names::unknown_subject("7101"), 1).await;
    assert!(wait_until(WAIT, || async { has(&sinks, "unknown_backlog.fleet", "firing") }).await);
    let alert = sinks.find("webhook", |b| b["dedup_key"] == "unknown_backlog.fleet").expect("alert");
    assert_eq!(alert["labels"]["backlog"], "1");
    let age: u64 = alert["labels"]["oldest_age_s"].as_str().and_then(|s| s.parse().ok()).expect("age label");
    assert!(age >= 1, "fired by age {age}");
    svc.stop().await;
}

#[tokio::test]
async fn dlq_oldest_age_fires_per_sender_and_resolves_when_replayed() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    // Relaxed: the default age is 30 minutes; 1 s here. Depth stays at its default (1000), so only age fires.
    let svc = Service::start(&nats, &sinks, &[("RULES__DLQ_OLDEST_AGE_S", "1")]).await;
    let js = &svc.deps.js;
    put(js, names::dlq_subject(bw_proto::v1::Category::Marketing, "8001"), 2).await;
    assert!(wait_until(WAIT, || async { has(&sinks, "dlq_oldest_age.8001", "firing") }).await);
    let alert = sinks.find("webhook", |b| b["dedup_key"] == "dlq_oldest_age.8001").expect("alert");
    assert_eq!(alert["labels"]["depth"], "2");
    assert_eq!(alert["runbook_url"], "https://runbooks.test/dlq-growing.md");
    assert_eq!(sinks.count_where("webhook", |b| b["dedup_key"] == "dlq_depth.8001"), 0, "2 is below 1000");
    js.get_stream(names::DLQ_STREAM)
        .await
        .expect("stream")
        .purge()
        .filter(names::dlq_scope_filter("8001"))
        .await
        .expect("purge");
    assert!(wait_until(WAIT, || async { has(&sinks, "dlq_oldest_age.8001", "resolved") }).await);
    svc.stop().await;
}

#[tokio::test]
async fn breaker_open_resolves_by_itself_from_a_closed_snapshot_when_the_closed_event_is_missed() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let svc = Service::start(&nats, &sinks, &[]).await;
    let t0 = bw_common::time::now_ms();
    let open = BreakerTransition {
        scope: Some(Scope { waba_id: "waba1".into(), phone_number_id: "9101".into() }),
        from: BreakerState::Closed as i32,
        to: BreakerState::Open as i32,
        at_unix_ms: t0,
        incident_id: "inc-9101".into(),
        reason: "failure rate 0.40 over 50 calls".into(),
        failure_rate: 0.4,
        calls_in_window: 50,
        open_until_unix_ms: t0 + 30_000,
    };
    publish(&svc.deps.js, names::breaker_subject("9101"), open).await;
    assert!(wait_until(WAIT, || async { has(&sinks, "breaker_open.9101", "firing") }).await);
    // A snapshot still OPEN keeps it firing.
    let snapshot = |state: BreakerState, since: i64| ScopeSnapshot {
        scope: Some(Scope { waba_id: "waba1".into(), phone_number_id: "9101".into() }),
        state: state as i32,
        since_unix_ms: since,
        updated_at_unix_ms: since,
        ..Default::default()
    };
    let scopes = &svc.deps.buckets.scopes;
    scopes.put("9101", snapshot(BreakerState::Open, t0).encode_to_vec().into()).await.expect("put snapshot");
    assert!(
        wait_until(WAIT, || async { svc.metric_with("bw_alerts_active", "breaker_open") == 1.0 }).await,
        "still firing while the snapshot says OPEN"
    );
    assert!(!has(&sinks, "breaker_open.9101", "resolved"));
    // The coordinator closed the breaker but the CLOSED event never reached alerting: the snapshot heals it.
    scopes.put("9101", snapshot(BreakerState::Closed, t0 + 2_000).encode_to_vec().into()).await.expect("put");
    assert!(wait_until(WAIT, || async { has(&sinks, "breaker_open.9101", "resolved") }).await);
    let resolved = sinks.find("webhook", |b| b["dedup_key"] == "breaker_open.9101" && b["status"] == "resolved");
    let resolved = resolved.expect("resolved notification");
    assert!(resolved["resolved_at"]["utc"].as_str().is_some_and(|s| s.ends_with(" UTC")), "{resolved}");

    // Redis restarted empty: the breaker reads CLOSED with no `since` and no transition is ever published.
    // A snapshot written after the trip still resolves the alert.
    let open = BreakerTransition {
        scope: Some(Scope { waba_id: "waba1".into(), phone_number_id: "9102".into() }),
        from: BreakerState::Closed as i32,
        to: BreakerState::Open as i32,
        at_unix_ms: t0,
        incident_id: "inc-9102".into(),
        reason: "failure rate 0.40 over 50 calls".into(),
        failure_rate: 0.4,
        calls_in_window: 50,
        open_until_unix_ms: t0 + 30_000,
    };
    publish(&svc.deps.js, names::breaker_subject("9102"), open).await;
    assert!(wait_until(WAIT, || async { has(&sinks, "breaker_open.9102", "firing") }).await);
    let reset = ScopeSnapshot {
        scope: Some(Scope { waba_id: "waba1".into(), phone_number_id: "9102".into() }),
        state: BreakerState::Closed as i32,
        since_unix_ms: 0,
        updated_at_unix_ms: t0 + 3_000,
        ..Default::default()
    };
    scopes.put("9102", reset.encode_to_vec().into()).await.expect("put");
    assert!(wait_until(WAIT, || async { has(&sinks, "breaker_open.9102", "resolved") }).await);
    svc.stop().await;
}

/// `send_unserved` at a relaxed 1 s: the compiled 120 s would hold the test two minutes, and the unit test
/// `poll::tests::a_partition_is_unserved_when_messages_wait_and_no_dispatcher_pulls` checks the decision at it.
/// With BW_SEND in two partitions, a message in the partition no dispatcher takes fires for that partition only;
/// a dispatcher taking it resolves the alert.
#[tokio::test]
async fn a_send_partition_no_dispatcher_takes_fires_send_unserved_and_resolves_once_served() {
    use async_nats::jetstream::consumer::{PullConsumer, pull};
    use futures::StreamExt;
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let overrides = [("NATS__SEND_PARTITIONS", "2"), ("RULES__SEND_UNSERVED_AFTER_S", "1")];
    let svc = Service::start(&nats, &sinks, &overrides).await;
    let send = svc.deps.buckets.send;
    let phone = (0..).map(|i| format!("7000{i:04}")).find(|p| send.of(p) == 1).expect("a sender of partition 1");
    let subject = send.outbox_subject(names::Lane::High, &phone);
    svc.deps.js.publish(subject, vec![1].into()).await.expect("publish").await.expect("stored");

    assert!(wait_until(WAIT, || async { has(&sinks, "send_unserved.BW_SEND_1", "firing") }).await);
    let alert = sinks.find("webhook", |b| b["dedup_key"] == "send_unserved.BW_SEND_1").expect("alert");
    assert_eq!(alert["severity"], "critical");
    assert_eq!(alert["labels"]["messages"], "1");
    assert_eq!(alert["runbook_url"], "https://runbooks.test/service-down.md");
    assert_eq!(sinks.count_where("webhook", |b| b["dedup_key"] == "send_unserved.BW_SEND"), 0, "partition 0 is empty");

    // A dispatcher takes it (the lane consumer it would create on that partition).
    let stream = svc.deps.js.get_stream("BW_SEND_1").await.expect("partition 1");
    let config = pull::Config {
        durable_name: Some(names::Lane::High.dispatcher_consumer().into()),
        filter_subject: names::SendPartitions::lane_filter(1, names::Lane::High),
        ..Default::default()
    };
    let consumer: PullConsumer =
        stream.get_or_create_consumer(names::Lane::High.dispatcher_consumer(), config).await.expect("consumer");
    let mut batch = consumer.fetch().max_messages(1).messages().await.expect("fetch");
    batch.next().await.expect("the message").expect("delivered").double_ack().await.expect("acked");
    assert!(wait_until(WAIT, || async { has(&sinks, "send_unserved.BW_SEND_1", "resolved") }).await);
    svc.stop().await;
}
