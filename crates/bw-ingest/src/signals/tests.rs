//! One real-shaped payload per field, from meta-cloud-api.md §4.5 (and §4.4 for value-level errors), plus the
//! hostile shapes: each malformed change names its path, echoes no value, and leaves the others parsed.

use super::*;

const WABA: &str = "102290129340398";

/// A delivery of one change, as Meta wraps it (§4.5 envelope).
fn body(field: &str, value: &str) -> Vec<u8> {
    format!(
        r#"{{"object":"whatsapp_business_account","entry":[{{"id":"{WABA}","time":1731705721,
        "changes":[{{"field":"{field}","value":{value}}}]}}]}}"#
    )
    .into_bytes()
}

fn kinds(field: &str, value: &str) -> Vec<Kind> {
    let out = extract(&body(field, value), "sha", 7).expect("parsed");
    assert!(out.kept.is_empty(), "nothing kept raw: {:?}", out.kept);
    for item in &out.items {
        assert_eq!(item.subject, format!("bw.account.v1.{field}.{WABA}"));
        assert_eq!(item.signal.field, field);
        assert_eq!(item.signal.waba_id, WABA);
        assert_eq!(item.signal.meta_time_unix_s, 1731705721);
        assert_eq!(item.signal.webhook_sha256, "sha");
    }
    out.items.into_iter().map(|i| i.signal.kind.expect("kind")).collect()
}

fn malformed(field: &str, value: &str) -> FieldError {
    let out = extract(&body(field, value), "sha", 7).expect("parsed");
    assert!(out.items.is_empty(), "no signal from a malformed change: {:?}", out.items);
    assert_eq!(out.kept.len(), 1);
    out.kept[0].error.clone().expect("an error")
}

#[test]
fn account_restriction_with_its_expiration() {
    let k = kinds(
        "account_update",
        r#"{"event":"ACCOUNT_RESTRICTION","restriction_info":[{"restriction_type":"RESTRICTED_BIZ_INITIATED_MESSAGING",
           "expiration":1641330498,"remediation":"Review the policy"}]}"#,
    );
    assert_eq!(
        k,
        vec![Kind::Restriction(AccountRestriction {
            restriction_type: "RESTRICTED_BIZ_INITIATED_MESSAGING".into(),
            expiration_unix_s: 1641330498,
            remediation: "Review the policy".into(),
        })]
    );
}

#[test]
fn ban_and_reinstatement_and_other_account_events() {
    let k = kinds(
        "account_update",
        r#"{"event":"DISABLED_UPDATE","ban_info":{"waba_ban_state":"DISABLE","waba_ban_date":"April 17, 2025"}}"#,
    );
    assert_eq!(k, vec![Kind::Ban(AccountBanState { ban_state: "DISABLE".into(), ban_date: "April 17, 2025".into() })]);
    let k = kinds("account_update", r#"{"event":"ACCOUNT_VIOLATION","violation_info":{"violation_type":"SPAM"}}"#);
    assert_eq!(k, vec![Kind::AccountEvent(AccountEvent { event: "ACCOUNT_VIOLATION".into(), detail: "SPAM".into() })]);
    let k = kinds("account_update", r#"{"event":"ACCOUNT_RESTRICTION"}"#);
    assert!(matches!(&k[..], [Kind::AccountEvent(e)] if e.event == "ACCOUNT_RESTRICTION"));
}

#[test]
fn capability_update_reads_every_tier_form() {
    let k = kinds(
        "business_capability_update",
        r#"{"max_daily_conversations_per_business":"TIER_2K","max_phone_numbers_per_waba":25}"#,
    );
    assert_eq!(
        k,
        vec![Kind::MessagingLimit(MessagingLimitChange {
            unique_users_per_24h: 2000,
            raw: "TIER_2K".into(),
            portfolio_id: String::new(),
            max_phone_numbers_per_waba: 25,
        })]
    );
    for (raw, users) in
        [("\"10000\"", 10_000), ("100000", 100_000), ("\"UNLIMITED\"", -1), ("-1", -1), ("\"TIER_250\"", 250)]
    {
        let k = kinds("business_capability_update", &format!(r#"{{"max_daily_conversations_per_business":{raw}}}"#));
        assert!(matches!(&k[..], [Kind::MessagingLimit(m)] if m.unique_users_per_24h == users), "{raw}: {k:?}");
    }
    let k = kinds("business_capability_update", r#"{"max_daily_conversations_per_business":"TIER_SOMETHING_NEW"}"#);
    assert!(matches!(&k[..], [Kind::MessagingLimit(m)] if m.unique_users_per_24h == 0), "kept, not applied");
}

#[test]
fn throughput_upgrade_and_the_tier_beside_it() {
    let k = kinds(
        "phone_number_quality_update",
        r#"{"display_phone_number":"15550783881","event":"THROUGHPUT_UPGRADE","current_limit":"TIER_UNLIMITED",
           "max_daily_conversations_per_business":"TIER_UNLIMITED"}"#,
    );
    assert_eq!(k.len(), 2);
    assert_eq!(
        k[0],
        Kind::Throughput(ThroughputChange {
            event: "THROUGHPUT_UPGRADE".into(),
            mps: 1000,
            current_limit: "TIER_UNLIMITED".into(),
            old_limit: String::new(),
        })
    );
    assert!(matches!(&k[1], Kind::MessagingLimit(m) if m.unique_users_per_24h == -1));
    // The display number is the business's own, and still never kept.
    let out = extract(
        &body("phone_number_quality_update", r#"{"display_phone_number":"15550783881","event":"ONBOARDING"}"#),
        "s",
        1,
    )
    .expect("parsed");
    assert!(!format!("{:?}", out.items).contains("15550783881"));
}

#[test]
fn account_alert() {
    let k = kinds(
        "account_alerts",
        r#"{"entity_type":"BUSINESS","entity_id":"506914307656634","alert_info":{"alert_severity":"WARNING",
           "alert_status":"ACTIVE","alert_type":"INCREASED_CAPABILITIES_ELIGIBILITY_DEFERRED",
           "alert_description":"Deferred"}}"#,
    );
    assert_eq!(
        k,
        vec![Kind::Alert(AccountAlert {
            entity_type: "BUSINESS".into(),
            entity_id: "506914307656634".into(),
            severity: "WARNING".into(),
            status: "ACTIVE".into(),
            alert_type: "INCREASED_CAPABILITIES_ELIGIBILITY_DEFERRED".into(),
            description: "Deferred".into(),
        })]
    );
}

#[test]
fn template_status_quality_and_category() {
    let k = kinds(
        "message_template_status_update",
        r#"{"event":"PAUSED","message_template_id":1689556908129832,"message_template_name":"order_confirmation",
           "message_template_language":"en-US","reason":"NONE","message_template_category":"MARKETING",
           "other_info":{"title":"FIRST_PAUSE","description":"Paused for low quality"}}"#,
    );
    assert_eq!(
        k,
        vec![Kind::TemplateStatus(TemplateStatusChange {
            event: "PAUSED".into(),
            template_id: 1689556908129832,
            template_name: "order_confirmation".into(),
            template_language: "en_US".into(),
            reason: "NONE".into(),
            category: "MARKETING".into(),
            other_title: "FIRST_PAUSE".into(),
        })]
    );
    let k = kinds(
        "message_template_quality_update",
        r#"{"previous_quality_score":"GREEN","new_quality_score":"YELLOW","message_template_id":806312974732579,
           "message_template_name":"welcome_template","message_template_language":"en-US"}"#,
    );
    assert!(
        matches!(&k[..], [Kind::TemplateQuality(q)] if q.new_quality == "YELLOW" && q.template_language == "en_US")
    );
    let k = kinds(
        "template_category_update",
        r#"{"message_template_id":278077987957091,"message_template_name":"welcome_template",
           "message_template_language":"en-US",
           "new_category":"UTILITY","correct_category":"MARKETING","category_update_timestamp":1746169200}"#,
    );
    assert!(matches!(&k[..], [Kind::TemplateCategory(c)]
        if c.correct_category == "MARKETING" && c.takes_effect_unix_s == 1746169200 && c.new_category == "UTILITY"));
    let k = kinds(
        "template_category_update",
        r#"{"message_template_id":278077987957091,"message_template_name":"welcome_template",
           "message_template_language":"en-US",
           "previous_category":"UTILITY","new_category":"MARKETING"}"#,
    );
    assert!(
        matches!(&k[..], [Kind::TemplateCategory(c)] if c.previous_category == "UTILITY" && c.takes_effect_unix_s == 0)
    );
}

#[test]
fn user_preferences_and_echoes_name_users_by_hash_only() {
    let value = r#"{"messaging_product":"whatsapp",
        "metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},
        "contacts":[{"wa_id":"16505551234","user_id":"US.13491208655302741918"}],
        "user_preferences":[{"wa_id":"16505551234","user_id":"US.13491208655302741918","category":"marketing_messages",
        "detail":"User requested to stop marketing messages","value":"stop","timestamp":1731705721}]}"#;
    let out = extract(&body("user_preferences", value), "s", 1).expect("parsed");
    let shown = format!("{:?}", out.items);
    assert!(!shown.contains("16505551234") && !shown.contains("13491208655302741918"), "{shown}");
    assert_eq!(out.items[0].signal.phone_number_id, "106540352242922");
    let k = kinds("user_preferences", value);
    assert_eq!(
        k,
        vec![Kind::UserPreference(UserPreference {
            recipient_key_hash: bw_common::mask::recipient_key("+16505551234"),
            category: "marketing_messages".into(),
            value: "stop".into(),
            timestamp_unix_s: 1731705721,
        })]
    );
    // A user-id-only preference is keyed by its id's hash.
    let k = kinds("user_preferences", r#"{"user_preferences":[{"user_id":"US.1349","value":"resume"}]}"#);
    assert!(matches!(&k[..], [Kind::UserPreference(p)] if p.recipient_key_hash.len() == 16 && p.value == "resume"));

    let echo = r#"{"messaging_product":"whatsapp","metadata":{"phone_number_id":"106540352242922"},
        "message_echoes":[{"from":"15550783881","to":"16505551234","id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBI",
        "timestamp":"1750030073",
        "type":"text","text":{"body":"We'll call you back"}}]}"#;
    let out = extract(&body("smb_message_echoes", echo), "s", 1).expect("parsed");
    let shown = format!("{:?}", out.items);
    assert!(!shown.contains("16505551234") && !shown.contains("wamid.") && !shown.contains("call you"), "{shown}");
    let k = kinds("smb_message_echoes", echo);
    assert!(matches!(&k[..], [Kind::Echo(e)]
        if e.recipient_key_hash == bw_common::mask::recipient_key("16505551234") && e.timestamp_unix_s == 1750030073));
}

#[test]
fn value_level_errors_of_any_field() {
    let k = kinds(
        "messages",
        r#"{"messaging_product":"whatsapp","metadata":{"phone_number_id":"106540352242922"},
           "errors":[{"code":130429,"title":"Rate limit hit","message":"Rate limit hit",
           "error_data":{"details":"Cloud API message throughput has been reached."},"href":"https://x"}]}"#,
    );
    assert_eq!(
        k,
        vec![Kind::ValueError(WebhookValueError {
            code: 130429,
            title: "Rate limit hit".into(),
            details: "Cloud API message throughput has been reached.".into(),
        })]
    );
    // A messages change without errors gives nothing here (statuses are the processor's).
    let out = extract(&body("messages", r#"{"statuses":[{"id":"w","status":"sent"}]}"#), "s", 1).expect("parsed");
    assert_eq!(out, Extracted::default());
}

#[test]
fn an_unknown_field_is_published_with_its_keys_and_kept_raw() {
    let out = extract(&body("business_username_update", r#"{"status":"approved","username":"@shop"}"#), "s", 1)
        .expect("parsed");
    assert_eq!(out.items.len(), 1);
    assert_eq!(
        out.items[0].signal.kind,
        Some(Kind::Unknown(UnknownWebhookField { value_keys: vec!["status".into(), "username".into()] }))
    );
    assert_eq!(out.kept.len(), 1);
    assert_eq!(out.kept[0].label, "business_username_update");
    assert!(out.kept[0].error.is_none());
    // A field nobody named is labelled `other`, and its hostile name never makes a subject token.
    let out = extract(&body("x.>*", r#"{"a":1}"#), "s", 1).expect("parsed");
    assert_eq!(out.kept[0].label, "other");
    assert_eq!(out.items[0].subject, format!("bw.account.v1._.{WABA}"));
}

#[test]
fn malformed_changes_name_their_path_and_never_echo_a_value() {
    let cases = [
        ("account_update", r#""a string""#, "value", "is not an object"),
        (
            "account_update",
            r#"{"event":"ACCOUNT_RESTRICTION","restriction_info":{"x":1}}"#,
            "restriction_info",
            "is not an array",
        ),
        (
            "account_update",
            r#"{"event":"ACCOUNT_RESTRICTION",
                "restriction_info":[{"restriction_type":"R","expiration":"+16505551234x"}]}"#,
            "restriction_info[0].expiration",
            "is not an integer or a string of digits",
        ),
        ("account_update", r#"{"event":"DISABLED_UPDATE"}"#, "ban_info", "is missing"),
        (
            "account_update",
            r#"{"event":"has space 16505551234"}"#,
            "event",
            "is not a word of [A-Za-z0-9_.-], 1-64 chars",
        ),
        (
            "business_capability_update",
            r#"{"max_daily_conversations_per_business":{"x":1}}"#,
            "max_daily_conversations_per_business",
            "is not a tier word or an integer",
        ),
        ("account_alerts", r#"{"entity_type":"BUSINESS"}"#, "alert_info", "is missing"),
        (
            "message_template_status_update",
            r#"{"event":"PAUSED"}"#,
            "message_template_id",
            "and message_template_name are both missing",
        ),
        (
            "user_preferences",
            r#"{"user_preferences":[{"value":"stop"}]}"#,
            "user_preferences[0].wa_id",
            "and user_id are both missing",
        ),
        (
            "user_preferences",
            r#"{"user_preferences":[{"wa_id":12,"value":"stop"}]}"#,
            "user_preferences[0].wa_id",
            "is not a phone number",
        ),
        ("smb_message_echoes", r#"{"message_echoes":"16505551234"}"#, "message_echoes", "is not an array"),
        ("messages", r#"{"errors":[{"title":"no code 16505551234"}]}"#, "errors[0].code", "is missing"),
    ];
    for (field, value, path, problem) in cases {
        let e = malformed(field, value);
        assert_eq!((e.path.as_str(), e.problem), (path, problem), "{field} {value}");
        assert!(!e.to_string().contains("16505551234"), "{e}");
    }
}

#[test]
fn one_bad_change_leaves_the_others_parsed_and_ids_are_stable() {
    let body = format!(
        r#"{{"object":"whatsapp_business_account","entry":[{{"id":"{WABA}","changes":[
          {{"field":"account_update","value":{{"event":"DISABLED_UPDATE"}}}},
          {{"field":"account_alerts","value":{{"alert_info":{{"alert_type":"OBA_APPROVED"}}}}}}]}}]}}"#
    );
    let a = extract(body.as_bytes(), "s", 1).expect("parsed");
    assert_eq!((a.items.len(), a.kept.len()), (1, 1));
    let b = extract(body.as_bytes(), "s", 2).expect("parsed");
    assert_eq!(a.items[0].msg_id, b.items[0].msg_id, "a repeat has the same message id");
    assert!(extract(b"[1", "s", 1).is_err());
}

#[test]
fn scrub_cuts_and_hides_digit_runs() {
    assert_eq!(scrub("call +1 6505551234 now, code 130429"), "call +1 <digits> now, code 130429");
    assert_eq!(scrub(&"a".repeat(500)).len(), 200);
    assert_eq!(bw_breaker::budget::tier_users("TIER_100K"), 100_000);
    assert_eq!(bw_breaker::budget::tier_users("nonsense"), 0);
}

#[test]
fn a_body_the_envelope_parser_refuses_never_echoes_a_number() {
    let bad = body("account_update", r#"{"errors":[{"code":"16505551234"}]}"#);
    let e = crate::webhook::parse(&bad).expect_err("a string code is refused by the typed parser");
    let text = e.to_string();
    assert!(text.contains("invalid type") && !text.contains("16505551234"), "{text}");
    // The signals parser reads Meta's digit-string integers, and names what is still wrong.
    let kept = extract(&bad, "s", 1).expect("parsed").kept;
    assert_eq!(
        kept[0].error.as_ref().map(|e| e.to_string()),
        Some("webhook field `account_update`: `event` is missing".into())
    );
}
