//! Per-recipient order (issue #14) end to end, at the compiled default order config (transactional, support
//! and marketing keep order; authentication does not): a later message to a recipient is not sent while an
//! earlier one waits in the DLQ, replay (two workers, two dispatchers) keeps ingest's acceptance order at Meta,
//! an OTP is not held behind a waiting promotion, and purging the earlier message releases the later one.

use bw_e2e::{Harness, WABA_ID, order_violations};
use bw_meta_sim::{FaultKind, SimConfig};
use bw_proto::v1::{Category, OperationState, SendRequest};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(90);
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

fn message(op: &str, phone: &str, recipient: &str, category: Category) -> SendRequest {
    bw_client::Request::template(op, WABA_ID, phone, recipient, "order_update", "es_AR")
        .param("1")
        .category(category)
        .build()
}

/// Submits one request and waits for ingest's answer (so the next one is accepted after it).
async fn submit(h: &Harness, request: &SendRequest) {
    let reply = h.producer().send(request).await.expect("ingest answers");
    assert!(reply.accepted, "{} rejected: {}", request.operation_id, reply.error);
}

/// Every call fails with 131000 (transient) until the scenario is cleared.
fn outage() -> bw_meta_sim::Scenario {
    crate::dispatch::failing(0, None, FaultKind::Error { code: 131000, http_status: None, subcode: None })
}

async fn state(h: &Harness, op: &str) -> Option<OperationState> {
    h.ledger_entry(op).await.map(|v| v.entry.state())
}

/// Waits until `op` is in the DLQ after at least `replays` failed replays (the n-th waits 1, 3, 8 s... before
/// the next).
async fn in_dlq(h: &Harness, op: &str, replays: u32) {
    let ok = bw_testkit::wait_until(WAIT, || async {
        h.ledger_entry(op).await.is_some_and(|v| v.entry.state() == OperationState::Dlq && v.entry.replays >= replays)
    })
    .await;
    assert!(
        ok,
        "{op} in the DLQ after {replays} replays: {:?}\nlast unknown-outcome entry of the sender: {}",
        h.ledger_entry(op).await.map(|v| v.entry),
        last_unknown(h, op).await
    );
}

/// What the last BW_UNKNOWN entry of `op`'s sender says (for a failure message).
async fn last_unknown(h: &Harness, op: &str) -> String {
    let Some(entry) = h.ledger_entry(op).await else { return "no ledger entry".into() };
    let subject = bw_wire::names::unknown_subject(&entry.entry.phone_number_id);
    let Ok(stream) = h.js.get_stream(bw_wire::names::UNKNOWN_STREAM).await else { return "no stream".into() };
    match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) => match <bw_proto::v1::UnknownOutcome as prost::Message>::decode(m.payload) {
            Ok(u) => format!(
                "{} error {:?}",
                u.request.map(|r| r.operation_id).unwrap_or_default(),
                u.error.map(|e| (e.meta_code, e.http_status, e.details))
            ),
            Err(e) => format!("undecodable: {e}"),
        },
        Err(e) => format!("none ({e})"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_messages_wait_while_an_earlier_one_is_in_the_dlq_and_replay_keeps_acceptance_order() {
    const PHONE: &str = "106540352250001";
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(outage());
    h.start_ingest(&[]).await;
    h.start_coordinator(&[]).await;
    h.start_dispatcher(&[]).await;
    h.start_dispatcher(&[]).await;
    h.start_replay(&[]).await;
    h.start_replay(&[]).await;
    let recipients = ["+5491155550101", "+5491155550102"];
    // The first message to each recipient fails through its retries into the DLQ, and fails its first two
    // replays while Meta is out: it then waits there 3 s for its next replay.
    let mut accepted = Vec::new();
    for (r, to) in recipients.iter().enumerate() {
        let op = format!("ord-{r}-0");
        submit(&h, &message(&op, PHONE, to, Category::Transactional)).await;
        accepted.push(op);
    }
    for op in &accepted {
        in_dlq(&h, op, 2).await;
    }
    h.sim.clear_scenario();
    // Meta is healthy again: later messages (both lanes) could go at once, but must wait for the first.
    for k in 1..5 {
        for (r, to) in recipients.iter().enumerate() {
            let op = format!("ord-{r}-{k}");
            let category = if k % 2 == 0 { Category::Marketing } else { Category::Transactional };
            submit(&h, &message(&op, PHONE, to, category)).await;
            accepted.push(op);
        }
    }
    // While the first to a recipient is still in the DLQ, nothing after it has reached Meta. (The oracle is read
    // first: if the first is still in the DLQ afterwards, it was then too.)
    let mut checked_while_waiting = 0;
    loop {
        let oracle = h.sim.oracle();
        let mut waiting = 0;
        for r in 0..recipients.len() {
            if state(&h, &format!("ord-{r}-0")).await == Some(OperationState::Dlq) {
                waiting += 1;
                for k in 1..5 {
                    let later = format!("ord-{r}-{k}");
                    assert!(oracle.get(&later).is_none(), "{later} reached Meta while ord-{r}-0 was in the DLQ");
                }
            }
        }
        if waiting == 0 {
            break;
        }
        checked_while_waiting += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(checked_while_waiting > 0, "the later messages were checked while the first waited in the DLQ");
    assert!(h.wait_all(&accepted, &SENT, WAIT).await, "everything is sent in the end");
    let oracle = h.sim.oracle();
    for op in &accepted {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted by Meta exactly once");
    }
    let violations = order_violations(&oracle, &accepted);
    assert!(violations.is_empty(), "Meta accepted later messages first: {violations:?}");
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &accepted).await.expect("accounting");
    assert!(report.is_clean(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_otp_is_not_held_behind_a_waiting_promotion_and_purging_the_promotion_releases_the_rest() {
    const PHONE: &str = "106540352250002";
    const TO: &str = "+5491155550201";
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(outage());
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    // No replay runs: the promotion stays in the DLQ until an operator acts.
    submit(&h, &message("promo", PHONE, TO, Category::Marketing)).await;
    in_dlq(&h, "promo", 0).await;
    h.sim.clear_scenario();
    submit(&h, &message("receipt", PHONE, TO, Category::Transactional)).await;
    submit(&h, &message("otp", PHONE, TO, Category::Authentication)).await;
    assert!(h.wait_state("otp", &SENT, WAIT).await, "the OTP goes although the promotion waits");
    // The receipt, accepted before the OTP, is still held behind the promotion.
    assert!(h.sim.oracle().get("receipt").is_none(), "the receipt did not overtake the promotion");
    assert_eq!(state(&h, "receipt").await, Some(OperationState::Queued));
    assert_eq!(state(&h, "promo").await, Some(OperationState::Dlq));
    // An operator purges the promotion (it ends EXPIRED): the receipt goes.
    let mut progress = |_: usize, _: usize| {};
    let report = bw_ops::ops::purge_dlq(&h.js, &h.buckets, Some(PHONE), 10, &mut progress).await.expect("purge");
    assert_eq!(report.selected, 1, "{report:?}");
    assert!(h.wait_state("receipt", &SENT, WAIT).await, "the receipt is released by the purge");
    assert_eq!(state(&h, "promo").await, Some(OperationState::Expired));
    assert!(h.sim.oracle().get("promo").is_none(), "the purged promotion never reached Meta");
}
