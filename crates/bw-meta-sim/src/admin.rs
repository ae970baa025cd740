//! The admin API under `/_sim/` (no auth; loopback only):
//!
//! | route | what |
//! |---|---|
//! | `GET /_sim/health` | `ok` |
//! | `GET /_sim/oracle` | [`OracleSnapshot`](crate::OracleSnapshot) JSON: accepted messages + counters |
//! | `GET /_sim/counters` | [`Counters`](crate::Counters) JSON |
//! | `POST /_sim/reset` | clear oracle, counters, limiter, expired tokens; restart the scenario clock |
//! | `GET /_sim/scenario` | `{"scenario": {...}, "elapsed_ms": n}` |
//! | `POST /_sim/scenario` | body: scenario TOML, or JSON with `content-type: application/json`; or `?builtin=flash-sale-outage&start_ms=0&duration_ms=5000`; clock starts now |
//! | `DELETE /_sim/scenario` | no faults |
//! | `POST /_sim/scenario/restart` | restart the clock of the active scenario |
//! | `GET`/`POST /_sim/limits` | read / replace the configured [`Limits`] (JSON; validated, unknown keys refused) |
//! | `POST /_sim/tokens/expire` | `{"token": "...", "code": 190}` (code 190 expired, the default, or 0 invalidated; token `*` = all): every call with it fails on every number, counted as injected |
//! | `POST /_sim/tokens/restore` | `{"token": "..."}`: valid again (`*` = all) |
//! | `POST /_sim/inbound` | `{"phone_number_id","from","name","text"}` → inbound message webhook (see below); answers `{"wamid"}` |
//! | `POST /_sim/events` | fire account, template and user webhooks (see below) |
//! | `GET /_sim/state` | the account state (see below) |
//! | `POST /_sim/dump` | `?path=...` or the configured `dump_path`: write the oracle as JSON |
//!
//! - `POST /_sim/inbound` takes a unit of the number's throughput and opens the user's 24 h window, as on Meta.
//!   Optional: `from_user_id`, `hide_phone` (a user-id-only webhook), `username`, `error_code` (an unsupported
//!   message with `errors[]`, e.g. 131052); `from` may be omitted when `from_user_id` is given.
//! - `POST /_sim/events`: one event (JSON object), a JSON array of events, or TOML with `[[events]]`; each fires
//!   `at_ms` after the call (see [`events`](crate::events)); answers `{"scheduled": n}`.
//! - `GET /_sim/state`: [`AccountSnapshot`](crate::AccountSnapshot): restricted or banned WABAs, template
//!   states, portfolio tiers and users reached, upgraded numbers, users who stopped marketing (masked), events.
//! - `GET /_sim/scenario` shows tokens (token events, injection targets) as `<redacted>`; `*` stays.

//!
//! ## `GET /_sim/counters` (also `counters` in `GET /_sim/oracle` and the dump)
//!
//! ```json
//! { "requests": 1200,
//!   "by_outcome":      { "200": 1000, "130429": 90, "2": 40, "http_503": 30, "reset": 20, "hang": 5,
//!                        "200_unparseable": 5, "4": 10 },
//!   "injected":        { "130429": 30, "2": 40, "http_503": 30, "reset": 20, "hang": 5, "200_unparseable": 5 },
//!   "limit_exceeded":  { "130429": 60, "4": 10 },
//!   "accepted_unacknowledged": 42,
//!   "webhooks": { "statuses_scheduled": 3000, "posts_ok": 900, "post_failures": 0, "statuses_delivered": 3000,
//!                 "statuses_dropped": 0, "inbound_delivered": 0, "statuses_withheld": 30, "statuses_delayed": 300 } }
//! ```
//!
//! - `by_outcome`: every answer by key: `"200"`, a Meta code as text (`"130429"`, `"131056"`, `"4"`, `"80007"`,
//!   `"190"`, `"100"`...), `"http_<status>"` for a bodiless HTTP error, `"reset"`, `"hang"`, `"200_unparseable"`.
//! - `injected`: the answers, by the same keys, that the scenario (a window's fault, latency cut by shutdown, a
//!   token event) or an admin call (`/_sim/tokens/expire`) produced: Meta "failing".
//! - `limit_exceeded`: the answers, by the same keys, caused by the client exceeding a modelled limit
//!   (throughput 130429, pair 131056, app 4, WABA 80007/80008, the portfolio limit in sync mode): self-inflicted.
//! - `account_state`: the answers, by the same keys, caused by account state the simulator announced by webhook
//!   (a restricted 368 or banned 131031 WABA, a paused 132015 / disabled 132016 / unapproved 132001 template, a
//!   number in maintenance 131057): the sender ignored a signal.
//! - `by_outcome[k] − injected[k] − limit_exceeded[k] − account_state[k]` = answers to the request itself (200s,
//!   validation and unknown-token errors, 131062). Counters are never negative; a missing key is 0.
//! - `async_failed` / `async_failed_by_cause`: `failed` statuses scheduled for accepted messages, by code, and by
//!   cause (`injected`: a scenario injection or `async_failure` fault; `configured`: `webhook.fail_recipients`;
//!   `account`: 131050 after a `user_preferences` stop, marketing to a US number, 131047 outside the window;
//!   `limit`: the portfolio messaging limit). The oracle's `failed` lists the messages.
//! - `injections`: calls each scenario injection answered or failed, by its name (`#<index>` unnamed).
//! - `api_versions`: calls by version, `"v20.0->v21.0"` for an expired version served by the oldest usable one,
//!   `"unknown"` for a path segment that is no version (answered like an unknown object).
//! - `portfolio_limited`: messages failed or refused for the messaging limit, by portfolio.
//! - `webhooks.fields_delivered`: account and other webhooks delivered, by field.
//! - `accepted_unacknowledged`: acceptances the client was not shown (reset, hang or bodiless 5xx after
//!   acceptance, unparseable 200).
//!
//! ## `GET /_sim/oracle`: `duplicates`
//!
//! `{"total": 3, "after_ambiguous": 2, "plain": 1, "after_ambiguous_ids": ["op-1", "op-7"], "plain_ids": ["op-9"]}`:
//! operations accepted more than once, split by whether every earlier acceptance was hidden from the client
//! (`after_ambiguous`) or it had a 200 and sent again (`plain`); see
//! [`OracleEntry::duplicate_kind`](crate::OracleEntry::duplicate_kind). Each entry of `messages` carries
//! `acknowledged`: one bool per acceptance, whether the client got a parseable 200 for it.

use crate::events::Event;
use crate::limits::Limits;
use crate::scenario::Scenario;
use crate::state::{Inner, lock_read, lock_write};
use crate::{fire, ids};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn routes() -> Router<Arc<Inner>> {
    Router::new()
        .route("/_sim/health", get(|| async { "ok" }))
        .route("/_sim/oracle", get(oracle))
        .route("/_sim/counters", get(counters))
        .route("/_sim/reset", post(reset))
        .route("/_sim/scenario", get(get_scenario).post(set_scenario).delete(clear_scenario))
        .route("/_sim/scenario/restart", post(restart))
        .route("/_sim/limits", get(get_limits).post(set_limits))
        .route("/_sim/inbound", post(inbound))
        .route("/_sim/events", post(events))
        .route("/_sim/state", get(state))
        .route("/_sim/tokens/expire", post(expire_token))
        .route("/_sim/tokens/restore", post(restore_token))
        .route("/_sim/dump", post(dump))
}

fn bad(msg: impl std::fmt::Display) -> Response {
    (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": msg.to_string() }))).into_response()
}

async fn oracle(State(st): State<Arc<Inner>>) -> Response {
    axum::Json(st.oracle.snapshot()).into_response()
}

async fn counters(State(st): State<Arc<Inner>>) -> Response {
    axum::Json(st.oracle.counters()).into_response()
}

async fn reset(State(st): State<Arc<Inner>>) -> Response {
    st.reset();
    axum::Json(json!({ "reset": true })).into_response()
}

async fn get_scenario(State(st): State<Arc<Inner>>) -> Response {
    let active = lock_read(&st.scenario).clone();
    // Tokens are secrets: never echoed.
    let mut scenario = active.scenario.clone();
    let redact = |t: &mut String| {
        if t != "*" {
            *t = "<redacted>".into();
        }
    };
    scenario.token_events.iter_mut().for_each(|e| redact(&mut e.token));
    scenario.injections.iter_mut().flat_map(|i| i.tokens.iter_mut()).for_each(redact);
    axum::Json(json!({ "scenario": scenario, "elapsed_ms": active.elapsed_ms() })).into_response()
}

#[derive(Deserialize)]
struct BuiltinQuery {
    builtin: Option<String>,
    start_ms: Option<u64>,
    duration_ms: Option<u64>,
}

async fn set_scenario(
    State(st): State<Arc<Inner>>,
    Query(q): Query<BuiltinQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parsed = match q.builtin.as_deref() {
        Some("flash-sale-outage") => Ok(Scenario::flash_sale_outage(
            Duration::from_millis(q.start_ms.unwrap_or(10_000)),
            Duration::from_millis(q.duration_ms.unwrap_or(30_000)),
        )),
        Some("outage") => Ok(Scenario::outage(
            Duration::from_millis(q.start_ms.unwrap_or(0)),
            Duration::from_millis(q.duration_ms.unwrap_or(30_000)),
        )),
        Some(name) => Scenario::builtin(name),
        None => {
            let json =
                headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("json"));
            if json {
                Scenario::from_json(&body)
            } else {
                match std::str::from_utf8(&body) {
                    Ok(text) => Scenario::from_toml(text),
                    Err(_) => return bad("scenario body is not utf-8"),
                }
            }
        }
    };
    match parsed {
        Ok(s) => {
            tracing::info!(scenario = %s.name, windows = s.windows.len(), "scenario set");
            let name = s.name.clone();
            st.set_scenario(s);
            axum::Json(json!({ "scenario": name, "elapsed_ms": 0 })).into_response()
        }
        Err(e) => bad(e),
    }
}

async fn clear_scenario(State(st): State<Arc<Inner>>) -> Response {
    st.set_scenario(Scenario::normal());
    axum::Json(json!({ "scenario": "normal" })).into_response()
}

async fn restart(State(st): State<Arc<Inner>>) -> Response {
    st.restart_clock();
    axum::Json(json!({ "restarted": true })).into_response()
}

async fn get_limits(State(st): State<Arc<Inner>>) -> Response {
    axum::Json(lock_read(&st.limits).clone()).into_response()
}

async fn set_limits(State(st): State<Arc<Inner>>, body: Bytes) -> Response {
    match serde_json::from_slice::<Limits>(&body) {
        Ok(l) => match l.validate() {
            Ok(()) => {
                *lock_write(&st.limits) = l.clone();
                axum::Json(l).into_response()
            }
            Err(e) => bad(e),
        },
        Err(e) => bad(format!("limits are not valid json: {e}")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenChange {
    token: String,
    #[serde(default = "code_190")]
    code: i64,
}

fn code_190() -> i64 {
    190
}

async fn expire_token(State(st): State<Arc<Inner>>, body: Bytes) -> Response {
    let change: TokenChange = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => return bad(format!("token change is not valid json: {e}")),
    };
    match st.kill_token(&change.token, change.code) {
        // The token itself is a secret: never echoed.
        Ok(()) => axum::Json(json!({ "expired": true, "code": change.code })).into_response(),
        Err(e) => bad(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRestore {
    token: String,
}

async fn restore_token(State(st): State<Arc<Inner>>, body: Bytes) -> Response {
    match serde_json::from_slice::<TokenRestore>(&body) {
        Ok(r) => axum::Json(json!({ "restored": st.restore_token(&r.token) })).into_response(),
        Err(e) => bad(format!("token restore is not valid json: {e}")),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Inbound {
    phone_number_id: String,
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    from_user_id: Option<String>,
    #[serde(default)]
    hide_phone: bool,
    #[serde(default)]
    name: String,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    error_code: Option<i64>,
}

async fn inbound(State(st): State<Arc<Inner>>, body: Bytes) -> Response {
    let msg: Inbound = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => return bad(format!("inbound message is not valid json: {e}")),
    };
    let kind = crate::events::EventKind::Inbound {
        phone_number_id: msg.phone_number_id.clone(),
        from: msg.from.clone(),
        from_user_id: msg.from_user_id.clone(),
        hide_phone: msg.hide_phone,
        name: None,
        username: None,
        text: None,
        error_code: msg.error_code,
    };
    if msg.text.is_none() && msg.error_code.is_none() {
        return bad("inbound message needs text (or error_code for an unsupported message)");
    }
    if let Err(e) = kind.validate() {
        return bad(format!("inbound message: {e}"));
    }
    let m = fire::Inbound {
        phone_number_id: msg.phone_number_id,
        from: msg.from,
        from_user_id: msg.from_user_id,
        hide_phone: msg.hide_phone,
        name: msg.name,
        username: msg.username,
        text: msg.text.unwrap_or_default(),
        error_code: msg.error_code,
    };
    match fire::inbound(&st, &m) {
        Some(wamid) => axum::Json(json!({ "wamid": wamid })).into_response(),
        None => (StatusCode::CONFLICT, axum::Json(json!({ "error": "no webhook url configured or queue full" })))
            .into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsDoc {
    events: Vec<Event>,
}

async fn events(State(st): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> Response {
    let json = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("json"));
    let parsed: Result<Vec<Event>, String> = if json {
        match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(v @ serde_json::Value::Array(_)) => serde_json::from_value(v).map_err(|e| e.to_string()),
            Ok(v) => serde_json::from_value::<Event>(v).map(|e| vec![e]).map_err(|e| e.to_string()),
            Err(e) => Err(format!("events are not valid json: {e}")),
        }
    } else {
        match std::str::from_utf8(&body) {
            Ok(text) => toml::from_str::<EventsDoc>(text).map(|d| d.events).map_err(|e| e.to_string()),
            Err(_) => Err("events body is not utf-8".into()),
        }
    };
    let list = match parsed {
        Ok(l) => l,
        Err(e) => return bad(e),
    };
    for (i, ev) in list.iter().enumerate() {
        if let Err(e) = ev.kind.validate() {
            return bad(format!("event `{}`: {e}", crate::scenario::event_name(ev, i)));
        }
    }
    let n = list.len();
    for (i, ev) in list.into_iter().enumerate() {
        let label = if ev.name.is_empty() { format!("admin #{i} {}", ev.kind.kind_name()) } else { ev.name.clone() };
        fire::later(&st, ev, label);
    }
    axum::Json(json!({ "scheduled": n })).into_response()
}

async fn state(State(st): State<Arc<Inner>>) -> Response {
    axum::Json(st.account.snapshot(&st.cfg, ids::now_ms())).into_response()
}

#[derive(Deserialize)]
struct DumpQuery {
    path: Option<String>,
}

async fn dump(State(st): State<Arc<Inner>>, Query(q): Query<DumpQuery>) -> Response {
    let Some(path) = q.path.map(std::path::PathBuf::from).or_else(|| st.cfg.dump_path.clone()) else {
        return bad("no path given and no dump_path configured");
    };
    match st.dump(&path) {
        Ok(()) => axum::Json(json!({ "path": path.display().to_string() })).into_response(),
        // The path is the caller's: a precise 400, not a 500.
        Err(e) => bad(format!("{e:#}")),
    }
}
