//! bw-ops against a real nats-server: accounting finds planted problems, operator replays never duplicate,
//! purges leave a final ledger state.

use bw_common::config::NatsConfig;
use bw_common::ledger::Ledger;
use bw_common::nats::publish_durable;
use bw_common::service::Deps;
use bw_common::time::now_ms;
use bw_ops::account::{account, account_expected};
use bw_ops::inspect::{dlq_items, quarantine_items};
use bw_ops::ops::{QuarantineFilter, purge_dlq, purge_quarantine, replay_dlq_now, replay_quarantine_now};
use bw_ops::scan::scan_stream;
use bw_proto::v1::*;
use bw_testkit::NatsServer;
use bw_wire::names;
use prost::Message;
use std::time::Duration;

mod tenants;

const PHONE: &str = "1001";

async fn setup() -> (NatsServer, Deps) {
    let nats = NatsServer::start();
    let cfg = NatsConfig::single(nats.url(), "");
    let deps = Deps::connect("ops-test", &cfg, None, Duration::from_secs(10)).await.expect("connect");
    (nats, deps)
}

fn request(op: &str) -> SendRequest {
    SendRequest {
        operation_id: op.into(),
        waba_id: "9".into(),
        phone_number_id: PHONE.into(),
        recipient: "+5491155551234".into(),
        category: Category::Transactional as i32,
        payload: Some(send_request::Payload::Template(TemplatePayload {
            name: "order".into(),
            language: "en_US".into(),
            ..Default::default()
        })),
        accepted_at_unix_ms: now_ms(),
        ..Default::default()
    }
}

async fn set_ledger(deps: &Deps, req: &SendRequest, state: OperationState, replays: u32) {
    let mut e = LedgerEntry {
        operation_id: req.operation_id.clone(),
        phone_number_id: req.phone_number_id.clone(),
        replays,
        ..Default::default()
    };
    e.set_state(state);
    Ledger::new(&deps.buckets).update(&req.operation_id, |_| Some(e.clone())).await.expect("ledger");
}

async fn publish(deps: &Deps, subject: String, msg_id: &str, payload: Vec<u8>) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
    publish_durable(&deps.js, subject, headers, payload.into()).await.expect("publish");
}

async fn put_dlq(deps: &Deps, op: &str, replays: u32) {
    let req = request(op);
    set_ledger(deps, &req, OperationState::Dlq, replays).await;
    let env = DlqEnvelope {
        request: Some(req),
        reason: DlqReason::BreakerOpen as i32,
        replay_attempts: replays,
        dead_lettered_at_unix_ms: now_ms(),
        ..Default::default()
    };
    publish(
        deps,
        names::dlq_subject(bw_proto::v1::Category::Marketing, PHONE),
        &format!("{op}.dlq{replays}"),
        env.encode_to_vec(),
    )
    .await;
}

async fn put_queued(deps: &Deps, op: &str) {
    let req = request(op);
    set_ledger(deps, &req, OperationState::Queued, 0).await;
    publish(deps, names::outbox_subject(names::Lane::High, PHONE), op, req.encode_to_vec()).await;
}

async fn put_quarantined(deps: &Deps, op: &str, reason: QuarantineReason) {
    let req = request(op);
    set_ledger(deps, &req, OperationState::Quarantined, 0).await;
    let entry = QuarantineEntry { request: Some(req), reason: reason as i32, ..Default::default() };
    publish(deps, names::quarantine_subject(PHONE), &format!("{op}.q"), entry.encode_to_vec()).await;
}

async fn ledger(deps: &Deps, op: &str) -> LedgerEntry {
    Ledger::new(&deps.buckets).get(op).await.expect("ledger").expect("entry").entry
}

/// The operations replayed so far: the requests are transactional, so they go back through the rh lane.
async fn rp_lane_ops(deps: &Deps) -> Vec<String> {
    scan_stream(&deps.js, names::SEND_STREAM, &names::outbox_subject(names::Lane::PriorityReplay, PHONE))
        .await
        .expect("scan")
        .into_iter()
        .map(|m| SendRequest::decode(m.payload.as_ref()).expect("request").operation_id)
        .collect()
}

fn ids(list: &[bw_ops::account::Finding]) -> Vec<String> {
    list.iter().map(|f| f.operation_id.clone()).collect()
}

#[tokio::test]
async fn accounting_is_clean_then_detects_planted_loss_and_double_placement() {
    let (_nats, deps) = setup().await;
    put_queued(&deps, "q-1").await;
    put_dlq(&deps, "d-1", 0).await;
    put_quarantined(&deps, "x-1", QuarantineReason::PermanentError).await;
    set_ledger(&deps, &request("s-1"), OperationState::Sent, 0).await;
    let report = account(&deps.js, &deps.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.ledger_entries, 4);
    assert_eq!(report.stream_messages.get(names::DLQ_STREAM), Some(&1));

    // Planted loss: the ledger says DLQ, no stream holds it.
    set_ledger(&deps, &request("lost-1"), OperationState::Dlq, 0).await;
    // Planted double placement: in BW_SEND and in BW_DLQ at once.
    put_queued(&deps, "twice-1").await;
    let env = DlqEnvelope { request: Some(request("twice-1")), ..Default::default() };
    publish(&deps, names::dlq_subject(bw_proto::v1::Category::Marketing, PHONE), "twice-1.dlq", env.encode_to_vec())
        .await;
    // A stream copy nobody accepted.
    publish(&deps, names::outbox_subject(names::Lane::Low, PHONE), "stray-1", request("stray-1").encode_to_vec()).await;

    let report = account_expected(&deps.js, &deps.buckets, &["s-1".into(), "never-1".into()]).await.expect("account");
    assert_eq!(ids(&report.lost), ["lost-1", "never-1"], "{report}");
    assert_eq!(report.lost_count(), 2);
    assert_eq!(ids(&report.in_two_places), ["twice-1"], "{report}");
    assert_eq!(ids(&report.unaccounted), ["stray-1"], "{report}");
    assert!(report.misplaced.is_empty(), "{report}");
}

#[tokio::test]
async fn operator_dlq_replay_twice_publishes_each_operation_once() {
    let (_nats, deps) = setup().await;
    for i in 0..10 {
        put_dlq(&deps, &format!("op-{i}"), 0).await;
    }
    // One already sent: the DLQ copy is stale and must not be replayed.
    set_ledger(&deps, &request("op-3"), OperationState::Sent, 0).await;
    let mut calls = 0;
    let mut progress = |_: usize, _: usize| calls += 1;
    let first = replay_dlq_now(&deps.js, &deps.buckets, Some(PHONE), &|_| true, 100, 1_000.0, &mut progress)
        .await
        .expect("replay");
    assert_eq!(first.selected, 10);
    assert_eq!(first.outcomes.get("replayed"), Some(&9), "{first:?}");
    assert_eq!(first.outcomes.get("already_sent"), Some(&1), "{first:?}");
    assert_eq!(calls, 10);

    // The same entries again (as if the first run had crashed before deleting them): no second copy.
    for i in 0..10 {
        if i != 3 {
            let e = ledger(&deps, &format!("op-{i}")).await;
            assert_eq!((e.state(), e.replays), (OperationState::Queued, 1));
            let env = DlqEnvelope { request: Some(request(&format!("op-{i}"))), ..Default::default() };
            publish(
                &deps,
                names::dlq_subject(bw_proto::v1::Category::Marketing, PHONE),
                &format!("op-{i}.again"),
                env.encode_to_vec(),
            )
            .await;
        }
    }
    let mut noop = |_: usize, _: usize| {};
    let second =
        replay_dlq_now(&deps.js, &deps.buckets, Some(PHONE), &|_| true, 100, 1_000.0, &mut noop).await.expect("replay");
    assert_eq!(second.selected, 9);
    let mut ops = rp_lane_ops(&deps).await;
    ops.sort();
    let expected: Vec<String> = (0..10).filter(|i| *i != 3).map(|i| format!("op-{i}")).collect();
    assert_eq!(ops, expected, "every operation exactly once in the replay lane");
    assert!(dlq_items(&deps.js, deps.buckets.send, Some(PHONE)).await.expect("dlq").0.is_empty());
    let report = account(&deps.js, &deps.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
}

#[tokio::test]
async fn quarantine_replay_and_purge_end_in_one_place() {
    let (_nats, deps) = setup().await;
    put_quarantined(&deps, "perm-1", QuarantineReason::PermanentError).await;
    put_quarantined(&deps, "poison-1", QuarantineReason::Poison).await;
    put_quarantined(&deps, "poison-2", QuarantineReason::Poison).await;
    put_dlq(&deps, "dlq-1", 0).await;

    let filter = QuarantineFilter { reason: Some(QuarantineReason::Poison), ..Default::default() };
    let mut noop = |_: usize, _: usize| {};
    let report =
        replay_quarantine_now(&deps.js, &deps.buckets, &filter, 100, 1_000.0, &mut noop).await.expect("replay");
    assert_eq!(report.outcomes.get("replayed"), Some(&2), "{report:?}");
    let again = replay_quarantine_now(&deps.js, &deps.buckets, &filter, 100, 1_000.0, &mut noop).await.expect("replay");
    assert_eq!(again.selected, 0, "replayed entries left the quarantine");
    let mut ops = rp_lane_ops(&deps).await;
    ops.sort();
    assert_eq!(ops, ["poison-1", "poison-2"]);

    let all = QuarantineFilter::default();
    let purged = purge_quarantine(&deps.js, &deps.buckets, &all, 100, &mut noop).await.expect("purge");
    assert_eq!(purged.outcomes.get("purged"), Some(&1), "{purged:?}");
    let e = ledger(&deps, "perm-1").await;
    assert_eq!(e.state(), OperationState::Expired);
    assert!(e.reason.contains("purged by operator"), "{}", e.reason);
    let purged = purge_dlq(&deps.js, &deps.buckets, Some(PHONE), 100, &mut noop).await.expect("purge");
    assert_eq!(purged.outcomes.get("purged"), Some(&1), "{purged:?}");
    assert_eq!(ledger(&deps, "dlq-1").await.state(), OperationState::Expired);
    assert!(quarantine_items(&deps.js, None).await.expect("q").0.is_empty());

    let report = account(&deps.js, &deps.buckets).await.expect("account");
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.per_state.get("expired"), Some(&2));
    assert_eq!(report.per_state.get("queued"), Some(&2));
}
