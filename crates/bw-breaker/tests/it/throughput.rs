//! A number's throughput as Meta states it (`lua/throughput_set.lua`, read by `admit_send.lua`) and inbound
//! messages counted against it (`lua/observe_inbound.lua`), on a real redis-server.

use crate::support::*;
use bw_breaker::throughput::{Throughput, UPGRADED_MPS};
use bw_breaker::{Decision, ScopeLimits, TrafficClass};
use std::time::Duration;

fn allowed(decisions: &[Decision]) -> usize {
    decisions.iter().filter(|d| matches!(d, Decision::Allow { .. })).count()
}

async fn throughput(url: &str, limits: &ScopeLimits) -> Throughput {
    Throughput::new(bw_breaker::RedisConn::Single(manager(url).await), Duration::from_millis(500), limits)
}

#[tokio::test]
async fn an_upgrade_raises_the_admitted_rate_to_the_limit_at_the_same_margin() {
    let redis = bw_testkit::RedisServer::start();
    // The compiled defaults: 74 messages per second, today's margin under Meta's 80.
    let defaults = ScopeLimits::default();
    let breaker = breaker(&redis.url(), defaults.clone()).await;
    let tput = throughput(&redis.url(), &defaults).await;
    let scope = scope();
    let before = breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    assert!(!before.degraded);
    assert!((before.slot_gap_ms - 1000.0 / 74.0).abs() < 0.01, "74/s before: {}", before.slot_gap_ms);

    let state = tput.set_limit(&scope, UPGRADED_MPS, "THROUGHPUT_UPGRADE").await.expect("recorded");
    assert_eq!((state.mps, state.event.as_str()), (1000, "THROUGHPUT_UPGRADE"));
    let after = breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    // 1,000 x 0.925 = 925 per second: slots 1.081 ms apart, never closer than Meta's 1 ms.
    assert!((after.slot_gap_ms - 1000.0 / 925.0).abs() < 0.01, "925/s after: {}", after.slot_gap_ms);
    assert!(after.slot_gap_ms >= 1.0, "never above Meta's stated limit");
    // Another number of the same WABA keeps its own rate.
    let other = bw_breaker::Scope::new(scope.waba_id.clone(), "999999");
    let o = breaker.admit(&other, &items(1, TrafficClass::Priority)).await;
    assert!((o.slot_gap_ms - 1000.0 / 74.0).abs() < 0.01, "the other number: {}", o.slot_gap_ms);

    // Clearing it falls back to the configured rate.
    assert_eq!(tput.clear(&scope).await.expect("cleared").mps, 0);
    let cleared = breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    assert!((cleared.slot_gap_ms - 1000.0 / 74.0).abs() < 0.01, "74/s again: {}", cleared.slot_gap_ms);
}

#[tokio::test]
async fn config_states_the_limit_too_and_the_webhook_wins() {
    let redis = bw_testkit::RedisServer::start();
    let coexistence = ScopeLimits { throughput_mps: 20.0, ..ScopeLimits::default() };
    let breaker = breaker(&redis.url(), coexistence.clone()).await;
    let scope = scope();
    let a = breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    assert!((a.slot_gap_ms - 1000.0 / 18.5).abs() < 0.01, "20 x 0.925: {}", a.slot_gap_ms);
    throughput(&redis.url(), &coexistence).await.set_limit(&scope, 1000, "THROUGHPUT_UPGRADE").await.expect("set");
    let b = breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    assert!((b.slot_gap_ms - 1000.0 / 925.0).abs() < 0.01, "{}", b.slot_gap_ms);
    assert!(throughput(&redis.url(), &coexistence).await.set_limit(&scope, 0, "x").await.is_err(), "0 refused");
}

#[tokio::test]
async fn inbound_messages_take_tokens_the_sends_would_have_taken() {
    let redis = bw_testkit::RedisServer::start();
    // A bucket of 10 that refills at 0.001/s, so the counts are exact whatever the machine's speed.
    let limits = ScopeLimits { rate_per_s: 0.001, burst: 10.0, reserve_fraction: 0.0, ..limits() };
    let breaker = breaker(&redis.url(), limits.clone()).await;
    let tput = throughput(&redis.url(), &limits).await;
    let scope = scope();
    let counted = tput.observe_inbound(&scope, 4).await.expect("counted");
    assert!((counted.tokens - 6.0).abs() < 0.01, "10 - 4 inbound: {counted:?}");
    assert_eq!(counted.inbound_total, 4);
    let a = breaker.admit(&scope, &items(10, TrafficClass::Priority)).await;
    assert_eq!(allowed(&a.decisions), 6, "inbound plus outbound stays within the bucket");

    // A late batch of inbound puts the bucket in debt of at most one second of the rate (here: 1 token).
    let debt = tput.observe_inbound(&scope, 500).await.expect("counted");
    assert!((debt.tokens + 1.0).abs() < 0.01, "debt bounded: {debt:?}");
    assert_eq!(tput.read(&scope).await.expect("read").inbound_total, 504);
    let b = breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    assert_eq!(allowed(&b.decisions), 0, "nothing goes while in debt");
}

#[tokio::test]
async fn an_app_echo_takes_a_slot_of_the_pair_and_of_the_number() {
    let redis = bw_testkit::RedisServer::start();
    // A pair allowing 2 back to back; a sender bucket that refills at 0.001/s.
    let limits = ScopeLimits { rate_per_s: 0.001, burst: 10.0, reserve_fraction: 0.0, pair_burst: 2, ..limits() };
    let breaker = breaker(&redis.url(), limits.clone()).await;
    let tput = throughput(&redis.url(), &limits).await;
    let scope = scope();
    let counted = tput.observe_echo(&scope, "r0", 1).await.expect("counted");
    assert!((counted.tokens - 9.0).abs() < 0.01, "{counted:?}");
    // items() names recipients r0, r1: r0's pair has one slot left, r1's two.
    let a = breaker.admit(&scope, &items(2, TrafficClass::Priority)).await;
    assert_eq!(allowed(&a.decisions), 2);
    let b = breaker.admit(&scope, &items(2, TrafficClass::Priority)).await;
    assert!(matches!(b.decisions[0], Decision::Deny { reason: bw_breaker::DenyReason::PairRate, .. }), "{b:?}");
    assert!(matches!(b.decisions[1], Decision::Allow { .. }), "r1 had no echo: {b:?}");
}
