//! Producer intake over NATS (through bw-client and raw requests) and HTTP.

use crate::support::{self, start};
use bw_client::{Client, Request};
use bw_proto::v1::{
    Category, IntakeReply, OperationState, RejectReason, RejectedRequest, SendRequest, TextPayload,
    send_request::Payload,
};
use bw_wire::names::{self, Lane};
use prost::Message as _;

const WABA: &str = "1001";
const PHONE: &str = "2002";
const TO: &str = "+5491155551234";

fn text(op: &str) -> SendRequest {
    Request::text(op, WABA, PHONE, TO, "Your order shipped").build()
}

async fn raw_request(nats: &async_nats::Client, subject: &str, payload: Vec<u8>) -> IntakeReply {
    let msg = nats.request(subject.to_string(), payload.into()).await.expect("reply");
    IntakeReply::decode(msg.payload.as_ref()).expect("IntakeReply")
}

#[tokio::test]
async fn accepted_request_is_stored_with_its_ledger_entry() {
    let env = start(|_| {}).await;
    let client = Client::new(env.nats.clone());
    let before = bw_common::time::now_ms();
    let request = Request::text("order-1", WABA, PHONE, TO, "hi").category(Category::Marketing).build();
    let reply = client.send(&request).await.expect("answered");
    assert!(reply.accepted && !reply.duplicate, "{reply:?}");
    assert_eq!(reply.operation_id, "order-1");

    let stored = env.last(names::SEND_STREAM, &names::outbox_subject(Lane::Low, PHONE)).await;
    assert_eq!(stored.headers.get("Nats-Msg-Id").map(|v| v.as_str()), Some("order-1"));
    let stored = SendRequest::decode(stored.payload.as_ref()).expect("stored request");
    assert!(stored.accepted_at_unix_ms >= before);
    assert_eq!(stored.operation_id, "order-1");

    let entry = env.entry("order-1").await.expect("ledger entry");
    assert_eq!(entry.state(), OperationState::Queued);
    assert_eq!((entry.waba_id.as_str(), entry.phone_number_id.as_str()), (WABA, PHONE));
    assert_eq!(entry.category(), Category::Marketing);
    assert_eq!(entry.accepted_at_unix_ms, stored.accepted_at_unix_ms);

    // Priority categories go to the high lane.
    let otp = Request::text("otp-1", WABA, PHONE, TO, "123456").category(Category::Authentication).build();
    assert!(client.send(&otp).await.expect("answered").accepted);
    env.last(names::SEND_STREAM, &names::outbox_subject(Lane::High, PHONE)).await;
    assert!(env.metrics_text().contains(r#"bw_intake_requests_total{source="nats",outcome="accepted",reason=""} 2"#));
    env.stop().await;
}

#[tokio::test]
async fn producer_retries_are_stored_once() {
    let env = start(|_| {}).await;
    let client = Client::new(env.nats.clone());
    let first = client.send(&text("order-2")).await.expect("answered");
    let second = client.send(&text("order-2")).await.expect("answered");
    assert!(first.accepted && !first.duplicate);
    assert!(second.accepted && second.duplicate, "{second:?}");
    assert_eq!(env.count(names::SEND_STREAM).await, 1);

    // After the JetStream dedup window the ledger still knows the id: nothing is published.
    let mut entry = support::entry_in("order-3", OperationState::Sent);
    entry.phone_number_id = PHONE.into();
    assert!(env.ledger.create(&entry).await.expect("ledger"));
    let reply = client.send(&text("order-3")).await.expect("answered");
    assert!(reply.accepted && reply.duplicate);
    assert_eq!(env.count(names::SEND_STREAM).await, 1, "nothing new published");
    assert_eq!(env.entry("order-3").await.expect("entry").state(), OperationState::Sent, "ledger untouched");

    // A first try that died after the publish but before the ledger create: the retry heals it.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "order-4");
    let subject = names::outbox_subject(Lane::High, PHONE);
    bw_common::nats::publish_durable(&env.js, subject, headers, text("order-4").encode_to_vec().into())
        .await
        .expect("published");
    let reply = client.send(&text("order-4")).await.expect("answered");
    assert!(reply.accepted && reply.duplicate);
    assert_eq!(env.entry("order-4").await.expect("ledger healed").state(), OperationState::Queued);
    assert_eq!(env.count(names::SEND_STREAM).await, 2);
    env.stop().await;
}

#[tokio::test]
async fn each_bad_input_is_rejected_with_its_reason_and_kept() {
    let env = start(|cfg| cfg.intake.max_request_bytes = 8_192).await;
    let subject = names::intake_subject(PHONE);
    let cases: Vec<(&str, String, Vec<u8>, RejectReason, &str)> = {
        let with = |edit: &dyn Fn(&mut SendRequest)| {
            let mut r = text("bad-1");
            edit(&mut r);
            r.encode_to_vec()
        };
        vec![
            ("undecodable", subject.clone(), vec![0xff, 0xff, 0xff], RejectReason::Undecodable, "not a protobuf"),
            (
                "no op id",
                subject.clone(),
                with(&|r| r.operation_id.clear()),
                RejectReason::MissingField,
                "operation_id is required",
            ),
            (
                "bad op id",
                subject.clone(),
                with(&|r| r.operation_id = "a b".into()),
                RejectReason::BadOperationId,
                "operation_id must be",
            ),
            (
                "no waba",
                subject.clone(),
                with(&|r| r.waba_id.clear()),
                RejectReason::MissingField,
                "waba_id is required",
            ),
            (
                "no recipient",
                subject.clone(),
                with(&|r| r.recipient.clear()),
                RejectReason::MissingField,
                "recipient is required",
            ),
            (
                "no payload",
                subject.clone(),
                with(&|r| r.payload = None),
                RejectReason::MissingField,
                "payload is required",
            ),
            (
                "bad recipient",
                subject.clone(),
                with(&|r| r.recipient = "5491155551234".into()),
                RejectReason::BadRecipient,
                "leading '+'",
            ),
            ("no category", subject.clone(), with(&|r| r.category = 0), RejectReason::UnknownCategory, "unspecified"),
            (
                "bad category",
                subject.clone(),
                with(&|r| r.category = 9),
                RejectReason::UnknownCategory,
                "category 9 is unknown",
            ),
            (
                "long text",
                subject.clone(),
                with(&|r| r.payload = Some(Payload::Text(TextPayload { body: "x".repeat(4097), preview_url: false }))),
                RejectReason::Oversize,
                "4097 characters",
            ),
            (
                "big request",
                subject.clone(),
                with(&|r| {
                    r.labels.insert("k".into(), "v".repeat(9_000));
                }),
                RejectReason::Oversize,
                "the limit is 8192 bytes",
            ),
            (
                "deadline",
                subject.clone(),
                with(&|r| r.deadline_unix_ms = 1_000),
                RejectReason::DeadlinePassed,
                "deadline passed",
            ),
            (
                "mismatch",
                names::intake_subject("2003"),
                with(&|_| {}),
                RejectReason::SubjectMismatch,
                "does not match the subject",
            ),
            ("letters", names::intake_subject("abc"), with(&|_| {}), RejectReason::SubjectMismatch, "must be digits"),
            (
                "body phone",
                subject.clone(),
                with(&|r| r.phone_number_id = "x1".into()),
                RejectReason::BadPayload,
                "phone_number_id must be digits",
            ),
        ]
    };
    for (i, (name, subject, payload, reason, text)) in cases.iter().enumerate() {
        let reply = raw_request(&env.nats, subject, payload.clone()).await;
        assert!(!reply.accepted, "{name}");
        assert_eq!(reply.reason(), *reason, "{name}: {}", reply.error);
        assert!(reply.error.contains(text), "{name}: `{}` lacks `{text}`", reply.error);
        assert!(env.wait_count(names::REJECTED_STREAM, i as u64 + 1).await, "{name} kept in BW_REJECTED");
        let rejected_subject =
            if subject.ends_with("abc") { "unknown" } else { &subject[names::intake_subject("").len()..] };
        let kept = env.last(names::REJECTED_STREAM, &names::rejected_subject(rejected_subject)).await;
        let kept = RejectedRequest::decode(kept.payload.as_ref()).expect("RejectedRequest");
        assert_eq!(kept.reason(), *reason, "{name}");
        assert_eq!(&kept.raw, payload, "{name}: raw bytes kept");
        assert_eq!(&kept.source, subject, "{name}");
    }
    assert_eq!(env.count(names::SEND_STREAM).await, 0, "nothing invalid reached BW_SEND");
    assert!(env.entry("bad-1").await.is_none(), "no ledger entry for rejected input");
    // Still serving after all of that.
    assert!(Client::new(env.nats.clone()).send(&text("good-1")).await.expect("answered").accepted);
    env.stop().await;
}

#[tokio::test]
async fn http_intake_speaks_json_and_protobuf() {
    let env = start(|_| {}).await;
    let http = support::http_client();
    let json = serde_json::json!({
        "operation_id": "web-1", "waba_id": WABA, "phone_number_id": PHONE, "recipient": TO,
        "category": "transactional", "text": {"body": "hi"}, "labels": {"order": "A1"}
    });
    let res = http.post(env.url("/v1/messages")).json(&json).send().await.expect("post");
    assert_eq!(res.status(), 202);
    let body: serde_json::Value = res.json().await.expect("json reply");
    assert_eq!(body["accepted"], true);
    assert_eq!(body["duplicate"], false);
    assert_eq!(env.entry("web-1").await.expect("ledger").state(), OperationState::Queued);

    let res = http.post(env.url("/v1/messages")).json(&json).send().await.expect("post");
    assert_eq!(res.status(), 200);
    assert_eq!(res.json::<serde_json::Value>().await.expect("json")["duplicate"], true);
    assert_eq!(env.count(names::SEND_STREAM).await, 1);

    let bad = serde_json::json!({"operation_id": "web-2", "waba_id": WABA, "phone_number_id": PHONE,
        "recipient": "+0123", "category": "transactional", "text": {"body": "hi"}});
    let res = http.post(env.url("/v1/messages")).json(&bad).send().await.expect("post");
    assert_eq!(res.status(), 400);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["reason"], "REJECT_REASON_BAD_RECIPIENT");
    assert_eq!(body["operation_id"], "web-2");

    let res = http.post(env.url("/v1/messages")).header("content-type", "application/json").body("{oops").send();
    let res = res.await.expect("post");
    assert_eq!(res.status(), 400);
    assert_eq!(res.json::<serde_json::Value>().await.expect("json")["reason"], "REJECT_REASON_UNDECODABLE");

    let res = http
        .post(env.url("/v1/messages"))
        .header("content-type", "application/x-protobuf")
        .body(text("web-3").encode_to_vec())
        .send()
        .await
        .expect("post");
    assert_eq!(res.status(), 202);
    let reply = IntakeReply::decode(res.bytes().await.expect("body")).expect("protobuf reply");
    assert!(reply.accepted && reply.operation_id == "web-3");

    let huge = vec![b' '; 65_536 * 4 + 1];
    let res = http.post(env.url("/v1/messages")).header("content-type", "application/json").body(huge).send();
    let res = res.await.expect("post");
    assert_eq!(res.status(), 413);
    assert_eq!(res.json::<serde_json::Value>().await.expect("json")["reason"], "REJECT_REASON_OVERSIZE");

    assert_eq!(env.count(names::SEND_STREAM).await, 2);
    assert_eq!(env.count(names::REJECTED_STREAM).await, 3);
    let kept = env.last(names::REJECTED_STREAM, &names::rejected_subject("http")).await;
    assert_eq!(RejectedRequest::decode(kept.payload.as_ref()).expect("kept").source, "http");
    env.stop().await;
}

#[tokio::test]
async fn unavailable_storage_is_reported_as_retryable() {
    let mut env = start(|_| {}).await;
    let http = support::http_client();
    env.server.kill();
    let json = serde_json::json!({"operation_id": "web-9", "waba_id": WABA, "phone_number_id": PHONE,
        "recipient": TO, "category": "support", "text": {"body": "hi"}});
    let res = http.post(env.url("/v1/messages")).json(&json).send().await.expect("post");
    assert_eq!(res.status(), 503);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["reason"], "REJECT_REASON_UNAVAILABLE");
    assert!(body["error"].as_str().unwrap_or_default().contains("retry with the same operation_id"));
    env.server.start_again();
    let client = Client::new(env.nats.clone());
    let reply = client.send(&text("web-9")).await.expect("answered after the restart");
    assert!(reply.accepted, "{reply:?}");
    env.stop().await;
}

#[tokio::test]
async fn an_oversized_request_near_max_payload_keeps_its_size_and_first_bytes() {
    // Compiled defaults against a nats-server with its default 1 MiB max_payload.
    let env = start(|_| {}).await;
    let mut request = text("near-limit-1");
    let base = request.encoded_len();
    // One label whose value brings the encoded request to exactly 1,048,512 bytes.
    let target = 1_048_512;
    let mut fill = target - base - 8;
    loop {
        request.labels.insert("k".into(), "v".repeat(fill));
        match request.encoded_len() {
            n if n == target => break,
            n if n < target => fill += target - n,
            n => fill -= n - target,
        }
    }
    let payload = request.encode_to_vec();
    assert_eq!(payload.len(), target);
    let reply = raw_request(&env.nats, &names::intake_subject(PHONE), payload.clone()).await;
    assert_eq!(reply.reason(), RejectReason::Oversize, "{}", reply.error);
    assert!(reply.error.contains("request is 1048512 bytes; the limit is 65536 bytes"), "{}", reply.error);
    assert_eq!(reply.operation_id, "", "refused by its size before it was decoded");
    assert!(env.wait_count(names::REJECTED_STREAM, 1).await, "the rejection is kept in BW_REJECTED");
    let kept = env.last(names::REJECTED_STREAM, &names::rejected_subject(PHONE)).await;
    let record = RejectedRequest::decode(kept.payload.as_ref()).expect("RejectedRequest");
    assert_eq!(record.reason(), RejectReason::Oversize);
    assert_eq!(record.raw_size, 1_048_512, "its size as received");
    assert_eq!(record.raw, payload[..4096], "its first 4 KiB: too large to keep in one record");
    assert!(kept.headers.get(bw_ingest::OBJECT_HEADER).is_none(), "no object named");
    // Producer input never goes to the large-body store Meta's deliveries need.
    let bodies = env.js.get_stream(format!("OBJ_{}", bw_ingest::BODIES_BUCKET)).await.expect("bucket stream");
    assert_eq!(bodies.cached_info().state.messages, 0);
    env.stop().await;
}

async fn post_raw(
    http: &reqwest::Client,
    env: &crate::support::Env,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let mut req = http.post(env.url("/v1/messages")).body(body);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let res = req.send().await.expect("post");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn http_intake_is_authenticated_and_strict_at_the_compiled_defaults() {
    let env = start(|cfg| {
        cfg.intake.api_keys.insert(
            "other".into(),
            bw_ingest::ApiKeyConfig {
                sha256: bw_ingest::key_sha256("other-key"),
                tenant: Some(bw_wire::tenancy::DEFAULT_TENANT.into()),
                phone_number_ids: vec![],
                waba_ids: vec!["9009".into()],
            },
        );
    })
    .await;
    let good = serde_json::json!({"operation_id": "auth-1", "waba_id": WABA, "phone_number_id": PHONE,
        "recipient": TO, "category": "transactional", "text": {"body": "hi"}})
    .to_string()
    .into_bytes();
    let json = Some("application/json");
    // No key, an unknown key: 401 with a JSON error, nothing stored.
    let (status, body) = post_raw(&support::bare_http_client(), &env, json, good.clone()).await;
    assert_eq!((status, body["reason"].as_str()), (401, Some("UNAUTHENTICATED")), "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("Authorization: Bearer")), "{body}");
    let wrong = reqwest::Client::builder().no_proxy().build().expect("client");
    let res = wrong.post(env.url("/v1/messages")).bearer_auth("not-a-key").header("content-type", "application/json");
    let res = res.body(good.clone()).send().await.expect("post");
    assert_eq!(res.status(), 401);
    assert_eq!(res.headers().get("www-authenticate").map(|v| v.as_bytes()), Some(&b"Bearer"[..]));
    // A valid key for another sender: 403.
    let res =
        wrong.post(env.url("/v1/messages")).header("x-api-key", "other-key").header("content-type", "application/json");
    let res = res.body(good.clone()).send().await.expect("post");
    assert_eq!(res.status(), 403);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["reason"], "FORBIDDEN");
    // Content-Type is required: missing or another type is 415.
    let http = support::http_client();
    assert_eq!(post_raw(&http, &env, None, good.clone()).await.0, 415);
    let (status, body) = post_raw(&http, &env, Some("text/plain"), good.clone()).await;
    assert_eq!((status, body["reason"].as_str()), (415, Some("UNSUPPORTED_MEDIA_TYPE")));
    assert_eq!(env.count(names::SEND_STREAM).await, 0, "nothing refused was stored");
    assert_eq!(env.count(names::REJECTED_STREAM).await, 0, "refusals before validation are counted, not kept");
    let metrics = env.metrics_text();
    for reason in ["missing_key", "unknown_key", "forbidden_sender", "unsupported_media_type"] {
        assert!(metrics.contains(&format!("bw_intake_refused_total{{reason=\"{reason}\"}} ")), "{reason}: {metrics}");
    }
    // The right key, with a charset parameter: accepted.
    let (status, body) = post_raw(&http, &env, Some("application/json; charset=utf-8"), good).await;
    assert_eq!(status, 202, "{body}");
    env.stop().await;
}

#[tokio::test]
async fn proto3_canonical_json_is_accepted_and_numbers_are_never_echoed() {
    let env = start(|_| {}).await;
    let http = support::http_client();
    let json = Some("application/json");
    let deadline = bw_common::time::now_ms() + 3_600_000;
    let canonical = serde_json::json!({"operationId": "camel-1", "wabaId": WABA, "phoneNumberId": PHONE,
        "recipient": TO, "category": "CATEGORY_TRANSACTIONAL", "text": {"body": "hi", "previewUrl": false},
        "deadlineUnixMs": deadline.to_string(), "customerLastInboundUnixMs": "0"});
    let (status, body) = post_raw(&http, &env, json, canonical.to_string().into_bytes()).await;
    assert_eq!(status, 202, "{body}");
    let stored = env.last(names::SEND_STREAM, &names::outbox_subject(Lane::High, PHONE)).await;
    let stored = SendRequest::decode(stored.payload.as_ref()).expect("SendRequest");
    assert_eq!((stored.operation_id.as_str(), stored.deadline_unix_ms), ("camel-1", deadline));

    // A recipient sent as a JSON number: a precise error that never shows it, in the reply and in BW_REJECTED.
    let number = serde_json::json!({"operation_id": "num-1", "waba_id": WABA, "phone_number_id": PHONE,
        "recipient": 5491155550099u64, "category": "transactional", "text": {"body": "hi"}});
    let (status, body) = post_raw(&http, &env, json, number.to_string().into_bytes()).await;
    assert_eq!((status, body["reason"].as_str()), (400, Some("REJECT_REASON_BAD_RECIPIENT")), "{body}");
    assert!(!body.to_string().contains("5491155550099"), "{body}");
    // Inside a nested wrong type serde would quote it: masked too.
    let nested = br#"{"operation_id":"num-2","labels":{"phone":5491155550099}}"#.to_vec();
    let (status, body) = post_raw(&http, &env, json, nested).await;
    assert_eq!((status, body["reason"].as_str()), (400, Some("REJECT_REASON_UNDECODABLE")), "{body}");
    assert!(!body.to_string().contains("5491155550099"), "{body}");
    assert!(env.wait_count(names::REJECTED_STREAM, 2).await);
    let kept = env.last(names::REJECTED_STREAM, &names::rejected_subject("http")).await;
    let kept = RejectedRequest::decode(kept.payload.as_ref()).expect("kept");
    assert!(!kept.error.contains("5491155550099") && kept.error.contains("+549*******099"), "{}", kept.error);
    env.stop().await;
}

#[tokio::test]
async fn text_plus_template_is_refused_the_same_way_on_both_intakes() {
    let env = start(|_| {}).await;
    // Protobuf cannot hold both in its oneof, but the wire can: concatenate a text request and a template field.
    let mut wire = text("both-1").encode_to_vec();
    let template = SendRequest {
        payload: Some(Payload::Template(bw_proto::v1::TemplatePayload {
            name: "order_update".into(),
            language: "en_US".into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    wire.extend(template.encode_to_vec());
    let nats = raw_request(&env.nats, &names::intake_subject(PHONE), wire.clone()).await;
    let http = support::http_client();
    let res = http.post(env.url("/v1/messages")).header("content-type", "application/x-protobuf").body(wire);
    let res = res.send().await.expect("post");
    assert_eq!(res.status(), 400);
    let over_http = IntakeReply::decode(res.bytes().await.expect("body")).expect("reply");
    let json = serde_json::json!({"operation_id": "both-1", "waba_id": WABA, "phone_number_id": PHONE,
        "recipient": TO, "category": "transactional", "text": {"body": "x"},
        "template": {"name": "order_update", "language": "en_US"}});
    let (_, as_json) = post_raw(&http, &env, Some("application/json"), json.to_string().into_bytes()).await;
    for (name, reason, error) in [
        ("nats", nats.reason().as_str_name().to_string(), nats.error.clone()),
        ("http protobuf", over_http.reason().as_str_name().to_string(), over_http.error.clone()),
        (
            "http json",
            as_json["reason"].as_str().unwrap_or("").to_string(),
            as_json["error"].as_str().unwrap_or("").to_string(),
        ),
    ] {
        assert_eq!(reason, "REJECT_REASON_BAD_PAYLOAD", "{name}");
        assert_eq!(error, "set either text or template, not both", "{name}");
    }
    assert_eq!(env.count(names::SEND_STREAM).await, 0);
    env.stop().await;
}
