//! Ambiguous answers after acceptance (bodiless 5xx, resets, hangs, unparseable 200s), late and dropped status
//! webhooks, answers held until after their statuses, the injected-vs-limit counters, the duplicate split, and the
//! shipped mixed-ambiguous scenario.

use crate::common::*;
use bw_meta_sim::{
    DuplicateKind, Fault, FaultKind, Garbled, Limits, Page, Scenario, Selection, SimConfig, StatusWindow,
    WebhookConfig, Window,
};
use serde_json::Value;
use std::time::{Duration, Instant};

fn always(kind: FaultKind) -> Scenario {
    Scenario {
        windows: vec![Window { error_rate: 1.0, faults: vec![Fault { kind, weight: 1 }], ..Window::new("w", 0, None) }],
        ..Scenario::default()
    }
}

fn webhook_to(url: &str) -> WebhookConfig {
    WebhookConfig {
        url: Some(url.to_string()),
        sent_delay_ms: Some(10),
        delivered_delay_ms: Some(20),
        read_delay_ms: Some(30),
        ..WebhookConfig::default()
    }
}

fn has_status(receiver: &Receiver, op: &str, status: &str) -> bool {
    receiver.statuses().iter().any(|s| s["biz_opaque_callback_data"] == op && s["status"] == status)
}

#[tokio::test]
async fn bodiless_5xx_after_acceptance_in_every_page_style() {
    let receiver = Receiver::start(0).await;
    let sim = start(SimConfig { webhook: webhook_to(&receiver.url), ..config() }).await;
    let client = client(Duration::from_secs(10));
    let cases = [(500, Page::Html, "text/html"), (502, Page::Plain, "text/plain"), (503, Page::Empty, "")];
    for (i, (status, page, ctype)) in cases.into_iter().enumerate() {
        let op = format!("op-5xx-{status}");
        sim.set_scenario(always(FaultKind::http_after_accept(status, page)));
        let (got, content_type, body) =
            send_raw(&client, &sim, &recipient(i as u32), Some(&op)).await.expect("answered");
        assert_eq!(got, status);
        assert!(content_type.starts_with(ctype), "{content_type:?} for {page:?}");
        assert!(serde_json::from_slice::<Value>(&body).is_err(), "no Meta body to read a code from");
        if page == Page::Empty {
            assert!(body.is_empty());
        }
        let entry = sim.oracle().get(&op).cloned().expect("accepted before the error");
        assert_eq!((entry.count, entry.unacknowledged), (1, 1));
        // The status webhook is what resolves the ambiguity.
        wait_until(Duration::from_secs(10), || async { has_status(&receiver, &op, "sent") }).await;
    }
    let c = sim.counters();
    for status in [500, 502, 503] {
        assert_eq!(c.injected(&format!("http_{status}")), 1);
    }
    assert_eq!(c.accepted_unacknowledged, 3);
}

#[tokio::test]
async fn unparseable_200s_are_accepted_without_a_wamid() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(10));
    for (i, body) in [Garbled::Truncated, Garbled::Empty, Garbled::Html].into_iter().enumerate() {
        let op = format!("op-garbled-{i}");
        sim.set_scenario(always(FaultKind::OkUnparseable { body }));
        let (status, _, raw) = send_raw(&client, &sim, &recipient(i as u32), Some(&op)).await.expect("answered");
        assert_eq!(status, 200);
        assert!(serde_json::from_slice::<Value>(&raw).is_err(), "{body:?} must not parse: {raw:?}");
        let entry = sim.oracle().get(&op).cloned().expect("accepted");
        assert_eq!((entry.count, entry.unacknowledged, entry.acknowledged.clone()), (1, 1, vec![false]));
    }
    assert_eq!(sim.counters().injected("200_unparseable"), 3);
}

#[tokio::test]
async fn resets_and_hangs_after_acceptance_are_counted_as_injected() {
    let sim = start(config()).await;
    let client = client(Duration::from_millis(500));
    sim.set_scenario(always(FaultKind::Reset { after_processing: true }));
    let err = send(&client, &sim, &recipient(1), Some("op-reset")).await.expect_err("connection reset");
    assert!(!err.is_timeout(), "{err:?}");
    sim.set_scenario(always(FaultKind::Hang { hold_ms: 20_000, accept: true }));
    let err = send(&client, &sim, &recipient(2), Some("op-hang")).await.expect_err("client gives up");
    assert!(err.is_timeout(), "{err:?}");
    let oracle = sim.oracle();
    for op in ["op-reset", "op-hang"] {
        assert_eq!(oracle.get(op).map(|e| (e.count, e.unacknowledged)), Some((1, 1)), "{op}");
    }
    let c = sim.counters();
    assert_eq!((c.injected("reset"), c.injected("hang"), c.accepted_unacknowledged), (1, 1, 2));
}

#[tokio::test]
async fn status_webhooks_can_be_delayed_for_a_window() {
    let receiver = Receiver::start(0).await;
    let sim = start(SimConfig { webhook: webhook_to(&receiver.url), ..config() }).await;
    let client = client(Duration::from_secs(10));
    let delay = Duration::from_secs(5);
    sim.set_scenario(Scenario {
        status_windows: vec![StatusWindow { delay_ms: Some(delay.as_millis() as u64), ..StatusWindow::default() }],
        ..Scenario::default()
    });
    let accepted_at = Instant::now();
    assert_eq!(send(&client, &sim, &recipient(1), Some("op-late")).await.expect("answered").status, 200);
    sim.clear_scenario();
    assert_eq!(send(&client, &sim, &recipient(2), Some("op-on-time")).await.expect("answered").status, 200);
    // The on-time message's statuses overtake the delayed ones.
    wait_until(Duration::from_secs(10), || async { has_status(&receiver, "op-on-time", "read") }).await;
    wait_until(Duration::from_secs(15), || async { has_status(&receiver, "op-late", "sent") }).await;
    // Arrival is never earlier than the delay after acceptance (load can only make it later).
    assert!(accepted_at.elapsed() >= delay);
    let ops: Vec<String> =
        receiver.statuses().iter().filter_map(|s| s["biz_opaque_callback_data"].as_str().map(str::to_string)).collect();
    let first_late = ops.iter().position(|o| o == "op-late").expect("late status arrived");
    let last_on_time = ops.iter().rposition(|o| o == "op-on-time").expect("on-time statuses arrived");
    assert!(last_on_time < first_late, "every on-time status came first: {ops:?}");
    assert_eq!(sim.counters().webhooks.statuses_delayed, 3);
}

#[tokio::test]
async fn status_webhooks_can_be_dropped_for_a_window() {
    let receiver = Receiver::start(0).await;
    let sim = start(SimConfig { webhook: webhook_to(&receiver.url), ..config() }).await;
    let client = client(Duration::from_secs(10));
    sim.set_scenario(Scenario {
        selection: Selection::Deterministic,
        status_windows: vec![StatusWindow { drop_rate: 1.0, ..StatusWindow::default() }],
        ..Scenario::default()
    });
    assert_eq!(send(&client, &sim, &recipient(1), Some("op-lost")).await.expect("answered").status, 200);
    sim.clear_scenario();
    assert_eq!(send(&client, &sim, &recipient(2), Some("op-kept")).await.expect("answered").status, 200);
    wait_until(Duration::from_secs(10), || async { has_status(&receiver, "op-kept", "read") }).await;
    // The dropped statuses were never scheduled, so nothing for op-lost can still be on its way.
    let w = sim.counters().webhooks;
    assert_eq!((w.statuses_withheld, w.statuses_scheduled), (3, 3));
    assert!(!receiver.statuses().iter().any(|s| s["biz_opaque_callback_data"] == "op-lost"));
    assert_eq!(sim.oracle().get("op-lost").map(|e| e.count), Some(1), "the message itself was accepted");
}

#[tokio::test]
async fn counters_separate_injected_answers_from_self_inflicted_ones() {
    // One message per 100 s per number with a burst of 2; the scenario injects 130429 on every other request.
    let limits = Limits { throughput_mps: 0.01, throughput_burst: 2, pair_enabled: false, ..Limits::default() };
    let sim = start(SimConfig { limits, ..config() }).await;
    let client = client(Duration::from_secs(10));
    sim.set_scenario(Scenario {
        selection: Selection::Deterministic,
        windows: vec![Window {
            error_rate: 0.5,
            faults: vec![Fault { kind: FaultKind::error(130429), weight: 1 }],
            ..Window::new("w", 0, None)
        }],
        ..Scenario::default()
    });
    let mut codes = Vec::new();
    for i in 0..10 {
        codes.push(send(&client, &sim, &recipient(i), None).await.expect("answered").code());
    }
    // Requests 2, 4, .. 10 are injected; of the other five, the burst of 2 passes and 3 exceed the limit.
    assert_eq!(codes.iter().filter(|c| **c == 0).count(), 2);
    assert_eq!(codes.iter().filter(|c| **c == 130429).count(), 8);
    let c = sim.counters();
    assert_eq!((c.outcome("130429"), c.injected("130429"), c.limit_exceeded("130429")), (8, 5, 3));
    assert_eq!(c.outcome("200"), 2);

    // The admin API and the oracle snapshot carry the same fields.
    let json: Value = client
        .get(format!("{}/_sim/counters", sim.base_url()))
        .send()
        .await
        .expect("admin answers")
        .json()
        .await
        .expect("json");
    assert_eq!(json["by_outcome"]["130429"], 8);
    assert_eq!(json["injected"]["130429"], 5);
    assert_eq!(json["limit_exceeded"]["130429"], 3);
    assert_eq!(json["accepted_unacknowledged"], 0);
    let oracle: Value = client
        .get(format!("{}/_sim/oracle", sim.base_url()))
        .send()
        .await
        .expect("admin answers")
        .json()
        .await
        .expect("json");
    assert_eq!(oracle["counters"]["injected"], json["injected"]);
    assert_eq!(oracle["counters"]["limit_exceeded"], json["limit_exceeded"]);
}

#[tokio::test]
async fn oracle_splits_duplicates_after_ambiguous_answers_from_plain_ones() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(10));
    let to = recipient(1);
    // Plain: a 200, then sent again.
    assert_eq!(send(&client, &sim, &to, Some("op-plain")).await.expect("answered").status, 200);
    assert_eq!(send(&client, &sim, &to, Some("op-plain")).await.expect("answered").status, 200);
    // After a reset after acceptance, then a bodiless 503 after acceptance, then a 200.
    sim.set_scenario(always(FaultKind::Reset { after_processing: true }));
    send(&client, &sim, &to, Some("op-ambiguous")).await.expect_err("reset");
    sim.set_scenario(always(FaultKind::http_after_accept(503, Page::Html)));
    assert_eq!(send(&client, &sim, &to, Some("op-ambiguous")).await.expect("answered").status, 503);
    sim.clear_scenario();
    assert_eq!(send(&client, &sim, &to, Some("op-ambiguous")).await.expect("answered").status, 200);
    // Refused before processing (nothing accepted), then sent again: not a duplicate.
    sim.set_scenario(always(FaultKind::http(503, false)));
    assert_eq!(send(&client, &sim, &to, Some("op-retried")).await.expect("answered").status, 503);
    sim.clear_scenario();
    assert_eq!(send(&client, &sim, &to, Some("op-retried")).await.expect("answered").status, 200);

    let snap = sim.oracle();
    assert_eq!(snap.get("op-plain").and_then(|e| e.duplicate_kind()), Some(DuplicateKind::Plain));
    let ambiguous = snap.get("op-ambiguous").expect("recorded");
    assert_eq!((ambiguous.count, ambiguous.acknowledged.clone()), (3, vec![false, false, true]));
    assert_eq!(ambiguous.duplicate_kind(), Some(DuplicateKind::AfterAmbiguous));
    assert_eq!(snap.get("op-retried").and_then(|e| e.duplicate_kind()), None);
    assert_eq!(snap.duplicates().len(), 2);

    let json: Value = client
        .get(format!("{}/_sim/oracle", sim.base_url()))
        .send()
        .await
        .expect("admin answers")
        .json()
        .await
        .expect("json");
    let d = &json["duplicates"];
    assert_eq!((d["total"].as_u64(), d["after_ambiguous"].as_u64(), d["plain"].as_u64()), (Some(2), Some(1), Some(1)));
    assert_eq!(d["after_ambiguous_ids"], serde_json::json!(["op-ambiguous"]));
    assert_eq!(d["plain_ids"], serde_json::json!(["op-plain"]));
}

/// The shipped file with every window moved `by_ms` earlier (windows already started keep their remaining part).
fn shipped_mixed_ambiguous(by_ms: u64) -> Scenario {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/mixed-ambiguous.toml");
    let mut s = Scenario::load(path).expect("the shipped file loads");
    let shift = |start: &mut u64, duration: &mut Option<u64>| {
        let end = duration.map(|d| *start + d);
        *start = start.saturating_sub(by_ms);
        *duration = end.map(|e| e.saturating_sub(by_ms).saturating_sub(*start)).filter(|d| *d > 0);
    };
    for w in &mut s.windows {
        shift(&mut w.start_ms, &mut w.duration_ms);
    }
    for w in &mut s.status_windows {
        shift(&mut w.start_ms, &mut w.duration_ms);
    }
    s
}

#[tokio::test]
async fn mixed_ambiguous_scenario_file_runs_over_http() {
    let receiver = Receiver::start(0).await;
    let sim = start(SimConfig { webhook: webhook_to(&receiver.url), ..config() }).await;
    // Long enough that only hangs time out on a loaded machine.
    let client = client(Duration::from_millis(2_500));

    // The ambiguous window (5 s to 20 s in the file), from its start.
    sim.set_scenario(shipped_mixed_ambiguous(5_000));
    let mut ok = 0u64;
    let mut transport = 0u64;
    let mut bodiless = 0u64;
    let mut garbled = 0u64;
    for i in 0..150 {
        match send_raw(&client, &sim, &recipient(i), Some(&format!("op-{i}"))).await {
            Ok((200, _, raw)) if serde_json::from_slice::<Value>(&raw).is_ok() => ok += 1,
            Ok((200, _, _)) => garbled += 1,
            Ok((status, _, raw)) => {
                assert!((500..=503).contains(&status), "{status}");
                assert!(serde_json::from_slice::<Value>(&raw).is_err(), "bodiless");
                bodiless += 1;
            }
            Err(_) => transport += 1,
        }
    }
    let c = sim.counters();
    let injected: u64 = c.injected.values().sum();
    assert_eq!(injected, transport + bodiless + garbled, "{:?}", c.injected);
    assert!(
        bodiless > 0 && transport > 0 && garbled > 0,
        "ok {ok} bodiless {bodiless} transport {transport} garbled {garbled}"
    );
    assert!(c.injected("reset") > 0 && c.injected("hang") > 0, "{:?}", c.injected);
    let oracle = sim.oracle();
    assert_eq!(oracle.total_accepted(), 150, "every fault in this window happens after acceptance");
    assert_eq!(c.accepted_unacknowledged, injected);
    // Late statuses: every message of the window had its statuses delayed.
    assert_eq!(c.webhooks.statuses_delayed, 150 * 3);

    // The app-call-limit window (20 s to 25 s): code 4 on every number, nothing accepted.
    sim.reset();
    sim.set_scenario(shipped_mixed_ambiguous(20_000));
    for phone in [PHONE, "106540352242923"] {
        let a = send_from(&client, &sim, phone, TOKEN, &recipient(1), Some("op-app")).await.expect("answered");
        assert_eq!((a.status, a.code()), (400, 4));
        assert!(a.headers.get("retry-after").is_none());
    }
    assert_eq!(sim.counters().injected("4"), 2);
    assert!(sim.oracle().get("op-app").is_none());
}

#[tokio::test]
async fn a_held_answer_comes_after_its_status_webhook_and_only_once_released() {
    let receiver = Receiver::start(0).await;
    let sim = std::sync::Arc::new(start(SimConfig { webhook: webhook_to(&receiver.url), ..config() }).await);
    sim.hold_answers(PHONE, 1);
    let client = client(Duration::from_secs(30));
    let first = send(&client, &sim, &recipient(1), Some("op-first")).await.expect("answered");
    assert_eq!(first.status, 200, "the first passes");
    let (client2, sim2) = (client.clone(), sim.clone());
    let second = tokio::spawn(async move { send(&client2, &sim2, &recipient(2), Some("op-held")).await });
    wait_until(Duration::from_secs(10), || async { sim.held_answers() == 1 }).await;
    // Accepted and its statuses out, while its answer waits.
    assert!(sim.oracle().get("op-held").is_some_and(|e| e.count == 1));
    wait_until(Duration::from_secs(10), || async { has_status(&receiver, "op-held", "sent") }).await;
    assert!(!second.is_finished(), "no answer before the release");
    sim.release_answers();
    let answer = second.await.expect("task").expect("answered");
    assert_eq!(answer.status, 200);
    assert_eq!(sim.held_answers(), 0);
    let third = send(&client, &sim, &recipient(3), Some("op-after")).await.expect("answered");
    assert_eq!(third.status, 200, "released: nothing is held any more");
}
