//! Integration tests of the alerting service against a real nats-server (JetStream), with a tiny axum server
//! standing in for the three sinks (generic webhook, Slack-style, PagerDuty-style).

mod harness;
mod rules;

use bw_proto::v1::{Alert, AlertStatus, BreakerState, BreakerTransition, Scope, Signal};
use bw_testkit::{NatsServer, wait_until};
use bw_wire::names;
use futures::StreamExt;
use harness::{Receiver, Service, publish};
use prost::Message;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn transition(phone: &str, to: BreakerState, at_unix_ms: i64) -> BreakerTransition {
    BreakerTransition {
        scope: Some(Scope { waba_id: "waba1".into(), phone_number_id: phone.into() }),
        from: if to == BreakerState::Open { BreakerState::Closed as i32 } else { BreakerState::Open as i32 },
        to: to as i32,
        at_unix_ms,
        incident_id: format!("inc-{phone}"),
        reason: "failure rate 0.40 over 50 calls".into(),
        failure_rate: 0.4,
        calls_in_window: 50,
        open_until_unix_ms: at_unix_ms + 30_000,
    }
}

#[tokio::test]
async fn breaker_open_notifies_every_sink_escalates_and_resolves_with_the_same_key() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let svc = Service::start(&nats, &sinks, &[("RULES__BREAKER_ESCALATE_AFTER_MS", "800")]).await;
    let mut alerts = svc.deps.nats.subscribe("bw.alert.v1.>").await.expect("subscribe alerts");
    let t0 = bw_common::time::now_ms();

    publish(&svc.deps.js, names::breaker_subject("1001"), transition("1001", BreakerState::Open, t0)).await;
    assert!(
        wait_until(WAIT, || async {
            sinks.count("pd") >= 1 && sinks.count("slack") >= 1 && sinks.count("webhook") >= 1
        })
        .await
    );

    let generic = sinks.find("webhook", |b| b["event"] == "fired").expect("generic fired");
    assert_eq!(generic["status"], "firing");
    assert_eq!(generic["dedup_key"], "breaker_open.1001");
    assert_eq!(generic["rule"], "breaker_open");
    assert_eq!(generic["severity"], "warning");
    assert_eq!(generic["scope"], "waba1/1001");
    assert_eq!(generic["runbook_url"], "https://runbooks.test/meta-down.md");
    assert_eq!(generic["labels"]["incident_id"], "inc-1001");
    let local = generic["started_at"]["local"].as_str().expect("local time");
    assert!(local.ends_with("America/Argentina/Buenos_Aires (UTC-03:00)"), "{local}");
    assert!(generic["started_at"]["utc"].as_str().expect("utc").ends_with(" UTC"));

    let slack = sinks.find("slack", |_| true).expect("slack");
    assert!(slack["text"].as_str().expect("text").contains("breaker_open"));
    let blocks = slack["blocks"].as_array().expect("blocks");
    let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap_or_default()).collect();
    assert_eq!(kinds, ["header", "section", "context"]);
    assert!(blocks[1]["text"]["text"].as_str().expect("section").contains("America/Argentina/Buenos_Aires"));

    let pd = sinks.find("pd", |_| true).expect("pagerduty");
    assert_eq!(pd["routing_key"], "rk-test");
    assert_eq!(pd["event_action"], "trigger");
    assert_eq!(pd["dedup_key"], "breaker_open.1001");
    assert_eq!(pd["payload"]["severity"], "warning");
    assert_eq!(pd["payload"]["source"], "breakwater-test");
    assert!(pd["payload"]["summary"].as_str().expect("summary").contains("waba1/1001"));
    assert!(pd["payload"]["timestamp"].as_str().expect("timestamp").ends_with('Z'));
    assert_eq!(pd["payload"]["custom_details"]["scope"], "waba1/1001");

    // Still OPEN past the (short) escalation threshold: critical, same dedup key.
    assert!(
        wait_until(WAIT, || async { sinks.find("pd", |b| b["payload"]["severity"] == "critical").is_some() }).await
    );
    let escalated = sinks.find("pd", |b| b["payload"]["severity"] == "critical").expect("escalation");
    assert_eq!(escalated["event_action"], "trigger");
    assert_eq!(escalated["dedup_key"], "breaker_open.1001");

    publish(&svc.deps.js, names::breaker_subject("1001"), transition("1001", BreakerState::Closed, t0 + 5_000)).await;
    assert!(wait_until(WAIT, || async { sinks.find("pd", |b| b["event_action"] == "resolve").is_some() }).await);
    let resolved = sinks.find("pd", |b| b["event_action"] == "resolve").expect("resolve");
    assert_eq!(resolved["dedup_key"], "breaker_open.1001");
    assert!(wait_until(WAIT, || async { sinks.find("webhook", |b| b["status"] == "resolved").is_some() }).await);

    // Every change is also published as an Alert on bw.alert.v1.breaker_open.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let msg = tokio::time::timeout(WAIT, alerts.next()).await.expect("alert published").expect("subscription open");
        assert_eq!(msg.subject.as_str(), "bw.alert.v1.breaker_open");
        seen.push(Alert::decode(msg.payload).expect("Alert"));
    }
    assert!(seen.iter().all(|a| a.dedup_key == "breaker_open.1001"));
    assert_eq!(seen[2].status, AlertStatus::Resolved as i32);
    assert_eq!(seen[2].resolved_at_unix_ms, t0 + 5_000);
    assert_eq!(sinks.count_where("pd", |b| b["event_action"] == "trigger"), 2, "one trigger, one escalation");
    svc.stop().await;
}

#[tokio::test]
async fn duplicate_and_stale_transitions_notify_once_across_two_instances() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let a = Service::start(&nats, &sinks, &[]).await;
    let b = Service::start(&nats, &sinks, &[]).await;
    let t0 = bw_common::time::now_ms();
    let open = transition("3001", BreakerState::Open, t0);
    for _ in 0..4 {
        publish(&a.deps.js, names::breaker_subject("3001"), open.clone()).await;
    }
    // A stale OPEN for a scope whose later CLOSED is handled first must not fire.
    publish(&a.deps.js, names::breaker_subject("3002"), transition("3002", BreakerState::Closed, t0 + 10)).await;
    // Two instances consume concurrently: make sure the CLOSED is handled before the stale OPEN arrives.
    assert!(wait_until(WAIT, || async { harness::consumer_drained(&a.deps.js).await }).await);
    publish(&a.deps.js, names::breaker_subject("3002"), transition("3002", BreakerState::Open, t0)).await;
    assert!(wait_until(WAIT, || async { harness::consumer_drained(&a.deps.js).await }).await);
    assert_eq!(a.metric("bw_alerts_fired_total") + b.metric("bw_alerts_fired_total"), 1.0);
    assert!(wait_until(WAIT, || async { sinks.count("webhook") >= 1 }).await);
    assert_eq!(sinks.count_where("webhook", |b| b["dedup_key"] == "breaker_open.3001"), 1);
    assert_eq!(sinks.count_where("webhook", |b| b["dedup_key"] == "breaker_open.3002"), 0);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn five_hundred_scopes_tripping_give_a_bounded_number_of_notifications() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let svc = Service::start(&nats, &sinks, &[("STORM__INTERVAL_MS", "3000"), ("STORM__MAX_INDIVIDUAL", "5")]).await;
    let t0 = bw_common::time::now_ms();
    let phones: Vec<String> = (0..500).map(|i| format!("5{i:04}")).collect();
    let js = &svc.deps.js;
    let acks =
        futures::future::join_all(phones.iter().map(|p| {
            js.publish(names::breaker_subject(p), transition(p, BreakerState::Open, t0).encode_to_vec().into())
        }))
        .await;
    for ack in acks {
        ack.expect("publish").await.expect("ack");
    }
    assert!(wait_until(WAIT, || async { svc.metric("bw_alerts_fired_total") == 500.0 }).await);
    // Each fired alert is notified either on its own (a few per interval) or counted in a digest.
    let individual = || sinks.count_where("webhook", |b| b["kind"] == "alert" && b["event"] == "fired");
    let digested = || sinks.sum_where("webhook", |b| b["kind"] == "digest", "fired");
    assert!(
        wait_until(WAIT, || async { individual() as u64 + digested() == 500 }).await,
        "individual {} + digested {}",
        individual(),
        digested()
    );
    assert!((5..=10).contains(&individual()), "{} individual notifications", individual());
    let total = sinks.count("webhook");
    assert!(total <= 10 + 4, "500 trips produced {total} webhook notifications");
    let pd_triggers = sinks.count_where("pd", |b| b["event_action"] == "trigger");
    assert!(pd_triggers <= 10 + 4, "{pd_triggers} PagerDuty triggers");
    assert!(sinks.find("pd", |b| b["dedup_key"] == "breaker_open._storm").is_some());
    let first_individual = individual();

    // Everything closes: the 5 individual alerts resolve individually, the storm incident resolves once.
    for p in &phones {
        publish(js, names::breaker_subject(p), transition(p, BreakerState::Closed, t0 + 1_000)).await;
    }
    assert!(wait_until(WAIT, || async { svc.metric("bw_alerts_resolved_total") >= 501.0 }).await);
    assert!(
        wait_until(WAIT, || async {
            sinks.find("pd", |b| b["dedup_key"] == "breaker_open._storm" && b["event_action"] == "resolve").is_some()
        })
        .await
    );
    let individual_resolves =
        || sinks.count_where("pd", |b| b["event_action"] == "resolve" && b["dedup_key"] != "breaker_open._storm");
    assert!(wait_until(WAIT, || async { individual_resolves() == first_individual }).await);
    assert!(sinks.count("webhook") <= 2 * (10 + 4) + 1, "{} webhook notifications in all", sinks.count("webhook"));
    svc.stop().await;
}

#[tokio::test]
async fn dlq_depth_and_near_limit_fire_then_resolve_when_drained() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let svc = Service::start(
        &nats,
        &sinks,
        &[
            // Above 5: the alert can only fire once all six entries of 2001 are in, whenever the poll runs.
            ("RULES__DLQ_DEPTH_THRESHOLD", "5"),
            ("RULES__STREAM_NEAR_LIMIT_RATIO", "0.5"),
            ("NATS__LIMITS__DLQ_MAX_MSGS", "10"),
        ],
    )
    .await;
    for i in 0..6u8 {
        let ack = svc
            .deps
            .js
            .publish(names::dlq_subject(bw_proto::v1::Category::Marketing, "2001"), vec![i].into())
            .await
            .expect("publish");
        ack.await.expect("ack");
    }
    svc.deps
        .js
        .publish(names::dlq_subject(bw_proto::v1::Category::Marketing, "2002"), vec![9].into())
        .await
        .expect("publish")
        .await
        .expect("ack");
    let fired = |key: &'static str| {
        let sinks = &sinks;
        move || async move { sinks.find("webhook", |b| b["dedup_key"] == key && b["event"] == "fired").is_some() }
    };
    assert!(wait_until(WAIT, fired("dlq_depth.2001")).await);
    assert!(wait_until(WAIT, fired("stream_near_limit.BW_DLQ")).await);
    let depth = sinks.find("webhook", |b| b["dedup_key"] == "dlq_depth.2001").expect("dlq alert");
    assert_eq!(depth["labels"]["depth"], "6");
    assert_eq!(depth["runbook_url"], "https://runbooks.test/dlq-growing.md");
    let limit = sinks.find("webhook", |b| b["dedup_key"] == "stream_near_limit.BW_DLQ").expect("limit alert");
    assert_eq!(limit["severity"], "critical");
    assert_eq!(sinks.count_where("webhook", |b| b["dedup_key"] == "dlq_depth.2002"), 0, "below threshold");

    let stream = svc.deps.js.get_stream(names::DLQ_STREAM).await.expect("dlq stream");
    stream.purge().filter(names::dlq_scope_filter("2001")).await.expect("drain");
    let resolved = |key: &'static str| {
        let sinks = &sinks;
        move || async move { sinks.find("webhook", |b| b["dedup_key"] == key && b["status"] == "resolved").is_some() }
    };
    assert!(wait_until(WAIT, resolved("dlq_depth.2001")).await);
    assert!(wait_until(WAIT, resolved("stream_near_limit.BW_DLQ")).await);
    assert_eq!(sinks.count_where("webhook", |b| b["dedup_key"] == "dlq_depth.2001"), 2, "one fire, one resolve");
    svc.stop().await;
}

#[tokio::test]
async fn a_ledger_near_its_byte_limit_fires_stream_near_limit() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let svc = Service::start(
        &nats,
        &sinks,
        &[("RULES__STREAM_NEAR_LIMIT_RATIO", "0.5"), ("NATS__LIMITS__LEDGER_MAX_BYTES", "65536")],
    )
    .await;
    let ledger = &svc.deps.buckets.ledger[0];
    assert_eq!(ledger.stream.cached_info().config.max_bytes, 65_536, "created with the configured byte limit");
    // Far below the message limit, past half of the byte limit.
    for i in 0..40 {
        ledger.put(format!("op-{i}"), vec![b'x'; 1024].into()).await.expect("put");
    }
    let key = "stream_near_limit.KV_BW_LEDGER";
    assert!(
        wait_until(WAIT, || async {
            sinks.find("webhook", |b| b["dedup_key"] == key && b["event"] == "fired").is_some()
        })
        .await
    );
    let alert = sinks.find("webhook", |b| b["dedup_key"] == key).expect("limit alert");
    assert_eq!(alert["severity"], "critical");
    assert_eq!(alert["labels"]["max_bytes"], "65536");
    assert!(alert["summary"].as_str().is_some_and(|s| s.contains("of at most 65536 bytes")), "{alert}");
    svc.stop().await;
}

#[tokio::test]
async fn failing_sinks_are_retried_and_counted_without_blocking_others() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    sinks.fail("webhook", 2, 503);
    sinks.fail("slack", usize::MAX, 500);
    let svc = Service::start(&nats, &sinks, &[("DELIVERY__MAX_ATTEMPTS", "4")]).await;
    publish(
        &svc.deps.js,
        names::breaker_subject("4001"),
        transition("4001", BreakerState::Open, bw_common::time::now_ms()),
    )
    .await;
    assert!(wait_until(WAIT, || async { sinks.count("webhook") == 1 && sinks.count("pd") == 1 }).await);
    assert_eq!(sinks.attempts("webhook"), 3, "two failures, then accepted");
    assert!(wait_until(WAIT, || async { svc.metric("bw_alert_sink_failures_total") == 1.0 }).await);
    assert_eq!(sinks.attempts("slack"), 4, "bounded by max_attempts");
    assert_eq!(sinks.count("slack"), 0);
    assert_eq!(svc.metric("bw_alert_sink_retries_total"), 2.0 + 3.0);
    svc.stop().await;
}

/// The coordinator's account signals (deploy/runbooks/account-signals.md): a restriction is critical, Meta's
/// account alerts a warning, each keyed by the WABA it names and linked to its runbook.
#[tokio::test]
async fn account_signals_become_alerts_with_their_runbook() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let svc = Service::start(&nats, &sinks, &[]).await;
    let signal = |kind: &str, detail: &str| Signal {
        kind: kind.into(),
        waba_id: "waba7".into(),
        detail: detail.into(),
        at_unix_ms: bw_common::time::now_ms(),
        ..Default::default()
    };
    let js = &svc.deps.js;
    publish(js, names::signal_subject("account_restricted"), signal("account_restricted", "RESTRICTED_X")).await;
    publish(js, names::signal_subject("account_alert"), signal("account_alert", "OBA_REJECTED")).await;
    assert!(wait_until(WAIT, || async { sinks.count("pd") >= 2 }).await);
    let held = sinks.find("pd", |b| b["dedup_key"] == "account_restricted.waba7").expect("restriction alert");
    assert_eq!(held["payload"]["severity"], "critical");
    assert_eq!(held["links"][0]["href"], "https://runbooks.test/account-signals.md");
    let alert = sinks.find("pd", |b| b["dedup_key"] == "account_alert.waba7").expect("account alert");
    assert_eq!(alert["payload"]["severity"], "warning");
    assert!(alert["payload"]["summary"].as_str().is_some_and(|s| s.contains("OBA_REJECTED")), "{alert}");
    svc.stop().await;
}

#[tokio::test]
async fn signals_fire_escalate_and_resolve_quota_and_credentials() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let svc = Service::start(&nats, &sinks, &[]).await;
    let signal = |kind: &str, detail: &str| Signal {
        kind: kind.into(),
        waba_id: "waba9".into(),
        phone_number_id: "9001".into(),
        meta_code: if kind == "credentials" { 190 } else { 0 },
        detail: detail.into(),
        at_unix_ms: bw_common::time::now_ms(),
        operation_id: String::new(),
    };
    let js = &svc.deps.js;
    publish(js, names::signal_subject("credentials"), signal("credentials", "token expired")).await;
    publish(js, names::signal_subject("quota"), signal("quota", "usage_percent=85")).await;
    assert!(wait_until(WAIT, || async { sinks.count("pd") >= 2 }).await);
    let creds = sinks.find("pd", |b| b["dedup_key"] == "credentials_invalid.9001").expect("credentials alert");
    assert_eq!(creds["payload"]["severity"], "critical");
    assert_eq!(creds["links"][0]["href"], "https://runbooks.test/invalid-credentials.md");
    let quota = sinks.find("pd", |b| b["dedup_key"] == "quota_usage.9001").expect("quota alert");
    assert_eq!(quota["payload"]["severity"], "warning");

    publish(js, names::signal_subject("quota"), signal("quota", "usage_percent=93.5")).await;
    assert!(
        wait_until(WAIT, || async {
            sinks
                .find("pd", |b| b["dedup_key"] == "quota_usage.9001" && b["payload"]["severity"] == "critical")
                .is_some()
        })
        .await
    );
    publish(js, names::signal_subject("quota"), signal("quota", "usage_percent=40")).await;
    assert!(
        wait_until(WAIT, || async {
            sinks.find("pd", |b| b["dedup_key"] == "quota_usage.9001" && b["event_action"] == "resolve").is_some()
        })
        .await
    );
    // A quota signal without a percent is refused clearly and does not stop the consumer.
    publish(js, names::signal_subject("quota"), signal("quota", "no number here")).await;
    publish(js, names::signal_subject("poison"), signal("poison", "op-1")).await;
    assert!(
        wait_until(WAIT, || async { sinks.find("pd", |b| b["dedup_key"] == "poison_messages.9001").is_some() }).await
    );
    assert_eq!(svc.metric_with("bw_alert_events_total", "result=\"malformed\""), 1.0);
    svc.stop().await;
}

#[tokio::test]
async fn a_quarantine_scope_alerts_once_per_template_or_code_whatever_the_number() {
    let nats = NatsServer::start();
    let sinks = Receiver::start().await;
    let svc = Service::start(&nats, &sinks, &[]).await;
    let signal = |phone: &str, code: i64, detail: &str| Signal {
        kind: "quarantine_scope".into(),
        waba_id: "100".into(),
        phone_number_id: phone.into(),
        meta_code: code,
        detail: detail.into(),
        at_unix_ms: bw_common::time::now_ms(),
        operation_id: String::new(),
    };
    let template = "held in quarantine scope tpl:100:en_US:promo: Meta refused template promo (en_US) with code 132015";
    let js = &svc.deps.js;
    // Two numbers of the WABA refused with the same template, and an unknown code: two alerts, by scope.
    publish(js, names::signal_subject("quarantine_scope"), signal("9001", 132015, template)).await;
    publish(js, names::signal_subject("quarantine_scope"), signal("9002", 132015, template)).await;
    let code = "held in quarantine scope code:424242: Meta answered code 424242, which Breakwater does not know";
    publish(js, names::signal_subject("quarantine_scope"), signal("9001", 424242, code)).await;
    assert!(
        wait_until(WAIT, || async {
            sinks.find("pd", |b| b["dedup_key"] == "quarantine_scope.code_424242").is_some()
                && sinks.find("pd", |b| b["dedup_key"] == "quarantine_scope.tpl_100_en_US_promo").is_some()
        })
        .await
    );
    let alert = sinks.find("pd", |b| b["dedup_key"] == "quarantine_scope.tpl_100_en_US_promo").expect("alert");
    let summary = alert["payload"]["summary"].as_str().unwrap_or_default().to_string();
    assert!(summary.contains("tpl:100:en_US:promo") && summary.contains("132015"), "{summary}");
    assert_eq!(alert["links"][0]["href"], "https://runbooks.test/quarantine-scopes.md");
    let templates = sinks.count_where("pd", |b| b["dedup_key"] == "quarantine_scope.tpl_100_en_US_promo");
    assert_eq!(templates, 1, "one alert for the template, not one per number");
    // A signal without a scope key in its detail is refused as malformed, and fires nothing.
    publish(js, names::signal_subject("quarantine_scope"), signal("9003", 1, "no scope here")).await;
    assert!(
        wait_until(WAIT, || async { svc.metric_with("bw_alert_events_total", "result=\"malformed\"") == 1.0 }).await
    );
    svc.stop().await;
}
