//! Secrets and personal data never reach logs or spans: a message with a known body goes through ingest,
//! the dispatcher, the simulator and its status webhooks (signed with the app secret) while every log event
//! and every span field of the services is captured at TRACE level; none may contain the access token, the
//! app secret, the webhook verify token, the message body or the full recipient number.

use bw_e2e::{ACCESS_TOKEN, APP_SECRET, Harness, WABA_ID};
use bw_proto::v1::{Category, OperationState};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

const PHONE: &str = "106540352242944";
const RECIPIENT: &str = "+5491155557788";
const BODY: &str = "redaction-canary-body: your code is 884213";

/// Writes every span field and event field it sees into one shared text.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<String>>);

struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, " {}={}", field.name(), value);
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let mut out = self.0.lock().expect("capture lock");
        let _ = write!(out, "\nspan {} {}", attrs.metadata().target(), attrs.metadata().name());
        attrs.record(&mut Fields(&mut out));
    }
    fn on_record(&self, _id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut out = self.0.lock().expect("capture lock");
        out.push_str("\nrecord");
        values.record(&mut Fields(&mut out));
    }
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut out = self.0.lock().expect("capture lock");
        let _ = write!(out, "\nevent {} {}", event.metadata().level(), event.metadata().target());
        event.record(&mut Fields(&mut out));
    }
}

// Current-thread runtime: every task of the services runs on this thread, so the thread-local subscriber
// set below sees all of them (a global subscriber may already belong to another test of this binary).
#[tokio::test(flavor = "current_thread")]
async fn tokens_secrets_bodies_and_phone_numbers_stay_out_of_logs_and_spans() {
    let capture = Capture::default();
    let filter = tracing_subscriber::EnvFilter::new(
        // The simulator stands in for Meta and is not under test here.
        "info,bw_meta_sim=warn,bw_ingest=trace,bw_dispatcher=trace,bw_common=trace,bw_client=trace,bw_breaker=trace",
    );
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(capture.clone())
        // The JSON formatter is what production uses; capture its output too.
        .with(tracing_subscriber::fmt::layer().json().with_writer(capture.clone()));
    let _default = tracing::subscriber::set_default(subscriber);

    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    let request =
        bw_client::Request::text("e2e-redact-1", WABA_ID, PHONE, RECIPIENT, BODY).category(Category::Support).build();
    let reply = h.producer().send(&request).await.expect("ingest answers");
    assert!(reply.accepted, "rejected: {}", reply.error);
    // READ means the signed status webhooks went through ingest as well.
    assert!(h.wait_state("e2e-redact-1", &[OperationState::Read], Duration::from_secs(20)).await);
    // A refused producer request and a forged webhook (bad signature) exercise the error paths.
    let bad = bw_client::Request::text("", WABA_ID, PHONE, RECIPIENT, BODY).build();
    let _ = h.producer().send(&bad).await;
    let forged = format!(
        r#"{{"object":"whatsapp_business_account","entry":[{{"changes":[{{"value":{{"messages":[{{"from":"{}","text":{{"body":"{BODY}"}}}}]}}}}]}}]}}"#,
        &RECIPIENT[1..]
    );
    let status = post_raw(&h.ingest_http, "/webhooks/meta", &forged).await;
    assert!(status.starts_with("HTTP/1.1 401"), "forged webhook answered {status}");
    drop(h);

    let text = capture.0.lock().expect("capture lock").clone();
    assert!(text.contains("ingest.intake") && text.contains("e2e-redact-1"), "nothing captured:\n{text}");
    let digits: String = RECIPIENT.chars().filter(|c| c.is_ascii_digit()).collect();
    for (what, secret) in [
        ("access token", ACCESS_TOKEN),
        ("app secret", APP_SECRET),
        ("verify token", "e2e-verify"),
        ("message body", "redaction-canary-body"),
        ("message body", "884213"),
        ("full phone number", RECIPIENT),
        ("full phone number", digits.as_str()),
    ] {
        let hit = text.lines().find(|l| l.contains(secret));
        assert!(hit.is_none(), "{what} leaked into logs or spans: {}", hit.unwrap_or_default());
    }
}

/// POSTs `body` with a wrong signature over a plain TCP connection; returns the status line.
async fn post_raw(addr: &str, path: &str, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect ingest");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         X-Hub-Signature-256: sha256=0000\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("write head");
    conn.write_all(body.as_bytes()).await.expect("write body");
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_string()
}

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("capture lock").push_str(&String::from_utf8_lossy(buf));
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;
    fn make_writer(&'a self) -> Capture {
        self.clone()
    }
}
