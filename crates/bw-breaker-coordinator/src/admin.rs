//! Admin API of the coordinator, merged into the admin server:
//!
//! - `GET  /admin/breakers` — every known scope with state, counters and limits;
//! - `GET  /admin/breakers/{phone_number_id}` — one scope;
//! - `POST /admin/breakers/{phone_number_id}/{force-open|force-closed|clear|reset}` — operator overrides, with
//!   an optional JSON body `{"reason": "..."}` that is logged;
//! - `POST /admin/pauses/{number|waba|app|token}/{id}/{pause|lift}` — an operator's pause of one scope (body
//!   `{"for_ms": N, "reason": "..."}`; without `for_ms` until lifted), or the lift of any pause of it (an answer's,
//!   a webhook's or an operator's); `id` is the phone_number_id, WABA id, app id or the token's fingerprint;
//! - `POST /admin/throughput/{phone_number_id}` — record Meta's stated throughput of a known number (body
//!   `{"mps": N}`, 1 to 1,000, default 1,000), as its `THROUGHPUT_UPGRADE` webhook would: for an upgrade whose
//!   webhook named no number the coordinator could tell (`meta_limits.rs`);
//! - `POST /admin/reload` — re-read the limits (also done on SIGHUP and when the limits file changes);
//! - `GET  /admin/leader` — this instance's id, whether it leads, and the lease holder.
//!
//! Every `POST` route is an operator action and needs `Authorization: Bearer <token>` whose sha256 is in
//! `operator.token_sha256` (compared in constant time: [`bw_common::admin::OperatorGate`], which also guards
//! every state-changing request to the mounted routes). Refusals are JSON `{"error": "..."}` and counted in
//! `bw_breaker_coordinator_admin_refusals_total{reason}`:
//!
//! - 403 `disabled` — no token hash is configured (the compiled default): operator actions are off;
//! - 401 `missing` — no `Authorization` header; 401 `malformed` — not `Bearer <token>`;
//! - 403 `invalid` — a token that matches no configured hash.
//!
//! The `GET` routes are read-only (states, counters, limits, no personal data) and stay open like `/livez`,
//! `/readyz` and `/metrics`.

use crate::coordinator::Coordinator;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bw_breaker::{Forced, Parent, PauseEnd, PauseSource, PauseSpec, Scope, ScopeLimits, ScopeStatus};
use serde_json::{Value, json};

/// Routes of the admin API.
pub fn router(coordinator: Coordinator) -> Router {
    let operator = coordinator.operator_gate().protect(
        Router::new()
            .route("/admin/breakers/{phone}/{action}", post(act))
            .route("/admin/pauses/{level}/{id}/{action}", post(pause_action))
            .route("/admin/throughput/{phone}", post(throughput))
            .route("/admin/reload", post(reload)),
    );
    Router::new()
        .route("/admin/breakers", get(list))
        .route("/admin/breakers/{phone}", get(one))
        .route("/admin/leader", get(leader))
        .merge(operator)
        .with_state(coordinator)
}

async fn leader(State(c): State<Coordinator>) -> Response {
    axum::Json(json!({
        "instance": c.instance(),
        "leader": c.is_leader(),
        "holder": c.leader_holder().await,
    }))
    .into_response()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": message.into() }))).into_response()
}

fn limits_json(l: &ScopeLimits) -> Value {
    json!({
        "rate_per_s": l.rate_per_s,
        "burst": l.burst,
        "reserve_fraction": l.reserve_fraction,
        "failure_threshold": l.failure_threshold,
        "min_calls": l.min_calls,
        "window_ms": l.window_ms,
        "cooldown_ms": l.cooldown_ms,
        "canaries_per_s": l.canaries_per_s,
        "pair_interval_ms": l.pair_interval_ms,
        "pair_burst": l.pair_burst,
        "ramp_ms": l.ramp_ms,
    })
}

fn status_json(c: &Coordinator, scope: &Scope, status: &ScopeStatus) -> Value {
    let s = &status.snapshot;
    let limits = c.limits();
    json!({
        "waba_id": scope.waba_id,
        "phone_number_id": scope.phone_number_id,
        "state": s.state().as_str_name().trim_start_matches("BREAKER_STATE_"),
        "since_unix_ms": s.since_unix_ms,
        "incident_id": s.incident_id,
        "open_until_unix_ms": s.open_until_unix_ms,
        "paused_until_unix_ms": s.paused_until_unix_ms,
        "pause_reason": s.pause_reason,
        "failure_rate": s.failure_rate,
        "calls_in_window": s.calls_in_window,
        "failures_in_window": status.failures_in_window,
        "trips": s.trips,
        "trip_streak": status.trip_streak,
        "ramp_fraction": s.ramp_fraction,
        "tokens": status.tokens,
        "usage_percent": status.usage_percent,
        "limits": limits_json(limits.for_scope(&scope.phone_number_id)),
    })
}

async fn list(State(c): State<Coordinator>) -> Response {
    let mut out = Vec::new();
    for scope in c.known_scopes() {
        match c.breaker().status(&scope).await {
            Ok(status) => out.push(status_json(&c, &scope, &status)),
            Err(e) => {
                return error(StatusCode::SERVICE_UNAVAILABLE, format!("redis unavailable: {e}"));
            }
        }
    }
    axum::Json(json!({ "scopes": out })).into_response()
}

async fn one(State(c): State<Coordinator>, Path(phone): Path<String>) -> Response {
    let Some(scope) = c.scope(&phone) else {
        return error(StatusCode::NOT_FOUND, format!("scope `{phone}` not found"));
    };
    match c.breaker().status(&scope).await {
        Ok(status) => axum::Json(status_json(&c, &scope, &status)).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("redis unavailable: {e}")),
    }
}

async fn act(State(c): State<Coordinator>, Path((phone, action)): Path<(String, String)>, body: Bytes) -> Response {
    let Some(scope) = c.scope(&phone) else {
        return error(StatusCode::NOT_FOUND, format!("scope `{phone}` not found"));
    };
    let reason = if body.is_empty() {
        String::new()
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) => v.get("reason").and_then(|r| r.as_str()).unwrap_or_default().chars().take(200).collect(),
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")),
        }
    };
    let breaker = c.breaker();
    let result = match action.as_str() {
        "force-open" => breaker.force(&scope, Forced::Open).await,
        "force-closed" => breaker.force(&scope, Forced::Closed).await,
        "clear" => breaker.force(&scope, Forced::Clear).await,
        "reset" => breaker.reset(&scope).await,
        other => {
            return error(
                StatusCode::NOT_FOUND,
                format!("unknown action `{other}` (force-open, force-closed, clear, reset)"),
            );
        }
    };
    match result {
        Ok((status, transitions)) => {
            c.metrics().operator_actions.get_or_create(&vec![("action".into(), action.clone())]).inc();
            tracing::info!(phone_number_id = %phone, action = %action, reason = %reason, "operator breaker action");
            c.store(&status, true).await;
            let mut body = status_json(&c, &scope, &status);
            body["transitions"] = json!(transitions.len());
            axum::Json(body).into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("redis unavailable: {e}")),
    }
}

/// The scope `level`/`id` names, or why not (ids are Meta's ids or a token fingerprint: short, plain ASCII).
fn parent_of(c: &Coordinator, level: &str, id: &str) -> Result<Parent, (StatusCode, String)> {
    let plain =
        !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !plain {
        return Err((StatusCode::BAD_REQUEST, "id must be 1 to 64 letters, digits, '-', '_' or '.'".into()));
    }
    match level {
        "number" => match c.scope(id) {
            Some(scope) => Ok(Parent::Number(scope)),
            None => Err((StatusCode::NOT_FOUND, format!("scope `{id}` not found"))),
        },
        "waba" => Ok(Parent::Waba(id.to_string())),
        "app" => Ok(Parent::App(id.to_string())),
        "token" if id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(Parent::Token(id.to_ascii_lowercase()))
        }
        "token" => Err((StatusCode::BAD_REQUEST, "a token is named by its fingerprint: 16 hex digits".into())),
        other => Err((StatusCode::NOT_FOUND, format!("unknown level `{other}` (number, waba, app, token)"))),
    }
}

fn pause_json(parent: &Parent, status: &bw_breaker::ParentStatus) -> Value {
    let p = status.to_proto(parent);
    json!({
        "level": p.level,
        "id": p.id,
        "code": p.code,
        "reason": p.reason,
        "since_unix_ms": p.since_unix_ms,
        "until_unix_ms": p.until_unix_ms,
        "halted": status.halted,
        "lift": p.lift,
        "source": p.source,
        "marketing_only": p.marketing_only,
    })
}

/// An operator pauses one scope (number, WABA, app or token), or lifts whatever pause it has.
async fn pause_action(
    State(c): State<Coordinator>,
    Path((level, id, action)): Path<(String, String, String)>,
    body: Bytes,
) -> Response {
    let parent = match parent_of(&c, &level, &id) {
        Ok(p) => p,
        Err((status, message)) => return error(status, message),
    };
    let body: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")),
        }
    };
    let reason: String = body.get("reason").and_then(|r| r.as_str()).unwrap_or_default().chars().take(200).collect();
    let result = match action.as_str() {
        "lift" => c.breaker().clear_parent(&parent).await,
        "pause" => {
            let end = match body.get("for_ms") {
                None | Some(Value::Null) => PauseEnd::Lifted,
                Some(v) => match v.as_u64().filter(|ms| *ms > 0) {
                    Some(ms) => PauseEnd::For(ms),
                    None => return error(StatusCode::BAD_REQUEST, "for_ms must be a positive number of milliseconds"),
                },
            };
            let spec =
                PauseSpec { scope: parent.level(), code: 0, end, marketing_only: false, source: PauseSource::Operator };
            c.breaker().pause(&parent, spec).await
        }
        other => return error(StatusCode::NOT_FOUND, format!("unknown action `{other}` (pause, lift)")),
    };
    match result {
        Ok(status) => {
            c.metrics().operator_actions.get_or_create(&vec![("action".into(), format!("{action}-{level}"))]).inc();
            tracing::info!(level = %level, id = %id, action = %action, reason = %reason, "operator pause action");
            c.forget_parent(&parent);
            // The snapshots show it at once on the leader; another instance's change reaches them within the
            // leader's parent_refresh_ms.
            if c.is_leader() {
                c.tick_all(true).await;
            }
            axum::Json(pause_json(&parent, &status)).into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("redis unavailable: {e}")),
    }
}

/// An operator records Meta's stated throughput of one known number (the event is recorded as `OPERATOR`).
async fn throughput(State(c): State<Coordinator>, Path(phone): Path<String>, body: Bytes) -> Response {
    let Some(scope) = c.scope(&phone) else {
        return error(StatusCode::NOT_FOUND, format!("scope `{phone}` not found"));
    };
    let body: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")),
        }
    };
    let max = bw_breaker::throughput::UPGRADED_MPS;
    let mps = match body.get("mps") {
        None | Some(Value::Null) => max,
        // Meta's highest stated throughput is the ceiling: Breakwater never sends above what Meta allows.
        Some(v) => match v.as_u64().filter(|m| (1..=u64::from(max)).contains(m)) {
            Some(m) => m as u32,
            None => return error(StatusCode::BAD_REQUEST, format!("mps must be a whole number from 1 to {max}")),
        },
    };
    match c.record_throughput(&scope, mps, "OPERATOR").await {
        Ok((mps, rate)) => {
            c.metrics().operator_actions.get_or_create(&vec![("action".into(), "throughput".into())]).inc();
            axum::Json(json!({
                "waba_id": scope.waba_id,
                "phone_number_id": scope.phone_number_id,
                "mps": mps,
                "rate_per_s": rate,
            }))
            .into_response()
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("redis unavailable: {e}")),
    }
}

async fn reload(State(c): State<Coordinator>) -> Response {
    match c.reload().await {
        Ok(n) => {
            c.metrics().operator_actions.get_or_create(&vec![("action".into(), "reload".into())]).inc();
            // A follower keeps the new limits for when it leads; the leader's file watcher picks the same
            // file change up by itself.
            axum::Json(json!({ "reloaded": true, "scopes_with_overrides": n, "leader": c.is_leader() })).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}
