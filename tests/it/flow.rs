//! One message through the whole pipeline, and the basic dispatch rows.

use bw_common::proto::{Category, OperationState};
use bw_e2e::{Harness, WABA_ID};
use std::time::Duration;

const PHONE: &str = "106540352242922";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_flows_from_producer_to_meta_and_back() {
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    let request =
        bw_client::Request::template("e2e-order-1", WABA_ID, PHONE, "+5491155551234", "order_confirmation", "es_AR")
            .param("1234")
            .category(Category::Transactional)
            .build();
    let reply = h.producer().send(&request).await.expect("ingest answers");
    assert!(reply.accepted, "rejected: {}", reply.error);
    assert!(!reply.duplicate);

    assert!(
        h.wait_state(
            "e2e-order-1",
            &[OperationState::Sent, OperationState::Delivered, OperationState::Read],
            Duration::from_secs(20)
        )
        .await,
        "message never reached SENT: {:?}",
        h.ledger_entry("e2e-order-1").await.map(|v| v.entry)
    );
    let entry = h.ledger_entry("e2e-order-1").await.expect("ledger entry").entry;
    assert!(entry.wamid.starts_with("wamid."), "wamid recorded: {}", entry.wamid);
    let oracle = h.sim.oracle();
    let seen = oracle.get("e2e-order-1").expect("the simulator accepted it");
    assert_eq!(seen.count, 1, "sent exactly once");
    assert_eq!(seen.wamids, vec![entry.wamid.clone()]);

    // The simulator's status webhooks come back through ingest and move the ledger forward.
    assert!(
        h.wait_state("e2e-order-1", &[OperationState::Read], Duration::from_secs(20)).await,
        "status webhooks did not reach the ledger: {:?}",
        h.ledger_entry("e2e-order-1").await.map(|v| v.entry.state())
    );
    // The wamid leads back to the operation.
    assert_eq!(h.ledger.operation_for_wamid(&entry.wamid).await.expect("kv"), Some("e2e-order-1".to_string()));
}
