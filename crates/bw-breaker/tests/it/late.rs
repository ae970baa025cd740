//! The fleet-wide late-send allowance (`claim_late.lua`): one bucket per sender, shared by every dispatcher
//! process, at the compiled default breaker config.

use crate::support::*;
use bw_breaker::{Breaker, BreakerConfig};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);
/// A refill far longer than any test: nothing refills meanwhile.
const NEVER_MS: f64 = 3_600_000.0;

async fn process(url: &str) -> Breaker {
    Breaker::new(Some(manager(url).await), None, BreakerConfig::default())
}

#[tokio::test]
async fn late_sends_of_one_sender_share_one_allowance_across_processes() {
    let redis = bw_testkit::RedisServer::start();
    let (a, b) = (process(&redis.url()).await, process(&redis.url()).await);
    let sender = scope();
    assert_eq!(a.claim_late(&sender, NEVER_MS, 1.0).await, Some(true));
    assert_eq!(b.claim_late(&sender, NEVER_MS, 1.0).await, Some(false), "the second process used the first one's");
    assert_eq!(a.claim_late(&sender, NEVER_MS, 1.0).await, Some(false));
    // Another sender of the same processes has its own allowance.
    assert_eq!(b.claim_late(&scope(), NEVER_MS, 1.0).await, Some(true));

    // Many late sends at once from both processes: exactly the burst goes.
    let sender = scope();
    let claims = (0..20).map(|i| {
        let p = if i % 2 == 0 { a.clone() } else { b.clone() };
        let s = sender.clone();
        async move { p.claim_late(&s, NEVER_MS, 2.0).await }
    });
    let granted = futures::future::join_all(claims).await;
    assert!(granted.iter().all(Option::is_some), "{granted:?}");
    assert_eq!(granted.iter().filter(|g| **g == Some(true)).count(), 2, "{granted:?}");

    // It refills, by one per refill period, for whichever process asks next.
    let sender = scope();
    assert_eq!(a.claim_late(&sender, 50.0, 1.0).await, Some(true));
    assert!(
        bw_testkit::wait_until(WAIT, || {
            let (b, s) = (b.clone(), sender.clone());
            async move { b.claim_late(&s, 50.0, 1.0).await == Some(true) }
        })
        .await,
        "the allowance never refilled"
    );
}

#[tokio::test]
async fn one_call_claims_many_late_sends_and_gets_at_most_what_the_allowance_holds() {
    let redis = bw_testkit::RedisServer::start();
    let (a, b) = (process(&redis.url()).await, process(&redis.url()).await);
    let sender = scope();
    assert_eq!(a.claim_late_many(&sender, NEVER_MS, 3.0, 5).await, Some(3), "a call gets the whole allowance, no more");
    assert_eq!(b.claim_late_many(&sender, NEVER_MS, 3.0, 2).await, Some(0), "and the other process none of it");
    assert_eq!(b.claim_late(&sender, NEVER_MS, 3.0).await, Some(false));
    let sender = scope();
    assert_eq!(a.claim_late_many(&sender, NEVER_MS, 3.0, 2).await, Some(2));
    assert_eq!(b.claim_late_many(&sender, NEVER_MS, 3.0, 2).await, Some(1), "the rest, shared across processes");
}

#[tokio::test]
async fn a_sender_refilled_faster_than_a_ms_holds_what_one_ms_refills() {
    let redis = bw_testkit::RedisServer::start();
    let a = process(&redis.url()).await;
    // One late send per 0.01 ms: Redis time is whole ms, so the bucket holds 100, not the 3 asked for.
    assert_eq!(a.claim_late_many(&scope(), 0.01, 3.0, 500).await, Some(100));
    // At a refill of a ms or more the burst asked for is the bucket.
    assert_eq!(a.claim_late_many(&scope(), 1.0, 3.0, 500).await, Some(3));
}

#[tokio::test]
async fn without_redis_the_late_allowance_is_left_to_the_process() {
    let mut redis = bw_testkit::RedisServer::start();
    let a = process(&redis.url()).await;
    let sender = scope();
    assert_eq!(a.claim_late(&sender, NEVER_MS, 1.0).await, Some(true));
    redis.kill();
    // No answer: the dispatcher falls back to its own process's allowance (`claim_late_here`).
    assert_eq!(a.claim_late(&sender, NEVER_MS, 1.0).await, None);
}
