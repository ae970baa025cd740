//! The servers Breakwater stands on fail under load: nats-server restarts, a 3-node NATS cluster loses its
//! stream leader, Redis restarts (losing its data) and Redis is unreachable for a while.

use super::common::{
    SENT, SETTLED, Verdict, assert_unknowns_flagged, blocking, breaker, cluster_topology, dispatcher_settings,
    requests, services, sim, submit, wait_states,
};
use bw_e2e::{ACCESS_TOKEN, APP_SECRET, Harness, WABA_ID};
use bw_wire::names;
use std::time::Duration;

const PHONE: &str = "106540352242941";
const WAIT: Duration = Duration::from_secs(60);

/// nats-server is stopped and started again on the same store while ingest accepts requests and the
/// dispatcher sends. The producer retries with the same operation ids until ingest answers.
///
/// Proves: the in-process services reconnect on their own, the file store keeps every stream and the ledger,
/// nothing is lost, and nothing is sent twice unless its outcome was flagged unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_server_restarted_under_load_loses_nothing() {
    let mut h = Harness::start(sim(false)).await;
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    h.start_dispatcher(&breaker(200)).await;
    let producer = h.producer();
    let submitting = tokio::spawn(async move { submit(&producer, requests(PHONE, "nr", 800), 4, WAIT).await });
    assert!(bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= 100 }).await, "sending started");
    blocking(|| h.nats.restart());
    let before = h.sim.total_accepted();
    eprintln!("nats-server restarted after {before} sends");
    let ops = submitting.await.expect("producer task");
    assert_eq!(ops.len(), 800, "every request was eventually accepted");
    wait_states(&h.js, &h.buckets, &ops, &SETTLED, WAIT).await;
    // Only what was in flight around the restart can be ambiguous: a small share, never most of the run.
    assert_unknowns_flagged(&h.js, &h.buckets, &ops, ops.len() / 10).await;
    let verdict = Verdict::of(&h.js, &h.buckets, &h.sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    verdict.assert_no_blind_duplicates();
    assert!(before < 800, "the restart happened under load");
}

/// A 3-node JetStream cluster with every stream and bucket replicated 3 times; ingest and two dispatchers
/// run as processes connected to all three nodes. Under load, the node leading BW_SEND is killed with
/// SIGKILL: the cluster elects a new leader and the services carry on through the two remaining nodes.
///
/// Proves: nothing lost and nothing sent twice unless flagged unknown, with one of three nodes gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_node_nats_cluster_losing_the_stream_leader_loses_nothing() {
    bw_common::crypto::install_crypto();
    let mut cluster = bw_testkit::NatsCluster::start();
    let redis = bw_testkit::RedisServer::start();
    let mut sim_cfg = sim(false);
    sim_cfg.app_secret = APP_SECRET.into();
    sim_cfg.access_tokens = vec![ACCESS_TOKEN.into()];
    sim_cfg.waba_id = WABA_ID.into();
    let sim = bw_meta_sim::MetaSim::start(sim_cfg).await.expect("simulator");
    let urls = cluster.urls();
    let (client, js, buckets) = cluster_topology(&urls, "e2e-cluster", (1, 1), WAIT).await;
    let info = js.get_stream(names::SEND_STREAM).await.expect("stream").info().await.expect("info").clone();
    assert_eq!(info.config.num_replicas, 3, "BW_SEND is replicated on all three nodes");

    // Ingest at its compiled tenancy: the sender registered to the tenant `default` in the replicated registry.
    bw_common::registry::Registry::open(&js, 3).await.expect("replicated sender registry");
    bw_e2e::register_senders(&js, &[(PHONE, WABA_ID)]).await;
    let mut procs = services("nats-cluster", &["dispatcher", "ingest"]);
    procs
        .spawn(
            "ingest",
            &[
                ("nats.url", urls.clone()),
                ("nats.replicas", "3".into()),
                // The per-recipient order sets (ingest's default keeps order for most categories).
                ("redis.url", redis.url()),
                ("http.listen", format!("127.0.0.1:{}", bw_testkit::free_port())),
                ("webhook.app_secret", APP_SECRET.into()),
                ("webhook.verify_token", "e2e-verify".into()),
                ("webhook.process", "false".into()),
            ],
        )
        .expect("spawn ingest");
    let mut settings = dispatcher_settings(&urls, &redis.url(), &sim.base_url());
    settings.push(("nats.replicas", "3".into()));
    procs.spawn("dispatcher", &settings).expect("spawn dispatcher");
    procs.spawn("dispatcher", &settings).expect("spawn dispatcher");
    procs.wait_ready(WAIT).await.expect("services ready");

    let producer = bw_client::Client::new(client.clone());
    let submitting = tokio::spawn(async move { submit(&producer, requests(PHONE, "nc", 600), 8, WAIT).await });
    assert!(bw_testkit::wait_until(WAIT, || async { sim.total_accepted() >= 100 }).await, "sending started");
    let mut stream = js.get_stream(names::SEND_STREAM).await.expect("stream");
    let leader = stream.info().await.expect("info").cluster.as_ref().and_then(|c| c.leader.clone()).expect("a leader");
    let index: usize = leader.trim_start_matches("bw-n").parse().expect("leader is one of bw-n0..bw-n2");
    blocking(|| cluster.nodes[index].kill());
    let at_kill = sim.total_accepted();
    eprintln!("killed BW_SEND leader {leader} after {at_kill} sends");

    let ops = submitting.await.expect("producer task");
    assert_eq!(ops.len(), 600, "every request was eventually accepted");
    wait_states(&js, &buckets, &ops, &SETTLED, Duration::from_secs(90)).await;
    // Only what was in flight around the failover can be ambiguous: a small share, never most of the run.
    assert_unknowns_flagged(&js, &buckets, &ops, ops.len() / 10).await;
    let new_leader = stream.info().await.expect("info").cluster.as_ref().and_then(|c| c.leader.clone());
    assert!(new_leader.is_some_and(|l| l != leader), "a new leader took over");
    let verdict = Verdict::of(&js, &buckets, &sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    verdict.assert_no_blind_duplicates();
    assert!(at_kill < 600, "the node died under load");
}

/// Redis is restarted mid-run (persistence off: every breaker counter and config hash is gone). The
/// dispatcher's breaker answers from its local fallback while Redis is away and uses the fresh Redis after.
///
/// Proves: nothing lost, nothing sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_under_load_loses_nothing() {
    let mut h = Harness::start(sim(false)).await;
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    h.start_dispatcher(&breaker(300)).await;
    let ops = submit(&h.producer(), requests(PHONE, "rr", 900), 64, WAIT).await;
    assert!(bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= 150 }).await, "sending started");
    blocking(|| h.redis.restart());
    let at_restart = h.sim.total_accepted();
    assert!(at_restart < 900, "the restart happened under load ({at_restart} sent)");
    wait_states(&h.js, &h.buckets, &ops, &SENT, WAIT).await;
    let verdict = Verdict::of(&h.js, &h.buckets, &h.sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    assert!(verdict.duplicates.is_empty(), "nothing sent twice: {:?}", verdict.duplicates);
}

/// Redis is unreachable for three seconds while 2,000 messages wait. The breaker library answers from its
/// local conservative fallback (20 msg/s, burst 5 here, against 500 msg/s with Redis), so sending goes on
/// but slowly; when Redis returns, full speed resumes.
///
/// Proves: no unbounded sending without Redis (Meta calls in the outage window stay within the fallback
/// rate), sending does not stop altogether, and nothing is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_falls_back_to_a_bounded_local_rate_and_loses_nothing() {
    let mut h = Harness::start(sim(false)).await;
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    let mut settings = breaker(500);
    settings.extend([
        ("breaker.fallback_rate_per_s", "20".to_string()),
        ("breaker.fallback_burst", "5".to_string()),
        ("breaker.command_timeout_ms", "100".to_string()),
        ("breaker.redis_retry_after_ms", "500".to_string()),
    ]);
    h.start_dispatcher(&settings).await;
    let ops = submit(&h.producer(), requests(PHONE, "ru", 2000), 64, WAIT).await;
    assert!(bw_testkit::wait_until(WAIT, || async { h.sim.total_accepted() >= 300 }).await, "sending started");
    blocking(|| h.redis.kill());
    // Calls admitted just before the kill may still be on the wire; measure from half a second later.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let from = h.sim.counters().requests;
    let window = Duration::from_secs(3);
    tokio::time::sleep(window).await;
    let during = h.sim.counters().requests - from;
    blocking(|| h.redis.restart());
    let bound = 5 + 20 * window.as_secs() + 20;
    eprintln!("Meta calls in {window:?} without Redis: {during} (bound {bound})");
    assert!(during <= bound, "sending without Redis must stay within the local fallback rate: {during} > {bound}");
    assert!(during > 0, "the local fallback keeps sending at a reduced rate");
    assert!(h.sim.total_accepted() < 2000, "messages were still waiting when Redis went away");

    wait_states(&h.js, &h.buckets, &ops, &SENT, WAIT).await;
    let verdict = Verdict::of(&h.js, &h.buckets, &h.sim.oracle(), &ops).await;
    verdict.assert_nothing_lost();
    assert!(verdict.duplicates.is_empty(), "nothing sent twice: {:?}", verdict.duplicates);
}

/// Replicated KV buckets answer reads from their stream leader only; a single-replica bucket keeps direct gets.
/// With direct gets a lagging follower answers the clients connected to its node with old revisions (after a
/// leader change, for as long as it lags), and every compare-and-set built on such a read fails
/// (`bw_common::nats::kv_stream_config`). A replicated bucket created by an earlier version with direct gets is
/// switched to leader reads when a service opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_buckets_read_from_their_stream_leader() {
    use async_nats::jetstream::kv;
    let cluster = bw_testkit::NatsCluster::start();
    let (_client, js, buckets) = cluster_topology(&cluster.urls(), "e2e-leader-reads", (1, 1), WAIT).await;
    for store in [&buckets.ledger[0], &buckets.wamid[0], &buckets.scopes, &buckets.webhook_dedup] {
        let config = &store.stream.cached_info().config;
        assert_eq!(config.num_replicas, 3, "{}", store.name);
        assert!(!config.allow_direct, "{}: replicated, so no direct gets", store.name);
    }
    // Reads and compare-and-set work through the leader.
    let revision = buckets.ledger[0].create("leader-reads", "a".into()).await.expect("create");
    buckets.ledger[0].update("leader-reads", "b".into(), revision).await.expect("compare-and-set");
    let value = buckets.ledger[0].get("leader-reads").await.expect("get").expect("present");
    assert_eq!(value.as_ref(), b"b");

    // A bucket an earlier version created (the client library's own way: direct gets on) is switched.
    let config = kv::Config { bucket: "BW_EARLIER".into(), history: 1, num_replicas: 3, ..Default::default() };
    let old = js.create_key_value(config.clone()).await.expect("created the earlier way");
    assert!(old.stream.cached_info().config.allow_direct, "the client library's buckets use direct gets");
    let reopened = bw_common::nats::open_bucket(&js, config).await.expect("opened");
    assert!(!reopened.stream.cached_info().config.allow_direct, "switched to leader reads");

    // One replica: nothing can lag, direct gets stay.
    let single = bw_testkit::NatsServer::start();
    let client = async_nats::connect(single.url()).await.expect("connects");
    let js = async_nats::jetstream::new(client);
    let nats_cfg = bw_common::config::NatsConfig::single(single.url(), "e2e-direct");
    let buckets = bw_common::nats::ensure_topology(&js, &nats_cfg).await.expect("topology");
    assert!(buckets.ledger[0].stream.cached_info().config.allow_direct, "one replica keeps direct gets");
}
