//! The console in a real headless Chromium against a real stack in an outage: the overview shows the sender
//! OPEN, the DLQ page shows the entries, the operator resets the breaker and replays the incident through the
//! confirmation pages, the ledger shows every entry of the incident sent, each action is in the audit stream,
//! and a viewer without a key cannot act. Screenshots go to `target/console-screenshots/`. Labels, keyboard
//! focus and text state labels are checked on every page.

use crate::support::cdp::Browser;
use crate::support::{OPERATOR_KEY, PHONE, WAIT};
use bw_proto::v1::OperationState;

/// Every form control has a label, every state badge has text, and the first Tab on a freshly loaded page lands
/// on the skip link, the next on the navigation.
async fn check_accessible(b: &mut Browser, page: &str) {
    let unlabelled = b
        .eval(
            "[...document.querySelectorAll('input:not([type=hidden]), select, textarea')]\
             .filter(e => !e.labels || e.labels.length === 0).length",
        )
        .await;
    assert_eq!(unlabelled, 0, "{page}: every form control has a label");
    let silent = b.eval("[...document.querySelectorAll('.state')].filter(e => !e.textContent.trim()).length").await;
    assert_eq!(silent, 0, "{page}: every state is written as text, not shown by colour alone");
    b.tab().await;
    let focused = b.eval("document.activeElement ? document.activeElement.textContent.trim() : ''").await;
    assert_eq!(focused, "Skip to content", "{page}: the keyboard reaches the skip link first");
    b.tab().await;
    let next = b.eval("document.activeElement ? document.activeElement.tagName : ''").await;
    assert_eq!(next, "A", "{page}: Tab moves on to the navigation");
}

/// Waits until the page at `url` (reloaded each time) shows `text`.
async fn wait_for_text(b: &mut Browser, url: &str, text: &str) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        b.goto(url).await;
        if b.text().await.contains(text) {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            eprintln!("{url} never showed `{text}`; it shows:\n{}", b.text().await);
            return false;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_drains_an_outage_from_the_browser_and_a_viewer_cannot_act() {
    let stack = crate::support::outage(12).await;
    let base = stack.console.clone();
    let mut b = Browser::start().await;

    // Sign in with the operator key.
    b.goto(&format!("{base}/login")).await;
    check_accessible(&mut b, "login").await;
    b.eval(&format!("document.getElementById('key').value = {}", serde_json::json!(OPERATOR_KEY))).await;
    b.click("button", "Sign in").await;
    assert!(b.text().await.contains("Signed in as alice (operator)"), "{}", b.text().await);

    // The overview shows the sender OPEN, as text.
    assert!(wait_for_text(&mut b, &format!("{base}/"), "OPEN").await, "overview shows the sender OPEN");
    let row = b
        .eval(&format!(
            "[...document.querySelectorAll('tr')].find(r => r.textContent.includes('{PHONE}'))?.innerText || ''"
        ))
        .await;
    assert!(row.as_str().unwrap_or_default().contains("OPEN"), "the sender's row says OPEN: {row}");
    // Rate and failures against the limits the coordinator reports (bw_e2e::FastBreaker: 200/s, trips at 50 %).
    assert!(
        wait_for_text(&mut b, &format!("{base}/"), "of 200.0/s").await
            && b.text().await.contains("trips at 50% once 5 calls"),
        "the overview compares rate and failures with the sender's limits"
    );
    check_accessible(&mut b, "overview").await;
    b.screenshot("overview-open").await;
    // Live refresh: a server-sent event makes the page swap in its re-read content (the script marks it).
    let deadline = tokio::time::Instant::now() + WAIT;
    while b.eval("document.getElementById('main').dataset.updated || ''").await == "" {
        assert!(tokio::time::Instant::now() < deadline, "the overview refreshed itself through server-sent events");
        // Polling a condition, not waiting for time to pass.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // The DLQ page lists the entries, recipients masked.
    b.goto(&format!("{base}/dlq")).await;
    let count = b.eval("document.getElementById('dlq-count').textContent").await;
    let n: usize = count.as_str().and_then(|t| t.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert_eq!(n, stack.ops.len(), "the DLQ page shows every entry: {count}");
    assert!(b.text().await.contains("+549*******"), "recipients are shown masked");
    check_accessible(&mut b, "dlq").await;
    b.screenshot("dlq").await;

    // The sender page; reset the breaker through its confirmation.
    b.goto(&format!("{base}/senders/{PHONE}")).await;
    check_accessible(&mut b, "sender").await;
    let sender = b.text().await;
    let tries: usize = sender
        .split("Recent outcomes: ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(tries >= 12, "the sender page shows the outage's dispatch outcomes ({tries})");
    b.screenshot("sender").await;
    b.click("button", "Reset breaker").await;
    assert!(b.text().await.contains("Reset (window, counters"), "a confirmation page first: {}", b.text().await);
    b.click("button", "Confirm").await;
    let result = b.eval("document.getElementById('action-result').textContent").await;
    assert!(result.as_str().unwrap_or_default().starts_with("done"), "reset done: {result}");
    assert!(wait_for_text(&mut b, &format!("{base}/"), "CLOSED").await, "the overview shows the sender CLOSED");

    // Replay the incident from the incidents page, through the confirmation.
    b.goto(&format!("{base}/incidents")).await;
    check_accessible(&mut b, "incidents").await;
    b.click("button", "Replay incident").await;
    let confirm = b.text().await;
    assert!(confirm.contains(&format!("Replay incident {}", stack.incident)), "{confirm}");
    b.screenshot("confirm-replay").await;
    b.click("button", "Confirm").await;
    assert!(b.text().await.contains("started"), "{}", b.text().await);
    let sent = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
    assert!(stack.h.wait_all(&stack.incident_ops, &sent, WAIT).await, "the ledger shows every incident entry sent");
    let oracle = stack.h.sim.oracle();
    for op in &stack.incident_ops {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted by Meta exactly once");
    }
    assert!(
        wait_for_text(&mut b, &format!("{base}/dlq?incident={}", stack.incident), "0 matching entries").await,
        "the incident's DLQ entries are gone"
    );
    assert!(wait_for_text(&mut b, &format!("{base}/incidents"), "finished").await, "the incident replay finished");
    b.screenshot("incidents-replayed").await;
    b.goto(&format!("{base}/quarantine")).await;
    check_accessible(&mut b, "quarantine").await;
    b.screenshot("quarantine").await;
    b.goto(&format!("{base}/op?id={}", stack.incident_ops[0])).await;
    check_accessible(&mut b, "op").await;
    assert!(b.text().await.contains("replays 1"), "{}", b.text().await);
    b.screenshot("op").await;

    // Every action is in the audit stream: who, what, when, scope.
    let audit = bw_console::audit::read_all(&stack.h.js).await.expect("audit");
    let seen: Vec<(String, String, String)> =
        audit.iter().map(|e| (e.who.clone(), e.action.clone(), e.outcome.clone())).collect();
    for (action, outcome) in [
        ("breaker_reset", "requested"),
        ("breaker_reset", "done"),
        ("replay_incident", "requested"),
        ("replay_incident", "started"),
    ] {
        assert!(seen.contains(&("alice".into(), action.into(), outcome.into())), "{action} {outcome}: {seen:?}");
    }
    assert!(audit.iter().all(|e| e.at_unix_ms > 0 && !e.scope.is_empty()));

    // Signed out: a viewer without a key reads, sees no action, and cannot act.
    b.click("button", "Sign out").await;
    b.goto(&format!("{base}/incidents")).await;
    let text = b.text().await;
    assert!(text.contains("Viewing without a key"), "{text}");
    assert!(!text.contains("Replay incident"), "no action buttons for a viewer");
    b.screenshot("viewer").await;
    b.goto(&format!("{base}/confirm?action=replay_incident&scope={PHONE}&incident={}", stack.incident)).await;
    assert!(b.text().await.contains("needs the operator role"), "{}", b.text().await);
    let status = b
        .eval(&format!(
            "fetch('/actions/replay_incident', {{ method: 'POST', headers: {{ 'content-type': \
             'application/x-www-form-urlencoded' }}, body: 'confirm=yes&scope={PHONE}&incident={}' }})\
             .then(r => r.status)",
            stack.incident
        ))
        .await;
    assert_eq!(status, 403, "a viewer's POST is refused");
    let after = bw_console::audit::read_all(&stack.h.js).await.expect("audit");
    assert!(after.iter().all(|e| e.who == "alice"), "nothing was done (or audited) for the viewer: {after:?}");
}
