//! `POST /{version}/{phone_number_id}/messages`: scenario latency and front-door faults, bearer token (190, or
//! 190/0 for a token expired by a scenario or the admin API), app (4) and WABA (80007/80008) call budgets, body
//! validation (100 / 131008 / 131009 / 132001), throughput (130429) and pair (131056) limits, then acceptance:
//! oracle, status webhooks, and Meta's success body, or an ambiguous answer after acceptance (reset, hang,
//! bodiless 5xx, unparseable 200).

use crate::conn::ConnKill;
use crate::errors;
use crate::ids;
use crate::limits::{Limits, Refused, RetryAfter};
use crate::oracle::{Acceptance, Source};
use crate::scenario::{Active, FaultKind, Garbled, Page};
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

/// Usage reported in headers: percent of the allowance in use, minutes to regain access, and the wait a
/// Retry-After would announce.
#[derive(Default, Clone, Copy)]
struct Usage {
    percent: u32,
    app_percent: Option<u32>,
    regain_minutes: u64,
    retry_after: Option<Duration>,
}

impl Usage {
    fn refused(wait: Duration, percent: u32) -> Usage {
        Usage {
            percent,
            app_percent: None,
            regain_minutes: wait.as_secs().div_ceil(60).max(1),
            retry_after: Some(wait),
        }
    }
}

/// A refusal with its code and cause.
struct Refusal {
    code: i64,
    source: Source,
    body: Option<Value>,
    usage: Usage,
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
    let limits = active.scenario.limits.clone().unwrap_or_else(|| lock_read(&st.limits).clone());
    let retry_mode = retry_mode(&st, &limits);
    if !decision.latency.is_zero() && !pause(&st, decision.latency).await {
        return meta_error(&st, Refusal::injected(2), &phone, retry_mode);
    }
    // Faults in front of Meta's application logic: nothing is accepted.
    let post_fault = match decision.fault {
        Some(fault) if !fault.accepts() => {
            let retry_after = active.scenario.retry_after_s;
            return front_fault(&st, fault, &kill, &phone, retry_mode, retry_after).await;
        }
        other => other,
    };
    let answer = match check(&st, &active, &limits, &headers, &body, &phone) {
        Ok(ok) => ok,
        Err(refusal) => return meta_error(&st, refusal, &phone, retry_mode),
    };
    let (send, usage) = answer;

    let wamid = ids::wamid(&send.wa_id);
    let unacknowledged = post_fault.as_ref().is_some_and(FaultKind::hides_acceptance);
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
    st.webhooks.message_accepted_with(
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
        decision.status_delay,
        decision.drop_statuses,
    );

    let mut message = json!({ "id": wamid });
    if send.mtype == "template" {
        message["message_status"] = json!("accepted");
    }
    let success = json!({
        "messaging_product": "whatsapp",
        "contacts": [{ "input": send.to, "wa_id": send.wa_id }],
        "messages": [message],
    });
    match post_fault {
        Some(FaultKind::Hang { hold_ms, .. }) => {
            st.oracle.count_as("hang", Source::Injected);
            pause(&st, Duration::from_millis(hold_ms)).await;
            kill.trigger();
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Some(FaultKind::Reset { .. }) => {
            st.oracle.count_as("reset", Source::Injected);
            kill.trigger();
            StatusCode::BAD_GATEWAY.into_response()
        }
        Some(FaultKind::Http { status, meta_body, code, .. }) => http_fault(&st, status, meta_body, code, Page::Html),
        Some(FaultKind::Bodiless { status, page, .. }) => http_fault(&st, status, false, None, page),
        Some(FaultKind::OkUnparseable { body }) => {
            st.oracle.count_as("200_unparseable", Source::Injected);
            garbled_ok(&success, body)
        }
        _ => {
            st.oracle.count("200");
            with_usage(&st, (StatusCode::OK, axum::Json(success)).into_response(), usage, &phone, RetryAfter::None)
        }
    }
}

impl Refusal {
    fn injected(code: i64) -> Refusal {
        Refusal { code, source: Source::Injected, body: None, usage: Usage::default() }
    }

    fn request(code: i64, details: &str) -> Refusal {
        Refusal {
            code,
            source: Source::Request,
            body: Some(errors::body(code, Some(details), None)),
            usage: Usage::default(),
        }
    }

    fn limit(code: i64, usage: Usage) -> Refusal {
        Refusal { code, source: Source::Limit, body: None, usage }
    }
}

/// Meta's checks in Graph's order: token, app and WABA call budgets, the request body, then the number's
/// throughput and the pair limit. Ok(the validated send and the usage to report).
fn check(
    st: &Inner,
    active: &Active,
    limits: &Limits,
    headers: &HeaderMap,
    body: &[u8],
    phone: &str,
) -> Result<(Send, Usage), Refusal> {
    authorize(st, active, headers)?;
    let app_percent = call_budgets(st, limits, phone)?;
    let send = validate(st, body).map_err(|(code, details)| Refusal::request(code, &details))?;
    let mut usage = message_limits(st, limits, phone, &send.wa_id)?;
    usage.app_percent = app_percent;
    Ok((send, usage))
}

/// A front-door fault: the request never reaches Meta's application logic.
async fn front_fault(
    st: &Inner,
    fault: FaultKind,
    kill: &ConnKill,
    phone: &str,
    mode: RetryAfter,
    retry_after_s: Option<u64>,
) -> Response {
    match fault {
        FaultKind::Http { status, meta_body, code, .. } => http_fault(st, status, meta_body, code, Page::Html),
        FaultKind::Bodiless { status, page, .. } => http_fault(st, status, false, None, page),
        FaultKind::Error { code, http_status, subcode } => {
            let status = http_status.unwrap_or_else(|| errors::http_status(code, st.cfg.throttle_http_status));
            st.oracle.count_as(&code.to_string(), Source::Injected);
            let retry_after_s = retry_after_s.filter(|_| errors::info(code).throttle);
            let usage = Usage { retry_after: retry_after_s.map(Duration::from_secs), ..Usage::default() };
            let mode = if retry_after_s.is_some() && mode == RetryAfter::None { RetryAfter::Seconds } else { mode };
            error_response(st, status, errors::body(code, None, subcode), usage, phone, mode)
        }
        FaultKind::Hang { hold_ms, .. } => {
            st.oracle.count_as("hang", Source::Injected);
            pause(st, Duration::from_millis(hold_ms)).await;
            kill.trigger();
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        FaultKind::Reset { .. } => {
            st.oracle.count_as("reset", Source::Injected);
            kill.trigger();
            StatusCode::BAD_GATEWAY.into_response()
        }
        // Faults that accept are not front-door faults; answer as Meta's overload to stay safe.
        FaultKind::AsyncFailure { .. } | FaultKind::OkUnparseable { .. } => {
            meta_error(st, Refusal::injected(2), phone, mode)
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

/// Bearer token: missing or unknown → 190 "cannot parse"; known but expired or revoked (admin call or scenario
/// token event) → 190 "session has expired" (or 0), on every number.
fn authorize(st: &Inner, active: &Active, headers: &HeaderMap) -> Result<(), Refusal> {
    let invalid = || Refusal { code: 190, source: Source::Request, body: None, usage: Usage::default() };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(invalid)?;
    if !(st.cfg.access_tokens.is_empty() || st.cfg.access_tokens.iter().any(|t| t == token)) {
        return Err(invalid());
    }
    let dead = st.token_state(token).or_else(|| active.token_fault(token));
    match dead {
        Some(code) => Err(Refusal {
            code,
            source: Source::Injected,
            body: Some(errors::dead_token_body(code)),
            usage: Usage::default(),
        }),
        None => Ok(()),
    }
}

/// App (code 4) and WABA (80007/80008) call budgets; every authenticated call counts. Ok(app percent in use).
fn call_budgets(st: &Inner, limits: &Limits, phone: &str) -> Result<Option<u32>, Refusal> {
    if !limits.enabled {
        return Ok(None);
    }
    let mut app_percent = None;
    if let Some(calls) = limits.app_calls {
        match st.limiter.app_call(calls, limits.app_window_ms) {
            Ok(p) => app_percent = Some(p),
            Err(Refused { wait }) => {
                let usage = Usage { app_percent: Some(100), ..Usage::refused(wait, 100) };
                return Err(Refusal::limit(4, usage));
            }
        }
    }
    if let Some(calls) = limits.waba_calls
        && let Err(Refused { wait }) = st.limiter.waba_call(st.cfg.waba_of(phone), calls, limits.waba_window_ms)
    {
        return Err(Refusal::limit(limits.waba_code, Usage::refused(wait, 100)));
    }
    Ok(app_percent)
}

/// The number's throughput (130429) and the pair limit (131056); only messages Meta accepts count.
fn message_limits(st: &Inner, limits: &Limits, phone: &str, wa_id: &str) -> Result<Usage, Refusal> {
    if !limits.enabled {
        return Ok(Usage::default());
    }
    let mps = limits.mps_for(phone, st.cfg.phone_numbers.get(phone).and_then(|p| p.throughput_mps));
    let throttled = |wait| Refusal::limit(130429, Usage::refused(wait, 100));
    // Check the throughput first so a message the pair limit refuses takes nothing from it, and vice versa.
    st.limiter.throughput_check(phone, mps, limits.throughput_burst).map_err(|Refused { wait }| throttled(wait))?;
    if limits.pair_enabled
        && let Err(Refused { wait }) = st.limiter.pair(phone, wa_id, limits)
    {
        return Err(Refusal::limit(131056, Usage::refused(wait, 0)));
    }
    let percent =
        st.limiter.throughput(phone, mps, limits.throughput_burst).map_err(|Refused { wait }| throttled(wait))?;
    Ok(Usage { percent, ..Usage::default() })
}

fn retry_mode(st: &Inner, limits: &Limits) -> RetryAfter {
    match limits.retry_after {
        RetryAfter::None if st.cfg.retry_after => RetryAfter::Seconds,
        mode => mode,
    }
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

fn http_fault(st: &Inner, status: u16, meta_body: bool, code: Option<i64>, page: Page) -> Response {
    let status_code = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    if meta_body {
        let code = code.unwrap_or_else(|| errors::default_code_for_status(status));
        st.oracle.count_as(&code.to_string(), Source::Injected);
        return error_response(st, status, errors::body(code, None, None), Usage::default(), "", RetryAfter::None);
    }
    st.oracle.count_as(&format!("http_{status}"), Source::Injected);
    let text = format!("{} {}", status, status_code.canonical_reason().unwrap_or("Error"));
    match page {
        Page::Html => {
            (status_code, [(header::CONTENT_TYPE, "text/html")], format!("<html><body><h1>{text}</h1></body></html>"))
                .into_response()
        }
        Page::Plain => (status_code, [(header::CONTENT_TYPE, "text/plain")], text).into_response(),
        Page::Empty => status_code.into_response(),
    }
}

/// A 200 whose body no JSON parser reads.
fn garbled_ok(success: &Value, body: Garbled) -> Response {
    match body {
        Garbled::Truncated => {
            let full = success.to_string();
            let cut = full.len() / 2;
            let text = full.get(..cut).unwrap_or("{").to_string();
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], text).into_response()
        }
        Garbled::Empty => (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], "").into_response(),
        Garbled::Html => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body>Please wait while we process your request.</body></html>",
        )
            .into_response(),
    }
}

fn meta_error(st: &Inner, r: Refusal, phone: &str, mode: RetryAfter) -> Response {
    st.oracle.count_as(&r.code.to_string(), r.source);
    if r.source == Source::Limit {
        st.oracle.record_limit(&r.code.to_string(), phone);
    }
    let status = errors::http_status(r.code, st.cfg.throttle_http_status);
    let body = r.body.unwrap_or_else(|| errors::body(r.code, None, None));
    error_response(st, status, body, r.usage, phone, mode)
}

fn error_response(st: &Inner, status: u16, body: Value, usage: Usage, phone: &str, mode: RetryAfter) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = with_usage(st, (status, axum::Json(body)).into_response(), usage, phone, mode);
    // Graph answers errors with this header too.
    resp.headers_mut()
        .insert("www-authenticate", HeaderValue::from_static("OAuth \"Facebook Platform\" \"invalid_request\""));
    resp
}

fn with_usage(st: &Inner, mut resp: Response, usage: Usage, phone: &str, mode: RetryAfter) -> Response {
    if st.cfg.usage_headers {
        let p = usage.percent;
        let waba = if phone.is_empty() { st.cfg.waba_id.as_str() } else { st.cfg.waba_of(phone) };
        let buc = json!({ waba: [{
            "type": "whatsapp",
            "call_count": p,
            "total_cputime": p.min(100) / 2,
            "total_time": p,
            "estimated_time_to_regain_access": usage.regain_minutes,
        }]});
        let a = usage.app_percent.unwrap_or(p);
        let app = json!({ "call_count": a, "total_time": a, "total_cputime": a / 2 });
        if let Ok(v) = HeaderValue::from_str(&buc.to_string()) {
            resp.headers_mut().insert("x-business-use-case-usage", v);
        }
        if let Ok(v) = HeaderValue::from_str(&app.to_string()) {
            resp.headers_mut().insert("x-app-usage", v);
        }
    }
    if let Some(wait) = usage.retry_after {
        let secs = wait.as_millis().div_ceil(1000).max(1) as u64;
        let value = match mode {
            RetryAfter::None => None,
            RetryAfter::Seconds => Some(HeaderValue::from(secs)),
            RetryAfter::HttpDate => {
                let at = std::time::SystemTime::now() + Duration::from_secs(secs);
                HeaderValue::from_str(&http_date(at)).ok()
            }
        };
        if let Some(v) = value {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    resp
}

/// IMF-fixdate (RFC 9110 §5.6.7): `Tue, 01 Dec 2026 10:00:07 GMT`.
pub(crate) fn http_date(at: std::time::SystemTime) -> String {
    let secs = at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let (h, m, s) = ((secs % 86_400) / 3600, (secs % 3600) / 60, secs % 60);
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let weekday = WEEKDAYS[days.rem_euclid(7) as usize];
    let month_name = MONTHS[(month - 1) as usize];
    format!("{weekday}, {day:02} {month_name} {year} {h:02}:{m:02}:{s:02} GMT")
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

#[cfg(test)]
mod tests {
    use super::http_date;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn http_date_is_imf_fixdate() {
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
        // 2026-12-01 10:00:07 UTC.
        assert_eq!(http_date(UNIX_EPOCH + Duration::from_secs(1_796_119_207)), "Tue, 01 Dec 2026 10:00:07 GMT");
        assert_eq!(http_date(UNIX_EPOCH + Duration::from_secs(951_782_400)), "Tue, 29 Feb 2000 00:00:00 GMT");
    }
}
