//! Meta webhook bodies: signature check over the raw bytes and parsing of the envelope into the items ingest
//! acts on (statuses, inbound messages, value-level errors). Pure functions, no I/O.
//!
//! Envelope (meta-cloud-api.md §4.4): `{"object":"whatsapp_business_account","entry":[{"id":"<WABA_ID>",
//! "changes":[{"field":"messages","value":{"metadata":{"phone_number_id":..},"statuses":[..],"messages":[..],
//! "errors":[..]}}]}]}`. Unknown fields are ignored, so new Meta fields never break parsing; the changes of
//! other fields (and value-level errors again, as typed signals) are read by `crate::signals`.

use bw_proto::v1::{DeliveryStatus, InboundMessage, StatusUpdate};
use hmac::{KeyInit, Mac};
use serde::Deserialize;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Checks `X-Hub-Signature-256: sha256=<hex>` against HMAC-SHA256 of `body` keyed with `app_secret`, in
/// constant time. False for a missing prefix, bad hex, a wrong length or an empty secret.
pub fn signature_valid(app_secret: &[u8], body: &[u8], header: Option<&str>) -> bool {
    if app_secret.is_empty() {
        return false;
    }
    let Some(hex_sig) = header.and_then(|h| h.trim().strip_prefix("sha256=")) else {
        return false;
    };
    let Ok(expected) = hex::decode(hex_sig) else {
        return false;
    };
    let Ok(mut mac) = HmacSha256::new_from_slice(app_secret) else {
        return false;
    };
    mac.update(body);
    // verify_slice compares in constant time and refuses a wrong length.
    mac.verify_slice(&expected).is_ok()
}

/// The header value Meta would send for `body` (used by tests, the benchmark and the simulator).
pub fn sign(app_secret: &[u8], body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(app_secret).expect("hmac accepts keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Hex sha256 of a body: the JetStream message id of a stored delivery.
pub fn body_sha256(body: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(body))
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    object: String,
    #[serde(default)]
    entry: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    id: String,
    #[serde(default)]
    changes: Vec<Change>,
}

#[derive(Deserialize)]
struct Change {
    #[serde(default)]
    field: String,
    #[serde(default)]
    value: Option<Value>,
}

#[derive(Deserialize)]
struct Value {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    statuses: Vec<RawStatus>,
    #[serde(default)]
    messages: Vec<serde_json::Value>,
    #[serde(default)]
    errors: Vec<RawError>,
}

#[derive(Deserialize, Default)]
struct Metadata {
    #[serde(default)]
    phone_number_id: String,
}

#[derive(Deserialize)]
struct RawStatus {
    #[serde(default)]
    id: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    timestamp: serde_json::Value,
    #[serde(default)]
    biz_opaque_callback_data: String,
    #[serde(default)]
    errors: Vec<RawError>,
}

#[derive(Deserialize, Clone)]
struct RawError {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    title: String,
}

/// A value-level error (system, app or account), not tied to one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    pub waba_id: String,
    pub phone_number_id: String,
    pub code: i64,
    pub title: String,
}

/// Everything ingest acts on in one delivery, in document order.
#[derive(Debug, Default)]
pub struct Parsed {
    pub statuses: Vec<StatusUpdate>,
    /// Statuses whose status word was not recognised (counted, ignored).
    pub unknown_statuses: usize,
    pub inbound: Vec<InboundMessage>,
    pub errors: Vec<ValueError>,
    /// Changes of other fields (account, template, user signals...): parsed by `crate::signals`, not here.
    pub ignored_changes: usize,
}

/// Why a body could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("webhook body is not valid json: {0}")]
    Json(String),
    #[error("webhook object `{0}` is not whatsapp_business_account")]
    Object(String),
}

/// Maps Meta's status word.
pub fn delivery_status(word: &str) -> DeliveryStatus {
    match word {
        "sent" => DeliveryStatus::Sent,
        "delivered" => DeliveryStatus::Delivered,
        "read" => DeliveryStatus::Read,
        "failed" => DeliveryStatus::Failed,
        "played" => DeliveryStatus::Played,
        _ => DeliveryStatus::Unspecified,
    }
}

/// Meta sends timestamps as strings of seconds; accept numbers too.
fn seconds(v: &serde_json::Value) -> i64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        serde_json::Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// Parses a webhook body.
pub fn parse(body: &[u8]) -> Result<Parsed, ParseError> {
    // serde quotes the offending value ("invalid type: string \"16505551234\""): scrubbed, as it is logged and kept.
    let envelope: Envelope = serde_json::from_slice(body).map_err(|e| ParseError::Json(scrub(&e.to_string())))?;
    if envelope.object != "whatsapp_business_account" {
        return Err(ParseError::Object(envelope.object.chars().take(64).collect()));
    }
    let mut out = Parsed::default();
    for entry in envelope.entry {
        for change in entry.changes {
            let Some(value) = change.value.filter(|_| change.field == "messages") else {
                out.ignored_changes += 1;
                continue;
            };
            let phone = value.metadata.phone_number_id;
            for s in value.statuses {
                let status = delivery_status(&s.status);
                if status == DeliveryStatus::Unspecified || s.id.is_empty() {
                    out.unknown_statuses += 1;
                    continue;
                }
                let first_error = s.errors.first().cloned();
                out.statuses.push(StatusUpdate {
                    wamid: s.id,
                    status: status as i32,
                    timestamp_unix_s: seconds(&s.timestamp),
                    operation_id: s.biz_opaque_callback_data,
                    phone_number_id: phone.clone(),
                    error_code: first_error.as_ref().map(|e| e.code).unwrap_or(0),
                    error_title: first_error.map(|e| e.title).unwrap_or_default(),
                });
            }
            for m in value.messages {
                let text = |key: &str| m.get(key).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                out.inbound.push(InboundMessage {
                    waba_id: entry.id.clone(),
                    phone_number_id: phone.clone(),
                    wamid: text("id"),
                    from: text("from"),
                    timestamp_unix_s: m.get("timestamp").map(seconds).unwrap_or(0),
                    r#type: text("type"),
                    message_json: m.to_string(),
                    from_user_id: text("from_user_id"),
                });
            }
            for e in value.errors {
                out.errors.push(ValueError {
                    waba_id: entry.id.clone(),
                    phone_number_id: phone.clone(),
                    code: e.code,
                    title: e.title,
                });
            }
        }
    }
    Ok(out)
}

/// Dedup key of a status delivery: hex sha256 of `wamid|status` (wamids hold characters KV keys refuse).
pub fn status_dedup_key(wamid: &str, status: DeliveryStatus) -> String {
    format!("st.{}", body_sha256(format!("{wamid}|{}", status.as_str_name()).as_bytes()))
}

/// Dedup key of an inbound message.
pub fn inbound_dedup_key(wamid: &str) -> String {
    format!("in.{}", body_sha256(wamid.as_bytes()))
}

/// Meta's documented example payloads (meta-cloud-api.md §4.4), for tests, benchmarks and the simulator.
pub mod examples {
    /// Meta's documented "sent" status webhook (v21 shape, with conversation and pricing).
    pub const STATUS_SENT: &str = r#"{
      "object": "whatsapp_business_account",
      "entry": [{
        "id": "102290129340398",
        "changes": [{
          "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922"},
            "statuses": [{
              "id": "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJDQjZCMzlEQUE4OTJBMTE4RTUA",
              "status": "sent",
              "timestamp": "1750030073",
              "recipient_id": "16505551234",
              "biz_opaque_callback_data": "order-42",
              "conversation": {"id": "5b4d8d2f0c4c1a2b3c", "expiration_timestamp": "1750116480",
                               "origin": {"type": "utility"}},
              "pricing": {"billable": true, "pricing_model": "PMP", "type": "regular", "category": "utility"}
            }]
          },
          "field": "messages"
        }]
      }]
    }"#;

    /// Meta's documented inbound text message webhook.
    pub const INBOUND_TEXT: &str = r#"{
      "object": "whatsapp_business_account",
      "entry": [{
        "id": "102290129340398",
        "changes": [{
          "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922"},
            "contacts": [{"profile": {"name": "Sheena Nelson"}, "wa_id": "16505551234"}],
            "messages": [{
              "from": "16505551234",
              "id": "wamid.HBgLMTY1MDUwNzY1MjAVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=",
              "timestamp": "1749416383",
              "type": "text",
              "text": {"body": "Does it come in another color?"}
            }]
          },
          "field": "messages"
        }]
      }]
    }"#;

    /// Meta's documented failed status webhook (no contacts, errors array).
    pub const STATUS_FAILED: &str = r#"{
      "object": "whatsapp_business_account",
      "entry": [{
        "id": "102290129340398",
        "changes": [{
          "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550783881", "phone_number_id": "106540352242922"},
            "statuses": [{
              "id": "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJBQkNERUYA",
              "status": "failed",
              "timestamp": "1750263773",
              "recipient_id": "16505551234",
              "errors": [{
                "code": 131049,
                "title": "This message was not delivered to maintain healthy ecosystem engagement.",
                "message": "This message was not delivered to maintain healthy ecosystem engagement.",
                "error_data": {"details": "In order to maintain a healthy ecosystem engagement, the message failed to be delivered."},
                "href": "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/"
              }]
            }]
          },
          "field": "messages"
        }]
      }]
    }"#;
}

/// Free text kept from Meta, at most.
const TEXT_CHARS: usize = 200;

/// Free text from Meta, cut to [`TEXT_CHARS`], every run of 7 or more digits (a phone number, perhaps) replaced
/// by `<digits>`.
pub fn scrub(text: &str) -> String {
    let cut: String = text.chars().take(TEXT_CHARS).collect();
    bw_common::mask::digit_runs(&cut, 7, |run| if run.starts_with('+') { "+<digits>" } else { "<digits>" }.into())
}

#[cfg(test)]
mod tests;
