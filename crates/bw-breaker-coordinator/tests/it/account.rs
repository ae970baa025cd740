//! Meta's account signals on BW_ACCOUNT: a restriction pauses only its WABA until its expiration (source
//! "webhook", shown in the snapshots), a ban holds a WABA until the reinstatement lifts it, and both raise an
//! `account_restricted` signal for the alerting service.

use super::*;
use bw_proto::v1::account_signal::Kind;
use bw_proto::v1::{AccountBanState, AccountRestriction, AccountSignal, Signal};
use bw_wire::names;

async fn publish(h: &Harness, signal: AccountSignal, id: &str) {
    let subject = names::account_subject(&signal.field, &signal.waba_id);
    let ack = h.deps.js.publish_with_headers(subject, names::msg_id_headers(id), signal.encode_to_vec().into()).await;
    ack.expect("publish").await.expect("stored");
}

fn signal(waba: &str, kind: Kind) -> AccountSignal {
    AccountSignal { field: "account_update".into(), waba_id: waba.into(), kind: Some(kind), ..Default::default() }
}

/// The (level, source, until) of the scope's pauses, and its snapshot's reason.
async fn pauses(h: &Harness, phone: &str) -> Vec<(String, String, i64, String)> {
    kv_state(&h.deps, phone)
        .await
        .map(|s| s.pauses.into_iter().map(|p| (p.level, p.source, p.until_unix_ms, p.reason)).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_restriction_pauses_its_waba_until_expiration_and_a_ban_holds_until_reinstated() {
    let h = start().await;
    let dispatcher = h.client();
    let (a1, b1) = (Scope::new("w-a", "8001"), Scope::new("w-b", "8002"));
    for s in [&a1, &b1] {
        dispatcher.admit(s, &[AdmitItem { recipient_key: "r".into(), class: TrafficClass::Priority }]).await;
    }
    // Whole seconds, as Meta sends them; 3 s ahead so the pause is seen before it ends.
    let expiration = bw_common::time::now_ms() / 1000 + 3;
    let restriction = AccountRestriction {
        restriction_type: "RESTRICTED_BIZ_INITIATED_MESSAGING".into(),
        expiration_unix_s: expiration,
        remediation: String::new(),
    };
    publish(&h, signal("w-a", Kind::Restriction(restriction)), "r1").await;
    // The script counts the pause on Redis's clock from the length the coordinator computed on its own: the end
    // agrees with `expiration` to within the call's latency.
    let paused = || async {
        pauses(&h, "8001").await.first().is_some_and(|(level, source, until, reason)| {
            (level.as_str(), source.as_str(), reason.as_str())
                == ("waba", "webhook", "Meta account_update RESTRICTED_BIZ_INITIATED_MESSAGING")
                && (until - expiration * 1000).abs() < 1000
        })
    };
    assert!(bw_testkit::wait_until(WAIT, paused).await, "{:?}", pauses(&h, "8001").await);
    assert!(pauses(&h, "8002").await.is_empty(), "the other WABA is not paused");
    let stream = h.deps.js.get_stream(names::EVENTS_STREAM).await.expect("events");
    let alert =
        stream.get_last_raw_message_by_subject(&names::signal_subject("account_restricted")).await.expect("alert");
    let alert = Signal::decode(alert.payload.as_ref()).expect("Signal");
    assert_eq!(alert.waba_id, "w-a");
    // The pause ends at the expiration by itself.
    assert!(bw_testkit::wait_until(WAIT, || async { pauses(&h, "8001").await.is_empty() }).await);

    // A ban holds w-b until lifted; the reinstatement lifts it.
    let ban = |state: &str| Kind::Ban(AccountBanState { ban_state: state.into(), ban_date: "April 17, 2025".into() });
    publish(&h, signal("w-b", ban("DISABLE")), "b1").await;
    let held = || async {
        pauses(&h, "8002").await.first().is_some_and(|(level, source, until, reason)| {
            (level.as_str(), source.as_str(), *until, reason.as_str())
                == ("waba", "webhook", 0, "Meta account_update DISABLED_UPDATE DISABLE")
        })
    };
    assert!(bw_testkit::wait_until(WAIT, held).await, "{:?}", pauses(&h, "8002").await);
    assert!(pauses(&h, "8001").await.is_empty());
    publish(&h, signal("w-b", ban("REINSTATE")), "b2").await;
    assert!(bw_testkit::wait_until(WAIT, || async { pauses(&h, "8002").await.is_empty() }).await);
    let applied = bw_testkit::wait_until(WAIT, || async {
        h.metrics_text().contains("bw_breaker_coordinator_account_signals_total{result=\"applied\"} 3")
    })
    .await;
    assert!(applied, "{}", h.metrics_text());
}

/// A THROUGHPUT_UPGRADE that names no number, for a WABA with two: nothing is guessed, the alert lists both
/// numbers and the exact call; the operator's call then raises that number only.
#[tokio::test]
async fn an_upgrade_without_a_number_alerts_with_the_call_that_records_it_for_one() {
    use bw_breaker::throughput::{Throughput, UPGRADED_MPS};
    use bw_proto::v1::ThroughputChange;
    let h = start().await;
    let dispatcher = h.client();
    let (a, b) = (Scope::new("w-t", "8101"), Scope::new("w-t", "8102"));
    for s in [&a, &b] {
        dispatcher.admit(s, &[AdmitItem { recipient_key: "r".into(), class: TrafficClass::Priority }]).await;
    }
    let both = || async {
        let scopes = h.get("/admin/breakers").await.1["scopes"].as_array().cloned().unwrap_or_default();
        scopes.iter().filter(|s| s["waba_id"] == "w-t").count() == 2
    };
    assert!(bw_testkit::wait_until(WAIT, both).await, "both numbers discovered");
    let upgrade = ThroughputChange { event: "THROUGHPUT_UPGRADE".into(), mps: UPGRADED_MPS, ..Default::default() };
    let mut s = signal("w-t", Kind::Throughput(upgrade));
    s.field = "phone_number_quality_update".into();
    publish(&h, s, "t1").await;
    let stream = h.deps.js.get_stream(names::EVENTS_STREAM).await.expect("events");
    let alert = || async {
        let m = stream.get_last_raw_message_by_subject(&names::signal_subject("account_alert")).await.ok()?;
        Signal::decode(m.payload.as_ref()).ok().map(|s| s.detail)
    };
    assert!(bw_testkit::wait_until(WAIT, || async { alert().await.is_some() }).await, "alert published");
    let detail = alert().await.unwrap_or_default();
    assert!(detail.contains("2 known numbers (8101, 8102)") && detail.contains("/admin/throughput/"), "{detail}");
    let tput = Throughput::new(h.redis.clone(), WAIT, &bw_breaker::ScopeLimits::default());
    for s in [&a, &b] {
        assert_eq!(tput.read(s).await.expect("read").mps, 0, "no number guessed");
    }

    // Bad input is a precise error; the operator's call records the upgrade for 8102 only.
    let (status, body) = h.post("/admin/throughput/9999").await;
    assert_eq!((status, body["error"].as_str()), (404, Some("scope `9999` not found")));
    let too_fast = reqwest::Client::new()
        .post(format!("{}/admin/throughput/8102", h.admin))
        .bearer_auth(OPERATOR_TOKEN)
        .body("{\"mps\": 5000}")
        .send()
        .await
        .expect("post");
    assert_eq!(too_fast.status().as_u16(), 400);
    let (status, body) = h.post_as("/admin/throughput/8102", None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = h.post("/admin/throughput/8102").await;
    assert_eq!((status, body["mps"].as_u64(), body["rate_per_s"].as_f64()), (200, Some(1000), Some(925.0)), "{body}");
    assert_eq!(tput.read(&b).await.expect("read").mps, UPGRADED_MPS);
    assert_eq!(tput.read(&a).await.expect("read").mps, 0, "the other number keeps its rate");
}
