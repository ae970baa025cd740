//! Rate limits enforced by admit_send.lua: sender bucket with a priority reserve, replay headroom, pair GCRA,
//! usage throttle, pauses.

use crate::support::*;
use bw_breaker::{AdmitItem, Decision, DenyReason, OutcomeKind, ScopeLimits, TrafficClass};

fn allowed(decisions: &[Decision]) -> usize {
    decisions.iter().filter(|d| matches!(d, Decision::Allow { .. })).count()
}

fn reasons(decisions: &[Decision]) -> Vec<Option<DenyReason>> {
    decisions
        .iter()
        .map(|d| match d {
            Decision::Allow { .. } => None,
            Decision::Deny { reason, .. } => Some(*reason),
        })
        .collect()
}

/// Near-zero refill so bucket arithmetic is exact within a test.
fn slow_bucket(burst: f64) -> ScopeLimits {
    ScopeLimits { rate_per_s: 0.001, burst, reserve_fraction: 0.25, replay_headroom: 2.0, ..limits() }
}

#[tokio::test]
async fn marketing_cannot_take_the_reserve_and_replay_leaves_a_headroom() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), slow_bucket(20.0)).await;
    // Reserve = 5 tokens. Replay needs reserve + 2 + 1 = 8: it takes 20 -> 7, 13 sends.
    let scope = scope();
    let a = breaker.admit(&scope, &items(20, TrafficClass::Replay)).await;
    assert_eq!(allowed(&a.decisions), 13);
    assert_eq!(reasons(&a.decisions)[13], Some(DenyReason::Reserve));
    // Marketing needs 6: takes 7 -> 5, 2 sends.
    let a = breaker.admit(&scope, &items(10, TrafficClass::Marketing)).await;
    assert_eq!(allowed(&a.decisions), 2);
    // Priority takes the reserve down to 0, then gets SenderRate with a retry-after.
    let a = breaker.admit(&scope, &items(10, TrafficClass::Priority)).await;
    assert_eq!(allowed(&a.decisions), 5);
    match a.decisions[5] {
        Decision::Deny { reason: DenyReason::SenderRate, retry_after_ms } => assert!(retry_after_ms > 100_000),
        other => panic!("expected sender rate, got {other:?}"),
    }
}

#[tokio::test]
async fn a_batch_mixing_classes_keeps_every_limit() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), slow_bucket(8.0)).await;
    let scope = scope();
    // Reserve 2: marketing needs 3, priority 1. Marketing first in the batch cannot starve the priority ones.
    let mut batch = items(10, TrafficClass::Marketing);
    batch.extend((0..4).map(|i| AdmitItem { recipient_key: format!("p{i}"), class: TrafficClass::Priority }));
    let a = breaker.admit(&scope, &batch).await;
    assert_eq!(allowed(&a.decisions[..10]), 6);
    assert_eq!(allowed(&a.decisions[10..]), 2);
}

#[tokio::test]
async fn pair_rate_allows_the_burst_then_one_per_interval() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits { pair_interval_ms: 6_000, pair_burst: 2, ..slow_bucket(1000.0) };
    let breaker = breaker(&redis.url(), limits).await;
    let scope = scope();
    let same = vec![AdmitItem { recipient_key: "same".into(), class: TrafficClass::Priority }; 4];
    let a = breaker.admit(&scope, &same).await;
    assert_eq!(reasons(&a.decisions), vec![None, None, Some(DenyReason::PairRate), Some(DenyReason::PairRate)]);
    match a.decisions[2] {
        Decision::Deny { retry_after_ms, .. } => assert!((5_000..=6_000).contains(&retry_after_ms), "{retry_after_ms}"),
        _ => unreachable!(),
    }
    // Other recipients are not affected, and a denied pair takes no sender token.
    let status = breaker.status(&scope).await.expect("status");
    assert!((status.tokens - 998.0).abs() < 0.01, "{}", status.tokens);
    let a = breaker.admit(&scope, &items(3, TrafficClass::Marketing)).await;
    assert_eq!(allowed(&a.decisions), 3);
}

#[tokio::test]
async fn usage_levels_slow_then_pause_low_priority_only() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits { rate_per_s: 10.0, burst: 10.0, throttle_slow_factor: 0.5, ..limits() };
    let breaker = breaker(&redis.url(), limits).await;
    let scope = scope();
    breaker.observe_usage(&scope, 85).await;
    // Slowed: low priority is paced at 5/s with no burst, so one of a batch passes; priority is untouched.
    let a = breaker.admit(&scope, &items(4, TrafficClass::Marketing)).await;
    assert_eq!(reasons(&a.decisions)[..2], [None, Some(DenyReason::Throttled)]);
    let a = breaker.admit(&scope, &items(3, TrafficClass::Priority)).await;
    assert_eq!(allowed(&a.decisions), 3);
    breaker.observe_usage(&scope, 95).await;
    let a = breaker.admit(&scope, &items(2, TrafficClass::Replay)).await;
    match a.decisions[0] {
        Decision::Deny { reason: DenyReason::Throttled, retry_after_ms } => assert_eq!(retry_after_ms, 5_000),
        other => panic!("expected throttled, got {other:?}"),
    }
    let a = breaker.admit(&scope, &items(1, TrafficClass::Priority)).await;
    assert_eq!(allowed(&a.decisions), 1);
    breaker.observe_usage(&scope, 10).await;
    let a = breaker.admit(&scope, &items(1, TrafficClass::Marketing)).await;
    assert_eq!(allowed(&a.decisions), 1);
}

#[tokio::test]
async fn a_number_hold_pauses_every_class_of_the_number() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), limits()).await;
    let scope = scope();
    let hold = bw_breaker::PauseSpec {
        scope: bw_common::classify::PauseScope::PhoneNumber,
        code: 131045,
        end: bw_breaker::PauseEnd::For(300_000),
        marketing_only: false,
        source: bw_breaker::PauseSource::Answer,
    };
    breaker.record(&scope, &outcomes(1, OutcomeKind::Pause(hold), false)).await;
    for class in [TrafficClass::Priority, TrafficClass::OlderPriority, TrafficClass::Marketing, TrafficClass::Replay] {
        let a = breaker.admit(&scope, &items(1, class)).await;
        assert!(
            matches!(a.decisions[0], Decision::Deny { reason: DenyReason::NumberPaused, retry_after_ms } if retry_after_ms > 290_000),
            "{class:?}: {:?}",
            a.decisions
        );
    }
    let snap = breaker.snapshot(&scope).await.expect("read");
    assert_eq!(snap.pauses.len(), 1);
    let p = &snap.pauses[0];
    assert_eq!((p.level.as_str(), p.code, p.lift.as_str(), p.source.as_str()), ("number", 131045, "time", "answer"));
    assert!(p.until_unix_ms > snap.updated_at_unix_ms && p.since_unix_ms <= snap.updated_at_unix_ms, "{p:?}");
    assert_eq!(snap.paused_until_unix_ms, 0, "the breaker's own (rate-limit) pause is another thing");
}

#[tokio::test]
async fn refusals_for_tokens_queue_up_one_slot_each() {
    let redis = bw_testkit::RedisServer::start();
    let breaker =
        breaker(&redis.url(), ScopeLimits { rate_per_s: 100.0, burst: 4.0, reserve_fraction: 0.0, ..limits() }).await;
    let scope = scope();
    let a = breaker.admit(&scope, &items(8, TrafficClass::Priority)).await;
    assert_eq!(allowed(&a.decisions), 4);
    let waits: Vec<u64> = a.decisions[4..]
        .iter()
        .map(|d| match d {
            Decision::Deny { reason: DenyReason::SenderRate, retry_after_ms } => *retry_after_ms,
            other => panic!("expected sender rate, got {other:?}"),
        })
        .collect();
    // At 100/s a token takes 10 ms: the n-th refusal waits for n tokens (less what refilled meanwhile).
    for (n, wait) in waits.iter().enumerate() {
        let full = 10 * (n as u64 + 1);
        assert!(*wait <= full && *wait + 3 >= full, "refusal {n} waits {wait} ms, expected about {full}");
    }
}

/// The waits of one call's refusals for sender tokens. Messages admitted before them (a token that came while
/// the test ran) are skipped; any other decision fails the test.
fn token_waits(decisions: &[Decision]) -> Vec<u64> {
    decisions
        .iter()
        .skip_while(|d| matches!(d, Decision::Allow { .. }))
        .map(|d| match d {
            Decision::Deny { reason: DenyReason::SenderRate | DenyReason::Reserve, retry_after_ms } => *retry_after_ms,
            other => panic!("expected a refusal for sender tokens, got {other:?}"),
        })
        .collect()
}

/// At the compiled defaults (74 msg/s): the refusals of several dispatchers form one waiting line per class, so
/// a second dispatcher's refused messages come back after the first's, one slot spacing each, instead of all
/// for the same next token (which at saturation cost 35 refusals per admitted message).
#[tokio::test]
async fn refusals_for_tokens_of_every_dispatcher_form_one_waiting_line() {
    let redis = bw_testkit::RedisServer::start();
    let a = breaker(&redis.url(), ScopeLimits::default()).await;
    let b = breaker(&redis.url(), ScopeLimits::default()).await;
    let scope = scope();
    let burst = ScopeLimits::default().burst as usize;
    let gap = 1000.0 / ScopeLimits::default().rate_per_s;
    // Dispatcher a empties the bucket and has 8 refused; b then has its 8 refused too (but for a token that
    // came meanwhile).
    // The time between the two scripts' clock readings is at most the time from before a's call to after b's
    // (a's answer travelling back included, which a clock started between the calls would miss).
    let before_a = std::time::Instant::now();
    let first = a.admit(&scope, &items(burst + 8, TrafficClass::Priority)).await;
    assert!(allowed(&first.decisions) >= burst);
    let first = token_waits(&first.decisions);
    let second = token_waits(&b.admit(&scope, &items(8, TrafficClass::Priority)).await.decisions);
    let elapsed = before_a.elapsed().as_secs_f64() * 1000.0;
    assert!(first.len() >= 6 && second.len() >= 6, "refused: a {first:?}, b {second:?}");
    // b's first refusal comes back after a's last one (less the time between the two calls), and each wait
    // is one slot spacing after the one before it. The scripts work in whole milliseconds: the clock reading
    // (floored), the stored end of the line (floored) and the returned wait (floored) cost at most 2 ms together.
    let last_of_a = *first.last().expect("a refusal");
    assert!(
        second[0] as f64 + elapsed + 2.0 >= last_of_a as f64 + gap,
        "b's refusals {second:?} do not come after a's {first:?} ({elapsed:.2} ms from a's call to b's answer)"
    );
    for waits in [&first, &second] {
        for pair in waits.windows(2) {
            let step = pair[1] as f64 - pair[0] as f64;
            assert!((step - gap).abs() <= 1.5, "waits {waits:?} are not one slot spacing ({gap:.1} ms) apart");
        }
    }
    // The lines are per class: a marketing refusal does not queue behind the priority ones.
    let m = b.admit(&scope, &items(1, TrafficClass::Marketing)).await;
    let m = token_waits(&m.decisions);
    assert!(m[0] < second[0], "marketing's wait {m:?} queued behind priority's {second:?}");
}

#[tokio::test]
async fn a_stale_usage_report_fades_and_stops_throttling() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), ScopeLimits { usage_ttl_ms: 1_000, ..limits() }).await;
    let scope = scope();
    breaker.observe_usage(&scope, 95).await;
    let a = breaker.admit(&scope, &items(1, TrafficClass::Marketing)).await;
    assert_eq!(reasons(&a.decisions), [Some(DenyReason::Throttled)]);
    // No fresher report comes (nothing low priority is sent): the reading fades below the pause band (90 %)
    // after about 60 ms of the 1 s ttl, and marketing flows again (slowed) without a new report.
    let resumed = bw_testkit::wait_until(std::time::Duration::from_secs(2), || async {
        allowed(&breaker.admit(&scope, &items(1, TrafficClass::Marketing)).await.decisions) == 1
    })
    .await;
    assert!(resumed, "a stale report kept throttling marketing");
    let faded = bw_testkit::wait_until(std::time::Duration::from_secs(2), || async {
        breaker.tick(&scope).await.expect("tick").0.usage_percent == 0
    })
    .await;
    assert!(faded, "the reading fades to nothing over its ttl");
}

#[tokio::test]
async fn a_usage_reading_is_trusted_for_meta_s_hourly_window_at_the_default_config() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), ScopeLimits::default()).await;
    let scope = scope();
    breaker.observe_usage(&scope, 95).await;
    let at = breaker.status(&scope).await.expect("status").snapshot.updated_at_unix_ms;
    // Seconds later (Redis time) the reading has hardly faded: marketing stays paused, priority flows.
    let later = bw_testkit::wait_until(std::time::Duration::from_secs(10), || async {
        breaker.status(&scope).await.is_ok_and(|s| s.snapshot.updated_at_unix_ms >= at + 2_000)
    })
    .await;
    assert!(later);
    let status = breaker.status(&scope).await.expect("status");
    assert!(status.usage_percent >= 94, "{}", status.usage_percent);
    assert_eq!(
        reasons(&breaker.admit(&scope, &items(1, TrafficClass::Marketing)).await.decisions),
        [Some(DenyReason::Throttled)]
    );
    assert_eq!(allowed(&breaker.admit(&scope, &items(1, TrafficClass::Priority)).await.decisions), 1);
}

#[tokio::test]
async fn without_usage_headers_the_scope_is_quota_blind_and_conservative() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    let breaker = breaker(&redis.url(), limits.clone()).await;
    let registry = bw_common::admin::new_registry();
    breaker.register_metrics(&registry);
    let (blind, seen) = (scope(), scope());
    assert_eq!(breaker.status(&blind).await.expect("status").quota_visibility, bw_breaker::QuotaVisibility::Unknown);
    breaker.observe_no_usage(&blind).await;
    breaker.observe_usage(&seen, 30).await;
    assert_eq!(breaker.status(&blind).await.expect("status").quota_visibility, bw_breaker::QuotaVisibility::Blind);
    assert_eq!(breaker.status(&seen).await.expect("status").quota_visibility, bw_breaker::QuotaVisibility::Seen);
    // Blind: the bucket (and the rate) is blind_rate_factor of the configured one.
    let want = (limits.burst * limits.blind_rate_factor).floor() as usize;
    assert_eq!(allowed(&breaker.admit(&blind, &items(20, TrafficClass::Priority)).await.decisions), want);
    assert_eq!(
        allowed(&breaker.admit(&seen, &items(20, TrafficClass::Priority)).await.decisions),
        limits.burst as usize
    );
    // The gauge says so per scope.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry.lock().expect("registry")).expect("encode");
    assert!(text.contains(&format!("bw_breaker_quota_visibility{{scope=\"{}\"}} 0", blind.index_member())), "{text}");
    assert!(text.contains(&format!("bw_breaker_quota_visibility{{scope=\"{}\"}} 1", seen.index_member())), "{text}");
    // An answer with headers ends it.
    breaker.observe_usage(&blind, 10).await;
    assert_eq!(breaker.status(&blind).await.expect("status").quota_visibility, bw_breaker::QuotaVisibility::Seen);
}

/// A usage reading trusted for Meta's hourly window pauses marketing and replay, and only Meta's answers
/// refresh it. At the default config, once the reading is older than `throttle_retry_ms`, one low-priority
/// message per `throttle_retry_ms` goes as a probe (its answer refreshes the reading); the others stay paused.
#[tokio::test]
async fn a_paused_usage_reading_lets_one_probe_through_per_retry_interval() {
    let redis = bw_testkit::RedisServer::start();
    let breaker = breaker(&redis.url(), ScopeLimits::default()).await;
    let scope = scope();
    breaker.observe_usage(&scope, 95).await;
    assert_eq!(
        reasons(&breaker.admit(&scope, &items(1, TrafficClass::Replay)).await.decisions),
        [Some(DenyReason::Throttled)],
        "a fresh reading pauses replay"
    );
    let probed = bw_testkit::wait_until(std::time::Duration::from_secs(20), || async {
        allowed(&breaker.admit(&scope, &items(1, TrafficClass::Replay)).await.decisions) == 1
    })
    .await;
    assert!(probed, "no probe once the reading was older than throttle_retry_ms");
    assert_eq!(
        reasons(&breaker.admit(&scope, &items(2, TrafficClass::Marketing)).await.decisions),
        [Some(DenyReason::Throttled), Some(DenyReason::Throttled)],
        "one probe per interval, not a flood"
    );
    // The probe's answer brings a fresh, low reading: marketing flows again.
    breaker.observe_usage(&scope, 10).await;
    assert_eq!(allowed(&breaker.admit(&scope, &items(1, TrafficClass::Marketing)).await.decisions), 1);
}

/// Older priority first, fleet-wide, at the compiled defaults: two dispatchers ask for one sender's tokens as
/// fast as their retry-afters allow, one for live priority messages, the other for dead-lettered priority
/// messages being replayed (`TrafficClass::OlderPriority`). While a replay waits for tokens, live priority takes
/// only a full bucket, so the replays get nearly all of the sender's rate whichever process asks first (without
/// the rule the two split it about evenly). When no replay waits any more, live priority has the whole rate.
#[tokio::test]
async fn priority_replays_take_the_sender_rate_before_live_priority_fleet_wide() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let redis = bw_testkit::RedisServer::start();
    let live = breaker(&redis.url(), ScopeLimits::default()).await;
    let older = breaker(&redis.url(), ScopeLimits::default()).await;
    let scope = scope();
    // Both start from an empty bucket.
    live.admit(&scope, &items(ScopeLimits::default().burst as usize, TrafficClass::Priority)).await;
    const TOTAL: usize = 150;
    let admitted = Arc::new(AtomicUsize::new(0));
    let pump = |b: bw_breaker::Breaker, class: TrafficClass| {
        let (scope, admitted) = (scope.clone(), admitted.clone());
        async move {
            let mut mine = 0;
            let mut i = 0;
            while admitted.load(Ordering::SeqCst) < TOTAL {
                i += 1;
                let item = AdmitItem { recipient_key: format!("{class:?}-{i}"), class };
                match b.admit(&scope, &[item]).await.decisions.first() {
                    Some(Decision::Allow { .. }) => {
                        mine += 1;
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                    Some(Decision::Deny { retry_after_ms, .. }) => {
                        tokio::time::sleep(std::time::Duration::from_millis((*retry_after_ms).clamp(1, 200))).await
                    }
                    None => panic!("no decision"),
                }
            }
            mine
        }
    };
    let (live_n, older_n) =
        tokio::join!(pump(live.clone(), TrafficClass::Priority), pump(older.clone(), TrafficClass::OlderPriority));
    println!("admitted: {older_n} priority replays, {live_n} live priority");
    assert!(older_n >= 4 * live_n, "replays {older_n}, live {live_n}: the replays must get the sender's rate first");
    // Once no replay has waited for OLDER_PRIORITY_WAIT_MS (1.5 s), live priority takes the whole bucket again:
    // two live messages in one call both pass (while the rule holds, the second needs a full bucket again).
    let ok = bw_testkit::wait_until(std::time::Duration::from_secs(10), || async {
        allowed(&live.admit(&scope, &items(2, TrafficClass::Priority)).await.decisions) == 2
    })
    .await;
    assert!(ok, "live priority never had the whole bucket back");
}
