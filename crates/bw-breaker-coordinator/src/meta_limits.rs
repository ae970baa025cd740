//! Meta's signals about how fast a number or a template may send (meta-cloud-api.md §3.1, §3.5, §4.5), applied
//! to the limiter's state:
//!
//! - `phone_number_quality_update` `THROUGHPUT_UPGRADE`: the number's stated limit becomes 1,000 messages per
//!   second in its throughput hash (`bw_breaker::throughput`), which every dispatcher's admission reads; the
//!   number then sends at 1,000 x `throughput_margin` (925 at the default), never above 1,000. Meta names the
//!   number only by `display_phone_number` (reference §4.5), a phone number Breakwater keeps nowhere (ingest
//!   drops it, the registry is keyed by `phone_number_id`): the signal's `phone_number_id` when ingest found one,
//!   else the WABA's only known number. A WABA with several numbers and no id is not guessed at (a wrong guess
//!   would send another number at 12 times its limit): the operator alert lists the WABA's numbers and the exact
//!   call that records the upgrade for one of them, `POST /admin/throughput/{phone_number_id}` (`admin.rs`).
//!   `ONBOARDING` and the legacy events change nothing (since October 2025 quality no longer moves throughput).
//! - `message_template_quality_update` RED paces the template's marketing fleet-wide at [`RED_MARKETING_PER_MIN`]
//!   sends per minute (`bw_breaker::template_rules`); GREEN, YELLOW or UNKNOWN ends the pace. The reference says
//!   "slow or stop that template's campaigns: a pause is next"; the safe reading taken is a pace so slow it is
//!   nearly a stop (a 50,000-message campaign would take two weeks) that still lets some messages prove the
//!   template, and an operator alert.
//! - `template_category_update` that changes the category (not the 24 h notice, which only alerts) records Meta's
//!   new category: a template moved to MARKETING is sent under marketing rules whatever its producer said
//!   (admission's marketing class, the 131049 cool-off, 131050 suppression, `marketing_undeliverable`).
//! - `smb_message_echoes` (a coexistence business's own message from the WhatsApp Business app) takes a slot of
//!   the pair's rate and a token of the number's throughput, as a send of Breakwater's would: Meta's pair and
//!   throughput limits count it too. An echo opens no customer service window (the user did not write).

use crate::coordinator::Coordinator;
use bw_breaker::Scope;
use bw_breaker::template_rules::TemplateRules;
use bw_breaker::templates::ScopeKey;
use bw_breaker::throughput::Throughput;
use bw_proto::v1::AccountSignal;
use bw_proto::v1::account_signal::Kind;
use std::time::Duration;

/// Sends per minute of a RED template's marketing, fleet-wide.
pub const RED_MARKETING_PER_MIN: u32 = 6;

/// One step a rate or template signal asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Record Meta's stated throughput of a number (`phone_number_id` empty: resolve it within the WABA).
    Throughput { phone_number_id: String, mps: u32, event: String },
    /// Record a template's quality (RED paces its marketing).
    TemplateQuality { key: ScopeKey, quality: String },
    /// Record a template's new category.
    TemplateCategory { key: ScopeKey, category: String, previous: String },
    /// Alert only (a category change announced for later).
    Notice { detail: String },
    /// A coexistence number's own message to a user: count it on the pair and the number.
    Echo { phone_number_id: String, recipient_key_hash: String },
}

fn template_key(waba_id: &str, language: &str, name: &str) -> Option<ScopeKey> {
    (!waba_id.is_empty() && !language.is_empty() && !name.is_empty()).then(|| ScopeKey::Template {
        waba_id: waba_id.into(),
        language: language.into(),
        name: name.into(),
    })
}

/// The steps of one signal. Pure.
pub fn steps(s: &AccountSignal) -> Vec<Step> {
    match &s.kind {
        Some(Kind::Throughput(t)) if t.mps > 0 && !s.waba_id.is_empty() => {
            vec![Step::Throughput { phone_number_id: s.phone_number_id.clone(), mps: t.mps, event: t.event.clone() }]
        }
        Some(Kind::Echo(e)) if !s.waba_id.is_empty() && !s.phone_number_id.is_empty() => vec![Step::Echo {
            phone_number_id: s.phone_number_id.clone(),
            recipient_key_hash: e.recipient_key_hash.clone(),
        }],
        Some(Kind::TemplateQuality(q)) => template_key(&s.waba_id, &q.template_language, &q.template_name)
            .map(|key| Step::TemplateQuality { key, quality: q.new_quality.clone() })
            .into_iter()
            .collect(),
        Some(Kind::TemplateCategory(c)) => {
            let Some(key) = template_key(&s.waba_id, &c.template_language, &c.template_name) else {
                return Vec::new();
            };
            if c.takes_effect_unix_s > 0 || !c.correct_category.is_empty() {
                // The notice: `new_category` is still the current one; the change comes with its own webhook.
                return vec![Step::Notice {
                    detail: format!(
                        "Meta template_category_update notice: template scope {key} becomes {} at {} (unix s)",
                        c.correct_category, c.takes_effect_unix_s
                    ),
                }];
            }
            vec![Step::TemplateCategory {
                key,
                category: c.new_category.clone(),
                previous: c.previous_category.clone(),
            }]
        }
        _ => Vec::new(),
    }
}

/// The operator alert of a throughput upgrade the coordinator could not tie to one number: the WABA's known
/// numbers (Meta ids, not phone numbers) and the exact call that records it for the one Meta upgraded (WhatsApp
/// Manager shows which: the webhook's display number is not kept).
pub fn unresolved_throughput(waba: &str, event: &str, mps: u32, numbers: &[String]) -> String {
    let known = if numbers.is_empty() { "none known yet".to_string() } else { numbers.join(", ") };
    format!(
        "Meta phone_number_quality_update {event} ({mps} mps) for one number of WABA {waba}; the webhook names it \
         only by its display phone, and the WABA has {} known numbers ({known}): rate unchanged. Find the upgraded \
         number in WhatsApp Manager and run: curl -X POST -H \"Authorization: Bearer $BW_OPERATOR_TOKEN\" \
         -d '{{\"mps\":{mps}}}' <coordinator admin>/admin/throughput/<phone_number_id> \
         (deploy/runbooks/account-signals.md)",
        numbers.len()
    )
}

impl Coordinator {
    /// The number a WABA-level signal names: its own id, else the WABA's only known number.
    fn number_of(&self, waba_id: &str, phone_number_id: &str) -> Result<Scope, usize> {
        if !phone_number_id.is_empty() {
            return Ok(Scope::new(waba_id, phone_number_id));
        }
        let mut of_waba: Vec<Scope> = self.known_scopes().into_iter().filter(|s| s.waba_id == waba_id).collect();
        match of_waba.len() {
            1 => Ok(of_waba.remove(0)),
            n => Err(n),
        }
    }

    /// Records Meta's stated throughput of a number (a webhook's, or an operator's on its behalf); returns the
    /// recorded limit and the rate every dispatcher now sends the number at.
    pub(crate) async fn record_throughput(&self, scope: &Scope, mps: u32, event: &str) -> anyhow::Result<(u32, f64)> {
        let limits = self.limits();
        let timeout = Duration::from_millis(self.inner.breaker.config().command_timeout_ms.max(1_000));
        let tput = Throughput::new(self.inner.redis.clone(), timeout, limits.for_scope(&scope.phone_number_id));
        let state = tput.set_limit(scope, mps, event).await?;
        let rate = bw_breaker::throughput::configured_rate(limits.for_scope(&scope.phone_number_id), state.mps);
        tracing::info!(
            waba_id = %scope.waba_id,
            phone_number_id = %scope.phone_number_id,
            mps = state.mps,
            rate_per_s = rate,
            %event,
            "number's throughput recorded; every dispatcher sends at the new rate"
        );
        Ok((state.mps, rate))
    }

    /// Applies one step; returns the detail of the operator alert it raises, if any.
    pub(crate) async fn apply_step(&self, signal: &AccountSignal, step: Step) -> anyhow::Result<Option<String>> {
        match step {
            Step::Throughput { phone_number_id, mps, event } => {
                let waba = &signal.waba_id;
                let scope = match self.number_of(waba, &phone_number_id) {
                    Ok(scope) => scope,
                    Err(_) => {
                        let mut numbers: Vec<String> = self
                            .known_scopes()
                            .into_iter()
                            .filter(|s| &s.waba_id == waba)
                            .map(|s| s.phone_number_id)
                            .collect();
                        numbers.sort();
                        let n = numbers.len();
                        tracing::warn!(waba_id = %waba, numbers = n, %event, "throughput signal: number unknown");
                        return Ok(Some(unresolved_throughput(waba, &event, mps, &numbers)));
                    }
                };
                let (mps, rate) = self.record_throughput(&scope, mps, &event).await?;
                Ok(Some(format!(
                    "Meta phone_number_quality_update {event}: number {} may send {mps} mps; Breakwater now sends it \
                     at {rate:.0}/s",
                    scope.phone_number_id
                )))
            }
            Step::TemplateQuality { key, quality } => {
                TemplateRules::new(self.inner.redis.clone()).set_quality(&key, &quality, RED_MARKETING_PER_MIN).await?;
                tracing::info!(scope = %key, %quality, "template quality recorded");
                Ok((quality == "RED").then(|| {
                    format!(
                        "Meta message_template_quality_update RED: template scope {key}'s marketing is paced at \
                         {RED_MARKETING_PER_MIN}/min until its quality recovers (a pause is next)"
                    )
                }))
            }
            Step::TemplateCategory { key, category, previous } => {
                TemplateRules::new(self.inner.redis.clone()).set_category(&key, &category).await?;
                tracing::info!(scope = %key, %category, %previous, "template category recorded");
                Ok((category == "MARKETING").then(|| {
                    format!(
                        "Meta template_category_update: template scope {key} moved from {previous} to MARKETING; \
                         marketing rules now apply to its sends"
                    )
                }))
            }
            Step::Notice { detail } => Ok(Some(detail)),
            Step::Echo { phone_number_id, recipient_key_hash } => {
                let scope = Scope::new(signal.waba_id.as_str(), phone_number_id.as_str());
                let limits = self.limits();
                let timeout = Duration::from_millis(self.inner.breaker.config().command_timeout_ms.max(1_000));
                let tput = Throughput::new(self.inner.redis.clone(), timeout, limits.for_scope(&phone_number_id));
                if recipient_key_hash.is_empty() {
                    tput.observe_inbound(&scope, 1).await?;
                } else {
                    tput.observe_echo(&scope, &recipient_key_hash, 1).await?;
                }
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_proto::v1::{TemplateCategoryChange, TemplateQualityChange, ThroughputChange};

    #[test]
    fn an_unresolved_upgrade_names_every_candidate_and_the_exact_call() {
        let a = unresolved_throughput("w9", "THROUGHPUT_UPGRADE", 1000, &["8101".into(), "8102".into()]);
        assert!(a.contains("WABA w9") && a.contains("2 known numbers (8101, 8102)"), "{a}");
        assert!(a.contains("-d '{\"mps\":1000}' <coordinator admin>/admin/throughput/<phone_number_id>"), "{a}");
        assert!(unresolved_throughput("w9", "THROUGHPUT_UPGRADE", 1000, &[]).contains("0 known numbers (none"));
    }

    fn throughput(event: &str, mps: u32, phone: &str) -> AccountSignal {
        AccountSignal {
            field: "phone_number_quality_update".into(),
            waba_id: "100".into(),
            phone_number_id: phone.into(),
            kind: Some(Kind::Throughput(ThroughputChange { event: event.into(), mps, ..Default::default() })),
            ..Default::default()
        }
    }

    #[test]
    fn an_upgrade_records_the_stated_limit_and_other_events_change_nothing() {
        assert_eq!(
            steps(&throughput("THROUGHPUT_UPGRADE", 1000, "200")),
            vec![Step::Throughput { phone_number_id: "200".into(), mps: 1000, event: "THROUGHPUT_UPGRADE".into() }]
        );
        assert_eq!(steps(&throughput("THROUGHPUT_UPGRADE", 1000, "")).len(), 1, "resolved within the WABA later");
        assert!(steps(&throughput("ONBOARDING", 0, "200")).is_empty());
        assert!(steps(&throughput("DOWNGRADE", 0, "200")).is_empty(), "legacy events are not acted on");
        let mut nameless = throughput("THROUGHPUT_UPGRADE", 1000, "200");
        nameless.waba_id.clear();
        assert!(steps(&nameless).is_empty());
    }

    #[test]
    fn quality_and_category_changes_are_recorded_and_a_notice_only_alerts() {
        let key = ScopeKey::Template { waba_id: "100".into(), language: "en_US".into(), name: "promo".into() };
        let quality = AccountSignal {
            waba_id: "100".into(),
            kind: Some(Kind::TemplateQuality(TemplateQualityChange {
                template_name: "promo".into(),
                template_language: "en_US".into(),
                new_quality: "RED".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        assert_eq!(steps(&quality), vec![Step::TemplateQuality { key: key.clone(), quality: "RED".into() }]);
        let category = |notice: bool| AccountSignal {
            waba_id: "100".into(),
            kind: Some(Kind::TemplateCategory(TemplateCategoryChange {
                template_name: "promo".into(),
                template_language: "en_US".into(),
                previous_category: if notice { String::new() } else { "UTILITY".into() },
                new_category: if notice { "UTILITY".into() } else { "MARKETING".into() },
                correct_category: if notice { "MARKETING".into() } else { String::new() },
                takes_effect_unix_s: if notice { 1_746_169_200 } else { 0 },
                ..Default::default()
            })),
            ..Default::default()
        };
        assert_eq!(
            steps(&category(false)),
            vec![Step::TemplateCategory { key, category: "MARKETING".into(), previous: "UTILITY".into() }]
        );
        assert!(matches!(steps(&category(true)).as_slice(), [Step::Notice { detail }] if detail.contains("MARKETING")));
        let echo = AccountSignal {
            waba_id: "100".into(),
            phone_number_id: "200".into(),
            kind: Some(Kind::Echo(bw_proto::v1::MessageEcho {
                recipient_key_hash: "abc".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        assert_eq!(steps(&echo), vec![Step::Echo { phone_number_id: "200".into(), recipient_key_hash: "abc".into() }]);
    }
}
