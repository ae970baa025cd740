//! The sender registry against a real nats-server: ownership, refusals, and a view that follows changes.

use bw_common::registry::{Owner, Registry, RegistryError, RegistryView};
use bw_proto::v1::SenderRecord;
use bw_testkit::NatsServer;
use std::time::Duration;

fn record(phone: &str, waba: &str, tenant: &str) -> SenderRecord {
    SenderRecord { phone_number_id: phone.into(), waba_id: waba.into(), tenant: tenant.into(), ..Default::default() }
}

/// Polls `check` until it holds (the view follows the bucket through a watch); panics after a generous bound.
async fn eventually<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..400 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("condition not reached");
}

#[tokio::test]
async fn a_number_belongs_to_one_tenant_and_views_follow_changes() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let registry = Registry::open(&js, 1).await.expect("open");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let view = RegistryView::start(registry.clone(), shutdown.clone()).await.expect("view");

    assert_eq!(view.owner("1001", "9").await.expect("owner"), Owner::Unregistered);
    registry.add(&record("1001", "2001", "crm")).await.expect("add");
    // Found at once through the direct read on a miss, before the watch delivers it.
    assert_eq!(view.owner("1001", "anything").await.expect("owner").tenant(), Some("crm"));
    // Updating the WABA of one's own number is allowed; moving it to another tenant is not.
    registry.add(&record("1001", "2002", "crm")).await.expect("update");
    let refused = registry.add(&record("1001", "2002", "shop")).await.expect_err("owned by crm");
    assert!(matches!(&refused, RegistryError::OwnedByAnother(t) if t == "crm"), "{refused}");
    assert!(matches!(registry.add(&record("+1001", "2002", "shop")).await, Err(RegistryError::Invalid(_))));
    eventually(|| {
        let view = view.clone();
        async move { matches!(view.owner("1001", "").await, Ok(Owner::Known { waba_id, .. }) if waba_id == "2002") }
    })
    .await;

    registry.add(&record("1002", "2003", "shop")).await.expect("add shop");
    let listed: Vec<(String, String)> =
        registry.list().await.expect("list").into_iter().map(|r| (r.tenant, r.phone_number_id)).collect();
    assert_eq!(listed, vec![("crm".into(), "1001".into()), ("shop".into(), "1002".into())]);

    assert!(registry.remove("1001").await.expect("rm"));
    assert!(!registry.remove("1001").await.expect("rm again"));
    eventually(|| {
        let view = view.clone();
        async move { view.owner("1001", "").await.ok() == Some(Owner::Unregistered) }
    })
    .await;
    // Once removed, another tenant may take it.
    registry.add(&record("1001", "2002", "shop")).await.expect("re-add to shop");

    // Dev mode: everything is the default tenant's, with the request's WABA.
    let dev = RegistryView::dev();
    assert_eq!(dev.owner("5", "7").await.expect("dev").tenant(), Some(bw_wire::tenancy::DEFAULT_TENANT));
    shutdown.cancel();
}
