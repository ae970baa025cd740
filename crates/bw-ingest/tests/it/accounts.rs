//! NATS accounts (deploy/nats/accounts.conf, the very file, with its producers' region generated for the tenant
//! `crm`): the tenant's producer user sends and follows its feed, and is refused on internal subjects, the ledger
//! and stream administration.

use crate::support::{WAIT, test_config};
use bw_client::{Client, Request};
use bw_proto::v1::OutcomeKind;
use bw_wire::names;

const WABA: &str = "1001";
const PHONE: &str = "2002";

#[tokio::test]
async fn a_producer_user_is_refused_on_internal_subjects() {
    let server = crate::support::accounts_server();
    let port = server.port();
    // The operator registers the number to `crm`; ingest runs as its own user, on its own inbox prefix, at the
    // compiled default tenancy (the registry).
    let operator = async_nats::ConnectOptions::with_user_and_password("operator".into(), "op-pw".into())
        .connect(format!("127.0.0.1:{port}"))
        .await
        .expect("operator connects");
    crate::support::register(&async_nats::jetstream::new(operator), PHONE, WABA, "crm").await;
    let mut cfg = test_config(&format!("nats://ingest:ingest-pw@127.0.0.1:{port}"));
    cfg.nats.inbox_prefix = "_INBOX_ingest".into();
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("service connects");
    let token = tokio_util::sync::CancellationToken::new();
    let ingest = tokio::spawn(bw_ingest::run(cfg, deps.clone(), token.clone()));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await, "ingest ready");

    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<String>();
    let producer = bw_client::tenant_options("crm", "crm-pw")
        .event_callback(move |ev| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(ev.to_string());
            }
        })
        .connect(format!("127.0.0.1:{port}"))
        .await
        .expect("producer connects");

    // Allowed: send, and follow its feed through its own durable consumer.
    let client = Client::new(producer.clone());
    let reply = client.send(&Request::text("acct-1", WABA, PHONE, "+5491155551234", "hi").build()).await;
    assert!(reply.expect("answered").accepted);
    let producer_js = async_nats::jetstream::new(producer.clone());
    let mut feed = bw_client::follow(&producer_js, "crm", Some(PHONE)).await.expect("its own feed consumer");
    let item = tokio::time::timeout(WAIT, feed.next()).await.expect("in time").expect("open").expect("event");
    assert_eq!((item.event.kind(), item.event.operation_id.as_str()), (OutcomeKind::Accepted, "acct-1"));
    item.ack().await.expect("ack allowed");
    assert!(client.status(PHONE, "acct-1").await.expect("status allowed").found);

    // Refused: an internal subject, the ledger, stream administration, snooping on the services' subjects.
    let refused = |what: String| what.contains("Permissions Violation");
    producer
        .publish(names::dlq_subject(bw_proto::v1::Category::Marketing, PHONE), "x".into())
        .await
        .expect("queued locally");
    producer.publish("$KV.BW_LEDGER.acct-1".to_string(), "x".into()).await.expect("queued locally");
    producer.publish("$JS.API.STREAM.PURGE.BW_SEND".to_string(), "".into()).await.expect("queued locally");
    let _snoop = producer.subscribe("_INBOX.>".to_string()).await.expect("queued locally");
    producer.flush().await.expect("flush");
    let mut violations = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while violations.len() < 4 {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(ev)) if refused(ev.clone()) => violations.push(ev),
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    let all = violations.join("\n");
    for subject in [
        names::dlq_subject(bw_proto::v1::Category::Marketing, PHONE).as_str(),
        "$KV.BW_LEDGER.acct-1",
        "$JS.API.STREAM.PURGE.BW_SEND",
        "_INBOX.>",
    ] {
        assert!(all.contains(subject), "no violation for {subject}: {all}");
    }
    // Nothing happened: the request is still in BW_SEND and its ledger entry is intact.
    let send = deps.js.get_stream(names::SEND_STREAM).await.expect("stream").get_info().await.expect("info");
    assert_eq!(send.state.messages, 1);
    let ledger = bw_common::ledger::Ledger::new(&deps.buckets);
    assert!(ledger.get("crm/acct-1").await.expect("ledger").is_some());
    token.cancel();
    ingest.await.expect("joins").expect("stops");
}

/// An older deployment's streams and buckets have no byte limit: ingest, as its own NATS user, gives them the
/// configured limits at start, with no permissions violation.
#[tokio::test]
async fn ingest_gives_existing_streams_their_byte_limits_as_its_own_user() {
    let server = crate::support::accounts_server();
    let port = server.port();
    let mut cfg = test_config(&format!("nats://ingest:ingest-pw@127.0.0.1:{port}"));
    cfg.nats.inbox_prefix = "_INBOX_ingest".into();
    // The older layout, created by the ingest user itself (as an older version did): no byte limits.
    let old = async_nats::ConnectOptions::with_user_and_password("ingest".into(), "ingest-pw".into())
        .custom_inbox_prefix("_INBOX_ingest")
        .connect(format!("127.0.0.1:{port}"))
        .await
        .expect("ingest user connects");
    let old_js = async_nats::jetstream::new(old);
    let send = names::SendPartitions::new(1);
    for mut config in bw_common::nats::stream_configs(&cfg.nats.limits, 1, send) {
        config.max_bytes = -1;
        old_js.create_stream(config).await.expect("old stream");
    }
    for bucket in bw_common::nats::bucket_configs(&cfg.nats) {
        let mut config = bw_common::nats::kv_stream_config(&bucket);
        config.max_bytes = -1;
        old_js.create_stream(config).await.expect("old bucket");
    }
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("service connects");
    let token = tokio_util::sync::CancellationToken::new();
    let ingest = tokio::spawn(bw_ingest::run(cfg.clone(), deps.clone(), token.clone()));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await, "ingest ready");
    for (name, want) in [
        (names::SEND_STREAM.to_string(), cfg.nats.limits.send_max_bytes),
        (names::INBOUND_STREAM.to_string(), cfg.nats.limits.inbound_max_bytes),
        (format!("KV_{}", names::ledger_bucket(0)), cfg.nats.limits.ledger_max_bytes),
        (format!("KV_{}", names::WEBHOOK_DEDUP_BUCKET), cfg.nats.limits.webhook_dedup_max_bytes),
    ] {
        let info = old_js.get_stream(&name).await.expect("stream").cached_info().clone();
        assert_eq!(info.config.max_bytes, want, "{name}");
    }
    let log = std::fs::read_to_string(server.dir().join("nats.log")).unwrap_or_default();
    let violations: Vec<&str> = log.lines().filter(|l| l.contains("Violation")).collect();
    assert!(violations.is_empty(), "{violations:?}");
    token.cancel();
    tokio::time::timeout(WAIT, ingest).await.expect("stops").expect("joins").expect("ok");
}
