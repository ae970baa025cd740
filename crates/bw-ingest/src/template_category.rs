//! Meta's category of a template at intake (meta-cloud-api.md §4.5, `template_category_update`): a template Meta
//! moved to MARKETING is accepted as marketing, on the marketing lane, whatever category its producer gave, and
//! its ledger entry (so the feed and the status query) says why. Read where the dispatcher reads it
//! (`bw_breaker::template_rules`, recorded by the coordinator), through the same one-second cache.
//!
//! Redis down or slow (past `redis.timeout_ms`): the producer's category stands, as before this check existed;
//! the dispatcher still sends the message under marketing rules once it can read the move.

use crate::metrics::Metrics;
use bw_breaker::template_rules::TemplateRules;
use bw_breaker::templates::ScopeKey;
use bw_proto::v1::{Category, SendRequest};
use std::time::Duration;

/// The template rules ingest reads at intake; absent when ingest runs without Redis.
pub(crate) struct TemplateCategory {
    pub rules: TemplateRules,
    /// Longest wait for a read; past it the request keeps its category.
    pub timeout: Duration,
}

impl TemplateCategory {
    pub(crate) fn new(redis: bw_breaker::RedisConn, timeout: Duration) -> TemplateCategory {
        TemplateCategory { rules: TemplateRules::new(redis), timeout }
    }

    /// The ledger reason when `request` (of `category`) becomes marketing because Meta moved its template to
    /// MARKETING; None when it keeps its category (not a template, already marketing, not moved, unreadable).
    pub(crate) async fn moved_to_marketing(
        &self,
        request: &SendRequest,
        category: Category,
        metrics: &Metrics,
    ) -> Option<String> {
        if category == Category::Marketing {
            return None;
        }
        let key = ScopeKey::template_of(request)?;
        match tokio::time::timeout(self.timeout, self.rules.read_cached(&key)).await {
            Ok(Ok(rules)) if rules.is_marketing() => {
                metrics.template_category("marketing");
                Some(moved_reason(&key, category))
            }
            Ok(Ok(_)) => None,
            Ok(Err(e)) => {
                metrics.template_category("unavailable");
                tracing::debug!(error = %e, "template rules unavailable at intake; the producer's category stands");
                None
            }
            Err(_) => {
                metrics.template_category("unavailable");
                tracing::debug!("template rules read timed out at intake; the producer's category stands");
                None
            }
        }
    }
}

/// What the producer reads in the feed: the template's scope key (WABA, language, name; no personal data), the
/// webhook that moved it and the category it asked for.
pub(crate) fn moved_reason(key: &ScopeKey, asked: Category) -> String {
    format!(
        "Meta moved template {key} to MARKETING (template_category_update): accepted as marketing, on the \
         marketing lane, instead of {}",
        asked.label()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_proto::v1::{TemplatePayload, send_request::Payload};

    #[test]
    fn the_reason_names_the_template_and_the_asked_category_only() {
        let request = SendRequest {
            waba_id: "102290129340398".into(),
            phone_number_id: "106540352242922".into(),
            recipient: "+5491175550123".into(),
            payload: Some(Payload::Template(TemplatePayload {
                name: "order_update".into(),
                language: "es_AR".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let key = ScopeKey::template_of(&request).expect("a template");
        let reason = moved_reason(&key, Category::Transactional);
        assert!(reason.contains("tpl:102290129340398:es_AR:order_update"), "{reason}");
        assert!(reason.contains("template_category_update") && reason.ends_with("instead of transactional"));
        assert!(!reason.contains("5491175550123"), "no recipient in {reason}");
    }
}
