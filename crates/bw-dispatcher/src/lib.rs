//! The dispatcher: the only component that talks to Meta.
//!
//! It pulls accepted send requests from the BW_SEND work queue through four durable pull consumers, filling a
//! batch in serving order: `rh` = priority (authentication/transactional/support) replayed from the DLQ, `hi` =
//! live priority, `lo` = marketing, `rp` = marketing replayed from the DLQ. Priority follows the message: a
//! marketing message waits while its sender has priority messages in the DLQ or `rh`, and a message that cannot
//! make its deadline ends EXPIRED before any call (`priority.rs`). Each message is checked against the ledger (never send an operation twice) and its
//! deadline, admitted through the Redis breaker and rate limits in one round trip per batch and scope, POSTed
//! to Meta, classified by error code, and moved to exactly one next place: SENT, a delayed redelivery, the
//! DLQ, the quarantine, or the unknown-outcome queue. Any number of instances share the consumers.
//!
//! A message the limits refuse for a short while (sender or pair rate, reserve, canary budget) waits in memory
//! for the slot the admission script names and goes back to admission with the others due then (one round
//! trip per scope and round); longer waits and retries of failed sends are JetStream delayed redeliveries.
//! Messages ingest marked `keeps_order` pass the per-recipient order gate first, in the same round trip: one
//! behind an earlier waiting message to the same recipient waits for it (`order`).
//!
//! Tenancy: in registry mode (the compiled default) a message is sent only while the sender registry still
//! assigns its number to the operation's tenant (the operation key's) under the request's WABA; one whose sender
//! was removed, moved to another tenant or re-registered under another WABA after acceptance goes to the
//! quarantine (`SENDER_REVOKED`, the detail says which), never to Meta and never to the DLQ.
//!
//! Must not: resend an operation the ledger shows as accepted by Meta, retry an unknown outcome, or hold a
//! message in memory for longer than `hold_max_ms`.
//!
//! Entry point: [`run`].

mod attempt;
pub mod budget;
mod gates;
mod late;
mod meta;
mod metrics;
mod moves;
mod order;
mod priority;
mod process;
mod route;

pub use meta::{MetaAnswer, MetaClient, build_body};

use async_nats::jetstream::consumer::{self, pull};
use bw_common::config::{AdminConfig, NatsConfig, RedisConfig, TelemetryConfig};
use bw_common::names::{self, Lane};
use bw_common::service::{Deps, ServiceConfig};
use futures::StreamExt;
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Compiled defaults, every key commented.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Dispatcher configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub nats: NatsConfig,
    pub redis: RedisConfig,
    pub admin: AdminConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    pub meta: MetaConfig,
    pub dispatch: DispatchConfig,
    /// Breaker client settings (local fallback, command timeouts); defaults when absent.
    #[serde(default)]
    pub breaker: bw_breaker::BreakerConfig,
    /// Whether senders are checked against the sender registry before each send (the compiled default).
    #[serde(default)]
    pub tenancy: bw_common::tenancy::TenancyConfig,
    /// The portfolio messaging-limit budget (`budget.rs`).
    #[serde(default)]
    pub budget: budget::BudgetConfig,
}

/// How to reach Meta.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaConfig {
    pub base_url: String,
    pub api_version: String,
    /// Start even though `api_version` has ended (`bw_common::api_versions::check`).
    #[serde(default)]
    pub allow_expired_api_version: bool,
    /// The Meta app the token belongs to: app-wide limits (code 4) pause every number on it. Empty: the
    /// token's fingerprint stands for the app.
    #[serde(default, deserialize_with = "bw_common::config::text")]
    pub app_id: String,
    #[serde(deserialize_with = "bw_common::config::text")]
    pub access_token: String,
    pub connect_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub pool_max_idle_per_host: usize,
}

impl std::fmt::Debug for MetaConfig {
    // The token never appears in logs, even through a debug print of the config.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaConfig")
            .field("base_url", &self.base_url)
            .field("api_version", &self.api_version)
            .field("access_token", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// Dispatch behaviour.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchConfig {
    /// BW_SEND partitions this instance serves (`nats.send_partitions`); empty: every partition.
    #[serde(default)]
    pub partitions: Vec<usize>,
    pub batch_size: usize,
    pub max_in_flight: usize,
    pub max_retries: u32,
    pub retry_base_ms: u64,
    pub retry_cap_ms: u64,
    pub retry_budget_ms: u64,
    pub ack_wait_ms: u64,
    pub unknown_review_ms: u64,
    pub long_pause_ms: u64,
    /// E.164 prefixes Meta does not deliver marketing templates to: such a message ends FAILED unsent and is
    /// never replayed (`gates.rs`).
    pub marketing_undeliverable: Vec<String>,
    pub publish_outcomes: bool,
    pub shutdown_grace_ms: u64,
    pub idle_wait_ms: u64,
    pub hold_max_ms: u64,
    pub readmit_interval_ms: u64,
    /// An admitted message that reaches the wire more than this long after its send slot goes back to
    /// admission instead of leaving late (0: never). See `process::Flown::Late`.
    pub late_send_tolerance_ms: u64,
    /// How long a reading of every sender's priority backlog is reused (the priority gate, `priority.rs`).
    pub priority_backlog_refresh_ms: u64,
    /// Redelivery delay of a marketing message held back while its sender has a priority backlog.
    pub priority_hold_ms: u64,
    /// Older priority first: a live priority message waits while its sender's priority replays are in the rh
    /// lane, until it is this old (or its deadline is nearer); 0 switches the rule off (`priority.rs`, rule 3).
    pub live_priority_hold_max_ms: u64,
    /// Write the wamid → operation link after each send (the third ledger write). Statuses carry
    /// `biz_opaque_callback_data`, which names the operation; the link is the fallback for one without it, and
    /// the reference leaves open whether Meta's `failed` statuses carry it, so the default keeps it (the safe
    /// reading). Off saves a durable write per message: for deployments whose own traffic shows every failed
    /// status carrying it (`bw_status_callback_data_total`, `deploy/runbooks/wamid-link.md`).
    pub wamid_link: bool,
}

impl ServiceConfig for Config {
    fn nats(&self) -> &NatsConfig {
        &self.nats
    }
    fn redis(&self) -> Option<&RedisConfig> {
        Some(&self.redis)
    }
    fn admin(&self) -> &AdminConfig {
        &self.admin
    }
    fn telemetry(&self) -> &TelemetryConfig {
        &self.telemetry
    }
    fn validate(&self) -> Result<(), String> {
        self.breaker.defaults.validate().map_err(|e| format!("breaker.defaults: {e}"))?;
        self.budget.validate()?;
        self.breaker.validate_pool().map_err(|e| format!("breaker: {e}"))?;
        let invalid = |m: &str| Err(m.to_string());
        if self.dispatch.ack_wait_ms <= self.meta.request_timeout_ms {
            return invalid("dispatch.ack_wait_ms must exceed meta.request_timeout_ms");
        }
        if self.dispatch.batch_size == 0 || self.dispatch.max_in_flight < self.dispatch.batch_size {
            return invalid("dispatch.batch_size must be > 0 and <= dispatch.max_in_flight");
        }
        if self.dispatch.hold_max_ms * 2 > self.dispatch.ack_wait_ms {
            return invalid("dispatch.hold_max_ms must be at most half of dispatch.ack_wait_ms");
        }
        if self.dispatch.priority_backlog_refresh_ms == 0 || self.dispatch.priority_hold_ms == 0 {
            return invalid("dispatch.priority_backlog_refresh_ms and dispatch.priority_hold_ms must be > 0");
        }
        if self.dispatch.retry_base_ms == 0 || self.dispatch.retry_cap_ms < self.dispatch.retry_base_ms {
            return invalid("dispatch.retry_base_ms must be > 0 and <= dispatch.retry_cap_ms");
        }
        let send = self.nats.send_partitions;
        if let Some(p) = self.dispatch.partitions.iter().find(|p| **p >= send) {
            return Err(format!(
                "dispatch.partitions names partition {p}, but nats.send_partitions is {send} (partitions 0 to {})",
                send.saturating_sub(1)
            ));
        }
        Ok(())
    }
    fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.dispatch.shutdown_grace_ms)
    }
}

impl Config {
    /// Loads and validates the config from the compiled defaults, an optional file and an env map.
    pub fn load(
        file: Option<&std::path::Path>,
        env: &std::collections::HashMap<String, String>,
    ) -> Result<Config, bw_common::config::ConfigError> {
        bw_common::service::load_config("dispatcher", DEFAULT_CONFIG, file, env)
    }
}

/// Client-side bound on waiting for the answer to a long-poll pull request.
const FETCH_TIMEOUT: Duration = Duration::from_secs(2);
/// Client-side bound on one no-wait fetch of a batch (see the fetch loop in [`run`]).
const FETCH_BOUND: Duration = Duration::from_secs(10);

/// An outstanding long-poll pull request (one message) on a lane.
struct Parked {
    since: tokio::time::Instant,
    batch: pull::Batch,
}

/// Takes the message a parked request received, if any, and clears the slot when the request is over
/// (answered, expired, failed, or unanswered for too long).
fn take_parked(slot: &mut Option<Parked>) -> Option<async_nats::jetstream::Message> {
    use futures::FutureExt;
    let parked = slot.as_mut()?;
    match parked.batch.next().now_or_never() {
        Some(Some(Ok(m))) => {
            *slot = None;
            Some(m)
        }
        Some(_) => {
            *slot = None;
            None
        }
        None => {
            if parked.since.elapsed() > FETCH_TIMEOUT * 2 {
                *slot = None;
            }
            None
        }
    }
}

/// Waits, at most about `idle_wait`, for a message on any lane: every lane without an outstanding long-poll
/// gets one, then the first message to arrive is returned. The other requests stay parked for the next turn.
async fn idle_wait_any(
    consumers: &[(Lane, consumer::Consumer<pull::Config>)],
    parked: &mut [Option<Parked>],
    idle_wait: Duration,
) -> Option<(Lane, async_nats::jetstream::Message)> {
    use futures::FutureExt;
    for (slot, (lane, consumer)) in parked.iter_mut().zip(consumers) {
        if slot.is_none() {
            match tokio::time::timeout(FETCH_TIMEOUT, consumer.batch().max_messages(1).expires(idle_wait).messages())
                .await
            {
                Ok(Ok(batch)) => *slot = Some(Parked { since: tokio::time::Instant::now(), batch }),
                Ok(Err(e)) => tracing::debug!(lane = lane.token(), error = %e, "long poll failed"),
                Err(_) => tracing::debug!(lane = lane.token(), "long poll unanswered"),
            }
        }
    }
    let polls: Vec<_> = parked
        .iter_mut()
        .enumerate()
        .filter_map(|(i, slot)| slot.as_mut().map(|p| async move { (i, p.batch.next().await) }.boxed()))
        .collect();
    if polls.is_empty() {
        return None;
    }
    let ((i, next), _, _) =
        tokio::time::timeout(idle_wait + FETCH_TIMEOUT, futures::future::select_all(polls)).await.ok()?;
    parked[i] = None;
    match next {
        Some(Ok(m)) => Some((consumers[i].0, m)),
        _ => None,
    }
}

/// Creates (or binds to) the durable pull consumer of a lane in BW_SEND (partition 0).
pub async fn lane_consumer(
    js: &async_nats::jetstream::Context,
    lane: Lane,
    ack_wait: Duration,
) -> anyhow::Result<consumer::Consumer<pull::Config>> {
    partition_lane_consumer(js, 0, lane, ack_wait).await
}

/// Creates (or binds to) the durable pull consumer of a lane in one BW_SEND partition (the same name on every
/// partition's stream).
pub async fn partition_lane_consumer(
    js: &async_nats::jetstream::Context,
    partition: usize,
    lane: Lane,
    ack_wait: Duration,
) -> anyhow::Result<consumer::Consumer<pull::Config>> {
    let stream = js.get_stream(names::SendPartitions::stream(partition)).await?;
    let config = pull::Config {
        durable_name: Some(lane.dispatcher_consumer().to_string()),
        filter_subject: names::SendPartitions::lane_filter(partition, lane),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_deliver: -1,
        max_ack_pending: 50_000,
        ..Default::default()
    };
    Ok(stream.get_or_create_consumer(lane.dispatcher_consumer(), config).await?)
}

/// The partitions an instance serves: those configured (in order, once each), or every one.
fn served_partitions(configured: &[usize], send: names::SendPartitions) -> Vec<usize> {
    let mut served: Vec<usize> = Vec::new();
    for &p in configured.iter().filter(|p| **p < send.count()) {
        if !served.contains(&p) {
            served.push(p);
        }
    }
    if served.is_empty() { send.all().collect() } else { served }
}

/// Indexes into the consumers (`per_lane` partitions of each lane, lane after lane) in fetch order for turn
/// `turn`: lanes in serving order, and within each lane the partitions starting at `turn mod per_lane`.
fn fetch_order(consumers: usize, per_lane: usize, turn: usize) -> impl Iterator<Item = usize> {
    let per_lane = per_lane.max(1);
    let start = turn % per_lane;
    (0..consumers).map(move |i| {
        let (lane, k) = (i / per_lane, i % per_lane);
        lane * per_lane + (start + k) % per_lane
    })
}

/// Access tokens the local stack, the drill and the simulator's examples use: fine against the simulator, a
/// mistake anywhere else.
const LOCAL_ACCESS_TOKENS: [&str; 4] = ["local-access-token", "sim-token", "drill-access-token", "e2e-access-token"];

/// What is wrong with the Meta credentials at start-up, if anything (never the token itself): an empty token,
/// or a well-known local one aimed at a Meta that is not on this machine.
fn credentials_warning(meta: &MetaConfig) -> Option<&'static str> {
    if meta.access_token.is_empty() {
        return Some(
            "meta.access_token is empty: Meta answers every send with 190 and the senders pause for credentials; set BW_DISPATCHER__META__ACCESS_TOKEN",
        );
    }
    let local = bw_common::config::points_at_this_machine(&meta.base_url);
    (LOCAL_ACCESS_TOKENS.contains(&meta.access_token.as_str()) && !local).then_some(
        "meta.access_token is a well-known local default but meta.base_url is not on this machine: set the real token (BW_DISPATCHER__META__ACCESS_TOKEN)",
    )
}

/// Runs the dispatcher until `shutdown` is cancelled, then finishes in-flight messages (ack or nak).
pub async fn run(cfg: Config, deps: Deps, shutdown: CancellationToken) -> anyhow::Result<()> {
    if let Some(warning) = credentials_warning(&cfg.meta) {
        tracing::warn!("{warning}");
    }
    let version = &cfg.meta.api_version;
    let today = bw_common::api_versions::today();
    match bw_common::api_versions::check(version, today, cfg.meta.allow_expired_api_version) {
        Err(refusal) => anyhow::bail!("{refusal}"),
        Ok(Some(warning)) => tracing::warn!("{warning}"),
        Ok(None) => {}
    }
    let metrics = metrics::Metrics::register(&deps.metrics);
    metrics.watch_api_version(version, shutdown.clone());
    let breaker = bw_breaker::Breaker::with_conn(deps.redis.clone(), Some(deps.nats.clone()), cfg.breaker.clone());
    breaker.register_metrics(&deps.metrics);
    // App pauses and token halts are keyed by this account (a new token is not under the old one's halt).
    breaker.set_account(&cfg.meta.app_id, &cfg.meta.access_token);
    // Fail fast without Redis while a scope is known to be OPEN; operators' changes arrive as transitions.
    breaker.follow_transitions().await?;
    let ledger = bw_common::ledger::Ledger::new(&deps.buckets);
    let registry = bw_common::registry::view_for(cfg.tenancy.mode, &deps, cfg.nats.replicas, shutdown.clone()).await?;
    if registry.is_dev() {
        tracing::info!("tenancy.mode = \"dev\": senders are not checked against the sender registry");
    }
    let meta = MetaClient::new(&cfg.meta)?;
    let ack_wait = Duration::from_millis(cfg.dispatch.ack_wait_ms);
    let partitions = served_partitions(&cfg.dispatch.partitions, deps.buckets.send);
    // Lane by lane in serving order, each lane's partitions side by side (see the fetch loop).
    let mut consumers = Vec::new();
    for lane in Lane::ALL {
        for &partition in &partitions {
            let consumer = deps
                .startup_step("lane consumer", Duration::from_secs(30), || {
                    partition_lane_consumer(&deps.js, partition, lane, ack_wait)
                })
                .await?;
            consumers.push((lane, consumer));
        }
    }
    let worker = Arc::new(process::Worker {
        js: deps.js.clone(),
        send: deps.buckets.send,
        nats: deps.nats.clone(),
        ledger,
        registry,
        breaker,
        meta,
        cfg: cfg.dispatch.clone(),
        metrics,
        shutdown: shutdown.clone(),
        instance: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
        backlog: priority::Backlog::new(
            deps.js.clone(),
            partitions.clone(),
            Duration::from_millis(cfg.dispatch.priority_backlog_refresh_ms),
        ),
        dlq_limit_signalled: Default::default(),
        late_allowance: Default::default(),
        late_claims: Default::default(),
        mark_lead: Default::default(),
        gates: gates::Gates::new(deps.redis.clone()).with_budget(budget::Budget::new(
            deps.redis.clone(),
            cfg.budget.clone(),
            &deps.metrics,
        )),
    });
    let tracker = TaskTracker::new();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(cfg.dispatch.max_in_flight));
    let batch_size = cfg.dispatch.batch_size;
    let idle_wait = Duration::from_millis(cfg.dispatch.idle_wait_ms.max(10));
    deps.health.set_started();
    tracing::info!(lanes = Lane::ALL.len(), partitions = ?partitions, batch_size, "dispatcher consuming");
    let per_lane = partitions.len();
    let mut turn = 0usize;

    // Long-poll pull requests left outstanding by earlier idle waits, one slot per lane: whatever arrives on any
    // lane wakes an idle dispatcher, and a request still pending when work resumes is read at the next turn.
    let mut parked: Vec<Option<Parked>> = consumers.iter().map(|_| None).collect();
    while !shutdown.is_cancelled() {
        let permits = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = in_flight.clone().acquire_many_owned(batch_size as u32) => p?,
        };
        let mut batch = Vec::with_capacity(batch_size);
        for (slot, (lane, _)) in parked.iter_mut().zip(&consumers) {
            if batch.len() < batch_size
                && let Some(m) = take_parked(slot)
            {
                batch.push((*lane, m));
            }
        }
        // Each lane's partitions take turns going first, so a busy partition cannot keep its neighbours' share of
        // the batch (lanes keep their serving order).
        turn = turn.wrapping_add(1);
        for (lane, consumer) in fetch_order(consumers.len(), per_lane, turn).map(|i| &consumers[i]) {
            let room = batch_size - batch.len();
            if room == 0 {
                break;
            }
            // A pull request can go unanswered while a stream or consumer leader moves (cluster node lost):
            // bound every fetch so the loop never waits on it forever.
            let fetch = async {
                match consumer.fetch().max_messages(room).messages().await {
                    Ok(mut messages) => {
                        while let Some(next) = messages.next().await {
                            match next {
                                Ok(m) => batch.push((*lane, m)),
                                Err(e) => {
                                    tracing::debug!(error = %e, "fetch ended");
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(lane = lane.token(), error = %e, "fetch failed"),
                }
            };
            // The bound is generous: a fetch abandoned while its messages are still arriving leaves them
            // delivered-but-unacked until the ack wait (30 s) redelivers them, which stalled whole batches on a
            // loaded machine when it was 2 s. A leader move answers within a few seconds anyway.
            if tokio::time::timeout(FETCH_BOUND, fetch).await.is_err() {
                tracing::warn!(lane = lane.token(), "fetch unanswered; retrying");
            }
        }
        if batch.is_empty() {
            drop(permits);
            let got = tokio::select! {
                _ = shutdown.cancelled() => None,
                got = idle_wait_any(&consumers, &mut parked, idle_wait) => got,
            };
            if let Some(m) = got {
                let permit = in_flight.clone().acquire_owned().await?;
                let worker = worker.clone();
                tracker.spawn(async move {
                    worker.process_batch(vec![m]).await;
                    drop(permit);
                });
            } else if !shutdown.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            continue;
        }
        let mut permits = permits;
        let used = permits.split(batch.len()).expect("batch never exceeds the permits acquired for it");
        drop(permits);
        let worker = worker.clone();
        tracker.spawn(async move {
            worker.process_batch(batch).await;
            drop(used);
        });
    }
    // A message that reached a parked request meanwhile goes back at once rather than after the ack wait.
    for slot in &mut parked {
        if let Some(m) = take_parked(slot) {
            let settle = bw_common::disposition::Settle::nak(moves::Outcome::Held, Duration::ZERO);
            bw_common::disposition::apply(&m, settle, &tracing::Span::none(), |l| worker.metrics.result(l)).await;
        }
    }

    tracker.close();
    let grace = Duration::from_millis(cfg.dispatch.shutdown_grace_ms);
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!("shutdown grace expired with messages in flight; JetStream will redeliver them");
    }
    tracing::info!("dispatcher stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(base_url: &str, token: &str) -> MetaConfig {
        let mut cfg = Config::load(None, &Default::default()).expect("compiled defaults load").meta;
        cfg.base_url = base_url.into();
        cfg.access_token = token.into();
        cfg
    }

    #[test]
    fn every_partition_of_a_lane_takes_its_turn_first_and_lanes_keep_their_order() {
        let send = names::SendPartitions::new(3);
        assert_eq!(served_partitions(&[], send), [0, 1, 2]);
        assert_eq!(served_partitions(&[2, 0, 2, 7], send), [2, 0], "configured order, once each, in range");
        let order = |turn| fetch_order(6, 3, turn).collect::<Vec<_>>();
        assert_eq!(order(0), [0, 1, 2, 3, 4, 5]);
        assert_eq!(order(1), [1, 2, 0, 4, 5, 3]);
        assert_eq!(order(2), [2, 0, 1, 5, 3, 4]);
        assert_eq!(fetch_order(4, 1, 5).collect::<Vec<_>>(), [0, 1, 2, 3], "one partition: the lanes in order");
    }

    #[test]
    fn a_dispatcher_may_only_serve_partitions_that_exist() {
        let mut env = std::collections::HashMap::new();
        env.insert("BW_DISPATCHER__NATS__SEND_PARTITIONS".to_string(), "2".to_string());
        env.insert("BW_DISPATCHER__DISPATCH__PARTITIONS".to_string(), "[1]".to_string());
        let cfg = Config::load(None, &env).expect("partition 1 of 2");
        assert_eq!(cfg.dispatch.partitions, [1]);
        env.insert("BW_DISPATCHER__DISPATCH__PARTITIONS".to_string(), "[2]".to_string());
        let err = Config::load(None, &env).expect_err("partition 2 of 2 does not exist").to_string();
        assert!(err.contains("dispatch.partitions") && err.contains("nats.send_partitions is 2"), "{err}");
    }

    #[test]
    fn start_up_warns_about_an_empty_or_local_token_outside_the_local_stack_without_printing_it() {
        let empty = credentials_warning(&meta("https://graph.example", "")).expect("empty token warned");
        assert!(empty.contains("empty"));
        let local = credentials_warning(&meta("https://graph.example", "local-access-token")).expect("warned");
        assert!(!local.contains("local-access-token"), "the token is never printed: {local}");
        assert_eq!(credentials_warning(&meta("http://127.0.0.1:9400", "local-access-token")), None);
        assert_eq!(credentials_warning(&meta("https://graph.example", "EAAG-real-looking")), None);
    }
}
