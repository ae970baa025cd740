//! The admin API under `/_sim/` (no auth; loopback only):
//!
//! | route | what |
//! |---|---|
//! | `GET /_sim/health` | `ok` |
//! | `GET /_sim/oracle` | [`OracleSnapshot`](crate::OracleSnapshot) JSON: accepted messages + counters |
//! | `GET /_sim/counters` | [`Counters`](crate::Counters) JSON |
//! | `POST /_sim/reset` | clear oracle, counters, limiter; restart the scenario clock |
//! | `GET /_sim/scenario` | `{"scenario": {...}, "elapsed_ms": n}` |
//! | `POST /_sim/scenario` | body: scenario TOML, or JSON with `content-type: application/json`; or `?builtin=flash-sale-outage&start_ms=0&duration_ms=5000`; clock starts now |
//! | `DELETE /_sim/scenario` | no faults |
//! | `POST /_sim/scenario/restart` | restart the clock of the active scenario |
//! | `GET`/`POST /_sim/limits` | read / replace [`Limits`](crate::Limits) (JSON) |
//! | `POST /_sim/inbound` | `{"phone_number_id","from","name","text"}` → inbound message webhook; answers `{"wamid"}` |
//! | `POST /_sim/dump` | `?path=...` or the configured `dump_path`: write the oracle as JSON |

use crate::limits::Limits;
use crate::scenario::Scenario;
use crate::{Inner, lock_read};
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
    axum::Json(json!({ "scenario": active.scenario, "elapsed_ms": active.elapsed_ms() })).into_response()
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
    axum::Json(*lock_read(&st.limits)).into_response()
}

async fn set_limits(State(st): State<Arc<Inner>>, body: Bytes) -> Response {
    match serde_json::from_slice::<Limits>(&body) {
        Ok(l) if l.throughput_mps > 0.0 => {
            *st.limits.write().unwrap_or_else(|e| e.into_inner()) = l;
            axum::Json(l).into_response()
        }
        Ok(_) => bad("throughput_mps must be positive"),
        Err(e) => bad(format!("limits are not valid json: {e}")),
    }
}

#[derive(Deserialize)]
struct Inbound {
    phone_number_id: String,
    from: String,
    #[serde(default)]
    name: String,
    text: String,
}

async fn inbound(State(st): State<Arc<Inner>>, body: Bytes) -> Response {
    let msg: Inbound = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => return bad(format!("inbound message is not valid json: {e}")),
    };
    match st.webhooks.inbound_text(&msg.phone_number_id, &msg.from, &msg.name, &msg.text) {
        Some(wamid) => axum::Json(json!({ "wamid": wamid })).into_response(),
        None => (StatusCode::CONFLICT, axum::Json(json!({ "error": "no webhook url configured or queue full" })))
            .into_response(),
    }
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
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({ "error": format!("{e:#}") }))).into_response(),
    }
}
