//! DLQ and quarantine inspection: decoded entries, per-scope statistics, and masked one-line views that are
//! safe to print (recipient masked, bodies never shown, only their length).

use crate::OpsError;
use crate::scan::scan_stream;
use async_nats::jetstream;
use bw_common::mask;
use bw_proto::v1::{DlqEnvelope, DlqReason, QuarantineEntry, QuarantineReason, SendRequest, send_request};
use bw_wire::names;
use bw_wire::names::phone_of_subject;
use prost::Message;
use std::collections::BTreeMap;

/// One decoded DLQ message.
#[derive(Debug, Clone)]
pub struct DlqItem {
    pub sequence: u64,
    pub subject: String,
    pub envelope: DlqEnvelope,
}

/// One decoded quarantine message.
#[derive(Debug, Clone)]
pub struct QuarantineItem {
    pub sequence: u64,
    pub subject: String,
    pub entry: QuarantineEntry,
}

/// A message that did not decode as the stream's envelope type.
#[derive(Debug, Clone)]
pub struct Undecodable {
    pub stream: String,
    pub sequence: u64,
    pub subject: String,
    pub len: usize,
}

fn filter(domain: fn(&str) -> String, scope: Option<&str>) -> String {
    domain(scope.unwrap_or("*"))
}

/// Every DLQ entry (of one scope: its partition only; or of every partition), read without consuming anything.
pub async fn dlq_items(
    js: &jetstream::Context,
    send: names::SendPartitions,
    scope: Option<&str>,
) -> Result<(Vec<DlqItem>, Vec<Undecodable>), OpsError> {
    let mut messages = Vec::new();
    match scope {
        Some(phone) => messages = scan_stream(js, &send.dlq_stream_of(phone), &send.dlq_scope_filter(phone)).await?,
        None => {
            for (p, stream) in send.dlq_streams().enumerate() {
                messages.extend(scan_stream(js, &stream, &names::SendPartitions::dlq_all(p)).await?);
            }
        }
    }
    let mut items = Vec::with_capacity(messages.len());
    let mut bad = Vec::new();
    for m in messages {
        match DlqEnvelope::decode(m.payload.as_ref()) {
            Ok(envelope) if envelope.request.is_some() => {
                items.push(DlqItem { sequence: m.sequence, subject: m.subject.to_string(), envelope })
            }
            _ => bad.push(Undecodable {
                stream: names::SendPartitions::dlq_stream_of_subject(&m.subject),
                sequence: m.sequence,
                subject: m.subject.to_string(),
                len: m.payload.len(),
            }),
        }
    }
    Ok((items, bad))
}

/// Every quarantine entry (of one scope, or all), read without consuming anything.
pub async fn quarantine_items(
    js: &jetstream::Context,
    scope: Option<&str>,
) -> Result<(Vec<QuarantineItem>, Vec<Undecodable>), OpsError> {
    let messages = scan_stream(js, names::QUARANTINE_STREAM, &filter(names::quarantine_subject, scope)).await?;
    let mut items = Vec::with_capacity(messages.len());
    let mut bad = Vec::new();
    for m in messages {
        let undecodable_marker = m.headers.get(bw_wire::names::UNDECODABLE_HEADER).is_some();
        match QuarantineEntry::decode(m.payload.as_ref()) {
            Ok(entry) if entry.request.is_some() && !undecodable_marker => {
                items.push(QuarantineItem { sequence: m.sequence, subject: m.subject.to_string(), entry })
            }
            _ => bad.push(Undecodable {
                stream: names::QUARANTINE_STREAM.into(),
                sequence: m.sequence,
                subject: m.subject.to_string(),
                len: m.payload.len(),
            }),
        }
    }
    Ok((items, bad))
}

/// Depth, oldest entry and reasons of one scope's queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueStats {
    pub scope: String,
    pub depth: u64,
    /// When the oldest entry got there, Unix ms (0 if unknown).
    pub oldest_at_unix_ms: i64,
    /// Entry count per reason label.
    pub reasons: BTreeMap<String, u64>,
}

impl QueueStats {
    /// Age of the oldest entry at `now_ms`, milliseconds.
    pub fn oldest_age_ms(&self, now_ms: i64) -> i64 {
        if self.oldest_at_unix_ms <= 0 { 0 } else { (now_ms - self.oldest_at_unix_ms).max(0) }
    }
}

fn add(stats: &mut BTreeMap<String, QueueStats>, scope: &str, at_ms: i64, reason: &str) {
    let s =
        stats.entry(scope.to_string()).or_insert_with(|| QueueStats { scope: scope.to_string(), ..Default::default() });
    s.depth += 1;
    if at_ms > 0 && (s.oldest_at_unix_ms == 0 || at_ms < s.oldest_at_unix_ms) {
        s.oldest_at_unix_ms = at_ms;
    }
    *s.reasons.entry(reason.to_string()).or_default() += 1;
}

/// Per-scope statistics of DLQ entries.
pub fn dlq_stats(items: &[DlqItem]) -> Vec<QueueStats> {
    let mut stats = BTreeMap::new();
    for item in items {
        let at = item.envelope.dead_lettered_at_unix_ms;
        add(&mut stats, phone_of_subject(&item.subject), at, dlq_reason_label(item.envelope.reason()));
    }
    stats.into_values().collect()
}

/// Per-scope statistics of quarantine entries.
pub fn quarantine_stats(items: &[QuarantineItem]) -> Vec<QueueStats> {
    let mut stats = BTreeMap::new();
    for item in items {
        let at = item.entry.quarantined_at_unix_ms;
        add(&mut stats, phone_of_subject(&item.subject), at, quarantine_reason_label(item.entry.reason()));
    }
    stats.into_values().collect()
}

/// Short lowercase name of a DLQ reason.
pub fn dlq_reason_label(reason: DlqReason) -> &'static str {
    reason.label()
}

/// Short lowercase name of a quarantine reason.
pub fn quarantine_reason_label(reason: QuarantineReason) -> &'static str {
    match reason {
        QuarantineReason::Unspecified => "unspecified",
        QuarantineReason::PermanentError => "permanent_error",
        QuarantineReason::Poison => "poison",
        QuarantineReason::UnknownReview => "unknown_review",
        QuarantineReason::WindowClosed => "window_closed",
        QuarantineReason::Operator => "operator",
        QuarantineReason::SenderRevoked => "sender_revoked",
        QuarantineReason::TemplateHeld => "template_held",
        QuarantineReason::Unclassified => "unclassified",
    }
}

/// Parses a quarantine reason label (as printed by [`quarantine_reason_label`]).
pub fn parse_quarantine_reason(label: &str) -> Option<QuarantineReason> {
    [
        QuarantineReason::PermanentError,
        QuarantineReason::Poison,
        QuarantineReason::UnknownReview,
        QuarantineReason::WindowClosed,
        QuarantineReason::Operator,
        QuarantineReason::SenderRevoked,
        QuarantineReason::TemplateHeld,
        QuarantineReason::Unclassified,
        QuarantineReason::Unspecified,
    ]
    .into_iter()
    .find(|r| quarantine_reason_label(*r) == label)
}

/// A request with personal data masked: what an operator may see.
#[derive(Debug, Clone, PartialEq)]
pub struct MaskedRequest {
    pub operation_id: String,
    pub phone_number_id: String,
    pub recipient: String,
    pub category: &'static str,
    /// `text <n chars>` or `template <name>/<language> (<n> params)`.
    pub payload: String,
    pub deadline_unix_ms: i64,
    pub attempts: usize,
}

/// Masks a request: recipient via [`mask::phone`], text bodies reduced to their length.
pub fn masked(request: &SendRequest) -> MaskedRequest {
    let payload = match &request.payload {
        Some(send_request::Payload::Text(t)) => format!("text {}", mask::body(&t.body)),
        Some(send_request::Payload::Template(t)) => {
            format!("template {}/{} ({} params)", t.name, t.language, t.body_parameters.len())
        }
        None => "none".to_string(),
    };
    MaskedRequest {
        operation_id: request.operation_id.clone(),
        phone_number_id: request.phone_number_id.clone(),
        recipient: mask::phone(&request.recipient),
        category: request.category().label(),
        payload,
        deadline_unix_ms: request.deadline_unix_ms,
        attempts: request.attempts.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_proto::v1::TextPayload;

    #[test]
    fn masked_view_hides_recipient_and_body() {
        let req = SendRequest {
            operation_id: "op-1".into(),
            phone_number_id: "1001".into(),
            recipient: "+5491155551234".into(),
            payload: Some(send_request::Payload::Text(TextPayload {
                body: "secret code 1234".into(),
                preview_url: false,
            })),
            ..Default::default()
        };
        let m = masked(&req);
        let shown = format!("{m:?}");
        assert!(!shown.contains("5491155551234"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
        assert_eq!(m.payload, "text <16 chars>");
    }

    #[test]
    fn stats_count_depth_oldest_and_reasons() {
        let item = |phone: &str, at: i64, reason: DlqReason| DlqItem {
            sequence: 1,
            subject: names::dlq_subject(bw_proto::v1::Category::Marketing, phone),
            envelope: DlqEnvelope { reason: reason as i32, dead_lettered_at_unix_ms: at, ..Default::default() },
        };
        let stats = dlq_stats(&[
            item("1", 500, DlqReason::BreakerOpen),
            item("1", 300, DlqReason::BreakerOpen),
            item("1", 400, DlqReason::RetriesExhausted),
            item("2", 900, DlqReason::Credentials),
        ]);
        assert_eq!(stats.len(), 2);
        assert_eq!(stats[0].scope, "1");
        assert_eq!(stats[0].depth, 3);
        assert_eq!(stats[0].oldest_at_unix_ms, 300);
        assert_eq!(stats[0].reasons.get("breaker_open"), Some(&2));
        assert_eq!(stats[0].oldest_age_ms(1_300), 1_000);
        assert_eq!(parse_quarantine_reason("poison"), Some(QuarantineReason::Poison));
        assert_eq!(parse_quarantine_reason("nope"), None);
    }
}
