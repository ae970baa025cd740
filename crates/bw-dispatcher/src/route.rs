//! Where a message goes next: the one place that turns Meta's answer (or the breaker's refusal) into a next
//! place. Pure functions of their inputs, no I/O, covered row by row by the table tests below; `process.rs`
//! and `settle.rs` only carry out what these decide.
//!
//! The table (meta-cloud-api.md §2.3, §3, §5, §6):
//!
//! | answer | next |
//! |---|---|
//! | 2xx with a message id | SENT |
//! | 2xx without a parseable body, 5xx without Meta's body, timeout or reset after the request was written | UNKNOWN (may have been accepted: reconciled through status webhooks, never resent blindly) |
//! | request never left (connect refused, DNS, TLS, connect timeout) | retry (transient) |
//! | transient code (1, 2, 131000, 131016, 133004; 131057, 2494100 with their 60 s number pause) | retry with decorrelated jitter, never sooner than Retry-After or the number's pause; past 1 + `max_retries` tries or the retry budget → DLQ "retries_exhausted" |
//! | 130429, 131056, 4, 80007/80008 | hold back (nak) for the answer's hint (Retry-After, `estimated_time_to_regain_access`) or the scope's default pause; a wait past the budget → DLQ "rate_limited" with a not-before time |
//! | 131048 spam limit | DLQ "spam_limited" for at least the pause (minutes), alert `spam_limited` |
//! | 131049 per-user marketing limit | DLQ "recipient_deferred", not before 24 h (not a sender failure) |
//! | 132069 per-Flow hourly limit | DLQ "rate_limited", not before 1 h |
//! | hold of the token (190, 0 with an auth subcode, 3, 10, 200–299, 131005) | DLQ "credentials", alert `credentials` (the token is halted) |
//! | hold of a WABA (368, 131031, 131042, 131063, 131064) or a number (33, 131037, 131045, 133000, 133010, 133015, 133016; a bodiless 401/403 or code 0 without an auth subcode probes) | the hint's or default pause up to `long_pause_ms`: hold back for it; longer or until lifted: DLQ "sender_paused" with the pause's end as not-before; alert `credentials` |
//! | permanent code (100, 131026, 132000 …) | quarantine, alert `quarantined` |
//! | template code held by scope (132001, 132007, 132015, 132016) | quarantine "template_held" under the template's scope (name, language, WABA), which is held so its later messages wait unsent (`crate::gates`); alert `quarantine_scope` |
//! | any other code, any other 4xx without Meta's body | quarantine "unclassified" under the code's scope, alert `quarantine_scope` (a person looks; never the DLQ, so replay cannot loop on it) |
//!
//! A refusal by the per-recipient order gate (`order_wait`) is always a delayed redelivery in BW_SEND, never
//! the DLQ, however long the earlier message waits (`crate::order`).
//!
//! Replayed messages (the rh and rp lanes) never retry here: a transient failure sends them back to the DLQ, whose
//! replay schedule owns their next try.

use crate::meta::MetaAnswer;
use bw_breaker::DenyReason;
use bw_common::classify::{ErrorClass, PauseScope, RateScope};
use bw_proto::v1::{DlqReason, QuarantineReason};
use bw_wire::names::Lane;

/// Where a message goes after one try or one refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Meta accepted it.
    /// Meta accepted it; `held`: it holds it for the template's quality assessment (pacing), not sent yet.
    Sent { wamid: String, held: bool },
    /// Try again after `delay_ms` (a transient failure that created nothing).
    Retry { delay_ms: u64 },
    /// Refused for now by a limit: clear the on-the-wire mark and redeliver after `delay_ms`.
    HoldBack { delay_ms: u64 },
    /// Keep it in the DLQ; replay not before `not_before_ms` from now (0: replay's own schedule).
    Dlq { reason: DlqReason, not_before_ms: u64, signal: Option<&'static str> },
    /// Never retried; a person decides.
    Quarantine { reason: QuarantineReason, signal: Option<&'static str> },
    /// Meta may have it: wait for a status webhook.
    Unknown,
}

/// The retry state of the operation before this try's answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tries {
    pub lane: Lane,
    /// Transient failures so far in this dispatch pass.
    pub failures: u32,
    /// Milliseconds since the first of them (0 when none).
    pub since_first_failure_ms: u64,
    /// The next decorrelated-jitter delay, drawn by the caller (so this stays a pure function).
    pub jitter_ms: u64,
}

/// The limits the decisions use (from `[dispatch]`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    pub max_retries: u32,
    /// No automatic wait (retry or hold back) reaches past this much time since the first failure; longer
    /// waits go to the DLQ with a not-before time.
    pub retry_budget_ms: u64,
    /// A refusal for longer than this sends the message to the DLQ instead of a redelivery.
    pub long_pause_ms: u64,
}

/// Where a message goes after Meta's answer.
pub(crate) fn after_answer(answer: &MetaAnswer, tries: &Tries, policy: &Policy) -> Next {
    match answer {
        MetaAnswer::Accepted { wamid, held, .. } => Next::Sent { wamid: wamid.clone(), held: *held },
        MetaAnswer::Unknown { .. } => Next::Unknown,
        MetaAnswer::NotSent { .. } => transient(tries, policy, 0),
        MetaAnswer::Rejected { meaning, retry_after_ms, .. } => match meaning.class {
            // A transient code with a pause of its own (maintenance: the number, ~60 s) waits at least that long.
            ErrorClass::Transient => {
                let paused = meaning.pause_ms(answer.pause_hint_ms()).unwrap_or(0);
                transient(tries, policy, retry_after_ms.unwrap_or(0).max(paused))
            }
            ErrorClass::RateLimit(scope) => rate_limited(scope, rate_hint(scope, answer), policy),
            // The template codes the table marks for the quarantine hold the template's scope (crate::gates).
            ErrorClass::Permanent if meaning.quarantine && meaning.scope == PauseScope::Template => {
                Next::Quarantine { reason: QuarantineReason::TemplateHeld, signal: Some("quarantine_scope") }
            }
            ErrorClass::Permanent => {
                Next::Quarantine { reason: QuarantineReason::PermanentError, signal: Some("quarantined") }
            }
            ErrorClass::Hold => held(meaning.scope, meaning.pause_ms(answer.pause_hint_ms()), policy),
            ErrorClass::Unclassified => {
                Next::Quarantine { reason: QuarantineReason::Unclassified, signal: Some("quarantine_scope") }
            }
        },
    }
}

/// The hint a rate limit of `scope` waits for: the number's and the pair's limiters take `Retry-After` only
/// (their AIMD and back-off are tuned to it); the WABA's and the app's take the longer of it and
/// `estimated_time_to_regain_access`.
fn rate_hint(scope: RateScope, answer: &MetaAnswer) -> Option<u64> {
    match (scope, answer) {
        (RateScope::Waba | RateScope::App, _) => answer.pause_hint_ms(),
        (_, MetaAnswer::Rejected { retry_after_ms, .. }) => *retry_after_ms,
        _ => None,
    }
}

/// A hold of `scope` (the breaker records the pause): a pause up to `long_pause_ms` is waited out as a
/// redelivery (the send after it probes); a longer one, or one until lifted, keeps the message in the DLQ with
/// the pause's end as its not-before time (replay also waits while the snapshot shows the pause).
fn held(scope: PauseScope, pause_ms: Option<u64>, policy: &Policy) -> Next {
    let reason = if scope == PauseScope::Token { DlqReason::Credentials } else { DlqReason::SenderPaused };
    match pause_ms {
        Some(ms) if ms <= policy.long_pause_ms => Next::HoldBack { delay_ms: ms },
        Some(ms) => Next::Dlq { reason, not_before_ms: ms, signal: Some("credentials") },
        None => Next::Dlq { reason, not_before_ms: 0, signal: Some("credentials") },
    }
}

fn transient(tries: &Tries, policy: &Policy, retry_after_ms: u64) -> Next {
    let delay_ms = tries.jitter_ms.max(retry_after_ms);
    let exhausted = tries.failures + 1 > policy.max_retries;
    let over_budget = tries.since_first_failure_ms + delay_ms > policy.retry_budget_ms;
    if tries.lane.is_replay() || exhausted || over_budget {
        // Retry-After past the budget is kept as the not-before time of the DLQ entry.
        let not_before_ms = if retry_after_ms > policy.retry_budget_ms { retry_after_ms } else { 0 };
        return Next::Dlq { reason: DlqReason::RetriesExhausted, not_before_ms, signal: None };
    }
    Next::Retry { delay_ms }
}

fn rate_limited(scope: RateScope, hint_ms: Option<u64>, policy: &Policy) -> Next {
    let wait = hint_ms.filter(|h| *h > 0).unwrap_or(scope.default_pause_ms());
    match scope {
        RateScope::Spam => Next::Dlq {
            reason: DlqReason::SpamLimited,
            not_before_ms: wait.max(RateScope::Spam.default_pause_ms()),
            signal: Some("spam_limited"),
        },
        RateScope::Recipient => Next::Dlq {
            reason: DlqReason::RecipientDeferred,
            not_before_ms: wait.max(RateScope::Recipient.default_pause_ms()),
            signal: None,
        },
        RateScope::Flow => Next::Dlq {
            reason: DlqReason::RateLimited,
            not_before_ms: wait.max(RateScope::Flow.default_pause_ms()),
            signal: None,
        },
        RateScope::PhoneNumber | RateScope::Pair | RateScope::App | RateScope::Waba => {
            if wait > policy.retry_budget_ms {
                Next::Dlq { reason: DlqReason::RateLimited, not_before_ms: wait, signal: None }
            } else {
                Next::HoldBack { delay_ms: wait }
            }
        }
    }
}

/// Where a message goes when the breaker or the limits refused it and it cannot wait in memory.
pub(crate) fn after_denial(reason: DenyReason, retry_after_ms: u64, policy: &Policy) -> Next {
    match reason {
        DenyReason::BreakerOpen | DenyReason::ForcedOpen => {
            Next::Dlq { reason: DlqReason::BreakerOpen, not_before_ms: 0, signal: None }
        }
        // A long pause (the number's own, the sender's app, WABA or token, a spam restriction, a deferred
        // recipient): keep the message in the DLQ until it lifts rather than cycling it through redeliveries,
        // under a reason that says what happened (the on-call person's runbook follows the reason).
        DenyReason::Paused
        | DenyReason::SpamPaused
        | DenyReason::RegistrationPaused
        | DenyReason::AppPaused
        | DenyReason::WabaPaused
        | DenyReason::TokenHalted
        | DenyReason::NumberPaused
        | DenyReason::RecipientDeferred
            if retry_after_ms > policy.long_pause_ms =>
        {
            let dlq = match reason {
                DenyReason::TokenHalted => DlqReason::Credentials,
                DenyReason::SpamPaused => DlqReason::SpamLimited,
                DenyReason::RecipientDeferred => DlqReason::RecipientDeferred,
                DenyReason::RegistrationPaused => DlqReason::RateLimited,
                _ => DlqReason::SenderPaused,
            };
            Next::Dlq { reason: dlq, not_before_ms: retry_after_ms, signal: None }
        }
        DenyReason::Paused
        | DenyReason::SpamPaused
        | DenyReason::RegistrationPaused
        | DenyReason::AppPaused
        | DenyReason::WabaPaused
        | DenyReason::TokenHalted
        | DenyReason::NumberPaused
        | DenyReason::RecipientDeferred
        | DenyReason::SenderRate
        | DenyReason::PairRate
        | DenyReason::Reserve
        | DenyReason::Throttled
        | DenyReason::CanaryBudget
        | DenyReason::Degraded => Next::HoldBack { delay_ms: retry_after_ms },
        // Per-recipient order: waiting behind an earlier message to the same recipient, however long, is a
        // redelivery in BW_SEND, never the DLQ (which holds at most the first waiting message of a recipient, so
        // replay cannot send a later one first or fill its lane with followers; see `crate::order`).
        DenyReason::OrderWait => Next::HoldBack { delay_ms: retry_after_ms },
    }
}

/// Whether a refusal may wait in memory for its slot (instead of a redelivery): never a breaker refusal.
pub(crate) fn holdable(reason: DenyReason) -> bool {
    !matches!(reason, DenyReason::BreakerOpen | DenyReason::ForcedOpen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_common::classify::{Channel, classify};

    const POLICY: Policy = Policy { max_retries: 3, retry_budget_ms: 300_000, long_pause_ms: 60_000 };
    const FIRST: Tries = Tries { lane: Lane::High, failures: 0, since_first_failure_ms: 0, jitter_ms: 1_500 };

    fn rejected(code: i64, retry_after_ms: Option<u64>) -> MetaAnswer {
        hinted(code, retry_after_ms, None)
    }

    fn hinted(code: i64, retry_after_ms: Option<u64>, regain_ms: Option<u64>) -> MetaAnswer {
        MetaAnswer::Rejected {
            meaning: classify(Some(code), None, 400, Channel::Sync),
            code,
            http_status: 400,
            details: String::new(),
            fbtrace_id: String::new(),
            retry_after_ms,
            regain_ms,
        }
    }

    fn scoped(reason: QuarantineReason) -> Next {
        Next::Quarantine { reason, signal: Some("quarantine_scope") }
    }

    fn dlq(reason: DlqReason, not_before_ms: u64, signal: Option<&'static str>) -> Next {
        Next::Dlq { reason, not_before_ms, signal }
    }

    #[test]
    fn every_row_of_the_answer_table() {
        let rows: Vec<(&str, MetaAnswer, Tries, Next)> = vec![
            (
                "200 with a wamid",
                MetaAnswer::Accepted { wamid: "wamid.1".into(), usage_percent: None, http_status: 200, held: false },
                FIRST,
                Next::Sent { wamid: "wamid.1".into(), held: false },
            ),
            (
                "timeout after the write",
                MetaAnswer::Unknown { details: "timeout".into(), http_status: 0 },
                FIRST,
                Next::Unknown,
            ),
            ("never left", MetaAnswer::NotSent { details: "refused".into() }, FIRST, Next::Retry { delay_ms: 1_500 }),
            ("131000 try again", rejected(131000, None), FIRST, Next::Retry { delay_ms: 1_500 }),
            ("2 downtime, Retry-After 20 s", rejected(2, Some(20_000)), FIRST, Next::Retry { delay_ms: 20_000 }),
            (
                "transient after three retries",
                rejected(131016, None),
                Tries { failures: 3, since_first_failure_ms: 9_000, ..FIRST },
                dlq(DlqReason::RetriesExhausted, 0, None),
            ),
            (
                "transient past the budget",
                rejected(133004, None),
                Tries { failures: 1, since_first_failure_ms: 299_000, ..FIRST },
                dlq(DlqReason::RetriesExhausted, 0, None),
            ),
            (
                "transient with Retry-After past the budget",
                rejected(131057, Some(600_000)),
                FIRST,
                dlq(DlqReason::RetriesExhausted, 600_000, None),
            ),
            (
                "transient on the replay lane",
                rejected(131000, None),
                Tries { lane: Lane::Replay, ..FIRST },
                dlq(DlqReason::RetriesExhausted, 0, None),
            ),
            (
                "transient on the priority replay lane",
                rejected(131000, None),
                Tries { lane: Lane::PriorityReplay, ..FIRST },
                dlq(DlqReason::RetriesExhausted, 0, None),
            ),
            ("130429 throughput", rejected(130429, None), FIRST, Next::HoldBack { delay_ms: 1_000 }),
            ("130429 with Retry-After", rejected(130429, Some(7_000)), FIRST, Next::HoldBack { delay_ms: 7_000 }),
            (
                "130429 with Retry-After past the budget",
                rejected(130429, Some(900_000)),
                FIRST,
                dlq(DlqReason::RateLimited, 900_000, None),
            ),
            ("131056 pair", rejected(131056, None), FIRST, Next::HoldBack { delay_ms: 1_000 }),
            ("4 app limit", rejected(4, None), FIRST, Next::HoldBack { delay_ms: 60_000 }),
            ("80007 WABA limit", rejected(80007, None), FIRST, Next::HoldBack { delay_ms: 60_000 }),
            ("80008 WABA BUC limit", rejected(80008, None), FIRST, Next::HoldBack { delay_ms: 60_000 }),
            (
                "80007 with estimated_time_to_regain_access 2 min",
                hinted(80007, None, Some(120_000)),
                FIRST,
                Next::HoldBack { delay_ms: 120_000 },
            ),
            (
                "80007 with a 30 min estimate: past the budget",
                hinted(80007, Some(5_000), Some(1_800_000)),
                FIRST,
                dlq(DlqReason::RateLimited, 1_800_000, None),
            ),
            ("4 app limit with Retry-After", rejected(4, Some(90_000)), FIRST, Next::HoldBack { delay_ms: 90_000 }),
            (
                "133016 registration limit, 10 min: the number waits in the DLQ",
                rejected(133016, None),
                FIRST,
                dlq(DlqReason::SenderPaused, 600_000, Some("credentials")),
            ),
            (
                "133015 deletion not complete, 5 min",
                rejected(133015, None),
                FIRST,
                dlq(DlqReason::SenderPaused, 300_000, Some("credentials")),
            ),
            (
                "131057 maintenance: retried after the number's 60 s pause",
                rejected(131057, None),
                FIRST,
                Next::Retry { delay_ms: 60_000 },
            ),
            ("131048 spam", rejected(131048, None), FIRST, dlq(DlqReason::SpamLimited, 600_000, Some("spam_limited"))),
            (
                "131049 per-user marketing limit",
                rejected(131049, None),
                FIRST,
                dlq(DlqReason::RecipientDeferred, 86_400_000, None),
            ),
            ("132069 Flow hourly limit", rejected(132069, None), FIRST, dlq(DlqReason::RateLimited, 3_600_000, None)),
            ("190 token expired", rejected(190, None), FIRST, dlq(DlqReason::Credentials, 0, Some("credentials"))),
            ("10 permission removed", rejected(10, None), FIRST, dlq(DlqReason::Credentials, 0, Some("credentials"))),
            (
                "0 without an auth subcode: the number probes after 30 s",
                rejected(0, None),
                FIRST,
                Next::HoldBack { delay_ms: 30_000 },
            ),
            ("368 WABA restricted", rejected(368, None), FIRST, dlq(DlqReason::SenderPaused, 0, Some("credentials"))),
            ("131042 billing", rejected(131042, None), FIRST, dlq(DlqReason::SenderPaused, 0, Some("credentials"))),
            (
                "131064 WABA limited: probed hourly",
                rejected(131064, None),
                FIRST,
                dlq(DlqReason::SenderPaused, 3_600_000, Some("credentials")),
            ),
            (
                "133010 number not registered",
                rejected(133010, None),
                FIRST,
                dlq(DlqReason::SenderPaused, 0, Some("credentials")),
            ),
            (
                "100 invalid parameter",
                rejected(100, None),
                FIRST,
                Next::Quarantine { reason: QuarantineReason::PermanentError, signal: Some("quarantined") },
            ),
            (
                "131026 undeliverable",
                rejected(131026, None),
                FIRST,
                Next::Quarantine { reason: QuarantineReason::PermanentError, signal: Some("quarantined") },
            ),
            ("an unknown code", rejected(424242, None), FIRST, scoped(QuarantineReason::Unclassified)),
            ("132015 template paused", rejected(132015, None), FIRST, scoped(QuarantineReason::TemplateHeld)),
            ("132001 template missing", rejected(132001, None), FIRST, scoped(QuarantineReason::TemplateHeld)),
            ("132007 template policy", rejected(132007, None), FIRST, scoped(QuarantineReason::TemplateHeld)),
            ("132016 template disabled", rejected(132016, None), FIRST, scoped(QuarantineReason::TemplateHeld)),
            (
                "132000 parameter count: this message only",
                rejected(132000, None),
                FIRST,
                Next::Quarantine { reason: QuarantineReason::PermanentError, signal: Some("quarantined") },
            ),
        ];
        for (name, answer, tries, expect) in rows {
            assert_eq!(after_answer(&answer, &tries, &POLICY), expect, "{name}");
        }
    }

    #[test]
    fn ambiguous_http_answers_are_unknown_and_refusals_are_classified() {
        use crate::meta::answer_from;
        let route = |status: u16, body: &[u8]| {
            after_answer(&answer_from(status, body, crate::meta::Hints::default()), &FIRST, &POLICY)
        };
        for status in [500, 502, 503, 504] {
            assert_eq!(route(status, b"<html>Bad Gateway</html>"), Next::Unknown, "bodiless {status}");
            assert_eq!(route(status, b""), Next::Unknown, "empty {status}");
        }
        assert_eq!(route(200, b"not json"), Next::Unknown, "200 without a body we can read");
        assert_eq!(route(201, b"{}"), Next::Unknown, "2xx without a message id");
        assert_eq!(
            route(200, br#"{"messages":[{"id":"wamid.X"}]}"#),
            Next::Sent { wamid: "wamid.X".into(), held: false },
            "200 with a wamid"
        );
        let meta_500 = br#"{"error":{"message":"(#131000) Something went wrong","code":131000}}"#;
        assert_eq!(route(500, meta_500), Next::Retry { delay_ms: 1_500 }, "Meta's own 131000 body says try again");
        assert_eq!(route(429, b""), Next::HoldBack { delay_ms: 1_000 }, "a bodiless 429 was refused");
        // A bodiless 401/403 pauses the number briefly (then a probe); it never halts the token.
        assert_eq!(route(401, b""), Next::HoldBack { delay_ms: 30_000 });
        assert_eq!(route(403, b"<html>Forbidden</html>"), Next::HoldBack { delay_ms: 30_000 });
        let no_code = br#"{"error":{"message":"forbidden"}}"#;
        assert_eq!(route(403, no_code), Next::HoldBack { delay_ms: 30_000 }, "an error body without a code");
        assert_eq!(route(404, b"no such route"), scoped(QuarantineReason::Unclassified));
    }

    #[test]
    fn every_deny_reason() {
        let rows = [
            (DenyReason::BreakerOpen, 5_000, dlq(DlqReason::BreakerOpen, 0, None)),
            (DenyReason::ForcedOpen, 0, dlq(DlqReason::BreakerOpen, 0, None)),
            (DenyReason::Paused, 2_000, Next::HoldBack { delay_ms: 2_000 }),
            (DenyReason::Paused, 600_000, dlq(DlqReason::SenderPaused, 600_000, None)),
            (DenyReason::SenderRate, 12, Next::HoldBack { delay_ms: 12 }),
            (DenyReason::PairRate, 6_000, Next::HoldBack { delay_ms: 6_000 }),
            (DenyReason::Reserve, 30, Next::HoldBack { delay_ms: 30 }),
            (DenyReason::Throttled, 100, Next::HoldBack { delay_ms: 100 }),
            (DenyReason::CanaryBudget, 1_000, Next::HoldBack { delay_ms: 1_000 }),
            (DenyReason::Degraded, 5_000, Next::HoldBack { delay_ms: 5_000 }),
            (DenyReason::SpamPaused, 5_000, Next::HoldBack { delay_ms: 5_000 }),
            (DenyReason::SpamPaused, 600_000, dlq(DlqReason::SpamLimited, 600_000, None)),
            (DenyReason::RegistrationPaused, 600_000, dlq(DlqReason::RateLimited, 600_000, None)),
            (DenyReason::AppPaused, 30_000, Next::HoldBack { delay_ms: 30_000 }),
            (DenyReason::AppPaused, 120_000, dlq(DlqReason::SenderPaused, 120_000, None)),
            (DenyReason::WabaPaused, 120_000, dlq(DlqReason::SenderPaused, 120_000, None)),
            (DenyReason::TokenHalted, 300_000, dlq(DlqReason::Credentials, 300_000, None)),
            (DenyReason::NumberPaused, 30_000, Next::HoldBack { delay_ms: 30_000 }),
            (DenyReason::NumberPaused, 600_000, dlq(DlqReason::SenderPaused, 600_000, None)),
            (DenyReason::RecipientDeferred, 86_400_000, dlq(DlqReason::RecipientDeferred, 86_400_000, None)),
            (DenyReason::OrderWait, 250, Next::HoldBack { delay_ms: 250 }),
            // However long the wait (the earlier message sits in the DLQ), never the DLQ itself.
            (DenyReason::OrderWait, 600_000, Next::HoldBack { delay_ms: 600_000 }),
        ];
        for (reason, wait, expect) in &rows {
            assert_eq!(after_denial(*reason, *wait, &POLICY), *expect, "{reason:?} for {wait} ms");
        }
        for reason in DenyReason::ALL {
            assert!(rows.iter().any(|(r, _, _)| *r == reason), "{reason:?} has no row in the table");
        }
        assert!(!holdable(DenyReason::BreakerOpen) && !holdable(DenyReason::ForcedOpen));
        assert!(holdable(DenyReason::SenderRate) && holdable(DenyReason::PairRate) && holdable(DenyReason::Paused));
        assert!(holdable(DenyReason::OrderWait));
    }
}
