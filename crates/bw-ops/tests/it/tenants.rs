//! `bw_ops::tenants::migrate_tenants` on a populated ledger in three partitions: entries of a registered tenant
//! move to its key (with their wamid links), those of `default`, of unregistered numbers and those already keyed
//! stay, a busy sender stops the whole run before anything changes, an interrupted run is finished without
//! losing the more advanced state, and a second run changes nothing.

use bw_common::config::NatsConfig;
use bw_common::ledger::Ledger;
use bw_common::registry::Registry;
use bw_common::service::Deps;
use bw_ops::tenants::{MigrateError, migrate_tenants};
use bw_proto::v1::*;
use bw_testkit::NatsServer;
use bw_wire::names;
use prost::Message;
use std::time::Duration;

const CRM_PHONE: &str = "1001";
const DEFAULT_PHONE: &str = "1002";
const UNREGISTERED_PHONE: &str = "1003";
const SHOP_PHONE: &str = "1004";

fn entry(op: &str, phone: &str, state: OperationState, wamid: &str) -> LedgerEntry {
    let mut e = LedgerEntry {
        operation_id: op.into(),
        waba_id: "77".into(),
        phone_number_id: phone.into(),
        wamid: wamid.into(),
        attempts: 1,
        ..Default::default()
    };
    e.set_state(state);
    e
}

async fn register(registry: &Registry, phone: &str, tenant: &str) {
    let record = SenderRecord {
        phone_number_id: phone.into(),
        waba_id: "77".into(),
        tenant: tenant.into(),
        ..Default::default()
    };
    registry.add(&record).await.expect("registered");
}

#[tokio::test]
async fn old_entries_move_to_their_tenants_key_and_nothing_else_changes() {
    let nats = NatsServer::start();
    let mut cfg = NatsConfig::single(nats.url(), "");
    cfg.ledger_partitions = 3;
    let deps = Deps::connect("ops-test", &cfg, None, Duration::from_secs(10)).await.expect("connect");
    let ledger = Ledger::new(&deps.buckets);
    let registry = Registry::open(&deps.js, 1).await.expect("registry");
    register(&registry, CRM_PHONE, "crm").await;
    register(&registry, DEFAULT_PHONE, bw_wire::tenancy::DEFAULT_TENANT).await;
    register(&registry, SHOP_PHONE, "shop").await;

    // Entries from before tenants (bare keys), and one already under its tenant's key.
    // Three ids whose tenant key lands in another partition and three whose key stays in theirs: both moves.
    let crosses = |op: &str| names::ledger_partition(op, 3) != names::ledger_partition(&format!("crm/{op}"), 3);
    let candidates: Vec<String> = (0..64).map(|i| format!("order-{i}")).collect();
    let mut crm: Vec<String> = candidates.iter().filter(|op| crosses(op)).take(3).cloned().collect();
    crm.extend(candidates.iter().filter(|op| !crosses(op)).take(3).cloned());
    crm.sort_by_key(|op| crosses(op));
    assert_eq!(crm.len(), 6);
    for (i, op) in crm.iter().enumerate() {
        let state = [OperationState::Sent, OperationState::Delivered, OperationState::Read][i % 3];
        let wamid = format!("wamid.crm{i}");
        ledger.create(&entry(op, CRM_PHONE, state, &wamid)).await.expect("create");
        ledger.link_wamid(&wamid, op).await.expect("link");
    }
    ledger.create(&entry("order-0-default", DEFAULT_PHONE, OperationState::Sent, "wamid.d")).await.expect("create");
    ledger.link_wamid("wamid.d", "order-0-default").await.expect("link");
    ledger.create(&entry("order-0-unregistered", UNREGISTERED_PHONE, OperationState::Sent, "")).await.expect("create");
    ledger.create(&entry("crm/order-new", CRM_PHONE, OperationState::Queued, "")).await.expect("create");
    ledger.create(&entry("shop-1", SHOP_PHONE, OperationState::Dlq, "")).await.expect("create");
    let revision = |op: &'static str| {
        let ledger = ledger.clone();
        async move { ledger.get(op).await.expect("read").map(|v| v.revision) }
    };
    let untouched = [
        ("order-0-default", revision("order-0-default").await),
        ("order-0-unregistered", revision("order-0-unregistered").await),
        ("crm/order-new", revision("crm/order-new").await),
    ];

    // A dead letter of a shop number from before tenants: the run refuses before changing anything.
    let envelope = DlqEnvelope {
        request: Some(SendRequest { operation_id: "shop-1".into(), ..Default::default() }),
        ..Default::default()
    };
    let dlq = deps.js.get_stream(names::DLQ_STREAM).await.expect("dlq");
    let sequence = deps
        .js
        .publish(names::dlq_subject(Category::Marketing, SHOP_PHONE), envelope.encode_to_vec().into())
        .await
        .expect("publish")
        .await
        .expect("stored")
        .sequence;
    let refused = migrate_tenants(&deps.js, &deps.buckets, &registry).await.expect_err("busy sender");
    match &refused {
        MigrateError::Busy { stream, phone, tenant, messages } => {
            assert_eq!(
                (stream.as_str(), phone.as_str(), tenant.as_str(), *messages),
                ("BW_DLQ", SHOP_PHONE, "shop", 1)
            );
        }
        other => panic!("unexpected {other}"),
    }
    assert!(refused.to_string().contains("nothing was changed"), "{refused}");
    for op in &crm {
        assert!(ledger.get(op).await.expect("read").is_some(), "{op} not moved while refused");
    }
    assert!(dlq.delete_message(sequence).await.expect("deleted"));

    // An interrupted earlier run: the second was copied at an older state (SENT; the old entry is DELIVERED now),
    // and the fifth was copied, its link re-pointed, and a status through that link moved the copy to READ while
    // the old entry still says DELIVERED.
    let (one, four) = (format!("crm/{}", crm[1]), format!("crm/{}", crm[4]));
    ledger.create(&entry(&one, CRM_PHONE, OperationState::Sent, "wamid.crm1")).await.expect("create");
    ledger.create(&entry(&four, CRM_PHONE, OperationState::Read, "wamid.crm4")).await.expect("create");
    ledger.link_wamid("wamid.crm4", &four).await.expect("link");

    let report = migrate_tenants(&deps.js, &deps.buckets, &registry).await.expect("migrates");
    assert_eq!(report.moved.get("crm"), Some(&6), "{report:?}");
    assert_eq!(report.moved.get("shop"), Some(&1), "{report:?}");
    assert_eq!(report.links, 5, "every link still naming an old id, not the fifth's: {report:?}");
    assert_eq!((report.default_tenant, report.unregistered, report.keyed), (1, 1, 3), "{report:?}");
    assert!(report.corrupt.is_empty());

    for (i, op) in crm.iter().enumerate() {
        assert!(ledger.get(op).await.expect("read").is_none(), "{op} left under its old key");
        let key = format!("crm/{op}");
        let moved = ledger.get(&key).await.expect("read").unwrap_or_else(|| panic!("{key} missing")).entry;
        assert_eq!(moved.operation_id, key);
        assert_eq!(moved.phone_number_id, CRM_PHONE);
        let expected = match i {
            // The interrupted copy is brought up to the old entry's state; the one already ahead stays ahead.
            4 => OperationState::Read,
            _ => [OperationState::Sent, OperationState::Delivered, OperationState::Read][i % 3],
        };
        assert_eq!(moved.state(), expected, "{key}");
        let link = ledger.operation_for_wamid(&format!("wamid.crm{i}")).await.expect("link");
        assert_eq!(link.as_deref(), Some(key.as_str()), "wamid link of {key}");
    }
    assert_eq!(ledger.get("shop/shop-1").await.expect("read").map(|v| v.entry.state()), Some(OperationState::Dlq));
    for (op, before) in untouched {
        assert_eq!(revision(op).await, before, "{op} untouched");
    }
    assert_eq!(ledger.operation_for_wamid("wamid.d").await.expect("link").as_deref(), Some("order-0-default"));

    // Safe to run again: nothing left to move.
    let again = migrate_tenants(&deps.js, &deps.buckets, &registry).await.expect("again");
    assert_eq!(again.moved_total(), 0, "{again:?}");
    assert_eq!(again.keyed, 8, "crm's 6 moved and its new one, shop's one: {again:?}");
}
