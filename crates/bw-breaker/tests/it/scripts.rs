//! Every script runs against a real Redis and answers the documented shape.

use crate::support::*;
use bw_breaker::{Decision, Forced, OutcomeKind, TrafficClass};
use bw_common::proto::BreakerState;

#[tokio::test]
async fn every_script_runs_and_a_fresh_scope_is_closed() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), limits()).await;
    let scope = scope();
    let admission = breaker.admit(&scope, &items(3, TrafficClass::Marketing)).await;
    assert!(!admission.degraded);
    assert_eq!(admission.state, BreakerState::Closed);
    assert_eq!(admission.decisions, vec![Decision::Allow { canary: false }; 3]);
    let result = breaker.record(&scope, &outcomes(3, OutcomeKind::Success, false)).await;
    assert!(!result.degraded);
    assert!(result.transitions.is_empty());
    breaker.observe_usage(&scope, 50).await;
    let snapshot = breaker.snapshot(&scope).await.expect("read_scope");
    assert_eq!(snapshot.state(), BreakerState::Closed);
    assert_eq!(snapshot.calls_in_window, 3);
    let (status, transitions) = breaker.tick(&scope).await.expect("tick_scope");
    assert!(transitions.is_empty());
    assert_eq!(status.usage_percent, 50);
    let (status, transitions) = breaker.force(&scope, Forced::Open).await.expect("force_breaker");
    assert_eq!(status.snapshot.state(), BreakerState::ForcedOpen);
    assert_eq!(transitions.len(), 1);
    assert!(!status.snapshot.incident_id.is_empty());
    let (status, _) = breaker.reset(&scope).await.expect("reset");
    assert_eq!(status.snapshot.state(), BreakerState::Closed);
    assert!(status.snapshot.incident_id.is_empty());
}
