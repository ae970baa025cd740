//! Every script runs against a real Redis and answers the documented shape.

use crate::support::*;
use bw_breaker::{Decision, Forced, OutcomeKind, TrafficClass};
use bw_proto::v1::BreakerState;

#[tokio::test]
async fn every_script_runs_and_a_fresh_scope_is_closed() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), limits()).await;
    let scope = scope();
    let admission = breaker.admit(&scope, &items(3, TrafficClass::Marketing)).await;
    assert!(!admission.degraded);
    assert_eq!(admission.state, BreakerState::Closed);
    assert!(admission.decisions.iter().all(|d| matches!(d, Decision::Allow { canary: false, .. })), "{admission:?}");
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

/// Loads the prelude into a real Redis and returns its definition tables as (table, name, value) rows.
async fn lua_definitions() -> Vec<(String, String, String)> {
    let redis = bw_testkit::RedisServer::start();
    let mut conn = manager(&redis.url()).await;
    let dump = r#"
local out = {}
local tables = { CODE = CODE, OUT = OUT, PAUSE = PAUSE, F = F, P = P, PF = PF }
for tname, t in pairs(tables) do
  for k, v in pairs(t) do
    out[#out + 1] = tname
    out[#out + 1] = k
    out[#out + 1] = tostring(v)
  end
end
return out
"#;
    let script = format!("{}\n{dump}", bw_breaker::scripts::PRELUDE);
    let flat: Vec<String> = redis::cmd("EVAL").arg(script).arg(0).query_async(&mut conn).await.expect("prelude loads");
    flat.chunks(3).map(|c| (c[0].clone(), c[1].clone(), c[2].clone())).collect()
}

fn sorted(mut v: Vec<(String, String)>) -> Vec<(String, String)> {
    v.sort();
    v
}

fn table(rows: &[(String, String, String)], name: &str) -> Vec<(String, String)> {
    sorted(rows.iter().filter(|r| r.0 == name).map(|r| (r.1.clone(), r.2.clone())).collect())
}

#[tokio::test]
async fn lua_definitions_match_the_rust_ones() {
    use bw_breaker::DenyReason;
    use bw_breaker::scripts::{self, Code};
    let rows = lua_definitions().await;
    // Decision codes: the same names and numbers on both sides.
    let rust_codes = sorted(Code::ALL.iter().map(|c| (c.lua_name().to_string(), (*c as i64).to_string())).collect());
    assert_eq!(table(&rows, "CODE"), rust_codes);
    // Every code maps to a variant and back; allow / canary to none.
    for code in Code::ALL {
        assert_eq!(Code::from_i64(code as i64), Some(code));
        match code.deny_reason() {
            None => assert!(matches!(code, Code::Allow | Code::Canary), "{code:?}"),
            Some(reason) => assert_eq!(reason.lua_code(), Some(code), "{reason:?}"),
        }
    }
    // Every deny reason either has its Lua code or is one of the reasons decided in Rust.
    for reason in DenyReason::ALL {
        let rust_only = matches!(
            reason,
            DenyReason::Degraded | DenyReason::AppPaused | DenyReason::WabaPaused | DenyReason::TokenHalted
        );
        assert_eq!(reason.lua_code().is_none(), rust_only, "{reason:?}");
    }
    // Labels are distinct.
    let mut labels: Vec<_> = DenyReason::ALL.iter().map(|r| r.label()).collect();
    labels.sort();
    labels.dedup();
    assert_eq!(labels.len(), DenyReason::ALL.len());
    // Outcome kinds, pause kinds and every field name.
    let pairs = |t: &[(&str, &str)]| sorted(t.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect());
    assert_eq!(table(&rows, "OUT"), pairs(scripts::OUT));
    assert_eq!(
        table(&rows, "PAUSE"),
        sorted(scripts::PAUSE_KINDS.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    );
    assert_eq!(table(&rows, "F"), pairs(scripts::STATE_FIELDS));
    assert_eq!(table(&rows, "P"), pairs(scripts::PAIR_FIELDS));
    assert_eq!(table(&rows, "PF"), pairs(scripts::PARENT_FIELDS));
}

#[tokio::test]
async fn the_state_hash_holds_only_fields_the_prelude_defines() {
    use bw_breaker::scripts;
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), limits()).await;
    let scope = scope();
    breaker.admit(&scope, &items(3, TrafficClass::Marketing)).await;
    breaker.record(&scope, &outcomes(2, OutcomeKind::Success, false)).await;
    breaker.record(&scope, &outcomes(1, OutcomeKind::Transient, false)).await;
    let limited = OutcomeKind::RateLimited { scope: bw_common::classify::RateScope::PhoneNumber, pause_ms: 10 };
    breaker.record(&scope, &outcomes(1, limited, false)).await;
    let pair = OutcomeKind::RateLimited { scope: bw_common::classify::RateScope::Pair, pause_ms: 10 };
    breaker.record(&scope, &outcomes(1, pair, false)).await;
    breaker
        .record(
            &scope,
            &outcomes(
                1,
                OutcomeKind::RateLimited { scope: bw_common::classify::RateScope::Recipient, pause_ms: 0 },
                false,
            ),
        )
        .await;
    breaker.observe_usage(&scope, 40).await;
    breaker.observe_no_usage(&scope).await;
    assert_eq!(breaker.claim_late(&scope, 1000.0, 1.0).await, Some(true));
    breaker.force(&scope, Forced::Open).await.expect("force");
    breaker.reset(&scope).await.expect("reset");
    let mut conn = manager(&redis.url()).await;
    let state: Vec<String> =
        redis::cmd("HKEYS").arg(scripts::state_key(&scope)).query_async(&mut conn).await.expect("hkeys");
    assert!(state.len() > 10, "{state:?}");
    for field in state {
        let known = scripts::STATE_FIELDS.iter().any(|(name, f)| {
            *f == field || (name.starts_with("win_") && field.strip_prefix(f).is_some_and(|n| n.parse::<u32>().is_ok()))
        });
        assert!(known, "state field `{field}` is not in F");
    }
    let pair: Vec<String> =
        redis::cmd("HKEYS").arg(scripts::pair_key(&scope, "r0")).query_async(&mut conn).await.expect("hkeys");
    assert!(!pair.is_empty());
    for field in pair {
        assert!(scripts::PAIR_FIELDS.iter().any(|(_, f)| *f == field), "pair field `{field}` is not in P");
    }
}
