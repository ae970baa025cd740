use super::*;
use bw_testkit::{NatsServer, wait_until};

fn cfg() -> JournalConfig {
    JournalConfig {
        lease: Duration::from_millis(600),
        max_group: 4,
        checkpoint: Duration::from_millis(50),
        max_bytes: 8 * 1024 * 1024,
        replicas: 1,
        bucket_max_bytes: 1024 * 1024,
    }
}

/// A ledger probe: the operations in `open` are still at their journaled revision.
fn probe(open: &'static [(&'static str, u64)]) -> StillOpen {
    Arc::new(move |op: String, revision: u64| {
        Box::pin(async move { open.iter().any(|(o, r)| *o == op && *r == revision) }) as BoxFuture<'static, bool>
    })
}

async fn journals(js: &jetstream::Context, instance: &str) -> Journals {
    Journals::open(js, &[0], instance, cfg(), JournalMetrics::default()).await.expect("journals open")
}

#[test]
fn a_checkpoint_covers_only_records_whose_attempts_are_all_settled() {
    let mut s = PartState { last_seq: 9, ..Default::default() };
    assert_eq!(s.settled_through(), 9, "nothing open: everything appended is settled");
    for (op, seq) in [("a", 4), ("b", 4), ("c", 7)] {
        s.open.insert(op.into(), Open { attempt: 1, revision: 1, seq, abandoned: false });
        *s.open_seqs.entry(seq).or_default() += 1;
    }
    // An append under way (seq 0) is not durable yet: not listed, and it cannot lower what is settled.
    s.open.insert("d".into(), Open { attempt: 1, revision: 1, seq: 0, abandoned: false });
    assert_eq!(s.settled_through(), 3);
    s.close("a", 4);
    assert_eq!(s.settled_through(), 3, "b of the same record is still open");
    s.close("b", 4);
    assert_eq!(s.settled_through(), 6);
    let listed: Vec<_> = s.open_attempts().into_iter().map(|a| a.operation_id).collect();
    assert_eq!(listed, ["c"]);
    s.close("c", 99);
    assert_eq!(s.settled_through(), 6, "a close of another attempt of c leaves this one open");
}

#[tokio::test]
async fn a_new_owner_flags_the_old_owners_unsettled_attempts_and_fences_its_appends() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = jetstream::new(client);

    let a = journals(&js, "instance-a").await;
    let stop_a = CancellationToken::new();
    a.spawn(probe(&[]), stop_a.clone());
    assert!(wait_until(Duration::from_secs(10), || async { a.owns(0) }).await, "a owns partition 0");
    let part_a = a.part(0).expect("served").clone();

    let settled = part_a.append("op-1", 1, 5).await.expect("journaled");
    settled.resolve();
    let open = part_a.append("op-2", 1, 7).await.expect("journaled");
    assert_eq!(part_a.append("op-2", 1, 7).await.err(), Some(Refusal::Live), "a second live copy never sends");
    // Several sends queued at once go in as few records as the appender needs.
    let group = futures::future::join_all((0..6).map(|i| {
        let part = part_a.clone();
        async move { part.append(&format!("op-g{i}"), 1, 1).await }
    }))
    .await;
    assert!(group.iter().all(|r| r.is_ok()));
    drop(group); // unresolved: abandoned, but their ledger entries moved on (the probe says so)
    let expected_before = lock(&part_a.state).last_seq;

    // a stalls (its loops stop, its lease is not given back): b takes over once the lease expires.
    stop_a.cancel();
    let b = journals(&js, "instance-b").await;
    b.spawn(probe(&[("op-2", 7)]), CancellationToken::new());
    assert!(wait_until(Duration::from_secs(10), || async { b.owns(0) }).await, "b takes partition 0 over");
    let part_b = b.part(0).expect("served").clone();
    assert_eq!(part_b.append("op-2", 2, 8).await.err(), Some(Refusal::Abandoned), "unsettled: unknown outcome");
    assert!(part_b.take_abandoned("op-2").is_some());
    assert!(part_b.append("op-1", 2, 6).await.is_ok(), "a settled attempt leaves nothing open");
    assert!(part_b.append("op-g0", 2, 2).await.is_ok(), "an attempt whose ledger entry moved on is settled");

    // a, resumed, is past its lease deadline and refuses; and an append chained as before fails anyway.
    assert!(!part_a.ready());
    assert_eq!(part_a.append("op-3", 1, 1).await.err(), Some(Refusal::NotOwner));
    let record = part_a.record(WireRecordKind::Sends, 1, Vec::new(), 0);
    let fenced = part_a.publish(part_a.names.sends_subject(), record, expected_before).await;
    assert!(fenced.is_err_and(|e| e.contains("deposed")), "the old owner's append is fenced");
    drop(open);
}
