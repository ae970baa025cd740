//! Shared pieces of the resilience tests: requests, a producer that keeps retrying until ingest accepts,
//! waiting for the ledger to settle, the verdict (accounting + duplicates at Meta), and service processes.

use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_drill::stack::{Services, bin_dir};
use bw_meta_sim::{Limits, OracleSnapshot, SimConfig};
use bw_ops::account::AccountingReport;
use bw_proto::v1::{LedgerEntry, OperationState, RejectReason, SendRequest};
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// States in which Meta has accepted the operation.
pub(super) const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

/// Settled states under broker faults: Meta accepted it, or a write whose answer was lost made its outcome
/// ambiguous and it waits, flagged, for reconciliation (never resent blindly).
pub(super) const SETTLED: [OperationState; 4] =
    [OperationState::Sent, OperationState::Delivered, OperationState::Read, OperationState::Unknown];

/// Every operation of `ops` that is UNKNOWN is flagged as such, and there are at most `max` of them.
pub(super) async fn assert_unknowns_flagged(js: &jetstream::Context, buckets: &Buckets, ops: &[String], max: usize) {
    let entries = ledger(js, buckets).await;
    let unknown: Vec<&LedgerEntry> =
        ops.iter().filter_map(|op| entries.get(op)).filter(|e| e.state() == OperationState::Unknown).collect();
    assert!(unknown.iter().all(|e| e.flagged_unknown), "unknown outcomes are flagged");
    assert!(unknown.len() <= max, "at most {max} ambiguous outcomes, got {}", unknown.len());
}

/// `n` requests ([`bw_e2e::order`]) with operation ids `<prefix>-<i>`.
pub(super) fn requests(phone: &str, prefix: &str, n: usize) -> Vec<SendRequest> {
    (0..n).map(|i| bw_e2e::order(phone, &format!("{prefix}-{i:06}"), i)).collect()
}

/// A simulator without Meta's rate limits (Breakwater's own limits are what the tests exercise), with or
/// without status webhooks.
pub(super) fn sim(webhooks: bool) -> SimConfig {
    let mut cfg = SimConfig { limits: Limits::disabled(), usage_headers: false, ..SimConfig::default() };
    if !webhooks {
        cfg.webhook.sent_delay_ms = None;
        cfg.webhook.delivered_delay_ms = None;
        cfg.webhook.read_delay_ms = None;
    }
    cfg
}

/// A harness whose simulator (no webhooks) answers each call after ~20 ms, so calls are on the wire when a
/// dispatcher process dies, with ingest running (no webhook processing): the start of the kill tests.
pub(super) async fn slow_harness() -> bw_e2e::Harness {
    let mut h = bw_e2e::Harness::start(sim(false)).await;
    h.sim.set_scenario(bw_meta_sim::Scenario {
        name: "slow".into(),
        latency: Some(bw_meta_sim::Latency::Fixed { ms: 20 }),
        ..bw_meta_sim::Scenario::default()
    });
    h.start_ingest(&[("webhook.process", "false".into())]).await;
    h
}

/// Dispatcher breaker settings for a test: sender rate `rate_per_s`, no trips (the failure-rate rule needs
/// more calls than any test makes), no ramp, no pair limit in the way.
pub(super) fn breaker(rate_per_s: u32) -> Vec<(&'static str, String)> {
    vec![
        ("breaker.defaults.rate_per_s", rate_per_s.to_string()),
        ("breaker.defaults.burst", (rate_per_s / 5).max(10).to_string()),
        ("breaker.defaults.min_calls", "1000000".into()),
        ("breaker.defaults.fast_trip_failures", "0".into()),
        ("breaker.defaults.ramp_ms", "0".into()),
        ("breaker.defaults.pair_burst", "1000".into()),
    ]
}

/// Submits every request through ingest, retrying (same operation id) until it is accepted or `within`
/// passes; returns the accepted operation ids. Panics on a rejection other than "unavailable".
pub(super) async fn submit(
    client: &bw_client::Client,
    requests: Vec<SendRequest>,
    concurrency: usize,
    within: Duration,
) -> Vec<String> {
    let deadline = Instant::now() + within;
    let results: Vec<Result<String, String>> = futures::stream::iter(requests)
        .map(|r| {
            let client = client.clone();
            async move {
                let mut last = String::new();
                while Instant::now() < deadline {
                    match client.send(&r).await {
                        Ok(reply) if reply.accepted => return Ok(r.operation_id),
                        Ok(reply) if reply.reason() == RejectReason::Unavailable => last = reply.error,
                        Ok(reply) => panic!("{} rejected: {:?} {}", r.operation_id, reply.reason(), reply.error),
                        Err(e) => last = e.to_string(),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(format!("{}: {last}", r.operation_id))
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let (ok, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
    let failed: Vec<String> = failed.into_iter().filter_map(Result::err).collect();
    assert!(failed.is_empty(), "{} requests never accepted, first: {:?}", failed.len(), failed.first());
    ok.into_iter().filter_map(Result::ok).collect()
}

/// Every ledger entry by operation id.
pub(super) async fn ledger(js: &jetstream::Context, buckets: &Buckets) -> HashMap<String, LedgerEntry> {
    match bw_ops::account::ledger_entries(js, buckets).await {
        Ok(entries) => entries.into_iter().map(|e| (e.operation_id.clone(), e)).collect(),
        Err(_) => HashMap::new(),
    }
}

/// How many of `ops` are in each state (for failure messages).
pub(super) fn state_counts(entries: &HashMap<String, LedgerEntry>, ops: &[String]) -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for op in ops {
        let label = entries.get(op).map(|e| e.state().label()).unwrap_or("missing");
        *out.entry(label).or_default() += 1;
    }
    out
}

/// Waits until every operation of `ops` is in one of `states`; on timeout, panics with the state counts.
pub(super) async fn wait_states(
    js: &jetstream::Context,
    buckets: &Buckets,
    ops: &[String],
    states: &[OperationState],
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let entries = ledger(js, buckets).await;
        let done = ops.iter().all(|op| entries.get(op).is_some_and(|e| states.contains(&e.state())));
        if done {
            return;
        }
        if Instant::now() >= deadline {
            let report = match bw_ops::account::account_expected(js, buckets, ops).await {
                Ok(r) => r.to_string(),
                Err(e) => format!("accounting failed: {e}"),
            };
            panic!(
                "operations not settled in {within:?}: {:?} (waiting for {states:?}); accounting:\n{report}",
                state_counts(&entries, ops)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a test concludes: the accounting report and every operation Meta accepted more than once.
pub(super) struct Verdict {
    pub report: AccountingReport,
    /// (operation id, times accepted by Meta, ledger says its outcome was once unknown).
    pub duplicates: Vec<(String, u32, bool)>,
    /// Operations Meta accepted at least once.
    pub reached_meta: usize,
}

impl Verdict {
    /// Runs the accounting check for `ops` and reads duplicates from the oracle.
    pub(super) async fn of(
        js: &jetstream::Context,
        buckets: &Buckets,
        oracle: &OracleSnapshot,
        ops: &[String],
    ) -> Verdict {
        // A copy the reconciler has yet to acknowledge (its operation already resolved by a status webhook) is
        // a moment of the system settling, not a loss: give it a few seconds to settle before judging.
        let settle_until = Instant::now() + Duration::from_secs(20);
        // The same goes for a read that times out while a cluster is still electing leaders.
        let report = loop {
            match bw_ops::account::account_expected(js, buckets, ops).await {
                Ok(report) if report.is_clean() || Instant::now() >= settle_until => break report,
                Ok(_) => {}
                Err(e) if Instant::now() >= settle_until => panic!("accounting cannot run: {e}"),
                Err(e) => eprintln!("accounting read failed, retrying: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let entries = ledger(js, buckets).await;
        let mut reached_meta = 0;
        let mut duplicates = Vec::new();
        for op in ops {
            let count = oracle.get(op).map(|e| e.count).unwrap_or(0);
            if count > 0 {
                reached_meta += 1;
            }
            if count > 1 {
                let flagged = entries.get(op).is_some_and(|e| e.flagged_unknown);
                duplicates.push((op.clone(), count, flagged));
            }
        }
        for (op, count, _) in duplicates.iter().take(5) {
            if let Some(e) = entries.get(op) {
                eprintln!(
                    "  {op}: accepted {count}x by Meta; ledger {} after {} recorded attempt(s), flagged_unknown {}",
                    e.state().label(),
                    e.attempts,
                    e.flagged_unknown
                );
            }
        }
        eprintln!(
            "verdict: {} operations, lost {}, clean {}, reached Meta {}, sent more than once {} (flagged unknown {})",
            ops.len(),
            report.lost_count(),
            report.is_clean(),
            reached_meta,
            duplicates.len(),
            duplicates.iter().filter(|d| d.2).count()
        );
        Verdict { report, duplicates, reached_meta }
    }

    /// Zero lost, nothing in two places, nothing misplaced.
    pub(super) fn assert_nothing_lost(&self) {
        assert_eq!(self.report.lost_count(), 0, "lost operations:\n{}", self.report);
        assert!(self.report.is_clean(), "accounting not clean:\n{}", self.report);
    }

    /// Duplicates whose outcome was never flagged unknown (the only ones allowed to be sent twice).
    pub(super) fn unflagged_duplicates(&self) -> Vec<&(String, u32, bool)> {
        self.duplicates.iter().filter(|d| !d.2).collect()
    }

    /// No operation was accepted by Meta twice unless its outcome had been unknown.
    pub(super) fn assert_no_blind_duplicates(&self) {
        let blind = self.unflagged_duplicates();
        assert!(blind.is_empty(), "sent twice without an unknown outcome: {blind:?}");
    }
}

/// Fails with a clear message when a service binary is missing (cargo does not build other packages'
/// binaries for a test).
pub(super) fn require_binaries(services: &[&str]) {
    let dir = bin_dir();
    let missing: Vec<String> = services.iter().map(|s| format!("bw-{s}")).filter(|b| !dir.join(b).is_file()).collect();
    assert!(
        missing.is_empty(),
        "service binaries {missing:?} not found in {}; build them first: \
         cargo build -p bw-dispatcher -p bw-ingest -p bw-replay -p bw-breaker-coordinator",
        dir.display()
    );
}

/// A process set whose logs go to a fresh directory under the system temp dir.
pub(super) fn services(test: &str, needs: &[&str]) -> Services {
    require_binaries(needs);
    let dir = std::env::temp_dir().join(format!("bw-resilience-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("service logs: {}", dir.display());
    Services::new(bin_dir(), dir)
}

/// Dispatcher process settings against the given servers and simulator.
pub(super) fn dispatcher_settings(nats_url: &str, redis_url: &str, meta_url: &str) -> Vec<(&'static str, String)> {
    let mut s = vec![
        ("nats.url", nats_url.to_string()),
        ("redis.url", redis_url.to_string()),
        ("meta.base_url", meta_url.to_string()),
        ("meta.access_token", bw_e2e::ACCESS_TOKEN.to_string()),
        ("meta.request_timeout_ms", "2000".to_string()),
        ("dispatch.ack_wait_ms", "3000".to_string()),
        ("dispatch.retry_base_ms", "100".to_string()),
        ("dispatch.retry_cap_ms", "500".to_string()),
        ("dispatch.idle_wait_ms", "50".to_string()),
        ("dispatch.shutdown_grace_ms", "2000".to_string()),
        // Dev tenancy, like the harness's relaxed services: these tests are about processes and servers.
        ("tenancy.mode", "dev".to_string()),
    ];
    s.extend(breaker(300));
    s
}

/// Runs a blocking server operation (stop, restart) without stalling the runtime's other tasks.
pub(super) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Connects to a NATS cluster (`urls`, comma-separated) and creates the replicated (R3) topology with the ledger in
/// `ledger_partitions` partitions, waiting up to `wait` for the cluster to elect its JetStream meta leader first.
/// The client takes its replies on the tenant `default`'s inbox prefix, so it can also send as that producer.
pub(super) async fn cluster_topology(
    urls: &str,
    name: &str,
    (ledger_partitions, send_partitions): (usize, usize),
    wait: Duration,
) -> (async_nats::Client, jetstream::Context, Buckets) {
    let nats_cfg = bw_common::config::NatsConfig {
        replicas: 3,
        ledger_partitions,
        send_partitions,
        inbox_prefix: bw_wire::tenancy::inbox_prefix(bw_wire::tenancy::DEFAULT_TENANT),
        ..bw_common::config::NatsConfig::single(urls, name)
    };
    let client = bw_common::nats::connect(&nats_cfg, "e2e", wait).await.expect("cluster reachable");
    let js = jetstream::new(client.clone());
    let deadline = Instant::now() + wait;
    let buckets = loop {
        match bw_common::nats::ensure_topology(&js, &nats_cfg).await {
            Ok(b) => break b,
            Err(e) => {
                assert!(Instant::now() < deadline, "replicated topology not created: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    (client, js, buckets)
}
