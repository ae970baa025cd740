//! Pipeline benchmark (issue: dispatcher). Prints, from one run on this machine:
//! - raw JetStream consume-and-ack throughput (the ceiling),
//! - a naive direct-send baseline (HTTP POSTs straight to the simulator, no durability, no breaker),
//! - end-to-end throughput through one and two dispatcher instances (JetStream → ledger → breaker admission
//!   → Meta simulator → ledger → ack), with the simulator's limits disabled,
//! - the latency the pipeline adds at a steady pace (p50/p99), next to the direct-send latency,
//! - many scopes: the same backlog over 4 senders and over 200 (round robin, so each fetched batch of 128 holds
//!   messages of 128 senders, one each), one dispatcher: msg/s and admissions per Redis script call.
//!   Admission and outcome recording are one script call per sender per batch (a scope's keys share one hash
//!   slot, so on Redis Cluster one call cannot span senders), so spreading a batch over many senders costs calls.
//! - the one-dispatcher drain with `dispatch.wamid_link = false` (the mark and the outcome only),
//! - a minimal durable sender: the steps this design's promises need per message and nothing else (ledger read,
//!   on-the-wire mark, POST, outcome with the wamid link alongside, ack; no breaker, limits, Redis, tracing or
//!   metrics), with and without the link: the ceiling of any dispatcher of this design on this machine
//!   (`BW_BENCH_ONLY=floor` runs it with the direct sender and one pipeline drain),
//! - the ledger's write after Meta's 200 on a bare KV bucket: the outcome and the wamid link as two writes
//!   made together (what the dispatcher does) against one JetStream atomic batch holding both (the only way
//!   for the link to share the outcome's commit; `BW_BENCH_ONLY=link` runs this alone),
//! - the 200 senders with BW_SEND in 4 partitions (`nats.send_partitions`), one dispatcher serving all and two
//!   serving two each: a fetch from one partition holds only that partition's quarter of the senders, so a
//!   batch holds more messages per sender.
//!
//! - `BW_BENCH_ONLY=journal`: the one-sender drain with `dispatch.wire_guarantee = "mark"` and `= "journal"`
//!   (docs/decisions/wire-journal.md) from one run: msg/s and the ratio to the naive direct sender, durable
//!   writes per message (last-sequence deltas of KV_BW_LEDGER, KV_BW_WAMID and BW_WIRE_0), and the p50/p99
//!   latency each adds over a direct POST at a steady pace.
//!
//! - `BW_BENCH_ONLY=whatif`: the naive sender, then the one-sender drain once per setting set of
//!   `BW_BENCH_WHATIF="label:key=value,key=value|label:..."` (dispatcher settings on top of the ones below): msg/s,
//!   durable writes, CPU microseconds per message of this process (dispatcher and simulator), nats-server and
//!   redis-server, and Redis script calls and commands per message. What bounds a drain, setting by setting.
//!
//! Run: `cargo bench -p bw-e2e --bench pipeline` (set BW_BENCH_N to change the message count;
//! BW_BENCH_ONLY=pipeline, =spread, =partitions, =floor or =link runs only the one-sender drain, the 200-sender
//! drain, the 200-sender drains with BW_SEND in 4 partitions, the minimal durable sender (with the direct sender
//! and the one-sender drain) or the outcome-and-link comparison, for profiling).
//!
//! The dispatchers run at the compiled default config except what lifts the limits (a rate and burst of 10^6 per
//! sender, a pair burst of 1,000) and `dispatch.publish_outcomes = false` (nothing consumes the feed here). Batch size and in-flight
//! bound are the defaults (128 and 1,024): the larger 256 / 2,048 used before queued more sends behind the
//! ledger writes, so more of them missed their slots, and were no faster (5,547 vs 5,504 msg/s one sender,
//! 2,467 vs 2,948 over 200 senders, one run each).
#![expect(clippy::disallowed_methods, reason = "the benchmark drains streams as a consumer would, without a handler")]

use bw_e2e::Harness;
use bw_proto::v1::{LedgerEntry, OperationState, SendRequest};
use bw_wire::names;
use prost::Message as _;
use std::time::{Duration, Instant};

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PHONE: &str = "106540352249999";

fn request(i: usize, tag: &str) -> SendRequest {
    let mut r = bw_e2e::order(PHONE, &format!("{tag}-{i:07}"), i);
    r.accepted_at_unix_ms = bw_common::time::now_ms();
    r
}

fn unlimited_sim() -> bw_meta_sim::SimConfig {
    let mut cfg =
        bw_meta_sim::SimConfig { limits: bw_meta_sim::Limits::disabled(), usage_headers: false, ..Default::default() };
    // No status webhooks: nothing listens for them in this benchmark.
    cfg.webhook.sent_delay_ms = None;
    cfg.webhook.delivered_delay_ms = None;
    cfg.webhook.read_delay_ms = None;
    cfg
}

fn dispatcher_overrides() -> Vec<(&'static str, String)> {
    vec![
        ("breaker.defaults.rate_per_s", "1000000".into()),
        ("breaker.defaults.burst", "1000000".into()),
        ("breaker.defaults.pair_burst", "1000".into()),
        ("dispatch.publish_outcomes", "false".into()),
    ]
}

/// The backlog `requests` preloaded, then `dispatchers` dispatchers started: msg/s until Meta accepted all of
/// them, and messages per Redis script call (each message is admitted once: the limits are off).
async fn drain(requests: &[SendRequest], dispatchers: usize) -> (f64, f64) {
    drain_split(requests, 1, &vec![""; dispatchers], &[]).await
}

/// [`drain`] with BW_SEND (and the DLQ) in `send_partitions` partitions and one dispatcher per entry of
/// `assigned` serving those partitions (`dispatch.partitions`, e.g. "[0, 1]"; empty: every partition), each
/// with the settings `changed` on top of [`dispatcher_overrides`].
async fn drain_split(
    requests: &[SendRequest],
    send_partitions: usize,
    assigned: &[&str],
    changed: &[(&'static str, String)],
) -> (f64, f64) {
    let n = requests.len();
    let dispatchers = assigned.len();
    let mut h = Harness::start_split(unlimited_sim(), 1, send_partitions).await;
    h.preload(requests).await;
    let mut redis =
        redis::Client::open(h.redis.url()).expect("redis url").get_multiplexed_async_connection().await.expect("redis");
    let before = script_calls(&mut redis).await;
    let started = Instant::now();
    for partitions in assigned {
        let mut overrides = dispatcher_overrides();
        overrides.extend(changed.iter().cloned());
        if !partitions.is_empty() {
            overrides.push(("dispatch.partitions", partitions.to_string()));
        }
        h.start_dispatcher(&overrides).await;
    }
    let done = bw_testkit::wait_until(Duration::from_secs(600), || async { h.sim.total_accepted() >= n as u64 }).await;
    let took = started.elapsed();
    assert!(done, "the backlog of {n} over {dispatchers} dispatcher(s) finished");
    let calls = script_calls(&mut redis).await - before;
    (n as f64 / took.as_secs_f64(), n as f64 / calls.max(1.0))
}

/// One sender's backlog of `n`: msg/s and messages per Redis script call.
async fn pipeline(n: usize, dispatchers: usize) -> (f64, f64) {
    let tag = format!("p{dispatchers}");
    drain(&(0..n).map(|i| request(i, &tag)).collect::<Vec<_>>(), dispatchers).await
}

/// [`pipeline`] with one dispatcher and `dispatch.wamid_link = false`: two ledger writes per send instead of
/// three (msg/s).
async fn pipeline_unlinked(n: usize) -> f64 {
    let requests: Vec<SendRequest> = (0..n).map(|i| request(i, "pu")).collect();
    drain_split(&requests, 1, &[""], &[("dispatch.wamid_link", "false".into())]).await.0
}

/// Durable writes so far to the streams a send writes: the ledger, the wamid links and the wire journal.
async fn durable_writes(js: &async_nats::jetstream::Context) -> [u64; 3] {
    let mut out = [0; 3];
    for (i, stream) in ["KV_BW_LEDGER", "KV_BW_WAMID", "BW_WIRE_0"].into_iter().enumerate() {
        if let Ok(mut s) = js.get_stream(stream).await
            && let Ok(info) = s.info().await
        {
            out[i] = info.state.last_sequence;
        }
    }
    out
}

/// What one drain of [`drain_with`] cost, per message.
struct Drained {
    rate: f64,
    /// Durable writes to the ledger, the wamid links and the wire journal.
    writes: [f64; 3],
    /// CPU microseconds of this process (the dispatcher and the simulator), nats-server and redis-server.
    cpu_us: [f64; 3],
    /// Redis script calls, and every command Redis ran (inside scripts too).
    script_calls: f64,
    redis_commands: f64,
}

/// One sender's backlog of `n` through one dispatcher at `dispatch.wire_guarantee = guarantee`: msg/s, and
/// durable writes per message to the ledger, the wamid links and the journal.
async fn drain_guarantee(n: usize, guarantee: &str) -> (f64, [f64; 3]) {
    let d = drain_with(n, &[("dispatch.wire_guarantee", guarantee.to_string())]).await;
    (d.rate, d.writes)
}

/// One sender's backlog of `n` through one dispatcher with the settings `changed` on top of
/// [`dispatcher_overrides`]: msg/s until Meta accepted all, and per message the durable writes (counted from the
/// preloaded backlog, ingest's ledger creates excluded, until BW_SEND is empty: every outcome written and acked),
/// the CPU and the Redis calls of the drain.
async fn drain_with(n: usize, changed: &[(&'static str, String)]) -> Drained {
    let settings = changed.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    let requests: Vec<SendRequest> = (0..n).map(|i| request(i, "drain")).collect();
    let mut h = Harness::start(unlimited_sim()).await;
    h.preload(&requests).await;
    let before = durable_writes(&h.js).await;
    let mut redis =
        redis::Client::open(h.redis.url()).expect("redis url").get_multiplexed_async_connection().await.expect("redis");
    let redis_before = bw_e2e::redis_command_calls(&mut redis).await;
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let mut overrides = dispatcher_overrides();
    overrides.extend(changed.iter().cloned());
    h.start_dispatcher(&overrides).await;
    let done = bw_testkit::wait_until(Duration::from_secs(600), || async { h.sim.total_accepted() >= n as u64 }).await;
    let took = started.elapsed();
    let cpu_after = cpu_seconds();
    assert!(done, "the backlog of {n} finished with {settings}");
    let redis_after = bw_e2e::redis_command_calls(&mut redis).await;
    let drained = bw_testkit::wait_until(Duration::from_secs(120), || async {
        match h.js.get_stream(names::SEND_STREAM).await {
            Ok(mut s) => s.info().await.is_ok_and(|i| i.state.messages == 0),
            Err(_) => false,
        }
    })
    .await;
    assert!(drained, "every send acked");
    let after = durable_writes(&h.js).await;
    let per = |x: f64| x / n as f64;
    let calls = |c: &str| redis_after.get(c).copied().unwrap_or(0.0) - redis_before.get(c).copied().unwrap_or(0.0);
    Drained {
        rate: n as f64 / took.as_secs_f64(),
        writes: [0, 1, 2].map(|i| per((after[i] - before[i]) as f64)),
        cpu_us: [0, 1, 2].map(|i| per((cpu_after[i] - cpu_before[i]) * 1e6)),
        script_calls: per(calls("evalsha")),
        redis_commands: per(redis_after.keys().map(|c| calls(c)).sum::<f64>() - calls("info")),
    }
}

/// CPU seconds used so far by this process (the dispatcher and the simulator), and by its nats-server and
/// redis-server children (/proc; zeros elsewhere).
fn cpu_seconds() -> [f64; 3] {
    let me = std::process::id();
    let mut out = [bw_e2e::cpu_seconds(me), 0.0, 0.0];
    for pid in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Some((comm, ppid, cpu)) = bw_e2e::process_stat(&pid.file_name().to_string_lossy())
            && ppid == me
        {
            match comm.as_str() {
                "nats-server" => out[1] += cpu,
                "redis-server" => out[2] += cpu,
                _ => {}
            }
        }
    }
    out
}

/// Script calls (EVALSHA) Redis has run so far.
async fn script_calls(redis: &mut redis::aio::MultiplexedConnection) -> f64 {
    bw_e2e::redis_command_calls(redis).await.get("evalsha").copied().unwrap_or(0.0)
}

/// The backlog of `n` messages spread round robin over `senders` numbers, one dispatcher: msg/s, and messages
/// admitted per Redis script call.
async fn spread(n: usize, senders: usize) -> (f64, f64) {
    drain(&spread_requests(n, senders), 1).await
}

/// `n` requests round robin over `senders` numbers.
fn spread_requests(n: usize, senders: usize) -> Vec<SendRequest> {
    let phones: Vec<String> = (0..senders).map(|s| format!("10654035{:07}", 2_250_000 + s)).collect();
    let now = bw_common::time::now_ms();
    (0..n)
        .map(|i| {
            let mut r = bw_e2e::order(&phones[i % senders], &format!("s{senders}-{i:07}"), i);
            r.accepted_at_unix_ms = now;
            r
        })
        .collect()
}

/// 200 senders with BW_SEND in 4 partitions: one dispatcher serving all, and two serving two each (msg/s and
/// messages per Redis script call of each).
async fn partitioned(n: usize) -> ((f64, f64), (f64, f64)) {
    let requests = spread_requests(n, 200);
    let one = drain_split(&requests, 4, &[""], &[]).await;
    let two = drain_split(&requests, 4, &["[0, 1]", "[2, 3]"], &[]).await;
    (one, two)
}

async fn raw_jetstream(n: usize) -> f64 {
    let server = bw_testkit::NatsServer::start();
    let client = async_nats::connect(server.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_or_create_stream(async_nats::jetstream::stream::Config {
            name: "RAW".into(),
            subjects: vec!["raw.>".into()],
            retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .expect("stream");
    let payload = bytes::Bytes::from(vec![7u8; 64]);
    let mut acks = Vec::with_capacity(4096);
    for _ in 0..n {
        acks.push(js.publish("raw.x", payload.clone()).await.expect("publish"));
        if acks.len() == 4096 {
            for a in acks.drain(..) {
                a.await.expect("ack");
            }
        }
    }
    for a in acks.drain(..) {
        a.await.expect("ack");
    }
    let consumer = stream
        .get_or_create_consumer(
            "raw",
            async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("raw".into()),
                max_ack_pending: 100_000,
                ..Default::default()
            },
        )
        .await
        .expect("consumer");
    let started = Instant::now();
    let mut seen = 0;
    use futures::StreamExt;
    while seen < n {
        let mut batch = consumer.fetch().max_messages(1000).messages().await.expect("fetch");
        while let Some(Ok(m)) = batch.next().await {
            m.ack().await.expect("ack");
            seen += 1;
        }
    }
    n as f64 / started.elapsed().as_secs_f64()
}

async fn direct_send(n: usize, concurrency: usize) -> f64 {
    let sim = bw_meta_sim::MetaSim::start(unlimited_sim()).await.expect("sim");
    let http = reqwest::Client::builder().pool_max_idle_per_host(concurrency).build().expect("client");
    let url = format!("{}/v21.0/{PHONE}/messages", sim.base_url());
    let started = Instant::now();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let permit = sem.clone().acquire_owned().await.expect("permit");
        let http = http.clone();
        let url = url.clone();
        let body = bw_dispatcher::build_body(&request(i, "direct"));
        tasks.spawn(async move {
            let r = http.post(url).bearer_auth("t").json(&body).send().await.expect("post");
            assert_eq!(r.status(), 200);
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    n as f64 / started.elapsed().as_secs_f64()
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99))
}

/// Paced load: per message, milliseconds from publish (pipeline) or request start (direct) to acceptance.
async fn latency(rate: f64, seconds: f64) -> ((f64, f64), (f64, f64)) {
    latency_with(rate, seconds, &[]).await
}

/// [`latency`] with the dispatcher's settings `changed` on top of [`dispatcher_overrides`].
async fn latency_with(rate: f64, seconds: f64, changed: &[(&'static str, String)]) -> ((f64, f64), (f64, f64)) {
    let n = (rate * seconds) as usize;
    // Pipeline: publish at a steady pace, read acceptance times from the simulator's oracle.
    let mut h = Harness::start(unlimited_sim()).await;
    let mut overrides = dispatcher_overrides();
    overrides.extend(changed.iter().cloned());
    h.start_dispatcher(&overrides).await;
    // Journal mode: sends wait until the partition is taken over; measure from then.
    if changed.iter().any(|(k, v)| *k == "dispatch.wire_guarantee" && v == "journal") {
        let owned = bw_testkit::wait_until(Duration::from_secs(30), || async {
            match h.js.get_stream("BW_WIRE_0").await {
                Ok(mut s) => s.info().await.is_ok_and(|i| i.state.last_sequence >= 1),
                Err(_) => false,
            }
        })
        .await;
        assert!(owned, "partition 0 taken over");
    }
    let mut published = Vec::with_capacity(n);
    let started = Instant::now();
    for i in 0..n {
        tokio::time::sleep_until((started + Duration::from_secs_f64(i as f64 / rate)).into()).await;
        let r = request(i, "lat");
        let entry = LedgerEntry {
            operation_id: r.operation_id.clone(),
            state: OperationState::Queued as i32,
            ..Default::default()
        };
        h.ledger.create(&entry).await.expect("ledger");
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", r.operation_id.as_str());
        let at = bw_common::time::now_ms();
        bw_common::nats::publish_durable(
            &h.js,
            names::outbox_subject(names::Lane::High, PHONE),
            headers,
            r.encode_to_vec().into(),
        )
        .await
        .expect("publish");
        published.push((r.operation_id, at));
    }
    assert!(bw_testkit::wait_until(Duration::from_secs(60), || async { h.sim.total_accepted() >= n as u64 }).await);
    let oracle = h.sim.oracle();
    let pipeline: Vec<f64> = published
        .iter()
        .filter_map(|(op, at)| oracle.get(op).map(|e| e.first_accepted_ms as f64 - *at as f64))
        .collect();
    drop(h);
    // Direct: the same pace, one POST per message.
    let sim = bw_meta_sim::MetaSim::start(unlimited_sim()).await.expect("sim");
    let http = reqwest::Client::new();
    let url = format!("{}/v21.0/{PHONE}/messages", sim.base_url());
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for i in 0..n {
        tokio::time::sleep_until((started + Duration::from_secs_f64(i as f64 / rate)).into()).await;
        let http = http.clone();
        let url = url.clone();
        let body = bw_dispatcher::build_body(&request(i, "dlat"));
        tasks.spawn(async move {
            let t = Instant::now();
            http.post(url).bearer_auth("t").json(&body).send().await.expect("post");
            t.elapsed().as_secs_f64() * 1000.0
        });
    }
    let mut direct = Vec::new();
    while let Some(Ok(ms)) = tasks.join_next().await {
        direct.push(ms);
    }
    (percentiles(pipeline), percentiles(direct))
}

/// The least any sender keeping this design's promises can do per message, and nothing else: from a work-queue
/// stream, read the ledger entry, set the on-the-wire mark (compare-and-set), POST to the simulator, record the
/// outcome (compare-and-set) with, when `link`, the wamid link written alongside, then ack; up to 1,024 at once
/// (the dispatcher's in-flight bound). No breaker, no rate limits, no Redis, no tracing or metrics: the
/// dispatcher adds those, so its drain cannot beat this one. msg/s.
async fn minimal_durable(n: usize, link: bool) -> f64 {
    use async_nats::jetstream::{consumer, kv, stream};
    use futures::StreamExt;
    let server = bw_testkit::NatsServer::start();
    let client = async_nats::connect(server.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    js.create_stream(stream::Config {
        name: "MIN".into(),
        subjects: vec!["min.>".into()],
        retention: stream::RetentionPolicy::WorkQueue,
        ..Default::default()
    })
    .await
    .expect("stream");
    let config =
        kv::Config { bucket: "MIN".into(), history: 1, storage: stream::StorageType::File, ..Default::default() };
    js.create_stream(bw_common::nats::kv_stream_config(&config)).await.expect("ledger stream");
    let ledger = js.get_key_value("MIN").await.expect("ledger");
    let sim = bw_meta_sim::MetaSim::start(unlimited_sim()).await.expect("sim");
    let http = reqwest::Client::builder().pool_max_idle_per_host(1024).build().expect("client");
    let url = format!("{}/v21.0/{PHONE}/messages", sim.base_url());
    let mut acks = Vec::with_capacity(4096);
    for i in 0..n {
        let r = request(i, if link { "minl" } else { "min" });
        let mut entry = LedgerEntry { operation_id: r.operation_id.clone(), ..Default::default() };
        entry.set_state(OperationState::Queued);
        ledger.create(&r.operation_id, entry.encode_to_vec().into()).await.expect("entry");
        acks.push(js.publish("min.x", r.encode_to_vec().into()).await.expect("publish"));
        if acks.len() == 4096 {
            for a in acks.drain(..) {
                a.await.expect("ack");
            }
        }
    }
    for a in acks.drain(..) {
        a.await.expect("ack");
    }
    let stream = js.get_stream("MIN").await.expect("stream");
    let config =
        consumer::pull::Config { durable_name: Some("min".into()), max_ack_pending: 4096, ..Default::default() };
    let consumer = stream.get_or_create_consumer("min", config).await.expect("consumer");
    let mut messages = consumer.messages().await.expect("messages");
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(1024));
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for _ in 0..n {
        let msg = messages.next().await.expect("open").expect("message");
        let permit = sem.clone().acquire_owned().await.expect("permit");
        let (ledger, http, url) = (ledger.clone(), http.clone(), url.clone());
        tasks.spawn(async move {
            let r = SendRequest::decode(msg.payload.as_ref()).expect("request");
            let op = r.operation_id.as_str();
            let read = ledger.entry(op).await.expect("read").expect("entry");
            let mut entry = LedgerEntry::decode(read.value.as_ref()).expect("entry");
            assert_eq!(entry.state(), OperationState::Queued);
            entry.in_flight_since_unix_ms = bw_common::time::now_ms();
            let marked = ledger.update(op, entry.encode_to_vec().into(), read.revision).await.expect("mark");
            let answer = http.post(url).bearer_auth("t").json(&bw_dispatcher::build_body(&r)).send().await;
            let body: serde_json::Value = answer.expect("post").json().await.expect("json");
            let wamid = body["messages"][0]["id"].as_str().expect("wamid").to_string();
            entry.set_state(OperationState::Sent);
            entry.in_flight_since_unix_ms = 0;
            entry.wamid = wamid.clone();
            let outcome = ledger.update(op, entry.encode_to_vec().into(), marked);
            if link {
                let key = bw_common::ledger::wamid_key(&wamid);
                let (o, l) = tokio::join!(outcome, ledger.put(key, op.to_string().into()));
                o.expect("outcome");
                l.expect("link");
            } else {
                outcome.await.expect("outcome");
            }
            msg.ack().await.expect("ack");
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    n as f64 / started.elapsed().as_secs_f64()
}

/// The ledger's write after Meta's 200, two ways, on one file-backed KV bucket of a fresh nats-server, `n`
/// operations, 256 at a time: (a) what the dispatcher does, the outcome (a compare-and-set update) and the wamid
/// link (a put) as two writes made together; (b) both as one JetStream atomic batch (ADR-50: the link staged,
/// the update committing), the only way for the link to share the outcome's commit. Returns writes/s of
/// operations for (a) and (b).
async fn outcome_with_link(n: usize) -> (f64, f64) {
    use async_nats::jetstream::kv;
    use futures::StreamExt;
    let server = bw_testkit::NatsServer::start();
    let client = async_nats::connect(server.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client.clone());
    let mut config = bw_common::nats::kv_stream_config(&kv::Config {
        bucket: "BENCH".into(),
        history: 1,
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    });
    config.allow_atomic_publish = true;
    js.create_stream(config).await.expect("bucket stream");
    let store = js.get_key_value("BENCH").await.expect("bucket");
    let entry = bytes::Bytes::from(vec![7u8; 160]);
    let mut revisions = Vec::with_capacity(2 * n);
    for i in 0..2 * n {
        revisions.push(store.create(format!("op-{i}"), entry.clone()).await.expect("create"));
    }
    let two_writes = |i: usize| {
        let (store, entry, revision) = (store.clone(), entry.clone(), revisions[i]);
        async move {
            let link = store.put(format!("w/{i}"), format!("op-{i}").into());
            let (updated, linked) = tokio::join!(store.update(format!("op-{i}"), entry, revision), link);
            updated.expect("update");
            linked.expect("link");
        }
    };
    let started = Instant::now();
    futures::stream::iter(0..n).map(two_writes).buffer_unordered(256).collect::<Vec<_>>().await;
    let separate = n as f64 / started.elapsed().as_secs_f64();
    let batch = |i: usize| {
        let (client, js, entry, revision) = (client.clone(), js.clone(), entry.clone(), revisions[i]);
        async move {
            let id = format!("b{i}");
            let mut staged = async_nats::HeaderMap::new();
            staged.insert("Nats-Batch-Id", id.as_str());
            staged.insert("Nats-Batch-Sequence", "1");
            client
                .publish_with_headers(format!("$KV.BENCH.w/{i}"), staged, format!("op-{i}").into())
                .await
                .expect("stage");
            let mut commit = async_nats::HeaderMap::new();
            commit.insert("Nats-Batch-Id", id.as_str());
            commit.insert("Nats-Batch-Sequence", "2");
            commit.insert("Nats-Batch-Commit", "1");
            commit.insert(async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, revision.to_string().as_str());
            js.publish_with_headers(format!("$KV.BENCH.op-{i}"), commit, entry)
                .await
                .expect("commit")
                .await
                .expect("ack");
        }
    };
    let started = Instant::now();
    futures::stream::iter(n..2 * n).map(batch).buffer_unordered(256).collect::<Vec<_>>().await;
    let atomic = n as f64 / started.elapsed().as_secs_f64();
    (separate, atomic)
}

fn main() {
    bw_common::crypto::install_crypto();
    let n: usize = std::env::var("BW_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        // BW_BENCH_ONLY: one drain alone, for profiling it.
        match std::env::var("BW_BENCH_ONLY").as_deref() {
            Ok("pipeline") => {
                let (rate, per_call) = pipeline(n, 1).await;
                println!("pipeline, 1 dispatcher, {n} messages: {rate:.0} msg/s, {per_call:.2} messages per Redis script call");
                return;
            }
            Ok("spread") => {
                let (rate, per_call) = spread(n, 200).await;
                println!("200 senders, 1 dispatcher, {n} messages: {rate:.0} msg/s, {per_call:.2} messages per Redis script call");
                return;
            }
            Ok("floor") => {
                let direct = direct_send(n, 256).await;
                let with_link = minimal_durable(n, true).await;
                let without = minimal_durable(n, false).await;
                let one = pipeline(n, 1).await.0;
                let unlinked = pipeline_unlinked(n).await;
                println!("{n} messages: naive direct send {direct:.0} msg/s; minimal durable sender {with_link:.0} msg/s ({:.2} of direct), without the wamid link {without:.0} ({:.2}); pipeline, 1 dispatcher {one:.0} ({:.2} of direct, {:.2} of the minimal durable sender), with dispatch.wamid_link = false {unlinked:.0} ({:.2} of direct, {:.2}x linked)", with_link / direct, without / direct, one / direct, one / with_link, unlinked / direct, unlinked / one);
                return;
            }
            Ok("link") => {
                let (separate, atomic) = outcome_with_link(n / 4).await;
                println!("outcome + wamid link, {} operations: two writes {separate:.0}/s, one atomic batch {atomic:.0}/s ({:.3}x)", n / 4, atomic / separate);
                return;
            }
            Ok("journal") => {
                let direct = direct_send(n, 256).await;
                let (mark, mark_writes) = drain_guarantee(n, "mark").await;
                let (journal, journal_writes) = drain_guarantee(n, "journal").await;
                let mark_lat = latency_with(500.0, 6.0, &[("dispatch.wire_guarantee", "mark".into())]).await;
                let journal_lat = latency_with(500.0, 6.0, &[("dispatch.wire_guarantee", "journal".into())]).await;
                println!("wire guarantee, 1 dispatcher, one sender, {n} messages, one run, this machine");
                println!("  naive direct send             {direct:>10.0} msg/s");
                for (name, rate, w, ((p50, p99), (d50, d99))) in [
                    ("mark", mark, mark_writes, mark_lat),
                    ("journal", journal, journal_writes, journal_lat),
                ] {
                    println!("  wire_guarantee = {name:<8}     {rate:>10.0} msg/s   = {:.2} of direct send; durable writes per message: ledger {:.2}, wamid link {:.2}, journal {:.3} (total {:.2})", rate / direct, w[0], w[1], w[2], w[0] + w[1] + w[2]);
                    println!("    latency at 500 msg/s: publish->Meta p50 {p50:.1} ms p99 {p99:.1} ms; added over a direct POST p50 {:.1} ms p99 {:.1} ms", p50 - d50, p99 - d99);
                }
                println!("  journal / mark: {:.2}x msg/s", journal / mark);
                return;
            }
            Ok("whatif") => {
                // BW_BENCH_WHATIF="label:key=value,key=value|label:...": the one-sender drain per setting set.
                let cpu_before = cpu_seconds();
                let direct = direct_send(n, 256).await;
                let us = (cpu_seconds()[0] - cpu_before[0]) * 1e6 / n as f64;
                println!("naive direct send {direct:.0} msg/s, cpu per message {us:.0} us");
                let sets = std::env::var("BW_BENCH_WHATIF").unwrap_or_default();
                for set in sets.split('|').filter(|s| !s.is_empty()) {
                    let (label, pairs) = set.split_once(':').unwrap_or((set, ""));
                    let changed: Vec<(&'static str, String)> = pairs
                        .split(',')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (&*Box::leak(k.to_string().into_boxed_str()), v.to_string()))
                        .collect();
                    let d = drain_with(n, &changed).await;
                    let (w, cpu) = (d.writes, d.cpu_us);
                    println!("  {label:<24} {:>8.0} msg/s = {:.2} of direct; writes/msg ledger {:.2} link {:.2} journal {:.3}", d.rate, d.rate / direct, w[0], w[1], w[2]);
                    println!("    cpu per message: process {:.0} us, nats-server {:.0} us, redis-server {:.0} us", cpu[0], cpu[1], cpu[2]);
                    println!("    redis per message: {:.2} script calls, {:.2} commands in all", d.script_calls, d.redis_commands);
                }
                return;
            }
            Ok("partitions") => {
                let (unsplit, unsplit_per_call) = spread(n, 200).await;
                let ((one, one_per_call), (two, two_per_call)) = partitioned(n).await;
                println!("200 senders, {n} messages: BW_SEND in 1 partition, 1 dispatcher {unsplit:.0} msg/s ({unsplit_per_call:.2} per script call); in 4 partitions, 1 dispatcher {one:.0} msg/s ({:.2}x, {one_per_call:.2} per call), 2 dispatchers serving 2 each {two:.0} msg/s ({:.2}x, {two_per_call:.2} per call)", one / unsplit, two / unsplit);
                return;
            }
            _ => {}
        }
        let raw = raw_jetstream(n * 5).await;
        let (separate, atomic) = outcome_with_link(n / 4).await;
        let direct = direct_send(n, 256).await;
        let floor = minimal_durable(n, true).await;
        let floor_unlinked = minimal_durable(n, false).await;
        let one = pipeline(n, 1).await.0;
        let unlinked = pipeline_unlinked(n).await;
        let two = pipeline(n, 2).await.0;
        let ((p50, p99), (d50, d99)) = latency(500.0, 6.0).await;
        let (few, few_per_call) = spread(n, 4).await;
        let (many, many_per_call) = spread(n, 200).await;
        let ((split_one, split_one_per_call), (split_two, split_two_per_call)) = partitioned(n).await;
        println!("pipeline benchmark, {n} messages (raw JetStream: {} messages), one run, this machine", n * 5);
        println!("  raw JetStream consume+ack     {raw:>10.0} msg/s");
        println!("  naive direct send (no queue)  {direct:>10.0} msg/s");
        println!("  outcome + wamid link ({} ops): two writes {separate:.0}/s, one atomic batch {atomic:.0}/s = {:.3}x (why the link stays a write of its own)", n / 4, atomic / separate);
        println!("  minimal durable sender        {floor:>10.0} msg/s   = {:.2} of direct send (ledger read, mark, POST, outcome + wamid link, ack; nothing else)", floor / direct);
        println!("    without the wamid link      {floor_unlinked:>10.0} msg/s   = {:.2} of direct send", floor_unlinked / direct);
        println!("  pipeline, 1 dispatcher        {one:>10.0} msg/s   = {:.3} of raw JetStream, {:.2} of direct send, {:.2} of the minimal durable sender", one / raw, one / direct, one / floor);
        println!("    dispatch.wamid_link = false {unlinked:>10.0} msg/s   = {:.2} of direct send, {:.2}x the linked drain (two ledger writes per send)", unlinked / direct, unlinked / one);
        println!("  pipeline, 2 dispatchers       {two:>10.0} msg/s   = {:.3} of raw JetStream, {:.2} of direct send, {:.2}x one", two / raw, two / direct, two / one);
        println!("  latency at 500 msg/s: pipeline publish->Meta p50 {p50:.1} ms p99 {p99:.1} ms; direct POST p50 {d50:.1} ms p99 {d99:.1} ms");
        println!("  latency the pipeline adds: p50 {:.1} ms, p99 {:.1} ms", p50 - d50, p99 - d99);
        println!("  4 senders, 1 dispatcher       {few:>10.0} msg/s   {few_per_call:.1} messages per Redis script call");
        println!("  200 senders, 1 dispatcher     {many:>10.0} msg/s   {many_per_call:.2} messages per Redis script call = {:.2}x the msg/s of 4 senders", many / few);
        println!("  200 senders, BW_SEND in 4 partitions (nats.send_partitions = 4):");
        println!("    1 dispatcher serving all    {split_one:>10.0} msg/s   {split_one_per_call:.2} messages per Redis script call = {:.2}x the unpartitioned 200 senders", split_one / many);
        println!("    2 dispatchers, 2 each       {split_two:>10.0} msg/s   {split_two_per_call:.2} messages per Redis script call = {:.2}x the unpartitioned 200 senders", split_two / many);
    });
}
