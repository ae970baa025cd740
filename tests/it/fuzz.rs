//! Bad-input suite: property-based fuzzing (bounded case counts, a few seconds in all) of every parser that
//! sees outside bytes — protobuf decoding of requests and envelopes followed by ingest validation, the Meta
//! webhook parser and signature check, the Meta error body parser, the dispatcher's body builder — and one
//! test against the real services that throws garbage at the intake subject, the HTTP intake and the
//! webhook endpoint.
//!
//! Every parser must never panic and must refuse with a precise reason; the real services must answer with a
//! clear error, store nothing in BW_SEND and keep every rejected intake body in BW_REJECTED.

use bw_e2e::{APP_SECRET, Harness, WABA_ID};
use bw_ingest::validate::{self, Limits};
use bw_ingest::webhook;
use bw_proto::v1::{
    Category, DlqEnvelope, IntakeReply, LedgerEntry, QuarantineEntry, RejectReason, RejectedRequest, ScopeSnapshot,
    SendRequest, StoredWebhook, TemplatePayload, TextPayload, UnknownOutcome, send_request::Payload,
};
use bw_wire::names;
use proptest::prelude::*;
use prost::Message as _;
use serde_json::Value;

const PHONE: &str = "106540352242961";
const NOW_MS: i64 = 1_750_000_000_000;

fn config() -> ProptestConfig {
    ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() }
}

fn valid_request() -> SendRequest {
    bw_client::Request::template("order-42", WABA_ID, PHONE, "+5491155551234", "order_confirmation", "es_AR")
        .param("1234")
        .category(Category::Transactional)
        .label("order", "A1")
        .build()
}

/// What an accepted request must satisfy whatever bytes it came from.
fn assert_accepted_is_sound(r: &SendRequest) {
    assert!(bw_wire::tenancy::valid_operation_id(&r.operation_id));
    assert!(validate::is_digits(&r.waba_id) && validate::is_digits(&r.phone_number_id));
    assert!(validate::check_recipient(&r.recipient).is_ok());
    assert!(matches!(validate::category(r), Ok(c) if c != Category::Unspecified));
    assert!(r.payload.is_some());
    assert!(r.attempts.is_empty());
}

/// Runs validation the way both intakes do and checks the answer is either sound or a precise refusal.
fn check_validation(r: &SendRequest, encoded_len: usize) {
    for subject in [Some(PHONE), None] {
        match validate::validate(r, subject, encoded_len, &Limits::default(), NOW_MS) {
            Ok(_) => assert_accepted_is_sound(r),
            Err(rej) => {
                assert_ne!(rej.reason, RejectReason::Unspecified, "a refusal names its reason");
                assert!(!rej.error.is_empty(), "a refusal explains itself");
                if r.recipient.len() >= 8 {
                    assert!(!rej.error.contains(&r.recipient), "the error never echoes the recipient: {}", rej.error);
                }
                if let Some(Payload::Text(t)) = &r.payload
                    && t.body.trim().len() >= 8
                {
                    assert!(!rej.error.contains(t.body.trim()), "the error never echoes the body: {}", rej.error);
                }
            }
        }
    }
}

/// Decodes `bytes` as every message type that crosses a process boundary; none may panic.
fn decode_everything(bytes: &[u8]) {
    if let Ok(r) = SendRequest::decode(bytes) {
        check_validation(&r, bytes.len());
        let _ = bw_dispatcher::build_body(&r);
    }
    let _ = DlqEnvelope::decode(bytes);
    let _ = QuarantineEntry::decode(bytes);
    let _ = UnknownOutcome::decode(bytes);
    let _ = StoredWebhook::decode(bytes);
    let _ = RejectedRequest::decode(bytes);
    let _ = LedgerEntry::decode(bytes);
    let _ = IntakeReply::decode(bytes);
    let _ = ScopeSnapshot::decode(bytes);
    for stream in [names::SEND_STREAM, names::DLQ_STREAM, names::QUARANTINE_STREAM, names::UNKNOWN_STREAM] {
        let _ = bw_ops::account::operation_of(stream, bytes);
    }
}

/// The mutation tests start from a request that passes validation (else they would only test refusals).
#[test]
fn the_seed_request_is_valid_and_its_body_is_metas_shape() {
    let r = valid_request();
    let bytes = r.encode_to_vec();
    assert_eq!(
        validate::validate(&r, Some(PHONE), bytes.len(), &Limits::default(), NOW_MS),
        Ok(Category::Transactional)
    );
    let body = bw_dispatcher::build_body(&r);
    assert_eq!(body["type"], "template");
    assert_eq!(body["template"]["components"][0]["parameters"][0]["text"], "1234");
}

/// Mutations of a byte string: overwrite, insert, remove, truncate.
fn mutate(mut bytes: Vec<u8>, edits: &[(u16, u8, u8)]) -> Vec<u8> {
    for &(pos, byte, kind) in edits {
        let at = if bytes.is_empty() { 0 } else { pos as usize % bytes.len() };
        match kind % 4 {
            0 if !bytes.is_empty() => bytes[at] = byte,
            1 => bytes.insert(at, byte),
            2 if !bytes.is_empty() => {
                bytes.remove(at);
            }
            3 => bytes.truncate(at),
            _ => {}
        }
    }
    bytes
}

fn text_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,24}",
        "[a-z0-9_]{1,16}",
        "[A-Za-z0-9_=.-]{1,40}",
        "\\+[0-9]{6,17}",
        "[0-9]{1,20}",
        Just(String::new())
    ]
}

prop_compose! {
    fn request_strategy()(
        operation_id in text_strategy(),
        waba_id in prop_oneof![Just(WABA_ID.to_string()), text_strategy()],
        phone_number_id in prop_oneof![Just(PHONE.to_string()), text_strategy()],
        recipient in prop_oneof![
            Just("+5491155551234".to_string()),
            Just("US.13491208655302741918".to_string()),
            text_strategy()
        ],
        category in -2i32..8,
        text in proptest::option::of(".{0,64}"),
        name in text_strategy(),
        language in prop_oneof![Just("es_AR".to_string()), text_strategy()],
        params in proptest::collection::vec(".{0,12}", 0..4),
        components in prop_oneof![Just(String::new()), Just("[]".to_string()), ".{0,32}"],
        deadline in prop_oneof![Just(0i64), any::<i64>()],
        labels in proptest::collection::btree_map(".{0,8}", ".{0,8}", 0..3),
    ) -> SendRequest {
        let payload = match text {
            Some(body) => Some(Payload::Text(TextPayload { body, preview_url: false })),
            None if name.is_empty() && params.is_empty() => None,
            None => Some(Payload::Template(TemplatePayload { name, language, body_parameters: params, components_json: components })),
        };
        SendRequest { operation_id, waba_id, phone_number_id, recipient, category, payload, deadline_unix_ms: deadline, labels, ..Default::default() }
    }
}

fn json_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null)),
        ".{0,16}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z_]{0,12}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Replaces the value at a pseudo-random path of `doc` (chosen by `picks`) with `with`.
fn graft(doc: &mut Value, picks: &[u8], with: Value) {
    let Some((&p, rest)) = picks.split_first() else {
        *doc = with;
        return;
    };
    match doc {
        Value::Object(map) if !map.is_empty() => {
            let key = map.keys().nth(p as usize % map.len()).cloned().unwrap_or_default();
            if let Some(next) = map.get_mut(&key) {
                graft(next, rest, with);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let i = p as usize % items.len();
            graft(&mut items[i], rest, with);
        }
        _ => *doc = with,
    }
}

fn check_parsed(body: &[u8]) {
    match webhook::parse(body) {
        Ok(parsed) => {
            for s in &parsed.statuses {
                assert!(!s.wamid.is_empty(), "a status without an id is not acted on");
                assert_ne!(s.status, 0, "a status with an unknown word is not acted on");
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

const EXAMPLES: [&str; 3] =
    [webhook::examples::STATUS_SENT, webhook::examples::STATUS_FAILED, webhook::examples::INBOUND_TEXT];

proptest! {
    #![proptest_config(config())]

    #[test]
    fn protobuf_decoding_of_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        decode_everything(&bytes);
    }

    #[test]
    fn mutated_requests_are_accepted_soundly_or_refused_precisely(
        edits in proptest::collection::vec((any::<u16>(), any::<u8>(), any::<u8>()), 1..6),
    ) {
        let bytes = mutate(valid_request().encode_to_vec(), &edits);
        decode_everything(&bytes);
    }

    #[test]
    fn structured_requests_are_accepted_soundly_or_refused_precisely(r in request_strategy()) {
        check_validation(&r, r.encoded_len());
        // Whatever reaches the dispatcher, the body it builds carries the id and recipient and serialises.
        let body = bw_dispatcher::build_body(&r);
        prop_assert_eq!(&body["messaging_product"], "whatsapp");
        let field = if bw_common::mask::is_user_id(&r.recipient) { "recipient" } else { "to" };
        prop_assert_eq!(body[field].as_str(), Some(r.recipient.as_str()));
        prop_assert_eq!(body["biz_opaque_callback_data"].as_str(), Some(r.operation_id.as_str()));
        match &r.payload {
            Some(Payload::Text(t)) => prop_assert_eq!(body["text"]["body"].as_str(), Some(t.body.as_str())),
            Some(Payload::Template(t)) => {
                prop_assert_eq!(body["template"]["name"].as_str(), Some(t.name.as_str()));
                prop_assert!(body["template"]["components"].is_array() || body["template"]["components"].is_object()
                    || !t.components_json.is_empty());
            }
            None => prop_assert!(body.get("type").is_none()),
        }
        prop_assert!(serde_json::to_vec(&body).is_ok());
    }

    #[test]
    fn webhook_parsing_of_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_parsed(&bytes);
    }

    #[test]
    fn webhook_parsing_of_byte_mutated_meta_payloads_never_panics(
        which in 0usize..3,
        edits in proptest::collection::vec((any::<u16>(), any::<u8>(), any::<u8>()), 1..8),
    ) {
        check_parsed(&mutate(EXAMPLES[which].as_bytes().to_vec(), &edits));
    }

    #[test]
    fn webhook_parsing_of_structurally_mutated_meta_payloads_never_panics(
        which in 0usize..3,
        picks in proptest::collection::vec(any::<u8>(), 0..8),
        with in json_strategy(),
    ) {
        let mut doc: Value = serde_json::from_str(EXAMPLES[which]).expect("example is json");
        graft(&mut doc, &picks, with);
        check_parsed(&serde_json::to_vec(&doc).expect("serialises"));
    }

    #[test]
    fn signature_check_never_panics_and_only_the_exact_signature_passes(
        secret in proptest::collection::vec(any::<u8>(), 0..48),
        body in proptest::collection::vec(any::<u8>(), 0..256),
        header in proptest::option::of(".{0,80}"),
        flip in any::<u16>(),
    ) {
        let _ = webhook::signature_valid(&secret, &body, header.as_deref());
        if !secret.is_empty() {
            let good = webhook::sign(&secret, &body);
            prop_assert!(webhook::signature_valid(&secret, &body, Some(&good)));
            if !body.is_empty() {
                let mut tampered = body.clone();
                let i = flip as usize % tampered.len();
                tampered[i] ^= 0x01;
                prop_assert!(!webhook::signature_valid(&secret, &tampered, Some(&good)), "a changed body fails");
            }
            // Change one hex digit of the signature.
            let mut sig = good.into_bytes();
            let i = 7 + flip as usize % (sig.len() - 7);
            sig[i] = if sig[i] == b'0' { b'1' } else { b'0' };
            let sig = String::from_utf8(sig).expect("ascii");
            prop_assert!(!webhook::signature_valid(&secret, &body, Some(&sig)), "a changed signature fails");
        } else {
            prop_assert!(!webhook::signature_valid(&secret, &body, header.as_deref()), "an empty secret refuses all");
        }
    }

    #[test]
    fn meta_error_bodies_parse_or_are_refused_without_panicking(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        code in any::<i64>(),
        message in ".{0,40}",
        fbtrace in "[A-Za-z0-9_-]{0,24}",
        noise in json_strategy(),
    ) {
        let _ = bw_common::classify::parse_error_body(&bytes);
        let body = serde_json::json!({"error": {"message": message, "type": "OAuthException", "code": code,
            "error_data": {"details": message}, "fbtrace_id": fbtrace, "extra": noise}});
        let parsed = bw_common::classify::parse_error_body(&serde_json::to_vec(&body).expect("json"));
        let parsed = parsed.expect("a Meta error envelope parses");
        prop_assert_eq!(parsed.code, Some(code));
        prop_assert_eq!(parsed.fbtrace_id, fbtrace);
        // Classification is total, whatever the code, subcode and status.
        let _ = bw_common::classify::classify_code(code);
        let status = (bytes.first().copied().unwrap_or(0) as u16) * 3;
        for channel in [bw_common::classify::Channel::Sync, bw_common::classify::Channel::Async] {
            let _ = bw_common::classify::classify(Some(code), Some(code / 7), status, channel);
            let _ = bw_common::classify::classify(None, None, status, channel);
        }
    }
}

/// A few fixed byte strings that are not valid send requests.
fn garbage() -> Vec<Vec<u8>> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = Vec::new();
    for _ in 0..64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        noise.push(seed as u8);
    }
    let valid = valid_request().encode_to_vec();
    let missing_recipient = SendRequest { recipient: String::new(), ..valid_request() }.encode_to_vec();
    vec![
        Vec::new(),
        vec![0xff, 0xfe, 0x00, 0x01],
        b"not protobuf at all".to_vec(),
        br#"{"operation_id":"json-on-the-protobuf-subject"}"#.to_vec(),
        noise,
        valid[..valid.len() / 2].to_vec(),
        missing_recipient,
    ]
}

async fn stream_messages(h: &Harness, stream: &str) -> Vec<bytes::Bytes> {
    let scanned = bw_ops::scan::scan_stream(&h.js, stream, ">").await.expect("scan");
    scanned.into_iter().map(|m| m.payload).collect()
}

/// Garbage against the running ingest: NATS intake, HTTP intake (JSON and protobuf) and the webhook route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_sent_to_the_real_services_is_refused_clearly_and_kept() {
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    // Stored webhooks stay in BW_WEBHOOKS so the test can see what was stored.
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    let mut kept = Vec::new();

    // NATS intake (the first request waits until ingest listens).
    let listening = bw_testkit::wait_until(std::time::Duration::from_secs(10), || async {
        h.client.request(names::intake_subject(PHONE), b"probe".to_vec().into()).await.is_ok()
    })
    .await;
    assert!(listening, "ingest serves the intake subject");
    kept.push(b"probe".to_vec());
    for body in garbage() {
        let reply = h.client.request(names::intake_subject(PHONE), body.clone().into()).await.expect("ingest answers");
        let reply = IntakeReply::decode(reply.payload.as_ref()).expect("a protobuf reply");
        assert!(!reply.accepted, "garbage accepted: {body:?}");
        assert_ne!(reply.reason(), RejectReason::Unspecified);
        assert!(!reply.error.is_empty());
        eprintln!("nats intake: {:?} {}", reply.reason(), reply.error);
        kept.push(body);
    }
    // A valid request on a subject whose phone token is not a phone number id.
    let valid = valid_request().encode_to_vec();
    let reply = h.client.request(names::intake_subject("not-a-phone"), valid.clone().into()).await.expect("answer");
    let reply = IntakeReply::decode(reply.payload.as_ref()).expect("reply");
    assert_eq!(reply.reason(), RejectReason::SubjectMismatch, "{}", reply.error);
    kept.push(valid);

    // HTTP intake.
    let mut auth = reqwest::header::HeaderMap::new();
    let bearer = format!("Bearer {}", bw_e2e::INTAKE_API_KEY);
    auth.insert(reqwest::header::AUTHORIZATION, bearer.parse().expect("header value"));
    let http = reqwest::Client::builder().default_headers(auth).build().expect("http client");
    let url = format!("http://{}/v1/messages", h.ingest_http);
    let ready = bw_testkit::wait_until(std::time::Duration::from_secs(10), || async {
        http.post(&url).header("content-type", "application/json").body("{").send().await.is_ok()
    })
    .await;
    assert!(ready, "ingest serves HTTP");
    kept.push(b"{".to_vec());
    for body in [&b"{not json"[..], br#"{"operation_id":"x","unknown_field":1}"#, br#"[1,2,3]"#] {
        let resp =
            http.post(&url).header("content-type", "application/json").body(body.to_vec()).send().await.expect("http");
        assert_eq!(resp.status(), 400);
        let json: Value = resp.json().await.expect("a JSON error");
        assert_eq!(json["accepted"], false);
        assert!(json["reason"].as_str().is_some_and(|r| r.starts_with("REJECT_REASON_")), "{json}");
        assert!(json["error"].as_str().is_some_and(|e| !e.is_empty()), "{json}");
        kept.push(body.to_vec());
    }
    let resp = http
        .post(&url)
        .header("content-type", "application/x-protobuf")
        .body(vec![0xff, 0xff, 0xff])
        .send()
        .await
        .expect("http");
    assert_eq!(resp.status(), 400);
    let reply = IntakeReply::decode(resp.bytes().await.expect("body").as_ref()).expect("protobuf reply");
    assert_eq!(reply.reason(), RejectReason::Undecodable);
    kept.push(vec![0xff, 0xff, 0xff]);

    // Webhook route: unsigned, wrongly signed and malformed signatures are refused before anything is stored.
    let hook = format!("http://{}/webhooks/meta", h.ingest_http);
    let body = b"\x00garbage{".to_vec();
    for sig in
        [None, Some(webhook::sign(b"another-secret", &body)), Some("sha256=zz".to_string()), Some("md5=00".into())]
    {
        let mut req = http.post(&hook).body(body.clone());
        if let Some(sig) = sig {
            req = req.header("x-hub-signature-256", sig);
        }
        assert_eq!(req.send().await.expect("http").status(), 401);
    }
    let verify = http.get(format!("{hook}?hub.mode=subscribe&hub.verify_token=wrong&hub.challenge=1")).send().await;
    assert_eq!(verify.expect("http").status(), 403);
    // A correctly signed body is stored exactly as received, whatever it holds.
    let signed = http
        .post(&hook)
        .header("x-hub-signature-256", webhook::sign(APP_SECRET.as_bytes(), &body))
        .body(body.clone())
        .send()
        .await
        .expect("http");
    assert_eq!(signed.status(), 200);

    assert!(stream_messages(&h, names::SEND_STREAM).await.is_empty(), "nothing stored for sending");
    let mut rejected: Vec<Vec<u8>> = stream_messages(&h, names::REJECTED_STREAM)
        .await
        .iter()
        .map(|m| RejectedRequest::decode(m.as_ref()).expect("rejected record").raw)
        .collect();
    rejected.sort();
    kept.sort();
    assert_eq!(rejected, kept, "every refused intake body is kept, byte for byte");
    let webhooks = stream_messages(&h, names::WEBHOOK_STREAM).await;
    assert_eq!(webhooks.len(), 1, "only the correctly signed delivery was stored");
    assert_eq!(StoredWebhook::decode(webhooks[0].as_ref()).expect("stored").body, body);
}
