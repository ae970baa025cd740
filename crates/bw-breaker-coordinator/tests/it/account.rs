//! Meta's account signals on BW_ACCOUNT: a restriction pauses only its WABA until its expiration (source
//! "webhook", shown in the snapshots), a ban holds a WABA until the reinstatement lifts it, and both raise an
//! `account_restricted` signal for the alerting service.

use super::*;
use bw_common::names;
use bw_common::proto::account_signal::Kind;
use bw_common::proto::{AccountBanState, AccountRestriction, AccountSignal, Signal};

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
