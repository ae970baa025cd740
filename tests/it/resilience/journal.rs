//! The wire journal (`dispatch.wire_guarantee = "journal"`) under kill -9 at each crash point of
//! docs/decisions/wire-journal.md, with real dispatcher processes: aborted right after the journal append,
//! right after the POST, right after the outcome (`BW_DISPATCHER_CRASH_POINT`, debug builds), and two owners
//! racing (the owner stopped past its lease while another takes over, then resumed). Each ends with 0 lost by the
//! accounting check and 0 unflagged duplicates by the simulator's oracle.

use super::common::{
    SETTLED, Verdict, assert_unknowns_flagged, dispatcher_settings, requests, services, slow_harness, submit,
    wait_states,
};
use bw_e2e::Harness;
use std::time::Duration;

const PHONE: &str = "106540352247301";
const WAIT: Duration = Duration::from_secs(60);
const MESSAGES: usize = 120;

/// Dispatcher settings in journal mode with a short partition lease (the next owner takes over 1 s after).
fn journal_settings(h: &Harness) -> Vec<(&'static str, String)> {
    let mut s = dispatcher_settings(&h.nats.url(), &h.redis.url(), &h.sim.base_url());
    s.push(("dispatch.wire_guarantee", "journal".into()));
    s.push(("dispatch.wire_lease_ms", "1000".into()));
    s.push(("dispatch.journal_checkpoint_ms", "100".into()));
    s.push(("dispatch.max_in_flight", "32".into()));
    s.push(("dispatch.batch_size", "16".into()));
    s
}

/// The value (holder's instance id) of partition 0's lease, if held.
async fn owner(h: &Harness) -> Option<String> {
    let store = h.js.get_key_value(bw_wire::names::WIRE_OWNERS_BUCKET).await.ok()?;
    let value = store.get("p0").await.ok()??;
    Some(String::from_utf8_lossy(&value).into_owned())
}

/// One dispatcher aborts at `point` on its first send; a second one, started after, takes the partition over and
/// finishes. What the first had journaled without an outcome ends UNKNOWN, flagged; nothing is lost or sent twice.
async fn crash_at(point: &str, prefix: &str, unknown_at_least: usize) {
    let h = slow_harness().await;
    let mut procs = services(&format!("journal-{point}"), &["dispatcher"]);
    let settings = journal_settings(&h);
    let victim = procs
        .spawn_with_env("dispatcher", &settings, &[("BW_DISPATCHER_CRASH_POINT", point)])
        .expect("spawn dispatcher");
    procs.wait_ready(WAIT).await.expect("dispatcher ready");
    assert!(bw_testkit::wait_until(WAIT, || async { owner(&h).await.is_some() }).await, "partition owned");

    let ops = submit(&h.producer(), requests(PHONE, prefix, MESSAGES), 32, WAIT).await;
    let deadline = std::time::Instant::now() + WAIT;
    while procs.procs[victim].is_running() {
        assert!(std::time::Instant::now() < deadline, "the dispatcher aborted at {point}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let at_crash = h.sim.total_accepted();
    assert!(at_crash < MESSAGES as u64, "the crash happened before the end ({at_crash} sent)");

    procs.spawn("dispatcher", &settings).expect("spawn the next owner");
    wait_states(&h.js, &h.buckets, &ops, &SETTLED, WAIT).await;
    let verdict = Verdict::of(&h.js, &h.buckets, &h.sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    verdict.assert_no_blind_duplicates();
    assert!(verdict.duplicates.is_empty(), "nothing journaled was sent again: {:?}", verdict.duplicates);
    // At most one group (one send's wait, a batch of 16) was journaled when the process aborted.
    assert_unknowns_flagged(&h.js, &h.buckets, &ops, 32).await;
    let entries = super::common::ledger(&h.js, &h.buckets).await;
    let unknown = ops.iter().filter(|op| entries.get(*op).is_some_and(|e| e.flagged_unknown)).count();
    assert!(unknown >= unknown_at_least, "the next owner flagged what was journaled without an outcome: {unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_between_the_journal_append_and_the_post_loses_and_doubles_nothing() {
    crash_at("after_journal", "wj-aj", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_between_the_post_and_the_outcome_loses_and_doubles_nothing() {
    crash_at("after_post", "wj-ap", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_between_the_outcome_and_the_ack_loses_and_doubles_nothing() {
    crash_at("after_outcome", "wj-ao", 0).await;
}

/// Two dispatchers serve the partition; its owner is stopped (SIGSTOP) under load past its lease, the other
/// takes the partition over and sends, then the first resumes: its appends fail (the take-over record fenced
/// them), and what it had journaled before is UNKNOWN to the new owner or settled by its own outcome write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_owners_racing_at_takeover_lose_and_double_nothing_unflagged() {
    let h = slow_harness().await;
    let mut procs = services("journal-race", &["dispatcher"]);
    let settings = journal_settings(&h);
    let first = procs.spawn("dispatcher", &settings).expect("spawn dispatcher");
    procs.wait_ready(WAIT).await.expect("dispatcher ready");
    assert!(bw_testkit::wait_until(WAIT, || async { owner(&h).await.is_some() }).await, "partition owned");
    let first_owner = owner(&h).await.expect("owned");
    procs.spawn("dispatcher", &settings).expect("spawn the second dispatcher");
    procs.wait_ready(WAIT).await.expect("both ready");

    let producer = h.producer();
    let sending = tokio::spawn(async move { submit(&producer, requests(PHONE, "wj-race", 400), 32, WAIT).await });
    assert!(bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= 40 }).await, "sending started");
    assert!(procs.signal(first, "STOP"), "owner stopped");
    let taken = bw_testkit::wait_until(WAIT, || async { owner(&h).await.is_some_and(|o| o != first_owner) }).await;
    assert!(taken, "the second dispatcher took the partition over");
    let at_takeover = h.sim.total_accepted();
    let progressed = bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= at_takeover + 40 }).await;
    assert!(progressed, "the new owner sends");
    assert!(procs.signal(first, "CONT"), "old owner resumed");

    let ops = sending.await.expect("producer");
    wait_states(&h.js, &h.buckets, &ops, &SETTLED, WAIT).await;
    let verdict = Verdict::of(&h.js, &h.buckets, &h.sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    verdict.assert_no_blind_duplicates();
    assert_unknowns_flagged(&h.js, &h.buckets, &ops, 64).await;
}
