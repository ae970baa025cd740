//! Helpers: a configured simulator, a client, a send helper, a webhook receiver, and wait_until.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use bw_meta_sim::{Limits, MetaSim, SimConfig, SimHandle};
use serde_json::{Value, json};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) const TOKEN: &str = "test-token";
pub(crate) const SECRET: &str = "test-app-secret";
pub(crate) const PHONE: &str = "106540352242922";

/// A config with one accepted token and no limits (tests that need limits set them).
pub(crate) fn config() -> SimConfig {
    SimConfig {
        access_tokens: vec![TOKEN.into()],
        app_secret: SECRET.into(),
        limits: Limits::disabled(),
        ..SimConfig::default()
    }
}

pub(crate) async fn start(cfg: SimConfig) -> SimHandle {
    MetaSim::start(cfg).await.expect("simulator starts")
}

pub(crate) fn client(timeout: Duration) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().timeout(timeout).build().expect("client builds")
}

/// One answer: HTTP status, JSON body (Null when not JSON), headers.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
    pub(crate) headers: reqwest::header::HeaderMap,
}

impl Answer {
    /// Meta error code, or 0 for a 200, or -status for a bodiless error.
    pub(crate) fn code(&self) -> i64 {
        if self.status == 200 {
            return 0;
        }
        self.body["error"]["code"].as_i64().unwrap_or(-i64::from(self.status))
    }

    pub(crate) fn wamid(&self) -> Option<&str> {
        self.body["messages"][0]["id"].as_str()
    }
}

pub(crate) async fn post(
    client: &reqwest::Client,
    sim: &SimHandle,
    body: &Value,
    token: Option<&str>,
) -> reqwest::Result<Answer> {
    let mut req = client.post(sim.messages_url("v21.0", PHONE)).json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Answer { status, body, headers })
}

pub(crate) fn text(to: &str, op: Option<&str>) -> Value {
    let mut v = json!({
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "text",
        "text": { "preview_url": false, "body": "hello" },
    });
    if let Some(op) = op {
        v["biz_opaque_callback_data"] = json!(op);
    }
    v
}

pub(crate) async fn send(
    client: &reqwest::Client,
    sim: &SimHandle,
    to: &str,
    op: Option<&str>,
) -> reqwest::Result<Answer> {
    post(client, sim, &text(to, op), Some(TOKEN)).await
}

/// Recipient number `n` (distinct numbers avoid the pair limit).
pub(crate) fn recipient(n: u32) -> String {
    format!("+1650555{n:04}")
}

pub(crate) async fn wait_until<F, Fut>(timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f().await {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "condition not met within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One POST the receiver got.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) signature: String,
    pub(crate) raw: Bytes,
    pub(crate) answered: u16,
}

impl Received {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.raw).expect("webhook body is json")
    }
}

/// A webhook receiver that answers 500 to the first `fail_first` POSTs.
#[derive(Clone)]
pub(crate) struct Receiver {
    pub(crate) url: String,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub(crate) async fn start(fail_first: usize) -> Receiver {
        let got = Arc::new(Mutex::new(Vec::new()));
        let fail = Arc::new(AtomicUsize::new(fail_first));
        let state = (got.clone(), fail.clone());
        let app = axum::Router::new().route("/webhook", axum::routing::post(receive)).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let url = format!("http://{}/webhook", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { url, got }
    }

    pub(crate) fn all(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }

    /// Bodies answered 200.
    pub(crate) fn accepted(&self) -> Vec<Value> {
        self.all().into_iter().filter(|r| r.answered == 200).map(|r| r.json()).collect()
    }

    /// Every status in accepted POSTs.
    pub(crate) fn statuses(&self) -> Vec<Value> {
        self.accepted()
            .iter()
            .flat_map(|b| b["entry"][0]["changes"][0]["value"]["statuses"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

type RecvState = (Arc<Mutex<Vec<Received>>>, Arc<AtomicUsize>);

async fn receive(State((got, fail)): State<RecvState>, headers: HeaderMap, raw: Bytes) -> StatusCode {
    let failing = fail.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
    let answered = if failing { 500 } else { 200 };
    let signature = headers.get("x-hub-signature-256").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    got.lock().expect("lock").push(Received { signature, raw, answered });
    StatusCode::from_u16(answered).expect("valid status")
}

/// Sends a text to `to` from business number `phone` with bearer `token`.
pub(crate) async fn send_from(
    client: &reqwest::Client,
    sim: &SimHandle,
    phone: &str,
    token: &str,
    to: &str,
    op: Option<&str>,
) -> reqwest::Result<Answer> {
    let resp = client.post(sim.messages_url("v21.0", phone)).bearer_auth(token).json(&text(to, op)).send().await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Answer { status, body, headers })
}

/// The raw answer: status, content type, body bytes.
pub(crate) async fn send_raw(
    client: &reqwest::Client,
    sim: &SimHandle,
    to: &str,
    op: Option<&str>,
) -> reqwest::Result<(u16, String, Bytes)> {
    let resp = client.post(sim.messages_url("v21.0", PHONE)).bearer_auth(TOKEN).json(&text(to, op)).send().await?;
    let status = resp.status().as_u16();
    let ctype =
        resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    Ok((status, ctype, resp.bytes().await?))
}

impl Receiver {
    /// Accepted envelopes whose first change has `field`.
    pub(crate) fn envelopes(&self, field: &str) -> Vec<Value> {
        self.accepted().into_iter().filter(|b| b["entry"][0]["changes"][0]["field"] == field).collect()
    }

    /// The `value` of every accepted change with `field`.
    pub(crate) fn values(&self, field: &str) -> Vec<Value> {
        self.envelopes(field).iter().map(|b| b["entry"][0]["changes"][0]["value"].clone()).collect()
    }

    /// Waits until a change with `field` arrived and returns its envelope.
    pub(crate) async fn wait_field(&self, field: &str) -> Value {
        wait_until(Duration::from_secs(5), || async { !self.envelopes(field).is_empty() }).await;
        self.envelopes(field).remove(0)
    }
}

/// Webhook settings for tests: fast statuses and retries to `url`.
pub(crate) fn fast_webhook(url: &str) -> bw_meta_sim::WebhookConfig {
    bw_meta_sim::WebhookConfig {
        url: Some(url.to_string()),
        sent_delay_ms: Some(10),
        delivered_delay_ms: Some(30),
        read_delay_ms: Some(60),
        retry_initial_ms: 20,
        retry_max_ms: 100,
        ..bw_meta_sim::WebhookConfig::default()
    }
}

/// A template message to `to`.
pub(crate) fn template(to: &str, name: &str, lang: &str, op: Option<&str>) -> Value {
    let mut v = json!({
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "template",
        "template": { "name": name, "language": { "code": lang } },
    });
    if let Some(op) = op {
        v["biz_opaque_callback_data"] = json!(op);
    }
    v
}

/// POSTs `body` from `phone` with `token`.
pub(crate) async fn post_from(
    client: &reqwest::Client,
    sim: &SimHandle,
    phone: &str,
    token: &str,
    body: &Value,
) -> reqwest::Result<Answer> {
    let resp = client.post(sim.messages_url("v21.0", phone)).bearer_auth(token).json(body).send().await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Answer { status, body, headers })
}

/// Whether `got` has the same shape as `want`: the same keys at every level, and the same JSON type for every
/// value (arrays compared by their first element). Returns the first difference.
pub(crate) fn same_shape(want: &Value, got: &Value, path: &str) -> Result<(), String> {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if kind(want) != kind(got) {
        return Err(format!("{path}: {} in the reference, {} here ({got})", kind(want), kind(got)));
    }
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let wk: Vec<&String> = w.keys().collect();
            let gk: Vec<&String> = g.keys().collect();
            if wk != gk {
                return Err(format!("{path}: keys {wk:?} in the reference, {gk:?} here"));
            }
            for (k, v) in w {
                same_shape(v, &g[k], &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        (Value::Array(w), Value::Array(g)) => match (w.first(), g.first()) {
            (Some(a), Some(b)) => same_shape(a, b, &format!("{path}[0]")),
            (None, None) => Ok(()),
            _ => Err(format!("{path}: empty on one side only")),
        },
        _ => Ok(()),
    }
}
