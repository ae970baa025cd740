//! Redis restarted empty (kill -9 with persistence off, then started again on the same port): the leader
//! notices the missing epoch before it writes any snapshot, re-applies the FORCED_OPEN override an operator had
//! set (the snapshot in BW_SCOPES is its only record), rewrites the config hashes, and the snapshot never shows
//! the scope unforced.

use super::*;

async fn epoch_set(deps: &bw_common::service::Deps) -> bool {
    let mut conn = deps.redis.clone().expect("redis");
    redis::cmd("EXISTS")
        .arg(bw_wire::names::COORDINATOR_EPOCH_KEY)
        .query_async::<bool>(&mut conn)
        .await
        .unwrap_or(false)
}

#[tokio::test]
async fn after_redis_restarts_empty_the_leader_restores_a_forced_open_and_the_configs() {
    let mut servers = Servers::start();
    let i = Instance::start(
        servers.config("c", &format!("[operator]\ntoken_sha256 = \"{}\"\n", sha256_hex(OPERATOR_TOKEN))),
    )
    .await;
    let scope = Scope::new("w1", "5551");
    let breaker = client(&i.deps);
    let cfg_min_calls = || {
        let mut conn = i.deps.redis.clone().expect("redis");
        let key = bw_breaker::scripts::cfg_key(&scope);
        async move {
            let v: Option<String> =
                redis::cmd("HGET").arg(key).arg("min_calls").query_async(&mut conn).await.ok().flatten();
            v.as_deref() == Some("4")
        }
    };
    assert!(bw_testkit::wait_until(WAIT, cfg_min_calls).await, "the leader writes the scope config");
    assert!(bw_testkit::wait_until(WAIT, || epoch_set(&i.deps)).await, "first start: the leader sets the epoch");
    let (status, body) = i.post_as("/admin/breakers/5551/force-open", Some(OPERATOR_TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            kv_state(&i.deps, "5551").await.is_some_and(|s| s.state() == BreakerState::ForcedOpen)
        })
        .await
    );

    servers.redis.kill();
    servers.redis.restart();
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            let snapshot = kv_state(&i.deps, "5551").await.map(|s| s.state());
            assert_eq!(snapshot, Some(BreakerState::ForcedOpen), "the snapshot never shows the scope unforced");
            breaker.status(&scope).await.is_ok_and(|s| s.snapshot.state() == BreakerState::ForcedOpen)
        })
        .await,
        "the override is back in Redis"
    );
    assert!(bw_testkit::wait_until(WAIT, cfg_min_calls).await, "config hashes rewritten");
    let text = i.metrics_text();
    assert!(text.contains("bw_breaker_coordinator_redis_epoch_missing_total 1"), "{text}");
    assert!(text.contains("bw_breaker_coordinator_overrides_restored_total 1"), "{text}");
}

/// A snapshot recording an override is not re-applied over a later transition Redis shows (here: the operator
/// reset the scope after forcing it open, before a coordinator that keeps the epoch first started).
#[tokio::test]
async fn an_override_cleared_after_its_snapshot_is_not_reapplied() {
    let servers = Servers::start();
    let cfg = servers.config("c", "");
    let deps = bw_common::service::Deps::connect("breaker-coordinator", &cfg.nats, Some(&cfg.redis), WAIT)
        .await
        .expect("deps");
    let scope = Scope::new("w1", "5551");
    let breaker = client(&deps);
    let (forced, _) = breaker.force(&scope, bw_breaker::Forced::Open).await.expect("force");
    assert_eq!(forced.snapshot.state(), BreakerState::ForcedOpen);
    deps.buckets.scopes.put("5551", forced.snapshot.encode_to_vec().into()).await.expect("snapshot");
    let (reset, _) = breaker.reset(&scope).await.expect("reset");
    assert_eq!(reset.snapshot.state(), BreakerState::Closed);

    let i = Instance::start(cfg).await;
    assert!(
        bw_testkit::wait_until(WAIT, || epoch_set(&deps)).await,
        "the leader went through the restore and set the epoch"
    );
    assert_eq!(breaker.status(&scope).await.expect("status").snapshot.state(), BreakerState::Closed);
    let text = i.metrics_text();
    assert!(text.contains("bw_breaker_coordinator_redis_epoch_missing_total 1"), "{text}");
    assert!(text.contains("bw_breaker_coordinator_overrides_restored_total 0"), "{text}");
}

/// A sender whose messages all wait in the DLQ, and that the Redis scope index does not name (the index was
/// lost with a Redis master, or never written): the coordinator learns it from its DLQ entries and writes its
/// snapshot, so replay, which follows the snapshots, gets a worker for it and can drain it.
#[tokio::test]
async fn a_sender_known_only_from_its_dlq_entries_gets_a_snapshot() {
    let servers = Servers::start();
    let i = Instance::start(servers.config("c", "")).await;
    assert!(kv_state(&i.deps, "5562").await.is_none(), "nothing knows the sender yet");
    let request = bw_proto::v1::SendRequest {
        operation_id: "dlq-only-1".into(),
        waba_id: "w1".into(),
        phone_number_id: "5562".into(),
        ..Default::default()
    };
    let envelope = bw_proto::v1::DlqEnvelope { request: Some(request), ..Default::default() };
    let subject = bw_wire::names::dlq_subject(bw_proto::v1::Category::Transactional, "5562");
    i.deps.js.publish(subject, envelope.encode_to_vec().into()).await.expect("publish").await.expect("stored");
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            kv_state(&i.deps, "5562").await.is_some_and(|s| {
                s.state() == BreakerState::Closed && s.scope.as_ref().is_some_and(|x| x.waba_id == "w1")
            })
        })
        .await,
        "the leader learned the sender from the DLQ and recorded its breaker"
    );
}
