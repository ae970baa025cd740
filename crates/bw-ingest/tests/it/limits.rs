//! Limits before work: the webhook endpoint refuses what needs no body before reading one, bounds the bodies
//! read at once and the bad signatures per source; the HTTP intake bounds its requests in flight; the NATS
//! intake refuses oversized payloads before decoding them; every stream has a byte limit, and intake refuses new
//! work near the limit of BW_SEND or the ledger.
//!
//! Requests are held in flight for real: a client sends a request's head and never its body, so the server
//! waits in the body read. Where the compiled default would need many such connections (32 webhook bodies,
//! 512 intake requests) a small value is configured beside it, and the defaults are asserted on their own.

use crate::support::{self, API_KEY, APP_SECRET, WAIT, start};
use bw_client::{Client, Request};
use bw_ingest::webhook::{examples, sign};
use bw_proto::v1::{RejectReason, RejectedRequest};
use bw_wire::names;
use prost::Message as _;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WABA: &str = "1001";
const PHONE: &str = "2002";
const TO: &str = "+5491155551234";

/// A well-formed signature header value that is not the body's.
fn wrong_signature() -> String {
    format!("sha256={}", "ab".repeat(32))
}

/// Opens a connection and sends a request head without its body; the connection stays open.
async fn head_only(addr: SocketAddr, path: &str, headers: &[(&str, String)]) -> TcpStream {
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).await.expect("write head");
    conn
}

/// The status and headers of the response on `conn` (bounded by WAIT: a server that waits for the body never
/// answers, and the test fails instead of hanging).
async fn response_head(conn: &mut TcpStream) -> (u16, String) {
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut chunk).await.expect("read");
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        String::from_utf8_lossy(&buf).to_string()
    };
    let text = tokio::time::timeout(WAIT, read).await.expect("answered without the body");
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text.to_ascii_lowercase())
}

async fn post_webhook(http: &reqwest::Client, env: &support::Env, body: &str, signature: String) -> reqwest::Response {
    http.post(env.url("/webhooks/meta"))
        .header("content-type", "application/json")
        .header("x-hub-signature-256", signature)
        .body(body.to_string())
        .send()
        .await
        .expect("post")
}

/// An HTTP client whose connections come from `local` (loopback has the whole 127/8).
fn client_from(local: &str) -> reqwest::Client {
    bw_common::crypto::install_crypto();
    let ip: std::net::IpAddr = local.parse().expect("ip");
    reqwest::Client::builder().no_proxy().local_address(ip).build().expect("client")
}

fn metric(text: &str, line_start: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(line_start)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[test]
fn the_compiled_defaults_set_every_limit() {
    let cfg = bw_ingest::Config::load(None, &Default::default()).expect("defaults");
    assert_eq!(cfg.intake.max_in_flight, 512);
    assert_eq!(cfg.intake.storage_full_ratio, 0.9);
    let w = &cfg.webhook;
    assert_eq!((w.max_body_bytes, w.max_bodies_in_flight, w.body_read_timeout_ms), (3_145_728, 32, 10_000));
    assert_eq!((w.bad_signature_burst, w.bad_signature_per_minute, w.bad_signature_sources), (20, 60, 10_000));
    assert!(w.trusted_proxies.is_empty(), "the TCP peer is the source unless proxies are configured");
    assert!(cfg.egress.allow_cidrs.is_empty(), "callbacks reach only global addresses by default");
    let limits = &cfg.nats.limits;
    assert!(limits.byte_limits().iter().all(|(_, v)| *v > 0), "{limits:?}");
    let send = names::SendPartitions::new(1);
    let streams = bw_common::nats::stream_configs(limits, 1, send);
    let buckets = bw_common::nats::bucket_configs(&cfg.nats);
    assert!(streams.iter().all(|s| s.max_bytes > 0), "every stream has a byte limit");
    assert!(buckets.iter().all(|b| b.max_bytes > 0), "every bucket has a byte limit");
    // The shared base (bw-common base.toml) documents each byte limit with its compiled value.
    for (key, value) in limits.byte_limits() {
        let line = format!("{key} = {value}");
        assert!(bw_common::config::BASE.lines().any(|l| l.starts_with(&line)), "base.toml lacks `{line}`");
    }
}

#[tokio::test]
async fn an_unsigned_webhook_is_refused_before_its_body_is_read() {
    let env = start(|_| {}).await;
    // The head promises 3 MB that never come: only an answer that needs no body can arrive.
    let json = ("Content-Type", "application/json".to_string());
    let mut unsigned =
        head_only(env.http, "/webhooks/meta", &[json.clone(), ("Content-Length", "3000000".into())]).await;
    let (status, text) = response_head(&mut unsigned).await;
    assert_eq!(status, 401, "{text}");
    let mut malformed = head_only(
        env.http,
        "/webhooks/meta",
        &[json.clone(), ("X-Hub-Signature-256", "sha256=00".into()), ("Content-Length", "3000000".into())],
    )
    .await;
    assert_eq!(response_head(&mut malformed).await.0, 401);
    // Over the cap by its Content-Length: 413, unread.
    let mut big = head_only(
        env.http,
        "/webhooks/meta",
        &[json, ("X-Hub-Signature-256", wrong_signature()), ("Content-Length", "3145729".into())],
    )
    .await;
    assert_eq!(response_head(&mut big).await.0, 413);
    let text = env.metrics_text();
    assert!(text.contains(r#"bw_webhooks_received_total{result="missing_signature"} 1"#), "{text}");
    assert!(text.contains(r#"bw_webhooks_received_total{result="invalid_signature"} 1"#), "{text}");
    assert!(text.contains(r#"bw_webhooks_received_total{result="too_large"} 1"#), "{text}");
    assert_eq!(env.count(names::WEBHOOK_STREAM).await, 0);
    env.stop().await;
}

#[tokio::test]
async fn a_body_without_content_length_is_cut_at_the_cap_and_a_stalled_one_times_out() {
    let env = start(|cfg| {
        cfg.webhook.max_body_bytes = 4_096;
        cfg.webhook.body_read_timeout_ms = 300;
    })
    .await;
    // Chunked: no Content-Length to refuse on, so the cap applies while the chunks arrive.
    let mut chunked = head_only(
        env.http,
        "/webhooks/meta",
        &[("X-Hub-Signature-256", wrong_signature()), ("Transfer-Encoding", "chunked".into())],
    )
    .await;
    for _ in 0..5 {
        let chunk = format!("400\r\n{}\r\n", " ".repeat(1_024));
        chunked.write_all(chunk.as_bytes()).await.expect("write chunk");
    }
    assert_eq!(response_head(&mut chunked).await.0, 413, "cut off past 4096 bytes, without waiting for the end");
    // A body that stops arriving does not hold its slot: 408 after the read timeout.
    let mut stalled = head_only(
        env.http,
        "/webhooks/meta",
        &[("X-Hub-Signature-256", wrong_signature()), ("Content-Length", "100".into())],
    )
    .await;
    assert_eq!(response_head(&mut stalled).await.0, 408);
    assert!(env.metrics_text().contains(r#"bw_webhooks_received_total{result="read_timeout"} 1"#));
    env.stop().await;
}

#[tokio::test]
async fn a_bad_signature_flood_from_one_address_gets_429_while_meta_still_gets_200() {
    // The compiled burst (20); the refill slowed from one a second to one a minute, so no token comes back
    // while the test runs however slow the machine is.
    let env = start(|cfg| {
        cfg.webhook.process = false;
        cfg.webhook.bad_signature_per_minute = 1;
    })
    .await;
    let body = examples::STATUS_SENT;
    let flood = client_from("127.0.0.1");
    // 20 badly signed requests at once, then 429 until a token is back.
    for i in 0..20 {
        assert_eq!(post_webhook(&flood, &env, body, wrong_signature()).await.status(), 401, "request {i}");
    }
    let limited = post_webhook(&flood, &env, body, wrong_signature()).await;
    assert_eq!(limited.status(), 429);
    let retry_after: u64 = limited.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let unsigned = flood.post(env.url("/webhooks/meta")).body(body).send().await.expect("post");
    assert_eq!(unsigned.status(), 429, "refused before the header check");
    // Meta, from another address, is not affected.
    let meta = client_from("127.0.0.2");
    let signed = post_webhook(&meta, &env, body, sign(APP_SECRET.as_bytes(), body.as_bytes())).await;
    assert_eq!(signed.status(), 200);
    assert_eq!(env.count(names::WEBHOOK_STREAM).await, 1, "stored");
    // A source over its budget is refused whole, even a signed request (Meta would retry it later).
    let from_flood = post_webhook(&flood, &env, body, sign(APP_SECRET.as_bytes(), body.as_bytes())).await;
    assert_eq!(from_flood.status(), 429);
    let text = env.metrics_text();
    assert!(text.contains(r#"bw_webhooks_received_total{result="invalid_signature"} 20"#), "{text}");
    assert!(text.contains(r#"bw_webhooks_received_total{result="rate_limited"} 3"#), "{text}");
    assert!(text.contains("bw_webhook_bad_signature_sources 1"), "{text}");
    env.stop().await;
}

#[tokio::test]
async fn webhook_bodies_beyond_the_concurrency_limit_get_503_with_retry_after() {
    let env = start(|cfg| {
        cfg.webhook.process = false;
        cfg.webhook.max_bodies_in_flight = 2;
        cfg.webhook.body_read_timeout_ms = 600_000;
    })
    .await;
    let head = [("X-Hub-Signature-256", wrong_signature()), ("Content-Length", "100".to_string())];
    let stalled =
        [head_only(env.http, "/webhooks/meta", &head).await, head_only(env.http, "/webhooks/meta", &head).await];
    let body = examples::STATUS_SENT;
    let http = support::bare_http_client();
    let signature = sign(APP_SECRET.as_bytes(), body.as_bytes());
    // Once both stalled bodies hold their slots, a delivery is refused at once (until then it goes through).
    let busy = || async { post_webhook(&http, &env, body, signature.clone()).await.status() == 503 };
    assert!(bw_testkit::wait_until(WAIT, busy).await, "503 while every slot is taken");
    let res = post_webhook(&http, &env, body, signature.clone()).await;
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(res.text().await.expect("text"), "busy; retry\n");
    drop(stalled);
    let stored = || async { post_webhook(&http, &env, body, signature.clone()).await.status() == 200 };
    assert!(bw_testkit::wait_until(WAIT, stored).await, "slots come back when the stalled bodies end");
    assert!(env.metrics_text().contains(r#"bw_webhooks_received_total{result="busy"}"#));
    env.stop().await;
}

#[tokio::test]
async fn http_intake_at_max_in_flight_answers_429_with_retry_after() {
    let env = start(|cfg| cfg.intake.max_in_flight = 2).await;
    let head = [
        ("Authorization", format!("Bearer {API_KEY}")),
        ("Content-Type", "application/json".to_string()),
        ("Content-Length", "200".to_string()),
    ];
    let stalled = [head_only(env.http, "/v1/messages", &head).await, head_only(env.http, "/v1/messages", &head).await];
    let http = support::http_client();
    let json = |op: &str| {
        serde_json::json!({"operation_id": op, "waba_id": WABA, "phone_number_id": PHONE, "recipient": TO,
            "category": "transactional", "text": {"body": "hi"}})
    };
    let mut n = 0;
    let busy = || {
        n += 1;
        let req = http.post(env.url("/v1/messages")).json(&json(&format!("busy-{n}")));
        async move { req.send().await.expect("post").status() == 429 }
    };
    assert!(bw_testkit::wait_until(WAIT, busy).await, "429 while max_in_flight requests are in flight");
    let res = http.post(env.url("/v1/messages")).json(&json("busy-x")).send().await.expect("post");
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["retry-after"], "1");
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["reason"], "BUSY");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("retry with the same operation_id")), "{body}");
    assert!(env.entry("busy-x").await.is_none(), "nothing stored");
    // The NATS intake has its own slots.
    let reply = Client::new(env.nats.clone()).send(&Request::text("nats-1", WABA, PHONE, TO, "hi").build()).await;
    assert!(reply.expect("reply").accepted);
    drop(stalled);
    let accepted = || async {
        let req = http.post(env.url("/v1/messages")).json(&json("after-1"));
        req.send().await.expect("post").status() == 202
    };
    assert!(bw_testkit::wait_until(WAIT, accepted).await);
    assert!(env.metrics_text().contains(r#"bw_intake_refused_total{reason="busy"}"#));
    env.stop().await;
}

#[tokio::test]
async fn a_nats_payload_over_the_limit_is_refused_before_decoding() {
    let env = start(|_| {}).await;
    // Not protobuf at all: decoded, it would be UNDECODABLE; its size alone refuses it.
    let junk = vec![0xff; 70_000];
    let msg = env.nats.request(names::intake_subject(PHONE), junk.clone().into()).await.expect("reply");
    let reply = bw_proto::v1::IntakeReply::decode(msg.payload.as_ref()).expect("reply");
    assert_eq!(reply.reason(), RejectReason::Oversize, "{}", reply.error);
    assert!(reply.error.contains("request is 70000 bytes; the limit is 65536 bytes"), "{}", reply.error);
    assert!(env.wait_count(names::REJECTED_STREAM, 1).await);
    let kept = env.last(names::REJECTED_STREAM, &names::rejected_subject(PHONE)).await;
    let record = RejectedRequest::decode(kept.payload.as_ref()).expect("record");
    assert_eq!((record.raw.len(), record.raw_size), (70_000, 70_000), "kept whole: it fits in one record");
    let text = env.metrics_text();
    assert!(text.contains(r#"reason="REJECT_REASON_OVERSIZE"} 1"#), "{text}");
    env.stop().await;
}

/// The fill ingest last read for `stream` (its gauge).
fn fill(env: &support::Env, stream: &str) -> f64 {
    metric(&env.metrics_text(), &format!("bw_ingest_storage_fill_ratio{{stream=\"{stream}\"}}")).unwrap_or(0.0)
}

#[tokio::test]
async fn near_full_send_stream_or_ledger_refuses_new_work_with_storage_full() {
    // Small byte limits, beside the compiled defaults asserted above.
    let env = start(|cfg| {
        cfg.nats.limits.send_max_bytes = 256 * 1024;
        cfg.nats.limits.ledger_max_bytes = 256 * 1024;
    })
    .await;
    let client = Client::new(env.nats.clone());
    let send = |op: &str| {
        let request = Request::text(op, WABA, PHONE, TO, "hi").build();
        let client = client.clone();
        async move { client.send(&request).await }
    };
    assert!(send("full-0").await.expect("reply").accepted);
    // Fill BW_SEND to 90% of its limit with another sender's messages, without reaching the limit.
    let stream = env.js.get_stream(names::SEND_STREAM).await.expect("stream");
    let max = stream.cached_info().config.max_bytes;
    assert_eq!(max, 256 * 1024);
    let mut bytes = 0;
    while (bytes as f64) < 0.9 * max as f64 {
        let ack = env.js.publish(names::outbox_subject(names::Lane::Low, "9999"), vec![b'f'; 4_096].into());
        ack.await.expect("publish").await.expect("stored");
        bytes = env.js.get_stream(names::SEND_STREAM).await.expect("stream").cached_info().state.bytes;
    }
    assert!((bytes as i64) < max, "below the limit: the stream itself still takes publishes");
    assert!(bw_testkit::wait_until(WAIT, || async { fill(&env, "BW_SEND") >= 0.9 }).await, "ingest read the fill");
    let reply = send("full-1").await.expect("reply");
    assert_eq!(reply.reason(), RejectReason::StorageFull, "{}", reply.error);
    assert!(reply.error.contains("BW_SEND (BW_SEND) is") && reply.error.contains("full (bytes)"), "{}", reply.error);
    assert!(env.entry("full-1").await.is_none(), "nothing stored");
    let after = env.js.get_stream(names::SEND_STREAM).await.expect("stream").cached_info().state.bytes;
    assert_eq!(after, bytes, "the refusal stored nothing in BW_SEND");
    // A retry of an operation accepted before is still answered as such.
    let retry = send("full-0").await.expect("reply");
    assert!(retry.accepted && retry.duplicate);
    // Over HTTP: 503 with the reason.
    let json = serde_json::json!({"operation_id": "full-http", "waba_id": WABA, "phone_number_id": PHONE,
        "recipient": TO, "category": "transactional", "text": {"body": "hi"}});
    let res = support::http_client().post(env.url("/v1/messages")).json(&json).send().await.expect("post");
    assert_eq!(res.status(), 503);
    assert_eq!(res.json::<serde_json::Value>().await.expect("json")["reason"], "REJECT_REASON_STORAGE_FULL");
    // Drained, new work is taken again.
    stream.purge().filter(names::outbox_subject(names::Lane::Low, "9999")).await.expect("purge");
    assert!(bw_testkit::wait_until(WAIT, || async { fill(&env, "BW_SEND") < 0.9 }).await);
    assert!(send("full-2").await.expect("reply").accepted);

    // The ledger the same way: filled by other entries to 90% of its limit.
    let ledger = &env.deps.buckets.ledger[0];
    let mut i = 0;
    while fill_of(&env, "KV_BW_LEDGER").await < 0.9 {
        ledger.put(format!("filler-{i}"), vec![b'l'; 4_096].into()).await.expect("put");
        i += 1;
    }
    assert!(bw_testkit::wait_until(WAIT, || async { fill(&env, "KV_BW_LEDGER") >= 0.9 }).await);
    let reply = send("full-3").await.expect("reply");
    assert_eq!(reply.reason(), RejectReason::StorageFull, "{}", reply.error);
    assert!(reply.error.contains("the ledger (KV_BW_LEDGER) is"), "{}", reply.error);
    let text = env.metrics_text();
    assert!(text.contains(r#"reason="REJECT_REASON_STORAGE_FULL"} 2"#), "{text}");
    env.stop().await;
}

/// A stream's byte fill as the server has it now.
async fn fill_of(env: &support::Env, stream: &str) -> f64 {
    let info = env.js.get_stream(stream).await.expect("stream");
    let info = info.cached_info();
    info.state.bytes as f64 / info.config.max_bytes as f64
}

#[tokio::test]
async fn every_stream_has_a_byte_limit_and_ingest_gives_one_to_streams_made_without() {
    use async_nats::jetstream::stream::DiscardPolicy::{New, Old};
    use futures::StreamExt as _;
    let env = start(|_| {}).await;
    let mut names_of = env.js.stream_names();
    let mut seen = Vec::new();
    while let Some(name) = names_of.next().await {
        let name = name.expect("name");
        let info = env.js.get_stream(&name).await.expect("stream").cached_info().clone();
        assert!(info.config.max_bytes > 0, "{name} has no byte limit");
        let kept_for_readers =
            ["BW_REJECTED", "BW_INBOUND", "BW_EVENTS", "BW_FEED", "BW_ACCOUNT"].contains(&name.as_str());
        assert_eq!(info.config.discard, if kept_for_readers { Old } else { New }, "{name}");
        seen.push(name);
    }
    for expected in ["BW_SEND", "BW_DLQ", "KV_BW_LEDGER", "BW_FEED", "OBJ_BW_INGEST_BODIES", "BW_WEBHOOKS"] {
        assert!(seen.iter().any(|s| s == expected), "{expected} in {seen:?}");
    }
    // Streams of an older deployment, made without byte limits.
    for name in ["BW_SEND", "KV_BW_LEDGER", "BW_FEED", "OBJ_BW_INGEST_BODIES"] {
        let mut config = env.js.get_stream(name).await.expect("stream").cached_info().config.clone();
        config.max_bytes = -1;
        env.js.update_stream(config).await.expect("update");
    }
    // The next ingest to start applies the configured limits to them.
    let cfg = support::test_config(&env.server.url());
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("deps");
    let token = tokio_util::sync::CancellationToken::new();
    let second = tokio::spawn(bw_ingest::run(cfg.clone(), deps.clone(), token.clone()));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await, "second ready");
    let limits = &cfg.nats.limits;
    for (name, want) in [
        ("BW_SEND", limits.send_max_bytes),
        ("KV_BW_LEDGER", limits.ledger_max_bytes),
        ("BW_FEED", limits.feed_max_bytes),
        ("OBJ_BW_INGEST_BODIES", limits.bodies_max_bytes),
    ] {
        let info = env.js.get_stream(name).await.expect("stream").cached_info().clone();
        assert_eq!(info.config.max_bytes, want, "{name}");
    }
    token.cancel();
    tokio::time::timeout(WAIT, second).await.expect("stops").expect("joins").expect("ok");
    env.stop().await;
}
