//! Admin API of the coordinator, merged into the admin server:
//!
//! - `GET  /admin/breakers` — every known scope with state, counters and limits;
//! - `GET  /admin/breakers/{phone_number_id}` — one scope;
//! - `POST /admin/breakers/{phone_number_id}/{force-open|force-closed|clear|reset}` — operator overrides, with
//!   an optional JSON body `{"reason": "..."}` that is logged;
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

use crate::Coordinator;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bw_breaker::{Forced, Scope, ScopeLimits, ScopeStatus};
use serde_json::{Value, json};

/// Routes of the admin API.
pub fn router(coordinator: Coordinator) -> Router {
    let operator = coordinator.operator_gate().protect(
        Router::new().route("/admin/breakers/{phone}/{action}", post(act)).route("/admin/reload", post(reload)),
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
