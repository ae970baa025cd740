//! Every limit and fault at its own scope, and only there, fleet-wide, at the compiled default config: app (4),
//! WABA (80007 / 80008, 368, 131063 for marketing), token (190), number (131048 spam, its own pause key for
//! 133010, 133016 and the probing authentication refusals), recipient (131049).

use crate::support::*;
use bw_breaker::{
    AdmitItem, Breaker, Decision, DenyReason, OutcomeItem, OutcomeKind, Parent, PauseEnd, PauseSource, PauseSpec,
    Scope, ScopeLimits, TrafficClass,
};
use bw_common::classify::{PauseScope, RateScope};
use bw_proto::v1::BreakerState;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);

async fn default_breaker(url: &str) -> Breaker {
    breaker(url, ScopeLimits::default()).await
}

fn one(recipient: &str, class: TrafficClass) -> AdmitItem {
    AdmitItem { recipient_key: recipient.into(), class }
}

fn outcome(kind: OutcomeKind) -> OutcomeItem {
    OutcomeItem { recipient_key: "r0".into(), kind, canary: false }
}

async fn first(breaker: &Breaker, scope: &Scope, class: TrafficClass) -> Decision {
    breaker.admit(scope, &[one("r0", class)]).await.decisions[0]
}

fn denied(d: Decision, want: DenyReason) -> Option<u64> {
    match d {
        Decision::Deny { reason, retry_after_ms } if reason == want => Some(retry_after_ms),
        _ => None,
    }
}

async fn eventually(breaker: &Breaker, scope: &Scope, want: DenyReason) -> bool {
    bw_testkit::wait_until(WAIT, || async {
        denied(first(breaker, scope, TrafficClass::Priority).await, want).is_some()
    })
    .await
}

fn hold(scope: PauseScope, code: i64, end: PauseEnd) -> OutcomeKind {
    OutcomeKind::Pause(PauseSpec { scope, code, end, marketing_only: false, source: PauseSource::Answer })
}

fn allowed(d: Decision) -> bool {
    matches!(d, Decision::Allow { .. })
}

fn in_waba(waba: &str) -> Scope {
    let s = scope();
    Scope::new(waba, s.phone_number_id)
}

#[tokio::test]
async fn an_app_rate_limit_pauses_every_number_on_the_app_in_every_dispatcher() {
    let redis = bw_testkit::RedisServer::start();
    let here = default_breaker(&redis.url()).await;
    let there = default_breaker(&redis.url()).await;
    let elsewhere = default_breaker(&redis.url()).await;
    here.set_account("app-1", "token-a");
    there.set_account("app-1", "token-b");
    elsewhere.set_account("app-2", "token-c");
    let (s1, s2, s3) = (scope(), scope(), scope());
    // `there` has read the parents already (cached as not paused).
    assert!(matches!(first(&there, &s2, TrafficClass::Priority).await, Decision::Allow { .. }));
    let app_limit = OutcomeKind::RateLimited { scope: RateScope::App, pause_ms: RateScope::App.default_pause_ms() };
    let r = here.record(&s1, &[outcome(app_limit)]).await;
    assert_eq!(r.state, BreakerState::Closed);
    // The recording process knows at once, for every number on the app (another WABA too).
    let retry = denied(first(&here, &s2, TrafficClass::Priority).await, DenyReason::AppPaused).expect("app paused");
    assert!((50_000..=60_000).contains(&retry), "{retry}");
    assert!(denied(first(&here, &s1, TrafficClass::Marketing).await, DenyReason::AppPaused).is_some());
    // Another dispatcher on the same app sees it within parent_refresh_ms.
    assert!(eventually(&there, &s3, DenyReason::AppPaused).await, "the other dispatcher honours the app pause");
    // Another app is not paused; the numbers' breakers saw no failure.
    assert!(matches!(first(&elsewhere, &s3, TrafficClass::Priority).await, Decision::Allow { .. }));
    let status = here.status(&s1).await.expect("status");
    assert_eq!((status.snapshot.calls_in_window, status.failures_in_window), (0, 0));
    let app = here.parent_status(&Parent::App("app-1".into())).await.expect("read");
    assert!(app.paused_until_unix_ms > 0 && !app.halted);
    assert_eq!(app.reason, "app paused");
    // An operator can lift it.
    here.clear_parent(&Parent::App("app-1".into())).await.expect("clear");
    assert!(matches!(first(&here, &s2, TrafficClass::Priority).await, Decision::Allow { .. }));
}

#[tokio::test]
async fn a_waba_rate_limit_pauses_every_number_of_that_waba_only() {
    let redis = bw_testkit::RedisServer::start();
    let here = default_breaker(&redis.url()).await;
    let there = default_breaker(&redis.url()).await;
    let (a1, a2, b1) = (in_waba("waba-a"), in_waba("waba-a"), in_waba("waba-b"));
    for code_scope in [RateScope::Waba] {
        let limit = OutcomeKind::RateLimited { scope: code_scope, pause_ms: code_scope.default_pause_ms() };
        here.record(&a1, &[outcome(limit)]).await;
    }
    let retry = denied(first(&here, &a2, TrafficClass::Priority).await, DenyReason::WabaPaused).expect("paused");
    assert!((50_000..=60_000).contains(&retry), "{retry}");
    assert!(eventually(&there, &a1, DenyReason::WabaPaused).await);
    assert!(matches!(first(&here, &b1, TrafficClass::Priority).await, Decision::Allow { .. }));
    assert!(matches!(first(&there, &b1, TrafficClass::Priority).await, Decision::Allow { .. }));
    assert_eq!(here.status(&a1).await.expect("status").snapshot.calls_in_window, 0);
}

#[tokio::test]
async fn credentials_halt_the_token_until_it_changes_or_an_operator_clears_it() {
    let redis = bw_testkit::RedisServer::start();
    let here = default_breaker(&redis.url()).await;
    let there = default_breaker(&redis.url()).await;
    here.set_account("app-1", "EAAG-secret-one");
    there.set_account("app-1", "EAAG-secret-one");
    let (s1, s2) = (in_waba("waba-a"), in_waba("waba-b"));
    let cfg = here.config().clone();
    let r = here.record(&s1, &[outcome(hold(PauseScope::Token, 190, PauseEnd::Lifted))]).await;
    assert_eq!(r.state, BreakerState::Closed, "credentials are not a health failure");
    // Every number on the token, in every dispatcher using it.
    for s in [&s1, &s2] {
        let retry = denied(first(&here, s, TrafficClass::Priority).await, DenyReason::TokenHalted).expect("halted");
        assert_eq!(retry, cfg.token_halt_retry_ms);
    }
    assert!(eventually(&there, &s2, DenyReason::TokenHalted).await);
    // The halt does not expire on its own (the key outlives any incident: days), and neither the token nor
    // anything of it but the fingerprint reaches Redis.
    let fp = bw_breaker::token_fingerprint("EAAG-secret-one");
    assert_eq!(fp.len(), 16);
    let mut conn = manager(&redis.url()).await;
    let ttl: i64 =
        redis::cmd("PTTL").arg(bw_breaker::scripts::token_halt_key(&fp)).query_async(&mut conn).await.expect("pttl");
    assert!(ttl > 6 * 86_400_000, "ttl {ttl}");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.expect("keys");
    assert!(keys.iter().all(|k| !k.contains("secret")), "{keys:?}");
    // The scope itself was not paused: a new token sends at once.
    here.set_account("app-1", "EAAG-secret-two");
    assert!(matches!(first(&here, &s1, TrafficClass::Priority).await, Decision::Allow { .. }));
    assert!(matches!(first(&here, &s2, TrafficClass::Priority).await, Decision::Allow { .. }));
    // The old token stays halted until an operator clears it.
    assert!(denied(first(&there, &s1, TrafficClass::Priority).await, DenyReason::TokenHalted).is_some());
    let status = here.parent_status(&Parent::Token(fp.clone())).await.expect("read");
    assert!(status.halted);
    assert_eq!((status.code, status.lift.as_str(), status.source.as_str()), (190, "new_token", "answer"));
    assert!(status.since_unix_ms > 0);
    here.clear_parent(&Parent::Token(fp)).await.expect("clear");
    let lifted = bw_testkit::wait_until(WAIT, || async {
        matches!(first(&there, &s1, TrafficClass::Priority).await, Decision::Allow { .. })
    })
    .await;
    assert!(lifted, "the operator's clear reaches the other dispatcher");
}

#[tokio::test]
async fn without_a_token_set_a_token_hold_pauses_only_the_number() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = default_breaker(&redis.url()).await;
    let (s, other) = (in_waba("waba-a"), in_waba("waba-a"));
    breaker.record(&s, &[outcome(hold(PauseScope::Token, 190, PauseEnd::Lifted))]).await;
    let retry = denied(first(&breaker, &s, TrafficClass::Priority).await, DenyReason::NumberPaused).expect("paused");
    assert_eq!(retry, breaker.config().token_halt_retry_ms);
    assert!(allowed(first(&breaker, &other, TrafficClass::Priority).await));
}

#[tokio::test]
async fn a_number_hold_pauses_that_number_alone_until_an_operator_lifts_it() {
    let redis = bw_testkit::RedisServer::start();
    let here = default_breaker(&redis.url()).await;
    let there = default_breaker(&redis.url()).await;
    here.set_account("app-1", "token-a");
    there.set_account("app-1", "token-a");
    let (s, same_waba, other_waba) = (in_waba("waba-a"), in_waba("waba-a"), in_waba("waba-b"));
    let r = here.record(&s, &[outcome(hold(PauseScope::PhoneNumber, 133010, PauseEnd::Lifted))]).await;
    assert_eq!(r.state, BreakerState::Closed, "a number hold is no health failure");
    // Read by the admission script itself: every dispatcher at once, not after a refresh.
    for b in [&here, &there] {
        let retry = denied(first(b, &s, TrafficClass::Priority).await, DenyReason::NumberPaused).expect("paused");
        assert_eq!(retry, here.config().token_halt_retry_ms);
        assert!(allowed(first(b, &same_waba, TrafficClass::Priority).await), "the WABA's other number sends");
        assert!(allowed(first(b, &other_waba, TrafficClass::Priority).await));
    }
    for parent in [Parent::Waba("waba-a".into()), Parent::App("app-1".into())] {
        assert!(!here.parent_status(&parent).await.expect("read").active(0), "{parent:?} not paused");
    }
    let token = Parent::Token(bw_breaker::token_fingerprint("token-a"));
    assert!(!here.parent_status(&token).await.expect("read").active(0), "the token is not halted");
    let snap = here.snapshot(&s).await.expect("snapshot");
    assert_eq!(snap.pauses.len(), 1, "{snap:?}");
    let p = &snap.pauses[0];
    assert_eq!((p.level.as_str(), p.code, p.until_unix_ms, p.lift.as_str()), ("number", 133010, 0, "operator"));
    assert!(here.snapshot(&same_waba).await.expect("snapshot").pauses.is_empty());
    here.clear_parent(&Parent::Number(s.clone())).await.expect("lift");
    assert!(allowed(first(&there, &s, TrafficClass::Priority).await), "lifted everywhere at once");
}

#[tokio::test]
async fn a_waba_hold_pauses_that_wabas_numbers_and_no_other() {
    let redis = bw_testkit::RedisServer::start();
    let here = default_breaker(&redis.url()).await;
    let there = default_breaker(&redis.url()).await;
    here.set_account("app-1", "token-a");
    there.set_account("app-1", "token-a");
    let (a1, a2, b1) = (in_waba("waba-a"), in_waba("waba-a"), in_waba("waba-b"));
    here.record(&a1, &[outcome(hold(PauseScope::Waba, 368, PauseEnd::Lifted))]).await;
    assert!(denied(first(&here, &a2, TrafficClass::Priority).await, DenyReason::WabaPaused).is_some());
    assert!(eventually(&there, &a1, DenyReason::WabaPaused).await);
    assert!(allowed(first(&here, &b1, TrafficClass::Priority).await));
    assert!(allowed(first(&there, &b1, TrafficClass::Priority).await));
    let status = here.parent_status(&Parent::Waba("waba-a".into())).await.expect("read");
    assert!(status.halted && status.code == 368 && status.lift == "operator", "{status:?}");
    let token = Parent::Token(bw_breaker::token_fingerprint("token-a"));
    assert!(!here.parent_status(&token).await.expect("read").active(0), "the token is not halted");
}

#[tokio::test]
async fn a_marketing_only_waba_pause_holds_marketing_and_its_replays_only() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = default_breaker(&redis.url()).await;
    breaker.set_account("app-1", "token-a");
    let s = in_waba("waba-m");
    let spec = PauseSpec {
        scope: PauseScope::Waba,
        code: 131063,
        end: PauseEnd::Lifted,
        marketing_only: true,
        source: PauseSource::Answer,
    };
    breaker.record(&s, &[outcome(OutcomeKind::Pause(spec))]).await;
    let classes = [TrafficClass::Marketing, TrafficClass::Priority, TrafficClass::Replay, TrafficClass::OlderPriority];
    let items: Vec<AdmitItem> = classes.iter().enumerate().map(|(i, c)| one(&format!("m{i}"), *c)).collect();
    let a = breaker.admit(&s, &items).await;
    assert!(denied(a.decisions[0], DenyReason::WabaPaused).is_some(), "{:?}", a.decisions);
    assert!(allowed(a.decisions[1]), "{:?}", a.decisions);
    assert!(denied(a.decisions[2], DenyReason::WabaPaused).is_some(), "{:?}", a.decisions);
    assert!(allowed(a.decisions[3]), "{:?}", a.decisions);
}

#[tokio::test]
async fn a_probing_pause_lets_one_send_through_after_it_and_doubles_on_a_repeat() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = default_breaker(&redis.url()).await;
    let s = scope();
    // A bodiless 401 / 403: the number pauses briefly, never the token.
    breaker.record(&s, &[outcome(hold(PauseScope::PhoneNumber, 0, PauseEnd::Probe(300)))]).await;
    assert!(denied(first(&breaker, &s, TrafficClass::Priority).await, DenyReason::NumberPaused).is_some());
    let mut conn = manager(&redis.url()).await;
    let key = bw_breaker::scripts::number_pause_key(&s);
    // The answers of sends already in flight do not compound it.
    breaker.record(&s, &[outcome(hold(PauseScope::PhoneNumber, 0, PauseEnd::Probe(300)))]).await;
    let length: u64 = redis::cmd("HGET").arg(&key).arg("n").query_async(&mut conn).await.expect("length");
    assert_eq!(length, 300, "not doubled while the pause runs");
    // After the pause, one send goes as the probe; the others wait for its answer.
    let probed = bw_testkit::wait_until(WAIT, || async {
        let a = breaker.admit(&s, &[one("p1", TrafficClass::Priority), one("p2", TrafficClass::Priority)]).await;
        allowed(a.decisions[0]) && denied(a.decisions[1], DenyReason::NumberPaused).is_some()
    })
    .await;
    assert!(probed, "one probe after the pause");
    assert!(denied(first(&breaker, &s, TrafficClass::Priority).await, DenyReason::NumberPaused).is_some());
    // The probe was refused again: twice as long.
    breaker.record(&s, &[outcome(hold(PauseScope::PhoneNumber, 0, PauseEnd::Probe(300)))]).await;
    let status = breaker.parent_status(&Parent::Number(s.clone())).await.expect("read");
    assert_eq!(status.lift, "probe");
    let length: u64 = redis::cmd("HGET").arg(&key).arg("n").query_async(&mut conn).await.expect("length");
    assert_eq!(length, 600, "doubled");
}

#[tokio::test]
async fn pauses_never_shorten_and_a_timed_pause_leaves_a_hold_in_place() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = default_breaker(&redis.url()).await;
    let s = scope();
    breaker.record(&s, &[outcome(hold(PauseScope::PhoneNumber, 133015, PauseEnd::For(300_000)))]).await;
    breaker.record(&s, &[outcome(hold(PauseScope::PhoneNumber, 131057, PauseEnd::For(60_000)))]).await;
    let retry = denied(first(&breaker, &s, TrafficClass::Priority).await, DenyReason::NumberPaused).expect("paused");
    assert!(retry > 240_000, "the longer pause stays: {retry}");
    breaker.record(&s, &[outcome(hold(PauseScope::PhoneNumber, 133010, PauseEnd::Lifted))]).await;
    breaker.record(&s, &[outcome(hold(PauseScope::PhoneNumber, 131057, PauseEnd::For(60_000)))]).await;
    let status = breaker.parent_status(&Parent::Number(s.clone())).await.expect("read");
    assert!(status.halted, "{status:?}");
    assert_eq!(status.code, 133010);
    // An operator's pause records its source.
    let w = Parent::Waba(s.waba_id.clone());
    let spec = PauseSpec {
        scope: PauseScope::Waba,
        code: 0,
        end: PauseEnd::For(60_000),
        marketing_only: false,
        source: PauseSource::Operator,
    };
    let status = breaker.pause(&w, spec).await.expect("pause");
    assert_eq!((status.source.as_str(), status.lift.as_str()), ("operator", "time"));
}

#[tokio::test]
async fn a_spam_restriction_pauses_the_number_for_minutes_with_its_own_reason_and_never_trips() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = default_breaker(&redis.url()).await;
    let (s, other) = (in_waba("waba-a"), in_waba("waba-a"));
    let spam = OutcomeKind::RateLimited { scope: RateScope::Spam, pause_ms: RateScope::Spam.default_pause_ms() };
    let r = breaker.record(&s, &vec![outcome(spam); 100]).await;
    assert_eq!(r.state, BreakerState::Closed);
    let retry = denied(first(&breaker, &s, TrafficClass::Priority).await, DenyReason::SpamPaused).expect("spam");
    assert!((9 * 60_000..=10 * 60_000).contains(&retry), "{retry}");
    let snap = breaker.snapshot(&s).await.expect("read");
    assert_eq!(snap.pause_reason, "spam restriction (131048)");
    assert_eq!(snap.calls_in_window, 0);
    assert!(matches!(first(&breaker, &other, TrafficClass::Priority).await, Decision::Allow { .. }));
}

#[tokio::test]
async fn a_registration_limit_pauses_the_number_with_its_own_reason() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = default_breaker(&redis.url()).await;
    let s = scope();
    breaker.record(&s, &[outcome(hold(PauseScope::PhoneNumber, 133016, PauseEnd::Probe(3_600_000)))]).await;
    let retry = denied(first(&breaker, &s, TrafficClass::Priority).await, DenyReason::NumberPaused).expect("paused");
    assert!(retry > 3_500_000, "{retry}");
    let status = breaker.status(&s).await.expect("status");
    assert_eq!(status.snapshot.calls_in_window, 0);
    assert_eq!(status.snapshot.pauses[0].reason, "number paused: Meta code 133016");
}

#[tokio::test]
async fn a_131049_defers_marketing_to_that_recipient_for_a_day_and_is_no_sender_failure() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = default_breaker(&redis.url()).await;
    let s = scope();
    let deferred: Vec<OutcomeItem> = (0..100)
        .map(|i| OutcomeItem {
            recipient_key: format!("r{i}"),
            kind: OutcomeKind::RateLimited { scope: RateScope::Recipient, pause_ms: 0 },
            canary: false,
        })
        .collect();
    let r = breaker.record(&s, &deferred).await;
    assert_eq!(r.state, BreakerState::Closed);
    assert_eq!(breaker.status(&s).await.expect("status").snapshot.calls_in_window, 0);
    let a = breaker
        .admit(
            &s,
            &[
                one("r0", TrafficClass::Marketing),
                one("r0", TrafficClass::Priority),
                one("fresh", TrafficClass::Marketing),
            ],
        )
        .await;
    let retry = denied(a.decisions[0], DenyReason::RecipientDeferred).expect("marketing deferred");
    assert!(retry > 86_400_000 - 60_000, "{retry}");
    assert!(matches!(a.decisions[1], Decision::Allow { .. }), "priority to that recipient is not deferred: {a:?}");
    assert!(matches!(a.decisions[2], Decision::Allow { .. }), "other recipients are not deferred: {a:?}");
}
