//! Pair limit (Meta §3.2) at the compiled default config: GCRA 6 s / burst 40 (Meta: 45), 4^X s back-off after
//! 131056, reset on a success, other recipients never slowed, never a breaker failure.

use crate::support::*;
use bw_breaker::{
    AdmitItem, Breaker, Decision, DenyReason, OutcomeItem, OutcomeKind, Scope, ScopeLimits, TrafficClass,
};
use bw_common::classify::RateScope;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// Meta's pair model as the simulator implements it: GCRA, emission interval 6 s, burst 45. Returns how many of
/// the sends (arrival times) it would refuse with 131056.
fn meta_rejections(arrivals: &[Instant]) -> usize {
    let t = Duration::from_secs(6);
    let tolerance = t * 44;
    let mut sorted = arrivals.to_vec();
    sorted.sort();
    let Some(first) = sorted.first().copied() else { return 0 };
    let mut tat = first;
    let mut rejected = 0;
    for at in sorted {
        let base = tat.max(at);
        if base.saturating_duration_since(at) > tolerance {
            rejected += 1;
        } else {
            tat = base + t;
        }
    }
    rejected
}

fn one(recipient: &str, class: TrafficClass) -> AdmitItem {
    AdmitItem { recipient_key: recipient.into(), class }
}

fn pair_limited(recipient: &str) -> OutcomeItem {
    OutcomeItem {
        recipient_key: recipient.into(),
        kind: OutcomeKind::RateLimited { scope: RateScope::Pair, pause_ms: RateScope::Pair.default_pause_ms() },
        canary: false,
    }
}

fn success(recipient: &str) -> OutcomeItem {
    OutcomeItem { recipient_key: recipient.into(), kind: OutcomeKind::Success, canary: false }
}

/// Admits `n` sends to one recipient the way a dispatcher does (re-submitting each refusal after its
/// retry-after) until `n` are admitted or one is refused for the pair; returns the arrival times (admission +
/// slot wait) and the first pair refusal.
async fn storm(breaker: &Breaker, scope: &Scope, recipient: &str, n: usize) -> (Vec<Instant>, Option<u64>) {
    let mut arrivals = Vec::new();
    let deadline = Instant::now() + WAIT;
    while arrivals.len() < n && Instant::now() < deadline {
        let batch = vec![one(recipient, TrafficClass::Priority); n - arrivals.len()];
        let at = Instant::now();
        let a = breaker.admit(scope, &batch).await;
        assert!(!a.degraded);
        let mut retry = None::<u64>;
        for d in a.decisions {
            match d {
                Decision::Allow { wait_ms, .. } => arrivals.push(at + Duration::from_millis(wait_ms)),
                Decision::Deny { reason: DenyReason::PairRate, retry_after_ms } => {
                    return (arrivals, Some(retry_after_ms));
                }
                Decision::Deny { reason: DenyReason::SenderRate, retry_after_ms } => {
                    retry = Some(retry.map_or(retry_after_ms, |r| r.min(retry_after_ms)))
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        if let Some(ms) = retry {
            tokio::time::sleep(Duration::from_millis(ms.max(1))).await;
        }
    }
    (arrivals, None)
}

#[tokio::test]
async fn a_storm_to_one_recipient_draws_no_self_inflicted_131056_at_the_default_config() {
    let redis = bw_testkit::RedisServer::start();
    let defaults = ScopeLimits::default();
    assert_eq!((defaults.pair_interval_ms, defaults.pair_burst), (6_000, 40), "stricter than Meta's 6 s / 45");
    let breaker = breaker(&redis.url(), defaults.clone()).await;
    let scope = scope();
    // 12 messages to one recipient: all admitted (the sender bucket spreads them over a few slots), and Meta's
    // model refuses none of them.
    let (arrivals, refused) = storm(&breaker, &scope, "fan", 12).await;
    assert_eq!((arrivals.len(), refused), (12, None));
    assert_eq!(meta_rejections(&arrivals), 0);
    // Keep going: the pair burst ends at 40 (12 + 28 more), then the next send waits about one interval.
    let (more, refused) = storm(&breaker, &scope, "fan", 40).await;
    assert_eq!(more.len(), 28, "the burst is 40 sends");
    let retry = refused.expect("the 41st send is refused for the pair");
    assert!(retry > 0 && retry <= defaults.pair_interval_ms, "retry {retry}");
    let all: Vec<Instant> = arrivals.into_iter().chain(more).collect();
    assert_eq!(meta_rejections(&all), 0, "Meta's 6 s / 45 model accepts every admitted send");
    // Other recipients of the same number are not slowed by the pair (only the sender bucket applies).
    let (other, refused) = storm(&breaker, &scope, "other", 1).await;
    assert_eq!((other.len(), refused), (1, None));
}

/// Waits until the pair admits a send; returns the refusals' retry-afters seen before.
async fn until_admitted(breaker: &Breaker, scope: &Scope, recipient: &str) -> Vec<u64> {
    let mut retries = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "pair never admitted again");
        match breaker.admit(scope, &[one(recipient, TrafficClass::Priority)]).await.decisions[0] {
            Decision::Allow { .. } => return retries,
            Decision::Deny { reason: DenyReason::PairRate, retry_after_ms } => {
                retries.push(retry_after_ms);
                tokio::time::sleep(Duration::from_millis(retry_after_ms.clamp(1, 500))).await;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn consecutive_131056_back_off_4_to_the_x_seconds_and_a_success_resets() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), ScopeLimits::default()).await;
    let scope = scope();
    // X = 0: 1 s.
    breaker.record(&scope, &[pair_limited("x")]).await;
    let retries = until_admitted(&breaker, &scope, "x").await;
    let first = *retries.first().expect("refused right after the 131056");
    assert!(first > 0 && first <= 1_000, "first back-off {first}");
    // Meanwhile the sender and other recipients are untouched, and the breaker saw no call.
    let status = breaker.status(&scope).await.expect("status");
    assert_eq!((status.snapshot.calls_in_window, status.failures_in_window), (0, 0));
    // X = 1: 4 s.
    breaker.record(&scope, &[pair_limited("x")]).await;
    let a = breaker.admit(&scope, &[one("x", TrafficClass::Priority), one("y", TrafficClass::Marketing)]).await;
    match a.decisions[0] {
        Decision::Deny { reason: DenyReason::PairRate, retry_after_ms } => {
            assert!((3_000..=4_000).contains(&retry_after_ms), "second back-off {retry_after_ms}")
        }
        other => panic!("expected pair rate, got {other:?}"),
    }
    assert!(matches!(a.decisions[1], Decision::Allow { .. }), "another recipient is not slowed: {a:?}");
    // X = 2: 16 s.
    breaker.record(&scope, &[pair_limited("x")]).await;
    match breaker.admit(&scope, &[one("x", TrafficClass::Priority)]).await.decisions[0] {
        Decision::Deny { reason: DenyReason::PairRate, retry_after_ms } => {
            assert!((15_000..=16_000).contains(&retry_after_ms), "third back-off {retry_after_ms}")
        }
        other => panic!("expected pair rate, got {other:?}"),
    }
    // A success resets the count: the next 131056 backs off 1 s again.
    breaker.record(&scope, &[success("x")]).await;
    breaker.record(&scope, &[pair_limited("x")]).await;
    match breaker.admit(&scope, &[one("x", TrafficClass::Priority)]).await.decisions[0] {
        Decision::Deny { reason: DenyReason::PairRate, retry_after_ms } => {
            assert!(retry_after_ms <= 1_000, "back-off after the reset {retry_after_ms}")
        }
        other => panic!("expected pair rate, got {other:?}"),
    }
    // After a 131056 Meta's bucket is full: once the back-off ends the pair sends one per interval, no burst.
    until_admitted(&breaker, &scope, "x").await;
    match breaker.admit(&scope, &[one("x", TrafficClass::Priority)]).await.decisions[0] {
        Decision::Deny { reason: DenyReason::PairRate, retry_after_ms } => {
            assert!(retry_after_ms > 4_000 && retry_after_ms <= 6_000, "{retry_after_ms}")
        }
        other => panic!("expected pair rate, got {other:?}"),
    }
    assert_eq!(breaker.status(&scope).await.expect("status").snapshot.state(), bw_proto::v1::BreakerState::Closed);
}

#[tokio::test]
async fn pair_limits_never_trip_the_breaker_at_the_default_config() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), ScopeLimits::default()).await;
    let scope = scope();
    let limited: Vec<OutcomeItem> = (0..200).map(|i| pair_limited(&format!("r{i}"))).collect();
    let r = breaker.record(&scope, &limited).await;
    assert_eq!(r.state, bw_proto::v1::BreakerState::Closed);
    assert!(r.transitions.is_empty());
    let status = breaker.status(&scope).await.expect("status");
    assert_eq!(status.snapshot.calls_in_window, 0);
    assert_eq!(status.snapshot.paused_until_unix_ms, 0, "the sender is not paused");
}
