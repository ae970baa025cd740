//! The portfolio messaging limit (reference §3.3): unique users reached outside a customer service window in
//! a rolling window, per business portfolio, shared by its numbers; past the tier a message is accepted and then
//! fails (the simulator's safe reading: no code or channel is documented), or is refused in sync mode.

use crate::common::*;
use bw_meta_sim::{
    Event, FailureCause, MessagingLimitConfig, Mode, PhoneNumberConfig, PortfolioConfig, SimConfig, Tier,
};
use std::time::Duration;

const PORTFOLIO: &str = "506914307656634";
const SAME_PORTFOLIO: &str = "106540352242923";
const OTHER_PORTFOLIO: &str = "106540352242924";

fn limited(receiver: &Receiver, tier: &str) -> SimConfig {
    let mut cfg = SimConfig { webhook: fast_webhook(&receiver.url), ..config() };
    cfg.webhook.delivered_delay_ms = None;
    cfg.webhook.read_delay_ms = None;
    cfg.portfolios
        .insert(PORTFOLIO.into(), PortfolioConfig { tier: Tier::parse(tier).expect("tier"), waba_ids: vec![] });
    cfg.phone_numbers.insert(
        OTHER_PORTFOLIO.into(),
        PhoneNumberConfig { portfolio_id: Some("506914307656635".into()), ..Default::default() },
    );
    cfg
}

/// Sends a template to each of `users` from `phone`; every answer must be a 200 (async mode). Only templates
/// count: a free-form message is a reply inside a service window.
async fn reach(client: &reqwest::Client, sim: &bw_meta_sim::SimHandle, phone: &str, users: std::ops::Range<u32>) {
    for n in users {
        let op = format!("op-{phone}-{n}");
        let body = template(&recipient(n), "order_update", "en_US", Some(&op));
        let a = post_from(client, sim, phone, TOKEN, &body).await.expect("answered");
        assert_eq!(a.code(), 0, "accepted: the limit fails later, by webhook");
    }
}

#[tokio::test]
async fn past_the_250_tier_messages_are_accepted_and_fail_and_the_portfolio_shares_it() {
    let receiver = Receiver::start(0).await;
    let sim = start(limited(&receiver, "TIER_250")).await;
    let client = client(Duration::from_secs(10));
    // 200 users from one number, 60 from another number of the same portfolio: 250 reached, 10 over.
    reach(&client, &sim, PHONE, 0..200).await;
    reach(&client, &sim, SAME_PORTFOLIO, 200..260).await;
    // Users already reached are not new ones; another portfolio has its own (unlimited) budget.
    reach(&client, &sim, SAME_PORTFOLIO, 0..5).await;
    reach(&client, &sim, OTHER_PORTFOLIO, 300..320).await;
    wait_until(Duration::from_secs(10), || async { receiver.statuses().len() >= 285 }).await;
    let statuses = receiver.statuses();
    let failed: Vec<&serde_json::Value> = statuses.iter().filter(|s| s["status"] == "failed").collect();
    assert_eq!(failed.len(), 10, "past the tier");
    assert!(failed.iter().all(|s| s["errors"][0]["code"] == 131048), "the configured code");
    let failed_ops: Vec<&str> = failed.iter().filter_map(|s| s["biz_opaque_callback_data"].as_str()).collect();
    assert!(failed_ops.iter().all(|op| op.starts_with(&format!("op-{SAME_PORTFOLIO}-2"))), "{failed_ops:?}");
    let c = sim.counters();
    assert_eq!(c.portfolio_limited.get(PORTFOLIO), Some(&10));
    assert_eq!(c.async_failed_for(FailureCause::Limit, 131048), 10);
    assert_eq!(sim.total_accepted(), 285, "all were accepted by the API");
    let state = sim.account_state();
    assert_eq!(state.portfolios[PORTFOLIO].reached, 250);
    assert_eq!(state.portfolios[PORTFOLIO].tier, Tier(Some(250)));
}

#[tokio::test]
async fn free_form_messages_never_count_they_are_replies_inside_a_window() {
    let receiver = Receiver::start(0).await;
    let sim = start(limited(&receiver, "2")).await;
    let client = client(Duration::from_secs(10));
    for n in 0..5 {
        let op = format!("text-{n}");
        let a = send_from(&client, &sim, PHONE, TOKEN, &recipient(n), Some(&op)).await.expect("answered");
        assert_eq!(a.code(), 0);
    }
    reach(&client, &sim, PHONE, 10..12).await;
    wait_until(Duration::from_secs(5), || async { receiver.statuses().len() >= 7 }).await;
    assert!(receiver.statuses().iter().all(|s| s["status"] != "failed"), "5 texts and 2 templates fit a tier of 2");
    assert_eq!(sim.account_state().portfolios[PORTFOLIO].reached, 2);
}

#[tokio::test]
async fn users_with_an_open_window_do_not_count_and_a_tier_change_lifts_the_limit() {
    let receiver = Receiver::start(0).await;
    let sim = start(limited(&receiver, "3")).await;
    let client = client(Duration::from_secs(10));
    reach(&client, &sim, PHONE, 0..3).await;
    // A user who wrote in: the reply is inside the service window and not counted.
    assert!(sim.inject_inbound(PHONE, &recipient(50), "Ana", "hi").is_some());
    reach(&client, &sim, PHONE, 50..51).await;
    reach(&client, &sim, PHONE, 3..4).await;
    wait_until(Duration::from_secs(5), || async { receiver.statuses().len() >= 5 }).await;
    let failed =
        |op: &str| receiver.statuses().iter().any(|s| s["biz_opaque_callback_data"] == op && s["status"] == "failed");
    assert!(!failed(&format!("op-{PHONE}-50")), "a reply in the window");
    assert!(failed(&format!("op-{PHONE}-3")), "the fourth new user");
    // The portfolio reaches the 2K tier (business_capability_update, in either documented form).
    let up = bw_meta_sim::EventKind::BusinessCapabilityUpdate {
        waba_id: None,
        max_daily_conversations_per_business: serde_json::json!("2000"),
        max_phone_numbers_per_waba: None,
        effect: true,
    };
    sim.fire_event(Event { name: "tier".into(), at_ms: 0, kind: up }).expect("valid");
    assert_eq!(sim.account_state().portfolios[PORTFOLIO].tier, Tier(Some(2_000)));
    reach(&client, &sim, PHONE, 4..5).await;
    wait_until(Duration::from_secs(5), || async {
        receiver.statuses().iter().any(|s| s["biz_opaque_callback_data"] == format!("op-{PHONE}-4").as_str())
    })
    .await;
    assert!(!failed(&format!("op-{PHONE}-4")), "under the new tier");
}

#[tokio::test]
async fn the_window_rolls_and_sync_mode_refuses_past_the_tier() {
    let receiver = Receiver::start(0).await;
    let mut cfg = limited(&receiver, "2");
    cfg.messaging_limit = MessagingLimitConfig { window_ms: 400, code: 131048, mode: Mode::Sync };
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(10));
    reach(&client, &sim, PHONE, 0..2).await;
    let tpl = |n: u32| template(&recipient(n), "order_update", "en_US", None);
    let a = post_from(&client, &sim, PHONE, TOKEN, &tpl(2)).await.expect("answered");
    assert_eq!((a.status, a.code()), (400, 131048), "sync mode: refused, nothing accepted");
    assert_eq!(sim.counters().limit_exceeded("131048"), 1);
    assert_eq!(sim.total_accepted(), 2);
    // Once the first users leave the rolling window, new users fit again.
    wait_until(Duration::from_secs(5), || async { sim.account_state().portfolios[PORTFOLIO].reached == 0 }).await;
    assert_eq!(post_from(&client, &sim, PHONE, TOKEN, &tpl(2)).await.expect("answered").code(), 0);
}

/// GET `/{version}/{id}?fields=whatsapp_business_manager_messaging_limit` of a number, its WABA or the portfolio.
async fn read_tier(client: &reqwest::Client, sim: &bw_meta_sim::SimHandle, id: &str, token: &str) -> (u16, String) {
    let url = format!("{}/v25.0/{id}?fields=whatsapp_business_manager_messaging_limit", sim.base_url());
    let r = client.get(url).bearer_auth(token).send().await.expect("answered");
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.expect("json");
    (status, body["whatsapp_business_manager_messaging_limit"].as_str().unwrap_or_default().to_string())
}

#[tokio::test]
async fn the_tier_is_read_on_a_number_its_waba_or_its_portfolio_as_announced() {
    let receiver = Receiver::start(0).await;
    let sim = start(limited(&receiver, "TIER_2K")).await;
    let client = client(Duration::from_secs(10));
    let waba = sim.account_state().wabas.keys().next().cloned().unwrap_or_else(|| "102290129340398".into());
    for id in [PHONE, PORTFOLIO, waba.as_str()] {
        assert_eq!(read_tier(&client, &sim, id, TOKEN).await, (200, "TIER_2K".into()), "{id}");
    }
    assert_eq!(read_tier(&client, &sim, OTHER_PORTFOLIO, TOKEN).await, (200, "TIER_UNLIMITED".into()));
    assert_eq!(read_tier(&client, &sim, PHONE, "wrong").await.0, 401, "an unknown token: 190");
    let other_field = format!("{}/v25.0/{PHONE}?fields=name", sim.base_url());
    assert_eq!(client.get(other_field).bearer_auth(TOKEN).send().await.expect("answered").status().as_u16(), 400);
    // A business_capability_update changes what the read says.
    let up = bw_meta_sim::EventKind::BusinessCapabilityUpdate {
        waba_id: None,
        max_daily_conversations_per_business: serde_json::json!("TIER_10K"),
        max_phone_numbers_per_waba: None,
        effect: true,
    };
    sim.fire_event(Event { name: "tier".into(), at_ms: 0, kind: up }).expect("valid");
    assert_eq!(read_tier(&client, &sim, PHONE, TOKEN).await, (200, "TIER_10K".into()));
}
