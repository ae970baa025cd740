//! Account signals: webhook fields beyond `messages` are stored before the 200, published as typed
//! `AccountSignal`s on BW_ACCOUNT, an unknown field is stored and counted, and a malformed one is kept raw with a
//! precise error, never a 500.

use crate::support::{APP_SECRET, Env, WAIT, start};
use bw_ingest::webhook::sign;
use bw_proto::v1::account_signal::Kind;
use bw_proto::v1::{AccountSignal, RejectedRequest};
use bw_wire::names;
use prost::Message as _;

const WABA: &str = "102290129340398";

async fn post_signed(env: &Env, body: &str) -> u16 {
    crate::support::http_client()
        .post(env.url("/webhooks/meta"))
        .header("content-type", "application/json")
        .header("X-Hub-Signature-256", sign(APP_SECRET.as_bytes(), body.as_bytes()))
        .body(body.to_string())
        .send()
        .await
        .expect("post")
        .status()
        .as_u16()
}

fn change(field: &str, value: serde_json::Value) -> String {
    serde_json::json!({"object": "whatsapp_business_account",
        "entry": [{"id": WABA, "time": 1731705721, "changes": [{"field": field, "value": value}]}]})
    .to_string()
}

async fn signal(env: &Env, field: &str) -> AccountSignal {
    let stream = env.js.get_stream(names::ACCOUNT_STREAM).await.expect("BW_ACCOUNT exists");
    let subject = names::account_subject(field, WABA);
    let found =
        bw_testkit::wait_until(WAIT, || async { stream.get_last_raw_message_by_subject(&subject).await.is_ok() }).await;
    assert!(found, "a signal on {subject}");
    let msg = env.last(names::ACCOUNT_STREAM, &subject).await;
    AccountSignal::decode(msg.payload.as_ref()).expect("AccountSignal")
}

async fn wait_metric(env: &Env, line: &str) -> bool {
    bw_testkit::wait_until(WAIT, || async { env.metrics_text().contains(line) }).await
}

#[tokio::test]
async fn restriction_unknown_and_malformed_fields_are_stored_published_and_counted() {
    let env = start(|_| {}).await;
    let restriction = change(
        "account_update",
        serde_json::json!({"event": "ACCOUNT_RESTRICTION", "restriction_info": [{
            "restriction_type": "RESTRICTED_BIZ_INITIATED_MESSAGING", "expiration": 1641330498}]}),
    );
    assert_eq!(post_signed(&env, &restriction).await, 200);
    let s = signal(&env, "account_update").await;
    assert_eq!((s.waba_id.as_str(), s.meta_time_unix_s), (WABA, 1731705721));
    match s.kind {
        Some(Kind::Restriction(r)) => assert_eq!(r.expiration_unix_s, 1641330498),
        other => panic!("a restriction, got {other:?}"),
    }
    assert!(wait_metric(&env, r#"bw_webhook_fields_total{field="account_update",result="published"} 1"#).await);
    // Meta delivers it again: the same message id, one signal.
    assert_eq!(post_signed(&env, &restriction.replace("\"time\":", "\"time\" :")).await, 200);
    assert!(wait_metric(&env, r#"bw_webhooks_processed_total{result="ok"} 2"#).await, "{}", env.metrics_text());
    assert_eq!(env.count(names::ACCOUNT_STREAM).await, 1);

    // An unknown field: 200, a signal with its keys, the raw value kept, counted.
    let unknown = change("business_username_update", serde_json::json!({"status": "approved", "username": "@shop"}));
    assert_eq!(post_signed(&env, &unknown).await, 200);
    let s = signal(&env, "business_username_update").await;
    assert!(matches!(s.kind, Some(Kind::Unknown(u)) if u.value_keys == ["status", "username"]));
    assert!(wait_metric(&env, r#"bw_webhook_fields_total{field="business_username_update",result="unknown"} 1"#).await);

    // A malformed change beside a good one: the good one goes through, the bad one is kept with its path.
    let body = serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": WABA, "changes": [
        {"field": "user_preferences",
         "value": {"user_preferences": [{"wa_id": {"n": "16505551234"}, "value": "stop"}]}},
        {"field": "account_alerts", "value": {"entity_type": "BUSINESS", "entity_id": "506914307656634",
            "alert_info": {"alert_type": "OBA_APPROVED", "alert_severity": "INFORMATIONAL"}}}]}]})
    .to_string();
    assert_eq!(post_signed(&env, &body).await, 200);
    assert!(
        matches!(signal(&env, "account_alerts").await.kind, Some(Kind::Alert(a)) if a.alert_type == "OBA_APPROVED")
    );
    assert!(wait_metric(&env, r#"bw_webhook_fields_total{field="user_preferences",result="malformed"} 1"#).await);
    let kept = env.last(names::REJECTED_STREAM, &names::rejected_subject(bw_ingest::signals::REJECTED_SOURCE)).await;
    let kept = RejectedRequest::decode(kept.payload.as_ref()).expect("RejectedRequest");
    assert_eq!(kept.error, "webhook field `user_preferences`: `user_preferences[0].wa_id` is not a phone number");
    assert!(String::from_utf8_lossy(&kept.raw).contains("16505551234"), "the raw value is kept whole");

    // A value the typed envelope parser refuses (a string error code) beside a ban in the same delivery: the
    // delivery is kept in BW_REJECTED as before, and the ban is still published.
    let body = serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": WABA, "changes": [
        {"field": "messages", "value": {"errors": [{"code": "x16505551234"}]}},
        {"field": "account_update",
         "value": {"event": "DISABLED_UPDATE", "ban_info": {"waba_ban_state": "DISABLE"}}}]}]})
    .to_string();
    assert_eq!(post_signed(&env, &body).await, 200);
    let banned = || async { matches!(signal(&env, "account_update").await.kind, Some(Kind::Ban(_))) };
    assert!(bw_testkit::wait_until(WAIT, banned).await, "the ban is published");
    assert!(wait_metric(&env, r#"bw_webhooks_processed_total{result="bad_json"} 1"#).await);
    assert!(wait_metric(&env, r#"bw_webhook_fields_total{field="messages",result="malformed"} 1"#).await);
    env.stop().await;
}
