//! `bwctl throughput` and `bwctl template-pace` (issue #36) against real nats-server and redis-server: a number's
//! stated throughput and a template's RED pace are shown (also under `bwctl scopes`) and cleared with an audit
//! entry before and after; clearing the throughput makes the breaker admit at the configured rate again, and
//! clearing the pace stops the pacing while Meta's quality stays recorded.

use crate::{PHONE, bwctl, set_scope, setup};
use bw_breaker::template_rules::TemplateRules;
use bw_breaker::templates::ScopeKey;
use bw_breaker::throughput::{Throughput, UPGRADED_MPS};
use bw_breaker::{AdmitItem, Breaker, BreakerConfig, RedisConn, Scope, ScopeLimits, TrafficClass};
use bw_proto::v1::BreakerState;
use std::time::Duration;

/// bwctl with `--redis-url url`.
async fn with_redis(nats: &bw_testkit::NatsServer, url: &str, args: &[&str]) -> (i32, String) {
    let argv: Vec<&str> = ["--redis-url", url].into_iter().chain(args.iter().copied()).collect();
    bwctl(nats, &argv).await
}

async fn slot_gap_ms(breaker: &Breaker, scope: &Scope) -> f64 {
    let item = AdmitItem { recipient_key: "r1".into(), class: TrafficClass::Priority };
    let admission = breaker.admit(scope, &[item]).await;
    assert!(!admission.degraded, "Redis answered");
    admission.slot_gap_ms
}

#[tokio::test]
async fn the_stated_throughput_and_a_red_pace_are_shown_and_cleared_with_an_audit() {
    let (nats, deps) = setup().await;
    let redis = bw_testkit::RedisServer::start();
    let url = redis.url();
    set_scope(&deps, BreakerState::Closed).await;
    let manager = bw_common::redis_conn::connect(&url, Duration::from_millis(500), Duration::from_secs(5))
        .await
        .expect("redis connects");
    // The compiled defaults, as a dispatcher runs them: 74 messages per second.
    let limits = ScopeLimits::default();
    let cfg = BreakerConfig { defaults: limits.clone(), ..BreakerConfig::default() };
    let breaker = Breaker::new(Some(manager.clone()), None, cfg);
    let scope = Scope::new("9", PHONE);
    let tput = Throughput::new(RedisConn::Single(manager.clone()), Duration::from_millis(500), &limits);
    tput.set_limit(&scope, UPGRADED_MPS, "THROUGHPUT_UPGRADE").await.expect("stated");
    let upgraded = slot_gap_ms(&breaker, &scope).await;
    assert!((upgraded - 1000.0 / 925.0).abs() < 0.01, "925/s while stated: {upgraded}");

    let (code, out) = with_redis(&nats, &url, &["throughput", "show", "--phone", PHONE]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1001 (WABA 9): 1000 messages/s (THROUGHPUT_UPGRADE at 20"), "{out}");

    let key = ScopeKey::parse("tpl:9:en_US:spring_sale").expect("key");
    let rules = TemplateRules::new(RedisConn::Single(manager.clone()));
    rules.set_category(&key, "MARKETING").await.expect("category");
    rules.set_quality(&key, "RED", 6).await.expect("quality");
    let (code, out) =
        with_redis(&nats, &url, &["template-pace", "show", "--template", "tpl:9:en_US:spring_sale"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("quality RED, category MARKETING: marketing paced at 6 sends/min"), "{out}");

    let (code, out) = with_redis(&nats, &url, &["scopes"]).await;
    assert_eq!(code, 0, "{out}");
    let row =
        |needle: &str| out.lines().find(|l| l.starts_with(needle)).map(|l| l.split_whitespace().collect::<Vec<_>>());
    assert!(out.contains("STATED-MPS") && out.contains("PACE-PER-MIN"), "{out}");
    assert_eq!(row("1001 ").map(|r| r.len() > 2), Some(true), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("1001") && l.contains("1000") && l.contains("THROUGHPUT_UPGRADE")),
        "{out}"
    );
    assert_eq!(
        row("tpl:9:en_US:spring_sale").as_deref(),
        Some(&["tpl:9:en_US:spring_sale", "RED", "MARKETING", "6"][..])
    );

    let (code, out) = with_redis(
        &nats,
        &url,
        &["throughput", "clear", "--phone", PHONE, "--reason", "INC-7 upgrade revoked", "--yes"],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("cleared: 1001: none stated: the configured throughput_mps, else rate_per_s, applies"),
        "{out}"
    );
    assert_eq!(tput.read(&scope).await.expect("read").mps, 0);
    let configured = slot_gap_ms(&breaker, &scope).await;
    assert!((configured - 1000.0 / 74.0).abs() < 0.01, "the configured 74/s again: {configured}");

    let args =
        ["template-pace", "clear", "--template", "tpl:9:en_US:spring_sale", "--reason", "rating recovered", "--yes"];
    let (code, out) = with_redis(&nats, &url, &args).await;
    assert_eq!(code, 0, "{out}");
    let after = rules.read(&key).await.expect("rules");
    assert!(!after.is_red(), "no longer paced: {after:?}");
    assert_eq!((after.quality.as_str(), after.category.as_str()), ("RED", "MARKETING"), "Meta's word stays");
    assert_eq!(rules.take(&key).await.expect("take"), 0, "a send may go now");
    let (_, again) = with_redis(&nats, &url, &args).await;
    assert!(again.contains("nothing to clear"), "{again}");

    let audit = bw_ops::audit::read_all(&deps.js).await.expect("audit");
    let trail: Vec<(&str, &str)> = audit.iter().map(|e| (e.action.as_str(), e.outcome.as_str())).collect();
    assert_eq!(
        trail,
        [
            ("throughput_clear", "requested"),
            ("throughput_clear", "done"),
            ("template_pace_clear", "requested"),
            ("template_pace_clear", "done")
        ]
    );
    assert_eq!(audit[1].scope.get("phone_number_id").map(String::as_str), Some(PHONE));
    assert!(audit[1].detail.contains("was 1000 messages/s"), "{:?}", audit[1]);
    assert!(audit[3].detail.contains("rating recovered; was 6 sends/min"), "{:?}", audit[3]);
    assert!(audit.iter().all(|e| e.who.starts_with("bwctl:") && e.role == "operator"));
}

#[tokio::test]
async fn bad_arguments_get_precise_refusals() {
    let (nats, _deps) = setup().await;
    let redis = bw_testkit::RedisServer::start();
    let url = redis.url();
    let (code, out) = with_redis(&nats, &url, &["throughput", "show", "--phone", "+5491155550000"]).await;
    assert_eq!((code, out.trim()), (1, "--phone is a phone_number_id (digits)"));
    let (code, out) = with_redis(&nats, &url, &["throughput", "show", "--phone", "4242"]).await;
    assert_eq!(code, 1);
    assert!(out.contains("no BW_SCOPES snapshot names the WABA of 4242: give it with --waba"), "{out}");
    let (code, out) =
        with_redis(&nats, &url, &["throughput", "clear", "--phone", "4242", "--waba", "9", "--reason", "x", "--yes"])
            .await;
    assert_eq!(code, 0);
    assert!(out.contains("nothing to clear"), "{out}");
    let (code, out) = with_redis(&nats, &url, &["template-pace", "show", "--template", "code:131049"]).await;
    assert_eq!((code, out.trim()), (1, "--template is a template's scope key, `tpl:<waba_id>:<language>:<name>`"));
    let (code, out) = with_redis(&nats, &url, &["template-pace", "show", "--template", "nonsense"]).await;
    assert_eq!(code, 1);
    assert!(out.contains("a scope key is"), "{out}");
}
