use super::*;
use bw_testkit::NatsServer;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

#[test]
fn builder_fills_every_field() {
    let r = Request::template("op-1", "1001", "2002", "+5491155551234", "order_update", "es_AR")
        .category(Category::Marketing)
        .param("A-1")
        .param("mañana")
        .deadline_unix_ms(42)
        .customer_last_inbound_unix_ms(7)
        .label("campaign", "spring")
        .build();
    assert_eq!((r.operation_id.as_str(), r.waba_id.as_str(), r.phone_number_id.as_str()), ("op-1", "1001", "2002"));
    assert_eq!(r.category(), Category::Marketing);
    assert_eq!((r.deadline_unix_ms, r.customer_last_inbound_unix_ms), (42, 7));
    match r.payload {
        Some(Payload::Template(t)) => {
            assert_eq!((t.name.as_str(), t.language.as_str()), ("order_update", "es_AR"));
            assert_eq!(t.body_parameters, vec!["A-1".to_string(), "mañana".to_string()]);
        }
        other => panic!("unexpected payload {other:?}"),
    }
    let t = Request::text("op-2", "1", "2", "+5491155551234", "hi").preview_url(true).param("ignored").build();
    assert_eq!(t.category(), Category::Transactional);
    assert!(matches!(t.payload, Some(Payload::Text(ref p)) if p.body == "hi" && p.preview_url));
}

fn fast() -> Options {
    Options {
        timeout: Duration::from_millis(300),
        tries: 20,
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(100),
    }
}

/// A fake ingest answering every request: the first `unavailable_first` answers say UNAVAILABLE.
async fn responder(nats: async_nats::Client, unavailable_first: u32, seen: Arc<AtomicU32>) {
    let mut sub = nats.subscribe(names::INTAKE_WILDCARD).await.expect("subscribe");
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            let request = SendRequest::decode(msg.payload.as_ref()).expect("request");
            let reply = if n <= unavailable_first {
                IntakeReply {
                    operation_id: request.operation_id,
                    reason: RejectReason::Unavailable as i32,
                    error: "ledger unavailable".into(),
                    ..Default::default()
                }
            } else {
                IntakeReply { accepted: true, operation_id: request.operation_id, ..Default::default() }
            };
            if let Some(to) = msg.reply {
                let _ = nats.publish(to, reply.encode_to_vec().into()).await;
            }
        }
    });
}

#[tokio::test]
async fn retries_no_responders_and_unavailable_with_the_same_id() {
    let server = NatsServer::start();
    let nats = async_nats::connect(server.url()).await.expect("connect");
    let client = Client::with_options(nats.clone(), fast());
    let request = Request::text("op-retry", "1", "2", "+5491155551234", "hi").build();
    let seen = Arc::new(AtomicU32::new(0));
    // Nobody listens yet: the first tries get "no responders"; the responder comes up a little later.
    let late = {
        let (nats, seen) = (nats.clone(), seen.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            responder(nats, 2, seen).await;
        })
    };
    let reply = client.send(&request).await.expect("eventually answered");
    late.await.expect("responder task");
    assert!(reply.accepted);
    assert_eq!(reply.operation_id, "op-retry");
    assert_eq!(seen.load(Ordering::SeqCst), 3, "two UNAVAILABLE answers, then accepted");
}

#[tokio::test]
async fn gives_up_with_a_clear_error() {
    let server = NatsServer::start();
    let nats = async_nats::connect(server.url()).await.expect("connect");
    let client = Client::with_options(nats, Options { tries: 2, ..fast() });
    let request = Request::text("op-none", "1", "2", "+5491155551234", "hi").build();
    let err = client.send(&request).await.expect_err("nobody listens");
    let text = err.to_string();
    assert!(text.contains("op-none") && text.contains("2 tries"), "{text}");
}

/// nats-server with the accounts config generated for two tenants (crm: 3001, 3002; shop: 4001) and a password
/// for each user it names.
fn tenant_server() -> NatsServer {
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/nats/accounts.conf"))
        .expect("accounts.conf");
    let record = |phone: &str, tenant: &str| bw_proto::v1::SenderRecord {
        phone_number_id: phone.into(),
        waba_id: "77".into(),
        tenant: tenant.into(),
        ..Default::default()
    };
    let records = [record("3001", "crm"), record("3002", "crm"), record("4001", "shop")];
    let conf = bw_ops::senders::render_accounts(&base, &records).expect("rendered");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("accounts.conf");
    std::fs::write(&path, conf).expect("written");
    let vars = [
        "BW_NATS_INGEST_PASSWORD",
        "BW_NATS_DISPATCHER_PASSWORD",
        "BW_NATS_REPLAY_PASSWORD",
        "BW_NATS_BREAKER_COORDINATOR_PASSWORD",
        "BW_NATS_ALERTING_PASSWORD",
        "BW_NATS_CONSOLE_PASSWORD",
        "BW_NATS_OPERATOR_PASSWORD",
        "BW_NATS_PRODUCER_CRM_PASSWORD",
        "BW_NATS_PRODUCER_SHOP_PASSWORD",
    ];
    let envs: Vec<(&str, &str)> = vars.iter().map(|v| (*v, "pw")).collect();
    NatsServer::start_with_config(&path, &envs)
}

/// Permission violations the server logged.
fn violations(server: &NatsServer) -> Vec<String> {
    let log = std::fs::read_to_string(server.dir().join("nats.log")).unwrap_or_default();
    log.lines().filter(|l| l.contains("Violation")).map(str::to_string).collect()
}

/// `follow` works with nothing but a tenant's own rights (the filtered create subject, no stream info): all of
/// the tenant's numbers, then one of them, never another tenant's events; following another tenant is refused.
#[tokio::test]
async fn a_tenant_follows_its_own_feed_with_its_own_rights_only() {
    let server = tenant_server();
    let url = format!("127.0.0.1:{}", server.port());
    // The feed as ingest writes it: ingest's user creates BW_FEED and publishes an event per operation.
    let ingest = async_nats::ConnectOptions::with_user_and_password("ingest".into(), "pw".into())
        .custom_inbox_prefix("_INBOX_ingest")
        .connect(&url)
        .await
        .expect("ingest connects");
    let ingest_js = async_nats::jetstream::new(ingest);
    ingest_js
        .get_or_create_stream(async_nats::jetstream::stream::Config {
            name: names::FEED_STREAM.into(),
            subjects: vec!["bw.feed.v1.>".into()],
            ..Default::default()
        })
        .await
        .expect("feed stream");
    let publish = |tenant: &'static str, phone: &'static str, op: &'static str| {
        let js = ingest_js.clone();
        async move {
            let event = OutcomeEvent {
                operation_id: op.into(),
                tenant: tenant.into(),
                phone_number_id: phone.into(),
                ..Default::default()
            };
            let subject = tenancy::feed_subject(tenant, phone, op);
            js.publish(subject, event.encode_to_vec().into()).await.expect("publish").await.expect("stored");
        }
    };
    publish("crm", "3001", "a-1").await;
    publish("shop", "4001", "a-1").await;
    publish("crm", "3002", "b-1").await;

    let crm = tenant_options("crm", "pw").connect(&url).await.expect("crm connects");
    let crm_js = async_nats::jetstream::new(crm.clone());
    let mut feed = follow(&crm_js, "crm", None).await.expect("crm follows its feed");
    let mut seen = Vec::new();
    for _ in 0..2 {
        let item = tokio::time::timeout(Duration::from_secs(10), feed.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("event");
        seen.push((item.event.tenant.clone(), item.event.phone_number_id.clone(), item.event.operation_id.clone()));
        item.ack().await.expect("ack allowed");
    }
    assert_eq!(seen, [("crm".into(), "3001".into(), "a-1".into()), ("crm".into(), "3002".into(), "b-1".into())]);
    drop(feed);

    // One number only: the same consumer takes the narrower filter and keeps its place.
    publish("crm", "3001", "a-2").await;
    publish("crm", "3002", "b-2").await;
    let mut feed = follow(&crm_js, "crm", Some("3002")).await.expect("one number");
    let item = tokio::time::timeout(Duration::from_secs(10), feed.next())
        .await
        .expect("in time")
        .expect("open")
        .expect("event");
    assert_eq!((item.event.phone_number_id.as_str(), item.event.operation_id.as_str()), ("3002", "b-2"));
    item.ack().await.expect("ack");
    assert!(violations(&server).is_empty(), "the tenant's own rights sufficed: {:?}", violations(&server));

    // Another tenant's feed is refused, by name and by filter.
    // A refused request is never answered: give up sooner than the default timeout.
    let short = async_nats::jetstream::ContextBuilder::new().timeout(Duration::from_secs(2)).build(crm);
    assert!(follow(&short, "shop", None).await.is_err(), "crm followed shop's feed");
    let log = violations(&server);
    assert!(log.iter().any(|l| l.contains("$JS.API.CONSUMER.CREATE.BW_FEED.feed-shop")), "{log:?}");
}
