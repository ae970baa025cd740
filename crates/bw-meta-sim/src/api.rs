//! `POST /{version}/{phone_number_id}/messages`, in Graph's order: the version in the path (an expired one is
//! served by the oldest usable version, a non-version is an unknown object), scenario latency and front-door
//! faults, bearer token (190, or 190/0 for a token expired by a scenario or the admin API), targeted sync
//! injections, app (4) and WABA (80007/80008) call budgets, body validation (100 / 131008 / 131009 / 132001,
//! `to` or a user-id `recipient`), the announced account state (ban 131031, maintenance 131057, restriction
//! 368, template 132015/132016/132001, user-id sends of OTP templates 131062), the portfolio messaging limit
//! when it fails synchronously, throughput (130429) and pair (131056) limits, then acceptance: oracle, status
//! webhooks (or a `failed` status: async injection or fault, `fail_recipients`, stopped marketing 131050,
//! marketing to a US number, 131047 outside the window when enforced, the portfolio limit), and Meta's success
//! body, or an ambiguous answer after acceptance (reset, hang, bodiless 5xx, unparseable 200).

use crate::account::SendClass;
use crate::config::OtpType;
use crate::conn::ConnKill;
use crate::errors;
use crate::ids;
use crate::inject::{Call, Mode};
use crate::limits::{Limits, Refused, RetryAfter};
use crate::oracle::{Acceptance, FailedMessage, FailureCause, Source};
use crate::request::{Send, validate};
use crate::scenario::{Active, FaultKind, Garbled, Page, Picked};
use crate::state::{Inner, lock_read};
use crate::versions::{self, Served};
use crate::webhook::{Failure, StatusEvent, StatusKind};
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

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
    /// Instead of the catalog status.
    http_status: Option<u16>,
    /// Retry-After even when the configuration sends none (a scenario's `retry_after_s`).
    force_retry_after: bool,
}

pub(crate) async fn send_message(
    State(st): State<Arc<Inner>>,
    ConnectInfo(kill): ConnectInfo<ConnKill>,
    Path((version, phone)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // Graph resolves the path first: a segment that is no version names an object that does not exist.
    let served = match versions::resolve(&version, versions::today(st.cfg.api_date.as_deref())) {
        Served::Unknown => {
            st.oracle.count_version("unknown");
            return fallback().await;
        }
        Served::AsAsked(v) => {
            st.oracle.count_version(&v);
            v
        }
        Served::Remapped { asked, served } => {
            st.oracle.count_version(&format!("{asked}->{served}"));
            served
        }
    };
    let mut resp = handle(&st, &kill, &phone, &headers, &body).await;
    if let Ok(v) = HeaderValue::from_str(&served) {
        resp.headers_mut().insert("facebook-api-version", v);
    }
    resp
}

async fn handle(st: &Arc<Inner>, kill: &ConnKill, phone: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    let active = lock_read(&st.scenario).clone();
    let decision = active.decide(phone);
    let limits = active.scenario.limits.clone().unwrap_or_else(|| lock_read(&st.limits).clone());
    let retry_mode = retry_mode(st, &limits);
    if !decision.latency.is_zero() && !pause(st, decision.latency).await {
        return meta_error(st, Refusal::injected(2), phone, retry_mode);
    }
    // Faults in front of Meta's application logic: nothing is accepted.
    let post_fault = match decision.fault {
        Some(fault) if !fault.accepts() => {
            let retry_after = active.scenario.retry_after_s;
            return front_fault(st, fault, kill, phone, retry_mode, retry_after).await;
        }
        other => other,
    };
    let parsed = serde_json::from_slice::<Value>(body);
    let (send, usage, async_pick) = match check(st, &active, &limits, headers, parsed, phone) {
        Ok(ok) => ok,
        Err(refusal) => return meta_error(st, refusal, phone, retry_mode),
    };

    let wamid = ids::wamid(send.wa_id.as_deref().unwrap_or_default());
    let unacknowledged = post_fault.as_ref().is_some_and(FaultKind::hides_acceptance);
    let oracle_to = send.wa_id.as_ref().map_or_else(|| send.input.clone(), |w| format!("+{w}"));
    st.oracle.record_accept(Acceptance {
        operation_id: send.biz_opaque.as_deref(),
        phone_number_id: phone,
        to: &oracle_to,
        wamid: &wamid,
        message_type: &send.mtype,
        unacknowledged,
    });
    let fault_code = match post_fault {
        Some(FaultKind::AsyncFailure { code }) => Some(code),
        _ => None,
    };
    let category = status_category(st, &send);
    let failure = later_failure(st, phone, &send, async_pick, fault_code, &category);
    if let Some((f, cause, injection)) = &failure {
        st.oracle.record_failure(FailedMessage {
            operation_id: send.biz_opaque.clone(),
            wamid: wamid.clone(),
            phone_number_id: phone.to_string(),
            code: f.code,
            cause: *cause,
            injection: injection.clone(),
        });
    }
    let (user_id, username, phone_shared) = match &send.user {
        Some(u) => (Some(u.user_id.clone()), u.username.clone(), u.share_phone),
        None => (None, None, true),
    };
    // A paced template holds the message: no status until a release or a pause (reference §3.5).
    let held = failure.is_none()
        && send.template.as_ref().is_some_and(|(n, l)| st.account.template(n, l).is_some_and(|t| t.paced));
    let status = StatusEvent {
        phone_number_id: phone.to_string(),
        kind: StatusKind::Sent,
        wamid: wamid.clone(),
        recipient_id: send.wa_id.clone().unwrap_or_default(),
        biz_opaque_callback_data: send.biz_opaque.clone(),
        category,
        conversation_id: ids::hex_id(16),
        timestamp: ids::now_ms() / 1000,
        recipient_user_id: user_id,
        phone_shared,
        username,
        by_user_id: send.by_user_id,
        fail_details: None,
    };
    if let (true, Some((name, lang))) = (held, &send.template) {
        st.oracle.count_held();
        st.account.hold(name, lang, status);
    } else {
        st.webhooks.message_accepted_failing(
            status,
            failure.map(|(f, _, _)| f),
            decision.status_delay,
            decision.drop_statuses,
        );
    }

    let mut message = json!({ "id": wamid });
    if send.mtype == "template" {
        message["message_status"] = json!(if held { "held_for_quality_assessment" } else { "accepted" });
    }
    let contact = if send.by_user_id {
        json!({ "input": send.input, "user_id": send.input })
    } else {
        json!({ "input": send.input, "wa_id": send.wa_id.clone().unwrap_or_default() })
    };
    let success = json!({
        "messaging_product": "whatsapp",
        "contacts": [contact],
        "messages": [message],
    });
    match post_fault {
        Some(FaultKind::Hang { hold_ms, .. }) => {
            st.oracle.count_as("hang", Source::Injected);
            pause(st, Duration::from_millis(hold_ms)).await;
            kill.trigger();
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Some(FaultKind::Reset { .. }) => {
            st.oracle.count_as("reset", Source::Injected);
            kill.trigger();
            StatusCode::BAD_GATEWAY.into_response()
        }
        Some(FaultKind::Http { status, meta_body, code, .. }) => http_fault(st, status, meta_body, code, Page::Html),
        Some(FaultKind::Bodiless { status, page, .. }) => http_fault(st, status, false, None, page),
        Some(FaultKind::OkUnparseable { body }) => {
            st.oracle.count_as("200_unparseable", Source::Injected);
            garbled_ok(&success, body)
        }
        _ => {
            if !st.answer_when_released(phone).await {
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            }
            st.oracle.count("200");
            with_usage(st, (StatusCode::OK, axum::Json(success)).into_response(), usage, phone, RetryAfter::None)
        }
    }
}

/// The pricing category statuses report: the template's (state or configuration), else `service`.
fn status_category(st: &Inner, send: &Send) -> String {
    match &send.template {
        Some((name, lang)) => match st.account.template(name, lang) {
            Some(t) => t.category.to_ascii_lowercase(),
            None => st.webhooks.config().template_category.clone(),
        },
        None => "service".to_string(),
    }
}

/// Whether and how an accepted message fails later, with the cause and the injection's name. The portfolio
/// limit is checked (and the user counted) only for a message nothing else fails: Meta counts users it
/// delivers to.
fn later_failure(
    st: &Inner,
    phone: &str,
    send: &Send,
    pick: Option<Picked>,
    fault_code: Option<i64>,
    category: &str,
) -> Option<(Failure, FailureCause, Option<String>)> {
    if let Some(p) = pick {
        let inj = p.injection;
        let f = Failure { code: inj.code, delay_ms: inj.delay_ms, after_sent: inj.after_sent, details: inj.details };
        return Some((f, FailureCause::Injected, Some(p.name)));
    }
    if let Some(code) = fault_code {
        return Some((Failure::code(code), FailureCause::Injected, None));
    }
    if let Some(code) = send.wa_id.as_deref().and_then(|w| st.webhooks.configured_failure(w)) {
        return Some((Failure::code(code), FailureCause::Configured, None));
    }
    let now = ids::now_ms();
    let key = send.user_key();
    let waba = st.cfg.waba_of(phone);
    let marketing = send.template.is_some() && category == "marketing";
    if marketing && st.account.marketing_stopped(waba, key) {
        return Some((Failure::code(131_050), FailureCause::Account, None));
    }
    if marketing && st.cfg.us_marketing_code > 0 && send.wa_id.as_deref().is_some_and(ids::is_us_number) {
        return Some((Failure::code(st.cfg.us_marketing_code), FailureCause::Account, None));
    }
    let in_window = st.account.in_window(phone, key, now);
    if st.cfg.enforce_service_window && send.template.is_none() && !in_window {
        return Some((Failure::code(131_047), FailureCause::Account, None));
    }
    // Only templates count toward the portfolio's limit: a free-form message is possible only inside a service
    // window (refused with 131047 outside one when `enforce_service_window`; otherwise taken as inside one), and
    // replies inside a window do not count (reference §3.3).
    if st.cfg.messaging_limit.mode == Mode::Async && !in_window && send.template.is_some() {
        let portfolio = st.cfg.portfolio_of(phone);
        if st.account.reach(portfolio, key, now, st.cfg.messaging_limit.window_ms).is_err() {
            st.oracle.count_portfolio_limited(portfolio);
            return Some((Failure::code(st.cfg.messaging_limit.code), FailureCause::Limit, None));
        }
    }
    None
}

impl Refusal {
    fn injected(code: i64) -> Refusal {
        Refusal::new(code, Source::Injected, None, Usage::default())
    }

    fn new(code: i64, source: Source, body: Option<Value>, usage: Usage) -> Refusal {
        Refusal { code, source, body, usage, http_status: None, force_retry_after: false }
    }

    fn request(code: i64, details: &str) -> Refusal {
        Refusal::new(code, Source::Request, Some(errors::body(code, Some(details), None)), Usage::default())
    }

    fn limit(code: i64, usage: Usage) -> Refusal {
        Refusal::new(code, Source::Limit, None, usage)
    }

    /// The answer of a sync injection: its code with the scenario's overrides and the reference's hints.
    fn injection(st: &Inner, active: &Active, pick: &Picked) -> Refusal {
        let inj = &pick.injection;
        let info = errors::info(inj.code);
        let body = errors::body_with(
            inj.code,
            &errors::Overrides {
                details: inj.details.as_deref(),
                subcode: inj.subcode,
                user_title: inj.user_title.as_deref(),
                user_msg: inj.user_msg.as_deref(),
            },
        );
        let body = if inj.code == 190 && inj.details.is_none() { errors::dead_token_body(190) } else { body };
        let mut usage = Usage::default();
        if info.throttle || [4, 17, 32, 613, 80007, 80008].contains(&inj.code) {
            // A throttle answer shows the budget used up: X-App-Usage for the app limit, and the WABA's
            // X-Business-Use-Case-Usage entry with estimated_time_to_regain_access (minutes) for 80007/80008.
            usage.percent = 100;
            if [4, 17, 32, 613].contains(&inj.code) {
                usage.app_percent = Some(100);
            }
            usage.regain_minutes = inj.regain_minutes.unwrap_or_else(|| remaining_minutes(active, inj));
        } else if let Some(m) = inj.regain_minutes {
            usage.regain_minutes = m;
        }
        let retry_after_s = inj.retry_after_s.or_else(|| active.scenario.retry_after_s.filter(|_| info.throttle));
        usage.retry_after = retry_after_s.map(Duration::from_secs);
        st.oracle.count_injection(&pick.name);
        Refusal {
            code: inj.code,
            source: Source::Injected,
            body: Some(body),
            usage,
            http_status: inj.http_status,
            force_retry_after: retry_after_s.is_some(),
        }
    }
}

/// Minutes until an injection's span ends (at least 1; 60 for an open-ended one).
fn remaining_minutes(active: &Active, inj: &crate::inject::Injection) -> u64 {
    match inj.duration_ms {
        Some(len) => inj.start_ms.saturating_add(len).saturating_sub(active.elapsed_ms()).div_ceil(60_000).max(1),
        None => 60,
    }
}

/// Meta's checks in Graph's order: token, targeted sync injections, app and WABA call budgets, the request
/// body, the announced account state, the portfolio limit (sync mode), then the number's throughput and the
/// pair limit. Ok(the validated send, the usage to report, an async injection picked for it).
fn check(
    st: &Inner,
    active: &Active,
    limits: &Limits,
    headers: &HeaderMap,
    parsed: Result<Value, serde_json::Error>,
    phone: &str,
) -> Result<(Send, Usage, Option<Picked>), Refusal> {
    let token = authorize(st, active, headers)?;
    let mut async_pick = None;
    if active.has_injections() {
        let body = parsed.as_ref().ok();
        if let Some(pick) = pick_injection(st, active, body, &token, phone) {
            if !pick.injection.is_async() {
                return Err(Refusal::injection(st, active, &pick));
            }
            async_pick = Some(pick);
        }
    }
    let app_percent = call_budgets(st, limits, phone)?;
    let send = validate(st, phone, parsed).map_err(|(code, details)| Refusal::request(code, &details))?;
    account_check(st, phone, &send)?;
    let mut usage = message_limits(st, limits, phone, send.user_key())?;
    usage.app_percent = app_percent;
    Ok((send, usage, async_pick))
}

/// The injection (if any) for a call, from a lenient reading of the body: injections may target calls whose
/// body is invalid too, as long as their targets can be read.
fn pick_injection(st: &Inner, active: &Active, body: Option<&Value>, token: &str, phone: &str) -> Option<Picked> {
    fn s(v: Option<&Value>) -> Option<&str> {
        v.and_then(Value::as_str)
    }
    let mtype = body.map_or("text", |b| s(b.get("type")).unwrap_or("text"));
    let template = body
        .and_then(|b| b.get("template"))
        .and_then(|t| Some((s(t.get("name"))?, s(t.get("language").and_then(|l| l.get("code")))?)));
    let to_digits = body.and_then(|b| s(b.get("to"))).map(ids::wa_id).filter(|d| !d.is_empty());
    let user_id = body.and_then(|b| s(b.get("recipient"))).filter(|r| ids::is_user_id(r)).map(str::to_string);
    let wa_id = to_digits.or_else(|| user_id.as_deref().and_then(|u| st.account.user_by_id(&st.cfg, u).wa_id));
    let user_id = user_id
        .or_else(|| wa_id.as_deref().map(|w| st.account.user_by_phone(&st.cfg, st.cfg.portfolio_of(phone), w).user_id));
    let category = template
        .and_then(|(n, l)| st.account.template(n, l))
        .map(|t| t.category.to_ascii_lowercase())
        .or_else(|| template.map(|_| st.webhooks.config().template_category.clone()));
    let call = Call {
        phone_number_id: phone,
        waba_id: st.cfg.waba_of(phone),
        token,
        template,
        wa_id: wa_id.as_deref(),
        user_id: user_id.as_deref(),
        message_type: mtype,
        category: category.as_deref(),
    };
    active.pick_injection(&call)
}

/// Refusals from the announced account state, and the portfolio limit in sync mode.
fn account_check(st: &Inner, phone: &str, send: &Send) -> Result<(), Refusal> {
    let now = ids::now_ms();
    let key = send.user_key();
    let in_window = st.account.in_window(phone, key, now);
    let template = send.template.as_ref().and_then(|(n, l)| st.account.template(n, l));
    let category = template.as_ref().map(|t| t.category.as_str());
    let class =
        SendClass { in_window, template: send.template.as_ref().map(|(n, l)| (n.as_str(), l.as_str())), category };
    let account = |code| Refusal::new(code, Source::Account, None, Usage::default());
    if let Some(code) = st.account.refusal(phone, st.cfg.waba_of(phone), class, now) {
        return Err(account(code));
    }
    if let Some(t) = &template {
        if let Ok(Some(code)) = crate::templates::template_status_effect(&t.status) {
            return Err(account(code));
        }
        let otp = matches!(t.otp_type, Some(OtpType::CopyCode | OtpType::OneTap | OtpType::ZeroTap));
        if send.by_user_id && otp {
            return Err(Refusal::new(131_062, Source::Request, None, Usage::default()));
        }
    }
    if st.cfg.messaging_limit.mode == Mode::Sync && !in_window && send.template.is_some() {
        let portfolio = st.cfg.portfolio_of(phone);
        if st.account.reach(portfolio, key, now, st.cfg.messaging_limit.window_ms).is_err() {
            st.oracle.count_portfolio_limited(portfolio);
            return Err(Refusal::new(st.cfg.messaging_limit.code, Source::Limit, None, Usage::default()));
        }
    }
    Ok(())
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
/// token event) → 190 "session has expired" (or 0), on every number. Ok(the token).
fn authorize(st: &Inner, active: &Active, headers: &HeaderMap) -> Result<String, Refusal> {
    let invalid = || Refusal::new(190, Source::Request, None, Usage::default());
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
        Some(code) => Err(Refusal::new(code, Source::Injected, Some(errors::dead_token_body(code)), Usage::default())),
        None => Ok(token.to_string()),
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
fn message_limits(st: &Inner, limits: &Limits, phone: &str, user_key: &str) -> Result<Usage, Refusal> {
    if !limits.enabled {
        return Ok(Usage::default());
    }
    let mps = st.mps_for(limits, phone);
    let throttled = |wait| Refusal::limit(130429, Usage::refused(wait, 100));
    // Check the throughput first so a message the pair limit refuses takes nothing from it, and vice versa.
    st.limiter.throughput_check(phone, mps, limits.throughput_burst).map_err(|Refused { wait }| throttled(wait))?;
    if limits.pair_enabled
        && let Err(Refused { wait }) = st.limiter.pair(phone, user_key, limits)
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
    let status = r.http_status.unwrap_or_else(|| errors::http_status(r.code, st.cfg.throttle_http_status));
    let body = r.body.unwrap_or_else(|| errors::body(r.code, None, None));
    let mode = if r.force_retry_after && mode == RetryAfter::None { RetryAfter::Seconds } else { mode };
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
    chrono::DateTime::<chrono::Utc>::from(at).format("%a, %d %b %Y %H:%M:%S GMT").to_string()
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
