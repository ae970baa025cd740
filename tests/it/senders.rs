//! Tenants end to end at the compiled default tenancy (the sender registry), with real NATS, Redis and the
//! simulator: one operation id used by two tenants is two operations, each sent once; a message whose sender
//! was revoked after ingest accepted it is quarantined with the reason, and Meta never sees it.

use bw_common::registry::Registry;
use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::SimConfig;
use bw_proto::v1::{OperationState, QuarantineReason, SenderRecord};
use bw_wire::tenancy::{self, DEFAULT_TENANT};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

async fn register(h: &Harness, phone: &str, waba: &str, tenant: &str) {
    let record = SenderRecord {
        phone_number_id: phone.into(),
        waba_id: waba.into(),
        tenant: tenant.into(),
        updated_at_unix_ms: bw_common::time::now_ms(),
        ..Default::default()
    };
    Registry::open(&h.js, 1).await.expect("registry").add(&record).await.expect("registered");
}

async fn send_as(h: &Harness, tenant: &str, op: &str, phone: &str, i: usize) {
    let producer = bw_client::Client::new(bw_e2e::producer_connection(&h.nats.url(), tenant).await);
    let reply = producer.send(&bw_e2e::order(phone, op, i)).await.expect("ingest answers");
    assert!(reply.accepted && !reply.duplicate, "{tenant} {op}: {reply:?}");
    assert_eq!(reply.operation_id, op);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_using_one_operation_id_are_both_sent_once() {
    let mut h = Harness::start(SimConfig::default()).await;
    register(&h, "106540352248001", WABA_ID, "crm").await;
    register(&h, "106540352248002", WABA_ID, "shop").await;
    h.start_ingest(&[("tenancy.mode", "registry".into())]).await;
    h.start_dispatcher_at_defaults().await;
    send_as(&h, "crm", "order-123", "106540352248001", 1).await;
    send_as(&h, "shop", "order-123", "106540352248002", 2).await;
    let keys = [tenancy::operation_key("crm", "order-123"), tenancy::operation_key("shop", "order-123")];
    assert!(h.wait_all(&keys, &SENT, WAIT).await, "both operations reached Meta");
    let oracle = h.sim.oracle();
    for (key, phone) in keys.iter().zip(["106540352248001", "106540352248002"]) {
        let accepted = oracle.get(key).unwrap_or_else(|| panic!("{key} accepted by Meta"));
        assert_eq!((accepted.count, accepted.phone_number_id.as_str()), (1, phone), "{key}");
    }
    assert!(oracle.get("order-123").is_none(), "no operation under the bare id");
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &keys).await.expect("accounting");
    assert!(report.is_clean(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_sender_was_revoked_after_acceptance_is_quarantined_and_never_sent() {
    const REMOVED: &str = "106540352248011";
    const REWABA: &str = "106540352248012";
    const MOVED: &str = "106540352248013";
    let mut h = Harness::start(SimConfig::default()).await;
    for phone in [REMOVED, REWABA, MOVED] {
        register(&h, phone, WABA_ID, DEFAULT_TENANT).await;
    }
    h.start_ingest(&[("tenancy.mode", "registry".into())]).await;
    // Accepted while each number was registered to the tenant `default`.
    for (i, (op, phone)) in [("revoked-1", REMOVED), ("revoked-2", REWABA), ("revoked-3", MOVED)].iter().enumerate() {
        send_as(&h, DEFAULT_TENANT, op, phone, i).await;
    }
    // Then an operator removes one number, re-registers one under another WABA and gives one to another tenant.
    let registry = Registry::open(&h.js, 1).await.expect("registry");
    assert!(registry.remove(REMOVED).await.expect("removed"));
    register(&h, REWABA, "102290129349999", DEFAULT_TENANT).await;
    assert!(registry.remove(MOVED).await.expect("removed"));
    register(&h, MOVED, WABA_ID, "shop").await;

    h.start_dispatcher_at_defaults().await;
    let ops = ["revoked-1".to_string(), "revoked-2".to_string(), "revoked-3".to_string()];
    assert!(h.wait_all(&ops, &[OperationState::Quarantined], WAIT).await, "each quarantined");
    for (op, phone, why) in [
        ("revoked-1", REMOVED, "is no longer in the sender registry"),
        ("revoked-2", REWABA, "is now registered under another WABA than the request's"),
        ("revoked-3", MOVED, "is now registered to another tenant than the operation's"),
    ] {
        let entry = h.ledger_entry(op).await.expect("ledger entry").entry;
        assert_eq!(entry.reason, format!("not sent: phone_number_id {phone} {why}"), "{op}");
        assert_eq!(entry.attempts, 0, "{op}: no attempt counted");
        let (items, _) = bw_ops::inspect::quarantine_items(&h.js, Some(phone)).await.expect("quarantine");
        assert_eq!(items.len(), 1, "{op}");
        assert_eq!(items[0].entry.reason(), QuarantineReason::SenderRevoked, "{op}");
        assert!(items[0].entry.detail.contains(why), "{op}: {}", items[0].entry.detail);
        assert!(!items[0].entry.detail.contains("shop"), "the new owner is not named");
    }
    let oracle = h.sim.oracle();
    for op in &ops {
        assert!(oracle.get(op).is_none(), "{op} never reached Meta");
    }
    assert_eq!(oracle.total_accepted(), 0);
    assert_eq!(h.sim.counters().requests, 0, "no call at all");
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &ops).await.expect("accounting");
    assert!(report.is_clean(), "{report}");
}
