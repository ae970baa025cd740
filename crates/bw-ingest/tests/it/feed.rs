//! Outcome feed (one event per ledger revision, per sender) and the status query over NATS and HTTP.

use crate::support::{self, APP_SECRET, WAIT, start};
use bw_client::{Client, Request};
use bw_ingest::webhook::sign;
use bw_proto::v1::{OperationState, OutcomeKind};
use bw_wire::tenancy::DEFAULT_TENANT;

const WABA: &str = "1001";
const PHONE: &str = "2002";

fn status_body(wamid: &str, status: &str, op: &str) -> String {
    serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": WABA, "changes": [{
        "field": "messages",
        "value": {"messaging_product": "whatsapp", "metadata": {"phone_number_id": PHONE},
                  "statuses": [{"id": wamid, "status": status, "timestamp": "1750030073",
                                "recipient_id": "5491155551234", "biz_opaque_callback_data": op}]}}]}]})
    .to_string()
}

#[tokio::test]
async fn every_state_change_reaches_the_senders_feed_and_the_status_query() {
    let env = start(|_| {}).await;
    let client = Client::new(env.nats.clone());
    let mut feed = support::Feed::follow(&env.js, DEFAULT_TENANT, PHONE, "crm-test").await;
    let mut next_kind = async || feed.next().await.0;
    let op = "feed-1";
    let reply = client.send(&Request::text(op, WABA, PHONE, "+5491155551234", "hi").build()).await.expect("reply");
    assert!(reply.accepted);
    let accepted = next_kind().await;
    assert_eq!((accepted.kind(), accepted.operation_id.as_str()), (OutcomeKind::Accepted, op));
    // The dispatcher's write when Meta answers 200 (played by the test).
    env.ledger
        .update(op, |cur| {
            let mut next = cur?.clone();
            next.set_state(OperationState::Sent);
            next.wamid = "wamid.FEED1".into();
            next.attempts = 1;
            Some(next)
        })
        .await
        .expect("ledger");
    let sent = next_kind().await;
    assert_eq!((sent.kind(), sent.wamid.as_str(), sent.attempts), (OutcomeKind::Sent, "wamid.FEED1", 1));
    assert!(sent.revision > accepted.revision);
    let http = support::http_client();
    for (word, kind) in [("delivered", OutcomeKind::Delivered), ("read", OutcomeKind::Read)] {
        let body = status_body("wamid.FEED1", word, op);
        let res = http
            .post(env.url("/webhooks/meta"))
            .header("X-Hub-Signature-256", sign(APP_SECRET.as_bytes(), body.as_bytes()))
            .body(body)
            .send()
            .await
            .expect("post");
        assert_eq!(res.status(), 200);
        let ev = next_kind().await;
        assert_eq!(ev.kind(), kind, "{word}");
        assert!(!format!("{ev:?}").contains("5491155551234"), "no recipient in events");
    }

    // Status over NATS: current state and the journey, oldest first.
    let status = client.status(PHONE, op).await.expect("status reply");
    assert!(status.found, "{status:?}");
    assert_eq!(status.current.as_ref().map(|c| c.kind()), Some(OutcomeKind::Read));
    let kinds: Vec<OutcomeKind> = status.journey.iter().map(|e| e.kind()).collect();
    assert_eq!(kinds, vec![OutcomeKind::Accepted, OutcomeKind::Sent, OutcomeKind::Delivered, OutcomeKind::Read]);
    // Another sender's subject does not see it.
    assert!(!client.status("2003", op).await.expect("reply").found);

    // Status over HTTP: authenticated, with UTC and display-zone times.
    let res = http.get(env.url(&format!("/v1/messages/{op}"))).send().await.expect("get");
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.expect("json");
    assert_eq!(body["state"], "read", "{body}");
    assert_eq!(body["wamid"], "wamid.FEED1");
    assert_eq!(body["time_zone"], "America/Argentina/Buenos_Aires");
    assert!(body["accepted_at"]["utc"].as_str().is_some_and(|t| t.ends_with('Z')), "{body}");
    assert!(body["accepted_at"]["local"].as_str().is_some_and(|t| t.ends_with("-03")), "{body}");
    let events: Vec<&str> =
        body["journey"].as_array().expect("journey").iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(events, vec!["accepted", "sent", "delivered", "read"]);
    let bare = support::bare_http_client().get(env.url(&format!("/v1/messages/{op}"))).send().await.expect("get");
    assert_eq!(bare.status(), 401);
    let missing = http.get(env.url("/v1/messages/no-such-op")).send().await.expect("get");
    assert_eq!(missing.status(), 404);
    env.stop().await;
}

#[tokio::test]
async fn a_second_ingest_instance_never_duplicates_feed_events() {
    let env = start(|_| {}).await;
    // A second instance on the same server shares the publisher's durable consumer.
    let mut cfg = support::test_config(&env.server.url());
    cfg.http.listen = "127.0.0.1:0".into();
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("deps");
    let token = tokio_util::sync::CancellationToken::new();
    let second = tokio::spawn(bw_ingest::run(cfg, deps.clone(), token.clone()));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await, "second ready");
    let client = Client::new(env.nats.clone());
    for i in 0..20 {
        let op = format!("dup-{i}");
        assert!(
            client.send(&Request::text(&op, WABA, PHONE, "+5491155551234", "hi").build()).await.expect("r").accepted
        );
    }
    let feed_count = || async {
        env.js
            .get_stream(bw_ingest::feed::FEED_STREAM)
            .await
            .expect("feed")
            .get_info()
            .await
            .expect("info")
            .state
            .messages
    };
    assert!(bw_testkit::wait_until(WAIT, || async { feed_count().await == 20 }).await, "one event per revision");
    let ledger_stream = env.js.get_stream("KV_BW_LEDGER").await.expect("kv stream");
    let consumer: async_nats::jetstream::consumer::PullConsumer =
        ledger_stream.get_consumer(bw_ingest::feed::FEED_CONSUMER).await.expect("consumer");
    let drained = bw_testkit::wait_until(WAIT, || async {
        let mut c = consumer.clone();
        c.info().await.is_ok_and(|i| i.num_pending == 0 && i.num_ack_pending == 0)
    })
    .await;
    assert!(drained, "every revision acked");
    assert_eq!(feed_count().await, 20, "still one event per revision");
    token.cancel();
    second.await.expect("joins").expect("stops");
    env.stop().await;
}
