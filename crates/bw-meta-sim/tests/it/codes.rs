//! Every code of the reference's §2.3 table, answered synchronously in the shape of §2.1 with the status of
//! §2.2, and a sample as asynchronous `failed` statuses in the shape of §4.4; targeting by number, WABA, token,
//! template, recipient and category; spans, shares and caps.

use crate::common::*;
use bw_meta_sim::{FailureCause, Injection, Mode, PhoneNumberConfig, Scenario, Selection, SimConfig, TemplateRef};
use serde_json::{Value, json};
use std::time::Duration;

/// The HTTP status the reference gives each code: the older Meta table of §2.2 (401, 500, 403, 400, 503; throttles
/// 429 there, the configured throttle status here), the Marketing Messages table (131009, 132018: 400), 503 for
/// the transient "temporarily unavailable" and maintenance codes (the simulator's documented inference), 400 for
/// every other code.
fn expected_status(code: i64, throttle: u16) -> u16 {
    match code {
        0 | 190 => 401,
        3 | 131000 => 500,
        10 | 200..=299 | 368 | 131005 | 131031 | 130497 => 403,
        4 | 80007 | 80008 | 130429 | 131048 | 131056 | 17 | 32 | 613 => throttle,
        2 | 131016 | 131057 | 133004 | 2_494_100 => 503,
        _ => 400,
    }
}

/// Every code of §2.3, 200–299 written out.
fn table_codes() -> Vec<i64> {
    let mut codes = vec![
        0, 190, 3, 10, 131005, 4, 17, 32, 613, 80007, 80008, 368, 131031, 130497, 131042, 131063, 131064, 33, 131045,
        133010, 133000, 133015, 133016, 131037, 130429, 131048, 131057, 2494100, 131056, 132000, 132001, 132005,
        132007, 132012, 132015, 132016, 132018, 132068, 132069, 131026, 131047, 131049, 131050, 130472, 130403, 131021,
        131062, 100, 131008, 131009, 131051, 131053, 135000, 131052, 1, 2, 131000, 131016, 133004,
    ];
    codes.extend(200..=299);
    codes
}

fn sync(code: i64) -> Injection {
    Injection { name: format!("c{code}"), mode: Some(Mode::Sync), ..Injection::new(code) }
}

fn scenario(injections: Vec<Injection>) -> Scenario {
    Scenario { selection: Selection::Deterministic, injections, ..Scenario::default() }
}

fn is_fbtrace(v: &Value) -> bool {
    v.as_str().is_some_and(|s| s.len() == 23 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
}

#[tokio::test]
async fn every_table_code_is_answered_synchronously_in_metas_shape() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(5));
    let codes = table_codes();
    assert_eq!(codes.len(), 59 + 100, "the table's codes with 200..=299");
    for (i, code) in codes.iter().copied().enumerate() {
        sim.set_scenario(scenario(vec![sync(code)]));
        let a = send(&client, &sim, &recipient(i as u32), Some("op")).await.expect("answered");
        assert_eq!(a.status, expected_status(code, 400), "HTTP status of {code}");
        let e = &a.body["error"];
        assert_eq!(e["code"], code, "{code}: {}", a.body);
        assert_eq!(e["type"], "OAuthException", "{code}");
        assert!(is_fbtrace(&e["fbtrace_id"]), "{code}: fbtrace_id {}", e["fbtrace_id"]);
        if code == 190 {
            // Graph's token error: no error_data, the subcode of an expired session.
            assert_eq!(e["message"], "Error validating access token: Session has expired.");
            assert_eq!(e["error_subcode"], 463);
            assert!(e.get("error_data").is_none());
        } else {
            let msg = e["message"].as_str().expect("message");
            assert!(msg.starts_with(&format!("(#{code}) ")) && msg.len() > format!("(#{code}) ").len(), "{msg}");
            assert_eq!(e["error_data"]["messaging_product"], "whatsapp", "{code}");
            assert!(e["error_data"]["details"].as_str().is_some_and(|d| !d.is_empty()), "{code}: details");
            let subcode = if code == 130429 { json!(2_494_055) } else { Value::Null };
            assert_eq!(e.get("error_subcode").cloned().unwrap_or(Value::Null), subcode, "{code}: subcode");
        }
        assert!(a.headers.get("retry-after").is_none(), "{code}: Meta documents no Retry-After");
        let buc: Value =
            serde_json::from_str(a.headers["x-business-use-case-usage"].to_str().expect("ascii")).expect("json");
        let usage = &buc["102290129340398"][0];
        assert!(usage["estimated_time_to_regain_access"].is_u64(), "{code}: {buc}");
        if [80007, 80008].contains(&code) {
            assert_eq!(usage["call_count"], 100, "{code}: the WABA budget shows used up");
            assert!(usage["estimated_time_to_regain_access"].as_u64() >= Some(1), "{code}: a regain hint");
        }
        if code == 4 {
            let app: Value = serde_json::from_str(a.headers["x-app-usage"].to_str().expect("ascii")).expect("json");
            assert_eq!(app["call_count"], 100, "code 4: the app budget shows used up");
        }
    }
    assert_eq!(sim.total_accepted(), 0, "a sync answer accepts nothing");
    let c = sim.counters();
    for code in &codes {
        assert_eq!(c.injected(&code.to_string()), 1, "{code} counted as injected");
        assert_eq!(c.injection(&format!("c{code}")), 1);
    }
}

#[tokio::test]
async fn throttle_status_hints_and_overrides_follow_the_scenario() {
    let sim = start(SimConfig { throttle_http_status: 429, ..config() }).await;
    let client = client(Duration::from_secs(5));
    sim.set_scenario(scenario(vec![sync(130429)]));
    assert_eq!(send(&client, &sim, &recipient(1), None).await.expect("answered").status, 429, "Meta's old table");

    let inj = Injection {
        name: "waba-limit".into(),
        http_status: Some(400),
        subcode: Some(7),
        details: Some("custom details".into()),
        user_title: Some("Slow down".into()),
        user_msg: Some("Too many calls".into()),
        regain_minutes: Some(15),
        retry_after_s: Some(30),
        ..Injection::new(80007)
    };
    sim.set_scenario(scenario(vec![inj]));
    let a = send(&client, &sim, &recipient(2), None).await.expect("answered");
    assert_eq!((a.status, a.code()), (400, 80007));
    let e = &a.body["error"];
    assert_eq!((&e["error_subcode"], &e["error_data"]["details"]), (&json!(7), &json!("custom details")));
    assert_eq!((&e["error_user_title"], &e["error_user_msg"]), (&json!("Slow down"), &json!("Too many calls")));
    assert_eq!(a.headers["retry-after"], "30");
    let buc: Value =
        serde_json::from_str(a.headers["x-business-use-case-usage"].to_str().expect("ascii")).expect("json");
    assert_eq!(buc["102290129340398"][0]["estimated_time_to_regain_access"], 15);

    // Without regain_minutes the hint is the injection's remaining span in minutes.
    let inj = Injection { duration_ms: Some(10 * 60_000), ..Injection::new(80007) };
    sim.set_scenario(scenario(vec![inj]));
    let a = send(&client, &sim, &recipient(3), None).await.expect("answered");
    let buc: Value =
        serde_json::from_str(a.headers["x-business-use-case-usage"].to_str().expect("ascii")).expect("json");
    let regain = buc["102290129340398"][0]["estimated_time_to_regain_access"].as_u64().expect("minutes");
    assert!((9..=10).contains(&regain), "about 10 minutes left: {regain}");
}

#[tokio::test]
async fn a_sample_of_codes_fails_asynchronously_in_the_status_shape() {
    let receiver = Receiver::start(0).await;
    let sim = start(SimConfig { webhook: fast_webhook(&receiver.url), ..config() }).await;
    let client = client(Duration::from_secs(5));
    // A-only codes default to async; the others are asked for.
    let codes = [131026, 131047, 131049, 131050, 130472, 131053, 131000, 130429, 132015, 131056, 368];
    for (i, code) in codes.iter().copied().enumerate() {
        let mut inj = Injection { name: format!("a{code}"), ..Injection::new(code) };
        if !matches!(code, 131026 | 131047 | 131049 | 131050 | 130472 | 131053) {
            inj.mode = Some(Mode::Async);
        }
        sim.set_scenario(scenario(vec![inj]));
        let a = send(&client, &sim, &recipient(i as u32), Some(&format!("op-{code}"))).await.expect("answered");
        assert_eq!(a.status, 200, "{code}: accepted first");
        assert!(a.wamid().is_some());
    }
    wait_until(Duration::from_secs(5), || async { receiver.statuses().len() >= codes.len() }).await;
    let reference = json!({
        "id": "wamid...", "status": "failed", "timestamp": "1750030073", "recipient_id": "16505551234",
        "biz_opaque_callback_data": "op",
        "errors": [{ "code": 131049, "title": "...", "message": "...", "error_data": { "details": "..." },
            "href": "..." }],
    });
    let statuses = receiver.statuses();
    for code in codes {
        let op = format!("op-{code}");
        let s = statuses.iter().find(|s| s["biz_opaque_callback_data"] == op.as_str()).expect("a status");
        same_shape(&reference, s, "status").unwrap_or_else(|e| panic!("{code}: {e}"));
        assert_eq!(s["errors"][0]["code"], code);
        assert_eq!(s["errors"][0]["message"], s["errors"][0]["title"], "Meta: message equals title");
        assert!(s.get("recipient_user_id").is_none(), "{code}: not on failed statuses of phone sends");
        let c = sim.counters();
        assert_eq!(c.async_failed_for(FailureCause::Injected, code), 1, "{code}");
        assert_eq!(c.injection(&format!("a{code}")), 1);
    }
    assert_eq!(statuses.len(), codes.len(), "failed messages get no sent/delivered/read");
    for body in receiver.accepted() {
        assert!(body["entry"][0]["changes"][0]["value"].get("contacts").is_none(), "no contacts[] on failed");
    }
    let snap = sim.oracle();
    assert_eq!(snap.total_accepted(), codes.len() as u64, "every one was accepted by the API");
    assert_eq!(snap.failed.len(), codes.len());
    assert!(snap.failed.iter().all(|f| f.cause == FailureCause::Injected && f.operation_id.is_some()));
}

#[tokio::test]
async fn an_async_failure_can_follow_sent_after_a_delay() {
    let receiver = Receiver::start(0).await;
    let sim = start(SimConfig { webhook: fast_webhook(&receiver.url), ..config() }).await;
    let client = client(Duration::from_secs(5));
    let inj = Injection {
        after_sent: true,
        delay_ms: Some(200),
        details: Some("Message failed to send because of too many messages in a short time".into()),
        mode: Some(Mode::Async),
        ..Injection::new(130429)
    };
    sim.set_scenario(scenario(vec![inj]));
    assert_eq!(send(&client, &sim, &recipient(1), Some("op-late")).await.expect("answered").status, 200);
    wait_until(Duration::from_secs(5), || async { receiver.statuses().len() >= 2 }).await;
    let kinds: Vec<String> =
        receiver.statuses().iter().map(|s| s["status"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(kinds, vec!["sent", "failed"], "sent first, then the failure");
    let failed = &receiver.statuses()[1];
    assert!(failed["errors"][0]["error_data"]["details"].as_str().is_some_and(|d| d.starts_with("Message failed")));
}

#[tokio::test]
async fn injections_hit_only_their_number_waba_token_template_recipient_and_category() {
    const OTHER: &str = "106540352242923";
    const WABA_2_NUMBER: &str = "106540352242924";
    let mut cfg = config();
    cfg.access_tokens.push("second-token".into());
    cfg.phone_numbers
        .insert(WABA_2_NUMBER.into(), PhoneNumberConfig { waba_id: Some("waba-2".into()), ..Default::default() });
    cfg.templates.push(bw_meta_sim::TemplateConfig {
        name: "promo".into(),
        language: None,
        category: "MARKETING".into(),
        status: "APPROVED".into(),
        otp_type: None,
        id: None,
        paced: false,
    });
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(5));
    let target = |code: i64, f: fn(&mut Injection)| {
        let mut i = sync(code);
        f(&mut i);
        i
    };
    sim.set_scenario(scenario(vec![
        target(131045, |i| i.phone_number_ids = vec![OTHER.into()]),
        target(368, |i| i.waba_ids = vec!["waba-2".into()]),
        target(10, |i| i.tokens = vec!["second-token".into()]),
        target(132015, |i| {
            i.templates = vec![TemplateRef { name: "order_update".into(), language: Some("en-US".into()) }]
        }),
        target(130403, |i| i.recipients = vec!["+1 (650) 555-0007".into()]),
        target(131063, |i| i.categories = vec!["marketing".into()]),
    ]));
    let code = |a: Answer| a.code();
    let text = |to: u32| text(&recipient(to), None);
    assert_eq!(code(post_from(&client, &sim, PHONE, TOKEN, &text(1)).await.expect("answered")), 0, "untargeted");
    assert_eq!(code(post_from(&client, &sim, OTHER, TOKEN, &text(2)).await.expect("answered")), 131045);
    assert_eq!(code(post_from(&client, &sim, WABA_2_NUMBER, TOKEN, &text(3)).await.expect("answered")), 368);
    assert_eq!(code(post_from(&client, &sim, PHONE, "second-token", &text(4)).await.expect("answered")), 10);
    let tpl = |name: &str, lang: &str| template(&recipient(5), name, lang, None);
    assert_eq!(code(post_from(&client, &sim, PHONE, TOKEN, &tpl("order_update", "en_US")).await.expect("ok")), 132015);
    assert_eq!(code(post_from(&client, &sim, PHONE, TOKEN, &tpl("order_update", "es_AR")).await.expect("ok")), 0);
    assert_eq!(code(post_from(&client, &sim, PHONE, TOKEN, &tpl("promo", "en_US")).await.expect("ok")), 131063);
    assert_eq!(code(post_from(&client, &sim, PHONE, TOKEN, &text(7)).await.expect("answered")), 130403);
    assert_eq!(code(post_from(&client, &sim, PHONE, TOKEN, &text(8)).await.expect("answered")), 0);
    assert_eq!(sim.total_accepted(), 3);
}

#[tokio::test]
async fn shares_caps_and_spans_are_exact_on_the_scenario_clock() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(5));
    let half = Injection { name: "half".into(), rate: 0.5, ..sync(131000) };
    sim.set_scenario(scenario(vec![half]));
    let mut failed = 0;
    for i in 0..10 {
        failed += u32::from(send(&client, &sim, &recipient(i), None).await.expect("answered").code() == 131000);
    }
    assert_eq!(failed, 5, "deterministic selection: exactly half");

    let capped = Injection { name: "capped".into(), max: Some(3), ..sync(2) };
    sim.set_scenario(scenario(vec![capped]));
    let mut failed = 0;
    for i in 0..10 {
        failed += u32::from(send(&client, &sim, &recipient(20 + i), None).await.expect("answered").code() == 2);
    }
    assert_eq!((failed, sim.counters().injection("capped")), (3, 3), "at most max calls");

    // A span from 0 to 300 ms, then another from 300 ms on: each code only inside its span.
    let early = Injection { duration_ms: Some(300), ..sync(131016) };
    let late = Injection { start_ms: 300, ..sync(133004) };
    sim.set_scenario(scenario(vec![early, late]));
    assert_eq!(send(&client, &sim, &recipient(40), None).await.expect("answered").code(), 131016);
    wait_until(Duration::from_secs(5), || async { sim.scenario_elapsed_ms() >= 300 }).await;
    assert_eq!(send(&client, &sim, &recipient(41), None).await.expect("answered").code(), 133004);
}

#[tokio::test]
async fn injections_parse_strictly_from_toml_and_the_admin_api() {
    let sim = start(config()).await;
    let client = client(Duration::from_secs(5));
    let toml = r#"
        selection = "deterministic"
        [[injections]]
        name = "tpl"
        code = 132016
        templates = [{ name = "gone" }]
    "#;
    let r = client.post(format!("{}/_sim/scenario", sim.base_url())).body(toml).send().await.expect("admin answers");
    assert_eq!(r.status().as_u16(), 200);
    let a = post_from(&client, &sim, PHONE, TOKEN, &template(&recipient(1), "gone", "pt_BR", None)).await.expect("ok");
    assert_eq!(a.code(), 132016);

    let typo = "[[injections]]\ncode = 368\nwaba_id = [\"x\"]\n";
    let r = client.post(format!("{}/_sim/scenario", sim.base_url())).body(typo).send().await.expect("admin answers");
    assert_eq!(r.status().as_u16(), 400);
    let err = r.text().await.expect("body");
    assert!(err.contains("waba_id") && err.contains("waba_ids"), "names the key and the allowed ones: {err}");
    let bad = "[[injections]]\nname = \"n\"\ncode = 368\nrate = 2.0\n";
    let err = Scenario::from_toml(bad).expect_err("rate").to_string();
    assert!(err.contains("injection `n`: rate"), "{err}");
    let hidden = "[[injections]]\ncode = 10\ntokens = [\"secret-token\"]\n";
    let r = client.post(format!("{}/_sim/scenario", sim.base_url())).body(hidden).send().await.expect("answers");
    assert_eq!(r.status().as_u16(), 200);
    let shown = client.get(format!("{}/_sim/scenario", sim.base_url())).send().await.expect("answers");
    let text = shown.text().await.expect("body");
    assert!(!text.contains("secret-token") && text.contains("<redacted>"), "tokens are never echoed: {text}");
}
