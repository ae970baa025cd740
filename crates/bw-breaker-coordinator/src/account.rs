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
//! The other signals (tiers, throughput, templates, user preferences, echoes, unknown fields) are acked here
//! without an action yet. Every change goes through `parent_pause.lua` (`Breaker::pause_because`,
//! `clear_parent`). One durable consumer, shared by every instance, with one message in flight: a ban and its
//! reinstatement apply in order whichever instance takes them. A step that fails (Redis, NATS) is redelivered;
//! applying a signal twice changes nothing (a pause only extends, an alert deduplicates).

use crate::Coordinator;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use bw_breaker::{Parent, PauseEnd, PauseSource, PauseSpec};
use bw_common::classify::PauseScope;
use bw_common::disposition::{Label, Settle, apply};
use bw_common::names;
use bw_common::proto::account_signal::Kind;
use bw_common::proto::{AccountSignal, Signal};
use futures::StreamExt;
use prost::Message as _;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

const RETRY_LATER: Duration = Duration::from_secs(2);

/// Restriction types that stop sending (reference §4.5); the others restrict management actions only.
const SENDING_RESTRICTIONS: [&str; 3] = [
    "RESTRICTED_BIZ_INITIATED_MESSAGING",
    "RESTRICTED_CUSTOMER_INITIATED_MESSAGING",
    "RESTRICTED_DIRECT_SEND_UTILITY_TEMPLATES",
];

/// `account_update` events that stop the WABA until Meta says otherwise.
const STOPPING_EVENTS: [&str; 4] =
    ["ACCOUNT_DELETED", "PARTNER_REMOVED", "PARTNER_APP_UNINSTALLED", "ACCOUNT_OFFBOARDED"];

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
    /// Raise a signal for the alerting service.
    Alert { kind: &'static str, detail: String },
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
            ack_wait: Duration::from_secs(30),
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
            let settle = self.account_signal(&msg.payload).instrument(span.clone()).await;
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
    use bw_common::proto::{AccountAlert, AccountBanState, AccountEvent, AccountRestriction, ThroughputChange};

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
        assert!(actions(&signal(Kind::Throughput(ThroughputChange::default())), 0).is_empty());
    }
}
