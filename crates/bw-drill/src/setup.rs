//! The drill's first phases: [`plan`] checks what the user gave, [`start`] brings up the stack (real
//! nats-server and redis-server, the Meta simulator, every service as its own process).

use crate::options::{DrillOptions, say};
use crate::{producer, scoped, stack, validation};
use bw_meta_sim::{Scenario, SimHandle};
use bw_testkit::{NatsServer, RedisServer};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub const WABA_ID: &str = "102290129340398";
pub(crate) const APP_SECRET: &str = "drill-app-secret";
pub(crate) const ACCESS_TOKEN: &str = "drill-access-token";
/// The drill's Redis requires it (`requirepass`), so every service connects as a deployment with Redis AUTH
/// does; the log scan looks for it like the other secrets.
pub(crate) const REDIS_PASSWORD: &str = "drill-redis-password";
/// The operator token of the drill's coordinator (its sha256 is configured): the drill lifts a WABA's pause when
/// the scenario's restriction ends, as an operator does with `POST /admin/pauses/waba/{id}/lift`.
pub(crate) const OPERATOR_TOKEN: &str = "drill-operator-token";
/// Retry-after of sends held by a pause until lifted, in the drill (compiled: 600 s). A held send goes to the
/// DLQ with this as its not-before, and replay honours it even after the pause is lifted; 61 s keeps the DLQ
/// path of the compiled default (over `dispatch.long_pause_ms`, 60 s) and the drill under a few minutes.
pub(crate) const HELD_RETRY_MS: u64 = 61_000;
/// Meta's documented default throughput per number, msg/s (the compiled sender rate is set against it).
pub(crate) const META_DEFAULT_MPS: f64 = 80.0;
/// The breakers' ramp after a close in the drill (compiled: 60 s), short to keep the drill under a few minutes.
pub(crate) const RAMP_MS: u64 = 5_000;
/// Signal-based alerts (credentials, quota, poison, status errors) resolve after this long without a new signal
/// (compiled: 30 min). A WABA restriction's `credentials_invalid` alert has no "clear" event, so at the compiled
/// value the drill could not settle; 20 s keeps "every alert resolved" a condition of the drill's end.
pub(crate) const SIGNAL_QUIET_RESOLVE_MS: u64 = 20_000;

/// The run the user asked for, checked.
pub(crate) struct Plan {
    pub opts: DrillOptions,
    pub scenario: Scenario,
    /// Owners of the validation matrix rows.
    pub owners: BTreeMap<String, String>,
}

/// Checks everything the user gave before anything starts; with a scenario file, "the outage" of the figures
/// (time to trip, time to close) becomes its first fault window.
pub(crate) fn plan(opts: DrillOptions) -> anyhow::Result<Plan> {
    // Everything the user gave is checked before anything starts.
    let scenario = match &opts.scenario {
        Some(name_or_path) => {
            Scenario::load(name_or_path).map_err(|e| anyhow::anyhow!("scenario `{name_or_path}`: {e}"))?
        }
        None => Scenario::flash_sale_outage(
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
    bw_common::time::parse_zone(&opts.zone).map_err(|e| anyhow::anyhow!("--zone: {e}"))?;
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
    Ok(Plan { opts, scenario, owners })
}

/// The running stack and what the later phases need of how it was set up.
pub(crate) struct Stack {
    /// The drill directory (canonical), and the wall clock when the run began.
    pub dir: PathBuf,
    pub wall_start: i64,
    pub nats_server: NatsServer,
    pub redis_server: RedisServer,
    pub nats_url: String,
    pub redis_cfg: bw_common::config::RedisConfig,
    pub sim: SimHandle,
    pub services: stack::Services,
    /// Index of the coordinator in `services.procs` (the drill lifts WABA pauses through its admin API).
    pub coordinator_idx: usize,
    pub senders: Vec<String>,
    pub wabas: Vec<String>,
    pub sender_waba: BTreeMap<String, String>,
    /// The rate Breakwater runs each sender at (msg/s).
    pub sender_rate: f64,
}

/// Starts the servers, the simulator and every service process, and waits until they are ready.
pub(crate) async fn start(opts: &DrillOptions, scenario: &Scenario) -> anyhow::Result<Stack> {
    let wall_start = bw_common::time::now_ms();
    let _ = std::fs::remove_dir_all(&opts.dir);
    std::fs::create_dir_all(&opts.dir)?;
    let dir = std::fs::canonicalize(&opts.dir)?;
    say(opts, &format!("drill directory: {}", dir.display()));

    let nats_server = NatsServer::start();
    let redis_server = RedisServer::start_with_password(REDIS_PASSWORD);
    say(opts, &format!("nats-server {}  redis-server {}", nats_server.url(), redis_server.url()));

    let ingest_http = format!("127.0.0.1:{}", stack::free_port());
    let webhook_url = format!("http://{ingest_http}/webhooks/meta");
    let senders = producer::sender_ids(opts.senders);
    // One WABA, unless the scenario aims at others: then the senders are spread over them round-robin.
    let wabas = scoped::sender_wabas(&senders, &scoped::wabas(scenario, WABA_ID));
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
    say(opts, &format!("Meta simulator {}", sim.base_url()));

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
    say(opts, &format!("{} service processes ready", services.procs.len()));
    Ok(Stack {
        dir,
        wall_start,
        nats_server,
        redis_server,
        nats_url,
        redis_cfg,
        sim,
        services,
        coordinator_idx,
        senders,
        wabas,
        sender_waba,
        sender_rate,
    })
}

fn operator_token_sha256() -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(OPERATOR_TOKEN.as_bytes()))
}

/// Registers the drill's senders (each of its WABA) to the tenant `default`, as `bwctl senders add` does.
async fn register_senders(nats_url: &str, senders: &BTreeMap<String, String>) -> anyhow::Result<()> {
    let nats = async_nats::connect(nats_url).await?;
    let registry = bw_common::registry::Registry::open(&async_nats::jetstream::new(nats), 1).await?;
    for (phone, waba) in senders {
        let record = bw_proto::v1::SenderRecord {
            phone_number_id: phone.clone(),
            waba_id: waba.clone(),
            tenant: bw_wire::tenancy::DEFAULT_TENANT.into(),
            updated_at_unix_ms: bw_common::time::now_ms(),
            ..Default::default()
        };
        registry.add(&record).await?;
    }
    Ok(())
}
