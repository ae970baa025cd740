//! `POST /{version}/{phone_number_id}/messages`: scenario latency and faults, bearer token (190), body validation
//! (100 / 131008 / 131009 / 132001), throughput (130429) and pair (131056) limits, then acceptance: oracle,
//! status webhooks, and Meta's success body.

use crate::conn::ConnKill;
use crate::errors;
use crate::ids;
use crate::limits::Refused;
use crate::oracle::Acceptance;
use crate::scenario::FaultKind;
use crate::webhook::{StatusEvent, StatusKind};
use crate::{Inner, lock_read};
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const TYPES: &[&str] = &[
    "text",
    "image",
    "audio",
    "document",
    "video",
    "sticker",
    "location",
    "contacts",
    "interactive",
    "template",
    "reaction",
];

/// A validated send.
struct Send {
    to: String,
    wa_id: String,
    mtype: String,
    biz_opaque: Option<String>,
}

/// Usage reported in headers: percent of the throughput allowance, and minutes to regain access.
#[derive(Default, Clone, Copy)]
struct Usage {
    percent: u32,
    regain_minutes: u64,
    retry_after_secs: Option<u64>,
}

pub(crate) async fn send_message(
    State(st): State<Arc<Inner>>,
    ConnectInfo(kill): ConnectInfo<ConnKill>,
    Path((_version, phone)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let active = lock_read(&st.scenario).clone();
    let decision = active.decide(&phone);
    if !decision.latency.is_zero() && !pause(&st, decision.latency).await {
        return meta_error(&st, 2, None, None, Usage::default());
    }
    // Faults that happen in front of Meta's application logic.
    let post_fault = match decision.fault {
        Some(FaultKind::Http { status, meta_body, code, after_processing: false }) => {
            return http_fault(&st, status, meta_body, code);
        }
        Some(FaultKind::Error { code, http_status, subcode }) => {
            let status = http_status.unwrap_or_else(|| errors::http_status(code, st.cfg.throttle_http_status));
            st.oracle.count(&code.to_string());
            return error_response(status, errors::body(code, None, subcode), Usage::default(), &st);
        }
        Some(FaultKind::Hang { hold_ms, accept: false }) => {
            st.oracle.count("hang");
            pause(&st, Duration::from_millis(hold_ms)).await;
            kill.trigger();
            return StatusCode::GATEWAY_TIMEOUT.into_response();
        }
        Some(FaultKind::Reset { after_processing: false }) => {
            st.oracle.count("reset");
            kill.trigger();
            return StatusCode::BAD_GATEWAY.into_response();
        }
        other => other,
    };

    if !authorized(&st, &headers) {
        return meta_error(&st, 190, None, None, Usage::default());
    }
    let send = match validate(&st, &body) {
        Ok(s) => s,
        Err((code, details)) => {
            return meta_error(&st, code, Some(&details), None, Usage::default());
        }
    };
    let usage = match check_limits(&st, &phone, &send.wa_id) {
        Ok(u) => u,
        Err((code, usage)) => return meta_error(&st, code, None, None, usage),
    };

    let wamid = ids::wamid(&send.wa_id);
    let unacknowledged = matches!(
        post_fault,
        Some(FaultKind::Hang { .. }) | Some(FaultKind::Reset { .. }) | Some(FaultKind::Http { .. })
    );
    st.oracle.record_accept(Acceptance {
        operation_id: send.biz_opaque.as_deref(),
        phone_number_id: &phone,
        to: &send.to,
        wamid: &wamid,
        message_type: &send.mtype,
        unacknowledged,
    });
    let fail_code = match post_fault {
        Some(FaultKind::AsyncFailure { code }) => Some(code),
        _ => None,
    };
    st.webhooks.message_accepted(
        StatusEvent {
            phone_number_id: phone.clone(),
            kind: StatusKind::Sent,
            wamid: wamid.clone(),
            recipient_id: send.wa_id.clone(),
            biz_opaque_callback_data: send.biz_opaque.clone(),
            category: if send.mtype == "template" {
                st.webhooks.config().template_category.clone()
            } else {
                "service".to_string()
            },
            conversation_id: ids::hex_id(16),
            timestamp: ids::now_ms() / 1000,
        },
        fail_code,
    );

    match post_fault {
        Some(FaultKind::Hang { hold_ms, .. }) => {
            st.oracle.count("hang");
            pause(&st, Duration::from_millis(hold_ms)).await;
            kill.trigger();
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Some(FaultKind::Reset { .. }) => {
            st.oracle.count("reset");
            kill.trigger();
            StatusCode::BAD_GATEWAY.into_response()
        }
        Some(FaultKind::Http { status, meta_body, code, .. }) => http_fault(&st, status, meta_body, code),
        _ => {
            st.oracle.count("200");
            let mut message = json!({ "id": wamid });
            if send.mtype == "template" {
                message["message_status"] = json!("accepted");
            }
            let body = json!({
                "messaging_product": "whatsapp",
                "contacts": [{ "input": send.to, "wa_id": send.wa_id }],
                "messages": [message],
            });
            with_usage(&st, (StatusCode::OK, axum::Json(body)).into_response(), usage)
        }
    }
}

/// Sleeps unless the simulator shuts down first (false then).
async fn pause(st: &Inner, d: Duration) -> bool {
    tokio::select! {
        _ = st.shutdown.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

fn authorized(st: &Inner, headers: &HeaderMap) -> bool {
    let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
    else {
        return false;
    };
    if token.is_empty() {
        return false;
    }
    st.cfg.access_tokens.is_empty() || st.cfg.access_tokens.iter().any(|t| t == token)
}

fn check_limits(st: &Inner, phone: &str, wa_id: &str) -> Result<Usage, (i64, Usage)> {
    let limits = *lock_read(&st.limits);
    if !limits.enabled {
        return Ok(Usage::default());
    }
    let mps = st.cfg.phone_numbers.get(phone).and_then(|p| p.throughput_mps).unwrap_or(limits.throughput_mps);
    let refused = |wait: Duration, percent| Usage {
        percent,
        regain_minutes: wait.as_secs().div_ceil(60).max(1),
        retry_after_secs: Some(wait.as_millis().div_ceil(1000).max(1) as u64),
    };
    let percent = match st.limiter.throughput(phone, mps, limits.throughput_burst) {
        Ok(p) => p,
        Err(Refused { wait }) => return Err((130429, refused(wait, 100))),
    };
    if limits.pair_enabled
        && let Err(Refused { wait }) = st.limiter.pair(phone, wa_id, &limits)
    {
        return Err((131056, refused(wait, percent)));
    }
    Ok(Usage { percent, ..Usage::default() })
}

fn validate(st: &Inner, raw: &[u8]) -> Result<Send, (i64, String)> {
    let invalid = |code: i64, d: &str| Err((code, d.to_string()));
    let Ok(body) = serde_json::from_slice::<Value>(raw) else {
        return invalid(100, "Request body is not valid JSON.");
    };
    if !body.is_object() {
        return invalid(100, "Request body must be a JSON object.");
    }
    match body.get("messaging_product").and_then(Value::as_str) {
        None => return invalid(100, "The parameter messaging_product is required."),
        Some("whatsapp") => {}
        Some(_) => return invalid(100, "Param messaging_product must be one of {WHATSAPP}."),
    }
    match body.get("recipient_type").map(|v| v.as_str()) {
        None | Some(Some("individual")) | Some(Some("group")) => {}
        _ => {
            return invalid(100, "Param recipient_type must be one of {INDIVIDUAL, GROUP}.");
        }
    }
    let to = match body.get("to").and_then(Value::as_str) {
        Some(t) if !t.trim().is_empty() => t.to_string(),
        _ => return invalid(100, "The parameter to is required."),
    };
    let wa_id = ids::wa_id(&to);
    let allowed = to.chars().all(|c| c.is_ascii_digit() || " +-()".contains(c));
    if !allowed || !(7..=15).contains(&wa_id.len()) {
        return invalid(131009, "Parameter 'to' is not a valid phone number.");
    }
    let mtype = match body.get("type") {
        None => "text".to_string(),
        Some(Value::String(t)) if TYPES.contains(&t.as_str()) => t.clone(),
        Some(_) => {
            return invalid(
                100,
                "Param type must be one of {TEXT, IMAGE, AUDIO, DOCUMENT, VIDEO, STICKER, LOCATION, CONTACTS, INTERACTIVE, TEMPLATE, REACTION}.",
            );
        }
    };
    let biz_opaque = match body.get("biz_opaque_callback_data") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.chars().count() <= 512 => Some(s.clone()),
        Some(Value::String(_)) => {
            return invalid(100, "Param biz_opaque_callback_data must be at most 512 characters long.");
        }
        Some(_) => return invalid(100, "Param biz_opaque_callback_data must be a string."),
    };
    let Some(nested) = body.get(&mtype).filter(|v| v.is_object() || (mtype == "contacts" && v.is_array())) else {
        return invalid(131008, &format!("Parameter '{mtype}' is required."));
    };
    match mtype.as_str() {
        "text" => match nested.get("body") {
            Some(Value::String(b)) if b.chars().count() > 4096 => {
                return invalid(100, "Param text['body'] must be at most 4096 characters long.");
            }
            Some(Value::String(b)) if !b.is_empty() => {}
            _ => return invalid(100, "The parameter text['body'] is required."),
        },
        "template" => validate_template(st, nested)?,
        "image" | "audio" | "document" | "video" | "sticker"
            if nested.get("id").and_then(Value::as_str).is_none()
                && nested.get("link").and_then(Value::as_str).is_none() =>
        {
            return invalid(131008, &format!("Parameter '{mtype}.link' or '{mtype}.id' is required."));
        }
        _ => {}
    }
    Ok(Send { to, wa_id, mtype, biz_opaque })
}

fn validate_template(st: &Inner, t: &Value) -> Result<(), (i64, String)> {
    let invalid = |code: i64, d: String| Err((code, d));
    let Some(name) = t.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
        return invalid(131008, "Parameter 'template.name' is required.".into());
    };
    let Some(lang) = t.get("language").and_then(|l| l.get("code")).and_then(Value::as_str).filter(|c| !c.is_empty())
    else {
        return invalid(131008, "Parameter 'template.language.code' is required.".into());
    };
    if let Some(components) = t.get("components") {
        let Some(list) = components.as_array() else {
            return invalid(131009, "Parameter 'template.components' must be an array.".into());
        };
        for c in list {
            let ok_type = c
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|ty| ["header", "body", "button", "footer"].contains(&ty));
            let ok_params = c.get("parameters").is_none_or(Value::is_array);
            if !ok_type || !ok_params {
                return invalid(131009, "Parameter 'template.components' has an invalid component.".into());
            }
        }
    }
    if !st.cfg.known_templates.is_empty() && !st.cfg.known_templates.iter().any(|k| k == name) {
        return invalid(132001, format!("template name ({name}) does not exist in {lang}"));
    }
    Ok(())
}

fn http_fault(st: &Inner, status: u16, meta_body: bool, code: Option<i64>) -> Response {
    let status_code = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    if meta_body {
        let code = code.unwrap_or_else(|| errors::default_code_for_status(status));
        st.oracle.count(&code.to_string());
        return error_response(status, errors::body(code, None, None), Usage::default(), st);
    }
    st.oracle.count(&format!("http_{status}"));
    let text = format!("{} {}", status, status_code.canonical_reason().unwrap_or("Error"));
    (status_code, [(header::CONTENT_TYPE, "text/html")], format!("<html><body><h1>{text}</h1></body></html>"))
        .into_response()
}

fn meta_error(st: &Inner, code: i64, details: Option<&str>, subcode: Option<i64>, usage: Usage) -> Response {
    st.oracle.count(&code.to_string());
    let status = errors::http_status(code, st.cfg.throttle_http_status);
    error_response(status, errors::body(code, details, subcode), usage, st)
}

fn error_response(status: u16, body: Value, usage: Usage, st: &Inner) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = with_usage(st, (status, axum::Json(body)).into_response(), usage);
    // Graph answers errors with this header too.
    resp.headers_mut()
        .insert("www-authenticate", HeaderValue::from_static("OAuth \"Facebook Platform\" \"invalid_request\""));
    resp
}

fn with_usage(st: &Inner, mut resp: Response, usage: Usage) -> Response {
    if st.cfg.usage_headers {
        let p = usage.percent;
        let buc = json!({ st.cfg.waba_id.clone(): [{
            "type": "whatsapp",
            "call_count": p,
            "total_cputime": p.min(100) / 2,
            "total_time": p,
            "estimated_time_to_regain_access": usage.regain_minutes,
        }]});
        let app = json!({ "call_count": p, "total_time": p, "total_cputime": p / 2 });
        if let Ok(v) = HeaderValue::from_str(&buc.to_string()) {
            resp.headers_mut().insert("x-business-use-case-usage", v);
        }
        if let Ok(v) = HeaderValue::from_str(&app.to_string()) {
            resp.headers_mut().insert("x-app-usage", v);
        }
    }
    if st.cfg.retry_after
        && let Some(secs) = usage.retry_after_secs
    {
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// Anything else under the Graph root: Graph's unsupported-request error.
pub(crate) async fn fallback() -> Response {
    let body = json!({ "error": {
        "message": "Unsupported post request. Object does not exist, cannot be loaded due to missing permissions, or does not support this operation.",
        "type": "GraphMethodException",
        "code": 100,
        "error_subcode": 33,
        "fbtrace_id": ids::fbtrace_id(),
    }});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}
