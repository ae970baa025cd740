//! The same scripts, unchanged, through a cluster client on a 3-master Redis Cluster.

use crate::support::*;
use bw_breaker::{AdmitItem, Breaker, Decision, Forced, OutcomeKind, RedisConn, TrafficClass};
use bw_proto::v1::BreakerState;

#[tokio::test]
async fn scripts_run_unchanged_on_a_redis_cluster() {
    let cluster = bw_testkit::RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    let conn = client.get_async_connection().await.expect("cluster connection");
    let breaker = Breaker::with_conn(Some(RedisConn::Cluster(conn)), None, config(limits()));
    // Enough scopes to land on every master.
    let scopes: Vec<_> = (0..12).map(|_| scope()).collect();
    for scope in &scopes {
        let batch: Vec<AdmitItem> =
            (0..8).map(|i| AdmitItem { recipient_key: format!("r{}", i % 3), class: TrafficClass::Priority }).collect();
        let a = breaker.admit(scope, &batch).await;
        assert!(!a.degraded, "cluster answered for {}", scope.phone_number_id);
        assert!(a.decisions.iter().all(|d| matches!(d, Decision::Allow { canary: false, .. })));
        let r = breaker.record(scope, &outcomes(4, OutcomeKind::Transient, false)).await;
        assert!(!r.degraded);
        assert_eq!(r.state, BreakerState::Open);
        assert_eq!(r.transitions.len(), 1);
        let (status, _) = breaker.force(scope, Forced::Closed).await.expect("force");
        assert_eq!(status.snapshot.state(), BreakerState::ForcedClosed);
        let (status, _) = breaker.reset(scope).await.expect("reset");
        assert_eq!(status.snapshot.state(), BreakerState::Closed);
        assert_eq!(status.snapshot.calls_in_window, 0);
    }
    // The keys of the scopes really are spread over the masters.
    let mut masters_with_keys = 0;
    for url in cluster.urls() {
        let mut conn = manager(&url).await;
        let n: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.expect("dbsize");
        if n > 0 {
            masters_with_keys += 1;
        }
    }
    assert!(masters_with_keys >= 2, "scopes landed on {masters_with_keys} masters");
}

#[tokio::test]
async fn parent_pauses_work_on_a_redis_cluster() {
    use bw_breaker::{DenyReason, Parent, ScopeLimits};
    use bw_common::classify::RateScope;
    let cluster = bw_testkit::RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    let conn = client.get_async_connection().await.expect("cluster connection");
    let breaker = Breaker::with_conn(Some(RedisConn::Cluster(conn)), None, config(ScopeLimits::default()));
    breaker.set_account("app-c", "token-c");
    let scopes: Vec<_> = (0..6).map(|_| scope()).collect();
    let first = |a: bw_breaker::Admission| a.decisions[0];
    let app_limit = OutcomeKind::RateLimited { scope: RateScope::App, pause_ms: 60_000 };
    let r = breaker.record(&scopes[0], &outcomes(1, app_limit, false)).await;
    assert!(!r.degraded);
    // Every scope, whatever its slot, is refused under the app's key (its own slot).
    for s in &scopes {
        let d =
            first(breaker.admit(s, &[AdmitItem { recipient_key: "r".into(), class: TrafficClass::Priority }]).await);
        assert!(matches!(d, Decision::Deny { reason: DenyReason::AppPaused, .. }), "{d:?}");
    }
    breaker.clear_parent(&Parent::App("app-c".into())).await.expect("clear on the cluster");
    let token = bw_breaker::PauseSpec {
        scope: bw_common::classify::PauseScope::Token,
        code: 190,
        end: bw_breaker::PauseEnd::Lifted,
        marketing_only: false,
        source: bw_breaker::PauseSource::Answer,
    };
    breaker.record(&scopes[1], &outcomes(1, OutcomeKind::Pause(token), false)).await;
    let d = first(
        breaker.admit(&scopes[2], &[AdmitItem { recipient_key: "r".into(), class: TrafficClass::Priority }]).await,
    );
    assert!(matches!(d, Decision::Deny { reason: DenyReason::TokenHalted, .. }), "{d:?}");
    let status = breaker.parent_status(&Parent::Token(bw_breaker::token_fingerprint("token-c"))).await.expect("read");
    assert!(status.halted);
    // A number's own pause lives in the number's slot, read by the admission script itself.
    let number = bw_breaker::PauseSpec { scope: bw_common::classify::PauseScope::PhoneNumber, code: 133010, ..token };
    breaker.clear_parent(&Parent::Token(bw_breaker::token_fingerprint("token-c"))).await.expect("clear");
    breaker.record(&scopes[3], &outcomes(1, OutcomeKind::Pause(number), false)).await;
    for (i, s) in scopes.iter().enumerate() {
        let d =
            first(breaker.admit(s, &[AdmitItem { recipient_key: "r".into(), class: TrafficClass::Priority }]).await);
        if i == 3 {
            assert!(matches!(d, Decision::Deny { reason: DenyReason::NumberPaused, .. }), "{d:?}");
        } else {
            assert!(matches!(d, Decision::Allow { .. }), "scope {i}: {d:?}");
        }
    }
    let snap = breaker.snapshot(&scopes[3]).await.expect("snapshot on the cluster");
    assert_eq!(snap.pauses.len(), 1, "{snap:?}");
    assert_eq!(snap.pauses[0].code, 133010);
}

/// The pooled trip on a 3-master cluster: `pool_evidence.lua` runs on the token's slot and `pool_trip.lua` on each
/// named number's slot (each script touches one slot), and the trip opens the failing numbers only.
#[tokio::test]
async fn the_pooled_trip_opens_the_failing_numbers_only_on_a_redis_cluster() {
    use bw_breaker::evidence::PoolTest;
    let cluster = bw_testkit::RedisCluster::start();
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    let conn = client.get_async_connection().await.expect("cluster connection");
    // The compiled defaults, the numbers' own checks out of reach: only the pool opens a breaker here.
    let defaults = bw_breaker::ScopeLimits { min_calls: u32::MAX, fast_trip_evidence: 1e9, ..Default::default() };
    let breaker = Breaker::with_conn(Some(RedisConn::Cluster(conn)), None, config(defaults));
    breaker.set_account("app-pool", "token-pool");
    // Enough numbers that their slots spread over the masters; the first 9 fail, the last 3 only succeed.
    let scopes: Vec<_> = (0..12).map(|_| scope()).collect();
    let (failing, healthy) = scopes.split_at(9);
    let batch = |prefix: &str, fails: usize, kind: OutcomeKind| -> Vec<bw_breaker::OutcomeItem> {
        (0..4)
            .map(|i| bw_breaker::OutcomeItem {
                recipient_key: format!("{prefix}-{i}"),
                kind: if i < fails { kind } else { OutcomeKind::Success },
                canary: false,
            })
            .collect()
    };
    let mut tripped = None;
    'rounds: for round in 0..10 {
        for (i, s) in scopes.iter().enumerate() {
            let b = if i < failing.len() {
                batch(&format!("f{round}-{i}"), 2, OutcomeKind::Transient)
            } else {
                batch(&format!("h{round}-{i}"), 0, OutcomeKind::Transient)
            };
            let r = breaker.record_pooled(s, &b).await;
            if r.tripped.is_some() {
                tripped = Some(r);
                break 'rounds;
            }
        }
    }
    let r = tripped.expect("the pool trips on the cluster");
    assert_eq!(r.tripped, Some(PoolTest::Evidence));
    assert!(!r.trips.is_empty() && r.trips.iter().all(|(s, t)| t.state == BreakerState::Open && failing.contains(s)));
    for s in failing.iter().filter(|s| r.trips.iter().any(|(t, _)| t == *s)) {
        assert_eq!(breaker.status(s).await.expect("read").snapshot.state(), BreakerState::Open);
    }
    for s in healthy {
        assert_eq!(breaker.status(s).await.expect("read").snapshot.state(), BreakerState::Closed);
    }
    // Meta's declared unavailability trips the second test the same way, on another token's pool.
    breaker.set_account("app-pool", "token-pool-2");
    let scopes: Vec<_> = (0..6).map(|_| scope()).collect();
    let mut second = None;
    'declared: for round in 0..10 {
        for (i, s) in scopes.iter().enumerate() {
            let fails = usize::from(i < 4);
            let r = breaker.record_pooled(s, &batch(&format!("d{round}-{i}"), fails, OutcomeKind::Unavailable)).await;
            if r.tripped.is_some() {
                second = Some(r);
                break 'declared;
            }
        }
    }
    let r = second.expect("the second test trips on the cluster");
    assert_eq!(r.tripped, Some(PoolTest::Unavailable));
    let named: Vec<&bw_breaker::Scope> = r.trips.iter().map(|(s, _)| s).collect();
    assert!(!named.is_empty() && named.iter().all(|s| scopes[..4].contains(s)), "{named:?}");
    for s in &scopes[4..] {
        assert_eq!(breaker.status(s).await.expect("read").snapshot.state(), BreakerState::Closed);
    }
    // The pooled keys and the numbers' keys are spread over the masters.
    let mut masters_with_keys = 0;
    for url in cluster.urls() {
        let mut conn = manager(&url).await;
        let n: i64 = redis::cmd("DBSIZE").query_async(&mut conn).await.expect("dbsize");
        masters_with_keys += usize::from(n > 0);
    }
    assert!(masters_with_keys >= 2, "keys landed on {masters_with_keys} masters");
}
