//! Limits at their real scopes: per-number throughput at Meta's default and overrides, the pair GCRA at
//! Meta's figures, the app budget (code 4) across numbers, the WABA budget (80007/80008) across the numbers of
//! one WABA, dead tokens on every number, scenario limits, and Retry-After.

use crate::common::*;
use bw_meta_sim::{Limits, PhoneNumberConfig, RetryAfter, Scenario, SimConfig};
use std::time::{Duration, Instant};

const OTHER: &str = "106540352242923";
const ELSEWHERE: &str = "106540352242924";
const WABA_2: &str = "102290129340399";

#[test]
fn compiled_defaults_are_metas() {
    let l = Limits::default();
    assert!(l.enabled && l.pair_enabled);
    assert_eq!(l.throughput_mps, 80.0, "80 mps per number");
    assert_eq!((l.pair_interval_ms, l.pair_burst), (6_000, 45), "pair: 1 per 6 s, bursts of 45");
    assert_eq!((l.app_calls, l.waba_calls), (None, None), "Meta documents no app/WABA budget for /messages");
    assert_eq!(l.waba_code, 80007);
    assert_eq!(l.retry_after, RetryAfter::None, "Meta sends no Retry-After");
    let cfg = SimConfig::default();
    assert!(!cfg.retry_after);
    assert_eq!(cfg.limits, l);
}

/// Sends `n` messages at once from `phone` to distinct recipients; (accepted, throttled, seconds taken).
async fn burst(client: &reqwest::Client, sim: &bw_meta_sim::SimHandle, phone: &str, n: u32) -> (u64, u64, f64) {
    let started = Instant::now();
    let sends = (0..n).map(|i| async move {
        send_from(client, sim, phone, TOKEN, &recipient(i), None).await.expect("answered").code()
    });
    let codes = futures::future::join_all(sends).await;
    let elapsed = started.elapsed().as_secs_f64();
    let ok = codes.iter().filter(|c| **c == 0).count() as u64;
    let throttled = codes.iter().filter(|c| **c == 130429).count() as u64;
    assert_eq!(ok + throttled, u64::from(n), "only 200s and 130429s: {codes:?}");
    (ok, throttled, elapsed)
}

#[tokio::test]
async fn default_throughput_is_80_mps_per_number_and_self_inflicted() {
    let sim = start(SimConfig { access_tokens: vec![TOKEN.into()], ..SimConfig::default() }).await;
    let client = client(Duration::from_secs(10));
    let (ok, throttled, elapsed) = burst(&client, &sim, PHONE, 200).await;
    let burst_size = Limits::default().throughput_burst as f64;
    assert!(ok as f64 >= burst_size, "the burst passes: {ok}");
    assert!(ok as f64 <= burst_size + 80.0 * elapsed + 1.0, "{ok} accepted in {elapsed:.3}s at 80 mps");
    assert!(throttled > 0);
    let c = sim.counters();
    assert_eq!(c.limit_exceeded("130429"), throttled, "the client exceeded the limit");
    assert_eq!(c.injected("130429"), 0, "nothing was injected");
    // Another number of the same app has its own throughput.
    assert_eq!(send_from(&client, &sim, OTHER, TOKEN, &recipient(999), None).await.expect("answered").code(), 0);
}

#[tokio::test]
async fn per_number_overrides_coexistence_and_upgraded() {
    let mut cfg = config();
    cfg.limits = Limits { throughput_mps: 0.01, throughput_burst: 1, pair_enabled: false, ..Limits::default() };
    cfg.limits.number_mps.insert(OTHER.into(), 20.0);
    cfg.limits.number_mps.insert(ELSEWHERE.into(), 1_000.0);
    // The Limits override wins over the number's config.
    cfg.phone_numbers.insert(ELSEWHERE.into(), PhoneNumberConfig { throughput_mps: Some(1.0), ..Default::default() });
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(10));

    // Default number at one message per 100 s, burst 1: the second send is refused.
    let first = send_from(&client, &sim, PHONE, TOKEN, &recipient(1), None).await.expect("answered");
    let second = send_from(&client, &sim, PHONE, TOKEN, &recipient(2), None).await.expect("answered");
    assert_eq!((first.code(), second.code()), (0, 130429));

    // Coexistence number at 20 mps, burst 1: at most 1 + 20 × elapsed of 60 concurrent sends.
    let started = Instant::now();
    let sends = (0..60).map(|i| {
        let (client, sim) = (&client, &sim);
        async move { send_from(client, sim, OTHER, TOKEN, &recipient(i), None).await.expect("answered").code() }
    });
    let codes = futures::future::join_all(sends).await;
    let elapsed = started.elapsed().as_secs_f64();
    let ok = codes.iter().filter(|c| **c == 0).count() as f64;
    assert!(ok >= 1.0 && ok <= 1.0 + 20.0 * elapsed + 1.0, "{ok} accepted in {elapsed:.3}s at 20 mps");

    // Upgraded number at 1,000 mps: sends 2 ms apart (twice its interval) all pass.
    for i in 0..5 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let a = send_from(&client, &sim, ELSEWHERE, TOKEN, &recipient(100 + i), None).await.expect("answered");
        assert_eq!(a.code(), 0, "1,000 mps override applies");
    }
}

#[tokio::test]
async fn pair_limit_is_gcra_6s_burst_45_at_the_default() {
    let limits = Limits { throughput_mps: 10_000.0, throughput_burst: 1_000, ..Limits::default() };
    let sim = start(SimConfig { limits, retry_after: true, ..config() }).await;
    let client = client(Duration::from_secs(10));
    let to = recipient(7);
    let mut codes = Vec::new();
    for _ in 0..47 {
        codes.push(send(&client, &sim, &to, Some("op")).await.expect("answered"));
    }
    assert!(codes[..45].iter().all(|a| a.code() == 0), "45 back to back");
    assert!(codes[45..].iter().all(|a| a.code() == 131056), "the 46th and 47th are refused");
    // TAT = t0 + 45 × 6 s; allowed again when TAT − now ≤ 44 × 6 s: one interval (6 s) after the burst started.
    let retry: u64 = codes[45].headers["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!((1..=6).contains(&retry), "one emission interval, not a repaid burst: {retry}s");
    assert_eq!(codes[45].status, 400);
    assert_eq!(sim.counters().limit_exceeded("131056"), 2);
    // Other recipients and other business numbers are unaffected.
    assert_eq!(send(&client, &sim, &recipient(8), None).await.expect("answered").code(), 0);
    assert_eq!(send_from(&client, &sim, OTHER, TOKEN, &to, None).await.expect("answered").code(), 0);
}

#[tokio::test]
async fn app_budget_answers_code_4_across_every_number() {
    let limits = Limits { app_calls: Some(5), retry_after: RetryAfter::HttpDate, ..Limits::disabled() };
    let limits = Limits { enabled: true, pair_enabled: false, throughput_mps: 10_000.0, ..limits };
    let mut cfg = config();
    cfg.limits = limits;
    cfg.phone_numbers
        .insert(ELSEWHERE.into(), PhoneNumberConfig { waba_id: Some(WABA_2.into()), ..Default::default() });
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(10));

    // An unknown token is refused before the budget and does not use it.
    assert_eq!(send_from(&client, &sim, PHONE, "wrong", &recipient(0), None).await.expect("answered").code(), 190);
    // Calls on three numbers in two WABAs share the app's budget of 5; a bad body is a call too.
    let bad = client
        .post(sim.messages_url("v21.0", OTHER))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({ "to": recipient(1) }))
        .send()
        .await
        .expect("answered");
    assert_eq!(bad.status().as_u16(), 400);
    for (i, phone) in [PHONE, OTHER, ELSEWHERE, PHONE].iter().enumerate() {
        let a = send_from(&client, &sim, phone, TOKEN, &recipient(10 + i as u32), None).await.expect("answered");
        assert_eq!(a.code(), 0, "call {} of 5", i + 2);
    }
    for phone in [ELSEWHERE, PHONE, OTHER] {
        let a = send_from(&client, &sim, phone, TOKEN, &recipient(20), Some("op-4")).await.expect("answered");
        assert_eq!((a.status, a.code()), (400, 4), "app budget exhausted on {phone}");
        assert_eq!(a.body["error"]["message"], "(#4) API Too Many Calls");
        let app: serde_json::Value =
            serde_json::from_str(a.headers["x-app-usage"].to_str().expect("ascii")).expect("json");
        assert_eq!(app["call_count"], 100);
        let date = a.headers["retry-after"].to_str().expect("ascii");
        assert!(date.len() == 29 && date.ends_with(" GMT") && date.as_bytes()[3] == b',', "IMF-fixdate: {date}");
    }
    assert!(sim.oracle().get("op-4").is_none(), "refused calls create nothing");
    let c = sim.counters();
    assert_eq!((c.limit_exceeded("4"), c.injected("4")), (3, 0));
}

#[tokio::test]
async fn waba_budget_answers_80007_across_the_numbers_of_one_waba() {
    let mut cfg = config();
    cfg.limits = Limits {
        waba_calls: Some(3),
        waba_window_ms: 60_000,
        throughput_mps: 10_000.0,
        pair_enabled: false,
        retry_after: RetryAfter::Seconds,
        ..Limits::default()
    };
    cfg.phone_numbers
        .insert(ELSEWHERE.into(), PhoneNumberConfig { waba_id: Some(WABA_2.into()), ..Default::default() });
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(10));
    for (i, phone) in [PHONE, OTHER, PHONE].iter().enumerate() {
        assert_eq!(
            send_from(&client, &sim, phone, TOKEN, &recipient(i as u32), None).await.expect("answered").code(),
            0
        );
    }
    let refused = send_from(&client, &sim, OTHER, TOKEN, &recipient(9), None).await.expect("answered");
    assert_eq!((refused.status, refused.code()), (400, 80007));
    assert_eq!(refused.body["error"]["message"], "(#80007) Rate limit issues");
    let retry: u64 = refused.headers["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!((1..=60).contains(&retry), "a window of 60 s: {retry}");
    // The number of the other WABA has its own budget, reported under its WABA id.
    let other = send_from(&client, &sim, ELSEWHERE, TOKEN, &recipient(9), None).await.expect("answered");
    assert_eq!(other.code(), 0);
    let buc: serde_json::Value =
        serde_json::from_str(other.headers["x-business-use-case-usage"].to_str().expect("ascii")).expect("json");
    assert!(buc.get(WABA_2).is_some(), "usage keyed by the number's WABA: {buc}");

    // 80008 (the Graph BUC page's code) when configured.
    sim.set_limits(Limits { waba_code: 80008, ..sim.limits() });
    let refused = send_from(&client, &sim, PHONE, TOKEN, &recipient(10), None).await.expect("answered");
    assert_eq!(refused.code(), 80008);
    let c = sim.counters();
    assert_eq!((c.limit_exceeded("80007"), c.limit_exceeded("80008")), (1, 1));
}

#[tokio::test]
async fn expired_tokens_fail_on_every_number_until_restored() {
    let cfg = SimConfig { access_tokens: vec![TOKEN.into(), "second-token".into()], ..config() };
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(10));
    let admin = |path: &str, body: serde_json::Value| {
        client.post(format!("{}/_sim/tokens/{path}", sim.base_url())).json(&body).send()
    };
    let r = admin("expire", serde_json::json!({ "token": TOKEN })).await.expect("admin answers");
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.expect("body");
    assert!(!text.contains(TOKEN), "the token is never echoed: {text}");
    for phone in [PHONE, OTHER, ELSEWHERE] {
        let a = send_from(&client, &sim, phone, TOKEN, &recipient(1), Some("op-dead")).await.expect("answered");
        assert_eq!((a.status, a.code()), (401, 190), "{phone}");
        assert_eq!(a.body["error"]["message"], "Error validating access token: Session has expired.");
        assert_eq!(a.body["error"]["type"], "OAuthException");
    }
    assert_eq!(send_from(&client, &sim, PHONE, "second-token", &recipient(1), None).await.expect("answered").code(), 0);
    assert!(sim.oracle().get("op-dead").is_none());
    let c = sim.counters();
    assert_eq!(c.injected("190"), 3, "admin-expired token answers are injected");

    // Bad admin input gets a precise 400.
    let r = admin("expire", serde_json::json!({ "token": TOKEN, "code": 42 })).await.expect("admin answers");
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().await.expect("body").contains("190 or 0"));
    let r = admin("expire", serde_json::json!({ "tokn": TOKEN })).await.expect("admin answers");
    assert_eq!(r.status().as_u16(), 400);

    let r = admin("restore", serde_json::json!({ "token": TOKEN })).await.expect("admin answers");
    assert_eq!(r.json::<serde_json::Value>().await.expect("json")["restored"], true);
    assert_eq!(send(&client, &sim, &recipient(2), None).await.expect("answered").code(), 0);

    // A scenario token event: every token invalidated (code 0) from its offset on.
    sim.set_scenario(
        Scenario::from_toml("name = \"revoked\"\n[[token_events]]\ntoken = \"*\"\nat_ms = 0\ncode = 0\n")
            .expect("parses"),
    );
    for token in [TOKEN, "second-token"] {
        let a = send_from(&client, &sim, OTHER, token, &recipient(3), None).await.expect("answered");
        assert_eq!((a.status, a.code()), (401, 0));
    }
    assert_eq!(sim.counters().injected("0"), 2);
    sim.clear_scenario();
    assert_eq!(send(&client, &sim, &recipient(4), None).await.expect("answered").code(), 0);
}

#[tokio::test]
async fn scenario_limits_replace_the_configured_ones_while_active() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(10));
    let toml = "name = \"app-budget\"\n[limits]\napp_calls = 2\nthroughput_mps = 10000.0\npair_enabled = false\n";
    let r = client.post(format!("{}/_sim/scenario", sim.base_url())).body(toml).send().await.expect("admin answers");
    assert_eq!(r.status().as_u16(), 200);
    let codes: Vec<i64> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(send(&client, &sim, &recipient(i), None).await.expect("answered").code());
        }
        v
    };
    assert_eq!(codes, vec![0, 0, 4]);
    assert!(!sim.limits().enabled, "the configured limits are untouched");
    sim.clear_scenario();
    assert_eq!(send(&client, &sim, &recipient(9), None).await.expect("answered").code(), 0);

    let bad = client
        .post(format!("{}/_sim/scenario", sim.base_url()))
        .body("[limits]\napp_calls = 0\n")
        .send()
        .await
        .expect("admin answers");
    assert_eq!(bad.status().as_u16(), 400);
    assert!(bad.text().await.expect("body").contains("app_calls"));
    let bad = client
        .post(format!("{}/_sim/limits", sim.base_url()))
        .body(r#"{"throughput_mps": 80, "pair_burst_window_ms": 6000}"#)
        .send()
        .await
        .expect("admin answers");
    assert_eq!(bad.status().as_u16(), 400, "unknown limit keys are refused");
}

#[tokio::test]
async fn retry_after_is_absent_by_default_and_present_when_configured() {
    // Default: no header on a limit refusal, nor on an injected throttle.
    // One message per 100 s: the second of two sends is always refused.
    let limits = Limits { throughput_mps: 0.01, throughput_burst: 1, ..Limits::default() };
    let sim = start(SimConfig { limits: limits.clone(), ..config() }).await;
    let client = client(Duration::from_secs(10));
    let answers = [
        send(&client, &sim, &recipient(1), None).await.expect("answered"),
        send(&client, &sim, &recipient(2), None).await.expect("answered"),
    ];
    assert_eq!((answers[0].code(), answers[1].code()), (0, 130429));
    let refused = &answers[1];
    assert!(refused.headers.get("retry-after").is_none(), "Meta sends no Retry-After");

    // Seconds.
    sim.set_limits(Limits { retry_after: RetryAfter::Seconds, ..limits.clone() });
    sim.reset();
    let _ = send(&client, &sim, &recipient(3), None).await.expect("answered");
    let a = send(&client, &sim, &recipient(4), None).await.expect("answered");
    assert_eq!(a.code(), 130429);
    let secs: u64 = a.headers["retry-after"].to_str().expect("ascii").parse().expect("integer seconds");
    assert!((90..=100).contains(&secs), "one message per 100 s: {secs}");

    // HTTP-date.
    sim.set_limits(Limits { retry_after: RetryAfter::HttpDate, ..limits.clone() });
    let a = send(&client, &sim, &recipient(4), None).await.expect("answered");
    assert_eq!(a.code(), 130429);
    let date = a.headers["retry-after"].to_str().expect("ascii");
    assert!(date.len() == 29 && date.ends_with(" GMT") && date.as_bytes()[3] == b',', "IMF-fixdate: {date}");

    // Injected throttles with the scenario's retry_after_s (an injected non-throttle error carries none).
    sim.set_limits(Limits::disabled());
    let toml = "retry_after_s = 7\n[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"error\", code = 130429 }]\n";
    sim.set_scenario(Scenario::from_toml(toml).expect("parses"));
    let a = send(&client, &sim, &recipient(5), None).await.expect("answered");
    assert_eq!(a.code(), 130429);
    assert_eq!(a.headers["retry-after"], "7");
    assert_eq!(sim.counters().injected("130429"), 1);
    let toml = "retry_after_s = 7\n[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"error\", code = 131000 }]\n";
    sim.set_scenario(Scenario::from_toml(toml).expect("parses"));
    let a = send(&client, &sim, &recipient(6), None).await.expect("answered");
    assert_eq!(a.code(), 131000);
    assert!(a.headers.get("retry-after").is_none(), "not a throttle");
}

#[tokio::test]
async fn inbound_messages_use_the_numbers_throughput() {
    let receiver = Receiver::start(0).await;
    let mut cfg = config();
    // One message per 100 s per number, burst 2.
    cfg.limits = Limits { throughput_mps: 0.01, throughput_burst: 2, pair_enabled: false, ..Limits::default() };
    cfg.webhook.url = Some(receiver.url.clone());
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(10));
    for i in 0..2 {
        assert!(sim.inject_inbound(PHONE, &recipient(i), "Ana", "hi").is_some());
    }
    let r = client
        .post(format!("{}/_sim/inbound", sim.base_url()))
        .json(&serde_json::json!({ "phone_number_id": PHONE, "from": recipient(3), "text": "hello" }))
        .send()
        .await
        .expect("admin answers");
    assert_eq!(r.status().as_u16(), 200);
    let a = send(&client, &sim, &recipient(9), None).await.expect("answered");
    assert_eq!(a.code(), 130429, "inbound and outbound share the number's throughput");
    assert_eq!(send_from(&client, &sim, OTHER, TOKEN, &recipient(9), None).await.expect("answered").code(), 0);
}

#[tokio::test]
async fn a_message_refused_by_one_limit_takes_nothing_from_the_other() {
    let mut cfg = config();
    // Throughput: burst of 3 then one per 100 s. Pair: one per 60 s, no burst.
    cfg.limits = Limits {
        throughput_mps: 0.01,
        throughput_burst: 3,
        pair_interval_ms: 60_000,
        pair_burst: 1,
        ..Limits::default()
    };
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(10));
    let mut codes = Vec::new();
    for to in [1, 1, 1, 2, 3, 4] {
        codes.push(send(&client, &sim, &recipient(to), None).await.expect("answered").code());
    }
    assert_eq!(codes, vec![0, 131056, 131056, 0, 0, 130429], "pair refusals used no throughput");
    let c = sim.counters();
    assert_eq!((c.limit_exceeded("131056"), c.limit_exceeded("130429")), (2, 1));
}
