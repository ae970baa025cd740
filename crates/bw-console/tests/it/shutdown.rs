//! The console stops promptly on shutdown even while a page holds its live-refresh stream open.

use crate::support::{OPERATOR_KEY, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_stops_while_a_page_listens_for_updates() {
    let mut stack = crate::support::outage(12).await;
    let response = reqwest::Client::new()
        .get(format!("{}/events", stack.console))
        .bearer_auth(OPERATOR_KEY)
        .send()
        .await
        .expect("events answer");
    assert_eq!(response.status().as_u16(), 200);
    let mut response = response;
    let first = tokio::time::timeout(WAIT, response.chunk()).await.expect("an event within the wait");
    let first = first.expect("a chunk").expect("not the end");
    assert!(String::from_utf8_lossy(&first).contains("data:"), "an event");
    stack.console_stop.cancel();
    let task = stack.console_task.take().expect("console task");
    let ended = tokio::time::timeout(WAIT, task).await.expect("the console stops with a stream open");
    assert!(ended.expect("joined").is_ok(), "the console ends cleanly");
    let end = async {
        // Events already sent may still be buffered; the stream then ends (or breaks) as the server closed it.
        while let Ok(Some(_)) = response.chunk().await {}
    };
    tokio::time::timeout(WAIT, end).await.expect("the server closed the stream");
}
