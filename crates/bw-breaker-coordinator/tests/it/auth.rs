//! Operator authentication of the state-changing admin routes, at the compiled default (no token hash: every
//! such route refused) and with a configured hash (missing, malformed and wrong tokens refused, the right one
//! works). Refusals change nothing and are counted.

use super::*;

const ACTIONS: [&str; 7] = [
    "/admin/breakers/5551/force-open",
    "/admin/breakers/5551/force-closed",
    "/admin/breakers/5551/clear",
    "/admin/breakers/5551/reset",
    "/admin/reload",
    "/admin/pauses/waba/w1/pause",
    "/admin/pauses/waba/w1/lift",
];

async fn assert_untouched(i: &Instance) {
    let status = client(&i.deps).status(&Scope::new("w1", "5551")).await.expect("status");
    assert_eq!(status.snapshot.state(), BreakerState::Closed, "a refused action changes nothing");
    let waba = client(&i.deps).parent_status(&bw_breaker::Parent::Waba("w1".into())).await.expect("read");
    assert!(!waba.active(0), "a refused pause pauses nothing: {waba:?}");
}

#[tokio::test]
async fn at_the_compiled_default_operator_actions_are_refused_and_reads_stay_open() {
    let servers = Servers::start();
    let i = Instance::start(servers.config("default", "")).await;
    for path in ACTIONS {
        for bearer in [None, Some(OPERATOR_TOKEN)] {
            let (status, body) = i.post_as(path, bearer).await;
            assert_eq!(status, 403, "{path}: {body}");
            assert!(body["error"].as_str().unwrap_or_default().contains("no operator token is configured"), "{body}");
        }
    }
    assert_untouched(&i).await;
    assert_eq!(i.get("/admin/breakers").await.0, 200);
    assert_eq!(i.get("/admin/breakers/5551").await.0, 200);
    assert_eq!(i.get("/admin/leader").await.0, 200);
    for path in ["/livez", "/metrics"] {
        let r = reqwest::get(format!("{}{path}", i.admin)).await.expect("get");
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    assert!(
        i.metrics_text().contains("bw_breaker_coordinator_admin_refusals_total{reason=\"disabled\"} 14"),
        "{}",
        i.metrics_text()
    );
}

#[tokio::test]
async fn with_a_token_hash_each_denied_action_is_refused_and_the_operator_is_obeyed() {
    let servers = Servers::start();
    let i = Instance::start(
        servers.config("authed", &format!("[operator]\ntoken_sha256 = \"{}\"\n", sha256_hex(OPERATOR_TOKEN))),
    )
    .await;
    let http = reqwest::Client::new();
    for path in ACTIONS {
        let (status, body) = i.post_as(path, None).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(body["error"].as_str().unwrap_or_default().contains("operator token required"), "{body}");
        let r = http
            .post(format!("{}{path}", i.admin))
            .header("authorization", format!("Basic {OPERATOR_TOKEN}"))
            .send()
            .await
            .expect("post");
        assert_eq!(r.status().as_u16(), 401, "{path}");
        assert!(r.headers().get("www-authenticate").is_some(), "{path}: a 401 names the scheme");
        let text = r.text().await.expect("body");
        assert!(text.contains("malformed") && !text.contains(OPERATOR_TOKEN), "{text}");
        let (status, body) = i.post_as(path, Some("test-operator-token-2")).await;
        assert_eq!(status, 403, "{path}: {body}");
        assert_eq!(body["error"], "operator token rejected");
    }
    assert_untouched(&i).await;
    let text = i.metrics_text();
    for (reason, n) in [("missing", 7), ("malformed", 7), ("invalid", 7)] {
        assert!(
            text.contains(&format!("bw_breaker_coordinator_admin_refusals_total{{reason=\"{reason}\"}} {n}")),
            "{text}"
        );
    }

    let (status, body) = i.post_as("/admin/breakers/5551/force-open", Some(OPERATOR_TOKEN)).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("FORCED_OPEN")), "{body}");
    let (status, body) = i.post_as("/admin/breakers/5551/reset", Some(OPERATOR_TOKEN)).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("CLOSED")), "{body}");
    let (status, body) = i.post_as("/admin/reload", Some(OPERATOR_TOKEN)).await;
    assert_eq!((status, body["reloaded"].as_bool()), (200, Some(true)), "{body}");
    let text = i.metrics_text();
    assert!(text.contains("bw_breaker_coordinator_operator_actions_total{action=\"force-open\"} 1"), "{text}");
}
