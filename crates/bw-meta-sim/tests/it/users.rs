//! Business-scoped user ids (reference §6, §4.4, §1): sends by `recipient`, user-id fields in answers and
//! statuses, user-id-only webhooks for users whose phone cannot be shared, and 131062 for OTP templates.

use crate::common::*;
use bw_meta_sim::{OtpType, SimConfig, TemplateConfig, UserConfig};
use serde_json::{Value, json};
use std::time::Duration;

const HIDDEN_PHONE: &str = "+16505551234";
const HIDDEN_ID: &str = "US.13491208655302741918";

fn cfg(receiver: &Receiver) -> SimConfig {
    let mut cfg = SimConfig { webhook: fast_webhook(&receiver.url), ..config() };
    cfg.users.push(UserConfig {
        phone: HIDDEN_PHONE.into(),
        user_id: Some(HIDDEN_ID.into()),
        username: Some("@sheena".into()),
        share_phone: false,
    });
    cfg.templates.push(TemplateConfig {
        name: "otp_login".into(),
        language: None,
        category: "AUTHENTICATION".into(),
        status: "APPROVED".into(),
        otp_type: Some(OtpType::CopyCode),
        id: None,
        paced: false,
    });
    cfg
}

fn by_id(user_id: &str, op: &str) -> Value {
    json!({
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "recipient": user_id,
        "type": "text",
        "text": { "body": "hello" },
        "biz_opaque_callback_data": op,
    })
}

fn statuses_of(receiver: &Receiver, op: &str) -> Vec<Value> {
    receiver.statuses().into_iter().filter(|s| s["biz_opaque_callback_data"] == op).collect()
}

#[tokio::test]
async fn a_user_id_send_is_answered_and_reported_with_user_ids_only() {
    let receiver = Receiver::start(0).await;
    let sim = start(cfg(&receiver)).await;
    let client = client(Duration::from_secs(5));
    let a = post(&client, &sim, &by_id(HIDDEN_ID, "op-bsuid"), Some(TOKEN)).await.expect("answered");
    assert_eq!(a.status, 200);
    // §1: input echoes the user id, user_id is returned, wa_id is omitted.
    assert_eq!(a.body["contacts"], json!([{ "input": HIDDEN_ID, "user_id": HIDDEN_ID }]));
    wait_until(Duration::from_secs(5), || async { statuses_of(&receiver, "op-bsuid").len() >= 3 }).await;
    for s in statuses_of(&receiver, "op-bsuid") {
        assert_eq!(s["recipient_user_id"], HIDDEN_ID);
        assert!(s.get("recipient_id").is_none(), "a phone that cannot be shared is absent");
    }
    // §4.4: contacts[] on sent/delivered/read with the user id; the username only on delivered and read.
    for body in receiver.accepted() {
        let value = &body["entry"][0]["changes"][0]["value"];
        let contacts = value["contacts"].as_array().expect("contacts block");
        let kinds: Vec<&str> =
            value["statuses"].as_array().expect("statuses").iter().filter_map(|s| s["status"].as_str()).collect();
        assert_eq!(contacts[0]["user_id"], HIDDEN_ID);
        assert!(contacts[0].get("wa_id").is_none());
        let username = contacts[0]["profile"]["username"].as_str();
        let later = kinds.iter().any(|k| *k != "sent");
        assert_eq!(username.is_some(), later, "{kinds:?}: the username only with delivered or read");
    }
    // Sends by phone and by id to the same person share one pair bucket and one oracle key.
    let snap = sim.oracle();
    let entry = snap.get("op-bsuid").expect("accepted");
    assert_eq!(entry.recipient_key, bw_meta_sim::ids::recipient_key(HIDDEN_PHONE));
}

#[tokio::test]
async fn phone_sends_carry_user_ids_except_on_failed_and_to_wins_over_recipient() {
    let receiver = Receiver::start(0).await;
    let mut c = cfg(&receiver);
    c.webhook.fail_recipients.insert(recipient(2), 131026);
    let sim = start(c).await;
    let client = client(Duration::from_secs(5));
    let mut both = by_id(HIDDEN_ID, "op-both");
    both["to"] = json!(recipient(1));
    let a = post(&client, &sim, &both, Some(TOKEN)).await.expect("answered");
    assert_eq!(a.body["contacts"][0]["wa_id"], "16505550001", "`to` wins: the phone form");
    assert!(a.body["contacts"][0].get("user_id").is_none());
    assert_eq!(send(&client, &sim, &recipient(2), Some("op-fails")).await.expect("answered").status, 200);
    let a = post(&client, &sim, &by_id("US.77777777777777777777", "op-unknown"), Some(TOKEN)).await.expect("ok");
    assert_eq!(a.status, 200, "an unknown user id is still a user");
    sim.set_scenario(bw_meta_sim::Scenario {
        injections: vec![bw_meta_sim::Injection {
            recipients: vec!["US.77777777777777777777".into()],
            ..bw_meta_sim::Injection::new(131026)
        }],
        ..bw_meta_sim::Scenario::default()
    });
    let a = post(&client, &sim, &by_id("US.77777777777777777777", "op-id-fails"), Some(TOKEN)).await.expect("ok");
    assert_eq!(a.status, 200);
    wait_until(Duration::from_secs(5), || async {
        statuses_of(&receiver, "op-both").len() >= 3
            && !statuses_of(&receiver, "op-fails").is_empty()
            && !statuses_of(&receiver, "op-id-fails").is_empty()
    })
    .await;
    let sent = &statuses_of(&receiver, "op-both")[0];
    assert_eq!(sent["recipient_id"], "16505550001");
    assert!(sent["recipient_user_id"].as_str().is_some_and(bw_meta_sim::ids::is_user_id), "derived user id");
    let failed = &statuses_of(&receiver, "op-fails")[0];
    assert_eq!(failed["status"], "failed");
    assert!(failed.get("recipient_user_id").is_none(), "absent on failed statuses of phone-addressed sends");
    let failed = &statuses_of(&receiver, "op-id-fails")[0];
    assert_eq!(failed["recipient_user_id"], "US.77777777777777777777", "present on failed user-id sends");
    assert!(failed.get("recipient_id").is_none());
    let snap = sim.oracle();
    assert_eq!(snap.get("op-unknown").expect("accepted").recipient_masked, "US.*****************777");
}

#[tokio::test]
async fn otp_templates_refuse_user_ids_with_131062_and_bad_ids_with_131009() {
    let receiver = Receiver::start(0).await;
    let sim = start(cfg(&receiver)).await;
    let client = client(Duration::from_secs(5));
    let mut otp = template(HIDDEN_PHONE, "otp_login", "en_US", None);
    assert_eq!(post(&client, &sim, &otp, Some(TOKEN)).await.expect("answered").code(), 0, "by phone: fine");
    otp.as_object_mut().expect("object").remove("to");
    otp["recipient"] = json!(HIDDEN_ID);
    let a = post(&client, &sim, &otp, Some(TOKEN)).await.expect("answered");
    assert_eq!((a.status, a.code()), (400, 131062));
    let a = post(&client, &sim, &by_id("+5491155551234", "op-bad"), Some(TOKEN)).await.expect("answered");
    assert_eq!(a.code(), 131009);
    assert!(!a.body.to_string().contains("5491155551234"), "the value is not echoed");
}

#[tokio::test]
async fn inbound_webhooks_can_carry_only_the_user_id_and_open_the_window_for_it() {
    let receiver = Receiver::start(0).await;
    let sim = start(cfg(&receiver)).await;
    let client = client(Duration::from_secs(5));
    // A configured user whose phone cannot be shared, and a phone hidden on request.
    for body in [
        json!({ "phone_number_id": PHONE, "from": HIDDEN_PHONE, "name": "Sheena",
            "text": "Does it come in another color?" }),
        json!({ "phone_number_id": PHONE, "from": recipient(3), "hide_phone": true, "text": "hi" }),
    ] {
        let r = client.post(format!("{}/_sim/inbound", sim.base_url())).json(&body).send().await.expect("answers");
        assert_eq!(r.status().as_u16(), 200);
    }
    wait_until(Duration::from_secs(5), || async { receiver.values("messages").len() >= 2 }).await;
    // §4.4 example with the phone fields absent (§6: wa_id and from may be absent).
    let example = json!({ "messaging_product": "whatsapp",
        "metadata": { "display_phone_number": "15550001234", "phone_number_id": PHONE },
        "contacts": [{ "profile": { "name": "Sheena Nelson", "username": "@sheena" },
            "user_id": "US.13491208655302741918" }],
        "messages": [{ "from_user_id": "US.13491208655302741918", "id": "wamid.HBgL...", "timestamp": "1749416383",
            "type": "text", "text": { "body": "Does it come in another color?" } }] });
    let values = receiver.values("messages");
    let sheena = values.iter().find(|v| v["messages"][0]["from_user_id"] == HIDDEN_ID).expect("user-id-only webhook");
    same_shape(&example, sheena, "value").expect("the reference's shape without the phone");
    let other = values.iter().find(|v| v["messages"][0]["from_user_id"] != HIDDEN_ID).expect("hidden phone");
    assert!(other["messages"][0].get("from").is_none() && other["contacts"][0].get("wa_id").is_none());
    let other_id = other["messages"][0]["from_user_id"].as_str().expect("a user id").to_string();
    // The user wrote: a reply by user id is inside the window, matched to the same person.
    let a = post(&client, &sim, &by_id(&other_id, "op-reply"), Some(TOKEN)).await.expect("answered");
    assert_eq!(a.status, 200);
    let snap = sim.oracle();
    assert_eq!(snap.get("op-reply").expect("accepted").recipient_key, bw_meta_sim::ids::recipient_key(&recipient(3)));
    // Without a phone or user id the admin call is refused precisely.
    let r = client
        .post(format!("{}/_sim/inbound", sim.base_url()))
        .json(&json!({ "phone_number_id": PHONE, "text": "hi" }))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status().as_u16(), 400);
}
