//! Several ingest instances sharing the queue group and the durable consumers; W3C trace context.

use crate::support::{self, APP_SECRET, WAIT, entry_in, start};
use bw_client::{Client, Request};
use bw_common::service::Deps;
use bw_ingest::Listeners;
use bw_proto::v1::OperationState;
use bw_wire::names::{self, Lane};
use tokio_util::sync::CancellationToken;

fn counter(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .map(|v| v as u64)
        .sum()
}

#[tokio::test]
async fn two_instances_share_intake_and_webhooks() {
    let env = start(|_| {}).await;
    // A second instance on the same NATS, with its own metrics.
    let cfg = support::test_config(&env.server.url());
    let deps2 = Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("deps");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let token2 = CancellationToken::new();
    let second = tokio::spawn(bw_ingest::run_on(
        cfg,
        deps2.clone(),
        Listeners { http: listener, webhook: None },
        token2.clone(),
    ));
    let health = deps2.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await);
    let metrics2 = || {
        let mut out = String::new();
        let registry = deps2.metrics.lock().expect("lock");
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        out
    };

    let client = Client::new(env.nats.clone());
    for i in 0..40 {
        let request = Request::text(&format!("shared-{i}"), "1001", "2002", "+5491155551234", "hi").build();
        let reply = client.send(&request).await.expect("answered");
        assert!(reply.accepted && !reply.duplicate, "{reply:?}");
    }
    let handled =
        counter(&env.metrics_text(), "bw_intake_requests_total") + counter(&metrics2(), "bw_intake_requests_total");
    assert_eq!(handled, 40, "each request handled by exactly one instance");
    assert_eq!(env.count(names::SEND_STREAM).await, 40);

    for i in 0..20 {
        let op = format!("wh-{i}");
        env.ledger.create(&entry_in(&op, OperationState::Sent)).await.expect("ledger");
        let body = serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": [{
            "field": "messages", "value": {"metadata": {"phone_number_id": "2"},
            "statuses": [{"id": format!("wamid.{i}"), "status": "read", "timestamp": "1", "biz_opaque_callback_data": op}]}}]}]})
        .to_string();
        let res = support::http_client()
            .post(env.url("/webhooks/meta"))
            .header("X-Hub-Signature-256", bw_ingest::webhook::sign(APP_SECRET.as_bytes(), body.as_bytes()))
            .body(body)
            .send()
            .await
            .expect("post");
        assert_eq!(res.status(), 200);
    }
    let done = bw_testkit::wait_until(WAIT, || async {
        counter(&env.metrics_text(), "bw_webhooks_processed_total")
            + counter(&metrics2(), "bw_webhooks_processed_total")
            == 20
    })
    .await;
    assert!(done, "each stored delivery processed once across both instances");
    for i in 0..20 {
        assert_eq!(env.entry(&format!("wh-{i}")).await.expect("entry").state(), OperationState::Read);
    }
    token2.cancel();
    second.await.expect("joins").expect("second instance stops cleanly");
    env.stop().await;
}

fn install_otel() {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("bw-ingest-test"));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber).expect("first global subscriber");
    });
}

#[tokio::test]
async fn trace_context_flows_from_producer_to_outbox() {
    install_otel();
    let env = start(|_| {}).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01").as_str());
    let request = Request::text("traced-1", "1001", "2002", "+5491155551234", "hi").build();
    let payload = prost::Message::encode_to_vec(&request);
    env.nats.request_with_headers(names::intake_subject("2002"), headers, payload.into()).await.expect("reply");
    let stored = env.last(names::SEND_STREAM, &names::outbox_subject(Lane::High, "2002")).await;
    let traceparent = stored.headers.get("traceparent").map(|v| v.to_string()).unwrap_or_default();
    assert!(traceparent.contains(trace_id), "outbox message continues the producer's trace: `{traceparent}`");
    assert!(!traceparent.contains("00f067aa0ba902b7"), "with the ingest span as the parent");
    env.stop().await;
}

#[tokio::test]
async fn webhooks_can_have_their_own_port() {
    let server = bw_testkit::NatsServer::start();
    let cfg = support::test_config(&server.url());
    let deps = Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("deps");
    let intake = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let hooks = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let (intake_addr, hooks_addr) = (intake.local_addr().expect("addr"), hooks.local_addr().expect("addr"));
    let token = CancellationToken::new();
    let task = tokio::spawn(bw_ingest::run_on(
        cfg,
        deps.clone(),
        Listeners { http: intake, webhook: Some(hooks) },
        token.clone(),
    ));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await);
    let http = support::http_client();
    let query =
        format!("/webhooks/meta?hub.mode=subscribe&hub.challenge=42&hub.verify_token={}", support::VERIFY_TOKEN);
    let on_hooks = http.get(format!("http://{hooks_addr}{query}")).send().await.expect("get");
    assert_eq!(on_hooks.status(), 200);
    let on_intake = http.get(format!("http://{intake_addr}{query}")).send().await.expect("get");
    assert_eq!(on_intake.status(), 404, "webhook routes are not on the producer port");
    let res = http.post(format!("http://{hooks_addr}/v1/messages")).body("{}").send().await.expect("post");
    assert_eq!(res.status(), 404, "producer routes are not on the webhook port");
    token.cancel();
    task.await.expect("joins").expect("stops cleanly");
}
