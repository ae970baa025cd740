//! Fault scenarios: every fault class, seeded mixes, window timing, hangs, resets.

use crate::common::*;
use bw_meta_sim::{Fault, FaultKind, Scenario, Selection, SimConfig, WebhookConfig, Window};
use std::time::Duration;

fn window(start_ms: u64, duration_ms: Option<u64>, error_rate: f64, faults: Vec<FaultKind>) -> Window {
    Window {
        error_rate,
        faults: faults.into_iter().map(|kind| Fault { kind, weight: 1 }).collect(),
        ..Window::new("w", start_ms, duration_ms)
    }
}

fn http(status: u16, meta_body: bool) -> FaultKind {
    FaultKind::http(status, meta_body)
}

fn error(code: i64) -> FaultKind {
    FaultKind::error(code)
}

#[tokio::test]
async fn every_sync_fault_class_is_produced_as_configured() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(5));
    // (fault, expected HTTP status, expected code: 0 = none, negative = bodiless)
    let table: Vec<(FaultKind, u16, i64)> = vec![
        (http(500, true), 500, 131000),
        (http(502, false), 502, -502),
        (http(503, true), 503, 2),
        (http(503, false), 503, -503),
        (http(504, false), 504, -504),
        (FaultKind::Http { status: 500, meta_body: true, code: Some(1), after_processing: false }, 500, 1),
        (error(130429), 400, 130429),
        (error(131000), 500, 131000),
        (error(131026), 400, 131026),
        (error(132001), 400, 132001),
        (error(190), 401, 190),
        (error(100), 400, 100),
        (error(131048), 400, 131048),
        (error(131056), 400, 131056),
        (error(368), 403, 368),
        (FaultKind::Error { code: 130429, http_status: Some(429), subcode: Some(2494055) }, 429, 130429),
    ];
    // One deterministic window at 100%: equal weights give round-robin in table order.
    sim.set_scenario(Scenario {
        selection: Selection::Deterministic,
        windows: vec![window(0, None, 1.0, table.iter().map(|t| t.0.clone()).collect())],
        ..Scenario::default()
    });
    for (i, (fault, status, code)) in table.iter().enumerate() {
        let a = send(&client, &sim, &recipient(i as u32), Some("op")).await.expect("answered");
        assert_eq!((a.status, a.code()), (*status, *code), "fault {fault:?}");
        if *code > 0 && *code != 190 {
            let msg = a.body["error"]["message"].as_str().expect("message");
            assert!(msg.starts_with(&format!("(#{code}) ")), "{msg}");
            assert_eq!(a.body["error"]["error_data"]["messaging_product"], "whatsapp");
            assert!(a.body["error"]["error_data"]["details"].is_string());
        }
        if *code == 190 {
            assert_eq!(a.body["error"]["type"], "OAuthException");
        }
        if *code < 0 {
            assert!(a.body.is_null(), "bodiless {status} has no JSON");
        }
    }
    let a = send(&client, &sim, &recipient(99), None).await.expect("answered");
    assert_eq!(a.body["error"]["error_subcode"], serde_json::Value::Null, "subcode only when configured");
    let counters = sim.counters();
    assert_eq!(counters.outcome("http_503"), 1);
    assert_eq!(counters.outcome("130429"), 2);
    assert_eq!(sim.total_accepted(), 0, "no fault above creates a message");
}

#[tokio::test]
async fn seeded_random_mix_is_reproducible_and_near_the_rate() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(5));
    let mut scenario = Scenario::flash_sale_outage(Duration::ZERO, Duration::from_secs(600));
    scenario.windows[0].latency = None;
    let run = || async {
        sim.reset();
        sim.set_scenario(scenario.clone());
        let mut codes = Vec::new();
        for i in 0..300 {
            codes.push(send(&client, &sim, &recipient(i), Some(&format!("op-{i}"))).await.expect("answered").code());
        }
        codes
    };
    let first = run().await;
    let second = run().await;
    assert_eq!(first, second, "same seed, same sequence");
    let failed = first.iter().filter(|c| **c != 0).count();
    assert!((55..=115).contains(&failed), "about 28% of 300 fail: {failed}");
    let c503 = first.iter().filter(|c| **c == 2).count();
    let c429 = first.iter().filter(|c| **c == 130429).count();
    assert_eq!(c503 + c429, failed, "only 503 (code 2) and 130429 in the mix");
    assert!(c503 > failed / 4 && c429 > failed / 4, "both kinds present: {c503} / {c429}");
    let counters = sim.counters();
    assert_eq!(counters.outcome("2") + counters.outcome("130429"), failed as u64);
    assert_eq!(sim.total_accepted(), (300 - failed) as u64);
}

#[tokio::test]
async fn windows_start_and_end_on_the_scenario_clock() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(5));
    sim.set_scenario(Scenario::outage(Duration::from_millis(300), Duration::from_millis(400)));
    let mut seen = Vec::new();
    while sim.scenario_elapsed_ms() < 1_000 {
        let before = sim.scenario_elapsed_ms();
        let a = send(&client, &sim, &recipient(seen.len() as u32), None).await.expect("answered");
        let after = sim.scenario_elapsed_ms();
        seen.push((before, after, a.status));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let check = |lo: u64, hi: u64, want: u16| {
        let inside: Vec<_> = seen.iter().filter(|(b, a, _)| *b >= lo && *a < hi).collect();
        assert!(!inside.is_empty(), "some request fell in [{lo}, {hi})");
        assert!(inside.iter().all(|(_, _, s)| *s == want), "[{lo}, {hi}) → {want}: {inside:?}");
    };
    check(0, 300, 200);
    check(300, 700, 503);
    check(700, 2_000, 200);

    // Restarting the clock starts the window over.
    sim.restart_scenario_clock();
    assert_eq!(send(&client, &sim, &recipient(5000), None).await.expect("answered").status, 200);
    wait_until(Duration::from_secs(2), || async {
        send(&client, &sim, &recipient(5001), None).await.expect("answered").status == 503
    })
    .await;
}

#[tokio::test]
async fn phone_filter_limits_a_window_to_one_number() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(5));
    let mut w = window(0, None, 1.0, vec![error(131000)]);
    w.phone_number_ids = vec!["999".into()];
    sim.set_scenario(Scenario { windows: vec![w], ..Scenario::default() });
    assert_eq!(send(&client, &sim, &recipient(1), None).await.expect("answered").status, 200);
    let other = client
        .post(sim.messages_url("v21.0", "999"))
        .bearer_auth(TOKEN)
        .json(&text(&recipient(2), None))
        .send()
        .await
        .expect("answered");
    assert_eq!(other.status().as_u16(), 500);
}

#[tokio::test]
async fn hangs_exceed_a_short_client_timeout() {
    let sim = start(config()).await;
    let client = client(Duration::from_millis(300));
    let hang = |accept| Scenario {
        windows: vec![window(0, None, 1.0, vec![FaultKind::Hang { hold_ms: 3_000, accept }])],
        ..Scenario::default()
    };
    sim.set_scenario(hang(false));
    let err = send(&client, &sim, &recipient(1), Some("op-hang")).await.expect_err("times out");
    assert!(err.is_timeout(), "{err:?}");
    assert!(sim.oracle().get("op-hang").is_none(), "not accepted");

    sim.set_scenario(hang(true));
    let err = send(&client, &sim, &recipient(2), Some("op-hang-accepted")).await.expect_err("times out");
    assert!(err.is_timeout(), "{err:?}");
    let entry = sim.oracle().get("op-hang-accepted").cloned().expect("accepted before hanging");
    assert_eq!((entry.count, entry.unacknowledged), (1, 1));
    assert_eq!(sim.counters().outcome("hang"), 2);
}

#[tokio::test]
async fn resets_are_transport_errors_and_after_processing_is_accepted() {
    let receiver = Receiver::start(0).await;
    let webhook = WebhookConfig { url: Some(receiver.url.clone()), ..WebhookConfig::default() };
    let sim = start(SimConfig { webhook, ..config() }).await;
    let client = client(Duration::from_secs(5));
    let reset = |after_processing| Scenario {
        windows: vec![window(0, None, 1.0, vec![FaultKind::Reset { after_processing }])],
        ..Scenario::default()
    };

    sim.set_scenario(reset(false));
    let err = send(&client, &sim, &recipient(1), Some("op-reset")).await.expect_err("connection dropped");
    assert!(!err.is_timeout() && !err.is_status(), "transport error: {err:?}");
    assert!(sim.oracle().get("op-reset").is_none());

    sim.set_scenario(reset(true));
    let err = send(&client, &sim, &recipient(2), Some("op-reset-after")).await.expect_err("connection dropped");
    assert!(!err.is_timeout(), "{err:?}");
    let entry = sim.oracle().get("op-reset-after").cloned().expect("accepted before the reset");
    assert_eq!((entry.count, entry.unacknowledged), (1, 1));
    assert_eq!(sim.counters().outcome("reset"), 2);

    // The status webhook is what proves the unknown-outcome send.
    wait_until(Duration::from_secs(3), || async {
        receiver.statuses().iter().any(|s| s["biz_opaque_callback_data"] == "op-reset-after" && s["status"] == "sent")
    })
    .await;

    // The client recovers on a new connection.
    sim.clear_scenario();
    assert_eq!(send(&client, &sim, &recipient(3), None).await.expect("answered").status, 200);
}

#[tokio::test]
async fn scenario_can_be_switched_over_the_admin_api() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(5));
    let toml = r#"
        name = "admin-outage"
        selection = "deterministic"
        [[windows]]
        start_ms = 0
        error_rate = 0.5
        faults = [{ kind = "error", code = 131000 }]
    "#;
    let r = client.post(format!("{}/_sim/scenario", sim.base_url())).body(toml).send().await.expect("admin answers");
    assert_eq!(r.status().as_u16(), 200);
    let codes: Vec<i64> = {
        let mut v = Vec::new();
        for i in 0..10 {
            v.push(send(&client, &sim, &recipient(i), None).await.expect("answered").code());
        }
        v
    };
    assert_eq!(codes.iter().filter(|c| **c == 131000).count(), 5, "deterministic 50%: {codes:?}");
    assert_eq!(sim.scenario().name, "admin-outage");

    let bad = client
        .post(format!("{}/_sim/scenario", sim.base_url()))
        .body("error_rate = 'x'")
        .send()
        .await
        .expect("answers");
    assert_eq!(bad.status().as_u16(), 400);

    let r = client
        .post(format!("{}/_sim/scenario?builtin=flash-sale-outage&start_ms=0&duration_ms=1000", sim.base_url()))
        .send()
        .await
        .expect("admin answers");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(sim.scenario().windows[0].duration_ms, Some(1000));

    let r = client.delete(format!("{}/_sim/scenario", sim.base_url())).send().await.expect("admin answers");
    assert_eq!(r.status().as_u16(), 200);
    assert!(sim.scenario().windows.is_empty());
}

#[tokio::test]
async fn latency_is_added() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(5));
    sim.set_scenario(Scenario { latency: Some(bw_meta_sim::Latency::Fixed { ms: 150 }), ..Scenario::default() });
    let started = std::time::Instant::now();
    assert_eq!(send(&client, &sim, &recipient(1), None).await.expect("answered").status, 200);
    assert!(started.elapsed() >= Duration::from_millis(150), "latency applied");
}
