//! Status webhooks: envelope, signature, retries, async failures, batching, duplicates, inbound injection.

use crate::common::*;
use bw_meta_sim::{Fault, FaultKind, Scenario, SimConfig, WebhookConfig, Window};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::time::Duration;

fn webhook(url: &str) -> WebhookConfig {
    WebhookConfig {
        url: Some(url.to_string()),
        sent_delay_ms: Some(10),
        delivered_delay_ms: Some(30),
        read_delay_ms: Some(60),
        retry_initial_ms: 20,
        retry_max_ms: 100,
        ..WebhookConfig::default()
    }
}

fn verify(secret: &str, r: &Received) -> bool {
    let Some(hex_sig) = r.signature.strip_prefix("sha256=") else {
        return false;
    };
    let Ok(sig) = hex::decode(hex_sig) else {
        return false;
    };
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(&r.raw);
    mac.verify_slice(&sig).is_ok()
}

#[tokio::test]
async fn statuses_arrive_signed_in_metas_envelope_with_callback_data() {
    let receiver = Receiver::start(0).await;
    let sim = start(SimConfig { webhook: webhook(&receiver.url), ..config() }).await;
    let client = client(Duration::from_secs(5));
    let a = send(&client, &sim, "+16505551234", Some("op-42")).await.expect("answered");
    assert_eq!(a.status, 200);
    let wamid = a.wamid().expect("wamid").to_string();
    assert!(wamid.starts_with("wamid.HBgL"), "{wamid}");
    assert_eq!(a.body["contacts"][0]["input"], "+16505551234");
    assert_eq!(a.body["contacts"][0]["wa_id"], "16505551234");
    assert!(a.body["messages"][0].get("message_status").is_none(), "only templates carry message_status");

    wait_until(Duration::from_secs(3), || async { receiver.statuses().len() >= 3 }).await;
    let all = receiver.all();
    assert!(all.iter().all(|r| verify(SECRET, r)), "every POST verifies with the app secret");
    assert!(!all.iter().any(|r| verify("wrong-secret", r)), "and not with another key");

    let body = all[0].json();
    assert_eq!(body["object"], "whatsapp_business_account");
    assert_eq!(body["entry"][0]["id"], "102290129340398");
    let change = &body["entry"][0]["changes"][0];
    assert_eq!(change["field"], "messages");
    assert_eq!(change["value"]["messaging_product"], "whatsapp");
    assert_eq!(change["value"]["metadata"]["phone_number_id"], PHONE);
    assert_eq!(change["value"]["metadata"]["display_phone_number"], "15550001234");

    let statuses = receiver.statuses();
    let kinds: Vec<&str> = statuses.iter().filter_map(|s| s["status"].as_str()).collect();
    assert_eq!(kinds, vec!["sent", "delivered", "read"]);
    for s in &statuses {
        assert_eq!(s["id"], wamid.as_str());
        assert_eq!(s["recipient_id"], "16505551234");
        assert_eq!(s["biz_opaque_callback_data"], "op-42");
        assert!(s["timestamp"].as_str().is_some_and(|t| t.parse::<u64>().is_ok()), "timestamp is a string");
    }
    let sent = &statuses[0];
    assert!(sent["conversation"]["id"].is_string());
    assert!(sent["conversation"]["expiration_timestamp"].is_string());
    assert_eq!(sent["pricing"]["pricing_model"], "PMP");
    assert_eq!(sent["pricing"]["category"], "service");
    // The receiver saw the POSTs before the simulator saw their answers.
    wait_until(Duration::from_secs(3), || async { sim.counters().webhooks.statuses_delivered == 3 }).await;
}

#[tokio::test]
async fn webhooks_are_retried_after_receiver_failures() {
    let receiver = Receiver::start(3).await;
    let cfg = WebhookConfig { delivered_delay_ms: None, read_delay_ms: None, ..webhook(&receiver.url) };
    let sim = start(SimConfig { webhook: cfg, ..config() }).await;
    let client = client(Duration::from_secs(5));
    assert_eq!(send(&client, &sim, &recipient(1), Some("op-retry")).await.expect("answered").status, 200);

    wait_until(Duration::from_secs(5), || async { !receiver.accepted().is_empty() }).await;
    let all = receiver.all();
    assert_eq!(all.iter().filter(|r| r.answered == 500).count(), 3);
    assert_eq!(all.len(), 4, "three failures then one success");
    assert!(all.windows(2).all(|w| w[0].raw == w[1].raw), "the same payload is redelivered");
    wait_until(Duration::from_secs(3), || async { sim.counters().webhooks.posts_ok == 1 }).await;
    let c = sim.counters().webhooks;
    assert_eq!((c.post_failures, c.posts_ok, c.statuses_delivered, c.statuses_dropped), (3, 1, 1, 0));
    assert_eq!(sim.webhooks_pending(), 0);
}

#[tokio::test]
async fn webhooks_give_up_after_max_attempts() {
    let receiver = Receiver::start(100).await;
    let cfg =
        WebhookConfig { delivered_delay_ms: None, read_delay_ms: None, max_attempts: 3, ..webhook(&receiver.url) };
    let sim = start(SimConfig { webhook: cfg, ..config() }).await;
    let client = client(Duration::from_secs(5));
    assert_eq!(send(&client, &sim, &recipient(1), None).await.expect("answered").status, 200);
    wait_until(Duration::from_secs(5), || async { sim.counters().webhooks.statuses_dropped == 1 }).await;
    assert_eq!(receiver.all().len(), 3);
}

#[tokio::test]
async fn async_failures_send_failed_statuses() {
    let receiver = Receiver::start(0).await;
    let mut cfg = webhook(&receiver.url);
    cfg.fail_recipients.insert("+16505550001".into(), 131026);
    let sim = start(SimConfig { webhook: cfg, ..config() }).await;
    let client = client(Duration::from_secs(5));

    assert_eq!(send(&client, &sim, "+16505550001", Some("op-undeliverable")).await.expect("answered").status, 200);
    sim.set_scenario(Scenario {
        windows: vec![Window {
            error_rate: 1.0,
            faults: vec![Fault { kind: FaultKind::AsyncFailure { code: 131049 }, weight: 1 }],
            ..Window::new("eco", 0, None)
        }],
        ..Scenario::default()
    });
    assert_eq!(send(&client, &sim, &recipient(2), Some("op-eco")).await.expect("answered").status, 200);

    wait_until(Duration::from_secs(3), || async { receiver.statuses().len() >= 2 }).await;
    let statuses = receiver.statuses();
    for (op, code) in [("op-undeliverable", 131026), ("op-eco", 131049)] {
        let s = statuses.iter().find(|s| s["biz_opaque_callback_data"] == op).expect("status for op");
        assert_eq!(s["status"], "failed");
        assert_eq!(s["errors"][0]["code"], code);
        assert!(s["errors"][0]["title"].is_string() && s["errors"][0]["error_data"]["details"].is_string());
    }
    assert_eq!(statuses.len(), 2, "failed messages get no sent/delivered/read");
    assert_eq!(sim.total_accepted(), 2, "both were accepted by the API");
}

#[tokio::test]
async fn statuses_are_batched_and_can_be_duplicated() {
    let receiver = Receiver::start(0).await;
    let cfg = WebhookConfig {
        sent_delay_ms: Some(100),
        delivered_delay_ms: None,
        read_delay_ms: None,
        batch_linger_ms: 100,
        batch_max: 4,
        duplicate_rate: 1.0,
        shuffle_batches: true,
        ..webhook(&receiver.url)
    };
    let sim = start(SimConfig { webhook: cfg, ..config() }).await;
    let client = client(Duration::from_secs(5));
    for i in 0..6 {
        assert_eq!(send(&client, &sim, &recipient(i), Some(&format!("op-{i}"))).await.expect("answered").status, 200);
    }
    wait_until(Duration::from_secs(3), || async { receiver.statuses().len() >= 12 }).await;
    let posts = receiver.accepted();
    let sizes: Vec<usize> =
        posts.iter().map(|b| b["entry"][0]["changes"][0]["value"]["statuses"].as_array().map_or(0, Vec::len)).collect();
    assert!(sizes.iter().all(|n| *n <= 4), "batch_max respected: {sizes:?}");
    assert!(sizes.iter().any(|n| *n > 1), "several statuses per POST: {sizes:?}");
    let statuses = receiver.statuses();
    for i in 0..6 {
        let op = format!("op-{i}");
        assert_eq!(statuses.iter().filter(|s| s["biz_opaque_callback_data"] == op.as_str()).count(), 2, "{op} twice");
    }
}

#[tokio::test]
async fn inbound_messages_can_be_injected() {
    let receiver = Receiver::start(0).await;
    let sim = start(SimConfig { webhook: webhook(&receiver.url), ..config() }).await;
    let client = client(Duration::from_secs(5));
    let r = client
        .post(format!("{}/_sim/inbound", sim.base_url()))
        .json(&serde_json::json!({ "phone_number_id": PHONE, "from": "+16505551234", "name": "Sheena", "text": "hi" }))
        .send()
        .await
        .expect("admin answers");
    assert_eq!(r.status().as_u16(), 200);
    let wamid = r.json::<serde_json::Value>().await.expect("json")["wamid"].as_str().expect("wamid").to_string();
    wait_until(Duration::from_secs(3), || async { !receiver.accepted().is_empty() }).await;
    let got = &receiver.all()[0];
    assert!(verify(SECRET, got));
    let value = &got.json()["entry"][0]["changes"][0]["value"];
    assert_eq!(value["messages"][0]["id"], wamid.as_str());
    assert_eq!(value["messages"][0]["from"], "16505551234");
    assert_eq!(value["messages"][0]["text"]["body"], "hi");
    assert_eq!(value["contacts"][0]["profile"]["name"], "Sheena");
    assert_eq!(value["metadata"]["phone_number_id"], PHONE);
    wait_until(Duration::from_secs(3), || async { sim.counters().webhooks.inbound_delivered == 1 }).await;
}

#[tokio::test]
async fn jitter_delivers_statuses_out_of_order() {
    let receiver = Receiver::start(0).await;
    let cfg = WebhookConfig { jitter_ms: 400, batch_linger_ms: 0, seed: 5, ..webhook(&receiver.url) };
    let sim = start(SimConfig { webhook: cfg, ..config() }).await;
    let client = client(Duration::from_secs(5));
    for i in 0..10 {
        assert_eq!(send(&client, &sim, &recipient(i), Some(&format!("op-{i}"))).await.expect("answered").status, 200);
    }
    wait_until(Duration::from_secs(5), || async { receiver.statuses().len() >= 30 }).await;
    let statuses = receiver.statuses();
    let rank = |s: &serde_json::Value| match s["status"].as_str() {
        Some("sent") => 0,
        Some("delivered") => 1,
        _ => 2,
    };
    let out_of_order = (0..10)
        .filter(|i| {
            let op = format!("op-{i}");
            let ranks: Vec<i32> =
                statuses.iter().filter(|s| s["biz_opaque_callback_data"] == op.as_str()).map(rank).collect();
            ranks.windows(2).any(|w| w[0] > w[1])
        })
        .count();
    assert!(out_of_order > 0, "some message saw a later status before an earlier one");
}

#[tokio::test]
async fn the_status_queue_is_bounded() {
    let receiver = Receiver::start(0).await;
    let cfg = WebhookConfig { queue_capacity: 4, sent_delay_ms: Some(500), ..webhook(&receiver.url) };
    let sim = start(SimConfig { webhook: cfg, ..config() }).await;
    let client = client(Duration::from_secs(5));
    for i in 0..3 {
        assert_eq!(
            send(&client, &sim, &recipient(i), None).await.expect("answered").status,
            200,
            "the API still accepts"
        );
    }
    let c = sim.counters().webhooks;
    assert_eq!((c.statuses_scheduled, c.statuses_dropped), (4, 5));
    wait_until(Duration::from_secs(3), || async { sim.counters().webhooks.statuses_delivered == 4 }).await;
}
