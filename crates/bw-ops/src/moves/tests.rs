use super::*;
use bw_proto::v1::{TemplatePayload, TextPayload};

const NOW: i64 = 10_000_000_000;

fn text(last_inbound: i64) -> SendRequest {
    SendRequest {
        operation_id: "op".into(),
        payload: Some(send_request::Payload::Text(TextPayload { body: "hi".into(), preview_url: false })),
        customer_last_inbound_unix_ms: last_inbound,
        ..Default::default()
    }
}

fn template() -> SendRequest {
    SendRequest {
        operation_id: "op".into(),
        payload: Some(send_request::Payload::Template(TemplatePayload {
            name: "order".into(),
            language: "en_US".into(),
            ..Default::default()
        })),
        customer_last_inbound_unix_ms: 1,
        ..Default::default()
    }
}

fn env(request: SendRequest, replay_attempts: u32, not_before: i64) -> DlqEnvelope {
    DlqEnvelope { request: Some(request), replay_attempts, not_before_unix_ms: not_before, ..Default::default() }
}

fn ledger(state: OperationState, replays: u32, reason: &str) -> LedgerEntry {
    let mut e = LedgerEntry { replays, reason: reason.into(), ..Default::default() };
    e.set_state(state);
    e
}

fn check(envelope: DlqEnvelope, entry: Option<LedgerEntry>, expect: Check) {
    let rules = Rules::default();
    assert_eq!(check_dlq_entry(&envelope, entry.as_ref(), NOW, &rules), expect, "{envelope:?} / {entry:?}");
}

#[test]
fn dlq_checks() {
    use OperationState::*;
    let day = 24 * 3600 * 1000;
    check(env(template(), 0, 0), Some(ledger(Dlq, 0, "")), Check::Replay { replay: 1 });
    check(env(template(), 0, 0), None, Check::Replay { replay: 1 });
    check(env(template(), 3, 0), Some(ledger(Dlq, 3, "")), Check::Replay { replay: 4 });
    check(env(template(), 0, 0), Some(ledger(Sent, 0, "")), Check::AlreadyAccepted);
    check(env(template(), 0, 0), Some(ledger(Read, 2, "")), Check::AlreadyAccepted);
    check(env(template(), 0, 0), Some(ledger(Expired, 0, "")), Check::AlreadyFinal);
    let mut late = template();
    late.deadline_unix_ms = NOW - 1;
    check(env(late, 0, 0), Some(ledger(Dlq, 0, "")), Check::Expired);
    check(env(text(NOW - day - 1), 0, 0), Some(ledger(Dlq, 0, "")), Check::WindowClosed);
    check(env(text(NOW - day + 60_000), 0, 0), Some(ledger(Dlq, 0, "")), Check::Replay { replay: 1 });
    check(env(text(0), 0, 0), Some(ledger(Dlq, 0, "")), Check::Replay { replay: 1 });
    check(env(template(), 5, 0), Some(ledger(Dlq, 5, "")), Check::Poison { replays: 5 });
    check(env(template(), 2, NOW + 3_000), Some(ledger(Dlq, 2, "")), Check::NotYet { wait_ms: 3_000 });
    // A pass that updated the ledger and crashed before acking resumes with the same replay number.
    check(env(template(), 2, 0), Some(ledger(Queued, 3, "replay 3 from dlq")), Check::Resume { replay: 3 });
    // The dispatcher published this entry and has not written the ledger yet (or died in between): its delivery
    // finishes the move or settles the operation; a replay now would be a second copy.
    let unfinished = Check::Elsewhere("a move of this operation is unfinished (ledger QUEUED)");
    check(env(template(), 3, 0), Some(ledger(Queued, 3, "replay 3 from dlq")), unfinished.clone());
    check(env(template(), 0, 0), Some(ledger(Queued, 0, "")), unfinished.clone());
    // A stale entry while a replayed copy is live in BW_SEND (not this module's marker): left alone too.
    check(env(template(), 2, 0), Some(ledger(Queued, 3, "sent to dlq")), unfinished);
    // UNKNOWN with a DLQ entry: the reconciler's resend after review (entry first, then the ledger; deliberate
    // and flagged), or the delivery that wrote this entry died before its ledger write and its redelivery found
    // its mark: the entry records that try's refusal. Either way the replay goes ahead.
    check(env(template(), 0, 0), Some(ledger(Unknown, 0, "")), Check::Replay { replay: 1 });
    // The quarantine holds it (a quarantine move whose DLQ ack was lost): the DLQ copy goes.
    check(env(template(), 5, 0), Some(ledger(Quarantined, 5, "")), Check::AlreadyFinal);
}

#[test]
fn not_before_is_ignored_when_replaying_now() {
    let rules = Rules { honor_not_before: false, ..Rules::default() };
    let got =
        check_dlq_entry(&env(template(), 1, NOW + 60_000), Some(&ledger(OperationState::Dlq, 1, "")), NOW, &rules);
    assert_eq!(got, Check::Replay { replay: 2 });
}

#[test]
fn outcome_source_handling() {
    assert!(Outcome::Replayed { replay: 1, duplicate: false }.source_done());
    assert!(Outcome::Quarantined(QuarantineReason::Poison).source_done());
    assert!(!Outcome::NotYet(Duration::from_secs(1)).source_done());
    assert!(!Outcome::Changed.source_done());
    assert!(!Outcome::Skipped("x".into()).source_done());
    assert_eq!(Outcome::Quarantined(QuarantineReason::Poison).label(), "poison");
}
