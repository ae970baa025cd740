//! Graph reads of the messaging limit (meta-cloud-api.md §3.3): `GET /{version}/{id}?fields=
//! whatsapp_business_manager_messaging_limit` on a business portfolio, a WABA or a phone number (v24.0+) answers
//! the portfolio's current tier (`TIER_250` ... `TIER_UNLIMITED`), as announced (configuration, then
//! `business_capability_update` events). Other fields and objects answer Graph's unsupported-request error; a
//! missing or unknown token answers 190.

use crate::state::Inner;
use crate::versions::{self, Served};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;

/// The field Meta names the portfolio's tier by (v24.0+).
pub(crate) const LIMIT_FIELD: &str = "whatsapp_business_manager_messaging_limit";

pub(crate) async fn read_object(
    State(st): State<Arc<Inner>>,
    Path((version, id)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    if matches!(versions::resolve(&version, versions::today(st.cfg.api_date.as_deref())), Served::Unknown) {
        return crate::api::fallback().await;
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    if token.is_empty() || !(st.cfg.access_tokens.is_empty() || st.cfg.access_tokens.iter().any(|t| t == token)) {
        let body = json!({"error": {"message": "Invalid OAuth access token.", "type": "OAuthException", "code": 190}});
        return (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    }
    let fields = query.get("fields").map(String::as_str).unwrap_or_default();
    if !fields.split(',').any(|f| f.trim() == LIMIT_FIELD) {
        return crate::api::fallback().await;
    }
    let portfolio = portfolio_of_object(&st, &id);
    let tier = st.account.tier(&portfolio);
    (StatusCode::OK, axum::Json(json!({ LIMIT_FIELD: tier.name(), "id": id }))).into_response()
}

/// The portfolio an id names: a portfolio itself, a WABA's, else the phone number's.
fn portfolio_of_object(st: &Inner, id: &str) -> String {
    let cfg = &st.cfg;
    if id == cfg.business_id || cfg.portfolios.contains_key(id) {
        return id.to_string();
    }
    let is_waba = id == cfg.waba_id
        || cfg.portfolios.values().any(|p| p.waba_ids.iter().any(|w| w == id))
        || cfg.phone_numbers.values().any(|p| p.waba_id.as_deref() == Some(id));
    if is_waba { cfg.portfolio_of_waba(id).to_string() } else { cfg.portfolio_of(id).to_string() }
}
