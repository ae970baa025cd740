//! The flash-sale drill: Breakwater's main job on a laptop.
//!
//! It starts real `nats-server` and `redis-server` processes in a fresh directory, the Meta simulator with the
//! flash-sale outage scenario, every service as its own OS process (several dispatchers and replay workers),
//! then a producer publishing a mixed load across several sender numbers. While it runs it prints a live view
//! (progress, breaker states, DLQ depth); at the end it proves the outcome with the accounting check and the
//! simulator's oracle, and writes `report.json`, `timeline.svg` and `report.html` to the drill directory.
//!
//! Must not: claim success from logs; "lost" comes only from `bw_ops::account_expected`, duplicates only from
//! the simulator's oracle.
//!
//! Entry point: [`run`].

// The report's JSON literal is large.
#![recursion_limit = "512"]

pub mod chaos;
pub mod chart;
pub mod errors;
pub mod html;
pub mod journey;
pub mod producer;
pub mod report;
pub mod scoped;
pub mod stack;
pub mod stuck;
pub mod validation;

use async_nats::jetstream;
use bw_common::proto::{Alert, BreakerState, BreakerTransition, DispatchOutcome};
use futures::StreamExt;
use prost::Message as _;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

pub use report::DrillReport;

/// What the drill does.
#[derive(Debug, Clone)]
pub struct DrillOptions {
    /// Messages the producer publishes.
    pub messages: usize,
    /// Sender phone numbers the load is spread over.
    pub senders: usize,
    /// Producer rate, messages per second.
    pub rate: f64,
    /// Outstanding producer requests.
    pub concurrency: usize,
    /// Simulated Meta throughput per phone number (msg/s); Breakwater is configured a little under it.
    pub meta_mps: f64,
    /// When the outage starts and how long it lasts, seconds after the producer starts.
    pub outage_start_s: u64,
    pub outage_length_s: u64,
    /// Service instances.
    pub dispatchers: usize,
    pub replays: usize,
    pub ingests: usize,
    /// Where the servers' data, logs and the report go (wiped first).
    pub dir: PathBuf,
    /// Give up waiting for the system to settle after this long.
    pub settle_timeout_s: u64,
    /// Print the live view.
    pub live: bool,
    /// A simulator scenario file (TOML, as in `crates/bw-meta-sim/scenarios/`) or built-in name; None: the
    /// flash-sale outage at `outage_start_s` for `outage_length_s`. Its clock starts with the producer.
    pub scenario: Option<String>,
    /// `--chaos SEED`: kill -9 a dispatcher and a replay worker, restart nats-server and redis-server, at times
    /// drawn from the seed. Server restarts block their thread: run the drill on a multi-thread runtime.
    pub chaos_seed: Option<u64>,
    /// Owners of the validation matrix rows (TOML, table `[owners]`); None: the compiled defaults.
    pub owners: Option<PathBuf>,
    /// IANA zone alert times are shown in next to UTC.
    pub zone: String,
    /// `--otlp URL`: every service exports its spans (one trace per operation) to this OTLP/HTTP traces
    /// endpoint (`telemetry.otlp_endpoint`), e.g. deploy/compose's Jaeger at `http://127.0.0.1:4318/v1/traces`.
    pub otlp_endpoint: Option<String>,
}

impl Default for DrillOptions {
    fn default() -> Self {
        DrillOptions {
            messages: 20_000,
            senders: 4,
            rate: 300.0,
            concurrency: 256,
            meta_mps: 80.0,
            outage_start_s: 15,
            outage_length_s: 20,
            dispatchers: 3,
            replays: 2,
            ingests: 1,
            dir: PathBuf::from(".drill"),
            settle_timeout_s: 300,
            live: true,
            scenario: None,
            chaos_seed: None,
            owners: None,
            zone: "America/Argentina/Buenos_Aires".into(),
            otlp_endpoint: None,
        }
    }
}

pub(crate) const WABA_ID: &str = "102290129340398";
const APP_SECRET: &str = "drill-app-secret";
const ACCESS_TOKEN: &str = "drill-access-token";
/// The drill's Redis requires it (`requirepass`), so every service connects as a deployment with Redis AUTH
/// does; the log scan looks for it like the other secrets.
const REDIS_PASSWORD: &str = "drill-redis-password";
/// The operator token of the drill's coordinator (its sha256 is configured): the drill lifts a WABA's pause when
/// the scenario's restriction ends, as an operator does with `POST /admin/pauses/waba/{id}/lift`.
const OPERATOR_TOKEN: &str = "drill-operator-token";
/// Retry-after of sends held by a pause until lifted, in the drill (compiled: 600 s). A held send goes to the
/// DLQ with this as its not-before, and replay honours it even after the pause is lifted; 61 s keeps the DLQ
/// path of the compiled default (over `dispatch.long_pause_ms`, 60 s) and the drill under a few minutes.
const HELD_RETRY_MS: u64 = 61_000;
/// Meta's documented default throughput per number, msg/s (the compiled sender rate is set against it).
const META_DEFAULT_MPS: f64 = 80.0;
/// The breakers' ramp after a close in the drill (compiled: 60 s), short to keep the drill under a few minutes.
const RAMP_MS: u64 = 5_000;
/// Signal-based alerts (credentials, quota, poison, status errors) resolve after this long without a new signal
/// (compiled: 30 min). A WABA restriction's `credentials_invalid` alert has no "clear" event, so at the compiled
/// value the drill could not settle; 20 s keeps "every alert resolved" a condition of the drill's end.
const SIGNAL_QUIET_RESOLVE_MS: u64 = 20_000;

/// Breaker events and dispatch outcomes as the drill observed them.
#[derive(Default)]
pub(crate) struct Observed {
    /// (seconds since start, from, to, phone) per transition.
    pub transitions: Vec<(f64, BreakerState, BreakerState, String)>,
    pub states: BTreeMap<String, BreakerState>,
    pub sent_total: u64,
    pub calls_total: u64,
    pub failed_calls_total: u64,
    pub by_result: BTreeMap<String, u64>,
    /// Decision time (µs) of messages refused while OPEN, and their whole handling time including the durable
    /// move to the DLQ.
    pub fail_fast_us: Vec<u64>,
    pub fail_fast_moved_us: Vec<u64>,
    /// Per sender, every call Meta answered, as (seconds since start, counted as a breaker failure): the report
    /// replays the breaker's window over them to find when the error rate crossed the threshold.
    pub calls: BTreeMap<String, Vec<(f64, bool)>>,
    /// Wall clock (unix ms) at the drill's time 0, to place observed calls in the breaker's window buckets.
    pub started_unix_ms: i64,
    /// When the last message from a live lane (hi, lo) was sent, seconds since start.
    pub last_live_sent_s: f64,
    /// When each replayed message (rh and rp lanes) was sent, seconds since start.
    pub replay_sent_s: Vec<f64>,
    /// Every error answer Meta gave a call: (seconds since start, code, sender).
    pub answers: Vec<errors::ObservedAnswer>,
    pub error_answers_total: u64,
    /// Per sender, what its outcomes said.
    pub senders: BTreeMap<String, SenderCounts>,
    /// Alerts by dedup key, as last published on `bw.alert.v1.*`.
    pub alerts: BTreeMap<String, Alert>,
    /// Per sender, when each of its messages was sent (seconds since start): the per-sender timeline.
    pub sent_at: BTreeMap<String, Vec<f64>>,
    /// Per sender, sends refused because its WABA was paused (`waba_paused`).
    pub waba_paused: BTreeMap<String, u64>,
    /// Operations a WABA restriction held: refused as `waba_paused`, or answered with a restriction code.
    pub held_ops: BTreeSet<String>,
}

/// One sender's outcome counts.
#[derive(Debug, Default, Clone)]
pub(crate) struct SenderCounts {
    pub sent: u64,
    pub dlq_moves: u64,
    pub rate_limited: u64,
    pub error_answers: u64,
}

/// Runs the drill and returns its report (also written to `opts.dir`).
pub async fn run(opts: DrillOptions) -> anyhow::Result<DrillReport> {
    bw_common::service::install_crypto();
    // Everything the user gave is checked before anything starts.
    let scenario = match &opts.scenario {
        Some(name_or_path) => {
            bw_meta_sim::Scenario::load(name_or_path).map_err(|e| anyhow::anyhow!("scenario `{name_or_path}`: {e}"))?
        }
        None => bw_meta_sim::Scenario::flash_sale_outage(
            Duration::from_secs(opts.outage_start_s),
            Duration::from_secs(opts.outage_length_s),
        ),
    };
    let owners = match &opts.owners {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("owners file {}: {e}", path.display()))?;
            validation::parse_owners(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => validation::parse_owners(validation::DEFAULT_OWNERS).map_err(|e| anyhow::anyhow!("{e}"))?,
    };
    bw_alerting::parse_zone(&opts.zone).map_err(|e| anyhow::anyhow!("--zone: {e}"))?;
    // With a scenario file, "the outage" of the figures (time to trip, time to close) is its first fault window.
    let mut opts = opts;
    if opts.scenario.is_some()
        && let Some(w) = scenario.windows.iter().find(|w| w.error_rate > 0.0)
    {
        opts.outage_start_s = w.start_ms / 1000;
        opts.outage_length_s = w.duration_ms.map_or(0, |d| d / 1000);
    } else if opts.scenario.is_some()
        && let Some(r) = scoped::restrictions(&scenario).first()
    {
        // A WABA restriction is the scenario's outage: its hold starts and ends with the restriction.
        opts.outage_start_s = r.start_s as u64;
        opts.outage_length_s = (r.end_s - r.start_s) as u64;
    }
    let wall_start = bw_common::time::now_ms();
    let _ = std::fs::remove_dir_all(&opts.dir);
    std::fs::create_dir_all(&opts.dir)?;
    let dir = std::fs::canonicalize(&opts.dir)?;
    say(&opts, &format!("drill directory: {}", dir.display()));

    let mut nats_server = bw_testkit::NatsServer::start();
    let mut redis_server = bw_testkit::RedisServer::start_with_password(REDIS_PASSWORD);
    say(&opts, &format!("nats-server {}  redis-server {}", nats_server.url(), redis_server.url()));

    let ingest_http = format!("127.0.0.1:{}", stack::free_port());
    let webhook_url = format!("http://{ingest_http}/webhooks/meta");
    let senders = producer::sender_ids(opts.senders);
    // One WABA, unless the scenario aims at others: then the senders are spread over them round-robin.
    let wabas = scoped::sender_wabas(&senders, &scoped::wabas(&scenario, WABA_ID));
    let sender_waba: BTreeMap<String, String> = senders.iter().cloned().zip(wabas.iter().cloned()).collect();
    let mut sim_cfg = bw_meta_sim::SimConfig {
        access_tokens: vec![ACCESS_TOKEN.into()],
        app_secret: APP_SECRET.into(),
        waba_id: WABA_ID.into(),
        dump_path: Some(dir.join("meta-sim-oracle.json")),
        ..Default::default()
    };
    sim_cfg.limits.throughput_mps = opts.meta_mps;
    for (phone, waba) in sender_waba.iter().filter(|(_, w)| *w != WABA_ID) {
        let number = bw_meta_sim::PhoneNumberConfig { waba_id: Some(waba.clone()), ..Default::default() };
        sim_cfg.phone_numbers.insert(phone.clone(), number);
    }
    sim_cfg.webhook.url = Some(webhook_url);
    let sim = bw_meta_sim::MetaSim::start(sim_cfg).await?;
    say(&opts, &format!("Meta simulator {}", sim.base_url()));

    // Every service runs at its compiled default tenancy (the sender registry): the drill's senders are the
    // tenant `default`'s, so operation keys stay the bare ids, and the producer answers on that tenant's inbox.
    register_senders(&nats_server.url(), &sender_waba).await?;
    let mut services = stack::Services::new(stack::bin_dir(), dir.join("logs"));
    // Info level unless told otherwise: the validation matrix scans these logs for personal data and secrets.
    if std::env::var_os("BW_DRILL_LOG").is_none() {
        services.log_level = "info".into();
    }
    services.otlp_endpoint = opts.otlp_endpoint.clone();
    let nats_url = nats_server.url();
    let redis_url = redis_server.url();
    let redis_cfg = bw_common::config::RedisConfig {
        password: REDIS_PASSWORD.into(),
        ..bw_common::config::RedisConfig::single(redis_url.clone())
    };
    // The compiled sender rate (74 of Meta's 80 msg/s), scaled when the simulator runs at another throughput.
    let sender_rate = (bw_breaker::ScopeLimits::default().rate_per_s * opts.meta_mps / META_DEFAULT_MPS).max(1.0);
    // Breakwater runs each sender a little under Meta's limit, so it never causes 130429 itself; short
    // cooldowns and ramp keep the drill under two minutes.
    let limits = [
        ("limits.default.rate_per_s", format!("{sender_rate}")),
        // Meta tolerates only a small burst above the rate: stay well under the simulator's 10.
        ("limits.default.burst", "5".to_string()),
        ("limits.default.cooldown_ms", "5000".to_string()),
        ("limits.default.cooldown_max_ms", "20000".to_string()),
        ("limits.default.ramp_ms", RAMP_MS.to_string()),
        ("limits.default.canaries_per_s", "5".to_string()),
    ];
    let mut coordinator = vec![
        ("nats.url", nats_url.clone()),
        ("redis.url", redis_url.clone()),
        ("redis.password", REDIS_PASSWORD.into()),
        ("operator.token_sha256", operator_token_sha256()),
    ];
    coordinator.extend(limits.iter().cloned());
    let coordinator_idx = services.spawn("breaker-coordinator", &coordinator)?;
    for _ in 0..opts.ingests.max(1) {
        let listen = if services.procs.iter().any(|p| p.service == "ingest") {
            format!("127.0.0.1:{}", stack::free_port())
        } else {
            ingest_http.clone()
        };
        services.spawn(
            "ingest",
            &[
                ("nats.url", nats_url.clone()),
                ("redis.url", redis_url.clone()),
                ("redis.password", REDIS_PASSWORD.into()),
                ("http.listen", listen),
                ("webhook.app_secret", APP_SECRET.into()),
                ("webhook.verify_token", "drill-verify".into()),
                ("reconciler.review_delay_ms", "15000".into()),
            ],
        )?;
    }
    for _ in 0..opts.dispatchers {
        services.spawn(
            "dispatcher",
            &[
                ("nats.url", nats_url.clone()),
                ("redis.url", redis_url.clone()),
                ("redis.password", REDIS_PASSWORD.into()),
                ("meta.base_url", sim.base_url()),
                ("meta.access_token", ACCESS_TOKEN.into()),
                ("meta.request_timeout_ms", "5000".into()),
                ("dispatch.unknown_review_ms", "15000".into()),
                ("breaker.defaults.rate_per_s", format!("{sender_rate}")),
                ("breaker.defaults.burst", "5".into()),
                ("breaker.defaults.cooldown_ms", "5000".into()),
                ("breaker.defaults.ramp_ms", RAMP_MS.to_string()),
                ("breaker.token_halt_retry_ms", HELD_RETRY_MS.to_string()),
            ],
        )?;
    }
    for _ in 0..opts.replays {
        services.spawn(
            "replay",
            &[
                ("nats.url", nats_url.clone()),
                ("replay.soak_ms", "2000".into()),
                ("replay.rate_per_s", format!("{}", sender_rate * opts.senders as f64)),
                ("replay.idle_ms", "500".into()),
                // A shallow replay lane: the dispatcher admits replayed messages only with the spare rate and
                // holds the refused ones for their slot; a fifth of a second of work per sender is plenty.
                ("replay.max_lane_depth", "16".into()),
            ],
        )?;
    }
    services.spawn(
        "alerting",
        &[("nats.url", nats_url.clone()), ("alerting.signal_quiet_resolve_ms", SIGNAL_QUIET_RESOLVE_MS.to_string())],
    )?;
    services.wait_ready(Duration::from_secs(60)).await?;
    say(&opts, &format!("{} service processes ready", services.procs.len()));

    let nats = async_nats::ConnectOptions::new()
        .custom_inbox_prefix(bw_common::tenancy::inbox_prefix(bw_common::tenancy::DEFAULT_TENANT))
        .connect(&nats_url)
        .await?;
    let js = jetstream::new(nats.clone());
    let buckets =
        bw_common::nats::ensure_topology(&js, &bw_common::config::NatsConfig::single(nats_url.clone(), "bw-drill"))
            .await?;

    let started = Instant::now();
    let observed = Arc::new(Mutex::new(Observed { started_unix_ms: bw_common::time::now_ms(), ..Default::default() }));
    let watchers = spawn_watchers(nats.clone(), observed.clone(), started).await?;

    // The scenario's clock starts with the producer (the drill's time 0, give or take a millisecond).
    sim.set_scenario(scenario.clone());
    let mut marks = scenario_marks(&scenario);
    // When a restriction of one WABA ends, the drill lifts that WABA's pause as an operator does: a 368 holds
    // its WABA until lifted, and the scenario sends no `account_update` webhook that would end it.
    let mut lift_plan = scoped::restrictions(&scenario);
    lift_plan.sort_by(|a, b| b.end_s.total_cmp(&a.end_s));
    let mut lifts: Vec<(f64, String)> = Vec::new();
    let producer_s = opts.messages as f64 / opts.rate.max(1.0);
    let mut chaos_plan: Vec<chaos::ChaosEvent> = opts
        .chaos_seed
        .map(|seed| chaos::schedule(seed, producer_s * 0.15, producer_s * 0.85, opts.dispatchers, opts.replays))
        .unwrap_or_default();
    chaos_plan.reverse();
    let mut restarts: Vec<(f64, usize, String)> = Vec::new();
    let mut chaos_log: Vec<(f64, String)> = Vec::new();
    if let Some(seed) = opts.chaos_seed {
        say(&opts, &format!("chaos seed {seed}: {} events planned", chaos_plan.len()));
    }
    let run_id = format!("drill{}", bw_common::time::now_ms() % 1_000_000);
    let progress = Arc::new(producer::ProducerProgress::default());
    let client = bw_client::Client::new(nats.clone());
    let producer = tokio::spawn(producer::produce(
        client,
        producer::Load {
            run_id: run_id.clone(),
            wabas: wabas.clone(),
            senders: senders.clone(),
            total: opts.messages,
            rate: opts.rate,
            concurrency: opts.concurrency,
        },
        progress.clone(),
    ));

    let mut samples = Vec::new();
    let mut last_sent = 0u64;
    let mut last_calls = 0u64;
    let mut last_failed = 0u64;
    let mut last_errors = 0u64;
    let mut settled_for = 0u32;
    let mut alert_states: Option<async_nats::jetstream::kv::Store> = None;
    let settle_deadline = Instant::now() + Duration::from_secs(opts.settle_timeout_s);
    let settled;
    let mut drained_at: Option<f64> = None;
    let mut max_dlq = 0u64;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut t = started.elapsed().as_secs_f64();
        // Chaos: due events first, then due restarts of killed processes.
        while chaos_plan.last().is_some_and(|e| e.at_s <= t) {
            let Some(event) = chaos_plan.pop() else { break };
            let label = event.kind.label();
            match event.kind {
                chaos::ChaosKind::KillDispatcher(n) | chaos::ChaosKind::KillReplay(n) => {
                    let service =
                        if matches!(event.kind, chaos::ChaosKind::KillDispatcher(_)) { "dispatcher" } else { "replay" };
                    if let Some(idx) = services.procs.iter().position(|p| p.service == service && p.instance == n) {
                        services.kill9(idx);
                        restarts.push((t + event.down_s, idx, format!("start {service}-{n} again")));
                    }
                }
                chaos::ChaosKind::RestartNats => tokio::task::block_in_place(|| nats_server.restart()),
                chaos::ChaosKind::RestartRedis => tokio::task::block_in_place(|| redis_server.restart()),
            }
            say(&opts, &format!("[{t:5.1}s] chaos: {label}"));
            marks.push(report::Mark { t, label: label.clone(), kind: report::MarkKind::Chaos });
            chaos_log.push((t, label));
        }
        let mut i = 0;
        while i < restarts.len() {
            if restarts[i].0 <= t {
                let (_, idx, label) = restarts.remove(i);
                services.restart(idx)?;
                say(&opts, &format!("[{t:5.1}s] chaos: {label}"));
                chaos_log.push((t, label));
            } else {
                i += 1;
            }
        }
        if lift_plan.last().is_some_and(|r| r.end_s <= t)
            && let Some(r) = lift_plan.pop()
        {
            let admin = services.procs[coordinator_idx].admin.clone();
            match lift_waba(&admin, &r.waba_id).await {
                Ok(()) => {
                    let label = format!("operator lifts WABA {} pause", r.waba_id);
                    say(&opts, &format!("[{t:5.1}s] {label}"));
                    marks.push(report::Mark { t, label, kind: report::MarkKind::Recovery });
                    lifts.push((t, r.waba_id.clone()));
                }
                Err(e) => {
                    // Tried again next second (the settle timeout bounds it).
                    say(&opts, &format!("[{t:5.1}s] lifting WABA {} pause failed: {e}", r.waba_id));
                    lift_plan.push(r);
                }
            }
        }
        t = started.elapsed().as_secs_f64();
        heal_states(&buckets.scopes, &observed).await;
        if let Some(kv) = &alert_states {
            heal_alerts(kv, &observed).await;
        } else {
            alert_states = js.get_key_value(bw_alerting::STATE_BUCKET).await.ok();
        }
        let depths = depths(&js).await;
        let (sent_per_s, error_rate, errors_per_s, open, half_open) = {
            let o = observed.lock().await;
            let calls = o.calls_total - last_calls;
            let failed = o.failed_calls_total - last_failed;
            let sample = (
                (o.sent_total - last_sent) as f64,
                if calls > 0 { failed as f64 / calls as f64 } else { 0.0 },
                (o.error_answers_total - last_errors) as f64,
                o.states.values().filter(|s| matches!(s, BreakerState::Open | BreakerState::ForcedOpen)).count() as u32,
                o.states.values().filter(|s| **s == BreakerState::HalfOpen).count() as u32,
            );
            last_sent = o.sent_total;
            last_calls = o.calls_total;
            last_failed = o.failed_calls_total;
            last_errors = o.error_answers_total;
            sample
        };
        max_dlq = max_dlq.max(depths.dlq);
        samples.push(chart::Sample {
            t,
            sent_per_s,
            error_rate,
            errors_per_s,
            scopes_open: open + half_open,
            scopes_half_open: half_open,
            dlq_depth: depths.dlq,
        });
        if opts.live {
            println!(
                "[{t:5.0}s] produced {:>6}/{:<6} accepted {:>6} | sent/s {:>5.0} err {:>4.1}% | breakers open {open} half-open {half_open} | queue {:>6} dlq {:>6} unknown {:>4} quarantine {:>4}",
                progress.submitted.load(Ordering::Relaxed),
                opts.messages,
                progress.accepted.load(Ordering::Relaxed),
                sent_per_s,
                error_rate * 100.0,
                depths.send,
                depths.dlq,
                depths.unknown,
                depths.quarantine,
            );
        }
        if max_dlq > 0 && depths.dlq == 0 && drained_at.is_none() {
            drained_at = Some(t);
        }
        let alerts_firing = observed.lock().await.alerts.values().filter(|a| a.resolved_at_unix_ms == 0).count();
        let quiet = producer.is_finished()
            && depths.read
            && alerts_firing == 0
            && chaos_plan.is_empty()
            && restarts.is_empty()
            && lift_plan.is_empty()
            && depths.send == 0
            && depths.dlq == 0
            && depths.unknown == 0
            && open + half_open == 0;
        settled_for = if quiet { settled_for + 1 } else { 0 };
        if settled_for >= 3 || Instant::now() > settle_deadline {
            settled = settled_for >= 3;
            break;
        }
    }
    // A run that did not settle says what held it, read while the services still run.
    let mut unsettled = if settled {
        Vec::new()
    } else {
        let states = observed.lock().await.states.clone();
        stuck::diagnose(&js, &buckets.scopes, &redis_cfg, &senders, &states).await
    };
    let produced = producer.await?;
    let accounting = bw_ops::account::account_expected(&js, &buckets, &produced.accepted).await?;
    let entries = bw_ops::account::ledger_entries(&js, &buckets).await?;
    if !settled {
        unsettled.extend(stuck::waiting_entries(&entries));
    }
    let oracle = sim.oracle();
    let sim_counters = sim.counters();
    let counters = serde_json::to_value(&sim_counters)?;
    services.stop_all(Duration::from_secs(10));
    let log_scan = scan_logs(&dir.join("logs"));
    for w in watchers {
        w.abort();
    }
    // The watcher tasks may still hold their handles for a moment after abort: take the data, not the Arc.
    let observed = std::mem::take(&mut *observed.lock().await);
    let duration_s = started.elapsed().as_secs_f64();
    let recovery_marks = marks.iter().filter(|m| m.kind == report::MarkKind::Recovery).count();
    if recovery_marks == 0 && scenario.windows.is_empty() {
        say(&opts, "scenario has no fault windows: no outage or recovery marks");
    }
    let header = report::Header {
        environment: environment(&opts),
        version: version(),
        started_utc: format!("{} ({})", bw_alerting::format_utc(wall_start), rfc3339(wall_start)),
        started_unix_ms: wall_start,
        load: format!(
            "{} messages over {} senders at {:.0} msg/s (Meta allows {:.0} msg/s per sender; Breakwater runs each at {:.1}){}",
            opts.messages,
            opts.senders,
            opts.rate,
            opts.meta_mps,
            sender_rate,
            opts.chaos_seed.map(|s| format!("; chaos seed {s}")).unwrap_or_default()
        ),
        duration_s,
        scenario: scenario_text(&scenario, opts.scenario.as_deref()),
        expected: format!(
            "all {} accepted; 0 lost; 0 unflagged duplicates; 0 self-inflicted rate-limit answers",
            opts.messages
        ),
        observed: String::new(),
        settled,
    };
    marks.sort_by(|a, b| a.t.total_cmp(&b.t));
    let report = report::build(report::Inputs {
        opts: &opts,
        produced: &produced,
        accounting: &accounting,
        entries: &entries,
        oracle: &oracle,
        observed: &observed,
        drained_at,
        max_dlq,
        unsettled,
        sender_rate,
        ramp_ms: RAMP_MS,
        ramp_start: bw_breaker::ScopeLimits::default().ramp_start,
        counters: &counters,
        webhooks: sim_counters.webhooks.clone(),
        scenario: &scenario,
        samples: &samples,
        marks,
        chaos: chaos_log,
        log_scan,
        header,
        sender_waba: &sender_waba,
        lifts: &lifts,
        owners: &owners,
        zone: opts.zone.clone(),
    });
    report::write(&dir, &report, &samples, &observed)?;
    let _ = sim.dump(&dir.join("meta-sim-oracle.json"));
    sim.shutdown().await;
    drop(nats_server);
    drop(redis_server);
    Ok(report)
}

fn say(opts: &DrillOptions, line: &str) {
    if opts.live {
        println!("{line}");
    }
}

/// Message counts of the streams that hold operations.
#[derive(Debug, Default, Clone, Copy)]
pub struct Depths {
    pub send: u64,
    pub dlq: u64,
    pub unknown: u64,
    pub quarantine: u64,
    /// Every count was read (false while the broker is unreachable: the zeros then mean nothing).
    pub read: bool,
}

/// Reads the stream depths (one info call per stream).
pub async fn depths(js: &jetstream::Context) -> Depths {
    async fn count(js: &jetstream::Context, name: &str) -> Option<u64> {
        let mut s = js.get_stream(name).await.ok()?;
        s.info().await.ok().map(|i| i.state.messages)
    }
    /// The sum over partition streams, unread if any one is.
    async fn count_all(js: &jetstream::Context, streams: impl Iterator<Item = String>) -> Option<u64> {
        let mut total = Some(0);
        for name in streams {
            total = total.zip(count(js, &name).await).map(|(t, n)| t + n);
        }
        total
    }
    use bw_common::names;
    // Every partition of BW_SEND and BW_DLQ (a kind is unread if any of its partitions is).
    let send = bw_common::nats::send_partitions(js).await.unwrap_or_default();
    let (send, dlq, unknown, quarantine) = (
        count_all(js, send.streams()).await,
        count_all(js, send.dlq_streams()).await,
        count(js, names::UNKNOWN_STREAM).await,
        count(js, names::QUARANTINE_STREAM).await,
    );
    Depths {
        read: send.is_some() && dlq.is_some() && unknown.is_some() && quarantine.is_some(),
        send: send.unwrap_or(0),
        dlq: dlq.unwrap_or(0),
        unknown: unknown.unwrap_or(0),
        quarantine: quarantine.unwrap_or(0),
    }
}

/// The drill learns breaker states from transitions; when the breaker state was lost (Redis restarted empty)
/// no transition is ever published for a scope that was OPEN. The scope snapshot the coordinator writes is then
/// the authority: a CLOSED snapshot written after the scope's last observed transition closes it in the view.
async fn heal_states(scopes: &async_nats::jetstream::kv::Store, observed: &Arc<Mutex<Observed>>) {
    let suspects: Vec<(String, f64)> = {
        let o = observed.lock().await;
        o.states
            .iter()
            .filter(|(_, s)| matches!(s, BreakerState::Open | BreakerState::HalfOpen))
            .filter_map(|(phone, _)| {
                let last = o.transitions.iter().rev().find(|t| &t.3 == phone)?.0;
                Some((phone.clone(), o.started_unix_ms as f64 + last * 1000.0))
            })
            .collect()
    };
    for (phone, last_ms) in suspects {
        let Ok(Some(bytes)) = scopes.get(&phone).await else { continue };
        let Ok(snap) = bw_common::proto::ScopeSnapshot::decode(bytes) else { continue };
        let closed =
            matches!(BreakerState::try_from(snap.state), Ok(BreakerState::Closed | BreakerState::ForcedClosed));
        if closed && snap.updated_at_unix_ms as f64 > last_ms {
            observed.lock().await.states.insert(phone, BreakerState::Closed);
        }
    }
}

/// Alerts resolved while the drill's subscription was cut (a nats-server restart) are read back from the
/// alert state bucket, the authority of the alerting service.
async fn heal_alerts(kv: &async_nats::jetstream::kv::Store, observed: &Arc<Mutex<Observed>>) {
    let firing: Vec<String> = {
        let o = observed.lock().await;
        o.alerts.values().filter(|a| a.resolved_at_unix_ms == 0).map(|a| a.dedup_key.clone()).collect()
    };
    for key in firing {
        let Ok(Some(value)) = kv.get(&key).await else { continue };
        if let Some(alert) = bw_alerting::alert_from_state(&value)
            && alert.resolved_at_unix_ms > 0
        {
            observed.lock().await.alerts.insert(key, alert);
        }
    }
}

/// Outage and recovery marks of every fault window of the scenario (seconds since its clock started).
pub fn scenario_marks(scenario: &bw_meta_sim::Scenario) -> Vec<report::Mark> {
    let mut marks = Vec::new();
    for r in scoped::restrictions(scenario) {
        marks.push(report::Mark {
            t: r.start_s,
            label: format!("WABA {} restricted ({} on every send)", r.waba_id, r.code),
            kind: report::MarkKind::Outage,
        });
    }
    for w in scenario.windows.iter().filter(|w| w.error_rate > 0.0 || w.latency.is_some()) {
        let name = if w.name.is_empty() { "fault window".to_string() } else { w.name.clone() };
        marks.push(report::Mark {
            t: w.start_ms as f64 / 1000.0,
            label: format!("{name} starts ({:.0}% errors)", w.error_rate * 100.0),
            kind: report::MarkKind::Outage,
        });
        if let Some(d) = w.duration_ms {
            marks.push(report::Mark {
                t: (w.start_ms + d) as f64 / 1000.0,
                label: format!("{name} ends: Meta recovers"),
                kind: report::MarkKind::Recovery,
            });
        }
    }
    marks
}

fn scenario_text(scenario: &bw_meta_sim::Scenario, given: Option<&str>) -> String {
    let windows: Vec<String> = scenario
        .windows
        .iter()
        .map(|w| {
            let codes: Vec<String> = w.faults.iter().filter_map(|f| errors::fault_key(&f.kind)).collect();
            format!(
                "{} {:.1}-{} s at {:.0}% [{}]",
                if w.name.is_empty() { "window" } else { &w.name },
                w.start_ms as f64 / 1000.0,
                w.duration_ms
                    .map(|d| format!("{:.1}", (w.start_ms + d) as f64 / 1000.0))
                    .unwrap_or_else(|| "end".into()),
                w.error_rate * 100.0,
                codes.join(", ")
            )
        })
        .collect();
    format!(
        "{} ({}): {}",
        if scenario.name.is_empty() { "unnamed" } else { &scenario.name },
        given.unwrap_or("built-in, from --outage-start/--outage-length"),
        if windows.is_empty() { "no fault windows".to_string() } else { windows.join("; ") }
    )
}

fn command_line(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program).args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn environment(opts: &DrillOptions) -> String {
    let nats_bin = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".into());
    let nats = command_line(&nats_bin, &["--version"]).unwrap_or_else(|| "nats-server (version unknown)".into());
    let redis = command_line("redis-server", &["--version"])
        .and_then(|v| v.split_whitespace().find(|w| w.starts_with("v=")).map(|w| format!("redis-server {}", &w[2..])))
        .unwrap_or_else(|| "redis-server (version unknown)".into());
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!(
        "local stack, {} {} with {cpus} CPUs; {nats}; {redis}; {} dispatchers, {} replay workers, {} ingest, 1 coordinator, 1 alerting (each its own process); Meta simulator in the drill process",
        std::env::consts::OS,
        std::env::consts::ARCH,
        opts.dispatchers,
        opts.replays,
        opts.ingests.max(1)
    )
}

fn version() -> String {
    // The working directory's repository, else the one this binary was built from.
    command_line("git", &["describe", "--always", "--dirty", "--tags"])
        .or_else(|| {
            command_line("git", &["-C", env!("CARGO_MANIFEST_DIR"), "describe", "--always", "--dirty", "--tags"])
        })
        .map(|d| format!("{d} (bw-drill {})", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| format!("bw-drill {} (git describe unavailable)", env!("CARGO_PKG_VERSION")))
}

fn rfc3339(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn operator_token_sha256() -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(OPERATOR_TOKEN.as_bytes()))
}

/// Lifts every pause of `waba_id` through the coordinator's admin API (`admin`: its host:port), as an operator
/// does: `POST /admin/pauses/waba/{id}/lift` with the operator token.
async fn lift_waba(admin: &str, waba_id: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = r#"{"reason":"drill: Meta lifted the restriction"}"#;
    let request = format!(
        "POST /admin/pauses/waba/{waba_id}/lift HTTP/1.1\r\nHost: {admin}\r\nAuthorization: Bearer {OPERATOR_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(admin).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange).await??;
    let text = String::from_utf8_lossy(&response);
    let status_line = text.lines().next().unwrap_or("no answer");
    anyhow::ensure!(status_line.split_whitespace().nth(1) == Some("200"), "coordinator answered `{status_line}`");
    Ok(())
}

/// Scans every service log for a full recipient number of the drill (`549115` followed by digits), the
/// access token, the app secret and the Redis password.
fn scan_logs(dir: &std::path::Path) -> Option<report::LogScan> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut scan = report::LogScan::default();
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
        scan.files += 1;
        scan.bytes += text.len() as u64;
        scan.findings += [ACCESS_TOKEN, APP_SECRET, REDIS_PASSWORD, OPERATOR_TOKEN]
            .iter()
            .map(|s| text.matches(s).count())
            .sum::<usize>();
        scan.findings += text
            .match_indices("549115")
            .filter(|(i, _)| text[i + 6..].chars().take(7).filter(char::is_ascii_digit).count() == 7)
            .count();
    }
    Some(scan)
}

/// Registers the drill's senders (each of its WABA) to the tenant `default`, as `bwctl senders add` does.
async fn register_senders(nats_url: &str, senders: &BTreeMap<String, String>) -> anyhow::Result<()> {
    let nats = async_nats::connect(nats_url).await?;
    let registry = bw_common::registry::Registry::open(&jetstream::new(nats), 1).await?;
    for (phone, waba) in senders {
        let record = bw_common::proto::SenderRecord {
            phone_number_id: phone.clone(),
            waba_id: waba.clone(),
            tenant: bw_common::tenancy::DEFAULT_TENANT.into(),
            updated_at_unix_ms: bw_common::time::now_ms(),
            ..Default::default()
        };
        registry.add(&record).await?;
    }
    Ok(())
}

async fn spawn_watchers(
    nats: async_nats::Client,
    observed: Arc<Mutex<Observed>>,
    started: Instant,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut transitions = nats.subscribe("bw.breaker.v1.>").await?;
    let mut outcomes = nats.subscribe("bw.outcome.v1.>").await?;
    let mut alerts = nats.subscribe("bw.alert.v1.>").await?;
    let o3 = observed.clone();
    let t3 = tokio::spawn(async move {
        while let Some(msg) = alerts.next().await {
            if let Ok(a) = Alert::decode(msg.payload.as_ref()) {
                let mut o = o3.lock().await;
                o.alerts.insert(a.dedup_key.clone(), a);
            }
        }
    });
    let o1 = observed.clone();
    let t1 = tokio::spawn(async move {
        while let Some(msg) = transitions.next().await {
            if let Ok(t) = BreakerTransition::decode(msg.payload.as_ref()) {
                let phone = t.scope.as_ref().map(|s| s.phone_number_id.clone()).unwrap_or_default();
                let mut o = o1.lock().await;
                o.transitions.push((started.elapsed().as_secs_f64(), t.from(), t.to(), phone.clone()));
                o.states.insert(phone, t.to());
            }
        }
    });
    let t2 = tokio::spawn(async move {
        while let Some(msg) = outcomes.next().await {
            if let Ok(d) = DispatchOutcome::decode(msg.payload.as_ref()) {
                let t = started.elapsed().as_secs_f64();
                let mut o = observed.lock().await;
                *o.by_result.entry(d.result.clone()).or_default() += 1;
                let called = d.decision == "allow" || d.decision == "canary";
                if d.result == "sent" {
                    o.sent_at.entry(d.phone_number_id.clone()).or_default().push(t);
                }
                if d.decision == "waba_paused" {
                    *o.waba_paused.entry(d.phone_number_id.clone()).or_default() += 1;
                    o.held_ops.insert(d.operation_id.clone());
                }
                if called && scoped::RESTRICTION_CODES.contains(&d.meta_code) {
                    o.held_ops.insert(d.operation_id.clone());
                }
                let sender = o.senders.entry(d.phone_number_id.clone()).or_default();
                match d.result.as_str() {
                    "sent" => sender.sent += 1,
                    "dlq" => sender.dlq_moves += 1,
                    _ => {}
                }
                if called && d.meta_code != 0 {
                    sender.error_answers += 1;
                    if errors::RATE_LIMIT_CODES.contains(&d.meta_code) {
                        sender.rate_limited += 1;
                    }
                    o.error_answers_total += 1;
                    o.answers.push((t, d.meta_code, d.phone_number_id.clone()));
                }
                if called {
                    // What the breaker's window counts, by Meta's answer (see errors::breaker_failure).
                    if let Some(failure) = errors::breaker_failure(&d.result, d.meta_code, d.http_status) {
                        o.calls.entry(d.phone_number_id.clone()).or_default().push((t, failure));
                    }
                }
                if d.result == "sent" {
                    if d.lane == "rp" || d.lane == "rh" {
                        o.replay_sent_s.push(t);
                    } else {
                        o.last_live_sent_s = o.last_live_sent_s.max(t);
                    }
                }
                match d.result.as_str() {
                    "sent" => {
                        o.sent_total += 1;
                        o.calls_total += 1;
                    }
                    "retry" | "rate_limited" | "unknown" | "quarantined" if called => {
                        o.calls_total += 1;
                        o.failed_calls_total += 1;
                    }
                    "dlq" if called => {
                        o.calls_total += 1;
                        o.failed_calls_total += 1;
                    }
                    "dlq" if d.decision == "breaker_open" || d.decision == "forced_open" => {
                        o.fail_fast_us.push(d.decision_us);
                        o.fail_fast_moved_us.push(d.handling_us);
                    }
                    _ => {}
                }
            }
        }
    });
    Ok(vec![t1, t2, t3])
}
