//! Recipients by business-scoped user id (reference §6), against the simulator with ingest and the dispatcher at
//! their compiled defaults: a request naming a user id is sent with Meta's `recipient` field, delivered once, and
//! matched by statuses that carry no phone number; an OTP template with a copy-code button sent to a user id is
//! refused by Meta with 131062, is quarantined and is never sent again.

use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::{OtpType, SimConfig, TemplateConfig, UserConfig};
use bw_proto::v1::*;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);
const PHONE: &str = "109000000071";
/// A user whose phone Meta may not share: every webhook about them carries only the user id.
const USER: &str = "BR.13491208655302741918";
/// A user the simulator has no phone for: its oracle shows the masked user id, which proves the `recipient` form.
const STRANGER: &str = "BR.99887766554433221100";

fn sim() -> SimConfig {
    SimConfig {
        users: vec![UserConfig {
            phone: "+5491166000071".into(),
            user_id: Some(USER.into()),
            username: Some("@cliente".into()),
            share_phone: false,
        }],
        templates: vec![TemplateConfig {
            name: "otp_login".into(),
            language: None,
            category: "AUTHENTICATION".into(),
            status: "APPROVED".into(),
            otp_type: Some(OtpType::CopyCode),
            id: None,
            paced: false,
        }],
        ..SimConfig::default()
    }
}

async fn submit(h: &Harness, op: &str, to: &str, template: &str, category: Category) {
    let request =
        bw_client::Request::template(op, WABA_ID, PHONE, to, template, "es_AR").param("1").category(category).build();
    let reply = h.producer().send(&request).await.expect("ingest answers");
    assert!(reply.accepted, "{}", reply.error);
}

#[tokio::test]
async fn a_user_id_recipient_is_sent_delivered_and_matched() {
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    bw_e2e::register_senders(&h.js, &[(PHONE, WABA_ID)]).await;

    submit(&h, "uid-1", STRANGER, "order_confirmation", Category::Transactional).await;
    assert!(h.wait_state("uid-1", &[OperationState::Delivered, OperationState::Read], WAIT).await);
    let oracle = h.sim.oracle();
    let sent = oracle.get("uid-1").expect("Meta accepted it");
    assert_eq!((sent.count, sent.delivered()), (1, 1), "sent and delivered once");
    // The simulator tells a `recipient` send by its masked form: the user id's country, never a phone.
    assert!(sent.recipient_masked.starts_with("BR."), "{}", sent.recipient_masked);
    assert!(!sent.recipient_masked.contains("1349120865530274"), "masked");
    let entry = h.ledger.get("uid-1").await.expect("ledger").expect("entry").entry;
    assert!(!entry.wamid.is_empty(), "the statuses (user id only) were matched to the operation");
}

#[tokio::test]
async fn an_otp_that_needs_a_phone_is_refused_131062_once() {
    let mut h = Harness::start(sim()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher_at_defaults().await;
    bw_e2e::register_senders(&h.js, &[(PHONE, WABA_ID)]).await;

    submit(&h, "uid-otp", USER, "otp_login", Category::Authentication).await;
    // A permanent refusal of that one message: quarantined for the operator, who can send it again to the phone.
    let held = h.wait_state("uid-otp", &[OperationState::Quarantined], WAIT).await;
    assert!(held, "{:?}", h.ledger.get("uid-otp").await.ok().flatten().map(|e| e.entry));
    let entry = h.ledger.get("uid-otp").await.expect("ledger").expect("entry").entry;
    assert_eq!(entry.last_code, 131062, "{}", entry.reason);
    assert_eq!(h.sim.oracle().get("uid-otp").map(|e| e.count).unwrap_or(0), 0, "Meta accepted no copy");
    // A later message of the same sender still goes: 131062 is about that message, not the number.
    submit(&h, "uid-2", USER, "order_confirmation", Category::Transactional).await;
    assert!(h.wait_state("uid-2", &[OperationState::Delivered, OperationState::Read], WAIT).await);
    assert_eq!(h.sim.oracle().get("uid-otp").map(|e| e.count).unwrap_or(0), 0, "never sent again");
}
