//! The Meta Cloud API client: builds the `/messages` body from a `SendRequest`, POSTs it, and turns the answer
//! into a [`MetaAnswer`]. The access token goes only into the Authorization header; the operation id goes into
//! `biz_opaque_callback_data` so a status webhook can prove a send whose answer was lost.

use crate::config::MetaConfig;
use bw_common::classify::{self, Channel, Classification, Retry};
use bw_proto::v1::{SendRequest, send_request::Payload};
use serde_json::json;
use std::time::{Duration, Instant};

/// What came back from one POST.
#[derive(Debug, Clone)]
pub enum MetaAnswer {
    /// HTTP 2xx (`http_status`, 200 in practice) with a wamid. `held`: the answer's `message_status` was
    /// `held_for_quality_assessment` (template pacing, meta-cloud-api.md §1, §3.5): accepted, not sent yet.
    Accepted { wamid: String, usage_percent: Option<u32>, http_status: u16, held: bool },
    /// Meta (or something in front of it) refused the message; it was not created.
    Rejected {
        /// What the answer means ([`classify::classify`]).
        meaning: Classification,
        /// Meta's code (0 when no Meta error body came).
        code: i64,
        http_status: u16,
        details: String,
        fbtrace_id: String,
        /// `Retry-After`, ms.
        retry_after_ms: Option<u64>,
        /// The longest `estimated_time_to_regain_access` of `X-Business-Use-Case-Usage` (minutes there), ms;
        /// None when absent or zero.
        regain_ms: Option<u64>,
    },
    /// The request never left (connect error): safe to retry, counts as transient.
    NotSent { details: String },
    /// The request may have reached Meta but no answer came (timeout, reset): never resend blindly.
    Unknown { details: String, http_status: u16 },
}

/// The hints of a refusal, as [`read_response`] found them in its headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hints {
    pub usage_percent: Option<u32>,
    pub retry_after_ms: Option<u64>,
    pub regain_ms: Option<u64>,
}

impl MetaAnswer {
    /// Writes the answer onto a `meta.send` span: `outcome` (accepted, rejected, not_sent, unknown), `http_status`
    /// when an HTTP answer arrived (left empty when none did: connect failure, timeout) and `meta_code` (Meta's
    /// error code; 0 on success and when no Meta error body came).
    pub fn record_on(&self, span: &tracing::Span) {
        let (outcome, http_status, meta_code) = match self {
            MetaAnswer::Accepted { http_status, .. } => ("accepted", Some(*http_status), 0),
            MetaAnswer::Rejected { http_status, code, .. } => ("rejected", Some(*http_status), *code),
            MetaAnswer::NotSent { .. } => ("not_sent", None, 0),
            MetaAnswer::Unknown { http_status, .. } => ("unknown", Some(*http_status).filter(|s| *s != 0), 0),
        };
        span.record("outcome", outcome);
        span.record("meta_code", meta_code);
        if let Some(status) = http_status {
            span.record("http_status", status);
        }
    }
}

/// A pooled HTTP client bound to one Meta base URL.
#[derive(Clone)]
pub struct MetaClient {
    http: reqwest::Client,
    base_url: String,
    api_version: String,
    auth_header: String,
}

impl MetaClient {
    /// Builds the client (connection pool, timeouts).
    pub fn new(cfg: &MetaConfig) -> anyhow::Result<MetaClient> {
        bw_common::crypto::install_crypto();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
            .timeout(Duration::from_millis(cfg.request_timeout_ms))
            .pool_max_idle_per_host(cfg.pool_max_idle_per_host)
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true)
            .build()?;
        Ok(MetaClient {
            http,
            base_url: cfg.base_url.trim_end_matches('/').to_string(),
            api_version: cfg.api_version.clone(),
            auth_header: format!("Bearer {}", cfg.access_token),
        })
    }

    /// POSTs one message. Returns the answer and how long the call took.
    pub async fn send(&self, request: &SendRequest) -> (MetaAnswer, Duration) {
        let url = format!("{}/{}/{}/messages", self.base_url, self.api_version, request.phone_number_id);
        let body = build_body(request);
        let started = Instant::now();
        let result =
            self.http.post(url).header(reqwest::header::AUTHORIZATION, &self.auth_header).json(&body).send().await;
        let answer = match result {
            Ok(response) => read_response(response).await,
            Err(e) => transport_error(&e),
        };
        (answer, started.elapsed())
    }

    /// Reads one string (or number) field of a Graph object: `GET /{version}/{id}?fields=<field>`. Errors name
    /// the HTTP status and Meta's code, never the token.
    pub(crate) async fn read_field(&self, id: &str, field: &str) -> Result<String, String> {
        let url = format!("{}/{}/{}?fields={field}", self.base_url, self.api_version, id);
        let response = self
            .http
            .get(url)
            .header(reqwest::header::AUTHORIZATION, &self.auth_header)
            .send()
            .await
            .map_err(|e| bw_common::error_chain(&e))?;
        let status = response.status();
        let body: serde_json::Value = response.json().await.map_err(|e| format!("HTTP {status}: {e}"))?;
        if !status.is_success() {
            return Err(format!("HTTP {status}, code {}", body["error"]["code"]));
        }
        match &body[field] {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Number(n) => Ok(n.to_string()),
            _ => Err(format!("no `{field}` in the answer")),
        }
    }
}

fn transport_error(e: &reqwest::Error) -> MetaAnswer {
    // A connect failure (refused, DNS, connect timeout) means nothing was written: the message cannot exist.
    if e.is_connect() {
        return MetaAnswer::NotSent { details: format!("connect failed: {}", bw_common::error_chain(e)) };
    }
    let what = if e.is_timeout() {
        "timeout after the request went out"
    } else {
        "connection lost after the request went out"
    };
    MetaAnswer::Unknown { details: format!("{what}: {}", bw_common::error_chain(e)), http_status: 0 }
}

async fn read_response(response: reqwest::Response) -> MetaAnswer {
    let status = response.status().as_u16();
    let hints = Hints {
        usage_percent: usage_percent(response.headers()),
        retry_after_ms: response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, std::time::SystemTime::now())),
        regain_ms: regain_ms(response.headers()),
    };
    let body = match response.bytes().await {
        Ok(b) => b,
        Err(e) => {
            // Headers arrived but the body did not: Meta may have created the message; we cannot know its id.
            return MetaAnswer::Unknown {
                details: format!("body lost: {}", bw_common::error_chain(&e)),
                http_status: status,
            };
        }
    };
    answer_from(status, &body, hints)
}

/// What a complete HTTP answer means ([`classify::classify`]). Only Meta's own error body, or a status that says
/// the request was refused before processing (401, 403, 429, other 4xx), proves the message was not created. A
/// 2xx without a message id and a 5xx without Meta's body may come after Meta accepted it (meta-cloud-api.md
/// §2.2, §5): unknown outcome, reconciled through status webhooks, never resent blindly.
pub(crate) fn answer_from(status: u16, body: &[u8], hints: Hints) -> MetaAnswer {
    if (200..300).contains(&status) {
        if let Some((wamid, held)) = parse_wamid(body) {
            return MetaAnswer::Accepted { wamid, usage_percent: hints.usage_percent, http_status: status, held };
        }
        return MetaAnswer::Unknown { details: format!("{status} without a message id"), http_status: status };
    }
    let Hints { retry_after_ms, regain_ms, .. } = hints;
    match classify::parse_error_body(body) {
        Some(err) => {
            let code = err.code.unwrap_or_default();
            MetaAnswer::Rejected {
                meaning: classify::classify(Some(code), err.error_subcode, status, Channel::Sync),
                code,
                http_status: status,
                details: err.error_data.map(|d| d.details).filter(|d| !d.is_empty()).unwrap_or(err.message),
                fbtrace_id: err.fbtrace_id,
                retry_after_ms,
                regain_ms,
            }
        }
        None => {
            let meaning = classify::classify(None, None, status, Channel::Sync);
            let details = format!("HTTP {status} without a Meta error body");
            if meaning.retry == Retry::Ambiguous {
                return MetaAnswer::Unknown { details, http_status: status };
            }
            MetaAnswer::Rejected {
                meaning,
                code: 0,
                http_status: status,
                details,
                fbtrace_id: String::new(),
                retry_after_ms,
                regain_ms,
            }
        }
    }
}

impl MetaAnswer {
    /// For a refusal: how long Meta asks to wait, from the answer's own hints (the longer of `Retry-After` and
    /// `estimated_time_to_regain_access`; both say "not before"). None when it gave none.
    pub(crate) fn pause_hint_ms(&self) -> Option<u64> {
        match self {
            MetaAnswer::Rejected { retry_after_ms, regain_ms, .. } => match (retry_after_ms, regain_ms) {
                (Some(a), Some(b)) => Some((*a).max(*b)),
                (a, b) => a.or(*b),
            },
            _ => None,
        }
    }
}

/// The longest `estimated_time_to_regain_access` (minutes) of `X-Business-Use-Case-Usage`, in ms; None when the
/// header or the field is absent or every value is 0 (a 0 is "no wait", sent on ordinary answers too).
pub(crate) fn regain_ms(headers: &reqwest::header::HeaderMap) -> Option<u64> {
    let raw = headers.get("x-business-use-case-usage")?.to_str().ok()?;
    let serde_json::Value::Object(map) = serde_json::from_str::<serde_json::Value>(raw).ok()? else {
        return None;
    };
    map.values()
        .filter_map(|entries| entries.as_array())
        .flatten()
        .filter_map(|e| e.get("estimated_time_to_regain_access").and_then(|m| m.as_u64()))
        .max()
        .filter(|m| *m > 0)
        .map(|minutes| minutes.saturating_mul(60_000))
}

/// `Retry-After` as a wait in milliseconds: delta seconds, or an HTTP-date (a date in the past is no wait).
pub(crate) fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<u64> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(seconds.saturating_mul(1000));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).map(|d| d.as_millis() as u64).unwrap_or(0))
}

/// The wamid of an accepted answer, and whether Meta holds the message for its template's quality assessment.
/// `paused` is in Meta's enum without a description (§1): it is read as accepted, like `accepted`.
fn parse_wamid(body: &[u8]) -> Option<(String, bool)> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let message = v.get("messages")?.get(0)?;
    let wamid = message.get("id")?.as_str()?.to_string();
    let held = message.get("message_status").and_then(|s| s.as_str()) == Some("held_for_quality_assessment");
    Some((wamid, held))
}

/// Highest percentage in `X-Business-Use-Case-Usage` / `X-App-Usage`, if present.
fn usage_percent(headers: &reqwest::header::HeaderMap) -> Option<u32> {
    let mut max: Option<u32> = None;
    let mut consider = |v: &serde_json::Value| {
        for key in ["call_count", "total_cputime", "total_time"] {
            if let Some(n) = v.get(key).and_then(|n| n.as_u64()) {
                max = Some(max.unwrap_or(0).max(n as u32));
            }
        }
    };
    if let Some(raw) = headers.get("x-business-use-case-usage").and_then(|v| v.to_str().ok())
        && let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(raw)
    {
        for entries in map.values() {
            if let Some(list) = entries.as_array() {
                list.iter().for_each(&mut consider);
            }
        }
    }
    if let Some(raw) = headers.get("x-app-usage").and_then(|v| v.to_str().ok())
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(raw)
    {
        consider(&v);
    }
    max
}

/// The `/messages` JSON body for a request.
pub fn build_body(request: &SendRequest) -> serde_json::Value {
    let mut body = json!({
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "biz_opaque_callback_data": request.operation_id,
    });
    // A user id goes in `recipient` (reference §6); Meta then answers with `contacts[].user_id` and no `wa_id`.
    let field = if bw_common::mask::is_user_id(&request.recipient) { "recipient" } else { "to" };
    body[field] = json!(request.recipient);
    match &request.payload {
        Some(Payload::Text(text)) => {
            body["type"] = json!("text");
            body["text"] = json!({ "preview_url": text.preview_url, "body": text.body });
        }
        Some(Payload::Template(t)) => {
            let components = if t.components_json.is_empty() {
                if t.body_parameters.is_empty() {
                    json!([])
                } else {
                    let params: Vec<_> =
                        t.body_parameters.iter().map(|p| json!({ "type": "text", "text": p })).collect();
                    json!([{ "type": "body", "parameters": params }])
                }
            } else {
                serde_json::from_str(&t.components_json).unwrap_or_else(|_| json!([]))
            };
            body["type"] = json!("template");
            body["template"] = json!({ "name": t.name, "language": { "code": t.language }, "components": components });
        }
        None => {}
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_proto::v1::{TemplatePayload, TextPayload};

    #[test]
    fn bodies_match_meta_shapes() {
        let mut req = SendRequest {
            operation_id: "op-1".into(),
            recipient: "+5491155551234".into(),
            payload: Some(Payload::Text(TextPayload { body: "hola".into(), preview_url: false })),
            ..Default::default()
        };
        let text = build_body(&req);
        assert_eq!(text["type"], "text");
        assert_eq!(text["text"]["body"], "hola");
        assert_eq!(text["biz_opaque_callback_data"], "op-1");
        assert_eq!(text["messaging_product"], "whatsapp");
        assert_eq!(text["to"], "+5491155551234");
        assert!(text.get("recipient").is_none());
        let by_id = build_body(&SendRequest { recipient: "US.13491208655302741918".into(), ..req.clone() });
        assert_eq!(by_id["recipient"], "US.13491208655302741918");
        assert!(by_id.get("to").is_none(), "a user id never goes in `to`");
        req.payload = Some(Payload::Template(TemplatePayload {
            name: "order_confirmation".into(),
            language: "es_AR".into(),
            body_parameters: vec!["1234".into()],
            components_json: String::new(),
        }));
        let tpl = build_body(&req);
        assert_eq!(tpl["type"], "template");
        assert_eq!(tpl["template"]["language"]["code"], "es_AR");
        assert_eq!(tpl["template"]["components"][0]["parameters"][0]["text"], "1234");
    }

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_784_000_000);
        assert_eq!(parse_retry_after("30", now), Some(30_000));
        assert_eq!(parse_retry_after(" 0 ", now), Some(0));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(parse_retry_after(&later, now), Some(90_000));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(5));
        assert_eq!(parse_retry_after(&earlier, now), Some(0));
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn regain_access_hint_is_the_longest_estimate_in_ms() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(regain_ms(&h), None);
        h.insert(
            "x-business-use-case-usage",
            r#"{"102290129340398":[{"type":"whatsapp","call_count":100,"estimated_time_to_regain_access":0}]}"#
                .parse()
                .expect("header"),
        );
        assert_eq!(regain_ms(&h), None, "0 minutes is no wait");
        let two = concat!(
            r#"{"1":[{"type":"whatsapp_business_management","estimated_time_to_regain_access":7}],"#,
            r#""2":[{"type":"whatsapp","estimated_time_to_regain_access":3}]}"#
        );
        h.insert("x-business-use-case-usage", two.parse().expect("header"));
        assert_eq!(regain_ms(&h), Some(7 * 60_000));
        let answer = answer_from(
            429,
            br#"{"error":{"code":80007,"message":"(#80007) Rate limit issues"}}"#,
            Hints { retry_after_ms: Some(30_000), regain_ms: regain_ms(&h), usage_percent: None },
        );
        assert_eq!(answer.pause_hint_ms(), Some(7 * 60_000), "the longer of the two hints");
    }

    #[test]
    fn usage_headers_give_the_highest_percentage() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(
            "x-business-use-case-usage",
            r#"{"102290129340398":[{"type":"whatsapp","call_count":85,"total_cputime":3,"total_time":4,"estimated_time_to_regain_access":0}]}"#
                .parse()
                .expect("header"),
        );
        assert_eq!(usage_percent(&h), Some(85));
        h.insert("x-app-usage", r#"{"call_count":91,"total_time":25,"total_cputime":25}"#.parse().expect("header"));
        assert_eq!(usage_percent(&h), Some(91));
        assert_eq!(usage_percent(&reqwest::header::HeaderMap::new()), None);
    }
}
