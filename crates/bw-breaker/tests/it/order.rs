//! Per-recipient order (lua/order_register.lua, the gate in admit_send.lua, releases in record_outcomes.lua and
//! order_release.lua) against a real Redis, at the compiled default limits.

use crate::support::*;
use bw_breaker::{
    Admission, AdmitItem, Breaker, BreakerConfig, Decision, DenyReason, Forced, OrderBook, OrderRelease, OutcomeItem,
    OutcomeKind, RedisConn, Scope, TrafficClass,
};
use std::time::Duration;

const TTL_MS: u64 = 604_800_000;

async fn setup(url: &str) -> (Breaker, OrderBook) {
    let conn = manager(url).await;
    let breaker = Breaker::new(Some(conn.clone()), None, BreakerConfig::default());
    let book = OrderBook::new(RedisConn::Single(conn), Duration::from_millis(500), TTL_MS);
    (breaker, book)
}

fn item(recipient: &str) -> AdmitItem {
    AdmitItem { recipient_key: recipient.into(), class: TrafficClass::Priority }
}

async fn admit(breaker: &Breaker, scope: &Scope, batch: &[(&str, &str)]) -> Admission {
    let items: Vec<AdmitItem> = batch.iter().map(|(r, _)| item(r)).collect();
    let ops: Vec<String> = batch.iter().map(|(_, op)| op.to_string()).collect();
    let a = breaker.admit_ordered(scope, &items, &ops).await;
    assert!(!a.degraded, "redis answered");
    a
}

fn waits_for(a: &Admission, i: usize) -> Option<String> {
    match a.decisions[i] {
        Decision::Deny { reason: DenyReason::OrderWait, .. } => {
            Some(a.blockers[i].as_ref().expect("an order_wait names its blocker").operation_id.clone())
        }
        _ => None,
    }
}

fn allowed(a: &Admission, i: usize) -> bool {
    matches!(a.decisions[i], Decision::Allow { .. })
}

async fn sent(breaker: &Breaker, scope: &Scope, recipient: &str, op: &str) {
    let outcome = OutcomeItem { recipient_key: recipient.into(), kind: OutcomeKind::Success, canary: false };
    let release = OrderRelease { recipient_key: recipient.into(), operation_id: op.into() };
    let r = breaker.record_releasing(scope, &[outcome], &[release]).await;
    assert!(!r.degraded);
}

#[tokio::test]
async fn a_later_message_waits_for_every_earlier_one_and_goes_once_it_is_released() {
    let redis = bw_testkit::RedisServer::start();
    let (breaker, book) = setup(&redis.url()).await;
    let scope = scope();
    for op in ["a", "b", "c"] {
        assert!(book.register(&scope, "r1", op).await.expect("register").added);
    }
    // Asked alone, or before the earlier ones in one batch, a later member waits for the earliest.
    let alone = admit(&breaker, &scope, &[("r1", "c")]).await;
    assert_eq!(waits_for(&alone, 0).as_deref(), Some("a"));
    let batch = admit(&breaker, &scope, &[("r1", "b"), ("r1", "a"), ("r1", "c")]).await;
    assert_eq!(waits_for(&batch, 0).as_deref(), Some("a"));
    assert!(allowed(&batch, 1), "the earliest goes: {:?}", batch.decisions);
    assert_eq!(waits_for(&batch, 2).as_deref(), Some("a"));
    // Admitted is not released: until Meta's answer is recorded, b still waits.
    assert_eq!(waits_for(&admit(&breaker, &scope, &[("r1", "b")]).await, 0).as_deref(), Some("a"));
    sent(&breaker, &scope, "r1", "a").await;
    let next = admit(&breaker, &scope, &[("r1", "c"), ("r1", "b")]).await;
    assert_eq!(waits_for(&next, 0).as_deref(), Some("b"));
    assert!(allowed(&next, 1));
    sent(&breaker, &scope, "r1", "b").await;
    assert!(allowed(&admit(&breaker, &scope, &[("r1", "c")]).await, 0));
    sent(&breaker, &scope, "r1", "c").await;
    assert!(book.members(&scope, "r1").await.expect("members").is_empty(), "an emptied set is gone");
}

#[tokio::test]
async fn other_recipients_and_messages_outside_the_set_are_not_gated() {
    let redis = bw_testkit::RedisServer::start();
    let (breaker, book) = setup(&redis.url()).await;
    let scope = scope();
    book.register(&scope, "r1", "promo").await.expect("register");
    book.register(&scope, "r1", "receipt").await.expect("register");
    book.register(&scope, "r2", "other").await.expect("register");
    // "otp" was never registered (authentication does not keep order); "" is an ungated message.
    let a = admit(&breaker, &scope, &[("r1", "receipt"), ("r1", "otp"), ("r1", ""), ("r2", "other")]).await;
    assert_eq!(waits_for(&a, 0).as_deref(), Some("promo"));
    assert!(allowed(&a, 1) && allowed(&a, 2) && allowed(&a, 3), "{:?}", a.decisions);
    // The same scope through the plain admission: never gated.
    let plain = breaker.admit(&scope, &[item("r1")]).await;
    assert!(allowed(&plain, 0));
    assert!(plain.blockers.iter().all(Option::is_none));
}

#[tokio::test]
async fn registration_keeps_acceptance_order_and_a_retry_keeps_its_first_place() {
    let redis = bw_testkit::RedisServer::start();
    let (_, book) = setup(&redis.url()).await;
    let scope = scope();
    let mut scores = Vec::new();
    for i in 0..50 {
        let r = book.register(&scope, "r1", &format!("op{i:02}")).await.expect("register");
        assert!(r.added);
        scores.push(r.score_us);
    }
    assert!(scores.windows(2).all(|w| w[0] < w[1]), "scores strictly increase: {scores:?}");
    let retry = book.register(&scope, "r1", "op00").await.expect("register");
    assert!(!retry.added);
    assert_eq!(retry.score_us, scores[0]);
    let members = book.members(&scope, "r1").await.expect("members");
    assert_eq!(members, (0..50).map(|i| format!("op{i:02}")).collect::<Vec<_>>());
    // The set expires after the configured time to live, and its key holds no phone number.
    let mut conn = manager(&redis.url()).await;
    let key = bw_breaker::scripts::order_key(&scope, "r1");
    assert!(key.starts_with(&format!("bw:{{{}:{}}}:ord:", scope.waba_id, scope.phone_number_id)), "{key}");
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut conn).await.expect("pttl");
    assert!(ttl > 0 && ttl <= TTL_MS as i64, "ttl {ttl}");
}

#[tokio::test]
async fn order_wait_comes_before_the_breaker_so_a_later_message_never_follows_into_the_dlq() {
    let redis = bw_testkit::RedisServer::start();
    let (breaker, book) = setup(&redis.url()).await;
    let scope = scope();
    book.register(&scope, "r1", "first").await.expect("register");
    book.register(&scope, "r1", "second").await.expect("register");
    breaker.force(&scope, Forced::Open).await.expect("force open");
    let a = admit(&breaker, &scope, &[("r1", "first"), ("r1", "second")]).await;
    assert!(matches!(a.decisions[0], Decision::Deny { reason: DenyReason::ForcedOpen, .. }), "{:?}", a.decisions);
    assert_eq!(waits_for(&a, 1).as_deref(), Some("first"));
    // A refused follower took no token: after the reset, a full bucket is left for the others.
    breaker.reset(&scope).await.expect("reset");
    let before = breaker.status(&scope).await.expect("status").tokens;
    let again = admit(&breaker, &scope, &[("r1", "second")]).await;
    assert_eq!(waits_for(&again, 0).as_deref(), Some("first"));
    assert_eq!(breaker.status(&scope).await.expect("status").tokens, before);
}

#[tokio::test]
async fn release_order_removes_members_and_the_next_one_goes() {
    let redis = bw_testkit::RedisServer::start();
    let (breaker, book) = setup(&redis.url()).await;
    let scope = scope();
    for op in ["q", "p", "x"] {
        book.register(&scope, "r1", op).await.expect("register");
    }
    // An operator quarantined "q" (or it expired): the dispatcher that finds it blocking removes it.
    let releases = [
        OrderRelease { recipient_key: "r1".into(), operation_id: "q".into() },
        OrderRelease { recipient_key: "r1".into(), operation_id: "never-registered".into() },
    ];
    assert_eq!(breaker.release_order(&scope, &releases).await.expect("release"), 1);
    let a = admit(&breaker, &scope, &[("r1", "x"), ("r1", "p")]).await;
    assert_eq!(waits_for(&a, 0).as_deref(), Some("p"));
    assert!(allowed(&a, 1));
}

#[tokio::test]
async fn without_redis_every_message_gets_the_bounded_fallback() {
    let redis = bw_testkit::RedisServer::start();
    let (breaker, book) = setup(&redis.url()).await;
    let scope = scope();
    book.register(&scope, "r1", "a").await.expect("register");
    book.register(&scope, "r2", "b").await.expect("register");
    drop(redis);
    // The order cannot be read: sending goes on at the fallback's bounded rate, for gated messages too.
    let items = [item("r1"), item("r2")];
    let a = breaker.admit_ordered(&scope, &items, &["a".to_string(), "b".to_string()]).await;
    assert!(a.degraded);
    assert!(allowed(&a, 0) && allowed(&a, 1), "{:?}", a.decisions);
    assert!(a.blockers.is_empty());
}

#[tokio::test]
async fn the_order_scripts_run_unchanged_on_a_redis_cluster() {
    let cluster = bw_testkit::RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    let conn = client.get_async_connection().await.expect("cluster connection");
    let breaker = Breaker::with_conn(Some(RedisConn::Cluster(conn.clone())), None, BreakerConfig::default());
    let book = OrderBook::new(RedisConn::Cluster(conn), Duration::from_millis(500), TTL_MS);
    // Enough senders to land on every master: each sender's order sets share its hash slot.
    for _ in 0..6 {
        let scope = scope();
        for op in ["a", "b"] {
            assert!(book.register(&scope, "r1", op).await.expect("register").added);
        }
        let first = admit(&breaker, &scope, &[("r1", "b"), ("r1", "a")]).await;
        assert_eq!(waits_for(&first, 0).as_deref(), Some("a"));
        assert!(allowed(&first, 1));
        sent(&breaker, &scope, "r1", "a").await;
        assert!(allowed(&admit(&breaker, &scope, &[("r1", "b")]).await, 0));
        let release = OrderRelease { recipient_key: "r1".into(), operation_id: "b".into() };
        assert_eq!(breaker.release_order(&scope, &[release]).await.expect("release"), 1);
        assert!(book.members(&scope, "r1").await.expect("members").is_empty());
    }
}
