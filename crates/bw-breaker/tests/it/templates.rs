//! lua/template_holds.lua against a real redis-server: holds of quarantine scopes.

use crate::support::manager;
use bw_breaker::RedisConn;
use bw_breaker::templates::{ScopeKey, TemplateHolds};

fn key(name: &str) -> ScopeKey {
    ScopeKey::Template { waba_id: "100".into(), language: "en_US".into(), name: name.into() }
}

async fn holds() -> (bw_testkit::RedisServer, TemplateHolds, redis::aio::ConnectionManager) {
    let redis = bw_testkit::RedisServer::start();
    let conn = manager(&redis.url()).await;
    (redis, TemplateHolds::new(RedisConn::Single(conn.clone())), conn)
}

async fn pttl(conn: &mut redis::aio::ConnectionManager, key: &ScopeKey) -> i64 {
    redis::cmd("PTTL").arg(key.hold_key()).query_async(conn).await.expect("pttl")
}

#[tokio::test]
async fn a_timed_hold_lapses_and_an_untimed_one_waits_for_release() {
    let (_redis, holds, mut conn) = holds().await;
    let (paused, disabled) = (key("promo_paused"), key("promo_disabled"));
    assert_eq!(holds.read(&paused).await.expect("read"), None, "nothing held at first");

    // 132015: three hours, then it lapses by itself (the key expires with it).
    let hold = holds.hold(&paused, 132015, 3 * 3_600_000).await.expect("hold");
    assert_eq!(hold.code, 132015);
    assert!(hold.until_ms > hold.since_ms, "a timed hold has an end");
    let ttl = pttl(&mut conn, &paused).await;
    assert!(ttl > 3 * 3_600_000 - 60_000 && ttl <= 3 * 3_600_000, "the key lives as long as the hold: {ttl}");

    // 132016: held until released; no expiry.
    let hold = holds.hold(&disabled, 132016, 0).await.expect("hold");
    assert_eq!(hold.until_ms, 0);
    assert_eq!(pttl(&mut conn, &disabled).await, -1, "an untimed hold never expires");

    // Other templates are not held.
    assert_eq!(holds.read(&key("order_update")).await.expect("read"), None);

    // A shorter hold never shortens a longer one; an untimed hold stays untimed.
    let before = holds.read(&paused).await.expect("read").expect("held");
    let after = holds.hold(&paused, 132015, 1_000).await.expect("hold");
    assert_eq!(after.until_ms, before.until_ms, "a hold only extends");
    assert_eq!(after.since_ms, before.since_ms, "the start of a hold in force is kept");
    assert_eq!(holds.hold(&disabled, 132015, 1_000).await.expect("hold").until_ms, 0);

    // Release ends it at once and says what was there.
    let released = holds.release(&disabled).await.expect("release").expect("was held");
    assert_eq!(released.code, 132015, "the last code is kept");
    assert_eq!(holds.read(&disabled).await.expect("read"), None);
    assert_eq!(holds.release(&disabled).await.expect("release"), None, "a second release finds nothing");
}

#[tokio::test]
async fn an_expired_hold_reads_as_not_held() {
    let (_redis, holds, mut conn) = holds().await;
    let k = key("short");
    holds.hold(&k, 132015, 60_000).await.expect("hold");
    // Move the hold's end into the past (as time would), keeping the key: the script itself must say not held.
    let _: () = redis::cmd("HSET").arg(k.hold_key()).arg("u").arg(1).query_async(&mut conn).await.expect("hset");
    assert_eq!(holds.read(&k).await.expect("read"), None);
    let fresh = holds.hold(&k, 132015, 60_000).await.expect("hold again");
    assert!(fresh.until_ms > 1, "a lapsed hold starts afresh");
}

#[tokio::test]
async fn an_unknown_mode_is_refused() {
    let (_redis, _holds, mut conn) = holds().await;
    let script = redis::Script::new(include_str!("../../../../lua/template_holds.lua"));
    let err = script.key("bw:{qs}:hold:code:1").arg("drop").invoke_async::<redis::Value>(&mut conn).await;
    let err = err.expect_err("an unknown mode is an error").to_string();
    assert!(err.contains("bad") && err.contains("mode"), "{err}");
}

#[tokio::test]
async fn marketing_cool_off_and_suppression_are_per_tenant_and_recipient() {
    use bw_breaker::recipient::{RecipientMarketing, marketing_key};
    let (_redis, _holds, mut conn) = holds().await;
    let marketing = RecipientMarketing::new(RedisConn::Single(conn.clone()));
    let (alice, bob) =
        (bw_common::mask::recipient_key("+5491155550001"), bw_common::mask::recipient_key("+5491155550002"));

    let fresh = marketing.read("acme", &alice).await.expect("read");
    assert_eq!((fresh.deferred_for_ms(), fresh.suppressed_code), (0, 0), "nothing at first");

    // 131049: 24 h for this recipient in this tenant, whichever sender saw it.
    let day = 86_400_000;
    let s = marketing.defer("acme", &alice, 131049, day).await.expect("defer");
    assert!(s.deferred_for_ms() > day - 60_000 && s.deferred_for_ms() <= day, "{s:?}");
    assert_eq!(marketing.read("acme", &bob).await.expect("read").deferred_for_ms(), 0, "another recipient flows");
    assert_eq!(marketing.read("other", &alice).await.expect("read").deferred_for_ms(), 0, "another tenant flows");
    // A shorter deferral never shortens the one in force.
    let again = marketing.defer("acme", &alice, 131049, 1_000).await.expect("defer");
    assert_eq!(again.deferred_until_ms, s.deferred_until_ms);
    let ttl: i64 = redis::cmd("PTTL").arg(marketing_key("acme", &alice)).query_async(&mut conn).await.expect("pttl");
    assert!(ttl > (day - 60_000) as i64, "the key outlives the deferral: {ttl}");

    // 131050: suppressed, and kept long after the deferral.
    let s = marketing.suppress("acme", &bob, 131050).await.expect("suppress");
    assert_eq!(s.suppressed_code, 131050);
    assert_eq!(s.deferred_for_ms(), 0, "a suppression is not a deferral");
    assert_eq!(marketing.read("acme", &bob).await.expect("read").suppressed_code, 131050);
    let ttl: i64 = redis::cmd("PTTL").arg(marketing_key("acme", &bob)).query_async(&mut conn).await.expect("pttl");
    assert!(ttl > (170 * day) as i64, "kept about 180 days: {ttl}");

    // `user_preferences` `resume` lifts the user's own stop (131050) only, and leaves a deferral running.
    marketing.defer("acme", &bob, 131049, day).await.expect("defer");
    let kept = marketing.resume("acme", &bob, 130472).await.expect("resume");
    assert_eq!(kept.suppressed_code, 131050, "another code's resume lifts nothing");
    let lifted = marketing.resume("acme", &bob, 131050).await.expect("resume");
    assert_eq!(lifted.suppressed_code, 0);
    assert!(lifted.deferred_for_ms() > 0, "the 131049 deferral runs to its end");
    marketing.suppress("acme", &alice, 130472).await.expect("suppress");
    assert_eq!(marketing.resume("acme", &alice, 131050).await.expect("resume").suppressed_code, 130472);

    // No phone number reaches Redis.
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.expect("keys");
    assert!(keys.iter().all(|k| !k.contains("5491155550")), "{keys:?}");
}
