//! Nothing leaks: with a stack populated by an outage (every order in the DLQ under an incident), every page
//! the console renders, its refusals of hostile input, and the audit stream hold no recipient's number, no
//! console key, operator token, access token or app secret.

use crate::support::{COORDINATOR_TOKEN, OPERATOR_KEY, PHONE, recipient_digits};

const N: usize = 30;

fn secrets() -> Vec<String> {
    let mut out: Vec<String> = (0..N).map(recipient_digits).collect();
    out.extend(
        [OPERATOR_KEY, COORDINATOR_TOKEN, bw_e2e::ACCESS_TOKEN, bw_e2e::APP_SECRET, bw_e2e::INTAKE_API_KEY]
            .map(String::from),
    );
    out
}

fn form(pairs: &[(&str, &str)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}={}", bw_console::html::url(v))).collect::<Vec<_>>().join("&")
}

fn assert_clean(what: &str, text: &str) {
    for s in secrets() {
        assert!(!text.contains(&s), "{what} shows `{s}`");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_page_response_or_audit_entry_shows_a_number_or_a_secret() {
    let stack = crate::support::outage(N).await;
    let base = &stack.console;
    let client = reqwest::Client::new();
    let get = |path: String| {
        let client = client.clone();
        let url = format!("{base}{path}");
        async move {
            let r = client.get(&url).bearer_auth(OPERATOR_KEY).send().await.expect("console answers");
            (r.status().as_u16(), r.text().await.expect("body"))
        }
    };
    let mut pages = vec![
        "/".to_string(),
        "/incidents".into(),
        "/quarantine".into(),
        format!("/senders/{PHONE}"),
        format!("/dlq?sender={PHONE}"),
        format!("/dlq?incident={}", stack.incident),
        "/dlq?reason=breaker_open&category=transactional".into(),
        "/op".into(),
        "/login".into(),
        "/assets/console.css".into(),
        "/assets/live.js".into(),
        format!("/confirm?action=replay_incident&scope={PHONE}&incident={}", stack.incident),
        format!("/confirm?action=breaker_reset&scope={PHONE}"),
        format!("/confirm?action=resend&op={}", stack.ops[0]),
    ];
    pages.extend((1..=N.div_ceil(10) + 1).map(|p| format!("/dlq?page={p}")));
    pages.extend(stack.ops.iter().map(|op| format!("/op?id={op}")));
    let mut rendered = 0;
    for path in pages {
        let (status, body) = get(path.clone()).await;
        assert!(status < 500, "{path}: HTTP {status}");
        assert_clean(&path, &body);
        rendered += 1;
    }
    // Every entry was rendered somewhere, masked.
    let (_, all) = get(format!("/dlq?sender={PHONE}&page=1")).await;
    assert!(all.contains("+549*******"), "recipients appear masked");

    // Hostile input: a phone number where an id goes is refused precisely and never echoed.
    let number = format!("%2B{}", recipient_digits(3));
    for path in [
        format!("/dlq?sender={number}"),
        format!("/op?id={number}"),
        format!("/senders/{}", recipient_digits(3)),
        format!("/confirm?action=breaker_reset&scope={number}"),
        "/dlq?page=notanumber".to_string(),
        "/nowhere".to_string(),
    ] {
        let (status, body) = get(path.clone()).await;
        assert!((400..500).contains(&status), "{path}: HTTP {status}");
        assert_clean(&path, &body);
    }

    // An action whose reason holds a number: the audit stream keeps it masked.
    let (_, confirm) = get(format!("/confirm?action=resend&op={}", stack.ops[0])).await;
    let csrf = confirm.split("name=\"csrf\" value=\"").nth(1).and_then(|r| r.split('"').next()).expect("csrf field");
    let reason = format!("customer +{} asked", recipient_digits(5));
    let r = client
        .post(format!("{base}/actions/resend"))
        .bearer_auth(OPERATOR_KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", csrf), ("confirm", "yes"), ("op", stack.ops[0].as_str()), ("reason", reason.as_str())]))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 409, "a DLQ operation is not resendable");
    assert_clean("resend answer", &r.text().await.expect("body"));
    // Without the CSRF token nothing happens.
    let r = client
        .post(format!("{base}/actions/breaker_reset"))
        .bearer_auth(OPERATOR_KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("confirm", "yes"), ("scope", PHONE)]))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 403, "no CSRF token, no action");

    let audit = bw_console::audit::read_all(&stack.h.js).await.expect("audit");
    assert_eq!(audit.len(), 2, "the resend's request and refusal: {audit:?}");
    for e in &audit {
        assert_clean("audit entry", &serde_json::to_string(e).expect("json"));
    }
    eprintln!("{rendered} pages rendered, none shows a number or a secret");
}
