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

use crate::budget::{Budget, HELD_PREFIX, held_reason, hold_delay, reserved};
use crate::meta::MetaAnswer;
use crate::settle::{Event, Outcome};
use crate::worker::{Work, Worker};
use bw_breaker::budget::{BudgetItem, Verdict};
use bw_breaker::templates::ScopeKey;
use bw_common::classify::{Only, PauseScope, RateScope};
use bw_common::disposition::Settle;
use bw_common::registry::Owner;
use bw_common::time::now_ms;
use bw_proto::v1::{Category, DlqReason, ErrorInfo, OperationState, QuarantineReason, send_request::Payload};
use std::time::{Duration, Instant};

fn is_marketing_template(w: &Work) -> bool {
    w.request.category() == Category::Marketing && matches!(w.request.payload, Some(Payload::Template(_)))
}

/// The first configured prefix the recipient starts with, if any (compared on the E.164 form, `+` and digits).
pub(crate) fn undeliverable_prefix<'a>(recipient: &str, prefixes: &'a [String]) -> Option<&'a str> {
    prefixes.iter().map(String::as_str).find(|p| !p.is_empty() && recipient.starts_with(p))
}

fn tenant_of(w: &Work) -> &str {
    bw_wire::tenancy::split_operation_key(&w.request.operation_id).0
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

/// A failed Graph read of a portfolio's tier is tried again after this long (the fallback applies meanwhile).
const ASK_AGAIN: Duration = Duration::from_secs(60);

/// The portfolio messaging-limit gate (`budget.rs`).
impl Worker {
    /// Learns a portfolio's tier from Meta once per process (`GET /{phone_number_id}?fields=
    /// whatsapp_business_manager_messaging_limit`, reference §3.3) and stores it unless a limit is stored already
    /// (a webhook's is newer). Meta's value wins over `budget.limits`; while Meta cannot be asked, the fallback
    /// (config, else the lowest tier) holds, and the read is tried again after [`ASK_AGAIN`].
    async fn learn_tier(&self, budget: &Budget, portfolio: &str, phone: &str) {
        // Held across the read: a message of the portfolio arriving meanwhile waits for Meta's tier instead of
        // being counted against the fallback.
        let mut asked = budget.asked.lock().await;
        let due = match asked.get(portfolio) {
            None => true,
            Some(None) => false,
            Some(Some(at)) => at.elapsed() >= ASK_AGAIN,
        };
        if !due {
            return;
        }
        let read = self.meta.read_field(phone, "whatsapp_business_manager_messaging_limit").await;
        let learned = match read {
            Ok(raw) => match bw_breaker::budget::tier_users(&raw) {
                0 => Err(format!("tier `{}` not understood", raw.chars().take(32).collect::<String>())),
                limit => budget.store.seed_limit(portfolio, limit, "graph", &raw).await.map_err(|e| e.to_string()),
            },
            Err(e) => Err(e),
        };
        match learned {
            Ok(limit) => {
                tracing::info!(%portfolio, limit, "portfolio messaging limit learned from Meta");
                asked.insert(portfolio.to_string(), None);
            }
            Err(error) => {
                tracing::warn!(%portfolio, %error, "portfolio tier not read from Meta; the fallback holds");
                asked.insert(portfolio.to_string(), Some(Instant::now()));
            }
        }
    }

    /// Redis unreachable: authentication, utility and support go on uncounted (an OTP must not wait for the
    /// counting store); marketing is held for `budget.hold_ms`.
    async fn budget_unavailable(
        &self,
        budget: &Budget,
        w: Work,
        portfolio: &str,
        reserved: bool,
        error: &str,
    ) -> Option<Work> {
        if reserved {
            tracing::debug!(parent: &w.span, %portfolio, %error, "portfolio budget unavailable; sent uncounted");
            return Some(w);
        }
        tracing::warn!(parent: &w.span, %portfolio, %error, "portfolio budget unavailable; marketing held");
        let delay = Duration::from_millis(budget.cfg.hold_ms);
        self.hold_out_of_lane(&w, Outcome::MovePending, delay, None).await;
        None
    }

    /// The budget gate; returns the message when it may go on, else it has been held (given back to the broker).
    pub(crate) async fn budget_gate(&self, w: Work) -> Option<Work> {
        let Some(budget) = &self.gates.budget else { return Some(w) };
        if !matches!(w.request.payload, Some(Payload::Template(_))) {
            return Some(w);
        }
        let registered = match self.registry.owner(&w.request.phone_number_id, &w.request.waba_id).await {
            Ok(Owner::Known { portfolio_id, .. }) => portfolio_id,
            _ => String::new(),
        };
        let portfolio = bw_breaker::budget::portfolio_of(&registered, &w.request.waba_id, &budget.cfg.portfolios);
        let rk = bw_common::mask::recipient_key(&w.request.recipient);
        let reserved = reserved(w.request.category());
        if budget.store_down() {
            return self.budget_unavailable(budget, w, &portfolio, reserved, "unreachable a moment ago").await;
        }
        self.learn_tier(budget, &portfolio, &w.request.phone_number_id).await;
        let fallback = budget.fallback(&portfolio);
        let timeout = Duration::from_millis(budget.cfg.timeout_ms);
        let phone = &w.request.phone_number_id;
        let ask_windows =
            |rks: Vec<String>| async move { budget.store.windows_open(phone, &rks).await.map_err(|e| e.to_string()) };
        let open = match within(timeout, budget.windows.call(phone, rk.clone(), ask_windows)).await {
            Ok(open) => open,
            Err(error) => {
                budget.mark_down();
                return self.budget_unavailable(budget, w, &portfolio, reserved, &error).await;
            }
        };
        let reserve = budget.cfg.reserve_percent * 10;
        let item = BudgetItem { recipient_key: rk, reserved, window_open: open };
        let ask_admits = |items: Vec<BudgetItem>| {
            let portfolio = portfolio.clone();
            async move { budget.store.admit_many(&portfolio, fallback, reserve, &items).await.map_err(|e| e.to_string()) }
        };
        let a = match within(timeout, budget.admits.call(&portfolio, item, ask_admits)).await {
            Ok(a) => a,
            Err(error) => {
                budget.mark_down();
                return self.budget_unavailable(budget, w, &portfolio, reserved, &error).await;
            }
        };
        let labels = vec![("portfolio", portfolio.clone())];
        budget.limit.get_or_create(&labels).set(a.limit);
        budget.remember_limit(&portfolio, a.limit);
        if a.verdict != Verdict::WindowOpen {
            budget.used.get_or_create(&labels).set(a.used);
        }
        let newly_noted: bool = budget.noted.lock().map(|mut n| n.insert(portfolio.clone())).unwrap_or(false);
        if newly_noted && let Err(e) = budget.store.note(&portfolio).await {
            tracing::debug!(%portfolio, error = %e, "portfolio not listed for bwctl yet");
            if let Ok(mut n) = budget.noted.lock() {
                n.remove(&portfolio);
            }
        }
        let Verdict::Held { wait_ms } = a.verdict else { return Some(w) };
        let class = if reserved { "reserved" } else { "marketing" };
        budget.held.get_or_create(&vec![("portfolio", portfolio.clone()), ("class", class.to_string())]).inc();
        let cap = if reserved { a.limit } else { bw_breaker::budget::marketing_cap(a.limit, reserve) };
        let reason = held_reason(&portfolio, a.used, a.limit, cap, reserved);
        let delivered = w.msg.info().map(|i| i.delivered).unwrap_or(1);
        let delay = hold_delay(&budget.cfg, delivered, wait_ms);
        let delay_ms = delay.as_millis() as u64;
        let (used, limit) = (a.used, a.limit);
        tracing::debug!(parent: &w.span, %portfolio, used, limit, class, delay_ms, "over the portfolio budget; held");
        if !w.ledger.entry.reason.starts_with(HELD_PREFIX) {
            let written = self
                .update_ledger(&w, |cur| {
                    // Only a message still waiting in BW_SEND in this pass gets the note.
                    let replays = w.ledger.entry.replays;
                    let cur = cur.filter(|c| c.state() == OperationState::Queued && c.replays == replays)?;
                    let mut e = cur.clone();
                    e.reason = reason.clone();
                    Some(e)
                })
                .await;
            if !written {
                self.settle(&w, Settle::nak(Outcome::MovePending, delay), None).await;
                return None;
            }
        }
        let err = ErrorInfo { details: reason, at_unix_ms: now_ms(), ..Default::default() };
        let event = Event { err: &err, wamid: "", latency_us: 0 };
        self.hold_out_of_lane(&w, Outcome::BudgetHeld, delay, Some(event)).await;
        None
    }
}

/// A budget call bounded by `budget.timeout_ms`: Err holds what went wrong ("timed out" past the bound).
async fn within<T>(timeout: Duration, call: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| Err("timed out".into()))
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
