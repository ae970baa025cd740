//! A loopback simulator of the Meta WhatsApp Cloud API, faithful enough that passing against it means something.
//!
//! It serves `POST /{version}/{phone_number_id}/messages` with Meta's success and error bodies, bearer-token
//! checks (190; tokens expired or revoked by a scenario or the admin API fail on every number), body validation
//! (100 / 131008 / 131009 / 132001), [`Limits`] at their real scopes (per-number throughput 130429, pair rate
//! 131056, app calls 4, WABA calls 80007/80008) with usage headers and optional Retry-After, a fault [`Scenario`]
//! (time windows with error rates, weighted fault mixes, latency, hangs, connection resets, outages, and the
//! ambiguous answers after acceptance: bodiless 5xx, resets, hangs, unparseable 200s; delayed or dropped status
//! webhooks), signed status webhooks (sent / delivered / read / failed) to a configured URL with batching,
//! duplicates, reordering and retries, and an [`OracleSnapshot`] of every message it accepted so tests can prove
//! "none lost, none sent twice" and tell duplicates after an ambiguous answer from plain ones.
//!
//! It also fails the way Meta fails beyond one send (see the crate's README for every key):
//! - every code of the reference's §2.3 table, aimed by a scenario's `[[injections]]` at a number, WABA, token,
//!   template or recipient, synchronously or as a `failed` status ([`inject`], [`errors`]);
//! - the account, template and user webhooks of §4.5 from a scenario's `[[events]]`, with the state they
//!   announce enforced afterwards ([`events`], [`account`]);
//! - the portfolio messaging limit (§3.3), throughput upgrades (§3.1), expired API versions (§0, [`versions`])
//!   and business-scoped user ids (§6);
//! - a status webhook that arrives before the answer naming its wamid: [`SimHandle::hold_answers`] holds 200s after
//!   acceptance while the statuses go out (in-process only).
//!
//! In-process use (tests):
//!
//! ```ignore
//! let sim = MetaSim::start(SimConfig { access_tokens: vec!["t".into()], ..SimConfig::default() }).await?;
//! let url = format!("{}/v21.0/{}/messages", sim.base_url(), "106540352242922");
//! sim.set_scenario(Scenario::outage(Duration::ZERO, Duration::from_secs(2)));   // clock starts now
//! let oracle = sim.oracle();
//! sim.shutdown().await;
//! ```
//!
//! The same controls are on the admin API under `/_sim/` (see [`admin`]). The binary `bw-meta-sim` wraps
//! [`MetaSim::start`] with `--config`, `--listen`, `--scenario`, `--webhook-url`, `--app-secret`, `--token`.
//! Access tokens, the app secret, message bodies and full phone numbers are never logged.

pub mod account;
pub mod admin;
mod api;
pub mod config;
mod conn;
pub mod errors;
pub mod events;
mod fire;
mod graph;
pub mod ids;
pub mod inject;
pub mod limits;
pub mod oracle;
mod request;
pub mod scenario;
mod state;
pub mod templates;
pub mod versions;
pub mod webhook;

pub use account::AccountSnapshot;
pub use config::{
    MessagingLimitConfig, OtpType, PhoneNumberConfig, PortfolioConfig, SimConfig, TemplateConfig, UserConfig,
    WebhookConfig,
};
pub use events::{ErrorSpec, Event, EventKind};
pub use inject::{Injection, Mode, TemplateRef};
pub use limits::{Limits, RetryAfter, Tier};
pub use oracle::{
    Counters, DuplicateKind, DuplicateReport, FailedMessage, FailureCause, OracleEntry, OracleSnapshot, WebhookCounters,
};
pub use scenario::{
    Fault, FaultKind, Garbled, Latency, Page, Scenario, ScenarioError, Selection, StatusWindow, TokenEvent, Window,
};

use account::Account;
use anyhow::Context as _;
use axum::Router;
use axum::routing::post;
use limits::Limiter;
use oracle::Oracle;
use scenario::Active;
use state::{Inner, lock_read, lock_write};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use webhook::Webhooks;

/// Entry point.
pub struct MetaSim;

impl MetaSim {
    /// Binds `cfg.listen` (127.0.0.1:0 by default), starts serving and the webhook sender, and returns a handle.
    /// The scenario in `cfg.scenario` (or none) starts its clock now.
    pub async fn start(cfg: SimConfig) -> anyhow::Result<SimHandle> {
        cfg.validate()?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let shutdown = CancellationToken::new();
        let oracle = Arc::new(Oracle::new());
        let displays = cfg
            .phone_numbers
            .iter()
            .filter_map(|(id, p)| p.display_phone_number.clone().map(|d| (id.clone(), d)))
            .collect();
        let wabas = cfg.phone_numbers.keys().map(|id| (id.clone(), cfg.waba_of(id).to_string())).collect();
        let setup = webhook::Setup {
            config: cfg.webhook.clone(),
            app_secret: cfg.app_secret.clone(),
            waba_id: cfg.waba_id.clone(),
            wabas,
            displays,
            default_display: cfg.display_phone_number.clone(),
            user_ids: cfg.user_ids,
        };
        let webhooks = Webhooks::start(setup, oracle.clone(), shutdown.clone())?;
        let listener =
            tokio::net::TcpListener::bind(cfg.listen).await.with_context(|| format!("cannot bind {}", cfg.listen))?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            limits: RwLock::new(cfg.limits.clone()),
            limiter: Limiter::new(),
            scenario: RwLock::new(Arc::new(Active::start(Scenario::normal()))),
            oracle,
            webhooks,
            shutdown: shutdown.clone(),
            dead_tokens: RwLock::new(BTreeMap::new()),
            account: Account::new(&cfg),
            events_cancel: Mutex::new(shutdown.child_token()),
            answer_gate: Mutex::new(None),
            cfg,
        });
        inner.set_scenario(inner.cfg.scenario.clone().unwrap_or_else(Scenario::normal));
        let app = Router::new()
            .route("/{version}/{phone_number_id}/messages", post(api::send_message))
            .route("/{version}/{object_id}", axum::routing::get(graph::read_object))
            .merge(admin::routes())
            .fallback(api::fallback)
            .with_state(inner.clone());
        // Loop watch: how late this runtime wakes a 10 ms timer. A stall holds back every request the clients
        // sent meanwhile, which then reach the limiter together (`Counters::limit_events` keeps the stall
        // before each limit answer, so a report can tell the simulator's bunching from the client's).
        let watch = (inner.oracle.clone(), shutdown.clone());
        tokio::spawn(async move {
            let (oracle, stop) = watch;
            let tick = Duration::from_millis(10);
            loop {
                let asked = std::time::Instant::now();
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(tick) => {}
                }
                oracle.note_loop_lag(asked.elapsed().saturating_sub(tick).as_millis() as u64);
            }
        });
        let stop = shutdown.clone();
        let server = tokio::spawn(async move {
            let make = app.into_make_service_with_connect_info::<conn::ConnKill>();
            let served = axum::serve(conn::SimListener::new(listener), make)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "meta simulator server stopped");
            }
        });
        tracing::info!(%addr, "meta simulator listening");
        Ok(SimHandle { inner, addr, server: Mutex::new(Some(server)) })
    }
}

/// A running simulator. Dropping it stops the server (without the final dump; call [`SimHandle::shutdown`]).
pub struct SimHandle {
    inner: Arc<Inner>,
    addr: SocketAddr,
    server: Mutex<Option<JoinHandle<()>>>,
}

impl SimHandle {
    /// `http://127.0.0.1:<port>`: what a client puts before `/{version}/{phone_number_id}/messages`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `{base_url}/{version}/{phone_number_id}/messages`.
    pub fn messages_url(&self, version: &str, phone_number_id: &str) -> String {
        format!("{}/{version}/{phone_number_id}/messages", self.base_url())
    }

    /// Every accepted message plus counters.
    pub fn oracle(&self) -> OracleSnapshot {
        self.inner.oracle.snapshot()
    }

    /// Messages accepted so far, repeats included (`oracle().total_accepted()` without copying every entry:
    /// cheap enough to poll while thousands of messages a second arrive).
    pub fn total_accepted(&self) -> u64 {
        self.inner.oracle.total_accepted()
    }

    pub fn counters(&self) -> Counters {
        self.inner.oracle.counters()
    }

    /// Replaces the active scenario; its clock starts now.
    pub fn set_scenario(&self, scenario: Scenario) {
        self.inner.set_scenario(scenario);
    }

    /// Holds back Meta's 200 answers to `phone_number_id` after the next `pass` accepted messages until
    /// [`SimHandle::release_answers`]: the messages are accepted and their status webhooks go out as scheduled, so a
    /// status reaches the business before the answer naming its wamid, as it can from Meta.
    pub fn hold_answers(&self, phone_number_id: &str, pass: u32) {
        let (released, _) = tokio::sync::watch::channel(false);
        let gate =
            state::AnswerGate { phone_number_id: phone_number_id.to_string(), pass, released, held: Arc::default() };
        if let Some(old) = self.inner.answer_gate.lock().unwrap_or_else(|e| e.into_inner()).replace(gate) {
            old.released.send_replace(true);
        }
    }

    /// Answers held so far by [`SimHandle::hold_answers`] and not yet released.
    pub fn held_answers(&self) -> u32 {
        let gate = self.inner.answer_gate.lock().unwrap_or_else(|e| e.into_inner());
        gate.as_ref().map_or(0, |g| g.held.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Sends every held answer and holds no more.
    pub fn release_answers(&self) {
        if let Some(gate) = self.inner.answer_gate.lock().unwrap_or_else(|e| e.into_inner()).take() {
            gate.released.send_replace(true);
        }
    }

    /// Back to no faults.
    pub fn clear_scenario(&self) {
        self.inner.set_scenario(Scenario::normal());
    }

    /// Restarts the active scenario's clock (and its RNG and counters).
    pub fn restart_scenario_clock(&self) {
        self.inner.restart_clock();
    }

    pub fn scenario(&self) -> Scenario {
        lock_read(&self.inner.scenario).scenario.clone()
    }

    /// Milliseconds since the active scenario started.
    pub fn scenario_elapsed_ms(&self) -> u64 {
        lock_read(&self.inner.scenario).elapsed_ms()
    }

    /// Replaces the configured limits (a scenario's `[limits]` table, while it is active, wins over them).
    pub fn set_limits(&self, limits: Limits) {
        *lock_write(&self.inner.limits) = limits;
    }

    /// The configured limits (not a scenario's override).
    pub fn limits(&self) -> Limits {
        lock_read(&self.inner.limits).clone()
    }

    /// From now on every call with `token` (or every token, for `*`) fails on every number: code 190 (expired)
    /// or 0 (invalidated). Err for another code or an empty token.
    pub fn expire_token(&self, token: &str, code: i64) -> Result<(), String> {
        self.inner.kill_token(token, code)
    }

    /// Undoes [`SimHandle::expire_token`]; true when the token was dead.
    pub fn restore_token(&self, token: &str) -> bool {
        self.inner.restore_token(token)
    }

    /// Replaces the webhook settings (URL, delays, retries...) for statuses scheduled from now on.
    pub fn set_webhook(&self, webhook: WebhookConfig) {
        self.inner.webhooks.set_config(webhook);
    }

    pub fn webhook(&self) -> WebhookConfig {
        (*self.inner.webhooks.config()).clone()
    }

    /// Statuses waiting or being delivered.
    pub fn webhooks_pending(&self) -> usize {
        self.inner.webhooks.pending()
    }

    /// Sends an inbound customer text message webhook; returns its wamid (None without a webhook URL or when
    /// the queue is full). It takes a unit of the number's throughput and opens the user's 24 h window, as on
    /// Meta.
    pub fn inject_inbound(&self, phone_number_id: &str, from: &str, name: &str, text: &str) -> Option<String> {
        self.inner.inbound(phone_number_id, from, name, text)
    }

    /// Fires an event now (its `at_ms` is ignored): the webhook and its effect on the account state. Err for
    /// an invalid event.
    pub fn fire_event(&self, event: Event) -> Result<(), String> {
        event.kind.validate()?;
        let label =
            if event.name.is_empty() { format!("handle {}", event.kind.kind_name()) } else { event.name.clone() };
        let cancel = self.inner.shutdown.clone();
        fire::fire(&self.inner, &event, &label, &cancel);
        Ok(())
    }

    /// The announced account state, the portfolios' usage and the events fired so far.
    pub fn account_state(&self) -> AccountSnapshot {
        self.inner.account.snapshot(&self.inner.cfg, ids::now_ms())
    }

    /// The throughput the simulator enforces for a number now (an upgrade webhook raises it).
    pub fn throughput_mps(&self, phone_number_id: &str) -> f64 {
        self.inner.mps_for(&self.inner.current_limits(), phone_number_id)
    }

    /// Clears the oracle, counters and limiter state, makes expired tokens valid, restarts the scenario clock.
    pub fn reset(&self) {
        self.inner.reset();
    }

    /// Writes the oracle snapshot as JSON.
    pub fn dump(&self, path: &Path) -> anyhow::Result<()> {
        self.inner.dump(path)
    }

    pub fn dump_path(&self) -> Option<PathBuf> {
        self.inner.cfg.dump_path.clone()
    }

    /// Stops serving (in-flight hangs end at once), stops webhooks, and writes the dump if `dump_path` is set.
    pub async fn shutdown(self) {
        self.inner.shutdown.cancel();
        let server = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(server) = server {
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
        if let Some(path) = &self.inner.cfg.dump_path
            && let Err(e) = self.inner.dump(path)
        {
            tracing::warn!(error = %e, "oracle dump failed");
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.inner.shutdown.cancel();
    }
}
