//! One message through the whole pipeline, and the basic dispatch rows.

use bw_e2e::{Harness, WABA_ID};
use bw_proto::v1::{Category, OperationState};
use std::time::Duration;

const PHONE: &str = "106540352242922";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_flows_from_producer_to_meta_and_back() {
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    let request =
        bw_client::Request::template("e2e-order-1", WABA_ID, PHONE, "+5491155551234", "order_confirmation", "es_AR")
            .param("1234")
            .category(Category::Transactional)
            .build();
    let reply = h.producer().send(&request).await.expect("ingest answers");
    assert!(reply.accepted, "rejected: {}", reply.error);
    assert!(!reply.duplicate);

    assert!(
        h.wait_state(
            "e2e-order-1",
            &[OperationState::Sent, OperationState::Delivered, OperationState::Read],
            Duration::from_secs(20)
        )
        .await,
        "message never reached SENT: {:?}",
        h.ledger_entry("e2e-order-1").await.map(|v| v.entry)
    );
    let entry = h.ledger_entry("e2e-order-1").await.expect("ledger entry").entry;
    assert!(entry.wamid.starts_with("wamid."), "wamid recorded: {}", entry.wamid);
    let oracle = h.sim.oracle();
    let seen = oracle.get("e2e-order-1").expect("the simulator accepted it");
    assert_eq!(seen.count, 1, "sent exactly once");
    assert_eq!(seen.wamids, vec![entry.wamid.clone()]);

    // The simulator's status webhooks come back through ingest and move the ledger forward.
    assert!(
        h.wait_state("e2e-order-1", &[OperationState::Read], Duration::from_secs(20)).await,
        "status webhooks did not reach the ledger: {:?}",
        h.ledger_entry("e2e-order-1").await.map(|v| v.entry.state())
    );
    // The wamid leads back to the operation.
    assert_eq!(h.ledger.operation_for_wamid(&entry.wamid).await.expect("kv"), Some("e2e-order-1".to_string()));
}

/// The ledger writes of one send: at the compiled defaults the on-the-wire mark, the outcome and the wamid link
/// (beside ingest's creation of the entry); with `dispatch.wamid_link = false` (and every other setting at its
/// default) the mark and the outcome only. Without the dispatcher's link the first status carrying
/// `biz_opaque_callback_data` stores it, so a later `failed` status without the callback data still settles
/// the operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_writes_the_wamid_link_at_the_defaults_and_not_when_it_is_off() {
    for link in [true, false] {
        let mut sim = bw_meta_sim::SimConfig::default();
        // Statuses come from the test, after the writes of the send are counted.
        sim.webhook.sent_delay_ms = None;
        sim.webhook.delivered_delay_ms = None;
        sim.webhook.read_delay_ms = None;
        let mut h = Harness::start(sim).await;
        h.register(&[PHONE]).await;
        h.start_ingest(&[]).await;
        if link {
            h.start_dispatcher_at_defaults().await;
        } else {
            h.start_dispatcher_at_defaults_but(&[("dispatch.wamid_link", "false".into())]).await;
        }
        let op = format!("e2e-link-{link}");
        let request = bw_client::Request::text(&op, WABA_ID, PHONE, "+5491155551234", "hi").build();
        assert!(h.producer().send(&request).await.expect("ingest answers").accepted);
        assert!(h.wait_state(&op, &[OperationState::Sent], Duration::from_secs(20)).await, "sent ({link})");
        // Acked: the dispatcher is done with it (the link, when written, was written before the ack).
        let send = h.js.get_stream(bw_wire::names::SEND_STREAM).await.expect("BW_SEND");
        let acked = bw_testkit::wait_until(Duration::from_secs(20), || async {
            send.get_info().await.map(|i| i.state.messages == 0 && i.state.last_sequence == 1).unwrap_or(false)
        })
        .await;
        assert!(acked, "the send was acknowledged ({link})");
        let last = |stream: &'static str| {
            let js = h.js.clone();
            async move { js.get_stream(stream).await.expect("stream").get_info().await.expect("info").state.last_sequence }
        };
        // Ingest's create, the mark, the outcome; the link in its own bucket.
        assert_eq!(last("KV_BW_LEDGER").await, 3, "ledger writes ({link})");
        assert_eq!(last("KV_BW_WAMID").await, u64::from(link), "wamid links ({link})");
        let wamid = h.ledger_entry(&op).await.expect("entry").entry.wamid;
        let linked = h.ledger.operation_for_wamid(&wamid).await.expect("read");
        assert_eq!(linked.is_some(), link, "link after the send ({link})");

        // Meta's `sent` status names the operation; ingest stores the link if the dispatcher did not.
        post_status(&h, &wamid, "sent", Some(&op)).await;
        let stored = bw_testkit::wait_until(Duration::from_secs(20), || async {
            h.ledger.operation_for_wamid(&wamid).await.ok().flatten().as_deref() == Some(op.as_str())
        })
        .await;
        assert!(stored, "the link after the first status carrying the callback data ({link})");
        // A failed status without the callback data finds the operation through it.
        post_status(&h, &wamid, "failed", None).await;
        assert!(h.wait_state(&op, &[OperationState::Failed], Duration::from_secs(20)).await, "failed ({link})");
    }
}

/// Posts one signed status webhook for `wamid` to ingest, with `biz_opaque_callback_data` when given.
async fn post_status(h: &Harness, wamid: &str, status: &str, callback_data: Option<&str>) {
    let mut s =
        serde_json::json!({"id": wamid, "status": status, "timestamp": "1750030073", "recipient_id": "5491155551234"});
    if let Some(op) = callback_data {
        s["biz_opaque_callback_data"] = op.into();
    }
    if status == "failed" {
        s["errors"] = serde_json::json!([{"code": 131026, "title": "Message undeliverable"}]);
    }
    assert_eq!(bw_e2e::post_webhook(&h.ingest_http, bw_e2e::status_webhook(PHONE, vec![s])).await, 200);
}
