//! Breaker transitions for scripted outcome sequences, the sliding window, canaries, cooldown growth, ramp-up.

use crate::support::*;
use bw_breaker::{Decision, DenyReason, Forced, OutcomeKind, ScopeLimits, TrafficClass};
use bw_common::classify::RateScope;
use bw_proto::v1::BreakerState;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn failure_rate_trips_only_with_enough_calls_and_only_transient_errors_count() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), ScopeLimits { min_calls: 10, failure_threshold: 0.3, ..limits() }).await;
    let scope = scope();
    // Permanent errors and rate limits never count as failures or calls.
    let result = breaker.record(&scope, &outcomes(40, OutcomeKind::Permanent, false)).await;
    assert_eq!(result.state, BreakerState::Closed);
    let pair_limit = OutcomeKind::RateLimited { scope: RateScope::Pair, pause_ms: 10 };
    breaker.record(&scope, &outcomes(3, pair_limit, false)).await;
    assert_eq!(breaker.snapshot(&scope).await.expect("read").calls_in_window, 0);
    // 6 successes and 3 failures: 9 calls, below min_calls although the rate is 33%.
    breaker.record(&scope, &outcomes(6, OutcomeKind::Success, false)).await;
    let result = breaker.record(&scope, &outcomes(3, OutcomeKind::Transient, false)).await;
    assert_eq!(result.state, BreakerState::Closed);
    assert!(result.transitions.is_empty());
    // The 10th call is a failure: 4 / 10 = 40% >= 30%.
    let result = breaker.record(&scope, &outcomes(1, OutcomeKind::Transient, false)).await;
    assert_eq!(result.state, BreakerState::Open);
    assert_eq!(result.transitions.len(), 1);
    let t = &result.transitions[0];
    assert_eq!((t.from(), t.to()), (BreakerState::Closed, BreakerState::Open));
    assert!(!t.incident_id.is_empty());
    assert_eq!(t.incident_id, result.incident_id);
    assert_eq!(t.calls_in_window, 10);
    assert!((t.failure_rate - 0.4).abs() < 1e-9, "{}", t.failure_rate);
    assert!(t.open_until_unix_ms > t.at_unix_ms + 59_000);
    // OPEN fails fast with the incident id and the time left.
    let admission = breaker.admit(&scope, &items(2, TrafficClass::Priority)).await;
    assert_eq!(admission.state, BreakerState::Open);
    assert_eq!(admission.incident_id, result.incident_id);
    for d in admission.decisions {
        match d {
            Decision::Deny { reason: DenyReason::BreakerOpen, retry_after_ms } => assert!(retry_after_ms > 50_000),
            other => panic!("expected breaker open, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn consecutive_rate_limits_trip_and_pause_the_scope() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(
        &redis.url(),
        ScopeLimits {
            consecutive_rate_limits: 3,
            // Every 130429 is its own episode here (the default groups those within 1 s; see below).
            aimd_cut_gap_ms: 0,
            ..limits()
        },
    )
    .await;
    let scope = scope();
    let limited = OutcomeKind::RateLimited { scope: RateScope::PhoneNumber, pause_ms: 5_000 };
    breaker.record(&scope, &outcomes(2, limited, false)).await;
    // A success in between resets the streak.
    breaker.record(&scope, &outcomes(1, OutcomeKind::Success, false)).await;
    let result = breaker.record(&scope, &outcomes(2, limited, false)).await;
    assert_eq!(result.state, BreakerState::Closed);
    let admission = breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    match admission.decisions[0] {
        Decision::Deny { reason: DenyReason::Paused, retry_after_ms } => {
            assert!((3_000..=5_000).contains(&retry_after_ms), "{retry_after_ms}")
        }
        other => panic!("expected paused, got {other:?}"),
    }
    let snapshot = breaker.snapshot(&scope).await.expect("read");
    assert_eq!(snapshot.pause_reason, "rate limit: throughput");
    let result = breaker.record(&scope, &outcomes(1, limited, false)).await;
    assert_eq!(result.state, BreakerState::Open);
    assert!(result.transitions[0].reason.contains("3 consecutive rate limits"), "{:?}", result.transitions);
}

#[tokio::test]
async fn half_open_canaries_close_or_reopen_with_a_longer_cooldown_and_the_incident_is_kept() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits {
        cooldown_ms: 300,
        cooldown_max_ms: 10_000,
        cooldown_growth: 4.0,
        canaries_per_s: 2,
        close_after_successes: 2,
        ..limits()
    };
    let breaker = breaker(&redis.url(), limits).await;
    let scope = scope();
    let opened = breaker.record(&scope, &outcomes(4, OutcomeKind::Transient, false)).await;
    assert_eq!(opened.state, BreakerState::Open);
    let incident = opened.incident_id.clone();
    // After the cooldown an admission moves the scope to HALF_OPEN and admits at most 2 canaries this second.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    assert!(
        bw_testkit::wait_until(WAIT, || {
            let b = breaker.clone();
            let s = scope.clone();
            let seen = seen.clone();
            async move {
                let a = b.admit(&s, &items(5, TrafficClass::Priority)).await;
                let half_open = a.state == BreakerState::HalfOpen;
                *seen.lock().expect("lock") = Some(a);
                half_open
            }
        })
        .await
    );
    let admission = seen.lock().expect("lock").take().expect("set");
    assert_eq!(admission.incident_id, incident);
    let canaries = admission.decisions.iter().filter(|d| matches!(d, Decision::Allow { canary: true, .. })).count();
    assert_eq!(canaries, 2, "{:?}", admission.decisions);
    assert!(
        admission.decisions[2..].iter().all(|d| matches!(d, Decision::Deny { reason: DenyReason::CanaryBudget, .. }))
    );
    // A canary failure re-opens; the second cooldown is 4x the first.
    let reopened = breaker.record(&scope, &outcomes(1, OutcomeKind::Transient, true)).await;
    assert_eq!(reopened.state, BreakerState::Open);
    assert_eq!(reopened.incident_id, incident);
    let t = &reopened.transitions[0];
    assert_eq!((t.from(), t.to()), (BreakerState::HalfOpen, BreakerState::Open));
    let cooldown = t.open_until_unix_ms - t.at_unix_ms;
    assert!((1_150..=1_250).contains(&cooldown), "cooldown {cooldown}");
    let status = breaker.status(&scope).await.expect("status");
    assert_eq!(status.trip_streak, 2);
    assert_eq!(status.snapshot.trips, 2);
    // Wait for HALF_OPEN again; successes of non-canary sends do not close, canary successes do.
    assert!(
        bw_testkit::wait_until(WAIT, || {
            let b = breaker.clone();
            let s = scope.clone();
            async move {
                b.tick(&s)
                    .await
                    .map(|(st, _)| st.snapshot.state() == BreakerState::HalfOpen)
                    .unwrap_or(false)
            }
        })
        .await
    );
    let still = breaker.record(&scope, &outcomes(3, OutcomeKind::Success, false)).await;
    assert_eq!(still.state, BreakerState::HalfOpen);
    let closed = breaker.record(&scope, &outcomes(2, OutcomeKind::Success, true)).await;
    assert_eq!(closed.state, BreakerState::Closed);
    assert_eq!(closed.incident_id, "");
    assert_eq!(closed.transitions[0].incident_id, incident, "the closing event names the incident it ends");
    // A new trip mints a new incident and starts the cooldown from the base again.
    let again = breaker.record(&scope, &outcomes(4, OutcomeKind::Transient, false)).await;
    assert_eq!(again.state, BreakerState::Open);
    assert_ne!(again.incident_id, incident);
    let t = &again.transitions[0];
    assert!((300..=330).contains(&(t.open_until_unix_ms - t.at_unix_ms)));
}

#[tokio::test]
async fn old_buckets_leave_the_sliding_window() {
    let redis = bw_testkit::RedisServer::start();
    let limits =
        ScopeLimits { window_ms: 1_000, window_buckets: 10, min_calls: 10, failure_threshold: 0.5, ..limits() };
    let breaker = breaker(&redis.url(), limits).await;
    let scope = scope();
    breaker.record(&scope, &outcomes(6, OutcomeKind::Transient, false)).await;
    let first = breaker.snapshot(&scope).await.expect("read");
    assert_eq!(first.calls_in_window, 6);
    // The failures slide out bucket by bucket (not all at once at a fixed boundary) within ~1 s.
    assert!(
        bw_testkit::wait_until(WAIT, || {
            let b = breaker.clone();
            let s = scope.clone();
            async move { b.snapshot(&s).await.map(|snap| snap.calls_in_window == 0).unwrap_or(false) }
        })
        .await
    );
    // 6 new successes and 4 new failures: 40% < 50%, so no trip although 10 failures were seen in total.
    breaker.record(&scope, &outcomes(6, OutcomeKind::Success, false)).await;
    let result = breaker.record(&scope, &outcomes(4, OutcomeKind::Transient, false)).await;
    assert_eq!(result.state, BreakerState::Closed);
    // Calls recorded in consecutive sub-buckets are all counted while inside the window.
    let scope2 = crate::support::scope();
    for _ in 0..5 {
        breaker.record(&scope2, &outcomes(1, OutcomeKind::Success, false)).await;
        tokio::time::sleep(Duration::from_millis(110)).await;
    }
    let snap = breaker.snapshot(&scope2).await.expect("read");
    assert!(snap.calls_in_window >= 4, "sub-buckets summed: {}", snap.calls_in_window);
}

#[tokio::test]
async fn forced_states_override_and_clear_ramps_the_rate_up() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits { ramp_ms: 60_000, ramp_start: 0.1, rate_per_s: 100.0, burst: 100.0, ..limits() };
    let breaker = breaker(&redis.url(), limits).await;
    let scope = scope();
    let (status, transitions) = breaker.force(&scope, Forced::Closed).await.expect("force");
    assert_eq!(status.snapshot.state(), BreakerState::ForcedClosed);
    assert_eq!(transitions.len(), 1);
    // FORCED_CLOSED never trips.
    let result = breaker.record(&scope, &outcomes(20, OutcomeKind::Transient, false)).await;
    assert_eq!(result.state, BreakerState::ForcedClosed);
    let (status, _) = breaker.force(&scope, Forced::Open).await.expect("force");
    assert_eq!(status.snapshot.state(), BreakerState::ForcedOpen);
    let admission = breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    assert!(matches!(admission.decisions[0], Decision::Deny { reason: DenyReason::ForcedOpen, .. }));
    let (status, transitions) = breaker.force(&scope, Forced::Clear).await.expect("clear");
    assert_eq!(status.snapshot.state(), BreakerState::Closed);
    assert_eq!(transitions[0].from(), BreakerState::ForcedOpen);
    // Right after closing the scope gets about 10% of its bucket: 10 of 100 priority sends.
    assert!(status.snapshot.ramp_fraction < 0.2, "{}", status.snapshot.ramp_fraction);
    let admission = breaker.admit(&scope, &items(100, TrafficClass::Priority)).await;
    let allowed = admission.decisions.iter().filter(|d| matches!(d, Decision::Allow { .. })).count();
    assert!((10..=12).contains(&allowed), "allowed {allowed}");
    // Reset gives the full rate at once.
    let (status, _) = breaker.reset(&scope).await.expect("reset");
    assert_eq!(status.snapshot.ramp_fraction, 1.0);
}

#[tokio::test]
async fn rate_limits_never_count_toward_the_failure_rate() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), ScopeLimits { consecutive_rate_limits: 1_000, ..limits() }).await;
    let scope = scope();
    let pair = OutcomeKind::RateLimited { scope: RateScope::Pair, pause_ms: 10 };
    let throughput = OutcomeKind::RateLimited { scope: RateScope::PhoneNumber, pause_ms: 10 };
    breaker.record(&scope, &outcomes(2, OutcomeKind::Success, false)).await;
    // Pair limits are the recipient's business, 130429 feeds the adaptive rate (Meta §6): neither is a call or
    // a failure of the window.
    let result = breaker.record(&scope, &outcomes(4, pair, false)).await;
    assert_eq!(result.state, BreakerState::Closed);
    let result = breaker.record(&scope, &outcomes(20, throughput, false)).await;
    assert_eq!(result.state, BreakerState::Closed, "{:?}", result.transitions);
    let status = breaker.status(&scope).await.expect("status");
    assert_eq!((status.snapshot.calls_in_window, status.failures_in_window), (2, 0));
}

#[tokio::test]
async fn at_the_default_config_a_burst_of_130429_is_one_episode_and_five_episodes_trip() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    let breaker = breaker(&redis.url(), limits.clone()).await;
    let scope = scope();
    let throughput =
        OutcomeKind::RateLimited { scope: RateScope::PhoneNumber, pause_ms: RateScope::PhoneNumber.default_pause_ms() };
    // The sends in flight when Meta starts refusing come back together: one episode, one cut, no trip.
    let r = breaker.record(&scope, &outcomes(10, throughput, false)).await;
    assert_eq!(r.state, BreakerState::Closed);
    let status = breaker.status(&scope).await.expect("status");
    assert!((status.adaptive_share - limits.aimd_decrease).abs() < 1e-6, "{}", status.adaptive_share);
    assert_eq!(status.snapshot.pause_reason, "rate limit: throughput");
    // Episodes at least aimd_cut_gap_ms apart, with no success between, trip at the fifth.
    let mut episodes = 1;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while episodes < limits.consecutive_rate_limits {
        assert!(std::time::Instant::now() < deadline, "episodes never counted");
        let before = breaker.status(&scope).await.expect("status").adaptive_share;
        let r = breaker.record(&scope, &outcomes(1, throughput, false)).await;
        let after = breaker.status(&scope).await.expect("status").adaptive_share;
        if after < before - 1e-9 {
            episodes += 1;
            let want =
                if episodes == limits.consecutive_rate_limits { BreakerState::Open } else { BreakerState::Closed };
            assert_eq!(r.state, want, "after episode {episodes}");
        } else {
            assert_eq!(r.state, BreakerState::Closed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn a_scope_known_open_is_refused_without_redis_until_a_transition_arrives() {
    let redis = bw_testkit::RedisServer::start();
    let nats = bw_testkit::NatsServer::start();
    let client = async_nats::connect(nats.url()).await.expect("nats");
    let dispatcher =
        bw_breaker::Breaker::new(Some(manager(&redis.url()).await), Some(client.clone()), config(limits()));
    dispatcher.follow_transitions().await.expect("subscribe");
    let other = bw_breaker::Breaker::new(Some(manager(&redis.url()).await), Some(client.clone()), config(limits()));
    other.follow_transitions().await.expect("subscribe");
    let operator = bw_breaker::Breaker::new(Some(manager(&redis.url()).await), Some(client), config(limits()));
    let scope = scope();
    let tripped = dispatcher.record(&scope, &outcomes(4, OutcomeKind::Transient, false)).await;
    assert_eq!(tripped.state, BreakerState::Open);

    // Another instance learns of the trip from its event, without asking Redis.
    let known = bw_testkit::wait_until(Duration::from_secs(5), || async {
        other.admit_known_open(&scope, 1).is_some_and(|a| a.incident_id == tripped.incident_id)
    })
    .await;
    assert!(known, "the trip event reached the other instance");
    assert_eq!(other.round_trips(), 0);

    // Known OPEN: the refusal comes without a round trip, with the incident and the cooldown left.
    let before = dispatcher.round_trips();
    for _ in 0..5 {
        let a = dispatcher.admit(&scope, &items(3, TrafficClass::Priority)).await;
        assert_eq!(a.state, BreakerState::Open);
        assert_eq!(a.incident_id, tripped.incident_id);
        assert!(!a.degraded);
        for d in &a.decisions {
            match d {
                Decision::Deny { reason: DenyReason::BreakerOpen, retry_after_ms } => {
                    assert!(*retry_after_ms > 50_000 && *retry_after_ms <= 60_000, "cooldown left {retry_after_ms}")
                }
                other => panic!("expected breaker open, got {other:?}"),
            }
        }
    }
    assert_eq!(dispatcher.round_trips(), before, "no round trip while known OPEN");

    // An operator closes it from another process: the transition event clears the cache.
    operator.force(&scope, Forced::Closed).await.expect("force closed");
    let reopened = bw_testkit::wait_until(Duration::from_secs(5), || async {
        matches!(dispatcher.admit(&scope, &items(1, TrafficClass::Priority)).await.decisions[0], Decision::Allow { .. })
    })
    .await;
    assert!(reopened, "the operator's close reached the dispatcher");
}

#[tokio::test]
async fn without_following_transitions_every_admission_asks_redis() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), limits()).await;
    let scope = scope();
    assert_eq!(breaker.record(&scope, &outcomes(4, OutcomeKind::Transient, false)).await.state, BreakerState::Open);
    // The first admission also reads the parent pauses (WABA and app keys, one call each, concurrently); they
    // are then trusted for `parent_refresh_ms` (1 s by default), so the next admission is one round trip.
    let before = breaker.round_trips();
    breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    assert_eq!(breaker.round_trips(), before + 3);
    let before = breaker.round_trips();
    breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    assert_eq!(breaker.round_trips(), before + 1);
}

/// `successes` successes then `failures` transient failures on a fresh scope; the state after.
async fn rate_case(breaker: &bw_breaker::Breaker, successes: usize, failures: usize) -> BreakerState {
    let scope = scope();
    breaker.record(&scope, &outcomes(successes, OutcomeKind::Success, false)).await;
    breaker.record(&scope, &outcomes(failures, OutcomeKind::Transient, false)).await.state
}

#[tokio::test]
async fn the_threshold_compare_is_exact() {
    let redis = bw_testkit::RedisServer::start();
    // The bare rate (failure_z 0): 5 % over at least 50 calls in the window trips, exactly (the fast trip's
    // evidence is far below its bar at 5 %).
    let bare = breaker(&redis.url(), ScopeLimits { failure_z: 0.0, ..ScopeLimits::default() }).await;
    assert_eq!(rate_case(&bare, 95, 5).await, BreakerState::Open, "exactly 5 % trips");
    assert_eq!(rate_case(&bare, 96, 4).await, BreakerState::Closed, "4 % does not");
    // The window at the defaults needs evidence (z = 4.5): 15 failures in 100 calls, not 14 (tests/it/evidence.rs).
    // The fast trip is off here: 11 failures in a row are its evidence, not the window's.
    let defaults = breaker(&redis.url(), ScopeLimits { fast_trip_failures: 0, ..ScopeLimits::default() }).await;
    assert_eq!(rate_case(&defaults, 95, 5).await, BreakerState::Closed, "5 % is no evidence");
    assert_eq!(rate_case(&defaults, 86, 14).await, BreakerState::Closed);
    assert_eq!(rate_case(&defaults, 85, 15).await, BreakerState::Open);
    // 0.07 trips at exactly 7 % (a float compare would need 7.000000000000001 failures).
    let seven = breaker(&redis.url(), ScopeLimits { failure_threshold: 0.07, min_calls: 100, ..limits() }).await;
    assert_eq!(rate_case(&seven, 93, 7).await, BreakerState::Open);
    assert_eq!(rate_case(&seven, 94, 6).await, BreakerState::Closed);
}

#[tokio::test]
async fn jitter_stays_inside_the_cooldown_cap() {
    let redis = bw_testkit::RedisServer::start();
    // Default: the first cooldown is 30 s plus up to 20 % jitter.
    let defaults = breaker(&redis.url(), ScopeLimits::default()).await;
    let scope = scope();
    // 20 failures of distinct recipients: far past the fast trip's evidence (11 such failures in a row).
    let r = defaults.record(&scope, &outcomes(20, OutcomeKind::Transient, false)).await;
    let t = &r.transitions[0];
    assert!((30_000..=36_000).contains(&(t.open_until_unix_ms - t.at_unix_ms)), "{t:?}");
    // Relaxed beside it: 100 ms growing x4, capped at 300 ms with 20 % jitter: no cooldown ever exceeds 300 ms.
    let limits = ScopeLimits {
        cooldown_ms: 100,
        cooldown_max_ms: 300,
        cooldown_growth: 4.0,
        cooldown_jitter: 0.2,
        canaries_per_s: 1000,
        ..limits()
    };
    let b = breaker(&redis.url(), limits).await;
    let scope = crate::support::scope();
    let first = b.record(&scope, &outcomes(4, OutcomeKind::Transient, false)).await;
    let mut cooldowns = vec![first.transitions[0].open_until_unix_ms - first.transitions[0].at_unix_ms];
    for _ in 0..6 {
        let half_open = bw_testkit::wait_until(WAIT, || async {
            b.tick(&scope).await.is_ok_and(|(s, _)| s.snapshot.state() == BreakerState::HalfOpen)
        })
        .await;
        assert!(half_open);
        let r = b.record(&scope, &outcomes(1, OutcomeKind::Transient, true)).await;
        let t = &r.transitions[0];
        assert_eq!(t.to(), BreakerState::Open);
        cooldowns.push(t.open_until_unix_ms - t.at_unix_ms);
    }
    assert!((100..=120).contains(&cooldowns[0]), "{cooldowns:?}");
    assert!(cooldowns.iter().all(|c| *c <= 300), "{cooldowns:?}");
    assert!(cooldowns[2..].iter().all(|c| *c == 300), "capped from the second re-trip on: {cooldowns:?}");
}

fn failed(prefix: &str, n: usize) -> Vec<bw_breaker::OutcomeItem> {
    (0..n)
        .map(|i| bw_breaker::OutcomeItem {
            recipient_key: format!("{prefix}{i}"),
            kind: OutcomeKind::Transient,
            canary: false,
        })
        .collect()
}

#[tokio::test]
async fn a_burst_of_transient_failures_trips_fast_even_when_the_window_is_thin() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    let breaker = breaker(&redis.url(), limits.clone()).await;
    // The fewest failures in a row (distinct recipients) whose evidence opens the breaker at the defaults.
    let n = (1..100).find(|k| bw_breaker::evidence::batch_trips(&limits, *k, *k)).expect("some count trips") as usize;
    assert!(n > limits.fast_trip_failures as usize, "{n}");
    assert!(n < limits.min_calls as usize, "{n}");
    // n - 1 failures: far below min_calls, nothing trips; the n-th distinct one does.
    let scope1 = scope();
    assert_eq!(breaker.record(&scope1, &failed("a", n - 1)).await.state, BreakerState::Closed);
    let r = breaker.record(&scope1, &failed("b", 1)).await;
    assert_eq!(r.state, BreakerState::Open);
    assert!(r.transitions[0].reason.contains("fast trip"), "{:?}", r.transitions);
    // One message failing on every retry is one recipient: the evidence grows, the guard holds.
    let scope2 = scope();
    for _ in 0..2 * n {
        assert_eq!(breaker.record(&scope2, &failed("same", 1)).await.state, BreakerState::Closed);
    }
    // The same failures among many successes in one batch are no evidence of an outage.
    let scope3 = scope();
    let mut batch = failed("c", n);
    batch.extend(outcomes(100, OutcomeKind::Success, false));
    assert_eq!(breaker.record(&scope3, &batch).await.state, BreakerState::Closed);
    // Rate limits between failures (which keep the sliding window thin by pausing the scope) do not hide them.
    let scope4 = scope();
    let limited =
        OutcomeKind::RateLimited { scope: RateScope::PhoneNumber, pause_ms: RateScope::PhoneNumber.default_pause_ms() };
    breaker.record(&scope4, &failed("d", 1)).await;
    breaker.record(&scope4, &outcomes(3, limited, false)).await;
    let r = breaker.record(&scope4, &failed("e", n - 1)).await;
    assert_eq!(r.state, BreakerState::Open);
    let calls = breaker.status(&scope4).await.expect("status").snapshot.calls_in_window;
    assert!(calls < u64::from(limits.min_calls), "tripped with {calls} calls in the window");
}
