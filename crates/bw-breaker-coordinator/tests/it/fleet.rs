//! Two coordinators on the same servers: one leads (ticks, writes), the other takes over when the leader dies,
//! and no breaker transition is ever applied (published) twice.

use super::*;
use bw_breaker::ScopeLimits;
use std::sync::{Arc, Mutex};

type Seen = Arc<Mutex<Vec<(BreakerState, BreakerState, String)>>>;

/// Records every transition event on `bw.breaker.v1.*` (from, to, incident), in arrival order, on a
/// connection of its own.
async fn record_events(url: &str) -> (Seen, async_nats::Client) {
    let nats = async_nats::connect(url).await.expect("connect");
    let mut sub = nats.subscribe(bw_wire::names::BREAKER_WILDCARD).await.expect("subscribe");
    nats.flush().await.expect("flush");
    let seen: Seen = Arc::default();
    let out = seen.clone();
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            if let Ok(t) = BreakerTransition::decode(msg.payload.as_ref()) {
                out.lock().expect("events").push((t.from(), t.to(), t.incident_id.clone()));
            }
        }
    });
    (seen, nats)
}

fn count(seen: &Seen, from: BreakerState, to: BreakerState) -> usize {
    seen.lock().expect("events").iter().filter(|(f, t, _)| *f == from && *t == to).count()
}

fn kinds(seen: &Seen) -> Vec<(BreakerState, BreakerState)> {
    seen.lock().expect("events").iter().map(|(f, t, _)| (*f, *t)).collect()
}

async fn trip(breaker: &Breaker, scope: &Scope) {
    let failures: Vec<OutcomeItem> = (0..4)
        .map(|i| OutcomeItem { recipient_key: format!("r{i}"), kind: OutcomeKind::Transient, canary: false })
        .collect();
    let result = breaker.record(scope, &failures).await;
    assert_eq!(result.state, BreakerState::Open, "4 failures trip at min_calls = 4");
}

/// Coordinator timing at the compiled defaults (tick 250 ms, lease 3 s renewed every second); only the limits
/// (cooldown 400 ms, min_calls 4) come from the harness limits file.
#[tokio::test]
async fn a_second_coordinator_takes_over_the_ticks_and_no_transition_is_applied_twice() {
    let servers = Servers::start();
    let (seen, _sub) = record_events(&servers.nats.url()).await;
    let a = Instance::start(servers.config("a", "")).await;
    assert!(bw_testkit::wait_until(WAIT, || async { a.coordinator.is_leader() }).await, "the first one leads");
    let b = Instance::start(servers.config("b", "")).await;
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            let (status, body) = b.get("/admin/leader").await;
            status == 200 && body["holder"] == a.coordinator.instance() && body["leader"] == false
        })
        .await,
        "the second one follows and names the leader"
    );
    assert!(!b.coordinator.is_leader());

    let scope = Scope::new("w1", "5551");
    let conn = b.deps.redis.clone().expect("redis");
    assert!(
        bw_testkit::wait_until(WAIT, || {
            let mut conn = conn.clone();
            let key = bw_breaker::scripts::cfg_key(&scope);
            async move {
                let v: Option<String> =
                    redis::cmd("HGET").arg(key).arg("min_calls").query_async(&mut conn).await.ok().flatten();
                v.as_deref() == Some("4")
            }
        })
        .await,
        "the leader writes the scope config"
    );
    let breaker = client(&b.deps);
    trip(&breaker, &scope).await;
    assert!(
        bw_testkit::wait_until(WAIT, || async { count(&seen, BreakerState::Open, BreakerState::HalfOpen) == 1 }).await,
        "the leader ticks OPEN -> HALF_OPEN after the cooldown: {:?}",
        kinds(&seen)
    );

    // Kill the leader: its loops stop without giving the lease back (as a crash would).
    a.task.abort();
    assert!(bw_testkit::wait_until(WAIT, || async { a.task.is_finished() }).await);
    let (_, transitions) = breaker.reset(&scope).await.expect("reset");
    assert_eq!(transitions.len(), 1, "HALF_OPEN -> CLOSED");
    trip(&breaker, &scope).await;
    let second_incident = breaker.status(&scope).await.expect("status").snapshot.incident_id;
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            assert!(!(a.coordinator.is_leader() && b.coordinator.is_leader()), "never two leaders at once");
            count(&seen, BreakerState::Open, BreakerState::HalfOpen) == 2
        })
        .await,
        "the survivor takes the lease and ticks the second incident: {:?}",
        kinds(&seen)
    );
    assert!(b.coordinator.is_leader());
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            kv_state(&b.deps, "5551")
                .await
                .is_some_and(|s| s.state() == BreakerState::HalfOpen && s.incident_id == second_incident)
        })
        .await,
        "the new leader writes the BW_SCOPES snapshot"
    );
    assert!(b.metrics_text().contains("bw_breaker_coordinator_leader 1"), "{}", b.metrics_text());
    use BreakerState::*;
    assert_eq!(
        kinds(&seen),
        [(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed), (Closed, Open), (Open, HalfOpen)],
        "every transition published exactly once"
    );
}

/// Even when two instances act at once (a stalled leader that still believes it leads), the scripts decide:
/// ticks hammered from two coordinators make the OPEN -> HALF_OPEN transition once.
#[tokio::test]
async fn ticks_from_two_coordinators_at_once_make_one_transition() {
    let servers = Servers::start();
    let (seen, _sub) = record_events(&servers.nats.url()).await;
    let connect = |name: &'static str| {
        let cfg = servers.config(name, "");
        async move {
            let deps = bw_common::service::Deps::connect("breaker-coordinator", &cfg.nats, Some(&cfg.redis), WAIT)
                .await
                .expect("deps");
            (Coordinator::new(cfg, &deps).expect("coordinator"), deps)
        }
    };
    // Not running: neither holds the lease, both tick directly.
    let (a, a_deps) = connect("a").await;
    let (b, b_deps) = connect("b").await;
    let scope = Scope::new("w1", "5551");
    let cfg = BreakerConfig {
        defaults: ScopeLimits {
            min_calls: 4,
            failure_threshold: 0.5,
            failure_z: 0.0,
            cooldown_ms: 400,
            cooldown_jitter: 0.0,
            ..ScopeLimits::default()
        },
        ..BreakerConfig::default()
    };
    let breaker = Breaker::with_conn(a_deps.redis.clone(), Some(a_deps.nats.clone()), cfg);
    trip(&breaker, &scope).await;
    let half_open = bw_testkit::wait_until(WAIT, || async {
        let (x, y, z, w) = tokio::join!(
            a.tick_scope(&scope, false),
            b.tick_scope(&scope, false),
            a.tick_scope(&scope, false),
            b.tick_scope(&scope, false)
        );
        [x, y, z, w].iter().flatten().any(|s| s.snapshot.state() == BreakerState::HalfOpen)
    })
    .await;
    assert!(half_open, "the cooldown ends");
    for deps in [&a_deps, &b_deps] {
        deps.nats.flush().await.expect("flush");
    }
    assert!(
        bw_testkit::wait_until(WAIT, || async { count(&seen, BreakerState::Open, BreakerState::HalfOpen) >= 1 }).await
    );
    _sub.flush().await.expect("flush");
    assert_eq!(
        kinds(&seen),
        [(BreakerState::Closed, BreakerState::Open), (BreakerState::Open, BreakerState::HalfOpen)]
    );
    assert!(kv_state(&a_deps, "5551").await.is_none(), "no lease, no snapshot writes");
}

/// A graceful stop gives the lease back before `run` returns, so the standby does not wait for it to lapse.
#[tokio::test]
async fn a_graceful_stop_hands_the_lease_over() {
    let servers = Servers::start();
    let mut a = Instance::start(servers.config("a", "")).await;
    assert!(bw_testkit::wait_until(WAIT, || async { a.coordinator.is_leader() }).await);
    let b = Instance::start(servers.config("b", "")).await;
    a.token.cancel();
    (&mut a.task).await.expect("joins").expect("run ends cleanly");
    let a_coordinator = a.coordinator.clone();
    assert!(!a_coordinator.is_leader());
    let holder = b.coordinator.leader_holder().await;
    assert_ne!(holder.as_deref(), Some(a_coordinator.instance()), "released, not left to expire");
    assert!(bw_testkit::wait_until(WAIT, || async { b.coordinator.is_leader() }).await, "the standby takes over");
    assert_eq!(b.coordinator.leader_holder().await.as_deref(), Some(b.coordinator.instance()));
}

/// The Service spreads operator calls over every instance: an action on a follower applies (the scripts are
/// the same everywhere) and the leader records it in BW_SCOPES.
#[tokio::test]
async fn an_operator_action_on_a_follower_applies_and_the_leader_records_it() {
    let servers = Servers::start();
    let operator = format!("[operator]\ntoken_sha256 = \"{}\"\n", sha256_hex(OPERATOR_TOKEN));
    let a = Instance::start(servers.config("a", &operator)).await;
    assert!(bw_testkit::wait_until(WAIT, || async { a.coordinator.is_leader() }).await);
    let b = Instance::start(servers.config("b", &operator)).await;
    assert!(!b.coordinator.is_leader());
    let (status, body) = b.post_as("/admin/breakers/5551/force-open", Some(OPERATOR_TOKEN)).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("FORCED_OPEN")), "{body}");
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            kv_state(&a.deps, "5551").await.is_some_and(|s| s.state() == BreakerState::ForcedOpen)
        })
        .await,
        "the leader writes the follower's override into BW_SCOPES"
    );
    assert!(!b.coordinator.is_leader(), "the follower did not take over to do it");
}
