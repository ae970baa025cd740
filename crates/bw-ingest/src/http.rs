//! HTTP routes: producer intake (`POST /v1/messages`, protobuf or JSON) and the Meta webhook receiver
//! (`GET` verification handshake and signed `POST` deliveries on the configured path).
//!
//! The webhook POST path does only three things before answering: read the body (size-limited, after the
//! checks of [`crate::guard`] that need no body), check the signature over the raw bytes, and store the body
//! durably in BW_WEBHOOKS (awaiting the JetStream ack). Parsing happens later, in the processor.

use crate::auth;
use crate::intake::{Caller, Intake, Source};
use crate::metrics::Metrics;
use crate::validate::Rejection;
use crate::webhook;
use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bw_common::registry::Owner;
use bw_proto::v1::{Category, IntakeReply, RejectReason, SendRequest, StoredWebhook, send_request::Payload};
use bw_wire::names;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// Shared state of the HTTP routes.
#[derive(Clone)]
pub(crate) struct HttpState {
    pub intake: Arc<Intake>,
    pub js: async_nats::jetstream::Context,
    pub metrics: Metrics,
    pub verify_token: Arc<str>,
    pub app_secret: Arc<[u8]>,
    pub max_webhook_bytes: usize,
    /// The webhook endpoint's limits before any body is read.
    pub webhook_guard: Arc<crate::guard::WebhookGuard>,
    /// One permit per intake request in flight (`intake.max_in_flight`); none left answers 429.
    pub intake_slots: Arc<tokio::sync::Semaphore>,
    /// Largest HTTP intake body read before answering OVERSIZE (JSON is bigger than protobuf).
    pub max_intake_body_bytes: usize,
    /// Producer API keys.
    pub keys: Arc<auth::Keys>,
    pub ledger: bw_common::ledger::Ledger,
    /// Zone of the local times in status answers.
    pub display_tz: chrono_tz::Tz,
    pub status_enabled: bool,
}

/// Routes for producers.
pub(crate) fn intake_routes(state: HttpState) -> Router {
    Router::new()
        .route("/v1/messages", post(post_message))
        .route("/v1/messages/{operation_id}", get(get_message))
        .with_state(state)
}

/// Routes for Meta.
pub(crate) fn webhook_routes(state: HttpState, path: &str) -> Router {
    Router::new().route(path, get(verify).post(receive)).with_state(state)
}

// ---- Meta webhooks ----

async fn verify(State(state): State<HttpState>, Query(q): Query<HashMap<String, String>>) -> Response {
    let mode = q.get("hub.mode").map(String::as_str);
    let token = q.get("hub.verify_token").map(String::as_str).unwrap_or("");
    let challenge = q.get("hub.challenge").cloned().unwrap_or_default();
    let token_ok = !state.verify_token.is_empty()
        && token.len() == state.verify_token.len()
        && token.bytes().zip(state.verify_token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    if mode == Some("subscribe") && token_ok {
        tracing::info!("webhook verification accepted");
        (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], challenge).into_response()
    } else {
        tracing::warn!("webhook verification refused");
        (StatusCode::FORBIDDEN, "verification refused\n").into_response()
    }
}

async fn receive(State(state): State<HttpState>, request: axum::extract::Request) -> Response {
    let started = Instant::now();
    let peer = request.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0);
    let (parts, body) = request.into_parts();
    let response = match state.webhook_guard.admit(peer, &parts.headers) {
        Ok(admitted) => store_webhook(&state, &parts.headers, body, admitted).await,
        Err(refusal) => refuse_webhook(&state, refusal),
    };
    if response.status() == StatusCode::UNAUTHORIZED {
        state.metrics.bad_signature_sources.set(state.webhook_guard.limiter.tracked() as i64);
    }
    state.metrics.webhook_ack_seconds.observe(started.elapsed().as_secs_f64());
    response
}

/// Answers a webhook refused before its body was read, and counts it.
fn refuse_webhook(state: &HttpState, refusal: crate::guard::Refusal) -> Response {
    use crate::guard::Refusal;
    let (result, status, text) = match refusal {
        Refusal::RateLimited(wait) => {
            state.metrics.received("rate_limited");
            let mut res =
                (StatusCode::TOO_MANY_REQUESTS, "too many badly signed requests from this address; retry later\n")
                    .into_response();
            res.headers_mut().insert(header::RETRY_AFTER, retry_after(wait));
            return res;
        }
        Refusal::MissingSignature => {
            ("missing_signature", StatusCode::UNAUTHORIZED, "missing X-Hub-Signature-256 header\n".to_string())
        }
        Refusal::MalformedSignature => {
            ("invalid_signature", StatusCode::UNAUTHORIZED, "malformed X-Hub-Signature-256 header\n".to_string())
        }
        Refusal::TooLarge => (
            "too_large",
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Content-Length over the {}-byte limit\n", state.max_webhook_bytes),
        ),
        Refusal::Busy => {
            // Meta retries a non-200 delivery for up to 7 days: refusing one while at the limit loses nothing.
            state.metrics.received("busy");
            let mut res = (StatusCode::SERVICE_UNAVAILABLE, "busy; retry\n").into_response();
            res.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return res;
        }
    };
    state.metrics.received(result);
    if status == StatusCode::UNAUTHORIZED {
        tracing::warn!(reason = result, "webhook refused before its body was read");
    }
    (status, text).into_response()
}

/// A `Retry-After` value in whole seconds, at least 1.
fn retry_after(wait: std::time::Duration) -> header::HeaderValue {
    header::HeaderValue::from(wait.as_secs_f64().ceil().max(1.0) as u64)
}

async fn store_webhook(
    state: &HttpState,
    headers: &HeaderMap,
    body: Body,
    admitted: crate::guard::Admitted,
) -> Response {
    let guard = &state.webhook_guard;
    let read = crate::guard::read_capped(body, state.max_webhook_bytes, 0);
    let bytes = match tokio::time::timeout(guard.read_timeout, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(crate::guard::ReadError::TooLarge(_))) => {
            state.metrics.received("too_large");
            let text = format!("body over the {}-byte limit\n", state.max_webhook_bytes);
            return (StatusCode::PAYLOAD_TOO_LARGE, text).into_response();
        }
        Ok(Err(crate::guard::ReadError::Failed)) | Err(_) => {
            state.metrics.received("read_timeout");
            return (StatusCode::REQUEST_TIMEOUT, "body not received in time\n").into_response();
        }
    };
    let signature = headers.get(crate::guard::SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    if !webhook::signature_valid(&state.app_secret, &bytes, signature) {
        state.metrics.received("invalid_signature");
        guard.charge(admitted.source);
        tracing::warn!(has_header = signature.is_some(), "webhook signature invalid");
        return (StatusCode::UNAUTHORIZED, "invalid signature\n").into_response();
    }
    let sha = webhook::body_sha256(&bytes);
    let span = tracing::info_span!("ingest.webhook", body_sha256 = %sha, bytes = bytes.len());
    let mut nats_headers = async_nats::HeaderMap::new();
    nats_headers.insert("Nats-Msg-Id", sha.as_str());
    // A body too large for one NATS message goes to the object store first; the record then points to it.
    let body = if state.intake.bodies.fits_inline(bytes.len()) {
        bytes.to_vec()
    } else {
        let name = crate::bodies::webhook_object(&sha);
        if let Err(e) = state.intake.bodies.put(&name, &bytes).instrument(span.clone()).await {
            state.metrics.received("store_failed");
            tracing::warn!(parent: &span, error = %e, "large webhook body not stored; answering 503");
            return (StatusCode::SERVICE_UNAVAILABLE, "not stored; retry\n").into_response();
        }
        nats_headers.insert(crate::bodies::OBJECT_HEADER, name.as_str());
        Vec::new()
    };
    let stored = StoredWebhook { body, received_at_unix_ms: bw_common::time::now_ms(), body_sha256: sha };
    bw_wire::trace::inject(&span, &mut nats_headers);
    let result = bw_common::nats::publish_durable(
        &state.js,
        names::WEBHOOK_SUBJECT.to_string(),
        nats_headers,
        stored.encode_to_vec().into(),
    )
    .instrument(span)
    .await;
    match result {
        Ok(duplicate) => {
            state.metrics.received(if duplicate { "duplicate_body" } else { "stored" });
            (StatusCode::OK, "ok\n").into_response()
        }
        Err(e) => {
            // Meta retries non-200 answers for days: nothing is lost by refusing now.
            state.metrics.received("store_failed");
            tracing::warn!(error = %e, "webhook not stored; answering 503");
            (StatusCode::SERVICE_UNAVAILABLE, "not stored; retry\n").into_response()
        }
    }
}

// ---- Producer intake ----

/// The JSON form of a send request (same fields as the protobuf `SendRequest`). Both the snake_case names and
/// proto3 canonical JSON (lowerCamelCase names, int64 as a string) are accepted.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default, alias = "operationId")]
    operation_id: String,
    #[serde(default, alias = "wabaId")]
    waba_id: String,
    #[serde(default, alias = "phoneNumberId")]
    phone_number_id: String,
    /// Kept as a value so a number is refused precisely (and never echoed). A phone number or a user id.
    #[serde(default)]
    recipient: Option<serde_json::Value>,
    /// The recipient's business-scoped user id, for a producer that keeps it apart from the phone. With both, the
    /// phone is used, as Meta uses `to` over `recipient` (reference §6).
    #[serde(default, alias = "userId")]
    user_id: Option<String>,
    #[serde(default)]
    category: Option<serde_json::Value>,
    #[serde(default)]
    text: Option<JsonText>,
    #[serde(default)]
    template: Option<JsonTemplate>,
    #[serde(default, alias = "deadlineUnixMs", deserialize_with = "int64")]
    deadline_unix_ms: i64,
    #[serde(default, alias = "customerLastInboundUnixMs", deserialize_with = "int64")]
    customer_last_inbound_unix_ms: i64,
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonText {
    body: String,
    #[serde(default, alias = "previewUrl")]
    preview_url: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonTemplate {
    #[serde(default)]
    name: String,
    #[serde(default)]
    language: String,
    #[serde(default, alias = "bodyParameters")]
    body_parameters: Vec<String>,
    #[serde(default, alias = "componentsJson")]
    components_json: String,
}

/// An int64 as proto3 JSON writes it (a string of digits) or as a plain number. The value is never echoed.
fn int64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Number(n) => n.as_i64().ok_or_else(|| serde::de::Error::custom("expected an int64 (ms)")),
        serde_json::Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| serde::de::Error::custom("expected an int64 (ms) as a number or a string of digits")),
        serde_json::Value::Null => Ok(0),
        _ => Err(serde::de::Error::custom("expected an int64 (ms)")),
    }
}

/// The JSON form of an `IntakeReply`.
#[derive(Serialize)]
struct JsonReply<'a> {
    accepted: bool,
    operation_id: &'a str,
    duplicate: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    error: &'a str,
}

fn parse_category(v: &serde_json::Value) -> Result<i32, Rejection> {
    let unknown =
        |shown: String| Rejection::new(RejectReason::UnknownCategory, format!("category `{shown}` is unknown"));
    match v {
        serde_json::Value::Number(n) => {
            n.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or_else(|| unknown(n.to_string()))
        }
        serde_json::Value::String(s) => {
            let upper = s.to_ascii_uppercase();
            let name = if upper.starts_with("CATEGORY_") { upper } else { format!("CATEGORY_{upper}") };
            match Category::from_str_name(&name) {
                Some(c) => Ok(c as i32),
                None => Err(unknown(s.chars().take(32).collect())),
            }
        }
        other => Err(unknown(other.to_string().chars().take(32).collect())),
    }
}

fn from_json(raw: &[u8]) -> Result<SendRequest, (String, Rejection)> {
    let j: JsonRequest = serde_json::from_slice(raw).map_err(|e| {
        // serde quotes offending values (a recipient sent as a number, text...): mask them.
        let error = crate::secret::mask_values(&e.to_string());
        (String::new(), Rejection::new(RejectReason::Undecodable, format!("body is not a JSON send request: {error}")))
    })?;
    let op = j.operation_id.clone();
    let recipient = match j.recipient {
        None | Some(serde_json::Value::Null) => j.user_id.unwrap_or_default(),
        Some(serde_json::Value::String(s)) => s,
        Some(_) => {
            return Err((
                op,
                Rejection::new(
                    RejectReason::BadRecipient,
                    "recipient must be a JSON string in E.164 form (\"+5491155551234\") or a user id, not a number",
                ),
            ));
        }
    };
    let category = match &j.category {
        Some(v) => parse_category(v).map_err(|r| (op.clone(), r))?,
        None => 0,
    };
    let payload = match (j.text, j.template) {
        (Some(_), Some(_)) => return Err((op, crate::validate::both_payloads())),
        (Some(t), None) => Some(Payload::Text(bw_proto::v1::TextPayload { body: t.body, preview_url: t.preview_url })),
        (None, Some(t)) => Some(Payload::Template(bw_proto::v1::TemplatePayload {
            name: t.name,
            language: t.language,
            body_parameters: t.body_parameters,
            components_json: t.components_json,
        })),
        (None, None) => None,
    };
    Ok(SendRequest {
        operation_id: j.operation_id,
        waba_id: j.waba_id,
        phone_number_id: j.phone_number_id,
        recipient,
        category,
        payload,
        deadline_unix_ms: j.deadline_unix_ms,
        customer_last_inbound_unix_ms: j.customer_last_inbound_unix_ms,
        labels: j.labels,
        ..Default::default()
    })
}

fn http_status(reply: &IntakeReply) -> StatusCode {
    if reply.accepted {
        return if reply.duplicate { StatusCode::OK } else { StatusCode::ACCEPTED };
    }
    match reply.reason() {
        RejectReason::Unavailable | RejectReason::StorageFull => StatusCode::SERVICE_UNAVAILABLE,
        RejectReason::Oversize => StatusCode::PAYLOAD_TOO_LARGE,
        RejectReason::SenderNotRegistered | RejectReason::SenderNotOwned => StatusCode::FORBIDDEN,
        _ => StatusCode::BAD_REQUEST,
    }
}

fn render(reply: &IntakeReply, protobuf: bool) -> Response {
    let status = http_status(reply);
    if protobuf {
        return (status, [(header::CONTENT_TYPE, "application/x-protobuf")], reply.encode_to_vec()).into_response();
    }
    let json = JsonReply {
        accepted: reply.accepted,
        operation_id: &reply.operation_id,
        duplicate: reply.duplicate,
        reason: (!reply.accepted).then(|| reply.reason().as_str_name()),
        error: &reply.error,
    };
    match serde_json::to_vec(&json) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

fn is_protobuf(headers: &HeaderMap, name: header::HeaderName) -> bool {
    headers.get(name).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("protobuf"))
}

/// Body formats of the intake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Protobuf,
}

/// The declared body format; None when the Content-Type is missing or another type.
fn body_format(headers: &HeaderMap) -> Option<Format> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Some(Format::Json),
        "application/x-protobuf" | "application/protobuf" => Some(Format::Protobuf),
        _ => None,
    }
}

/// A JSON error of the HTTP layer (before validation): `{"accepted":false,"reason":..,"error":..}`.
pub(crate) fn http_error(status: StatusCode, reason: &'static str, error: &str) -> Response {
    let json = JsonReply { accepted: false, operation_id: "", duplicate: false, reason: Some(reason), error };
    let body = serde_json::to_vec(&json).unwrap_or_else(|_| b"{\"accepted\":false}".to_vec());
    let mut res = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if status == StatusCode::UNAUTHORIZED {
        res.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    }
    res
}

/// Answers an intake request beyond `intake.max_in_flight` (429 with Retry-After) and counts it.
fn intake_busy(state: &HttpState) -> Response {
    state.metrics.refused("busy");
    let mut res = http_error(
        StatusCode::TOO_MANY_REQUESTS,
        "BUSY",
        "too many requests in flight on this instance; retry with the same operation_id",
    );
    res.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    res
}

/// Answers a refused authentication (401) and counts it.
pub(crate) fn refuse(state: &HttpState, refusal: auth::Refusal) -> Response {
    state.metrics.refused(refusal.label());
    tracing::info!(reason = refusal.label(), "http request refused");
    let error = match refusal {
        auth::Refusal::MissingKey => "an API key is required: send `Authorization: Bearer <key>` (or `X-Api-Key`)",
        auth::Refusal::UnknownKey => "the API key is not valid",
        auth::Refusal::Forbidden => "this API key may not act for that sender",
    };
    let status = if refusal == auth::Refusal::Forbidden { StatusCode::FORBIDDEN } else { StatusCode::UNAUTHORIZED };
    http_error(status, if status == StatusCode::FORBIDDEN { "FORBIDDEN" } else { "UNAUTHENTICATED" }, error)
}

async fn post_message(State(state): State<HttpState>, headers: HeaderMap, body: Body) -> Response {
    let principal = match state.keys.authenticate(auth::presented_key(&headers)) {
        Ok(p) => p,
        Err(r) => return refuse(&state, r),
    };
    let Some(format) = body_format(&headers) else {
        state.metrics.refused("unsupported_media_type");
        return http_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            "Content-Type must be application/json or application/x-protobuf",
        );
    };
    // At most intake.max_in_flight requests at once (the body read included); past it 429, retried by the
    // producer with the same operation id.
    let Ok(_slot) = state.intake_slots.clone().try_acquire_owned() else {
        return intake_busy(&state);
    };
    let protobuf_in = format == Format::Protobuf;
    let protobuf_out = protobuf_in || is_protobuf(&headers, header::ACCEPT);
    let span = tracing::info_span!("ingest.intake", source = "http", operation_id = tracing::field::Empty);
    let mut trace_headers = async_nats::HeaderMap::new();
    for name in ["traceparent", "tracestate"] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
            trace_headers.insert(name, v);
        }
    }
    bw_common::telemetry::set_parent_from(&span, Some(&trace_headers));
    let intake = state.intake.clone();
    let reply = async {
        let cap = state.max_intake_body_bytes;
        let oversize = || Rejection::new(RejectReason::Oversize, format!("body is over {cap} bytes"));
        // A declared length over the cap is refused unread; a body without one is cut off at the cap.
        if let Some(declared) = crate::guard::declared_length(&headers).filter(|n| *n > cap as u64) {
            return Ok(intake.reject_cut(&[], declared, Source::Http, oversize()).await);
        }
        let raw = match crate::guard::read_capped(body, cap, crate::intake::KEPT_PREFIX).await {
            Ok(b) => b,
            Err(crate::guard::ReadError::TooLarge(t)) => {
                return Ok(intake.reject_cut(&t.prefix, t.seen as u64, Source::Http, oversize()).await);
            }
            Err(crate::guard::ReadError::Failed) => {
                let r = Rejection::new(RejectReason::Undecodable, "the body could not be read whole");
                return Ok(intake.reject_cut(&[], 0, Source::Http, r).await);
            }
        };
        let decoded = if protobuf_in {
            crate::intake::decode(&raw).map(|r| (r, raw.len())).map_err(|r| (String::new(), r))
        } else {
            from_json(&raw).map(|r| {
                let len = r.encoded_len();
                (r, len)
            })
        };
        match decoded {
            Ok((request, len)) => {
                // A key narrowed to some of its tenant's numbers: checked on the registry's WABA of the number. A
                // number of another tenant (or none) is refused by the intake with its precise reason.
                if let Some(tenant) = principal.tenant()
                    && let Ok(Owner::Known { tenant: owner, waba_id, .. }) =
                        intake.registry.owner(&request.phone_number_id, &request.waba_id).await
                    && owner == tenant
                    && !principal.narrowed_to(&request.phone_number_id, &waba_id)
                {
                    tracing::info!(key = principal.name.as_deref().unwrap_or(""), phone_number_id = %request.phone_number_id, "api key not allowed for this sender");
                    return Err(auth::Refusal::Forbidden);
                }
                Ok(intake.handle(request, &raw, len, Source::Http, Caller::Key(principal.tenant()), &span).await)
            }
            Err((op, r)) => {
                let op = if bw_wire::tenancy::valid_operation_id(&op) { op } else { String::new() };
                Ok(intake.reject(&raw, Source::Http, &op, r).await)
            }
        }
    }
    .instrument(span.clone())
    .await;
    match reply {
        Ok(reply) => render(&reply, protobuf_out),
        Err(refusal) => refuse(&state, refusal),
    }
}

// ---- Status query ----

/// A time in Unix ms, in UTC and in the display zone (null when unset).
fn times(ms: i64, tz: chrono_tz::Tz) -> serde_json::Value {
    use chrono::TimeZone as _;
    if ms <= 0 {
        return serde_json::Value::Null;
    }
    match chrono::Utc.timestamp_millis_opt(ms).single() {
        Some(t) => serde_json::json!({
            "unix_ms": ms,
            "utc": t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
            "local": t.with_timezone(&tz).format("%Y-%m-%d %H:%M:%S%.3f %Z").to_string(),
        }),
        None => serde_json::json!({ "unix_ms": ms }),
    }
}

/// The JSON of one feed event.
pub(crate) fn event_json(e: &bw_proto::v1::OutcomeEvent, tz: chrono_tz::Tz) -> serde_json::Value {
    let kind = e.kind().as_str_name().trim_start_matches("OUTCOME_KIND_").to_ascii_lowercase();
    serde_json::json!({
        "revision": e.revision,
        "event": kind,
        "state": e.state().label(),
        "at": times(e.at_unix_ms, tz),
        "wamid": e.wamid,
        "meta_code": e.meta_code,
        "reason": e.reason,
        "incident_id": e.incident_id,
        "attempts": e.attempts,
        "replays": e.replays,
        "flagged_unknown": e.flagged_unknown,
    })
}

async fn get_message(
    State(state): State<HttpState>,
    axum::extract::Path(operation_id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let principal = match state.keys.authenticate(auth::presented_key(&headers)) {
        Ok(p) => p,
        Err(r) => return refuse(&state, r),
    };
    if !state.status_enabled {
        return http_error(StatusCode::NOT_FOUND, "NOT_FOUND", "status queries are disabled on this instance");
    }
    // The key's tenant scopes the id: another tenant's operation of the same id is a different key, so it is
    // answered 404 like an unknown one (its existence is not disclosed).
    let reply = crate::feed::status(&state.ledger, &state.js, principal.tenant(), &operation_id, None).await;
    if !reply.error.is_empty() && !reply.found {
        let status =
            if reply.error.contains("unavailable") { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::BAD_REQUEST };
        return http_error(status, "ERROR", &reply.error);
    }
    // An operation of a sender the key's narrowing leaves out is answered like an unknown one (no existence leak).
    let current = reply.current.as_ref().filter(|c| principal.narrowed_to(&c.phone_number_id, &c.waba_id));
    let Some(current) = current else {
        return http_error(StatusCode::NOT_FOUND, "NOT_FOUND", "no such operation for this API key");
    };
    let tz = state.display_tz;
    let journey: Vec<serde_json::Value> = reply.journey.iter().map(|e| event_json(e, tz)).collect();
    let body = serde_json::json!({
        "operation_id": reply.operation_id,
        "tenant": current.tenant,
        "state": current.state().label(),
        "event": event_json(current, tz)["event"],
        "waba_id": current.waba_id,
        "phone_number_id": current.phone_number_id,
        "category": current.category().label(),
        "wamid": current.wamid,
        "attempts": current.attempts,
        "meta_code": current.meta_code,
        "reason": current.reason,
        "incident_id": current.incident_id,
        "flagged_unknown": current.flagged_unknown,
        "replays": current.replays,
        "trace_id": current.trace_id,
        "accepted_at": times(current.accepted_at_unix_ms, tz),
        "updated_at": times(current.at_unix_ms, tz),
        "time_zone": tz.name(),
        "journey": journey,
        "journey_error": (!reply.error.is_empty()).then_some(reply.error.as_str()),
    });
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_requests_map_to_protobuf() {
        let raw = br#"{"operation_id":"op-1","waba_id":"1","phone_number_id":"2","recipient":"+5491155551234",
            "category":"transactional","text":{"body":"hi"},"labels":{"order":"A1"}}"#;
        let r = from_json(raw).expect("maps");
        assert_eq!(r.category(), Category::Transactional);
        assert!(matches!(r.payload, Some(Payload::Text(ref t)) if t.body == "hi"));
        assert_eq!(r.labels.get("order").map(String::as_str), Some("A1"));
        // A user id as the recipient, or in `user_id`; with both, the phone (Meta's `to` wins over `recipient`).
        let id = "US.13491208655302741918";
        let by_id = |body: String| from_json(body.as_bytes()).expect("maps").recipient;
        assert_eq!(by_id(format!(r#"{{"operation_id":"a","recipient":"{id}"}}"#)), id);
        assert_eq!(by_id(format!(r#"{{"operation_id":"a","user_id":"{id}"}}"#)), id);
        assert_eq!(
            by_id(format!(r#"{{"operation_id":"a","userId":"{id}","recipient":"+5491155551234"}}"#)),
            "+5491155551234"
        );
        let check_cat = |v: serde_json::Value, expect: Option<Category>| {
            assert_eq!(parse_category(&v).ok(), expect.map(|c| c as i32), "{v}");
        };
        check_cat(serde_json::json!("MARKETING"), Some(Category::Marketing));
        check_cat(serde_json::json!("CATEGORY_SUPPORT"), Some(Category::Support));
        check_cat(serde_json::json!(1), Some(Category::Authentication));
        check_cat(serde_json::json!("promo"), None);
        check_cat(serde_json::json!(true), None);
    }

    #[test]
    fn json_errors_are_precise() {
        let (_, r) = from_json(b"{").expect_err("bad json");
        assert_eq!(r.reason, RejectReason::Undecodable);
        let (_, r) = from_json(br#"{"operation_id":"a","recipent":"+1"}"#).expect_err("typo");
        assert!(r.error.contains("recipent"), "{}", r.error);
        let (op, r) = from_json(br#"{"operation_id":"a","text":{"body":"x"},"template":{"name":"t"}}"#)
            .expect_err("both payloads");
        assert_eq!((op.as_str(), r.reason), ("a", RejectReason::BadPayload));
        let (_, r) = from_json(br#"{"operation_id":"a","category":"promo"}"#).expect_err("category");
        assert_eq!(r.reason, RejectReason::UnknownCategory);
        assert!(r.error.contains("`promo`"));
    }
}
