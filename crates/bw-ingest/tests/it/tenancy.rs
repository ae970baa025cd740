//! Tenants at the compiled default (`tenancy.mode = "registry"`): replies only to the requester's inbox, senders
//! only from the registry and only for their owner, operation ids per tenant, and each tenant's own feed, status
//! answers and HTTP reads. Dev mode (the local stack's) is checked beside it.

use crate::support::{self, APP_SECRET, WAIT, start};
use bw_client::{Client, Request};
use bw_proto::v1::{OutcomeKind, RejectReason, SendRequest, StatusQuery};
use bw_wire::names::{self, Lane};
use bw_wire::tenancy::{self, TenancyMode};
use prost::Message as _;

const CRM: &str = "crm";
const CRM_PHONE: &str = "4001";
const CRM_WABA: &str = "5001";
const SHOP: &str = "shop";
const SHOP_PHONE: &str = "4002";
const SHOP_WABA: &str = "5002";
const TO: &str = "+5491155551234";
const CRM_KEY: &str = "crm-http-key";
const SHOP_KEY: &str = "shop-http-key";

/// Ingest at the compiled defaults with two tenants registered and an HTTP key each.
async fn two_tenants() -> support::Env {
    let env = start(|cfg| {
        for (name, key, tenant) in [("crm", CRM_KEY, CRM), ("shop", SHOP_KEY, SHOP)] {
            cfg.intake.api_keys.insert(
                name.into(),
                bw_ingest::ApiKeyConfig {
                    sha256: bw_ingest::key_sha256(key),
                    tenant: Some(tenant.into()),
                    phone_number_ids: vec![],
                    waba_ids: vec![],
                },
            );
        }
    })
    .await;
    support::register(&env.js, CRM_PHONE, CRM_WABA, CRM).await;
    support::register(&env.js, SHOP_PHONE, SHOP_WABA, SHOP).await;
    env
}

fn text(op: &str, waba: &str, phone: &str) -> SendRequest {
    Request::text(op, waba, phone, TO, "Your order shipped").build()
}

fn counter(text: &str, line_prefix: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn reply_refused(env: &support::Env, source: &str) -> u64 {
    counter(&env.metrics_text(), &format!("bw_intake_reply_refused_total{{source=\"{source}\"}} "))
}

/// POSTs a JSON send request with `key`: status and body.
async fn post_json(env: &support::Env, key: &str, op: &str, waba: &str, phone: &str) -> (u16, serde_json::Value) {
    let body = serde_json::json!({"operation_id": op, "waba_id": waba, "phone_number_id": phone,
        "recipient": TO, "category": "transactional", "text": {"body": "hi"}});
    let res = support::bare_http_client()
        .post(env.url("/v1/messages"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("post");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(serde_json::Value::Null))
}

async fn get_json(env: &support::Env, key: &str, op: &str) -> (u16, serde_json::Value) {
    let res = support::bare_http_client()
        .get(env.url(&format!("/v1/messages/{op}")))
        .bearer_auth(key)
        .send()
        .await
        .expect("get");
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn a_reply_subject_naming_a_ledger_key_changes_nothing_and_is_counted() {
    let env = two_tenants().await;
    let crm = support::producer(&env.server.url(), CRM).await;
    let victim = Client::new(crm.clone()).send(&text("victim-1", CRM_WABA, CRM_PHONE)).await.expect("reply");
    assert!(victim.accepted, "{victim:?}");
    let key = tenancy::operation_key(CRM, "victim-1");
    let before = env.ledger.get(&key).await.expect("ledger").expect("victim entry").revision;

    // A request of the same tenant whose reply subject is the victim's ledger key, then one on the shared inbox
    // (registry mode: only the tenant's own inbox prefix), then a status query aimed the same way.
    let attack = text("attack-1", CRM_WABA, CRM_PHONE).encode_to_vec();
    let ledger_subject = format!("$KV.BW_LEDGER.{key}");
    let intake = names::intake_subject(CRM_PHONE);
    crm.publish_with_reply(intake.clone(), ledger_subject.clone(), attack.clone().into()).await.expect("publish");
    crm.publish_with_reply(intake, "_INBOX.guess.1".to_string(), attack.into()).await.expect("publish");
    let query = StatusQuery { operation_id: "victim-1".into() }.encode_to_vec();
    let status_subject = bw_ingest::feed::status_subject(CRM_PHONE);
    crm.publish_with_reply(status_subject, ledger_subject, query.into()).await.expect("publish");
    crm.flush().await.expect("flush");
    let counted = bw_testkit::wait_until(WAIT, || async {
        reply_refused(&env, "intake") == 2 && reply_refused(&env, "status") == 1
    })
    .await;
    assert!(counted, "{}", env.metrics_text());

    let after = env.ledger.get(&key).await.expect("ledger").expect("victim entry");
    assert_eq!(after.revision, before, "the victim's ledger entry was not written");
    assert_eq!(after.entry.operation_id, key, "and still decodes as itself");
    // Not processed at all: no ledger entry, nothing stored, nothing kept as rejected.
    assert!(env.ledger.get(&tenancy::operation_key(CRM, "attack-1")).await.expect("ledger").is_none());
    assert_eq!(env.count(names::SEND_STREAM).await, 1, "only the victim's request");
    assert_eq!(env.count(names::REJECTED_STREAM).await, 0);
    assert!(!env.metrics_text().contains("attack-1"));
    // The tenant's own inbox still gets its answers.
    let status = Client::new(crm).status(CRM_PHONE, "victim-1").await.expect("status");
    assert!(status.found, "{status:?}");
    env.stop().await;
}

#[tokio::test]
async fn unregistered_senders_and_waba_mismatches_are_refused_with_their_reason() {
    let env = two_tenants().await;
    let crm = Client::new(support::producer(&env.server.url(), CRM).await);
    // A number nobody registered: refused on NATS (the answer goes to the asker's inbox, and says nothing of any
    // tenant) and over HTTP.
    let reply = crm.send(&text("unreg-1", CRM_WABA, "4999")).await.expect("reply");
    assert_eq!(reply.reason(), RejectReason::SenderNotRegistered, "{reply:?}");
    assert!(!reply.accepted && reply.error.contains("bwctl senders add"), "{}", reply.error);
    assert_eq!(reply.operation_id, "unreg-1");
    let (status, body) = post_json(&env, CRM_KEY, "unreg-2", CRM_WABA, "4999").await;
    assert_eq!((status, body["reason"].as_str()), (403, Some("REJECT_REASON_SENDER_NOT_REGISTERED")), "{body}");

    // The tenant's own number with another WABA (here the other tenant's): refused, the registry's WABA is the
    // truth, never the request's.
    let reply = crm.send(&text("waba-1", SHOP_WABA, CRM_PHONE)).await.expect("reply");
    assert_eq!(reply.reason(), RejectReason::WabaMismatch, "{reply:?}");
    assert!(!reply.error.contains(CRM_WABA), "the registered WABA is not disclosed: {}", reply.error);
    let (status, body) = post_json(&env, CRM_KEY, "waba-2", SHOP_WABA, CRM_PHONE).await;
    assert_eq!((status, body["reason"].as_str()), (400, Some("REJECT_REASON_WABA_MISMATCH")), "{body}");

    assert_eq!(env.count(names::SEND_STREAM).await, 0, "nothing refused was stored");
    for op in ["unreg-1", "unreg-2", "waba-1", "waba-2"] {
        assert!(env.ledger.get(&tenancy::operation_key(CRM, op)).await.expect("ledger").is_none(), "{op}");
    }
    assert!(env.wait_count(names::REJECTED_STREAM, 4).await, "each refusal kept in BW_REJECTED");
    let metrics = env.metrics_text();
    for (source, reason, n) in [
        ("nats", "REJECT_REASON_SENDER_NOT_REGISTERED", 1),
        ("http", "REJECT_REASON_SENDER_NOT_REGISTERED", 1),
        ("nats", "REJECT_REASON_WABA_MISMATCH", 1),
        ("http", "REJECT_REASON_WABA_MISMATCH", 1),
    ] {
        let line = format!("bw_intake_requests_total{{source=\"{source}\",outcome=\"rejected\",reason=\"{reason}\"}} ");
        assert_eq!(counter(&metrics, &line), n, "{line}: {metrics}");
    }
    env.stop().await;
}

#[tokio::test]
async fn two_tenants_using_one_operation_id_are_both_accepted_as_new() {
    let env = two_tenants().await;
    let crm = Client::new(support::producer(&env.server.url(), CRM).await);
    let shop = Client::new(support::producer(&env.server.url(), SHOP).await);
    let a = crm.send(&text("order-123", CRM_WABA, CRM_PHONE)).await.expect("reply");
    let b = shop.send(&text("order-123", SHOP_WABA, SHOP_PHONE)).await.expect("reply");
    for (who, reply) in [("crm", &a), ("shop", &b)] {
        assert!(reply.accepted && !reply.duplicate, "{who}: {reply:?}");
        assert_eq!(reply.operation_id, "order-123", "{who}: the producer sees its own id");
    }
    // Two operations, each under its tenant's key, each stored for sending with that key as its message id.
    for (tenant, phone) in [(CRM, CRM_PHONE), (SHOP, SHOP_PHONE)] {
        let key = tenancy::operation_key(tenant, "order-123");
        let entry = env.entry(&key).await.unwrap_or_else(|| panic!("ledger entry {key}"));
        assert_eq!((entry.operation_id.as_str(), entry.phone_number_id.as_str()), (key.as_str(), phone));
        let stored = env.last(names::SEND_STREAM, &names::outbox_subject(Lane::High, phone)).await;
        assert_eq!(stored.headers.get("Nats-Msg-Id").map(|v| v.as_str()), Some(key.as_str()));
        assert_eq!(SendRequest::decode(stored.payload.as_ref()).expect("request").operation_id, key);
    }
    assert_eq!(env.count(names::SEND_STREAM).await, 2);
    // The same tenant again is a duplicate, as before.
    let again = crm.send(&text("order-123", CRM_WABA, CRM_PHONE)).await.expect("reply");
    assert!(again.accepted && again.duplicate && again.operation_id == "order-123", "{again:?}");
    assert_eq!(env.count(names::SEND_STREAM).await, 2);
    env.stop().await;
}

#[tokio::test]
async fn an_http_key_acts_only_for_its_tenants_numbers_and_reads_only_its_operations() {
    let env = two_tenants().await;
    let (status, body) = post_json(&env, SHOP_KEY, "order-9", SHOP_WABA, SHOP_PHONE).await;
    assert_eq!(status, 202, "{body}");
    // The CRM's key from the shop's number, whatever WABA it writes: 403, nothing stored.
    for waba in [SHOP_WABA, CRM_WABA] {
        let (status, body) = post_json(&env, CRM_KEY, "steal-1", waba, SHOP_PHONE).await;
        assert_eq!((status, body["reason"].as_str()), (403, Some("REJECT_REASON_SENDER_NOT_OWNED")), "{body}");
        assert!(body["error"].as_str().is_some_and(|e| e.contains(SHOP_PHONE) && !e.contains(SHOP)), "{body}");
    }
    assert_eq!(env.count(names::SEND_STREAM).await, 1);
    assert!(env.ledger.get(&tenancy::operation_key(CRM, "steal-1")).await.expect("ledger").is_none());
    // The shop's operation id read with the CRM's key: 404, as for an id that does not exist.
    let (status, body) = get_json(&env, CRM_KEY, "order-9").await;
    assert_eq!((status, body["reason"].as_str()), (404, Some("NOT_FOUND")), "{body}");
    let (unknown_status, unknown) = get_json(&env, CRM_KEY, "no-such-op").await;
    assert_eq!((unknown_status, &unknown), (status, &body), "the answer does not tell the two apart");
    // The shop reads its own.
    let (status, body) = get_json(&env, SHOP_KEY, "order-9").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!((body["operation_id"].as_str(), body["tenant"].as_str()), (Some("order-9"), Some(SHOP)), "{body}");
    assert_eq!(body["phone_number_id"], SHOP_PHONE);
    env.stop().await;
}

#[tokio::test]
async fn a_narrowed_key_uses_only_the_numbers_it_lists_by_the_registrys_waba() {
    let env = start(|cfg| {
        cfg.intake.api_keys.insert(
            "narrow".into(),
            bw_ingest::ApiKeyConfig {
                sha256: bw_ingest::key_sha256(CRM_KEY),
                tenant: Some(CRM.into()),
                phone_number_ids: vec![],
                waba_ids: vec![CRM_WABA.into()],
            },
        );
    })
    .await;
    support::register(&env.js, CRM_PHONE, CRM_WABA, CRM).await;
    support::register(&env.js, "4003", "5003", CRM).await;
    let (status, body) = post_json(&env, CRM_KEY, "n-1", CRM_WABA, CRM_PHONE).await;
    assert_eq!(status, 202, "{body}");
    // Its tenant's other number, under another WABA: the request naming the listed WABA does not widen it.
    let (status, body) = post_json(&env, CRM_KEY, "n-2", CRM_WABA, "4003").await;
    assert_eq!((status, body["reason"].as_str()), (403, Some("FORBIDDEN")), "{body}");
    assert_eq!(env.count(names::SEND_STREAM).await, 1);
    env.stop().await;
}

#[tokio::test]
async fn feed_events_and_status_answers_belong_to_their_tenant() {
    let env = two_tenants().await;
    let crm_conn = support::producer(&env.server.url(), CRM).await;
    let crm = Client::new(crm_conn.clone());
    let shop = Client::new(support::producer(&env.server.url(), SHOP).await);
    let mut crm_feed = support::Feed::follow(&env.js, CRM, CRM_PHONE, "feed-crm").await;
    let mut shop_feed = support::Feed::follow(&env.js, SHOP, SHOP_PHONE, "feed-shop").await;
    assert!(crm.send(&text("order-123", CRM_WABA, CRM_PHONE)).await.expect("reply").accepted);
    assert!(shop.send(&text("order-123", SHOP_WABA, SHOP_PHONE)).await.expect("reply").accepted);
    assert!(shop.send(&text("only-shop", SHOP_WABA, SHOP_PHONE)).await.expect("reply").accepted);

    let (event, subject) = crm_feed.next().await;
    assert_eq!((event.tenant.as_str(), event.operation_id.as_str()), (CRM, "order-123"), "{event:?}");
    assert_eq!(event.kind(), OutcomeKind::Accepted);
    assert_eq!(subject, format!("bw.feed.v1.{CRM}.{CRM_PHONE}.order-123"));
    let (event, subject) = shop_feed.next().await;
    assert_eq!((event.tenant.as_str(), event.operation_id.as_str()), (SHOP, "order-123"), "{event:?}");
    assert_eq!(subject, tenancy::feed_subject(SHOP, SHOP_PHONE, "order-123"));
    // The feed's message id is the operation key's: the two revisions never deduplicate each other.
    let stream = env.js.get_stream(bw_ingest::feed::FEED_STREAM).await.expect("feed");
    let stored = stream.get_last_raw_message_by_subject(&subject).await.expect("event");
    let msg_id = stored.headers.get("Nats-Msg-Id").map(|v| v.as_str().to_string()).unwrap_or_default();
    assert_eq!(msg_id, format!("{}.{}", tenancy::operation_key(SHOP, "order-123"), event.revision));

    // Status: each tenant finds its own operation of that id, with its own id and tenant.
    let mine = crm.status(CRM_PHONE, "order-123").await.expect("status");
    let current = mine.current.as_ref().expect("found");
    assert_eq!((current.tenant.as_str(), current.phone_number_id.as_str()), (CRM, CRM_PHONE));
    assert_eq!((mine.operation_id.as_str(), current.operation_id.as_str()), ("order-123", "order-123"));
    assert_eq!(mine.journey.iter().map(|e| e.kind()).collect::<Vec<_>>(), vec![OutcomeKind::Accepted]);
    assert!(mine.journey.iter().all(|e| e.tenant == CRM));
    let theirs = shop.status(SHOP_PHONE, "order-123").await.expect("status");
    assert_eq!(theirs.current.as_ref().map(|c| c.tenant.as_str()), Some(SHOP));
    // The shop's other id asked on the CRM's number: not found.
    assert!(!crm.status(CRM_PHONE, "only-shop").await.expect("status").found);
    // Asked on the shop's number from the CRM's inbox: answers for that number go to the shop's inbox only, so
    // the query is refused instead of answered (and counted).
    let query = StatusQuery { operation_id: "only-shop".into() }.encode_to_vec();
    let subject = bw_ingest::feed::status_subject(SHOP_PHONE);
    let inbox = format!("{}.q1", tenancy::inbox_prefix(CRM));
    crm_conn.publish_with_reply(subject, inbox, query.into()).await.expect("publish");
    crm_conn.flush().await.expect("flush");
    assert!(bw_testkit::wait_until(WAIT, || async { reply_refused(&env, "status") == 1 }).await);
    env.stop().await;
}

#[tokio::test]
async fn a_status_webhook_finds_a_tenants_operation_by_its_key() {
    let env = two_tenants().await;
    let crm = Client::new(support::producer(&env.server.url(), CRM).await);
    assert!(crm.send(&text("hook-1", CRM_WABA, CRM_PHONE)).await.expect("reply").accepted);
    let key = tenancy::operation_key(CRM, "hook-1");
    env.ledger
        .update(&key, |cur| {
            let mut next = cur?.clone();
            next.set_state(bw_proto::v1::OperationState::Sent);
            next.wamid = "wamid.T1".into();
            Some(next)
        })
        .await
        .expect("ledger");
    // The dispatcher sets biz_opaque_callback_data to the operation key.
    let body = serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": CRM_WABA, "changes": [{
        "field": "messages", "value": {"messaging_product": "whatsapp", "metadata": {"phone_number_id": CRM_PHONE},
        "statuses": [{"id": "wamid.T1", "status": "delivered", "timestamp": "1750030073",
                      "recipient_id": "5491155551234", "biz_opaque_callback_data": key}]}}]}]})
    .to_string();
    let res = support::http_client()
        .post(env.url("/webhooks/meta"))
        .header("X-Hub-Signature-256", bw_ingest::webhook::sign(APP_SECRET.as_bytes(), body.as_bytes()))
        .body(body)
        .send()
        .await
        .expect("post");
    assert_eq!(res.status(), 200);
    assert!(env.wait_state(&key, bw_proto::v1::OperationState::Delivered).await);
    env.stop().await;
}

#[tokio::test]
async fn dev_mode_lets_any_number_send_but_still_keeps_replies_in_inboxes() {
    let env = start(|cfg| cfg.tenancy.mode = TenancyMode::Dev).await;
    // Not registered, a plain client on the shared `_INBOX.`: accepted, the bare id is the key.
    let plain = async_nats::connect(env.server.url()).await.expect("connects");
    let reply = Client::new(plain.clone()).send(&text("dev-1", "7001", "7002")).await.expect("reply");
    assert!(reply.accepted && !reply.duplicate, "{reply:?}");
    assert_eq!(env.entry("dev-1").await.expect("entry").waba_id, "7001");
    // A reply subject outside every inbox is still refused.
    let raw = text("dev-2", "7001", "7002").encode_to_vec();
    plain
        .publish_with_reply(names::intake_subject("7002"), "$KV.BW_LEDGER.dev-1".to_string(), raw.into())
        .await
        .expect("publish");
    plain.flush().await.expect("flush");
    assert!(bw_testkit::wait_until(WAIT, || async { reply_refused(&env, "intake") == 1 }).await);
    assert!(env.entry("dev-2").await.is_none());
    let answer = Client::new(plain).send(&text("dev-1", "7001", "7002")).await.expect("reply");
    assert!(answer.accepted && answer.duplicate, "{answer:?}");
    env.stop().await;
}
