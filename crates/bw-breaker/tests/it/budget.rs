//! lua/portfolio_budget.lua against a real redis-server: the portfolio messaging-limit budget and the customer
//! service windows.

use crate::support::manager;
use bw_breaker::RedisConn;
use bw_breaker::budget::{self, BudgetItem, PortfolioBudget, Verdict};

const PF: &str = "506914307656634";
const RESERVE: u32 = 100;

async fn budget() -> (bw_testkit::RedisServer, PortfolioBudget, redis::aio::ConnectionManager) {
    let redis = bw_testkit::RedisServer::start();
    let conn = manager(&redis.url()).await;
    (redis, PortfolioBudget::new(RedisConn::Single(conn.clone())), conn)
}

fn rk(i: usize) -> String {
    bw_common::mask::recipient_key(&format!("+549115{i:07}"))
}

#[tokio::test]
async fn new_users_are_counted_to_the_limit_then_held_and_known_users_pass() {
    let (_redis, b, _conn) = budget().await;
    b.set_limit(PF, 10, "webhook", "10").await.expect("set");
    for i in 0..10 {
        let a = b.admit(PF, &rk(i), 250, RESERVE, true, false).await.expect("admit");
        assert_eq!(a.verdict, Verdict::Counted, "user {i}");
        assert_eq!((a.used, a.limit), (i as i64 + 1, 10));
    }
    let held = b.admit(PF, &rk(10), 250, RESERVE, true, false).await.expect("admit");
    let Verdict::Held { wait_ms } = held.verdict else { panic!("held past the limit: {held:?}") };
    assert!(wait_ms > 0 && wait_ms <= budget::WINDOW_MS, "a slot frees when the oldest leaves: {wait_ms}");
    assert_eq!(held.used, 10);
    // A user reached already is not a new one: it passes at any fill.
    assert_eq!(b.admit(PF, &rk(3), 250, RESERVE, false, false).await.expect("admit").verdict, Verdict::Known);
    // An open window: not counted at all.
    assert_eq!(b.admit(PF, &rk(11), 250, RESERVE, false, true).await.expect("admit").verdict, Verdict::WindowOpen);
    // Another portfolio has its own budget (the fallback, the lowest tier here).
    let other = b.admit("777", &rk(10), 250, RESERVE, true, false).await.expect("admit");
    assert_eq!((other.verdict, other.limit), (Verdict::Counted, 250));
    let state = b.read(PF, 250).await.expect("read");
    assert_eq!((state.used, state.limit, state.source.as_str(), state.raw.as_str()), (10, 10, "webhook", "10"));
    assert!(state.held_at_ms > 0 && state.held_reserved, "{state:?}");
    assert!(state.oldest_ms > 0);
}

#[tokio::test]
async fn one_round_trip_admits_in_order_as_one_at_a_time_would() {
    let (_redis, b, _conn) = budget().await;
    let item = |i: usize, reserved: bool, window_open: bool| BudgetItem { recipient_key: rk(i), reserved, window_open };
    // A limit of 4 with a quarter reserved: marketing may count 3 users, reserved classes 4.
    let items = [
        item(0, false, false),
        item(1, false, false),
        item(0, false, false),
        item(9, false, true),
        item(2, false, false),
        item(3, false, false),
        item(3, true, false),
        item(4, true, false),
    ];
    let answers = b.admit_many(PF, 4, 250, &items).await.expect("admit");
    let verdicts: Vec<Verdict> = answers.iter().map(|a| a.verdict).collect();
    assert_eq!(
        verdicts[..5],
        [Verdict::Counted, Verdict::Counted, Verdict::Known, Verdict::WindowOpen, Verdict::Counted]
    );
    assert!(matches!(verdicts[5], Verdict::Held { .. }), "marketing stops at 3 of 4: {verdicts:?}");
    assert_eq!(verdicts[6], Verdict::Counted, "a reserved class uses the reserve");
    assert!(matches!(verdicts[7], Verdict::Held { .. }), "the whole limit is used: {verdicts:?}");
    let used: Vec<i64> = answers.iter().map(|a| a.used).collect();
    assert_eq!(used, [1, 2, 2, 2, 3, 3, 4, 4]);
    assert_eq!(b.admit_many(PF, 4, 250, &[]).await.expect("nothing"), vec![]);
}

#[tokio::test]
async fn marketing_stops_at_the_reserve_and_reserved_classes_use_the_rest() {
    let (_redis, b, _conn) = budget().await;
    b.set_limit(PF, 20, "webhook", "20").await.expect("set");
    // 10 % of 20 reserved: marketing takes 18.
    for i in 0..18 {
        assert_eq!(b.admit(PF, &rk(i), 250, RESERVE, false, false).await.expect("admit").verdict, Verdict::Counted);
    }
    let m = b.admit(PF, &rk(18), 250, RESERVE, false, false).await.expect("admit");
    assert!(matches!(m.verdict, Verdict::Held { .. }), "marketing held at the reserve: {m:?}");
    let state = b.read(PF, 250).await.expect("read");
    assert!(!state.held_reserved, "the hold was marketing's");
    for i in 18..20 {
        let a = b.admit(PF, &rk(i), 250, RESERVE, true, false).await.expect("admit");
        assert_eq!(a.verdict, Verdict::Counted, "utility and authentication take the reserve");
    }
    let u = b.admit(PF, &rk(20), 250, RESERVE, true, false).await.expect("admit");
    assert!(matches!(u.verdict, Verdict::Held { .. }), "past the whole limit: {u:?}");
}

#[tokio::test]
async fn a_tier_rise_makes_room_and_unlimited_counts_nothing() {
    let (_redis, b, _conn) = budget().await;
    // No stored limit: the fallback (config or the lowest tier) applies.
    for i in 0..3 {
        b.admit(PF, &rk(i), 3, RESERVE, true, false).await.expect("admit");
    }
    assert!(matches!(b.admit(PF, &rk(3), 3, RESERVE, true, false).await.expect("admit").verdict, Verdict::Held { .. }));
    assert_eq!(b.read(PF, 3).await.expect("read").source, "", "the fallback has no source");
    assert_eq!(b.seed_limit(PF, 2000, "graph", "TIER_2K").await.expect("seed"), 2000, "seeded: none stored before");
    assert_eq!(b.seed_limit(PF, 100_000, "graph", "TIER_100K").await.expect("seed"), 2000, "a seed never overrides");
    assert_eq!(b.set_limit(PF, 2000, "webhook", "TIER_2K").await.expect("set"), 2000, "a webhook does");
    assert_eq!(b.admit(PF, &rk(3), 3, RESERVE, true, false).await.expect("admit").verdict, Verdict::Counted);
    assert_eq!(b.set_limit(PF, -1, "webhook", "TIER_UNLIMITED").await.expect("set"), 2000);
    let a = b.admit(PF, &rk(4), 3, RESERVE, false, false).await.expect("admit");
    assert_eq!((a.verdict, a.limit), (Verdict::Unlimited, -1));
    assert!(b.set_limit(PF, 0, "webhook", "?").await.is_err(), "0 is not a tier");
    assert_eq!(b.portfolios().await.expect("portfolios"), vec![PF.to_string()]);
}

#[tokio::test]
async fn the_window_slides_users_out_and_frees_their_slots() {
    let (_redis, b, mut conn) = budget().await;
    b.set_limit(PF, 2, "webhook", "2").await.expect("set");
    b.admit(PF, &rk(0), 250, 0, true, false).await.expect("admit");
    b.admit(PF, &rk(1), 250, 0, true, false).await.expect("admit");
    assert!(matches!(b.admit(PF, &rk(2), 250, 0, true, false).await.expect("admit").verdict, Verdict::Held { .. }));
    // Age user 0 past the window, as 24 h would.
    let _: () = redis::cmd("ZADD")
        .arg(budget::budget_key(PF))
        .arg(1_000)
        .arg(rk(0))
        .query_async(&mut conn)
        .await
        .expect("zadd");
    let a = b.admit(PF, &rk(2), 250, 0, true, false).await.expect("admit");
    assert_eq!((a.verdict, a.used), (Verdict::Counted, 2), "user 0 left the window; user 2 took its slot");
}

#[tokio::test]
async fn an_inbound_message_opens_the_window_for_24_hours_from_its_time() {
    let (_redis, b, mut conn) = budget().await;
    let now = bw_common::time::now_ms();
    let (phone, user) = ("106540352242922", rk(7));
    assert!(!b.window_open(phone, &user).await.expect("read"));
    assert!(b.open_window(phone, &user, now - 3_600_000, now).await.expect("open"));
    assert!(b.window_open(phone, &user).await.expect("read"));
    assert!(!b.window_open("106540352242923", &user).await.expect("read"), "the window is the number's");
    let both = b.windows_open(phone, &[rk(8), user.clone()]).await.expect("read both");
    assert_eq!(both, [false, true], "one answer per recipient, in order");
    let ttl: i64 = redis::cmd("PTTL").arg(budget::window_key(phone, &user)).query_async(&mut conn).await.expect("pttl");
    assert!(ttl > 22 * 3_600_000 && ttl <= 23 * 3_600_000, "24 h from the message, not from now: {ttl}");
    // A redelivered older message never shortens it; a newer one renews it.
    b.open_window(phone, &user, now - 20 * 3_600_000, now).await.expect("open");
    let after: i64 =
        redis::cmd("PTTL").arg(budget::window_key(phone, &user)).query_async(&mut conn).await.expect("pttl");
    assert!(after > 22 * 3_600_000, "{after}");
    assert!(!b.open_window(phone, &rk(8), now - 25 * 3_600_000, now).await.expect("open"), "already over");
    assert!(!b.window_open(phone, &rk(8)).await.expect("read"));
}

/// The figure of docs/messaging-limit.md: memory of one portfolio's budget at 100,000 recipients a day.
#[tokio::test]
async fn one_hundred_thousand_recipients_are_counted_exactly_in_a_few_megabytes() {
    let (_redis, b, mut conn) = budget().await;
    b.set_limit(PF, 100_000, "webhook", "TIER_100K").await.expect("set");
    let key = budget::budget_key(PF);
    for chunk in 0..100 {
        let items: Vec<BudgetItem> = (chunk * 1000..(chunk + 1) * 1000)
            .map(|i| BudgetItem { recipient_key: rk(i), reserved: true, window_open: false })
            .collect();
        let answers = b.admit_many(PF, 250, RESERVE, &items).await.expect("admit 1000");
        assert!(answers.iter().all(|a| a.verdict == Verdict::Counted), "chunk {chunk}: all new and under the limit");
        assert_eq!(answers.last().map(|a| a.used), Some((chunk as i64 + 1) * 1000), "counted in order");
    }
    let state = b.read(PF, 250).await.expect("read");
    assert_eq!(state.used, 100_000, "exact: every distinct recipient counted once");
    let a = b.admit(PF, &rk(100_000), 250, RESERVE, true, false).await.expect("admit");
    assert!(matches!(a.verdict, Verdict::Held { .. }), "the 100,001st is held");
    let bytes: i64 =
        redis::cmd("MEMORY").arg("USAGE").arg(&key).arg("SAMPLES").arg(0).query_async(&mut conn).await.expect("mem");
    println!("portfolio budget at 100,000 recipients: {bytes} bytes ({:.1} MB)", bytes as f64 / 1_048_576.0);
    assert!(bytes < 16 * 1_048_576, "{bytes} bytes");
}
