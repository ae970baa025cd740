//! Meta's account signals (BW_ACCOUNT, published by ingest's `signals` module) applied to the WABA's pause and
//! turned into operator alerts, as meta-cloud-api.md §4.5 says:
//!
//! - an `account_update` restriction of messaging pauses the WABA (every number of it) until its `expiration`,
//!   source "webhook"; one without an expiration holds it until lifted. The reference restricts a *send class*
//!   (business-initiated, customer-initiated, utility templates) but a WABA pause holds every class: the safe
//!   reading (nothing sent that Meta would refuse) until a per-class pause exists. Restrictions that do not
//!   touch sending (template creation, adding numbers, calling) only alert;
//! - a ban (`DISABLED_UPDATE` `DISABLE`), and `ACCOUNT_DELETED`, `PARTNER_REMOVED`, `PARTNER_APP_UNINSTALLED`,
//!   `ACCOUNT_OFFBOARDED`, hold the WABA until lifted; `REINSTATE` and `ACCOUNT_RECONNECTED` lift a hold that a
//!   webhook set (an operator's hold stays the operator's, a timed restriction runs to its end);
//! - every pause and `account_alerts`, `SCHEDULE_FOR_DISABLE` and `ACCOUNT_VIOLATION` become alerts: a signal
//!   `account_restricted` or `account_alert` on BW_EVENTS, which the alerting service notifies (rules of the
//!   same names). Value-level errors are alerted by ingest itself (`status_error`, `credentials` signals).
//!
//! - a `message_template_status_update` PAUSED, DISABLED, REJECTED, ARCHIVED, DELETED or PENDING_DELETION holds
//!   the template's quarantine scope (`tpl:<waba>:<language>:<name>`, the key the dispatcher checks before each
//!   send: the WABA of the entry, the language as ingest normalises it to the send form, the name) until
//!   lifted, with the code Meta would answer a send with (132015 paused, 132016 disabled, 132001 otherwise);
//!   APPROVED, REINSTATED, UNARCHIVED and an `UNPAUSE` title lift the hold, whoever set it (Meta says the
//!   template sends again), and release its held messages, each re-queued exactly once
//!   (`bw_ops::quarantine::release_scope`);
//! - a `user_preferences` `stop` of `marketing_messages` suppresses marketing to the user as 131050 does, and
//!   `resume` lifts that suppression (see [`Coordinator::tenants_of`] for the tenant it applies in).
//! - a throughput upgrade, template quality and category changes, app echoes: `crate::meta_limits`.
//!
//! - a messaging-limit tier (`business_capability_update`, or the tier riding on `phone_number_quality_update`)
//!   sets the budget limit of the WABA's business portfolio(s) (`bw_breaker::budget`, [`Coordinator::portfolios_of`]),
//!   whether it rises or falls (Meta's value is the truth); a rise releases held messages at their next
//!   redelivery. A value Meta's formats do not explain (0) changes nothing.
//!
//! Unknown fields are acked here without an action. Every change goes through `parent_pause.lua`
//! (`Breaker::pause_because`, `clear_parent`). One durable consumer, shared by every instance, with one message
//! in flight: a ban and its reinstatement apply in order whichever instance takes them. A step that fails (Redis,
//! NATS) is redelivered; applying a signal twice changes nothing (a pause only extends, an alert deduplicates).

use crate::coordinator::Coordinator;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use bw_breaker::recipient::RecipientMarketing;
use bw_breaker::templates::{ScopeKey, TemplateHolds};
use bw_breaker::{Parent, PauseEnd, PauseSource, PauseSpec};
use bw_common::classify::PauseScope;
use bw_common::disposition::{Label, Settle, apply};
use bw_proto::v1::account_signal::Kind;
use bw_proto::v1::{AccountSignal, Signal};
use bw_wire::names;
use futures::StreamExt;
use prost::Message as _;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

const RETRY_LATER: Duration = Duration::from_secs(2);

/// The consumer's ack wait; a longer step sends progress acks.
const ACK_WAIT: Duration = Duration::from_secs(30);

/// Restriction types that stop sending (reference §4.5); the others restrict management actions only.
const SENDING_RESTRICTIONS: [&str; 3] = [
    "RESTRICTED_BIZ_INITIATED_MESSAGING",
    "RESTRICTED_CUSTOMER_INITIATED_MESSAGING",
    "RESTRICTED_DIRECT_SEND_UTILITY_TEMPLATES",
];

/// `account_update` events that stop the WABA until Meta says otherwise.
const STOPPING_EVENTS: [&str; 4] =
    ["ACCOUNT_DELETED", "PARTNER_REMOVED", "PARTNER_APP_UNINSTALLED", "ACCOUNT_OFFBOARDED"];

/// Template events that stop the template's sends (reference §4.5), with the code Meta answers a send with then.
const TEMPLATE_HOLDING_EVENTS: [(&str, i64); 6] = [
    ("PAUSED", 132015),
    ("DISABLED", 132016),
    ("REJECTED", 132001),
    ("ARCHIVED", 132001),
    ("DELETED", 132001),
    ("PENDING_DELETION", 132001),
];

/// Template events after which it sends again; an `other_info.title` of UNPAUSE says the same.
const TEMPLATE_RELEASING_EVENTS: [&str; 4] = ["APPROVED", "REINSTATED", "UNARCHIVED", "UNPAUSE"];

/// The suppression code a user's own `stop` stands for (Meta answers 131050 to marketing it ignores).
pub const USER_STOP_CODE: i64 = 131050;

/// How fast a template's release re-queues its held messages (per second).
const RELEASE_RATE_PER_S: f64 = 200.0;

/// Signal kinds (and alert rules) raised here.
pub const RESTRICTED_SIGNAL: &str = "account_restricted";
pub const ALERT_SIGNAL: &str = "account_alert";

/// What one account signal asks of the coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Pause the WABA until this Unix ms.
    PauseUntil { waba: String, until_unix_ms: i64, reason: String },
    /// Hold the WABA until lifted.
    Hold { waba: String, reason: String },
    /// Lift the WABA's hold if a webhook set it.
    Lift { waba: String, reason: String },
    /// Hold a template's quarantine scope until lifted, with the code Meta answers its sends with.
    HoldTemplate { key: ScopeKey, code: i64, reason: String },
    /// Lift a template's hold and re-queue its held messages once each.
    ReleaseTemplate { key: ScopeKey, reason: String },
    /// Suppress marketing to a user (by its recipient key hash) as 131050 does.
    SuppressMarketing { recipient_key_hash: String },
    /// Lift a user's 131050 suppression.
    ResumeMarketing { recipient_key_hash: String },
    /// Set the messaging limit (-1 unlimited) of the portfolio named, else of the WABA's portfolio(s).
    SetPortfolioLimit { portfolio_id: String, limit: i64, raw: String },
    /// Raise a signal for the alerting service.
    Alert { kind: &'static str, detail: String },
    /// A rate or template step (`crate::meta_limits`).
    Limits(crate::meta_limits::Step),
}

/// The actions of one signal at `now_ms`, in order. Pure: the table of the module's comment.
pub fn actions(s: &AccountSignal, now_ms: i64) -> Vec<Action> {
    let waba = s.waba_id.clone();
    let alert = |kind, detail: String| Action::Alert { kind, detail };
    let Some(kind) = &s.kind else { return Vec::new() };
    match kind {
        Kind::Restriction(r) => {
            let reason = format!("Meta account_update {}", r.restriction_type);
            if !SENDING_RESTRICTIONS.contains(&r.restriction_type.as_str()) {
                return vec![alert(ALERT_SIGNAL, format!("{reason} (no send impact)"))];
            }
            if r.expiration_unix_s == 0 {
                let detail = format!("{reason} without expiration: WABA held until lifted");
                return vec![Action::Hold { waba, reason: reason.clone() }, alert(RESTRICTED_SIGNAL, detail)];
            }
            let until_unix_ms = r.expiration_unix_s.saturating_mul(1000);
            if until_unix_ms <= now_ms {
                // A late or replayed delivery of a restriction already over: nothing to hold.
                return Vec::new();
            }
            let detail = format!("{reason} until {}: WABA paused", r.expiration_unix_s);
            vec![Action::PauseUntil { waba, until_unix_ms, reason }, alert(RESTRICTED_SIGNAL, detail)]
        }
        Kind::Ban(b) => {
            let reason = format!("Meta account_update DISABLED_UPDATE {}", b.ban_state);
            match b.ban_state.as_str() {
                "DISABLE" => vec![
                    Action::Hold { waba, reason: reason.clone() },
                    alert(RESTRICTED_SIGNAL, format!("{reason}: WABA held until reinstated")),
                ],
                "REINSTATE" => vec![Action::Lift { waba, reason }],
                _ => vec![alert(ALERT_SIGNAL, format!("{reason} on {}", b.ban_date))],
            }
        }
        Kind::AccountEvent(e) => {
            let reason = format!("Meta account_update {}", e.event);
            match e.event.as_str() {
                ev if STOPPING_EVENTS.contains(&ev) => vec![
                    Action::Hold { waba, reason: reason.clone() },
                    alert(RESTRICTED_SIGNAL, format!("{reason}: WABA held until reconnected or lifted")),
                ],
                "ACCOUNT_RECONNECTED" => vec![Action::Lift { waba, reason }],
                "ACCOUNT_VIOLATION" => vec![alert(ALERT_SIGNAL, format!("{reason} {}", e.detail))],
                _ => Vec::new(),
            }
        }
        Kind::Alert(a) => vec![alert(
            ALERT_SIGNAL,
            format!(
                "Meta account_alerts {} {} {} on {} {}: {}",
                a.severity, a.status, a.alert_type, a.entity_type, a.entity_id, a.description
            ),
        )],
        Kind::TemplateStatus(t) => {
            if t.template_name.is_empty() || t.template_language.is_empty() || waba.is_empty() {
                // No key the dispatcher could match: nothing to hold or release (ingest stored the raw delivery).
                return Vec::new();
            }
            let key = ScopeKey::Template {
                waba_id: waba,
                language: t.template_language.clone(),
                name: t.template_name.clone(),
            };
            let reason = format!("Meta message_template_status_update {} {}", t.event, t.other_title);
            let reason = reason.trim_end().to_string();
            if let Some((_, code)) = TEMPLATE_HOLDING_EVENTS.iter().find(|(e, _)| *e == t.event) {
                let detail = format!("{reason}: template scope {key} held until released");
                vec![Action::HoldTemplate { key, code: *code, reason }, alert(ALERT_SIGNAL, detail)]
            } else if TEMPLATE_RELEASING_EVENTS.contains(&t.event.as_str()) || t.other_title == "UNPAUSE" {
                vec![Action::ReleaseTemplate { key, reason }]
            } else {
                Vec::new()
            }
        }
        Kind::UserPreference(p) => {
            // Meta sends only `marketing_messages` today; another category is not what 131050 suppresses.
            let marketing = p.category.is_empty() || p.category == "marketing_messages";
            if !marketing || p.recipient_key_hash.is_empty() {
                return Vec::new();
            }
            // The hash is `mask::recipient_key` of the user's phone, the key the dispatcher's gate reads. A
            // preference naming only a business-scoped user id hashes that id instead: it is recorded, but matches
            // a send only if one is keyed the same way; a phone send is then stopped by Meta's 131050 answer.
            let recipient_key_hash = p.recipient_key_hash.clone();
            match p.value.as_str() {
                "stop" => vec![Action::SuppressMarketing { recipient_key_hash }],
                "resume" => vec![Action::ResumeMarketing { recipient_key_hash }],
                _ => Vec::new(),
            }
        }
        Kind::MessagingLimit(l) if l.unique_users_per_24h != 0 && !waba.is_empty() => {
            vec![Action::SetPortfolioLimit {
                portfolio_id: l.portfolio_id.clone(),
                limit: l.unique_users_per_24h.max(-1),
                raw: l.raw.clone(),
            }]
        }
        Kind::Throughput(_) | Kind::TemplateQuality(_) | Kind::TemplateCategory(_) | Kind::Echo(_) => {
            crate::meta_limits::steps(s).into_iter().map(Action::Limits).collect()
        }
        _ => Vec::new(),
    }
}

/// What became of one signal (the `result` label of `bw_breaker_coordinator_account_signals`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    Applied,
    Ignored,
    Retry,
    Undecodable,
}

impl Label for Handled {
    fn label(self) -> &'static str {
        match self {
            Handled::Applied => "applied",
            Handled::Ignored => "ignored",
            Handled::Retry => "retry",
            Handled::Undecodable => "undecodable",
        }
    }
}

impl Coordinator {
    /// The tenants whose marketing state a user preference of `waba_id` applies to. The recipient key is per
    /// tenant, and Meta names only the WABA: every tenant with a number of that WABA in the sender registry
    /// (BW_SENDERS), or the default tenant when the registry holds none (dev mode, where it owns every number).
    /// A WABA shared by two tenants suppresses in both: the safe reading, since the user stopped marketing from
    /// the business, not from one of its tenants.
    pub(crate) async fn tenants_of(&self, waba_id: &str) -> anyhow::Result<Vec<String>> {
        let registry = bw_common::registry::Registry::open(&self.inner.js, self.inner.cfg.nats.replicas).await?;
        let mut tenants: Vec<String> =
            registry.list().await?.into_iter().filter(|r| r.waba_id == waba_id).map(|r| r.tenant).collect();
        tenants.dedup();
        if tenants.is_empty() {
            tenants.push(bw_wire::tenancy::DEFAULT_TENANT.to_string());
        }
        Ok(tenants)
    }

    /// The portfolios a tier of `waba_id` applies to: the one the signal names, else those of the WABA's numbers
    /// in the sender registry, else the configured one of the WABA (`budget.portfolios`), else the WABA itself;
    /// the ids the dispatcher counts under (`bw_breaker::budget::portfolio_of`).
    pub(crate) async fn portfolios_of(&self, waba_id: &str, named: &str) -> anyhow::Result<Vec<String>> {
        let by_waba = &self.inner.cfg.budget.portfolios;
        if !named.is_empty() {
            return Ok(vec![named.to_string()]);
        }
        let registry = bw_common::registry::Registry::open(&self.inner.js, self.inner.cfg.nats.replicas).await?;
        let mut portfolios: Vec<String> = registry
            .list()
            .await?
            .into_iter()
            .filter(|r| r.waba_id == waba_id)
            .map(|r| bw_breaker::budget::portfolio_of(&r.portfolio_id, waba_id, by_waba))
            .collect();
        portfolios.sort();
        portfolios.dedup();
        if portfolios.is_empty() {
            portfolios.push(bw_breaker::budget::portfolio_of("", waba_id, by_waba));
        }
        Ok(portfolios)
    }

    /// The shared durable consumer on BW_ACCOUNT (created by the first instance; the others bind it).
    async fn account_consumer(&self) -> anyhow::Result<async_nats::jetstream::consumer::Consumer<pull::Config>> {
        let stream = self
            .inner
            .js
            .get_stream(names::ACCOUNT_STREAM)
            .await
            .map_err(|e| anyhow::anyhow!("cannot open stream `{}`: {e}", names::ACCOUNT_STREAM))?;
        let config = pull::Config {
            durable_name: Some(names::ACCOUNT_COORDINATOR_CONSUMER.to_string()),
            description: Some("coordinator: Meta's account signals to WABA pauses and alerts".into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            // In order across every instance: a ban and its reinstatement never race.
            max_ack_pending: 1,
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        };
        let mut last = None;
        for _ in 0..5 {
            match stream.get_or_create_consumer(names::ACCOUNT_COORDINATOR_CONSUMER, config.clone()).await {
                Ok(c) => return Ok(c),
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        anyhow::bail!(
            "cannot create consumer `{}`: {}",
            names::ACCOUNT_COORDINATOR_CONSUMER,
            last.map(|e| e.to_string()).unwrap_or_default()
        )
    }

    /// Consumes BW_ACCOUNT until `stop`.
    pub(crate) async fn consume_account_signals(self, stop: CancellationToken) -> anyhow::Result<()> {
        let consumer = self.account_consumer().await?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| anyhow::anyhow!("cannot pull from `{}`: {e}", names::ACCOUNT_COORDINATOR_CONSUMER))?;
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => break,
                next = messages.next() => match next {
                    Some(Ok(msg)) => msg,
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "account signal consumer error");
                        continue;
                    }
                    None => break,
                },
            };
            let span = tracing::info_span!(
                "coordinator.account_signal",
                subject = %msg.subject,
                result = tracing::field::Empty
            );
            // A template's release re-queues its held messages at RELEASE_RATE_PER_S and may outlast the ack
            // wait: tell the broker the signal is still in hand, so it is not redelivered meanwhile.
            let work = self.account_signal(&msg.payload).instrument(span.clone());
            tokio::pin!(work);
            let mut still_working = tokio::time::interval(ACK_WAIT / 3);
            still_working.tick().await;
            let settle = loop {
                tokio::select! {
                    settle = &mut work => break settle,
                    _ = still_working.tick() => {
                        bw_common::disposition::progress(&msg).await;
                    }
                }
            };
            apply(&msg, settle, &span, |result| {
                self.inner
                    .metrics
                    .account_signals
                    .get_or_create(&vec![("result".to_string(), result.to_string())])
                    .inc();
            })
            .await;
        }
        Ok(())
    }

    async fn account_signal(&self, payload: &[u8]) -> Settle<Handled> {
        let signal = match AccountSignal::decode(payload) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "undecodable account signal dropped");
                return Settle::term(Handled::Undecodable);
            }
        };
        let actions = actions(&signal, bw_common::time::now_ms());
        if actions.is_empty() {
            return Settle::ack(Handled::Ignored);
        }
        for action in actions {
            if let Err(e) = self.act(&signal, action).await {
                let (field, waba_id) = (&signal.field, &signal.waba_id);
                tracing::warn!(error = %e, %field, %waba_id, "account signal not applied yet");
                return Settle::nak(Handled::Retry, RETRY_LATER);
            }
        }
        Settle::ack(Handled::Applied)
    }

    async fn act(&self, signal: &AccountSignal, action: Action) -> anyhow::Result<()> {
        let breaker = &self.inner.breaker;
        let spec = |end| PauseSpec {
            scope: PauseScope::Waba,
            code: 0,
            end,
            marketing_only: false,
            source: PauseSource::Webhook,
        };
        match action {
            Action::PauseUntil { waba, until_unix_ms, reason } => {
                let ms = (until_unix_ms - bw_common::time::now_ms()).max(1) as u64;
                breaker.pause_because(&Parent::Waba(waba.clone()), spec(PauseEnd::For(ms)), Some(&reason)).await?;
                tracing::warn!(waba_id = %waba, until_unix_ms, %reason, "WABA paused by Meta's account signal");
            }
            Action::Hold { waba, reason } => {
                breaker.pause_because(&Parent::Waba(waba.clone()), spec(PauseEnd::Lifted), Some(&reason)).await?;
                tracing::warn!(waba_id = %waba, %reason, "WABA held by Meta's account signal until lifted");
            }
            Action::Lift { waba, reason } => {
                let parent = Parent::Waba(waba.clone());
                let status = breaker.parent_status(&parent).await?;
                if status.halted && status.source == PauseSource::Webhook.label() {
                    breaker.clear_parent(&parent).await?;
                    tracing::info!(waba_id = %waba, %reason, "WABA hold lifted by Meta's account signal");
                } else {
                    tracing::info!(
                        waba_id = %waba,
                        %reason,
                        halted = status.halted,
                        source = %status.source,
                        "no webhook hold to lift: the WABA's pause (if any) stays"
                    );
                }
            }
            Action::HoldTemplate { key, code, reason } => {
                TemplateHolds::new(self.inner.redis.clone()).hold(&key, code, 0).await?;
                tracing::warn!(scope = %key, code, %reason, "template held by Meta's status webhook until released");
            }
            Action::ReleaseTemplate { key, reason } => {
                let holds = TemplateHolds::new(self.inner.redis.clone());
                let lift =
                    async { holds.release_everywhere(&key).await.map(|was| was.is_some()).map_err(|e| e.to_string()) };
                let mut quiet = |_: usize, _: usize| {};
                let released = bw_ops::quarantine::release_scope(
                    &self.inner.js,
                    &self.inner.buckets,
                    &key.to_string(),
                    lift,
                    RELEASE_RATE_PER_S,
                    &mut quiet,
                )
                .await?;
                let report = &released.report;
                if report.errors > 0 {
                    // Redelivered: the hold is gone and each move is a compare-and-set, so a second pass re-queues
                    // only what this one could not.
                    anyhow::bail!("{} held message(s) of scope {key} not re-queued yet", report.errors);
                }
                tracing::info!(
                    scope = %key,
                    %reason,
                    hold_lifted = released.hold_lifted,
                    selected = report.selected,
                    passes = released.passes,
                    "template released by Meta's status webhook; its held messages re-queued once each"
                );
            }
            Action::SuppressMarketing { recipient_key_hash } => {
                let marketing = RecipientMarketing::new(self.inner.redis.clone());
                for tenant in self.tenants_of(&signal.waba_id).await? {
                    marketing.suppress(&tenant, &recipient_key_hash, USER_STOP_CODE).await?;
                }
                tracing::info!(waba_id = %signal.waba_id, "user_preferences stop: marketing to the user suppressed");
            }
            Action::ResumeMarketing { recipient_key_hash } => {
                let marketing = RecipientMarketing::new(self.inner.redis.clone());
                for tenant in self.tenants_of(&signal.waba_id).await? {
                    marketing.resume(&tenant, &recipient_key_hash, USER_STOP_CODE).await?;
                }
                tracing::info!(waba_id = %signal.waba_id, "user_preferences resume: marketing to the user resumed");
            }
            Action::SetPortfolioLimit { portfolio_id, limit, raw } => {
                let budget = bw_breaker::budget::PortfolioBudget::new(self.inner.redis.clone());
                for portfolio in self.portfolios_of(&signal.waba_id, &portfolio_id).await? {
                    let previous = budget.set_limit(&portfolio, limit, "webhook", &raw).await?;
                    tracing::info!(%portfolio, waba_id = %signal.waba_id, previous, limit, %raw,
                        "portfolio messaging limit set by Meta's webhook");
                }
            }
            Action::Limits(step) => {
                if let Some(detail) = self.apply_step(signal, step).await? {
                    Box::pin(self.act(signal, Action::Alert { kind: ALERT_SIGNAL, detail })).await?;
                }
            }
            Action::Alert { kind, detail } => {
                let alert = Signal {
                    kind: kind.to_string(),
                    waba_id: signal.waba_id.clone(),
                    phone_number_id: signal.phone_number_id.clone(),
                    meta_code: 0,
                    detail,
                    at_unix_ms: bw_common::time::now_ms(),
                    operation_id: String::new(),
                };
                bw_common::nats::publish_durable(
                    &self.inner.js,
                    names::signal_subject(kind),
                    async_nats::HeaderMap::new(),
                    alert.encode_to_vec().into(),
                )
                .await
                .map_err(|e| anyhow::anyhow!("alert signal not published: {e}"))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_proto::v1::{
        AccountAlert, AccountBanState, AccountEvent, AccountRestriction, TemplateStatusChange, ThroughputChange,
        UserPreference,
    };

    fn signal(kind: Kind) -> AccountSignal {
        AccountSignal { field: "account_update".into(), waba_id: "w1".into(), kind: Some(kind), ..Default::default() }
    }

    fn restriction(kind: &str, expiration_unix_s: i64) -> AccountSignal {
        signal(Kind::Restriction(AccountRestriction {
            restriction_type: kind.into(),
            expiration_unix_s,
            remediation: String::new(),
        }))
    }

    #[test]
    fn a_sending_restriction_pauses_the_waba_until_its_expiration_and_alerts() {
        let a = actions(&restriction("RESTRICTED_BIZ_INITIATED_MESSAGING", 2_000), 1_000_000);
        assert_eq!(
            a[0],
            Action::PauseUntil {
                waba: "w1".into(),
                until_unix_ms: 2_000_000,
                reason: "Meta account_update RESTRICTED_BIZ_INITIATED_MESSAGING".into()
            }
        );
        assert!(matches!(&a[1], Action::Alert { kind: RESTRICTED_SIGNAL, .. }));
        assert!(actions(&restriction("RESTRICTED_BIZ_INITIATED_MESSAGING", 999), 1_000_000).is_empty(), "over");
        let held = actions(&restriction("RESTRICTED_CUSTOMER_INITIATED_MESSAGING", 0), 1_000_000);
        assert!(matches!(&held[0], Action::Hold { .. }), "no expiration: until lifted");
        let other = actions(&restriction("RESTRICTED_ADD_PHONE_NUMBER_ACTION", 2_000), 1_000_000);
        assert!(matches!(&other[..], [Action::Alert { kind: ALERT_SIGNAL, .. }]), "no send impact");
    }

    #[test]
    fn a_ban_holds_and_a_reinstatement_lifts() {
        let ban = |state: &str| signal(Kind::Ban(AccountBanState { ban_state: state.into(), ban_date: "d".into() }));
        assert!(matches!(&actions(&ban("DISABLE"), 0)[..], [Action::Hold { .. }, Action::Alert { .. }]));
        assert!(matches!(&actions(&ban("REINSTATE"), 0)[..], [Action::Lift { .. }]));
        assert!(matches!(&actions(&ban("SCHEDULE_FOR_DISABLE"), 0)[..], [Action::Alert { kind: ALERT_SIGNAL, .. }]));
        let event = |e: &str| signal(Kind::AccountEvent(AccountEvent { event: e.into(), detail: String::new() }));
        assert!(matches!(&actions(&event("PARTNER_REMOVED"), 0)[..], [Action::Hold { .. }, Action::Alert { .. }]));
        assert!(matches!(&actions(&event("ACCOUNT_RECONNECTED"), 0)[..], [Action::Lift { .. }]));
        assert!(actions(&event("MM_LITE_TERMS_SIGNED"), 0).is_empty());
    }

    #[test]
    fn account_alerts_alert_and_other_signals_wait_for_their_step() {
        let a = actions(
            &signal(Kind::Alert(AccountAlert {
                entity_type: "BUSINESS".into(),
                entity_id: "506914307656634".into(),
                severity: "WARNING".into(),
                status: "ACTIVE".into(),
                alert_type: "OBA_REJECTED".into(),
                description: "x".into(),
            })),
            0,
        );
        assert!(matches!(&a[..], [Action::Alert { kind: ALERT_SIGNAL, detail }] if detail.contains("OBA_REJECTED")));
        assert!(actions(&signal(Kind::Throughput(ThroughputChange::default())), 0).is_empty(), "no stated mps");
    }

    fn template_status(event: &str, title: &str) -> AccountSignal {
        AccountSignal {
            field: "message_template_status_update".into(),
            waba_id: "102290129340398".into(),
            kind: Some(Kind::TemplateStatus(TemplateStatusChange {
                event: event.into(),
                template_name: "order_update".into(),
                template_language: "en_US".into(),
                other_title: title.into(),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn template_statuses_hold_or_release_the_scope_the_dispatcher_checks() {
        // The key a send of this template is checked against (bw-dispatcher gates: ScopeKey::template_of).
        let send = bw_proto::v1::SendRequest {
            waba_id: "102290129340398".into(),
            payload: Some(bw_proto::v1::send_request::Payload::Template(bw_proto::v1::TemplatePayload {
                name: "order_update".into(),
                language: "en_US".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let sent_key = ScopeKey::template_of(&send).expect("a template send has a scope");
        for (event, code) in [
            ("PAUSED", 132015),
            ("DISABLED", 132016),
            ("REJECTED", 132001),
            ("ARCHIVED", 132001),
            ("DELETED", 132001),
            ("PENDING_DELETION", 132001),
        ] {
            let a = actions(&template_status(event, ""), 0);
            assert!(
                matches!(&a[..], [Action::HoldTemplate { key, code: c, .. }, Action::Alert { kind: ALERT_SIGNAL, .. }]
                    if *key == sent_key && *c == code),
                "{event}: {a:?}"
            );
        }
        for (event, title) in
            [("APPROVED", ""), ("REINSTATED", ""), ("UNARCHIVED", ""), ("UNPAUSE", ""), ("APPROVED", "UNPAUSE")]
        {
            let a = actions(&template_status(event, title), 0);
            assert!(matches!(&a[..], [Action::ReleaseTemplate { key, .. }] if *key == sent_key), "{event}: {a:?}");
        }
        // A paused template's title is not a release; events that do not change sending do nothing.
        assert!(matches!(&actions(&template_status("PAUSED", "FIRST_PAUSE"), 0)[..], [Action::HoldTemplate { .. }, _]));
        for event in ["PENDING", "FLAGGED", "IN_APPEAL", "LOCKED", ""] {
            assert!(actions(&template_status(event, ""), 0).is_empty(), "{event}");
        }
        let mut nameless = template_status("PAUSED", "");
        if let Some(Kind::TemplateStatus(t)) = &mut nameless.kind {
            t.template_language.clear();
        }
        assert!(actions(&nameless, 0).is_empty(), "no key the dispatcher could match");
    }

    #[test]
    fn a_tier_sets_the_portfolio_limit_and_an_unexplained_value_changes_nothing() {
        use bw_proto::v1::MessagingLimitChange;
        let tier = |n: i64, raw: &str, pf: &str| {
            signal(Kind::MessagingLimit(MessagingLimitChange {
                unique_users_per_24h: n,
                raw: raw.into(),
                portfolio_id: pf.into(),
                max_phone_numbers_per_waba: 25,
            }))
        };
        assert_eq!(
            actions(&tier(2_000, "TIER_2K", ""), 0),
            vec![Action::SetPortfolioLimit { portfolio_id: String::new(), limit: 2_000, raw: "TIER_2K".into() }]
        );
        assert_eq!(
            actions(&tier(-1, "TIER_UNLIMITED", "p9"), 0),
            vec![Action::SetPortfolioLimit { portfolio_id: "p9".into(), limit: -1, raw: "TIER_UNLIMITED".into() }]
        );
        assert!(actions(&tier(0, "TIER_WHAT", ""), 0).is_empty(), "0: not understood, not applied");
    }

    #[test]
    fn a_user_stop_suppresses_marketing_and_resume_lifts_it() {
        let pref = |category: &str, value: &str| AccountSignal {
            field: "user_preferences".into(),
            waba_id: "w1".into(),
            kind: Some(Kind::UserPreference(UserPreference {
                recipient_key_hash: bw_common::mask::recipient_key("+5491155551234"),
                category: category.into(),
                value: value.into(),
                timestamp_unix_s: 1,
            })),
            ..Default::default()
        };
        let rk = bw_common::mask::recipient_key("+5491155551234");
        assert_eq!(
            actions(&pref("marketing_messages", "stop"), 0),
            vec![Action::SuppressMarketing { recipient_key_hash: rk.clone() }]
        );
        assert_eq!(
            actions(&pref("marketing_messages", "resume"), 0),
            vec![Action::ResumeMarketing { recipient_key_hash: rk }]
        );
        assert!(actions(&pref("marketing_messages", "interested"), 0).is_empty());
        assert!(actions(&pref("service_messages", "stop"), 0).is_empty(), "only marketing is what 131050 covers");
    }
}
