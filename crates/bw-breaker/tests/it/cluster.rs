//! The same scripts, unchanged, through a cluster client on a 3-master Redis Cluster.

use crate::support::*;
use bw_breaker::{AdmitItem, Breaker, Decision, Forced, OutcomeKind, RedisConn, TrafficClass};
use bw_common::proto::BreakerState;

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
