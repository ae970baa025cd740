//! Meta webhooks: verification, signatures, durable storage, and asynchronous processing into the ledger.

use crate::support::{self, APP_SECRET, Env, VERIFY_TOKEN, WAIT, entry_in, start};
use bw_ingest::webhook::{examples, sign};
use bw_proto::v1::{InboundMessage, OperationState, Signal, StoredWebhook};
use bw_wire::names;
use prost::Message as _;

const PHONE: &str = "106540352242922";

async fn post(env: &Env, body: &str, signature: Option<String>) -> u16 {
    let mut req = support::http_client()
        .post(env.url("/webhooks/meta"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(s) = signature {
        req = req.header("X-Hub-Signature-256", s);
    }
    req.send().await.expect("post").status().as_u16()
}

async fn post_signed(env: &Env, body: &str) {
    assert_eq!(post(env, body, Some(sign(APP_SECRET.as_bytes(), body.as_bytes()))).await, 200, "stored");
}

/// A status delivery in Meta's envelope.
fn status_body(wamid: &str, status: &str, callback: Option<&str>, error_code: Option<i64>) -> String {
    let mut s =
        serde_json::json!({"id": wamid, "status": status, "timestamp": "1750030073", "recipient_id": "16505551234"});
    if let Some(op) = callback {
        s["biz_opaque_callback_data"] = op.into();
    }
    if let Some(code) = error_code {
        s["errors"] =
            serde_json::json!([{"code": code, "title": "error title", "message": "m", "error_data": {"details": "d"}}]);
    }
    serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": [{
        "field": "messages",
        "value": {"messaging_product": "whatsapp",
                  "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE},
                  "statuses": [s]}}]}]})
    .to_string()
}

async fn wait_metric(env: &Env, line: &str) -> bool {
    bw_testkit::wait_until(WAIT, || async { env.metrics_text().contains(line) }).await
}

#[tokio::test]
async fn verification_handshake() {
    let env = start(|_| {}).await;
    let http = support::http_client();
    let get = |query: String| {
        let http = http.clone();
        let url = env.url(&format!("/webhooks/meta?{query}"));
        async move {
            let res = http.get(url).send().await.expect("get");
            (res.status().as_u16(), res.text().await.expect("text"))
        }
    };
    let ok = get(format!("hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token={VERIFY_TOKEN}")).await;
    assert_eq!(ok, (200, "1158201444".to_string()));
    assert_eq!(get("hub.mode=subscribe&hub.challenge=1&hub.verify_token=wrong".into()).await.0, 403);
    assert_eq!(get(format!("hub.mode=unsubscribe&hub.challenge=1&hub.verify_token={VERIFY_TOKEN}")).await.0, 403);
    assert_eq!(get("hub.challenge=1".into()).await.0, 403);
    env.stop().await;
}

#[tokio::test]
async fn only_signed_deliveries_are_stored() {
    let env = start(|cfg| {
        cfg.webhook.process = false;
        cfg.webhook.max_body_bytes = 4_096;
    })
    .await;
    let body = examples::STATUS_SENT;
    assert_eq!(post(&env, body, None).await, 401, "missing signature");
    assert_eq!(post(&env, body, Some(sign(b"other-secret", body.as_bytes()))).await, 401, "wrong secret");
    assert_eq!(post(&env, body, Some("sha256=00".into())).await, 401, "garbage signature");
    let tampered = body.replace("sent", "read");
    assert_eq!(post(&env, &tampered, Some(sign(APP_SECRET.as_bytes(), body.as_bytes()))).await, 401, "tampered");
    assert_eq!(env.count(names::WEBHOOK_STREAM).await, 0, "nothing stored");

    post_signed(&env, body).await;
    assert_eq!(env.count(names::WEBHOOK_STREAM).await, 1, "stored before the 200");
    let stored = env.last(names::WEBHOOK_STREAM, names::WEBHOOK_SUBJECT).await;
    let stored = StoredWebhook::decode(stored.payload.as_ref()).expect("StoredWebhook");
    assert_eq!(stored.body, body.as_bytes(), "raw body kept byte for byte");
    assert_eq!(stored.body_sha256, bw_ingest::webhook::body_sha256(body.as_bytes()));

    post_signed(&env, body).await;
    assert_eq!(env.count(names::WEBHOOK_STREAM).await, 1, "a retried delivery is stored once");

    let big = format!("{{\"object\":\"whatsapp_business_account\",\"pad\":\"{}\"}}", "x".repeat(5_000));
    assert_eq!(post(&env, &big, Some(sign(APP_SECRET.as_bytes(), big.as_bytes()))).await, 413);
    assert_eq!(env.count(names::WEBHOOK_STREAM).await, 1);

    let metrics = env.metrics_text();
    assert!(metrics.contains(r#"bw_webhooks_received_total{result="invalid_signature"} 3"#), "{metrics}");
    assert!(metrics.contains(r#"bw_webhooks_received_total{result="missing_signature"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"bw_webhooks_received_total{result="stored"} 1"#));
    assert!(metrics.contains("bw_webhook_ack_seconds_count 7"), "{metrics}");
    env.stop().await;
}

#[tokio::test]
async fn statuses_apply_forward_only() {
    let env = start(|_| {}).await;
    let mut entry = entry_in("op-a", OperationState::Sent);
    entry.wamid = "wamid.A".into();
    env.ledger.create(&entry).await.expect("ledger");

    post_signed(&env, &status_body("wamid.A", "read", Some("op-a"), None)).await;
    assert!(env.wait_state("op-a", OperationState::Read).await);
    // A late "sent", then a "delivered" that carries no callback data (found through the wamid map).
    post_signed(&env, &status_body("wamid.A", "sent", Some("op-a"), None)).await;
    post_signed(&env, &status_body("wamid.A", "delivered", None, None)).await;
    assert!(wait_metric(&env, r#"bw_statuses_applied_total{status="stale"} 2"#).await, "{}", env.metrics_text());
    assert_eq!(env.entry("op-a").await.expect("entry").state(), OperationState::Read, "read is kept");

    // Without callback data the wamid map links the status to its operation.
    env.ledger.create(&entry_in("op-b", OperationState::Sent)).await.expect("ledger");
    env.ledger.link_wamid("wamid.B", "op-b").await.expect("link");
    post_signed(&env, &status_body("wamid.B", "delivered", None, None)).await;
    assert!(env.wait_state("op-b", OperationState::Delivered).await);
    assert_eq!(env.entry("op-b").await.expect("entry").wamid, "wamid.B", "wamid recorded");

    // The same (wamid, status) in another delivery is dropped as a duplicate, and writes nothing: not the
    // ledger (same revision), and no dedup key either (a plain status has none; the ledger is the proof).
    let revision = env.ledger.get("op-b").await.expect("ledger").expect("entry").revision;
    let again = status_body("wamid.B", "delivered", None, None).replace("1750030073", "1750030074");
    post_signed(&env, &again).await;
    assert!(wait_metric(&env, r#"bw_duplicates_dropped_total{kind="status"} 1"#).await, "{}", env.metrics_text());
    assert_eq!(env.ledger.get("op-b").await.expect("ledger").expect("entry").revision, revision, "no ledger write");
    let dedup = format!("KV_{}", names::WEBHOOK_DEDUP_BUCKET);
    assert_eq!(env.count(&dedup).await, 0, "plain statuses need no dedup key");
    // Statuses of messages Breakwater never sent are counted, not fatal.
    post_signed(&env, &status_body("wamid.Z", "sent", None, None)).await;
    assert!(wait_metric(&env, r#"bw_statuses_applied_total{status="unmatched"} 1"#).await);
    assert!(env.wait_count(names::WEBHOOK_STREAM, 0).await, "every delivery acked");
    env.stop().await;
}

#[tokio::test]
async fn documented_payloads_are_processed() {
    let env = start(|_| {}).await;
    // The sent status carries callback data "order-42" for an operation whose outcome was unknown.
    let mut unknown = entry_in("order-42", OperationState::Unknown);
    unknown.flagged_unknown = true;
    env.ledger.create(&unknown).await.expect("ledger");
    post_signed(&env, examples::STATUS_SENT).await;
    assert!(env.wait_state("order-42", OperationState::Sent).await);
    let entry = env.entry("order-42").await.expect("entry");
    assert!(entry.flagged_unknown, "a duplicate at Meta stays flagged");
    assert!(entry.reason.contains("unknown outcome resolved"), "{}", entry.reason);
    let wamid = "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJDQjZCMzlEQUE4OTJBMTE4RTUA";
    assert_eq!(entry.wamid, wamid);
    assert_eq!(env.ledger.operation_for_wamid(wamid).await.expect("map"), Some("order-42".into()), "link recorded");

    // Inbound text → BW_INBOUND, once even when Meta delivers it twice.
    post_signed(&env, examples::INBOUND_TEXT).await;
    post_signed(&env, &examples::INBOUND_TEXT.replace("  ", " ")).await;
    assert!(wait_metric(&env, r#"bw_duplicates_dropped_total{kind="inbound"} 1"#).await, "{}", env.metrics_text());
    assert_eq!(env.count(names::INBOUND_STREAM).await, 1);
    let inbound = env.last(names::INBOUND_STREAM, &names::inbound_subject(PHONE)).await;
    let inbound = InboundMessage::decode(inbound.payload.as_ref()).expect("InboundMessage");
    assert_eq!((inbound.from.as_str(), inbound.r#type.as_str()), ("16505551234", "text"));
    assert_eq!(inbound.waba_id, "102290129340398");

    // The failed status (no callback data) is linked through the wamid map and is terminal.
    env.ledger.create(&entry_in("op-f", OperationState::Sent)).await.expect("ledger");
    env.ledger.link_wamid("wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJBQkNERUYA", "op-f").await.expect("link");
    post_signed(&env, examples::STATUS_FAILED).await;
    assert!(env.wait_state("op-f", OperationState::Failed).await);
    assert_eq!(env.entry("op-f").await.expect("entry").last_code, 131049);
    let signal = env.last(names::EVENTS_STREAM, &names::signal_subject("status_error")).await;
    let signal = Signal::decode(signal.payload.as_ref()).expect("Signal");
    assert_eq!((signal.meta_code, signal.operation_id.as_str()), (131049, "op-f"));
    env.stop().await;
}

/// A user who hides the phone (reference §6): statuses carry only `recipient_user_id` and `contacts[].user_id`, an
/// inbound message only `from_user_id`. The status is matched through its callback data or the wamid link, and the
/// inbound message is forwarded with the user id and an empty phone.
#[tokio::test]
async fn user_id_only_webhooks_are_matched_and_forwarded() {
    let env = start(|_| {}).await;
    let user = "US.13491208655302741918";
    let value = |inner: serde_json::Value| {
        let mut v = serde_json::json!({"messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE},
            "contacts": [{"profile": {"name": "S", "username": "@sheena"}, "user_id": user}]});
        v.as_object_mut().expect("object").extend(inner.as_object().expect("object").clone());
        serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398",
            "changes": [{"field": "messages", "value": v}]}]})
        .to_string()
    };
    env.ledger.create(&entry_in("op-u", OperationState::Sent)).await.expect("ledger");
    let status = |wamid: &str, status: &str, callback: Option<&str>| {
        let mut s = serde_json::json!({"id": wamid, "status": status, "timestamp": "1750030073",
            "recipient_user_id": user});
        if let Some(op) = callback {
            s["biz_opaque_callback_data"] = op.into();
        }
        value(serde_json::json!({ "statuses": [s] }))
    };
    post_signed(&env, &status("wamid.U1", "delivered", Some("op-u"))).await;
    assert!(env.wait_state("op-u", OperationState::Delivered).await);
    // Without callback data, the wamid link matches it.
    env.ledger.create(&entry_in("op-v", OperationState::Sent)).await.expect("ledger");
    env.ledger.link_wamid("wamid.V1", "op-v").await.expect("link");
    post_signed(&env, &status("wamid.V1", "read", None)).await;
    assert!(env.wait_state("op-v", OperationState::Read).await);

    let inbound = value(serde_json::json!({"messages": [{"from_user_id": user, "id": "wamid.IN1",
        "timestamp": "1749416383", "type": "text", "text": {"body": "hi"}}]}));
    post_signed(&env, &inbound).await;
    assert!(env.wait_count(names::INBOUND_STREAM, 1).await);
    let m = env.last(names::INBOUND_STREAM, &names::inbound_subject(PHONE)).await;
    let m = InboundMessage::decode(m.payload.as_ref()).expect("InboundMessage");
    assert_eq!((m.from.as_str(), m.from_user_id.as_str(), m.wamid.as_str()), ("", user, "wamid.IN1"));
    assert!(env.wait_count(names::WEBHOOK_STREAM, 0).await, "every delivery acked");
    env.stop().await;
}

#[tokio::test]
async fn credential_errors_raise_a_credentials_signal() {
    let env = start(|_| {}).await;
    env.ledger.create(&entry_in("op-c", OperationState::Sent)).await.expect("ledger");
    post_signed(&env, &status_body("wamid.C", "failed", Some("op-c"), Some(131031))).await;
    assert!(env.wait_state("op-c", OperationState::Failed).await);
    let stream = env.js.get_stream(names::EVENTS_STREAM).await.expect("events");
    let found = bw_testkit::wait_until(WAIT, || async {
        stream.get_last_raw_message_by_subject(&names::signal_subject("credentials")).await.is_ok()
    })
    .await;
    assert!(found, "credentials signal published");
    let signal = env.last(names::EVENTS_STREAM, &names::signal_subject("credentials")).await;
    let signal = Signal::decode(signal.payload.as_ref()).expect("Signal");
    assert_eq!((signal.meta_code, signal.waba_id.as_str()), (131031, "102290129340398"));
    // Meta delivers the same failed status again: its dedup key drops it, so the signal is not raised twice.
    let last_signal = || async {
        stream.get_last_raw_message_by_subject(&names::signal_subject("credentials")).await.expect("signal").sequence
    };
    let first = last_signal().await;
    let again = status_body("wamid.C", "failed", Some("op-c"), Some(131031)).replace("1750030073", "1750030074");
    post_signed(&env, &again).await;
    assert!(wait_metric(&env, r#"bw_duplicates_dropped_total{kind="status"} 1"#).await, "{}", env.metrics_text());
    assert_eq!(last_signal().await, first, "one signal per failed status, however often Meta sends it");
    // A "read" after "failed" never resurrects it.
    post_signed(&env, &status_body("wamid.C", "read", Some("op-c"), None)).await;
    assert!(wait_metric(&env, r#"bw_statuses_applied_total{status="conflict"} 1"#).await);
    assert_eq!(env.entry("op-c").await.expect("entry").state(), OperationState::Failed);
    env.stop().await;
}

#[tokio::test]
async fn bad_bodies_never_block_the_consumer() {
    let env = start(|_| {}).await;
    post_signed(&env, "{not json").await;
    post_signed(&env, r#"{"object":"page","entry":[]}"#).await;
    post_signed(
        &env,
        r#"{"object":"whatsapp_business_account","entry":[{"changes":[{"field":"messages","value":7}]}]}"#,
    )
    .await;
    env.ledger.create(&entry_in("op-ok", OperationState::Sent)).await.expect("ledger");
    post_signed(&env, &status_body("wamid.OK", "delivered", Some("op-ok"), None)).await;
    assert!(env.wait_state("op-ok", OperationState::Delivered).await, "later delivery still processed");
    assert!(wait_metric(&env, r#"bw_webhooks_processed_total{result="bad_json"} 3"#).await, "{}", env.metrics_text());
    assert!(env.wait_count(names::WEBHOOK_STREAM, 0).await);
    // Signed but not understood: kept for inspection, not dropped.
    assert!(env.wait_count(names::REJECTED_STREAM, 3).await, "bad bodies kept in BW_REJECTED");
    env.stop().await;
}

/// A signed delivery of `n` "delivered" statuses for operations `big-<i>`, padded with fields Meta may add (and
/// ingest ignores) so the body is about `target` bytes.
fn many_statuses_body(n: usize, target: usize) -> String {
    // About 200 bytes of each status are its other fields.
    let pad = "p".repeat(target / n - 200);
    let statuses: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({"id": format!("wamid.BIG{i}"), "status": "delivered", "timestamp": "1750030073",
                "recipient_id": "16505551234", "biz_opaque_callback_data": format!("big-{i}"),
                "conversation": {"id": pad, "origin": {"type": "utility"}}})
        })
        .collect();
    serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398", "changes": [{
        "field": "messages",
        "value": {"messaging_product": "whatsapp",
                  "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE},
                  "statuses": statuses}}]}]})
    .to_string()
}

#[tokio::test]
async fn deliveries_up_to_meta_limit_are_stored_and_fully_applied() {
    // Compiled defaults (max_body_bytes 3 MiB) against a nats-server with its default 1 MiB max_payload.
    let env = start(|_| {}).await;
    assert_eq!(env.nats.server_info().max_payload, 1024 * 1024, "the server runs with its default max_payload");
    let mut first = 0;
    for (round, (n, target)) in [(400usize, 1_100_000usize), (800, 3_000_000)].into_iter().enumerate() {
        for i in first..first + n {
            env.ledger.create(&entry_in(&format!("big-{i}"), OperationState::Sent)).await.expect("ledger");
        }
        let body = many_statuses_body(n, target)
            .replace("wamid.BIG", &format!("wamid.R{round}BIG"))
            .replace("\"big-", "\"tmp-");
        // Renumber the operations of this round.
        let mut body = body;
        for i in (0..n).rev() {
            body = body.replace(&format!("\"tmp-{i}\""), &format!("\"big-{}\"", first + i));
        }
        assert!(body.len() * 100 >= target * 99 && body.len() <= 3 * 1024 * 1024, "body is {} bytes", body.len());
        assert!(body.len() > 1024 * 1024, "over the server's max_payload");
        let status = post(&env, &body, Some(sign(APP_SECRET.as_bytes(), body.as_bytes()))).await;
        assert_eq!(status, 200, "a signed {} byte body is stored", body.len());
        let all_delivered = bw_testkit::wait_until(std::time::Duration::from_secs(120), || async {
            for i in first..first + n {
                if env.entry(&format!("big-{i}")).await.is_none_or(|e| e.state() != OperationState::Delivered) {
                    return false;
                }
            }
            true
        })
        .await;
        assert!(all_delivered, "every status of the {} byte body applied; {}", body.len(), env.metrics_text());
        first += n;
    }
    assert!(env.wait_count(names::WEBHOOK_STREAM, 0).await, "both deliveries acked");
    // Once processed, the large bodies are deleted from the object store.
    let store = env.js.get_object_store(bw_ingest::BODIES_BUCKET).await.expect("bucket");
    let gone = bw_testkit::wait_until(WAIT, || async {
        use futures::StreamExt;
        let mut list = store.list().await.expect("list");
        let mut left = 0;
        while let Some(o) = list.next().await {
            if o.is_ok_and(|o| o.name.starts_with("webhook.")) {
                left += 1;
            }
        }
        left == 0
    })
    .await;
    assert!(gone, "processed large bodies deleted");
    assert!(env.metrics_text().contains(r#"bw_statuses_applied_total{status="delivered"} 1200"#));
    env.stop().await;
}

#[tokio::test]
async fn a_late_failed_never_overrides_read_and_the_first_terminal_fact_stays() {
    let env = start(|_| {}).await;
    env.ledger.create(&entry_in("op-r", OperationState::Sent)).await.expect("ledger");
    post_signed(&env, &status_body("wamid.R", "read", Some("op-r"), None)).await;
    assert!(env.wait_state("op-r", OperationState::Read).await);
    post_signed(&env, &status_body("wamid.R", "failed", Some("op-r"), Some(131_049))).await;
    assert!(wait_metric(&env, r#"bw_statuses_applied_total{status="conflict"} 1"#).await, "{}", env.metrics_text());
    let e = env.entry("op-r").await.expect("entry");
    assert_eq!(e.state(), OperationState::Read, "read is kept");
    assert_eq!(e.last_code, 131_049, "the late failure's code is recorded");
    assert!(e.reason.contains("later failed status (131049) was recorded"), "{}", e.reason);

    // The other order: failed first, then delivered: failed stays, the delivery is recorded.
    env.ledger.create(&entry_in("op-f", OperationState::Sent)).await.expect("ledger");
    post_signed(&env, &status_body("wamid.F", "failed", Some("op-f"), Some(131_026))).await;
    assert!(env.wait_state("op-f", OperationState::Failed).await);
    post_signed(&env, &status_body("wamid.F", "delivered", Some("op-f"), None)).await;
    assert!(wait_metric(&env, r#"bw_statuses_applied_total{status="conflict"} 2"#).await, "{}", env.metrics_text());
    let e = env.entry("op-f").await.expect("entry");
    assert_eq!((e.state(), e.last_code), (OperationState::Failed, 131_026));
    assert!(e.reason.contains("later delivered status was recorded"), "{}", e.reason);
    env.stop().await;
}

/// The evidence for `dispatch.wamid_link`: statuses are counted by whether they carried
/// `biz_opaque_callback_data`; a failed status without it that matches no operation is told apart from other
/// unmatched statuses (alert FailedStatusUnmatched), while one whose wamid is linked settles its operation.
#[tokio::test]
async fn statuses_are_counted_by_their_callback_data_and_an_unmatched_failure_is_told_apart() {
    let env = start(|_| {}).await;
    env.ledger.create(&entry_in("op-c", OperationState::Sent)).await.expect("ledger");
    post_signed(&env, &status_body("wamid.C", "sent", Some("op-c"), None)).await;
    // The link the sent status stored lets a failed one without callback data settle the operation.
    post_signed(&env, &status_body("wamid.C", "failed", None, Some(131026))).await;
    assert!(env.wait_state("op-c", OperationState::Failed).await);
    // A failed status of no known operation, without callback data: its own label; a sent one: plain unmatched.
    post_signed(&env, &status_body("wamid.Y", "failed", None, Some(131026))).await;
    post_signed(&env, &status_body("wamid.X", "sent", None, None)).await;
    assert!(
        wait_metric(&env, r#"bw_statuses_applied_total{status="unmatched_failed"} 1"#).await,
        "{}",
        env.metrics_text()
    );
    assert!(wait_metric(&env, r#"bw_statuses_applied_total{status="unmatched"} 1"#).await, "{}", env.metrics_text());
    let metrics = env.metrics_text();
    for (status, presence, n) in [("sent", "present", 1), ("failed", "absent", 2), ("sent", "absent", 1)] {
        let line = format!(r#"bw_status_callback_data_total{{status="{status}",callback_data="{presence}"}} {n}"#);
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
    assert!(!metrics.contains(r#"status="failed",callback_data="present""#), "{metrics}");
    env.stop().await;
}

/// Messages BW_SEND holds now.
async fn send_messages(env: &Env) -> u64 {
    let mut stream = env.js.get_stream(names::SEND_STREAM).await.expect("BW_SEND");
    stream.info().await.expect("info").state.messages
}

#[tokio::test]
async fn a_retriable_failed_status_queues_its_attempt_again_once_and_an_earlier_one_changes_nothing() {
    use bw_common::ledger::WamidLink;
    use bw_proto::v1::SendRequest;
    let env = start(|_| {}).await;
    let request = SendRequest {
        operation_id: "op-a".into(),
        waba_id: "102290129340398".into(),
        phone_number_id: PHONE.into(),
        recipient: "+16505551234".into(),
        category: bw_proto::v1::Category::Transactional as i32,
        ..Default::default()
    };
    let mut entry = entry_in("op-a", OperationState::Sent);
    entry.wamid = "wamid.A1".into();
    entry.attempts = 1;
    env.ledger.create(&entry).await.expect("ledger");
    let link = WamidLink { operation_id: "op-a".into(), attempt: 1, request: request.encode_to_vec() };
    env.ledger.link_attempt("wamid.A1", &link).await.expect("link");

    // 131000 (transient): Meta did not deliver it; the operation is queued again with the code it carries.
    post_signed(&env, &status_body("wamid.A1", "failed", Some("op-a"), Some(131_000))).await;
    assert!(env.wait_state("op-a", OperationState::Queued).await);
    let e = env.entry("op-a").await.expect("entry");
    assert_eq!((e.async_pending_wamid.as_str(), e.async_failures, e.last_code), ("wamid.A1", 1, 131_000));
    assert!(
        e.reason.contains("attempt 1 failed after acceptance (131000, transient); queued as a new attempt"),
        "{e:?}"
    );
    assert!(bw_testkit::wait_until(WAIT, || async { send_messages(&env).await == 1 }).await);
    let stream = env.js.get_stream(names::SEND_STREAM).await.expect("BW_SEND");
    let subject = names::outbox_subject(names::Lane::High, PHONE);
    let queued = stream.get_last_raw_message_by_subject(&subject).await.expect("on the live lane of its category");
    let r = SendRequest::decode(queued.payload.as_ref()).expect("request");
    assert_eq!((r.async_error_code, r.async_failed_wamid.as_str(), r.async_failed_attempt), (131_000, "wamid.A1", 1));
    assert_eq!(r.recipient, request.recipient, "the attempt's own request");

    // Meta repeats it (a new delivery of the same fact, past the webhook dedup): still one attempt.
    let again = status_body("wamid.A1", "failed", Some("op-a"), Some(131_000)).replace("1750030073", "1750030074");
    post_signed(&env, &again).await;
    assert!(wait_metric(&env, r#"bw_duplicates_dropped_total{kind="status"} 1"#).await, "{}", env.metrics_text());
    assert_eq!(send_messages(&env).await, 1);
    assert_eq!(env.entry("op-a").await.expect("entry").async_failures, 1);

    // The new attempt went out (the dispatcher's part, written here). A failed status of another, earlier
    // attempt (one whose answer was lost, so no link names it: only its callback data) now changes nothing but
    // the journey.
    env.ledger
        .update("op-a", |cur| {
            let mut e = cur?.clone();
            e.set_state(OperationState::Sent);
            e.wamid = "wamid.A2".into();
            e.async_pending_wamid.clear();
            Some(e)
        })
        .await
        .expect("sent");
    post_signed(&env, &status_body("wamid.A0", "failed", Some("op-a"), Some(131_016))).await;
    assert!(wait_metric(&env, r#"bw_statuses_applied_total{status="failed_earlier_attempt"} 1"#).await);
    let e = env.entry("op-a").await.expect("entry");
    assert_eq!((e.state(), e.wamid.as_str(), e.async_failures), (OperationState::Sent, "wamid.A2", 1));
    assert!(e.reason.contains("of an earlier attempt was recorded, not applied"), "{e:?}");
    assert_eq!(send_messages(&env).await, 1, "nothing queued again");

    // A permanent code of the current attempt ends it FAILED, nothing queued.
    post_signed(&env, &status_body("wamid.A2", "failed", Some("op-a"), Some(131_026))).await;
    assert!(env.wait_state("op-a", OperationState::Failed).await);
    assert_eq!(send_messages(&env).await, 1);
    env.stop().await;
}
