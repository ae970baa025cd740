//! The oracle matches what a client sent; validation answers like Meta; reset and dump.

use crate::common::*;
use bw_meta_sim::{OracleSnapshot, SimConfig};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

fn note(tally: &mut BTreeMap<i64, u64>, a: &Answer) {
    *tally.entry(a.code()).or_default() += 1;
}

#[tokio::test]
async fn oracle_counts_match_what_the_client_sent() {
    let dump = tempfile::tempdir().expect("tempdir");
    let dump_path = dump.path().join("oracle.json");
    let cfg =
        SimConfig { known_templates: vec!["order_update".into()], dump_path: Some(dump_path.clone()), ..config() };
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(5));
    let mut tally: BTreeMap<i64, u64> = BTreeMap::new();

    for i in 0..20 {
        note(&mut tally, &send(&client, &sim, &recipient(i), Some(&format!("op-{i}"))).await.expect("answered"));
    }
    // The same operation sent twice: Meta has no idempotency key, so it is created twice.
    let first = send(&client, &sim, &recipient(100), Some("op-dup")).await.expect("answered");
    let second = send(&client, &sim, &recipient(100), Some("op-dup")).await.expect("answered");
    note(&mut tally, &first);
    note(&mut tally, &second);
    note(&mut tally, &send(&client, &sim, &recipient(101), None).await.expect("answered"));

    let template = |name: &str| {
        json!({ "messaging_product": "whatsapp", "to": recipient(102), "type": "template",
                "biz_opaque_callback_data": format!("op-tpl-{name}"),
                "template": { "name": name, "language": { "code": "en_US" },
                              "components": [{ "type": "body", "parameters": [{ "type": "text", "text": "x" }] }] } })
    };
    let ok_tpl = post(&client, &sim, &template("order_update"), Some(TOKEN)).await.expect("answered");
    assert_eq!(ok_tpl.body["messages"][0]["message_status"], "accepted");
    note(&mut tally, &ok_tpl);

    // Rejections (body, code, HTTP status).
    let rejected: Vec<(serde_json::Value, Option<&str>, i64, u16)> = vec![
        (text(&recipient(103), Some("op-bad-token")), Some("wrong"), 190, 401),
        (text(&recipient(103), Some("op-no-token")), None, 190, 401),
        (json!({ "to": recipient(103), "type": "text", "text": { "body": "x" } }), Some(TOKEN), 100, 400),
        (json!({ "messaging_product": "sms", "to": recipient(103), "text": { "body": "x" } }), Some(TOKEN), 100, 400),
        (json!({ "messaging_product": "whatsapp", "type": "text", "text": { "body": "x" } }), Some(TOKEN), 100, 400),
        (json!({ "messaging_product": "whatsapp", "to": "abc", "text": { "body": "x" } }), Some(TOKEN), 131009, 400),
        (json!({ "messaging_product": "whatsapp", "to": recipient(103), "type": "text" }), Some(TOKEN), 131008, 400),
        (
            json!({ "messaging_product": "whatsapp", "to": recipient(103), "type": "text", "text": {} }),
            Some(TOKEN),
            100,
            400,
        ),
        (
            json!({ "messaging_product": "whatsapp", "to": recipient(103), "type": "fax", "fax": {} }),
            Some(TOKEN),
            100,
            400,
        ),
        (
            json!({ "messaging_product": "whatsapp", "to": recipient(103), "type": "template", "template": { "language": { "code": "en" } } }),
            Some(TOKEN),
            131008,
            400,
        ),
        (
            json!({ "messaging_product": "whatsapp", "to": recipient(103), "type": "template", "template": { "name": "n" } }),
            Some(TOKEN),
            131008,
            400,
        ),
        (
            json!({ "messaging_product": "whatsapp", "to": recipient(103), "type": "template", "template": { "name": "order_update", "language": { "code": "en" }, "components": {} } }),
            Some(TOKEN),
            131009,
            400,
        ),
        (template("unknown_template"), Some(TOKEN), 132001, 400),
        (
            json!({ "messaging_product": "whatsapp", "to": recipient(103), "text": { "body": "x" }, "biz_opaque_callback_data": "x".repeat(513) }),
            Some(TOKEN),
            100,
            400,
        ),
        (
            json!({ "messaging_product": "whatsapp", "to": recipient(103), "text": { "body": "x".repeat(4097) } }),
            Some(TOKEN),
            100,
            400,
        ),
    ];
    for (body, token, code, status) in &rejected {
        let a = post(&client, &sim, body, *token).await.expect("answered");
        assert_eq!((a.code(), a.status), (*code, *status), "{body}");
        note(&mut tally, &a);
    }
    let raw = client
        .post(sim.messages_url("v21.0", PHONE))
        .bearer_auth(TOKEN)
        .body("{not json")
        .send()
        .await
        .expect("answered");
    assert_eq!(raw.status().as_u16(), 400);
    *tally.entry(100).or_default() += 1;

    let snap = sim.oracle();
    let accepted = tally.get(&0).copied().unwrap_or(0);
    assert_eq!(accepted, 24, "20 + 2 duplicates + 1 without op + 1 template");
    assert_eq!(snap.total_accepted(), accepted);
    assert_eq!(snap.messages.len(), 23, "the duplicate is one entry");
    let dup = snap.get("op-dup").expect("op-dup recorded");
    assert_eq!(dup.count, 2);
    assert_eq!(dup.unacknowledged, 0);
    assert_eq!(dup.wamids, vec![first.wamid().expect("wamid"), second.wamid().expect("wamid")]);
    assert!(dup.first_accepted_ms <= dup.last_accepted_ms);
    assert_eq!(dup.recipient_masked, "+165*****100");
    assert!(!dup.recipient_key.is_empty());
    assert_eq!(snap.duplicates().len(), 1);
    assert!(snap.get("op-bad-token").is_none() && snap.get("op-tpl-unknown_template").is_none());
    assert_eq!(snap.get("op-tpl-order_update").expect("template").message_type, "template");
    assert_eq!(snap.messages.iter().filter(|e| e.operation_id.is_none()).count(), 1);
    for e in &snap.messages {
        assert_eq!(e.count as usize, e.wamids.len());
        assert_eq!(e.phone_number_id, PHONE);
    }

    // Counters per outcome equal the client's own tally.
    let counters = sim.counters();
    for (code, n) in &tally {
        let key = if *code == 0 { "200".to_string() } else { code.to_string() };
        assert_eq!(counters.outcome(&key), *n, "outcome {key}");
    }
    assert_eq!(counters.requests, tally.values().sum::<u64>());

    // The HTTP oracle says the same.
    let over_http: OracleSnapshot =
        client.get(format!("{}/_sim/oracle", sim.base_url())).send().await.expect("get").json().await.expect("json");
    assert_eq!(over_http, snap);

    // Dump on request, then reset, then dump on shutdown.
    let r = client.post(format!("{}/_sim/dump", sim.base_url())).send().await.expect("dump");
    assert_eq!(r.status().as_u16(), 200);
    let dumped: OracleSnapshot =
        serde_json::from_slice(&std::fs::read(&dump_path).expect("dump written")).expect("dump parses");
    assert_eq!(dumped.total_accepted(), accepted);

    let r = client.post(format!("{}/_sim/reset", sim.base_url())).send().await.expect("reset");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(sim.oracle(), OracleSnapshot::default());
    note(&mut tally, &send(&client, &sim, &recipient(1), Some("after-reset")).await.expect("answered"));
    sim.shutdown().await;
    let dumped: OracleSnapshot =
        serde_json::from_slice(&std::fs::read(&dump_path).expect("dump written")).expect("dump parses");
    assert_eq!(dumped.messages.len(), 1);
    assert_eq!(dumped.messages[0].operation_id.as_deref(), Some("after-reset"));
}

#[tokio::test]
async fn concurrent_clients_are_all_accounted_for() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(10));
    let sends = (0..400u32).map(|i| {
        let (client, sim) = (&client, &sim);
        async move { send(client, sim, &recipient(i % 50), Some(&format!("op-{}", i % 200))).await.expect("answered") }
    });
    let answers = futures::future::join_all(sends).await;
    assert!(answers.iter().all(|a| a.status == 200));
    let snap = sim.oracle();
    assert_eq!(snap.total_accepted(), 400);
    assert_eq!(snap.messages.len(), 200);
    assert!(snap.messages.iter().all(|e| e.count == 2), "each op sent twice");
    let mut wamids: Vec<&str> = answers.iter().filter_map(Answer::wamid).collect();
    wamids.sort_unstable();
    wamids.dedup();
    assert_eq!(wamids.len(), 400, "wamids are unique");
}
