//! Account and template webhooks (reference §4.5), value-level errors (§2.1) and echoes: each payload parsed
//! back and compared with the reference's example (same keys and types, and the example's values where the
//! event sets them), signed like every webhook, and the state the simulator enforces after each.

use crate::common::*;
use bw_meta_sim::{
    Event, EventKind, FailureCause, Limits, PhoneNumberConfig, Scenario, SimConfig, TemplateConfig, Tier,
};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use std::time::Duration;

const WABA: &str = "102290129340398";
const OTHER_WABA_NUMBER: &str = "106540352242925";

fn signed(secret: &str, r: &Received) -> bool {
    let Some(sig) = r.signature.strip_prefix("sha256=").and_then(|h| hex::decode(h).ok()) else {
        return false;
    };
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(&r.raw);
    mac.verify_slice(&sig).is_ok()
}

fn tpl(name: &str, lang: Option<&str>, category: &str) -> TemplateConfig {
    TemplateConfig {
        name: name.into(),
        language: lang.map(str::to_string),
        category: category.into(),
        status: "APPROVED".into(),
        otp_type: None,
        id: None,
        paced: false,
    }
}

async fn sim_with(receiver: &Receiver, f: impl FnOnce(&mut SimConfig)) -> bw_meta_sim::SimHandle {
    let mut cfg = SimConfig { webhook: fast_webhook(&receiver.url), ..config() };
    cfg.phone_numbers.insert(
        PHONE.into(),
        PhoneNumberConfig { display_phone_number: Some("15550783881".into()), ..Default::default() },
    );
    cfg.phone_numbers
        .insert(OTHER_WABA_NUMBER.into(), PhoneNumberConfig { waba_id: Some("waba-2".into()), ..Default::default() });
    f(&mut cfg);
    start(cfg).await
}

fn events(list: Vec<(u64, EventKind)>) -> Scenario {
    Scenario {
        events: list.into_iter().map(|(at_ms, kind)| Event { name: String::new(), at_ms, kind }).collect(),
        ..Scenario::default()
    }
}

fn parse(text: &str) -> EventKind {
    #[derive(serde::Deserialize)]
    struct Doc {
        events: Vec<Event>,
    }
    let mut doc: Doc = toml::from_str(&format!("[[events]]\n{text}")).expect("event parses");
    doc.events.remove(0).kind
}

/// The envelope of §4.5 around `value`.
fn check_envelope(env: &Value, field: &str, waba: &str) {
    assert_eq!(env["object"], "whatsapp_business_account");
    assert_eq!(env["entry"][0]["id"], waba, "{field}: entry id is the WABA");
    assert!(env["entry"][0]["time"].is_u64(), "{field}: entry time");
    assert_eq!(env["entry"][0]["changes"][0]["field"], field);
}

#[tokio::test]
async fn each_account_and_template_field_has_the_reference_shape() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |cfg| {
        cfg.templates.push(TemplateConfig {
            id: Some(1_689_556_908_129_832),
            ..tpl("order_confirmation", Some("en_US"), "MARKETING")
        });
        cfg.templates.push(TemplateConfig {
            id: Some(806_312_974_732_579),
            ..tpl("welcome_template", Some("en_US"), "UTILITY")
        });
        cfg.portfolios.insert(
            "506914307656634".into(),
            bw_meta_sim::PortfolioConfig { tier: Tier::parse("TIER_UNLIMITED").expect("tier"), waba_ids: vec![] },
        );
    })
    .await;
    // Each case: the event, the reference's example value (§4.5), and the values that must match it exactly.
    let cases: Vec<(&str, &str, Value, Vec<&str>)> = vec![
        (
            "account_update",
            r#"
                kind = "account_update"
                event = "ACCOUNT_RESTRICTION"
                expiration = 1641330498
                remediation = "<optional>"
            "#,
            json!({"event":"ACCOUNT_RESTRICTION",
                "restriction_info":[{"restriction_type":"RESTRICTED_BIZ_INITIATED_MESSAGING",
                "expiration":1641330498,"remediation":"<optional>"}]}),
            vec!["event", "restriction_info"],
        ),
        (
            "account_update",
            r#"
                kind = "account_update"
                event = "DISABLED_UPDATE"
                ban_state = "DISABLE"
                ban_date = "April 17, 2025"
            "#,
            json!({"event":"DISABLED_UPDATE","ban_info":{"waba_ban_state":"DISABLE","waba_ban_date":"April 17, 2025"}}),
            vec!["event", "ban_info"],
        ),
        (
            "business_capability_update",
            r#"
                kind = "business_capability_update"
                max_daily_conversations_per_business = "TIER_2K"
            "#,
            json!({"max_daily_conversations_per_business":"TIER_2K","max_phone_numbers_per_waba":25}),
            vec!["max_daily_conversations_per_business", "max_phone_numbers_per_waba"],
        ),
        (
            "phone_number_quality_update",
            r#"
                kind = "phone_number_quality_update"
                phone_number_id = "106540352242922"
                event = "THROUGHPUT_UPGRADE"
                current_limit = "TIER_UNLIMITED"
                max_daily_conversations_per_business = "TIER_UNLIMITED"
            "#,
            json!({"display_phone_number":"15550783881","event":"THROUGHPUT_UPGRADE",
                "current_limit":"TIER_UNLIMITED","max_daily_conversations_per_business":"TIER_UNLIMITED"}),
            vec!["display_phone_number", "event", "current_limit", "max_daily_conversations_per_business"],
        ),
        (
            "account_alerts",
            r#"
                kind = "account_alerts"
                alert_type = "INCREASED_CAPABILITIES_ELIGIBILITY_DEFERRED"
                alert_description = "..."
            "#,
            json!({"entity_type":"BUSINESS","entity_id":"506914307656634","alert_info":{"alert_severity":"WARNING",
                "alert_status":"ACTIVE","alert_type":"INCREASED_CAPABILITIES_ELIGIBILITY_DEFERRED",
                "alert_description":"..."}}),
            vec!["entity_type", "entity_id", "alert_info"],
        ),
        (
            "message_template_status_update",
            r#"
                kind = "message_template_status_update"
                template = "order_confirmation"
                event = "PAUSED"
                description = "..."
            "#,
            json!({"event":"PAUSED","message_template_id":1689556908129832u64,
                "message_template_name":"order_confirmation",
                "message_template_language":"en-US","reason":"NONE","message_template_category":"MARKETING",
                "other_info":{"title":"FIRST_PAUSE","description":"..."}}),
            vec![
                "event",
                "message_template_id",
                "message_template_name",
                "message_template_language",
                "reason",
                "message_template_category",
                "other_info",
            ],
        ),
        (
            "message_template_quality_update",
            r#"
                kind = "message_template_quality_update"
                template = "welcome_template"
                previous_quality_score = "GREEN"
                new_quality_score = "YELLOW"
            "#,
            json!({"previous_quality_score":"GREEN","new_quality_score":"YELLOW",
                "message_template_id":806312974732579u64,"message_template_name":"welcome_template",
                "message_template_language":"en-US"}),
            vec![
                "previous_quality_score",
                "new_quality_score",
                "message_template_id",
                "message_template_name",
                "message_template_language",
            ],
        ),
        (
            "template_category_update",
            r#"
                kind = "template_category_update"
                template = "welcome_template"
                new_category = "MARKETING"
                notice = true
            "#,
            json!({"message_template_id":278077987957091u64,"message_template_name":"welcome_template",
                "message_template_language":"en-US",
                "new_category":"UTILITY","correct_category":"MARKETING","category_update_timestamp":1746169200}),
            vec!["message_template_name", "message_template_language", "new_category", "correct_category"],
        ),
        (
            "template_category_update",
            r#"
                kind = "template_category_update"
                template = "welcome_template"
                new_category = "MARKETING"
            "#,
            json!({"message_template_id":278077987957091u64,"message_template_name":"welcome_template",
                "message_template_language":"en-US",
                "previous_category":"UTILITY","new_category":"MARKETING"}),
            vec!["message_template_name", "message_template_language", "previous_category", "new_category"],
        ),
        (
            "user_preferences",
            r#"
                kind = "user_preferences"
                phone_number_id = "106540352242922"
                user = "+16505551234"
                user_id = "US.13491208655302741918"
                value = "stop"
            "#,
            json!({"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881",
                "phone_number_id":"106540352242922"},
                "contacts":[{"wa_id":"16505551234","user_id":"US.13491208655302741918"}],
                "user_preferences":[{"wa_id":"16505551234","user_id":"US.13491208655302741918",
                "category":"marketing_messages",
                "detail":"User requested to stop marketing messages","value":"stop","timestamp":1731705721}]}),
            vec!["messaging_product", "metadata", "contacts"],
        ),
        (
            "smb_message_echoes",
            r#"
                kind = "smb_message_echoes"
                phone_number_id = "106540352242922"
                to = "+16505551234"
                text = "Here's the info you requested!"
            "#,
            json!({"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881",
                "phone_number_id":"106540352242922"},
                "message_echoes":[{"from":"15550783881","to":"+16505551234","id":"wamid.HBgL...",
                "timestamp":"1739321024",
                "type":"text","text":{"body":"Here's the info you requested!"}}]}),
            vec!["messaging_product", "metadata"],
        ),
    ];
    for (i, (field, text, example, exact)) in cases.iter().enumerate() {
        let kind = parse(text);
        let before = receiver.envelopes(field).len();
        sim.fire_event(Event { name: format!("case-{i}"), at_ms: 0, kind }).expect("valid event");
        wait_until(Duration::from_secs(5), || async { receiver.envelopes(field).len() > before }).await;
        let env = receiver.envelopes(field).remove(before);
        check_envelope(&env, field, WABA);
        let value = &env["entry"][0]["changes"][0]["value"];
        same_shape(example, value, field).unwrap_or_else(|e| panic!("case {i}: {e}\n{value}"));
        for key in exact {
            assert_eq!(value[*key], example[*key], "case {i} {field}.{key}");
        }
    }
    // The notice carries a timestamp a day ahead; user_preferences carries the preference as given.
    let notice = &receiver.values("template_category_update")[0];
    let ahead = notice["category_update_timestamp"].as_u64().expect("unix s") - bw_meta_sim::ids::now_ms() / 1000;
    assert!((86_000..=86_400).contains(&ahead), "24 h notice: {ahead}");
    let pref = &receiver.values("user_preferences")[0]["user_preferences"][0];
    assert_eq!((&pref["value"], &pref["category"]), (&json!("stop"), &json!("marketing_messages")));
    assert!(receiver.all().iter().all(|r| signed(SECRET, r)), "every webhook is signed with the app secret");
    let fired = sim.account_state().events;
    assert_eq!(fired.len(), cases.len());
    wait_until(Duration::from_secs(5), || async {
        sim.counters().webhooks.fields_delivered.values().sum::<u64>() == cases.len() as u64
    })
    .await;
}

#[tokio::test]
async fn value_errors_inbound_errors_and_raw_fields_are_delivered() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |_| {}).await;
    sim.set_scenario(events(vec![
        (
            0,
            parse(
                r#"
            kind = "value_errors"
            phone_number_id = "106540352242922"
            errors = [{ code = 130429, details = "Too many messages in a short time" }]
        "#,
            ),
        ),
        (
            0,
            parse(
                r#"
            kind = "inbound"
            phone_number_id = "106540352242922"
            from = "+16505551234"
            error_code = 131052
        "#,
            ),
        ),
        (
            0,
            parse(
                r#"
            kind = "raw"
            field = "business_username_update"
            value = { status = "approved", username = "@shop" }
        "#,
            ),
        ),
    ]));
    wait_until(Duration::from_secs(5), || async { receiver.accepted().len() >= 3 }).await;
    // §2.1: system, app or account errors in entry[].changes[].value.errors[] (Meta's example).
    let example = json!({"messaging_product":"whatsapp","metadata":{"display_phone_number":"15550783881",
        "phone_number_id":"106540352242922"},
        "errors":[{"code":130429,"title":"Rate limit hit","message":"Rate limit hit",
        "error_data":{"details":"Too many messages in a short time"},
        "href":"/documentation/business-messaging/whatsapp/support/error-codes"}]});
    let values = receiver.values("messages");
    let errors = values.iter().find(|v| v.get("errors").is_some()).expect("value-level errors");
    same_shape(&example, errors, "value").expect("the reference's shape");
    assert_eq!(
        (&errors["errors"][0]["code"], &errors["errors"][0]["title"]),
        (&json!(130429), &json!("Rate limit hit"))
    );
    assert_eq!(errors["errors"][0]["error_data"], example["errors"][0]["error_data"]);
    let inbound = values.iter().find(|v| v.get("messages").is_some()).expect("inbound");
    let m = &inbound["messages"][0];
    assert_eq!((&m["type"], &m["errors"][0]["code"]), (&json!("unsupported"), &json!(131052)));
    assert!(m["from_user_id"].is_string() && m["from"] == "16505551234");
    let raw = receiver.wait_field("business_username_update").await;
    assert_eq!(raw["entry"][0]["changes"][0]["value"]["username"], "@shop");
    wait_until(Duration::from_secs(5), || async { sim.counters().webhooks.inbound_delivered == 1 }).await;
    let delivered = sim.counters().webhooks.fields_delivered;
    assert_eq!((delivered.get("messages"), delivered.get("business_username_update")), (Some(&1), Some(&1)));
}

#[tokio::test]
async fn a_restriction_refuses_business_initiated_sends_of_its_waba_until_its_expiration() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |_| {}).await;
    let client = client(Duration::from_secs(5));
    // A user who wrote in: replies to them are customer-initiated and keep flowing.
    assert!(sim.inject_inbound(PHONE, &recipient(9), "Ana", "hi").is_some());
    sim.set_scenario(events(vec![(
        0,
        parse("kind = \"account_update\"\nevent = \"ACCOUNT_RESTRICTION\"\nexpires_in_ms = 1500"),
    )]));
    let env = receiver.wait_field("account_update").await;
    let expiration = env["entry"][0]["changes"][0]["value"]["restriction_info"][0]["expiration"].as_u64().expect("s");
    let a = send(&client, &sim, &recipient(1), None).await.expect("answered");
    assert_eq!((a.status, a.code()), (403, 368), "business-initiated send of the restricted WABA");
    assert_eq!(send(&client, &sim, &recipient(9), None).await.expect("answered").code(), 0, "a reply in the window");
    let other = send_from(&client, &sim, OTHER_WABA_NUMBER, TOKEN, &recipient(1), None).await.expect("answered");
    assert_eq!(other.code(), 0, "another WABA is untouched");
    assert_eq!(sim.counters().account_state("368"), 1, "counted as announced state the sender ignored");
    let state = sim.account_state();
    assert_eq!(state.wabas[WABA].restrictions[0].restriction_type, "RESTRICTED_BIZ_INITIATED_MESSAGING");
    // The restriction ends at its expiration (whole seconds, rounded up: never before the webhook's time).
    let until = state.wabas[WABA].restrictions[0].until_unix_ms.expect("an end");
    assert!(expiration * 1000 >= until, "the webhook's expiration is not before the real end");
    wait_until(Duration::from_secs(5), || async { !sim.account_state().wabas.contains_key(WABA) }).await;
    assert_eq!(send(&client, &sim, &recipient(2), None).await.expect("answered").code(), 0, "expired");
}

#[tokio::test]
async fn a_ban_stops_the_waba_and_a_reinstatement_resumes_it() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |_| {}).await;
    let client = client(Duration::from_secs(5));
    let ban = parse(
        r#"
        kind = "account_update"
        event = "DISABLED_UPDATE"
        ban_state = "DISABLE"
    "#,
    );
    sim.fire_event(Event { name: "ban".into(), at_ms: 0, kind: ban }).expect("valid");
    assert_eq!(send(&client, &sim, &recipient(1), None).await.expect("answered").code(), 131031);
    assert!(sim.inject_inbound(PHONE, &recipient(2), "Ana", "hi").is_some());
    assert_eq!(send(&client, &sim, &recipient(2), None).await.expect("answered").code(), 131031, "replies too");
    assert_eq!(send_from(&client, &sim, OTHER_WABA_NUMBER, TOKEN, &recipient(1), None).await.expect("ok").code(), 0);
    let back = parse(
        r#"
        kind = "account_update"
        event = "DISABLED_UPDATE"
        ban_state = "REINSTATE"
    "#,
    );
    sim.fire_event(Event { name: "reinstate".into(), at_ms: 0, kind: back }).expect("valid");
    assert_eq!(send(&client, &sim, &recipient(3), None).await.expect("answered").code(), 0, "reinstated");
    wait_until(Duration::from_secs(5), || async { receiver.envelopes("account_update").len() == 2 }).await;
    let mut states: Vec<String> = receiver
        .values("account_update")
        .iter()
        .map(|v| v["ban_info"]["waba_ban_state"].as_str().unwrap_or_default().to_string())
        .collect();
    states.sort();
    assert_eq!(states, vec!["DISABLE", "REINSTATE"], "webhooks may arrive in any order");
    // Announce only: the webhook, no effect.
    let quiet = parse("kind = \"account_update\"\nevent = \"DISABLED_UPDATE\"\neffect = false");
    sim.fire_event(Event { name: "quiet".into(), at_ms: 0, kind: quiet }).expect("valid");
    assert_eq!(send(&client, &sim, &recipient(4), None).await.expect("answered").code(), 0);
}

#[tokio::test]
async fn template_status_events_pause_and_release_only_that_template() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |cfg| cfg.templates.push(tpl("promo", None, "MARKETING"))).await;
    let client = client(Duration::from_secs(5));
    let send_tpl = |name: &'static str, lang: &'static str, n: u32| {
        let (client, sim) = (&client, &sim);
        async move {
            let body = template(&recipient(n), name, lang, None);
            post_from(client, sim, PHONE, TOKEN, &body).await.expect("ok")
        }
    };
    let status = |event: &str| {
        let kind = parse(&format!(
            r#"
                kind = "message_template_status_update"
                template = "promo"
                event = "{event}"
            "#
        ));
        Event { name: event.into(), at_ms: 0, kind }
    };
    sim.fire_event(status("PAUSED")).expect("valid");
    let a = send_tpl("promo", "en_US", 1).await;
    assert_eq!((a.status, a.code()), (400, 132015));
    assert_eq!(send_tpl("promo", "es_AR", 2).await.code(), 0, "another language of the name");
    assert_eq!(send_tpl("welcome", "en_US", 3).await.code(), 0, "another template");
    sim.fire_event(status("APPROVED")).expect("valid");
    assert_eq!(send_tpl("promo", "en_US", 4).await.code(), 0, "released");
    sim.fire_event(status("DISABLED")).expect("valid");
    assert_eq!(send_tpl("promo", "en_US", 5).await.code(), 132016);
    sim.fire_event(status("REJECTED")).expect("valid");
    assert_eq!(send_tpl("promo", "en_US", 6).await.code(), 132001);
    let c = sim.counters();
    assert_eq!((c.account_state("132015"), c.account_state("132016"), c.account_state("132001")), (1, 1, 1));
    let t = sim.account_state().templates.into_iter().find(|t| t.language.as_deref() == Some("en_US")).expect("state");
    assert_eq!((t.name.as_str(), t.status.as_str(), t.category.as_str()), ("promo", "REJECTED", "MARKETING"));
    wait_until(Duration::from_secs(5), || async { receiver.envelopes("message_template_status_update").len() == 4 })
        .await;
    let values = receiver.values("message_template_status_update");
    let disabled = values.iter().find(|v| v["event"] == "DISABLED").expect("the DISABLED webhook");
    assert_eq!((&disabled["event"], &disabled["other_info"]["title"]), (&json!("DISABLED"), &json!("DISABLED")));
    assert!(disabled["disable_info"]["disable_date"].is_u64());
}

#[tokio::test]
async fn a_stop_fails_marketing_to_that_user_with_131050_until_resume() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |cfg| {
        cfg.templates.push(tpl("promo", None, "MARKETING"));
        cfg.templates.push(tpl("receipt", None, "UTILITY"));
    })
    .await;
    let client = client(Duration::from_secs(5));
    let user = "+5491155550001";
    let pref = |value: &str| {
        let kind = parse(&format!(
            r#"
                kind = "user_preferences"
                phone_number_id = "{PHONE}"
                user = "{user}"
                value = "{value}"
            "#
        ));
        Event { name: value.into(), at_ms: 0, kind }
    };
    sim.fire_event(pref("stop")).expect("valid");
    let send_tpl = |name: &'static str, op: &'static str| {
        let (client, sim) = (&client, &sim);
        async move { post_from(client, sim, PHONE, TOKEN, &template(user, name, "en_US", Some(op))).await.expect("ok") }
    };
    assert_eq!(send_tpl("promo", "op-stopped").await.code(), 0, "accepted: the failure arrives by webhook");
    assert_eq!(send_tpl("receipt", "op-utility").await.code(), 0);
    sim.fire_event(pref("resume")).expect("valid");
    assert_eq!(send_tpl("promo", "op-resumed").await.code(), 0);
    wait_until(Duration::from_secs(5), || async { receiver.statuses().len() >= 7 }).await;
    let statuses = receiver.statuses();
    let of = |op: &str| -> Vec<String> {
        statuses
            .iter()
            .filter(|s| s["biz_opaque_callback_data"] == op)
            .map(|s| s["status"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(of("op-stopped"), vec!["failed"]);
    let failed = statuses.iter().find(|s| s["biz_opaque_callback_data"] == "op-stopped").expect("failed");
    assert_eq!(failed["errors"][0]["code"], 131050);
    assert_eq!(of("op-utility"), vec!["sent", "delivered", "read"], "utility templates still flow");
    assert_eq!(of("op-resumed"), vec!["sent", "delivered", "read"]);
    assert_eq!(sim.counters().async_failed_for(FailureCause::Account, 131050), 1);
}

#[tokio::test]
async fn a_throughput_upgrade_raises_the_numbers_limit_after_its_maintenance() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |cfg| {
        cfg.limits = Limits { throughput_mps: 0.01, throughput_burst: 1, pair_enabled: false, ..Limits::default() };
    })
    .await;
    let client = client(Duration::from_secs(5));
    assert_eq!(send(&client, &sim, &recipient(1), None).await.expect("answered").code(), 0);
    assert_eq!(send(&client, &sim, &recipient(2), None).await.expect("answered").code(), 130429, "0.01 mps");
    let upgrade = parse(&format!(
        r#"
            kind = "phone_number_quality_update"
            phone_number_id = "{PHONE}"
            throughput_mps = 1000.0
            maintenance_ms = 300
        "#
    ));
    sim.fire_event(Event { name: "upgrade".into(), at_ms: 0, kind: upgrade }).expect("valid");
    let a = send(&client, &sim, &recipient(3), None).await.expect("answered");
    assert_eq!((a.status, a.code()), (503, 131057), "maintenance during the upgrade");
    let env = receiver.wait_field("phone_number_quality_update").await;
    assert_eq!(env["entry"][0]["changes"][0]["value"]["event"], "THROUGHPUT_UPGRADE");
    assert_eq!(sim.throughput_mps(PHONE), 1000.0, "the limit follows the upgrade");
    assert_eq!(sim.throughput_mps(OTHER_WABA_NUMBER), 0.01, "other numbers keep theirs");
    // At 0.01 mps the next slot was 100 s away; at 1,000 mps it is open now.
    assert_eq!(send(&client, &sim, &recipient(10), None).await.expect("answered").code(), 0);
    assert_eq!(sim.counters().account_state("131057"), 1);
}

/// A number outside the US (marketing templates to US numbers are not delivered).
fn ar(n: u32) -> String {
    format!("+54911555{n:05}")
}

#[tokio::test]
async fn echoes_use_the_pair_limit_of_a_coexistence_number() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |cfg| {
        cfg.limits = Limits { pair_interval_ms: 60_000, pair_burst: 1, ..Limits::default() };
    })
    .await;
    let client = client(Duration::from_secs(5));
    let echo = parse(&format!(
        r#"
            kind = "smb_message_echoes"
            phone_number_id = "{PHONE}"
            to = "{}"
        "#,
        recipient(1)
    ));
    sim.fire_event(Event { name: "echo".into(), at_ms: 0, kind: echo }).expect("valid");
    assert_eq!(
        send(&client, &sim, &recipient(1), None).await.expect("answered").code(),
        131056,
        "the app used the pair"
    );
    assert_eq!(send(&client, &sim, &recipient(2), None).await.expect("answered").code(), 0);
    let env = receiver.wait_field("smb_message_echoes").await;
    assert_eq!(env["entry"][0]["changes"][0]["value"]["message_echoes"][0]["to"], recipient(1));
}

#[tokio::test]
async fn a_category_change_applies_marketing_rules_to_the_template() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |cfg| cfg.templates.push(tpl("welcome_template", None, "UTILITY"))).await;
    let client = client(Duration::from_secs(5));
    // A utility template moved to marketing: a user's stop now applies to it, and statuses price it as marketing.
    let stop = parse(&format!(
        r#"
            kind = "user_preferences"
            phone_number_id = "{PHONE}"
            user = "{}"
            value = "stop"
        "#,
        ar(3)
    ));
    sim.fire_event(Event { name: "stop".into(), at_ms: 0, kind: stop }).expect("valid");
    let body = template(&ar(3), "welcome_template", "en_US", Some("op-before"));
    assert_eq!(post_from(&client, &sim, PHONE, TOKEN, &body).await.expect("ok").code(), 0);
    let change = parse(
        r#"
            kind = "template_category_update"
            template = "welcome_template"
            new_category = "MARKETING"
        "#,
    );
    sim.fire_event(Event { name: "recategorised".into(), at_ms: 0, kind: change }).expect("valid");
    let body = template(&ar(4), "welcome_template", "en_US", Some("op-marketing"));
    assert_eq!(post_from(&client, &sim, PHONE, TOKEN, &body).await.expect("ok").code(), 0);
    let body = template(&ar(3), "welcome_template", "en_US", Some("op-after"));
    assert_eq!(post_from(&client, &sim, PHONE, TOKEN, &body).await.expect("ok").code(), 0);
    // Marketing to a US number is not delivered (reference §7): it fails with the configured code.
    let body = template(&recipient(5), "welcome_template", "en_US", Some("op-us"));
    assert_eq!(post_from(&client, &sim, PHONE, TOKEN, &body).await.expect("ok").code(), 0);
    wait_until(Duration::from_secs(5), || async {
        let s = receiver.statuses();
        let has =
            |op: &str, status: &str| s.iter().any(|s| s["biz_opaque_callback_data"] == op && s["status"] == status);
        has("op-after", "failed") && has("op-us", "failed") && has("op-marketing", "sent") && has("op-before", "sent")
    })
    .await;
    let statuses = receiver.statuses();
    let first = |op: &str| statuses.iter().find(|s| s["biz_opaque_callback_data"] == op).cloned().expect("status");
    assert_eq!(first("op-before")["pricing"]["category"], "utility", "a utility template ignores a marketing stop");
    assert_eq!(first("op-marketing")["pricing"]["category"], "marketing");
    assert_eq!(first("op-after")["errors"][0]["code"], 131050, "marketing rules now apply");
    assert_eq!(first("op-us")["errors"][0]["code"], 131049);
    let c = sim.counters();
    assert_eq!(
        (c.async_failed_for(FailureCause::Account, 131050), c.async_failed_for(FailureCause::Account, 131049)),
        (1, 1)
    );
}

#[tokio::test]
async fn events_fire_on_the_scenario_clock_and_through_the_admin_api() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |_| {}).await;
    let client = client(Duration::from_secs(5));
    let toml = format!(
        r#"
        name = "account-timeline"
        [[events]]
        name = "alert-later"
        at_ms = 300
        kind = "account_alerts"
        alert_type = "OBA_APPROVED"
        entity_type = "PHONE_NUMBER"
        entity_id = "{PHONE}"
    "#
    );
    let r = client.post(format!("{}/_sim/scenario", sim.base_url())).body(toml).send().await.expect("answers");
    assert_eq!(r.status().as_u16(), 200);
    let env = receiver.wait_field("account_alerts").await;
    assert!(sim.scenario_elapsed_ms() >= 300, "fired at its offset");
    assert_eq!(env["entry"][0]["changes"][0]["value"]["alert_info"]["alert_type"], "OBA_APPROVED");
    assert_eq!(sim.account_state().events[0].name, "alert-later");

    // The admin API: JSON (one event or a list) or TOML; bad events are refused with the key named.
    let one = json!({ "kind": "business_capability_update", "max_daily_conversations_per_business": 10000 });
    let r = client.post(format!("{}/_sim/events", sim.base_url())).json(&one).send().await.expect("answers");
    assert_eq!(r.json::<Value>().await.expect("json")["scheduled"], 1);
    wait_until(Duration::from_secs(5), || async {
        sim.account_state().portfolios.get("506914307656634").is_some_and(|p| p.tier == Tier(Some(10_000)))
    })
    .await;
    let bad = json!({ "kind": "account_update", "event": "ACCOUNT_RESTRICTED" });
    let r = client.post(format!("{}/_sim/events", sim.base_url())).json(&bad).send().await.expect("answers");
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().await.expect("body").contains("ACCOUNT_RESTRICTION"), "lists the allowed values");
    let r = client
        .post(format!("{}/_sim/events", sim.base_url()))
        .body("[[events]]\nkind = \"user_preferences\"\nphone_number_id = \"1\"\nvalue = \"stop\"\n")
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status().as_u16(), 400, "a preference names its user");
    let state: Value =
        client.get(format!("{}/_sim/state", sim.base_url())).send().await.expect("answers").json().await.expect("json");
    assert_eq!(state["portfolios"]["506914307656634"]["tier"], "TIER_10K");
    // Replacing the scenario cancels its pending events and resets the announced state.
    sim.set_scenario(events(vec![(
        60_000,
        parse(
            r#"
        kind = "account_update"
        event = "DISABLED_UPDATE"
    "#,
        ),
    )]));
    sim.clear_scenario();
    assert!(sim.account_state().portfolios.get("506914307656634").is_none_or(|p| p.tier == Tier::UNLIMITED));
}

#[tokio::test]
async fn paced_templates_hold_messages_until_released_or_dropped_by_a_pause() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |cfg| cfg.templates.push(tpl("promo", None, "MARKETING"))).await;
    let client = client(Duration::from_secs(5));
    let pacing = |action: &str| {
        let kind = parse(&format!(
            r#"
            kind = "template_pacing"
            template = "promo"
            action = "{action}"
        "#
        ));
        Event { name: action.into(), at_ms: 0, kind }
    };
    let send_tpl = |op: &'static str, n: u32| {
        let (client, sim) = (&client, &sim);
        async move {
            let body = template(&ar(n), "promo", "en_US", Some(op));
            post_from(client, sim, PHONE, TOKEN, &body).await.expect("ok")
        }
    };
    sim.fire_event(pacing("hold")).expect("valid");
    let a = send_tpl("op-held-1", 1).await;
    assert_eq!(a.body["messages"][0]["message_status"], "held_for_quality_assessment");
    let b = send_tpl("op-held-2", 2).await;
    assert_eq!(b.body["messages"][0]["message_status"], "held_for_quality_assessment");
    assert_eq!(sim.counters().held_for_quality, 2);
    let t = sim.account_state().templates.into_iter().find(|t| t.language.is_some()).expect("state");
    assert_eq!((t.paced, t.held), (true, 2));
    // Good feedback: the held messages are sent and delivered.
    sim.fire_event(pacing("release")).expect("valid");
    wait_until(Duration::from_secs(5), || async {
        receiver.statuses().iter().filter(|s| s["status"] == "read").count() == 2
    })
    .await;
    // Held again, then bad feedback: the template is paused and the held message fails with 132015.
    sim.fire_event(pacing("hold")).expect("valid");
    assert_eq!(send_tpl("op-held-3", 3).await.body["messages"][0]["message_status"], "held_for_quality_assessment");
    let pause = parse(
        r#"
        kind = "message_template_status_update"
        template = "promo"
        event = "PAUSED"
    "#,
    );
    sim.fire_event(Event { name: "pause".into(), at_ms: 0, kind: pause }).expect("valid");
    wait_until(Duration::from_secs(5), || async {
        receiver.statuses().iter().any(|s| s["biz_opaque_callback_data"] == "op-held-3")
    })
    .await;
    let dropped: Vec<serde_json::Value> =
        receiver.statuses().into_iter().filter(|s| s["biz_opaque_callback_data"] == "op-held-3").collect();
    assert_eq!(dropped.len(), 1);
    assert_eq!((&dropped[0]["status"], &dropped[0]["errors"][0]["code"]), (&json!("failed"), &json!(132015)));
    assert_eq!(send_tpl("op-after-pause", 4).await.code(), 132015, "a paused template refuses sends");
    assert_eq!(sim.counters().async_failed_for(FailureCause::Account, 132015), 1);
    assert!(sim.oracle().failed.iter().any(|f| f.operation_id.as_deref() == Some("op-held-3")));
}

#[tokio::test]
async fn system_messages_announce_a_changed_number_or_user_id() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |_| {}).await;
    let client = client(Duration::from_secs(5));
    let changed = parse(&format!(
        r#"
            kind = "system"
            phone_number_id = "{PHONE}"
            system_type = "user_changed_number"
            from = "{}"
            new_phone = "{}"
        "#,
        ar(1),
        ar(2)
    ));
    sim.fire_event(Event { name: "changed".into(), at_ms: 0, kind: changed }).expect("valid");
    wait_until(Duration::from_secs(5), || async { !receiver.values("messages").is_empty() }).await;
    let value = receiver.values("messages").remove(0);
    assert!(value.get("contacts").is_none(), "system webhooks have no contacts array");
    let m = &value["messages"][0];
    assert_eq!((&m["type"], &m["system"]["type"]), (&json!("system"), &json!("user_changed_number")));
    assert_eq!(m["system"]["wa_id"], "5491155500002");
    let new_id = m["system"]["user_id"].as_str().expect("new user id").to_string();
    assert!(bw_meta_sim::ids::is_user_id(&new_id) && m["system"]["previous_user_id"] != new_id.as_str());
    // The new id addresses the new phone.
    let body = json!({ "messaging_product": "whatsapp", "recipient": new_id, "type": "text", "text": { "body": "hi" },
        "biz_opaque_callback_data": "op-new-id" });
    assert_eq!(post(&client, &sim, &body, Some(TOKEN)).await.expect("answered").status, 200);
    let entry = sim.oracle().get("op-new-id").cloned().expect("accepted");
    assert_eq!(entry.recipient_key, bw_meta_sim::ids::recipient_key(&ar(2)));
    let bad = parse(&format!(
        r#"
            kind = "system"
            phone_number_id = "{PHONE}"
            system_type = "user_changed_number"
            from = "{}"
        "#,
        ar(1)
    ));
    assert!(
        sim.fire_event(Event { name: "bad".into(), at_ms: 0, kind: bad })
            .expect_err("no new phone")
            .contains("new_phone")
    );
}

#[tokio::test]
async fn hostile_offsets_and_delays_do_not_break_the_simulator() {
    let receiver = Receiver::start(0).await;
    let sim = sim_with(&receiver, |_| {}).await;
    let client = client(Duration::from_secs(5));
    let toml = format!(
        r#"
        [[events]]
        at_ms = {max}
        kind = "account_update"
        event = "ACCOUNT_RESTRICTION"
        expires_in_ms = {max}
        [[events]]
        kind = "phone_number_quality_update"
        phone_number_id = "{PHONE}"
        maintenance_ms = {max}
        [[injections]]
        code = 131000
        mode = "async"
        start_ms = 0
        duration_ms = {max}
        delay_ms = {max}
        max = 1
        [[injections]]
        code = 80007
        duration_ms = {max}
        phone_number_ids = ["{OTHER_WABA_NUMBER}"]
        "#,
        max = i64::MAX
    );
    let r = client.post(format!("{}/_sim/scenario", sim.base_url())).body(toml).send().await.expect("answers");
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap_or_default());
    let a = send_from(&client, &sim, OTHER_WABA_NUMBER, TOKEN, &recipient(1), Some("op-never")).await.expect("ok");
    assert_eq!(a.status, 200, "accepted; its failure is decades away");
    let a = send_from(&client, &sim, OTHER_WABA_NUMBER, TOKEN, &recipient(2), None).await.expect("answered");
    assert_eq!(a.code(), 80007, "a span that ends decades from now");
    wait_until(Duration::from_secs(5), || async {
        sim.account_state().numbers.get(PHONE).is_some_and(|n| n.maintenance_until_unix_ms.is_some())
    })
    .await;
    let a = send(&client, &sim, &recipient(3), None).await.expect("answered");
    assert_eq!(a.code(), 131057, "maintenance that ends decades from now");
    let health = client.get(format!("{}/_sim/health", sim.base_url())).send().await.expect("answers");
    assert_eq!(health.status().as_u16(), 200);
}
