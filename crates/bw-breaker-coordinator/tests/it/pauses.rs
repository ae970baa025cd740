//! Every pause that holds a scope reaches its BW_SCOPES snapshot (the number's own, its WABA's, its token's, as
//! the dispatchers recorded the account), and only that scope's; the pause gauge counts them; an operator
//! pauses and lifts through the admin API.

use super::*;
use bw_breaker::{PauseEnd, PauseSource, PauseSpec};
use bw_common::classify::PauseScope;

fn hold(scope: PauseScope, code: i64) -> OutcomeKind {
    OutcomeKind::Pause(PauseSpec {
        scope,
        code,
        end: PauseEnd::Lifted,
        marketing_only: false,
        source: PauseSource::Answer,
    })
}

/// The (level, code, source) of each pause in the scope's snapshot, sorted.
async fn pauses(h: &Instance, phone: &str) -> Vec<(String, i64, String)> {
    let mut out: Vec<_> = kv_state(&h.deps, phone)
        .await
        .map(|s| s.pauses.into_iter().map(|p| (p.level, p.code, p.source)).collect())
        .unwrap_or_default();
    out.sort();
    out
}

async fn shows(h: &Instance, phone: &str, want: &[(&str, i64, &str)]) -> bool {
    let want: Vec<(String, i64, String)> = want.iter().map(|(l, c, s)| (l.to_string(), *c, s.to_string())).collect();
    bw_testkit::wait_until(WAIT, || async { pauses(h, phone).await == want }).await
}

#[tokio::test]
async fn each_pause_shows_in_the_snapshots_of_the_scopes_it_holds_and_no_other() {
    let h = start().await;
    let dispatcher = h.client();
    dispatcher.set_account("app-p", "token-p");
    let (a1, a2, b1) = (Scope::new("w-a", "7001"), Scope::new("w-a", "7002"), Scope::new("w-b", "7003"));
    for s in [&a1, &a2, &b1] {
        // Admission registers the scope and the account it is sent with.
        dispatcher.admit(s, &[AdmitItem { recipient_key: "r".into(), class: TrafficClass::Priority }]).await;
    }
    let outcome = |kind| [OutcomeItem { recipient_key: "r".into(), kind, canary: false }];
    dispatcher.record(&a1, &outcome(hold(PauseScope::Waba, 368))).await;
    assert!(shows(&h, "7001", &[("waba", 368, "answer")]).await, "{:?}", pauses(&h, "7001").await);
    assert!(shows(&h, "7002", &[("waba", 368, "answer")]).await, "{:?}", pauses(&h, "7002").await);
    dispatcher.record(&b1, &outcome(hold(PauseScope::PhoneNumber, 133010))).await;
    assert!(shows(&h, "7003", &[("number", 133010, "answer")]).await, "{:?}", pauses(&h, "7003").await);
    assert!(shows(&h, "7002", &[("waba", 368, "answer")]).await, "a number pause stays with its number");
    let gauge = |text: &str, level: &str, code: i64| {
        text.contains(&format!("bw_breaker_pauses{{level=\"{level}\",code=\"{code}\",lift=\"operator\"}} 1"))
    };
    let counted = bw_testkit::wait_until(WAIT, || async {
        gauge(&h.metrics_text(), "waba", 368) && gauge(&h.metrics_text(), "number", 133010)
    })
    .await;
    assert!(counted, "{}", h.metrics_text());

    // A token halt holds every scope sent with the token.
    dispatcher.record(&a2, &outcome(hold(PauseScope::Token, 190))).await;
    assert!(shows(&h, "7003", &[("number", 133010, "answer"), ("token", 190, "answer")]).await);
    assert!(shows(&h, "7001", &[("token", 190, "answer"), ("waba", 368, "answer")]).await);

    // An operator lifts the WABA's pause and the token's halt, and pauses one number.
    let fp = bw_breaker::token_fingerprint("token-p");
    for path in ["/admin/pauses/waba/w-a/lift".to_string(), format!("/admin/pauses/token/{fp}/lift")] {
        let (status, body) = h.post(&path).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    assert!(shows(&h, "7001", &[]).await, "{:?}", pauses(&h, "7001").await);
    assert!(shows(&h, "7003", &[("number", 133010, "answer")]).await);
    let r = reqwest::Client::new()
        .post(format!("{}/admin/pauses/number/7002/pause", h.admin))
        .bearer_auth(OPERATOR_TOKEN)
        .body(r#"{"for_ms": 600000, "reason": "checking the display name"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 200);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!((body["source"].as_str(), body["lift"].as_str()), (Some("operator"), Some("time")), "{body}");
    assert!(shows(&h, "7002", &[("number", 0, "operator")]).await, "{:?}", pauses(&h, "7002").await);
    // The dispatcher sees the lifts above the number within parent_refresh_ms, the number's pause at once.
    let number_paused = bw_testkit::wait_until(WAIT, || async {
        let item = AdmitItem { recipient_key: "r".into(), class: TrafficClass::Priority };
        let d = dispatcher.admit(&a2, &[item]).await.decisions[0];
        matches!(d, bw_breaker::Decision::Deny { reason: bw_breaker::DenyReason::NumberPaused, .. })
    })
    .await;
    assert!(number_paused);

    // Bad requests are refused precisely and change nothing.
    for (path, status) in [
        ("/admin/pauses/galaxy/1/lift", 404),
        ("/admin/pauses/number/9999/lift", 404),
        ("/admin/pauses/token/not-a-fingerprint/lift", 400),
        ("/admin/pauses/waba/w-a/unpause", 404),
        ("/admin/pauses/waba/a%20b/lift", 400),
    ] {
        assert_eq!(h.post(path).await.0, status, "{path}");
    }
}
