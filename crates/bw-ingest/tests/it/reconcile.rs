//! The reconciler of unknown outcomes: resolved by a status webhook, or the category policy after review.

use crate::support::{APP_SECRET, Env, WAIT, entry_in, start};
use bw_common::time::now_ms;
use bw_ingest::Policy;
use bw_ingest::webhook::sign;
use bw_proto::v1::{
    Category, DlqEnvelope, DlqReason, ErrorInfo, OperationState, QuarantineEntry, QuarantineReason, RejectedRequest,
    UnknownOutcome,
};
use bw_wire::names;
use prost::Message as _;

const PHONE: &str = "106540352242922";

async fn put_unknown(env: &Env, op: &str, category: Category, review_at: i64) {
    let mut entry = entry_in(op, OperationState::Unknown);
    entry.category = category as i32;
    entry.flagged_unknown = true;
    env.ledger.create(&entry).await.expect("ledger");
    let request =
        bw_client::Request::text(op, "102290129340398", PHONE, "+16505551234", "hi").category(category).build();
    let outcome = UnknownOutcome {
        request: Some(request),
        error: Some(ErrorInfo { details: "timeout after the request went out".into(), ..Default::default() }),
        sent_at_unix_ms: now_ms(),
        review_at_unix_ms: review_at,
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", format!("{op}.unknown.1").as_str());
    bw_common::nats::publish_durable(&env.js, names::unknown_subject(PHONE), headers, outcome.encode_to_vec().into())
        .await
        .expect("unknown stored");
}

async fn post_status(env: &Env, wamid: &str, status: &str, op: &str) {
    let body = serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "102290129340398",
        "changes": [{"field": "messages", "value": {"messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE},
            "statuses": [{"id": wamid, "status": status, "timestamp": "1750030073",
                          "recipient_id": "16505551234", "biz_opaque_callback_data": op}]}}]}]})
    .to_string();
    let res = crate::support::http_client()
        .post(env.url("/webhooks/meta"))
        .header("X-Hub-Signature-256", sign(APP_SECRET.as_bytes(), body.as_bytes()))
        .body(body)
        .send()
        .await
        .expect("post");
    assert_eq!(res.status(), 200);
}

#[tokio::test]
async fn unknown_outcome_resolved_by_a_status_is_never_resent() {
    let env = start(|_| {}).await;
    // Waiting for review when the status arrives.
    put_unknown(&env, "op-u1", Category::Transactional, now_ms() + 1_500).await;
    post_status(&env, "wamid.U1", "delivered", "op-u1").await;
    assert!(env.wait_state("op-u1", OperationState::Delivered).await);
    // Already resolved when the reconciler first sees it.
    let mut e = entry_in("op-u2", OperationState::Unknown);
    e.flagged_unknown = true;
    env.ledger.create(&e).await.expect("ledger");
    post_status(&env, "wamid.U2", "sent", "op-u2").await;
    assert!(env.wait_state("op-u2", OperationState::Sent).await);
    put_unknown_entry_only(&env, "op-u2", Category::Marketing).await;

    assert!(env.wait_count(names::UNKNOWN_STREAM, 0).await, "both entries acked");
    for op in ["op-u1", "op-u2"] {
        let entry = env.entry(op).await.expect("entry");
        assert!(entry.state().is_accepted_by_meta(), "{op}: {:?}", entry.state());
        assert!(entry.flagged_unknown, "{op} stays flagged");
    }
    assert_eq!(env.count(names::DLQ_STREAM).await, 0, "nothing resent");
    assert_eq!(env.count(names::QUARANTINE_STREAM).await, 0);
    assert!(
        env.metrics_text().contains(r#"bw_reconciler_decisions_total{action="resolved"} 2"#),
        "{}",
        env.metrics_text()
    );
    env.stop().await;
}

/// Publishes only the BW_UNKNOWN entry (the ledger entry exists already).
async fn put_unknown_entry_only(env: &Env, op: &str, category: Category) {
    let request =
        bw_client::Request::text(op, "102290129340398", PHONE, "+16505551234", "hi").category(category).build();
    let outcome = UnknownOutcome {
        request: Some(request),
        sent_at_unix_ms: now_ms(),
        review_at_unix_ms: now_ms(),
        ..Default::default()
    };
    bw_common::nats::publish_durable(
        &env.js,
        names::unknown_subject(PHONE),
        Default::default(),
        outcome.encode_to_vec().into(),
    )
    .await
    .expect("unknown stored");
}

#[tokio::test]
async fn unknown_outcome_gets_its_category_policy_after_review() {
    let env = start(|cfg| cfg.reconciler.policy.marketing = Policy::Resend).await;
    // review_at 0: the entry waits sent_at + review_delay_ms (500 ms in tests).
    put_unknown(&env, "op-t", Category::Transactional, 0).await;
    put_unknown(&env, "op-a", Category::Authentication, 0).await;
    put_unknown(&env, "op-m", Category::Marketing, 0).await;
    assert_eq!(env.entry("op-t").await.expect("entry").state(), OperationState::Unknown, "not before review");

    assert!(env.wait_state("op-t", OperationState::Quarantined).await);
    assert!(env.wait_state("op-a", OperationState::Expired).await);
    assert!(env.wait_state("op-m", OperationState::Dlq).await);
    assert!(env.wait_count(names::UNKNOWN_STREAM, 0).await);
    for op in ["op-t", "op-a", "op-m"] {
        assert!(env.entry(op).await.expect("entry").flagged_unknown, "{op} flagged");
    }
    let q = env.last(names::QUARANTINE_STREAM, &names::quarantine_subject(PHONE)).await;
    let q = QuarantineEntry::decode(q.payload.as_ref()).expect("QuarantineEntry");
    assert_eq!(q.reason(), QuarantineReason::UnknownReview);
    assert_eq!(q.request.expect("request").operation_id, "op-t");
    let d = env.last(names::DLQ_STREAM, &names::dlq_subject(Category::Marketing, PHONE)).await;
    let d = DlqEnvelope::decode(d.payload.as_ref()).expect("DlqEnvelope");
    assert_eq!(d.reason(), DlqReason::UnknownNoStatus);
    assert_eq!(d.request.expect("request").operation_id, "op-m");
    assert_eq!(env.count(names::DLQ_STREAM).await, 1);
    assert_eq!(env.count(names::QUARANTINE_STREAM).await, 1);
    env.stop().await;
}

#[tokio::test]
async fn undecodable_unknown_entries_are_kept_aside() {
    let env = start(|_| {}).await;
    env.js.publish(names::unknown_subject(PHONE), vec![0xff, 0x01].into()).await.expect("publish").await.expect("ack");
    assert!(env.wait_count(names::UNKNOWN_STREAM, 0).await);
    assert!(bw_testkit::wait_until(WAIT, || async { env.count(names::REJECTED_STREAM).await == 1 }).await);
    let kept = env.last(names::REJECTED_STREAM, &names::rejected_subject("unknown")).await;
    assert_eq!(RejectedRequest::decode(kept.payload.as_ref()).expect("kept").raw, vec![0xff, 0x01]);
    env.stop().await;
}

#[tokio::test]
async fn an_entry_resolved_while_it_waits_for_review_leaves_soon_not_at_review_time() {
    let env = start(|cfg| cfg.reconciler.recheck_ms = 300).await;
    // Review in an hour; the first try's late ledger write (or a status) resolves the operation meanwhile.
    put_unknown(&env, "op-late", Category::Transactional, now_ms() + 3_600_000).await;
    assert!(bw_testkit::wait_until(WAIT, || async { env.count(names::UNKNOWN_STREAM).await == 1 }).await, "stored");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await; // the reconciler has looked once
    let current = env.ledger.get("op-late").await.expect("ledger").expect("entry");
    env.ledger
        .update_from("op-late", Some(current), |cur| {
            let mut e = cur.cloned().unwrap_or_default();
            e.set_state(OperationState::Sent);
            Some(e)
        })
        .await
        .expect("sent");
    assert!(env.wait_count(names::UNKNOWN_STREAM, 0).await, "left BW_UNKNOWN well before its review time");
    assert_eq!(env.entry("op-late").await.expect("entry").state(), OperationState::Sent);
    assert_eq!(env.count(names::DLQ_STREAM).await + env.count(names::QUARANTINE_STREAM).await, 0);
    env.stop().await;
}

#[tokio::test]
async fn unknown_outcome_resent_while_the_scope_is_open_names_its_incident() {
    use bw_proto::v1::{BreakerState, Scope, ScopeSnapshot};
    let env = start(|cfg| cfg.reconciler.policy.marketing = Policy::Resend).await;
    let snapshot = |state: BreakerState, incident: &str| ScopeSnapshot {
        scope: Some(Scope { waba_id: "102290129340398".into(), phone_number_id: PHONE.into() }),
        state: state as i32,
        incident_id: incident.into(),
        ..Default::default()
    };
    let incident = format!("{PHONE}-1700000000000042");
    let open = snapshot(BreakerState::Open, &incident);
    env.deps.buckets.scopes.put(PHONE, open.encode_to_vec().into()).await.expect("scope snapshot");
    put_unknown(&env, "op-open", Category::Marketing, 0).await;
    assert!(env.wait_state("op-open", OperationState::Dlq).await);
    let d = env.last(names::DLQ_STREAM, &names::dlq_subject(Category::Marketing, PHONE)).await;
    let d = DlqEnvelope::decode(d.payload.as_ref()).expect("DlqEnvelope");
    assert_eq!((d.reason(), d.incident_id.as_str()), (DlqReason::UnknownNoStatus, incident.as_str()));
    assert_eq!(env.entry("op-open").await.expect("entry").incident_id, incident);

    // CLOSED (the snapshot keeps no incident): the entry names none.
    let closed = snapshot(BreakerState::Closed, "");
    env.deps.buckets.scopes.put(PHONE, closed.encode_to_vec().into()).await.expect("scope snapshot");
    put_unknown(&env, "op-closed", Category::Marketing, 0).await;
    assert!(env.wait_state("op-closed", OperationState::Dlq).await);
    let d = env.last(names::DLQ_STREAM, &names::dlq_subject(Category::Marketing, PHONE)).await;
    let d = DlqEnvelope::decode(d.payload.as_ref()).expect("DlqEnvelope");
    assert_eq!(d.request.expect("request").operation_id, "op-closed");
    assert_eq!(d.incident_id, "");
    env.stop().await;
}
