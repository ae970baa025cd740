//! The hostile-tenant suite: two tenants of one Breakwater, `crm` (the victim) and `shop` (the attacker), each
//! with its own NATS user, password, inbox prefix and HTTP key, against nats-server running the accounts config
//! `bwctl senders nats-accounts` generates (tests/it/tenant_stack.rs), with ingest, the dispatcher and replay as
//! their own users at the compiled default tenancy (the registry), redis-server and the Meta simulator.
//!
//! The attacker tries what a hostile producer would: send as the victim's number (NATS and HTTP), with the
//! victim's WABA id, read the victim's feed (its consumer, another filter, the stream's listing, its inbox),
//! query the victim's operation (NATS and HTTP), reuse the victim's operation id, point replies and deliveries
//! into the ledger's KV subjects, and pull from ingest's own consumers. Each attempt is refused with a clear error
//! (a permissions violation the server logs, or a precise reject reason), and nothing of the victim changes: its
//! ledger entry keeps its revision, its feed subjects keep their message counts, and its feed consumer keeps its
//! position. Reusing the id is the one attempt that is accepted: as the attacker's own operation, and Meta sees
//! each tenant's message exactly once.
//!
//! Two attempts are refused by the ingest limits (callbacks into the cloud metadata service, floods of unsigned
//! webhooks): `a_callback_to_the_metadata_service_is_a_configuration_error` and
//! `unsigned_webhooks_are_refused_before_their_body_is_read`.

use crate::tenant_stack::{TenantStack, WAIT, http_key};
use bw_client::{Client, Options, Request};
use bw_e2e::WABA_ID;
use bw_proto::v1::{OperationState, OutcomeKind, RejectReason, SendRequest, StatusQuery};
use bw_wire::tenancy;
use prost::Message as _;
use std::collections::BTreeMap;
use std::time::Duration;

const CRM: &str = "crm";
const SHOP: &str = "shop";
const CRM_PHONE: &str = "106540352260001";
const SHOP_PHONE: &str = "106540352260002";
const CRM_WABA: &str = WABA_ID;
const SHOP_WABA: &str = "102290129340511";
/// The victim's operation, and the id the attacker reuses.
const OP: &str = "order-1";

fn order(op: &str, waba: &str, phone: &str, i: usize) -> SendRequest {
    Request::text(op, waba, phone, &format!("+54911666{i:05}"), "Your order shipped").build()
}

/// Short tries for requests a permission refuses: the server never answers them.
fn refused_options() -> Options {
    Options { timeout: Duration::from_secs(2), tries: 1, ..Options::default() }
}

/// A JetStream context that gives up on an unanswered (refused) API request after 2 s.
fn short_js(nats: &async_nats::Client) -> async_nats::jetstream::Context {
    async_nats::jetstream::ContextBuilder::new().timeout(Duration::from_secs(2)).build(nats.clone())
}

/// Whether a request on `subject` goes unanswered (a permission refuses it; the server never answers).
async fn unanswered(nats: &async_nats::Client, subject: &str, body: &str) -> bool {
    let request = async_nats::Request::new().payload(body.to_string().into()).timeout(Some(Duration::from_secs(2)));
    nats.send_request(subject.to_string(), request).await.is_err()
}

/// Waits until the server logged a violation of `user` naming `subject`.
async fn logged(s: &TenantStack, user: &str, subject: &str) -> bool {
    bw_testkit::wait_until(WAIT, || async {
        s.violations().iter().any(|l| l.contains(&format!("user:{user}\"")) && l.contains(subject))
    })
    .await
}

/// What an attack must leave as it was.
#[derive(Debug, PartialEq, Eq)]
struct Victim {
    /// The KV revision of the victim's ledger entry.
    revision: u64,
    /// Messages per feed subject of the victim's tenant.
    feed: BTreeMap<String, u64>,
    /// The victim's feed consumer: (delivered stream sequence, ack floor stream sequence, pending, ack pending).
    consumer: (u64, u64, u64, usize),
    /// Messages in BW_SEND (nothing new is queued for anyone).
    send: u64,
}

async fn victim(s: &TenantStack) -> Victim {
    let operator = s.operator().await;
    let ledger = bw_common::ledger::Ledger::new(&operator.buckets);
    let key = tenancy::operation_key(CRM, OP);
    let revision = ledger.get(&key).await.expect("ledger").expect("the victim's entry").revision;
    let feed = bw_ops::scan::subject_counts(&operator.js, "BW_FEED", &tenancy::feed_filter(CRM)).await.expect("feed");
    let stream = operator.js.get_stream("BW_FEED").await.expect("feed stream");
    let info = stream.consumer_info(tenancy::feed_consumer(CRM)).await.expect("the victim's consumer");
    let consumer =
        (info.delivered.stream_sequence, info.ack_floor.stream_sequence, info.num_pending, info.num_ack_pending);
    let count = |name: &'static str| {
        let js = operator.js.clone();
        async move { js.get_stream(name).await.expect("stream").get_info().await.expect("info").state.messages }
    };
    Victim { revision, feed, consumer, send: count("BW_SEND").await }
}

/// Messages in a stream, as the operator reads it.
async fn messages(s: &TenantStack, stream: &str) -> u64 {
    let operator = s.operator().await;
    operator.js.get_stream(stream).await.expect("stream").get_info().await.expect("info").state.messages
}

/// POSTs a JSON send request with `key`: (HTTP status, JSON answer).
async fn http_send(s: &TenantStack, key: &str, op: &str, waba: &str, phone: &str) -> (u16, serde_json::Value) {
    let body = serde_json::json!({"operation_id": op, "waba_id": waba, "phone_number_id": phone,
        "recipient": "+5491166600099", "category": "transactional", "text": {"body": "hi"}});
    let res = reqwest::Client::new()
        .post(format!("http://{}/v1/messages", s.ingest_http))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("ingest answers");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_tenant_is_refused_everything_of_another_and_changes_nothing() {
    // On the heap: the whole journey is one large future.
    Box::pin(hostile_tenant()).await;
}

async fn hostile_tenant() {
    let mut s = TenantStack::start(
        &[(CRM, CRM_PHONE, CRM_WABA), (SHOP, SHOP_PHONE, SHOP_WABA)],
        bw_meta_sim::SimConfig::default(),
    )
    .await;
    s.start_ingest(&[]).await;
    s.start_dispatcher().await;
    s.start_replay().await;

    // The victim sends, its message reaches Meta and is read, and it follows its feed to the end.
    let crm_nats = s.tenant(CRM).await;
    let crm = Client::new(crm_nats.clone());
    let reply = crm.send(&order(OP, CRM_WABA, CRM_PHONE, 1)).await.expect("answered");
    assert!(reply.accepted && !reply.duplicate, "{reply:?}");
    let crm_js = async_nats::jetstream::new(crm_nats.clone());
    let mut feed = bw_client::follow(&crm_js, CRM, None).await.expect("the victim follows its feed");
    loop {
        let item =
            tokio::time::timeout(WAIT, feed.next()).await.expect("events in time").expect("open").expect("event");
        item.ack().await.expect("acked");
        assert_eq!((item.event.tenant.as_str(), item.event.operation_id.as_str()), (CRM, OP), "its own id");
        if item.event.kind() == OutcomeKind::Read {
            break;
        }
    }
    drop(feed);
    // Settled: read (final), every event acknowledged.
    let settled = bw_testkit::wait_until(WAIT, || async {
        let v = victim(&s).await;
        v.consumer.2 == 0 && v.consumer.3 == 0 && v.consumer.0 == v.consumer.1
    })
    .await;
    assert!(settled, "{:?}", victim(&s).await);
    let before = victim(&s).await;
    assert!(
        s.violations().is_empty(),
        "the tenants' own traffic needs no more than their rights: {:?}",
        s.violations()
    );

    let shop_nats = s.tenant(SHOP).await;
    let shop = Client::with_options(shop_nats.clone(), refused_options());
    let shop_js = short_js(&shop_nats);
    let user = tenancy::nats_user(SHOP);

    // 1. Send as the victim's number over NATS: the subject is not the attacker's; NATS refuses it, no answer.
    let err = shop.send(&order("steal-1", CRM_WABA, CRM_PHONE, 2)).await.expect_err("refused");
    assert!(err.to_string().contains("no reply from ingest"), "{err}");
    assert!(logged(&s, &user, &format!("bw.send.v1.{CRM_PHONE}")).await);

    // 2. The same over HTTP with the attacker's key: 403, the number is another tenant's.
    let (status, answer) = http_send(&s, &http_key(SHOP), "steal-2", CRM_WABA, CRM_PHONE).await;
    assert_eq!((status, answer["reason"].as_str()), (403, Some("REJECT_REASON_SENDER_NOT_OWNED")), "{answer}");
    // Another tenant's number is refused as not owned whatever WABA it names: nothing of it is disclosed.
    let (status, answer) = http_send(&s, &http_key(SHOP), "steal-3", SHOP_WABA, CRM_PHONE).await;
    assert_eq!((status, answer["reason"].as_str()), (403, Some("REJECT_REASON_SENDER_NOT_OWNED")), "{answer}");

    // 3. Its own number with the victim's WABA id: the registry's WABA is the truth.
    let shop_ok = Client::new(shop_nats.clone());
    let reply = shop_ok.send(&order("waba-1", CRM_WABA, SHOP_PHONE, 3)).await.expect("answered");
    assert!(!reply.accepted && reply.reason() == RejectReason::WabaMismatch, "{reply:?}");
    assert!(!reply.error.is_empty(), "a clear error: {reply:?}");
    let (status, answer) = http_send(&s, &http_key(SHOP), "waba-2", CRM_WABA, SHOP_PHONE).await;
    assert_eq!((status, answer["reason"].as_str()), (400, Some("REJECT_REASON_WABA_MISMATCH")), "{answer}");

    // 4. Read the victim's feed.
    // Its consumer by name: the create subject is not the attacker's.
    assert!(bw_client::follow(&shop_js, CRM, None).await.is_err(), "the attacker bound feed-crm");
    assert!(logged(&s, &user, "$JS.API.CONSUMER.CREATE.BW_FEED.feed-crm").await);
    // Its own consumer name with the victim's filter in the body: the server checks the body against the subject.
    let create = serde_json::json!({"stream_name": "BW_FEED", "config": {"name": "feed-shop", "durable_name": "feed-shop",
        "filter_subject": tenancy::feed_filter(CRM), "ack_policy": "explicit"}});
    let subject = format!("$JS.API.CONSUMER.CREATE.BW_FEED.feed-shop.{}", tenancy::feed_filter(SHOP));
    let answer = shop_nats.request(subject, create.to_string().into()).await.expect("the server answers");
    let text = String::from_utf8_lossy(&answer.payload).to_string();
    assert!(text.contains("did not match filtered subject"), "{text}");
    // Its own consumer name over every tenant's subjects: that create subject is not granted.
    let subject = "$JS.API.CONSUMER.CREATE.BW_FEED.feed-shop.bw.feed.v1.>".to_string();
    let create = serde_json::json!({"stream_name": "BW_FEED", "config": {"name": "feed-shop", "durable_name": "feed-shop",
        "filter_subject": "bw.feed.v1.>", "ack_policy": "explicit"}});
    assert!(unanswered(&shop_nats, &subject, &create.to_string()).await, "{subject}");
    assert!(logged(&s, &user, &subject).await);
    // The filterless and the legacy create, which would take any filter.
    for subject in ["$JS.API.CONSUMER.CREATE.BW_FEED", "$JS.API.CONSUMER.DURABLE.CREATE.BW_FEED.feed-shop"] {
        assert!(unanswered(&shop_nats, subject, &create.to_string()).await, "{subject}");
        assert!(logged(&s, &user, subject).await, "{subject}");
    }
    // Pull from the victim's consumer, list the feed's subjects, read the victim's inbox or its feed subjects.
    let next = "$JS.API.CONSUMER.MSG.NEXT.BW_FEED.feed-crm";
    shop_nats.publish_with_reply(next, "_INBOX_shop.steal", "{\"batch\":10}".into()).await.expect("queued");
    assert!(shop_js.get_stream("BW_FEED").await.is_err(), "the attacker read BW_FEED's info");
    let _inbox = shop_nats.subscribe("_INBOX_crm.>").await.expect("queued locally");
    let _feed = shop_nats.subscribe(tenancy::feed_filter(CRM)).await.expect("queued locally");
    shop_nats.flush().await.expect("flush");
    for subject in [next, "$JS.API.STREAM.INFO.BW_FEED", "_INBOX_crm.>", "bw.feed.v1.crm.>"] {
        assert!(logged(&s, &user, subject).await, "{subject}");
    }

    // 5. Query the victim's operation: over NATS the victim's number's subject is refused; on its own number the
    //    id is the attacker's own (none); over HTTP another tenant's id is not found (its existence not told).
    assert!(shop.status(CRM_PHONE, OP).await.is_err(), "no answer on the victim's number");
    assert!(logged(&s, &user, &format!("bw.status.v1.{CRM_PHONE}")).await);
    let reply = shop_ok.status(SHOP_PHONE, OP).await.expect("answered");
    assert!(!reply.found, "{reply:?}");
    let crm_key_id = tenancy::operation_key(CRM, OP);
    // The victim's id is the attacker's own (none: 404); the victim's key is no operation id a key may name (400).
    for (id, expected) in [(OP, 404), (crm_key_id.as_str(), 400)] {
        let res = reqwest::Client::new()
            .get(format!("http://{}/v1/messages/{}", s.ingest_http, id.replace('/', "%2F")))
            .bearer_auth(http_key(SHOP))
            .send()
            .await
            .expect("ingest answers");
        let status = res.status().as_u16();
        let text = res.text().await.unwrap_or_default();
        assert_eq!(status, expected, "{id}: {text}");
        assert!(!text.contains(CRM_PHONE) && !text.contains("\"state\""), "nothing of the victim's: {text}");
    }

    // 6. Point replies into the ledger's KV: ingest answers only below the requester's inbox, and does nothing
    //    for a request that names another reply subject; the server never writes a pull's messages there.
    let victim_kv = format!("$KV.BW_LEDGER.{crm_key_id}");
    let rejected = messages(&s, "BW_REJECTED").await;
    let request = order("kv-1", SHOP_WABA, SHOP_PHONE, 4).encode_to_vec();
    shop_nats
        .publish_with_reply(format!("bw.send.v1.{SHOP_PHONE}"), victim_kv.clone(), request.into())
        .await
        .expect("sent");
    let query = StatusQuery { operation_id: OP.into() }.encode_to_vec();
    shop_nats
        .publish_with_reply(format!("bw.status.v1.{SHOP_PHONE}"), victim_kv.clone(), query.into())
        .await
        .expect("sent");
    shop_nats.flush().await.expect("flush");

    // 7. Pull from ingest's own consumers: the callbacks' and the feed publisher's.
    for subject in
        ["$JS.API.CONSUMER.MSG.NEXT.BW_FEED.callback-crm", "$JS.API.CONSUMER.MSG.NEXT.KV_BW_LEDGER.feed-publisher"]
    {
        shop_nats.publish_with_reply(subject, "_INBOX_shop.steal", "{\"batch\":10}".into()).await.expect("queued");
        shop_nats.flush().await.expect("flush");
        assert!(logged(&s, &user, subject).await, "{subject}");
    }
    let operator = s.operator().await;
    let publisher = operator.js.get_stream("KV_BW_LEDGER").await.expect("ledger stream");
    let publisher_before = publisher.consumer_info(bw_wire::names::FEED_CONSUMER).await.expect("feed-publisher");

    // Ingest handled both and refused them, counting each (never processed: nothing stored below).
    let counted = bw_testkit::wait_until(WAIT, || async {
        s.ingest_metric("bw_intake_reply_refused_total{source=\"intake\"}").await >= 1.0
            && s.ingest_metric("bw_intake_reply_refused_total{source=\"status\"}").await >= 1.0
    })
    .await;
    assert!(counted, "ingest refused both redirected replies:\n{}", s.ingest_metrics().await);
    // Nothing of the victim changed, nothing was stored for the redirected request, no feed event moved.
    assert_eq!(victim(&s).await, before, "the victim is unchanged");
    let ledger = bw_common::ledger::Ledger::new(&operator.buckets);
    assert!(ledger.get(&tenancy::operation_key(SHOP, "kv-1")).await.expect("ledger").is_none(), "not processed");
    assert_eq!(messages(&s, "BW_REJECTED").await, rejected, "not even kept as rejected input");
    assert!(ledger.get(&tenancy::operation_key(SHOP, "steal-1")).await.expect("ledger").is_none());
    assert!(ledger.get(&tenancy::operation_key(CRM, "steal-1")).await.expect("ledger").is_none());
    let publisher_after = publisher.consumer_info(bw_wire::names::FEED_CONSUMER).await.expect("feed-publisher");
    assert_eq!(
        (publisher_after.delivered.stream_sequence, publisher_after.ack_floor.stream_sequence),
        (publisher_before.delivered.stream_sequence, publisher_before.ack_floor.stream_sequence),
        "nothing pulled from the feed publisher"
    );

    // 8. Reuse the victim's operation id: accepted as the attacker's own, sent once; the victim's stays sent once.
    let reply = shop_ok.send(&order(OP, SHOP_WABA, SHOP_PHONE, 5)).await.expect("answered");
    assert!(reply.accepted && !reply.duplicate, "a new operation of the attacker: {reply:?}");
    assert_eq!(reply.operation_id, OP, "answered with its own id");
    let shop_key = tenancy::operation_key(SHOP, OP);
    let read = bw_testkit::wait_until(WAIT, || async {
        ledger.get(&shop_key).await.ok().flatten().is_some_and(|v| v.entry.state() == OperationState::Read)
    })
    .await;
    assert!(read, "the attacker's own message went through");
    let oracle = s.sim.oracle();
    assert_eq!(oracle.get(&crm_key_id).map(|e| e.count), Some(1), "the victim's sent once");
    assert_eq!(oracle.get(&shop_key).map(|e| e.count), Some(1), "the attacker's sent once");
    assert_eq!(oracle.total_accepted(), 2, "{:?}", oracle.messages);

    // 9. With its own feed holding events now, a pull from its own consumer whose reply is the victim's KV
    //    subject: the server delivers (the pull is acknowledged pending), and the ledger never takes it.
    let created = bw_client::follow(&shop_js, SHOP, None).await.expect("the attacker's own feed");
    drop(created);
    shop_nats
        .publish_with_reply("$JS.API.CONSUMER.MSG.NEXT.BW_FEED.feed-shop", victim_kv.clone(), "{\"batch\":1}".into())
        .await
        .expect("sent");
    shop_nats.flush().await.expect("flush");
    let stream = operator.js.get_stream("BW_FEED").await.expect("feed stream");
    let delivered = bw_testkit::wait_until(WAIT, || async {
        stream.consumer_info(tenancy::feed_consumer(SHOP)).await.is_ok_and(|i| i.num_ack_pending > 0)
    })
    .await;
    assert!(delivered, "the server delivered the pull to the reply subject");

    let after = victim(&s).await;
    assert_eq!(after.revision, before.revision, "the victim's ledger entry kept its revision");
    assert_eq!(after.feed, before.feed, "the victim's feed kept its events");
    assert_eq!(after.consumer, before.consumer, "the victim's feed consumer kept its place");
    let reply = crm.status(CRM_PHONE, OP).await.expect("the victim still reads its operation");
    assert!(reply.found && reply.current.as_ref().is_some_and(|c| c.kind() == OutcomeKind::Read), "{reply:?}");

    // Every violation came from the attacker, none from a service or the victim.
    let others: Vec<String> = s.violations().into_iter().filter(|l| !l.contains(&format!("user:{user}\""))).collect();
    assert!(others.is_empty(), "{others:?}");
    s.stop().await;
}

/// A tenant's callback aimed at the cloud metadata service (169.254.169.254) is a configuration error naming the
/// callback and the kind of address, never the address (ingest's egress policy).
#[test]
fn a_callback_to_the_metadata_service_is_a_configuration_error() {
    let env: std::collections::HashMap<String, String> = [
        ("BW_INGEST__CALLBACKS__CRM_HOOK__URL", "http://169.254.169.254/latest/meta-data/"),
        ("BW_INGEST__CALLBACKS__CRM_HOOK__SECRET", "a-callback-secret-of-some-length"),
        ("BW_INGEST__CALLBACKS__CRM_HOOK__TENANT", CRM),
        ("BW_INGEST__CALLBACKS__CRM_HOOK__PHONE_NUMBER_IDS", "[\"*\"]"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let err = bw_ingest::Config::load(None, &env).expect_err("refused");
    let text = format!("{err:#}");
    assert!(text.contains("callbacks.crm_hook.url") && text.contains("link-local"), "{text}");
    assert!(!text.contains("169.254"), "the address is not echoed: {text}");
}

/// A flood of unsigned webhook deliveries, each announcing a body near the cap, is refused (401, or 429 once the
/// source is over its budget) before any body is read: a request that never sends its body still gets its
/// answer. Nothing is stored, and ingest still serves a signed delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_webhooks_are_refused_before_their_body_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TenantStack::start(&[(CRM, CRM_PHONE, CRM_WABA)], bw_meta_sim::SimConfig::default()).await;
    s.start_ingest(&[]).await;
    let mut answers = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let addr = s.ingest_http.clone();
        answers.spawn(async move {
            let mut conn = tokio::net::TcpStream::connect(&addr).await.expect("connects");
            let head = format!(
                "POST /webhooks/meta HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
                 content-length: 3000000\r\nconnection: close\r\n\r\n"
            );
            conn.write_all(head.as_bytes()).await.expect("head written");
            // The body never comes: only an answer given before reading it can arrive.
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(WAIT, conn.read_to_end(&mut answer)).await;
            String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_string()
        });
    }
    let mut unauthorized = 0;
    while let Some(status_line) = answers.join_next().await {
        let status_line = status_line.expect("task");
        // 401 (no signature), or 429 once the source is over its budget of refused deliveries.
        let code = status_line.split_whitespace().nth(1).unwrap_or_default().to_string();
        assert!(matches!(code.as_str(), "401" | "429"), "refused before the body was read: {status_line:?}");
        unauthorized += usize::from(code == "401");
    }
    assert!(unauthorized > 0, "unsigned deliveries are refused as unauthenticated");
    let operator = s.operator().await;
    let webhooks = operator.js.get_stream("BW_WEBHOOKS").await.expect("stream").get_info().await.expect("info");
    assert_eq!(webhooks.state.messages, 0, "nothing stored");
    // The flood came from this machine, like the signed delivery: served once the source's budget is back.
    let served = bw_testkit::wait_until(WAIT, || async {
        bw_e2e::post_webhook(&s.ingest_http, bw_e2e::status_webhook(CRM_PHONE, vec![])).await == 200
    })
    .await;
    assert!(served, "a signed delivery is still served");
    s.stop().await;
}
