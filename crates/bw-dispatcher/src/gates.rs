//! Gates of a message's scope beyond its sender (issue #40 items 5 and 7): quarantine scopes and marketing to
//! one recipient.
//!
//! Before a send ([`Worker::gate`]):
//! - a marketing template to a country Meta does not deliver marketing to (`dispatch.marketing_undeliverable`,
//!   by default "+1", the US) ends FAILED unsent, and is never replayed;
//! - marketing to a recipient the tenant's 131050 / 130472 suppression covers ends FAILED unsent;
//! - marketing to a recipient in its 131049 cool-off (any sender of the tenant) waits in the DLQ
//!   (`recipient_deferred`) until the cool-off ends, out of its recipient's order chain, so later non-marketing
//!   messages to the recipient are not held behind it;
//! - a message of a held template goes to the quarantine unsent (`template_held`, with the scope key), while
//!   other templates flow.
//!
//! After Meta's answer ([`Worker::quarantine_scoped`], [`Worker::note_marketing_answer`]): a template code
//! (132001, 132007, 132015, 132016) holds the template and quarantines the message under the template's scope;
//! an unclassified code quarantines it under the code's scope (never the DLQ, so replay cannot loop on it);
//! 131049 starts the recipient's cool-off, 131050 / 130472 its suppression.
//!
//! Redis unreachable: the gates let the message through (Meta's answer then holds it as above); the breaker's
//! own degraded mode already slows the sender.

use crate::meta::MetaAnswer;
use crate::process::{Work, Worker};
use bw_breaker::recipient::RecipientMarketing;
use bw_breaker::templates::{ScopeKey, TemplateHolds};
use bw_common::classify::{Only, PauseScope, RateScope};
use bw_common::proto::{Category, DlqReason, ErrorInfo, QuarantineReason, send_request::Payload};
use bw_common::time::now_ms;

/// The Redis side of the gates (absent without Redis: every gate passes).
#[derive(Clone, Default)]
pub(crate) struct Gates {
    pub holds: Option<TemplateHolds>,
    pub marketing: Option<RecipientMarketing>,
}

impl Gates {
    pub(crate) fn new(redis: Option<bw_breaker::RedisConn>) -> Gates {
        Gates { holds: redis.clone().map(TemplateHolds::new), marketing: redis.map(RecipientMarketing::new) }
    }
}

fn is_marketing_template(w: &Work) -> bool {
    w.request.category() == Category::Marketing && matches!(w.request.payload, Some(Payload::Template(_)))
}

/// The first configured prefix the recipient starts with, if any (compared on the E.164 form, `+` and digits).
pub(crate) fn undeliverable_prefix<'a>(recipient: &str, prefixes: &'a [String]) -> Option<&'a str> {
    prefixes.iter().map(String::as_str).find(|p| !p.is_empty() && recipient.starts_with(p))
}

fn tenant_of(w: &Work) -> &str {
    bw_common::tenancy::split_operation_key(&w.request.operation_id).0
}

impl Worker {
    /// The gates before a send. Returns the message when it may go on; otherwise it has been moved (failed,
    /// dead-lettered or quarantined) and settled.
    pub(crate) async fn gate(&self, w: Work) -> Option<Work> {
        if w.request.category() == Category::Marketing {
            if is_marketing_template(&w)
                && let Some(prefix) = undeliverable_prefix(&w.request.recipient, &self.cfg.marketing_undeliverable)
            {
                let reason = format!(
                    "marketing template to a {prefix} number: Meta does not deliver marketing templates there \
                     (dispatch.marketing_undeliverable); failed without sending"
                );
                tracing::info!(parent: &w.span, prefix, "marketing to an undeliverable country; failed fast");
                self.fail_unsent(w, reason).await;
                return None;
            }
            if let Some(marketing) = &self.gates.marketing {
                let rk = bw_common::mask::recipient_key(&w.request.recipient);
                let state = marketing.read(tenant_of(&w), &rk).await;
                match state {
                    Ok(s) if s.suppressed_code != 0 => {
                        let reason = format!(
                            "the recipient refuses marketing from this business (Meta code {}); failed without \
                             sending (non-marketing messages still go)",
                            s.suppressed_code
                        );
                        self.fail_unsent(w, reason).await;
                        return None;
                    }
                    Ok(s) if s.deferred_for_ms() > 0 => {
                        // Meta extends its block on a retry inside the cool-off: wait it out in the DLQ, out of
                        // the recipient's order chain (dead_letter releases it for this reason).
                        let err = ErrorInfo {
                            details: "marketing to this recipient cools off after 131049 (any sender of the tenant)"
                                .into(),
                            meta_code: 131049,
                            at_unix_ms: now_ms(),
                            ..Default::default()
                        };
                        self.dead_letter(w, DlqReason::RecipientDeferred, "", err, s.deferred_for_ms()).await;
                        return None;
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(parent: &w.span, error = %e, "recipient state unavailable; sending"),
                }
            }
        }
        if let (Some(holds), Some(key)) = (&self.gates.holds, ScopeKey::template_of(&w.request)) {
            match holds.read_cached(&key).await {
                Ok(Some(hold)) => {
                    let detail = held_detail(&key, hold.code);
                    let code = hold.code;
                    tracing::info!(parent: &w.span, scope = %key, code, "template held; quarantined unsent");
                    self.metrics.quarantine_held(&key.to_string(), hold.code);
                    self.quarantine_unsent_scoped(w, QuarantineReason::TemplateHeld, detail, key.to_string()).await;
                    return None;
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(parent: &w.span, error = %e, "template hold unavailable; sending"),
            }
        }
        Some(w)
    }

    /// Meta refused with a code whose messages are held by scope: hold the template (when it is one) and
    /// quarantine the message under its scope key, with a `quarantine_scope` signal naming the scope.
    pub(crate) async fn quarantine_scoped(
        &self,
        w: Work,
        reason: QuarantineReason,
        err: ErrorInfo,
        answer: &MetaAnswer,
    ) {
        let MetaAnswer::Rejected { meaning, code, .. } = answer else {
            self.to_quarantine(w, reason, err).await;
            return;
        };
        let key = ScopeKey::of(&w.request, *code, meaning.scope == PauseScope::Template);
        if key.is_template()
            && let Some(holds) = &self.gates.holds
        {
            let ms = meaning.pause_ms(None).unwrap_or(0);
            if let Err(e) = holds.hold(&key, *code, ms).await {
                // The message is quarantined anyway; the next one of the template is refused by Meta and held.
                tracing::warn!(parent: &w.span, scope = %key, error = %e, "template hold not recorded");
            }
        }
        let detail = held_detail(&key, *code);
        self.metrics.quarantine_held(&key.to_string(), *code);
        let signal_err = ErrorInfo { details: detail.clone(), ..err.clone() };
        self.signal("quarantine_scope", &w, &signal_err).await;
        self.to_quarantine_scoped(w, reason, err, key.to_string(), detail).await;
    }

    /// What a marketing-only recipient code teaches the tenant: 131049 starts the recipient's cool-off (every
    /// sender of the tenant), 131050 / 130472 suppress marketing to the recipient.
    pub(crate) async fn note_marketing_answer(&self, w: &Work, answer: &MetaAnswer) {
        let (Some(marketing), MetaAnswer::Rejected { meaning, code, retry_after_ms, .. }) =
            (&self.gates.marketing, answer)
        else {
            return;
        };
        if meaning.only != Only::Marketing || meaning.scope != PauseScope::Recipient {
            return;
        }
        let rk = bw_common::mask::recipient_key(&w.request.recipient);
        let tenant = tenant_of(w);
        let recorded = if *code == 131049 {
            let ms = retry_after_ms.unwrap_or(0).max(RateScope::Recipient.default_pause_ms());
            marketing.defer(tenant, &rk, *code, ms).await
        } else {
            marketing.suppress(tenant, &rk, *code).await
        };
        if let Err(e) = recorded {
            tracing::warn!(parent: &w.span, code, error = %e, "recipient marketing state not recorded");
        }
    }
}

/// What the producer's feed and the operator see for a held message: the scope, never a phone number.
pub(crate) fn held_detail(key: &ScopeKey, code: i64) -> String {
    match key {
        ScopeKey::Template { name, language, .. } => format!(
            "held in quarantine scope {key}: Meta refused template {name} ({language}) with code {code}; waits \
             for the template to be released"
        ),
        ScopeKey::Code(_) => {
            format!(
                "held in quarantine scope {key}: Meta answered code {code}, which Breakwater does not know; \
                     waits for an operator"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undeliverable_prefixes_match_the_e164_start_only() {
        let us = vec!["+1".to_string()];
        assert_eq!(undeliverable_prefix("+15551234567", &us), Some("+1"));
        assert_eq!(undeliverable_prefix("+5491155551234", &us), None);
        assert_eq!(undeliverable_prefix("+44123451", &us), None, "a 1 later in the number does not match");
        assert_eq!(undeliverable_prefix("+15551234567", &[String::new()]), None, "an empty entry matches nothing");
        assert_eq!(undeliverable_prefix("+15551234567", &[]), None);
        let default = vec!["+1".to_string(), "US.".to_string()];
        assert_eq!(undeliverable_prefix("US.13491208655302741918", &default), Some("US."));
        assert_eq!(undeliverable_prefix("US.ENT.11815799212886844830", &default), Some("US."));
        assert_eq!(undeliverable_prefix("BR.13491208655302741918", &default), None);
    }

    #[test]
    fn held_details_name_the_scope_and_code_never_a_number() {
        let key = ScopeKey::Template { waba_id: "100".into(), language: "en_US".into(), name: "promo".into() };
        let d = held_detail(&key, 132015);
        assert!(d.contains("tpl:100:en_US:promo") && d.contains("132015"), "{d}");
        assert!(held_detail(&ScopeKey::Code(424242), 424242).contains("code:424242"));
    }
}
