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
//!   other templates flow;
//! - first of all, a template Meta moved to MARKETING (`template_category_update`) is sent as marketing whatever
//!   category its producer gave (the gates above, and admission's marketing class), and a marketing send of a
//!   template whose quality is RED takes a slot of the template's fleet-wide pace or goes back to the broker
//!   until its slot (`bw_breaker::template_rules`).
//! - last, a template that would pass its business portfolio's messaging limit is held (`budget.rs`).
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
use bw_breaker::template_rules::TemplateRules;
use bw_breaker::templates::{ScopeKey, TemplateHolds};
use bw_common::classify::{Only, PauseScope, RateScope};
use bw_common::proto::{Category, DlqReason, ErrorInfo, QuarantineReason, send_request::Payload};
use bw_common::time::now_ms;

/// The Redis side of the gates (absent without Redis: every gate passes).
#[derive(Clone, Default)]
pub(crate) struct Gates {
    pub holds: Option<TemplateHolds>,
    pub marketing: Option<RecipientMarketing>,
    /// The portfolio messaging-limit budget (`budget.rs`); absent when off or without Redis.
    pub budget: Option<std::sync::Arc<crate::budget::Budget>>,
    /// Template category moves and RED paces (`bw_breaker::template_rules`); absent without Redis.
    pub rules: Option<TemplateRules>,
}

impl Gates {
    pub(crate) fn new(redis: Option<bw_breaker::RedisConn>) -> Gates {
        Gates {
            holds: redis.clone().map(TemplateHolds::new),
            rules: redis.clone().map(TemplateRules::new),
            marketing: redis.map(RecipientMarketing::new),
            budget: None,
        }
    }

    pub(crate) fn with_budget(mut self, budget: Option<crate::budget::Budget>) -> Gates {
        self.budget = budget.map(std::sync::Arc::new);
        self
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
        let w = self.template_rules(w).await?;
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
        // Last: only a message every other gate lets through spends the portfolio's budget.
        self.budget_gate(w).await
    }

    /// Meta's category and quality of the message's template: MARKETING makes it a marketing send; RED paces its
    /// marketing (over the pace it goes back to the broker until its slot, unsent and not failed).
    async fn template_rules(&self, mut w: Work) -> Option<Work> {
        let (Some(rules), Some(key)) = (&self.gates.rules, ScopeKey::template_of(&w.request)) else { return Some(w) };
        let r = match rules.read_cached(&key).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(parent: &w.span, error = %e, "template rules unavailable; sending");
                return Some(w);
            }
        };
        if r.is_marketing() && w.request.category() != Category::Marketing {
            tracing::info!(parent: &w.span, scope = %key, "Meta moved the template to MARKETING; sent as marketing");
            w.request.set_category(Category::Marketing);
        }
        if r.is_red() && w.request.category() == Category::Marketing {
            match rules.take(&key).await {
                Ok(0) => {}
                Ok(wait_ms) => {
                    let err = ErrorInfo {
                        details: format!(
                            "template scope {key} has quality RED: its marketing goes at {}/min fleet-wide",
                            r.red_per_min
                        ),
                        at_unix_ms: now_ms(),
                        ..Default::default()
                    };
                    self.held_back(w, std::time::Duration::from_millis(wait_ms), err).await;
                    return None;
                }
                Err(e) => tracing::debug!(parent: &w.span, error = %e, "template pace unavailable; sending"),
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

/// The ledger reason of a message Meta accepted and holds for its template's quality assessment (template pacing,
/// `message_status: held_for_quality_assessment`, meta-cloud-api.md §3.5): not failed and never resent; Meta
/// releases it (sent, delivered follow) or drops it (failed 132015, when the template is paused: then a new
/// attempt waits in the template's quarantine scope).
pub(crate) const HELD_FOR_QUALITY_REASON: &str = "held_for_quality_assessment: Meta holds it while the template's \
     quality is assessed (pacing); not failed, never resent; a status webhook moves it on";

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
