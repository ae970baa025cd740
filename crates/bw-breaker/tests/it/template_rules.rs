//! Template category and quality (`lua/template_rules.lua`) on a real redis-server.

use crate::support::*;
use bw_breaker::template_rules::TemplateRules;
use bw_breaker::templates::ScopeKey;

#[tokio::test]
async fn a_red_template_takes_one_slot_per_pace_and_recovers_with_its_rating() {
    let redis = bw_testkit::RedisServer::start();
    let rules = TemplateRules::new(bw_breaker::RedisConn::Single(manager(&redis.url()).await));
    let key = ScopeKey::Template { waba_id: "100".into(), language: "en_US".into(), name: "promo".into() };
    assert_eq!(rules.take(&key).await.expect("take"), 0, "unknown quality: not paced");
    let r = rules.set_quality(&key, "RED", 6).await.expect("set");
    assert!(r.is_red());
    assert_eq!(rules.take(&key).await.expect("take"), 0, "the first send goes");
    // 6 per minute: the next one waits up to 10 s (no burst), whatever the machine's speed.
    let wait = rules.take(&key).await.expect("take");
    assert!(wait > 0 && wait <= 10_000, "{wait}");
    let next = rules.take(&key).await.expect("take");
    assert!(next > wait && next <= 20_000, "the next refusal comes back one interval later: {wait} then {next}");
    rules.set_quality(&key, "YELLOW", 6).await.expect("set");
    assert_eq!(rules.take(&key).await.expect("take"), 0, "recovered: not paced");

    let moved = rules.set_category(&key, "MARKETING").await.expect("set");
    assert!(moved.is_marketing());
    assert_eq!(rules.read_cached(&key).await.expect("read").category, "MARKETING");
}
