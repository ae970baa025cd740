//! The ledger and BW_SEND split into partitions (`nats.ledger_partitions`, `nats.send_partitions`, issue "scale
//! out", item 3): every service, the outcome feed, the accounting check and bwctl work across the partitions,
//! each operation lives in the one ledger partition its id hashes to and each sender in the one send partition
//! its phone_number_id hashes to, dispatchers serve the partitions they are given, and a service given another
//! partition count than the topology was created with refuses to start.

use crate::dispatch::failing;
use bw_e2e::Harness;
use bw_meta_sim::{FaultKind, SimConfig};
use bw_proto::v1::OperationState;
use bw_wire::names;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::time::Duration;

const PHONE: &str = "106540352247001";

/// Every call fails with a 503 for the first 1.5 s (trip, DLQ, close, replay, as in the outage test), with ingest
/// and a coordinator on the fast test breaker ([`bw_e2e::FastBreaker`]) started; returns the dispatchers' breaker
/// settings.
async fn start_outage(h: &mut Harness) -> Vec<(String, String)> {
    h.sim.set_scenario(failing(
        0,
        Some(1_500),
        FaultKind::Http { status: 503, meta_body: true, code: None, after_processing: false },
    ));
    let keys = |prefix: &str| bw_e2e::FastBreaker::default().settings(prefix);
    h.start_ingest(&[]).await;
    h.start_coordinator(&bw_e2e::pairs(&keys("limits.default"))).await;
    keys("breaker.defaults")
}

/// Why a dispatcher given the NATS settings `set` makes from the defaults does not start (it must not).
async fn refusal(nats_url: String, set: impl FnOnce(&mut bw_common::config::NatsConfig)) -> String {
    let mut cfg = bw_common::config::NatsConfig::single(nats_url, "e2e-partitions");
    set(&mut cfg);
    let refused = bw_common::service::Deps::connect("dispatcher", &cfg, None, Duration::from_secs(5)).await;
    format!("{:#}", refused.err().expect("refused"))
}
const PARTITIONS: usize = 4;
const N: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_and_its_replay_run_unchanged_on_a_ledger_in_four_partitions() {
    let mut h = Harness::start_partitioned(SimConfig::default(), PARTITIONS).await;
    let breaker_keys = start_outage(&mut h).await;
    h.start_dispatcher(&bw_e2e::pairs(&breaker_keys)).await;
    h.start_replay(&[("replay.probe_rate_per_s", "5".into())]).await;

    let ops = h.submit_orders(PHONE, "part", N).await;
    // Delivered: the status webhooks found their operations in whichever partition holds them.
    let delivered = [OperationState::Delivered, OperationState::Read];
    if !h.wait_all(&ops, &delivered, Duration::from_secs(60)).await {
        let mut states = BTreeMap::<String, usize>::new();
        for op in &ops {
            let e = h.ledger_entry(op).await.map(|v| v.entry);
            let key = e.map(|e| format!("{} ({})", e.state().label(), e.reason)).unwrap_or_else(|| "none".into());
            *states.entry(key).or_default() += 1;
        }
        panic!("not every operation was delivered: {states:?}");
    }
    let oracle = h.sim.oracle();
    let mut replayed = 0;
    for op in &ops {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted exactly once");
        replayed += usize::from(h.ledger_entry(op).await.expect("entry").entry.replays > 0);
    }
    assert!(replayed > 0, "some operations went through the DLQ and back");

    // Each operation is in its own partition's bucket and in no other; every partition holds some.
    assert_eq!(h.buckets.ledger.len(), PARTITIONS);
    let mut per_partition = vec![0usize; PARTITIONS];
    for op in &ops {
        let home = names::ledger_partition(op, PARTITIONS);
        for (i, store) in h.buckets.ledger.iter().enumerate() {
            let found = store.get(op).await.expect("bucket readable").is_some();
            assert_eq!(found, i == home, "{op} in {} (its partition is {home})", store.name);
        }
        per_partition[home] += 1;
    }
    assert!(per_partition.iter().all(|n| *n > 0), "operations per partition: {per_partition:?}");
    let names: Vec<&str> = h.buckets.ledger.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["BW_LEDGER", "BW_LEDGER_1", "BW_LEDGER_2", "BW_LEDGER_3"]);

    // The wamid links are split the same way: each is found through its partition, and every partition has some.
    let names: Vec<&str> = h.buckets.wamid.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["BW_WAMID", "BW_WAMID_1", "BW_WAMID_2", "BW_WAMID_3"]);
    for op in &ops {
        let wamid = h.ledger_entry(op).await.expect("entry").entry.wamid;
        assert_eq!(h.ledger.operation_for_wamid(&wamid).await.expect("link readable").as_deref(), Some(op.as_str()));
    }
    let mut links = Vec::new();
    for store in &h.buckets.wamid {
        let stream = h.js.get_stream(&store.stream_name).await.expect("stream info");
        links.push(stream.cached_info().state.messages);
    }
    assert!(links.iter().all(|n| *n > 0), "wamid links per partition: {links:?}");
    assert_eq!(links.iter().sum::<u64>(), N as u64, "one link per operation: {links:?}");

    // The outcome feed publishes the revisions of every partition: each operation's journey ends delivered.
    let producer = h.producer();
    for op in &ops {
        let journey = bw_testkit::wait_until(Duration::from_secs(30), || async {
            let Ok(reply) = producer.status(PHONE, op).await else { return false };
            reply.journey.iter().any(|e| delivered.contains(&e.state()))
        })
        .await;
        assert!(journey, "{op}: the feed has its delivery");
    }

    // Accounting and bwctl read every partition.
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &ops).await.expect("accounting");
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.ledger_entries, N as u64, "every partition's entries counted");
    let (code, out) = crate::bwctl(&h.nats.url(), &["account"]).await;
    assert_eq!(code, 0, "{out}");
    for partition in 1..PARTITIONS {
        let op = ops.iter().find(|op| names::ledger_partition(op, PARTITIONS) == partition).expect("an op there");
        let (code, out) = crate::bwctl(&h.nats.url(), &["op", op]).await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains(&format!("operation  {op}")), "{out}");
    }

    // A service given another partition count refuses to start, naming the setting; nothing is created.
    for wrong in [1, 8] {
        let text = refusal(h.nats.url(), |cfg| cfg.ledger_partitions = wrong).await;
        assert!(text.contains("nats.ledger_partitions is") && text.contains("4 partition(s)"), "{text}");
    }
    let mut streams = h.js.stream_names();
    let mut ledger_streams = Vec::new();
    while let Some(name) = streams.next().await {
        let name = name.expect("stream name");
        if name.starts_with("KV_BW_LEDGER") {
            ledger_streams.push(name);
        }
    }
    ledger_streams.sort();
    assert_eq!(ledger_streams, ["KV_BW_LEDGER", "KV_BW_LEDGER_1", "KV_BW_LEDGER_2", "KV_BW_LEDGER_3"]);
}

/// One sender in each of `partitions` send partitions (phone_number_ids found by their hash, not hard-coded).
fn one_sender_per_partition(send: names::SendPartitions) -> Vec<String> {
    let mut phones: Vec<Option<String>> = vec![None; send.count()];
    for i in 0.. {
        let phone = format!("1065403522{i:05}");
        let slot = &mut phones[send.of(&phone)];
        if slot.is_none() {
            *slot = Some(phone);
        }
        if phones.iter().all(Option::is_some) {
            break;
        }
    }
    phones.into_iter().flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_in_three_partitions_each_sender_in_its_own_stream_served_by_the_dispatchers_given_it() {
    const SEND: usize = 3;
    const PER_SENDER: usize = 40;
    let mut h = Harness::start_split(SimConfig::default(), 1, SEND).await;
    let send = h.buckets.send;
    assert_eq!(send.count(), SEND);
    let phones = one_sender_per_partition(send);
    // The outage: the senders of partitions 0 and 1 trip, dead-letter and replay through their own partition's
    // rh lane.
    let breaker_keys = start_outage(&mut h).await;
    h.start_replay(&[("replay.probe_rate_per_s", "5".into())]).await;
    let mut first = bw_e2e::pairs(&breaker_keys);
    first.push(("dispatch.partitions", "[0, 1]".into()));
    h.start_dispatcher(&first).await;

    let mut ops = Vec::new();
    for (p, phone) in phones.iter().enumerate() {
        ops.push(h.submit_orders(phone, &format!("send-p{p}"), PER_SENDER).await);
    }
    let delivered = [OperationState::Delivered, OperationState::Read];
    for (p, sender_ops) in ops.iter().enumerate().take(2) {
        assert!(h.wait_all(sender_ops, &delivered, Duration::from_secs(60)).await, "partition {p}'s sender delivered");
    }
    // No dispatcher serves partition 2 yet: its sender's requests wait in BW_SEND_2, in its live lane, untouched.
    for op in &ops[2] {
        let state = h.ledger_entry(op).await.expect("entry").entry.state();
        assert_eq!(state, OperationState::Queued, "{op} waits for a dispatcher of partition 2");
    }
    let waiting = bw_ops::scan::subject_depth(&h.js, "BW_SEND_2", &send.outbox_subject(names::Lane::High, &phones[2]))
        .await
        .expect("depth");
    assert_eq!(waiting, PER_SENDER as u64);
    // What the on-call person sees: the unserved partition holds messages and no dispatcher ever took one.
    let (code, out) = crate::bwctl(&h.nats.url(), &["partitions"]).await;
    assert_eq!(code, 0, "{out}");
    let row = |stream: &str| -> Vec<String> {
        let line = out.lines().find(|l| l.split_whitespace().nth(2) == Some(stream)).unwrap_or_default();
        line.split_whitespace().map(str::to_string).collect()
    };
    let unserved = row("BW_SEND_2");
    let depth = PER_SENDER.to_string();
    assert_eq!((unserved[3].as_str(), unserved.last().map(String::as_str)), (depth.as_str(), Some("never")), "{out}");
    assert!(row("BW_SEND_1").last().is_some_and(|d| d.ends_with("ago")), "partition 1 was served: {out}");
    assert!(out.contains("send partitions: 3, ledger partitions: 1"), "{out}");
    for (p, phone) in phones.iter().enumerate() {
        let subject = send.outbox_subject(names::Lane::High, phone);
        assert_eq!(subject.starts_with("bw.outbox.v1."), p == 0, "{subject}: only partition 0 keeps the old subjects");
    }

    // A dispatcher for partition 2 takes them.
    let mut second = bw_e2e::pairs(&breaker_keys);
    second.push(("dispatch.partitions", "[2]".into()));
    h.start_dispatcher(&second).await;
    assert!(h.wait_all(&ops[2], &delivered, Duration::from_secs(60)).await, "partition 2's sender delivered");

    let oracle = h.sim.oracle();
    let all: Vec<String> = ops.concat();
    for op in &all {
        assert_eq!(oracle.get(op).map(|e| e.count), Some(1), "{op} accepted exactly once");
    }
    // The sender of partition 1 went through its DLQ (BW_DLQ_1) and back through bw.outbox.p1.v1.rh.<phone>.
    let mut replayed = 0;
    for op in &ops[1] {
        replayed += usize::from(h.ledger_entry(op).await.expect("entry").entry.replays > 0);
    }
    assert!(replayed > 0, "some of partition 1's operations were replayed");

    // Three work streams and three DLQ streams, each with its own subjects; all drained. The senders of
    // partitions 0 and 1 dead-lettered into their own partition's DLQ; partition 2's sender, served only after the
    // outage, never did.
    for p in 0..SEND {
        let name = names::SendPartitions::stream(p);
        let mut stream = h.js.get_stream(&name).await.expect("partition stream");
        let info = stream.info().await.expect("info");
        assert_eq!(info.config.subjects, [names::SendPartitions::stream_subjects(p)], "{name}");
        assert_eq!(info.state.messages, 0, "{name} drained");
        let name = names::SendPartitions::dlq_stream(p);
        let mut stream = h.js.get_stream(&name).await.expect("dlq partition stream");
        let info = stream.info().await.expect("info");
        assert_eq!(info.config.subjects, [names::SendPartitions::dlq_all(p)], "{name}");
        assert_eq!(info.state.messages, 0, "{name} drained");
        assert_eq!(info.state.last_sequence > 0, p < 2, "{name} held dead letters only of a sender that failed");
    }

    // Accounting and bwctl read every partition.
    let report = bw_ops::account::account_expected(&h.js, &h.buckets, &all).await.expect("accounting");
    assert!(report.is_clean(), "{report}");
    let (code, out) = crate::bwctl(&h.nats.url(), &["account"]).await;
    assert_eq!(code, 0, "{out}");

    // A service given another send partition count refuses to start, naming the setting.
    for wrong in [1, 4] {
        let text = refusal(h.nats.url(), |cfg| cfg.send_partitions = wrong).await;
        assert!(text.contains("nats.send_partitions is") && text.contains("3 partition(s)"), "{text}");
    }
}

/// How many keys each bucket of `bucket_of` 0..n holds (None for a bucket that does not exist).
async fn keys_per_bucket(
    js: &async_nats::jetstream::Context,
    bucket_of: fn(usize) -> String,
    n: usize,
) -> Vec<Option<usize>> {
    let mut out = Vec::new();
    for i in 0..n {
        match js.get_key_value(bucket_of(i)).await {
            Ok(store) => {
                let keys = store.keys().await.expect("keys");
                out.push(Some(keys.filter_map(|k| async move { k.ok() }).count().await));
            }
            Err(_) => out.push(None),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwctl_repartitions_a_stopped_ledger_and_the_services_follow_the_new_count() {
    const OPS: usize = 300;
    let h = Harness::start_partitioned(SimConfig::default(), 2).await;
    // What a stopped deployment leaves: ledger entries and their wamid links in two partitions.
    let ops: Vec<String> = (0..OPS).map(|i| format!("repart-{i:04}")).collect();
    for (i, op) in ops.iter().enumerate() {
        let request = bw_e2e::order(PHONE, op, i);
        h.ledger.create(&bw_common::ledger::entry_for(&request, OperationState::Sent)).await.expect("create");
        h.ledger.link_wamid(&format!("wamid.{op}"), op).await.expect("link");
    }
    let connect = |n: usize| {
        let mut cfg = bw_common::config::NatsConfig::single(h.nats.url(), "e2e-repartition");
        cfg.ledger_partitions = n;
        async move { bw_common::service::Deps::connect("dispatcher", &cfg, None, Duration::from_secs(5)).await }
    };

    // The feed publisher has not published partition 1's revisions: refused, nothing changed.
    let stream = h.js.get_stream("KV_BW_LEDGER_1").await.expect("partition 1");
    let behind = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some(names::FEED_CONSUMER.into()),
        deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::All,
        ..Default::default()
    };
    stream.get_or_create_consumer(names::FEED_CONSUMER, behind).await.expect("feed consumer");
    let err = bw_ops::repartition::repartition_ledger(&h.js, 3).await.expect_err("feed behind");
    assert!(err.to_string().contains("KV_BW_LEDGER_1") && err.to_string().contains("feed"), "{err}");
    connect(2).await.expect("still two partitions: nothing changed");
    // Caught up (a consumer at the end of the stream): it goes ahead.
    stream.delete_consumer(names::FEED_CONSUMER).await.expect("deleted");
    let caught_up = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some(names::FEED_CONSUMER.into()),
        deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::New,
        ..Default::default()
    };
    stream.get_or_create_consumer(names::FEED_CONSUMER, caught_up).await.expect("feed consumer");

    // 2 -> 3.
    let (code, out) = crate::bwctl(&h.nats.url(), &["ledger", "repartition", "--to", "3", "--yes"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ledger partitions: 2 -> 3"), "{out}");
    assert!(out.contains("created: BW_LEDGER_2, BW_WAMID_2"), "{out}");
    for op in &ops {
        let home = names::ledger_partition(op, 3);
        for i in 0..3 {
            let store = h.js.get_key_value(names::ledger_bucket(i)).await.expect("bucket");
            assert_eq!(store.get(op).await.expect("read").is_some(), i == home, "{op} in partition {i} (home {home})");
        }
    }
    let entries = keys_per_bucket(&h.js, names::ledger_bucket, 3).await;
    let links = keys_per_bucket(&h.js, names::wamid_bucket, 3).await;
    assert!(entries.iter().all(|n| n.is_some_and(|n| n > 0)), "entries per partition: {entries:?}");
    assert_eq!(entries.iter().flatten().sum::<usize>(), OPS, "{entries:?}");
    assert_eq!(links.iter().flatten().sum::<usize>(), OPS, "{links:?}");
    // The feed publisher starts afresh at the end of each stream: the moved entries are not published twice.
    let consumer: Result<async_nats::jetstream::consumer::PullConsumer, _> =
        stream.get_consumer(names::FEED_CONSUMER).await;
    assert!(consumer.is_err(), "the feed publisher's consumer was removed");
    // Run again (as after an interruption): nothing left to move.
    let (code, out) = crate::bwctl(&h.nats.url(), &["ledger", "repartition", "--to", "3", "--yes"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("moved 0 entries and 0 wamid links; 600 already in place"), "{out}");

    // The services follow the new count: 3 starts and finds every entry and link, 2 is refused.
    let deps = connect(3).await.expect("three partitions");
    let ledger = bw_common::ledger::Ledger::new(&deps.buckets);
    for op in &ops {
        assert!(ledger.get(op).await.expect("read").is_some(), "{op} found");
        let found = ledger.operation_for_wamid(&format!("wamid.{op}")).await.expect("link read");
        assert_eq!(found.as_deref(), Some(op.as_str()));
    }
    let refused = refusal(h.nats.url(), |cfg| cfg.ledger_partitions = 2).await;
    assert!(refused.contains("3 partition(s)"), "{refused}");

    // 3 -> 1: everything in partition 0, the others deleted.
    let (code, out) = crate::bwctl(&h.nats.url(), &["ledger", "repartition", "--to", "1", "--yes"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("deleted (empty): BW_LEDGER_1, BW_LEDGER_2, BW_WAMID_1, BW_WAMID_2"), "{out}");
    assert_eq!(keys_per_bucket(&h.js, names::ledger_bucket, 3).await, [Some(OPS), None, None]);
    assert_eq!(keys_per_bucket(&h.js, names::wamid_bucket, 3).await, [Some(OPS), None, None]);
    let deps = connect(1).await.expect("one partition");
    let ledger = bw_common::ledger::Ledger::new(&deps.buckets);
    for op in &ops {
        assert!(ledger.get(op).await.expect("read").is_some(), "{op} found");
    }
    let report = bw_ops::account::account(&deps.js, &deps.buckets).await.expect("accounting");
    assert_eq!(report.ledger_entries, OPS as u64, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bwctl_repartitions_a_drained_send_layout_and_the_services_follow_the_new_count() {
    let mut h = Harness::start_split(SimConfig::default(), 1, 2).await;
    let two = h.buckets.send;
    let phone_of = |send: names::SendPartitions, partition: usize| {
        (0..).map(|i| format!("1065403522{i:05}")).find(|p| send.of(p) == partition).expect("phone")
    };
    // A message still waiting in partition 1: refused, nothing changed.
    h.preload(&[bw_e2e::order(&phone_of(two, 1), "send-repart-waiting", 1)]).await;
    let err = bw_ops::repartition::repartition_send(&h.js, 3).await.expect_err("BW_SEND_1 holds a message");
    assert!(err.to_string().contains("BW_SEND_1 still holds 1 message"), "{err}");
    assert_eq!(bw_common::nats::send_partitions(&h.js).await.expect("layout"), two, "nothing changed");

    // Drained: 2 -> 3.
    h.js.get_stream("BW_SEND_1").await.expect("stream").purge().await.expect("drained");
    let (code, out) = crate::bwctl(&h.nats.url(), &["send", "repartition", "--to", "3", "--yes"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("send partitions: 2 -> 3"), "{out}");
    assert!(out.contains("deleted (empty): BW_DLQ, BW_DLQ_1, BW_SEND, BW_SEND_1"), "{out}");
    assert!(out.contains("created: BW_DLQ, BW_DLQ_1, BW_DLQ_2, BW_SEND, BW_SEND_1, BW_SEND_2"), "{out}");
    let three = bw_common::nats::send_partitions(&h.js).await.expect("layout");
    assert_eq!(three.count(), 3);

    // The services follow: one given 2 is refused; ingest and a dispatcher given 3 deliver a message of a sender
    // of the new partition 2.
    let refused = refusal(h.nats.url(), |cfg| cfg.send_partitions = 2).await;
    assert!(refused.contains("nats.send_partitions is 2") && refused.contains("3 partition(s)"), "{refused}");
    h.send_partitions = 3;
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    let ops = h.submit_orders(&phone_of(three, 2), "send-repart", 5).await;
    let delivered = [OperationState::Delivered, OperationState::Read];
    assert!(h.wait_all(&ops, &delivered, Duration::from_secs(60)).await, "delivered on the new layout");
    let mut stream = h.js.get_stream("BW_SEND_2").await.expect("partition 2");
    assert_eq!(stream.info().await.expect("info").state.last_sequence, 5, "they went through BW_SEND_2");
}
