//! Concurrency (no lost updates, limits never exceeded), Redis restart mid-run, Redis unreachable fallback.

use crate::support::*;
use bw_breaker::{Decision, DenyReason, OutcomeKind, ScopeLimits, TrafficClass};
use bw_proto::v1::BreakerState;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_never_exceed_the_bucket_and_lose_no_outcome() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits { rate_per_s: 0.001, burst: 300.0, reserve_fraction: 0.0, pair_burst: 1000, ..limits() };
    let scope = scope();
    let mut tasks = Vec::new();
    for task in 0..16 {
        // Separate connections, like separate dispatcher instances.
        let breaker = breaker(&redis.url(), limits.clone()).await;
        let scope = scope.clone();
        tasks.push(tokio::spawn(async move {
            let mut allowed = 0;
            for round in 0..10 {
                let batch: Vec<_> = (0..5)
                    .map(|i| bw_breaker::AdmitItem {
                        recipient_key: format!("t{task}-{round}-{i}"),
                        class: TrafficClass::Priority,
                    })
                    .collect();
                let a = breaker.admit(&scope, &batch).await;
                assert!(!a.degraded);
                allowed += a.decisions.iter().filter(|d| matches!(d, Decision::Allow { .. })).count();
                breaker.record(&scope, &outcomes(5, OutcomeKind::Success, false)).await;
            }
            allowed
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    // 800 asked for, 300 tokens: exactly 300 admitted across all tasks.
    assert_eq!(total, 300);
    let b = breaker(&redis.url(), limits).await;
    assert_eq!(b.snapshot(&scope).await.expect("read").calls_in_window, 800);
}

#[tokio::test]
async fn redis_restart_mid_run_reloads_scripts_and_recovers() {
    let mut redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), limits()).await;
    let scope = scope();
    assert!(!breaker.admit(&scope, &items(1, TrafficClass::Priority)).await.degraded);
    redis.restart();
    // Data and script cache are gone; the connection manager reconnects and EVALSHA falls back to EVAL/LOAD.
    assert!(
        bw_testkit::wait_until(WAIT, || {
            let b = breaker.clone();
            let s = scope.clone();
            async move { !b.admit(&s, &items(1, TrafficClass::Priority)).await.degraded }
        })
        .await,
        "breaker did not go back to redis after the restart"
    );
    let result = breaker.record(&scope, &outcomes(4, OutcomeKind::Transient, false)).await;
    assert!(!result.degraded);
    assert_eq!(result.state, BreakerState::Open);
}

#[tokio::test]
async fn unreachable_redis_falls_back_to_a_conservative_local_breaker_and_recovers() {
    let mut redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), limits()).await;
    let cfg = breaker.config().clone();
    let scope = scope();
    let opened = breaker.record(&scope, &outcomes(4, OutcomeKind::Transient, false)).await;
    assert_eq!(opened.state, BreakerState::Open);
    redis.kill();
    // Redis last said OPEN: the fallback starts OPEN with the same incident.
    let a = breaker.admit(&scope, &items(3, TrafficClass::Priority)).await;
    assert!(a.degraded);
    assert_eq!(a.state, BreakerState::Open);
    assert_eq!(a.incident_id, opened.incident_id);
    assert!(a.decisions.iter().all(|d| matches!(d, Decision::Deny { reason: DenyReason::BreakerOpen, .. })), "{a:?}");
    // A scope Redis never saw: bounded by the local bucket, replay refused.
    let fresh = crate::support::scope();
    let a = breaker.admit(&fresh, &items(100, TrafficClass::Priority)).await;
    assert!(a.degraded);
    let allowed = a.decisions.iter().filter(|d| matches!(d, Decision::Allow { .. })).count();
    assert_eq!(allowed as f64, cfg.fallback_burst);
    // The refused ones are asked about again once Redis is tried again, not queued behind each other at the
    // fallback's rate (the last of 100 would wait 19 s, and stay stranded after Redis answered again).
    for d in &a.decisions {
        if let Decision::Deny { reason, retry_after_ms } = d {
            assert_eq!(*reason, DenyReason::SenderRate, "{a:?}");
            assert!(*retry_after_ms <= cfg.redis_retry_after_ms, "{d:?} waits past the next try of Redis");
        }
    }
    let a = breaker.admit(&fresh, &items(1, TrafficClass::Replay)).await;
    assert!(matches!(a.decisions[0], Decision::Deny { reason: DenyReason::Degraded, .. }));
    // The local breaker trips on failures.
    let r = breaker.record(&fresh, &outcomes(cfg.fallback_min_calls as usize, OutcomeKind::Transient, false)).await;
    assert!(r.degraded);
    assert_eq!(r.state, BreakerState::Open);
    // Redis comes back (empty): answers come from Redis again without any intervention.
    redis.restart();
    assert!(
        bw_testkit::wait_until(WAIT, || {
            let b = breaker.clone();
            let s = fresh.clone();
            async move {
                let a = b.admit(&s, &items(1, TrafficClass::Priority)).await;
                !a.degraded && a.state == BreakerState::Closed
            }
        })
        .await
    );
}
