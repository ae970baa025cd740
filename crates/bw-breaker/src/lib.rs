//! Distributed circuit breaker and rate limits for sender scopes (WABA + phone number), shared by every
//! dispatcher and replay instance through atomic Redis Lua scripts (`lua/`).
//!
//! [`Breaker::admit`] decides a batch of sends of one scope in one round trip (pause, breaker, usage throttle,
//! pair rate, sender rate with a priority reserve, replay only on spare rate) and gives every admitted send a
//! slot (a wait, so the fleet's sends of a number are spaced at its current rate); [`Breaker::record`] feeds a
//! batch of outcomes back in one round trip and reports the transitions it caused, which the library also
//! publishes on `bw.breaker.v1.<phone>`.
//!
//! Pauses hold exactly their scope ([`OutcomeKind::Pause`], [`Breaker::pause`]; `lua/parent_pause.lua`): the
//! number's own pause key shares the number's hash tag and `admit_send.lua` reads it in the admission call
//! ([`DenyReason::NumberPaused`]); the pauses above the number (app: code 4 and friends; WABA: 80007 / 80008,
//! 368, 131031, 131042, 131063, 131064; token: 190, 0 with an auth subcode, permission codes) live in their own
//! keys with their own hash tag. Admission reads those (concurrently, at most once per `parent_refresh_ms` per key
//! and process; a pause this process records is known at once) and refuses every send under them (marketing
//! only, for a marketing-only pause) with [`DenyReason::AppPaused`], [`DenyReason::WabaPaused`] or
//! [`DenyReason::TokenHalted`]. Each pause records its code and reason, its start, its end or what lifts it, and
//! who set it ([`ParentStatus`]). A token halt is keyed by a fingerprint of the token ([`token_fingerprint`]), so
//! it lifts by itself when the token changes ([`Breaker::set_account`]). State changes only inside the scripts, on Redis server time. When
//! Redis is unreachable the library never errors on the send path: it answers from a local conservative
//! fallback ([`BreakerConfig`] `fallback_*`) with `degraded = true`, and goes back to Redis on its own.
//!
//! What must not live here: NATS consumption, Meta calls, or config authority (the coordinator owns that).

pub mod budget;
mod config;
pub mod evidence;
mod local;
mod metrics;
pub mod order;
mod pool;
pub mod recipient;
pub mod scripts;
pub mod template_rules;
pub mod templates;
pub mod throughput;

pub use config::{BreakerConfig, ScopeLimits};
pub use order::{Blocker, OrderBook, OrderRelease, Registration};
pub use pool::PoolResult;

use bw_common::classify::{PauseScope, RateScope};
use bw_proto::v1::{self as proto, BreakerState, BreakerTransition};
use prost::Message as _;
use rand::RngExt;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A sender scope: one phone number of one WhatsApp Business Account.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub waba_id: String,
    pub phone_number_id: String,
}

impl Scope {
    pub fn new(waba_id: impl Into<String>, phone_number_id: impl Into<String>) -> Scope {
        Scope { waba_id: waba_id.into(), phone_number_id: phone_number_id.into() }
    }

    /// `waba_id:phone_number_id`, the member of `names::SCOPES_INDEX_KEY`.
    pub fn index_member(&self) -> String {
        format!("{}:{}", self.waba_id, self.phone_number_id)
    }

    /// Parses an index member back.
    pub fn from_index_member(member: &str) -> Option<Scope> {
        let (waba, phone) = member.split_once(':')?;
        (!waba.is_empty() && !phone.is_empty()).then(|| Scope::new(waba, phone))
    }

    fn to_proto(&self) -> proto::Scope {
        proto::Scope { waba_id: self.waba_id.clone(), phone_number_id: self.phone_number_id.clone() }
    }
}

/// Traffic class of a send, deciding which share of the sender rate it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrafficClass {
    /// Authentication, transactional, support: may use the whole bucket including the reserve.
    Priority,
    /// Priority traffic that goes first within its class, fleet-wide: a dead-lettered priority message being
    /// replayed (older than any live one), or a live one close to its deadline. While one of these waits for
    /// sender tokens, the sender's other priority messages take only a full bucket (spare rate) for
    /// `OLDER_PRIORITY_WAIT_MS` in `lua/admit_send.lua`; otherwise it is admitted like [`TrafficClass::Priority`].
    OlderPriority,
    /// Marketing: never takes the reserve; slowed and paused first under Meta usage pressure.
    Marketing,
    /// Messages replayed from the DLQ: only the spare rate above the reserve plus a headroom.
    Replay,
}

impl TrafficClass {
    /// Priority traffic (either kind): may take the transactional reserve.
    pub fn is_priority(self) -> bool {
        matches!(self, TrafficClass::Priority | TrafficClass::OlderPriority)
    }
}

/// One send asking for admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitItem {
    /// `bw_common::mask::recipient_key` of the recipient.
    pub recipient_key: String,
    pub class: TrafficClass,
}

/// The answer for one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Send it, after sleeping `wait_ms` (its send slot, measured from the admission; sleep right before the
    /// POST). `canary` is true while HALF_OPEN; report it back in [`OutcomeItem::canary`].
    Allow { canary: bool, wait_ms: u64 },
    /// Do not send now; come back after `retry_after_ms`.
    Deny { reason: DenyReason, retry_after_ms: u64 },
}

/// Why a send was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyReason {
    BreakerOpen,
    ForcedOpen,
    /// Fleet-wide pause of the scope (rate-limit error, Retry-After, credentials).
    Paused,
    SenderRate,
    PairRate,
    /// Tokens left are reserved for priority traffic (or, for replay, the live headroom).
    Reserve,
    /// Meta usage header above the throttle levels.
    Throttled,
    /// HALF_OPEN and this second's canaries are taken.
    CanaryBudget,
    /// Redis unreachable and the local fallback refuses this class (replay).
    Degraded,
    /// 131048: the number is restricted for spam / quality; paused for minutes.
    SpamPaused,
    /// 131049: marketing to this recipient is deferred (at least 24 h); other classes are not.
    RecipientDeferred,
    /// A pause of kind registration in the number's state hash (`PAUSE.registration` of the prelude; 133016 now
    /// pauses the number's own pause key, [`DenyReason::NumberPaused`]).
    RegistrationPaused,
    /// Code 4 (17, 32, 613): the app's call budget; every number on the app is paused.
    AppPaused,
    /// A pause of the WABA (its budget, a restriction, billing, marketing disabled): every number of the WABA is
    /// paused (marketing only, for a marketing-only pause).
    WabaPaused,
    /// The access token is halted (190, 0 with an auth subcode, permission codes): every number on it is halted
    /// until the token changes or an operator lifts the halt.
    TokenHalted,
    /// The number's own pause (registration, display name, deleted number, maintenance, an authentication
    /// refusal that probes): this number alone.
    NumberPaused,
    /// An earlier accepted message to the same recipient (same sender, a category that keeps order) is still
    /// waiting: this one may not reach Meta before it ([`Admission::blockers`] names it).
    OrderWait,
}

impl DenyReason {
    /// Metric / log label.
    pub fn label(self) -> &'static str {
        match self {
            DenyReason::BreakerOpen => "breaker_open",
            DenyReason::ForcedOpen => "forced_open",
            DenyReason::Paused => "paused",
            DenyReason::SenderRate => "sender_rate",
            DenyReason::PairRate => "pair_rate",
            DenyReason::Reserve => "reserve",
            DenyReason::Throttled => "throttled",
            DenyReason::CanaryBudget => "canary_budget",
            DenyReason::Degraded => "degraded",
            DenyReason::SpamPaused => "spam_paused",
            DenyReason::RecipientDeferred => "recipient_deferred",
            DenyReason::RegistrationPaused => "registration_paused",
            DenyReason::AppPaused => "app_paused",
            DenyReason::WabaPaused => "waba_paused",
            DenyReason::TokenHalted => "token_halted",
            DenyReason::OrderWait => "order_wait",
            DenyReason::NumberPaused => "number_paused",
        }
    }

    /// Every reason.
    pub const ALL: [DenyReason; 17] = [
        DenyReason::BreakerOpen,
        DenyReason::ForcedOpen,
        DenyReason::Paused,
        DenyReason::SenderRate,
        DenyReason::PairRate,
        DenyReason::Reserve,
        DenyReason::Throttled,
        DenyReason::CanaryBudget,
        DenyReason::Degraded,
        DenyReason::SpamPaused,
        DenyReason::RecipientDeferred,
        DenyReason::RegistrationPaused,
        DenyReason::AppPaused,
        DenyReason::WabaPaused,
        DenyReason::TokenHalted,
        DenyReason::OrderWait,
        DenyReason::NumberPaused,
    ];

    /// The `admit_send.lua` code of this reason; None for the reasons decided in Rust (the local fallback and
    /// the parent pauses, which live outside the scope's hash slot).
    pub fn lua_code(self) -> Option<scripts::Code> {
        scripts::Code::ALL.into_iter().find(|c| c.deny_reason() == Some(self))
    }
}

/// Answer to [`Breaker::admit`]: one decision per item, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    pub decisions: Vec<Decision>,
    pub state: BreakerState,
    /// Incident id while the scope is not CLOSED (empty otherwise).
    pub incident_id: String,
    /// True when answered by the local fallback (Redis unreachable).
    pub degraded: bool,
    /// Unix ms the decisions were made at (Redis server time; this host's clock when answered without the
    /// scope script). A send slot is at `server_now_ms + wait_ms`.
    pub server_now_ms: i64,
    /// Spacing of the scope's send slots when the decisions were made (1 / effective rate), ms; 0 when the
    /// answer came without a slot schedule (a refusal known without a round trip).
    pub slot_gap_ms: f64,
    /// For each [`DenyReason::OrderWait`] decision (same index), the operation it waits for; empty when the
    /// admission carried no operation ids ([`Breaker::admit`]) or was answered without the scope script.
    pub blockers: Vec<Option<Blocker>>,
}

/// What a send ended in, as far as the breaker cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    Success,
    /// 5xx, 131000 and friends, timeouts before a response: counts toward the breaker.
    Transient,
    /// Meta's own answer that its service is unavailable ([`evidence::UNAVAILABLE_CODES`] in its JSON error
    /// body): a transient failure everywhere, and also the evidence of the pool's second test
    /// ([`evidence::Declared`]). [`OutcomeKind::transient`] picks it from the code.
    Unavailable,
    /// A rate limit at its own scope; never a health failure:
    /// - [`RateScope::PhoneNumber`] (130429): pauses the number for `pause_ms`, cuts its adaptive rate;
    /// - [`RateScope::Pair`] (131056): the pair backs off 4^X s (`pause_ms` is ignored);
    /// - [`RateScope::Spam`] (131048): pauses the number for `pause_ms` ([`DenyReason::SpamPaused`]);
    /// - [`RateScope::Recipient`] (131049): defers marketing to the recipient for max(`pause_ms`, 24 h);
    /// - [`RateScope::App`] / [`RateScope::Waba`]: pauses the app / WABA key for `pause_ms` (every number; the
    ///   dispatcher records these as [`OutcomeKind::Pause`] with Meta's code);
    /// - [`RateScope::Flow`] (132069): recorded nowhere (admission does not know Flows; the dispatcher parks the
    ///   message for the hour).
    RateLimited {
        scope: RateScope,
        pause_ms: u64,
    },
    /// Permanent client error: never counts.
    Permanent,
    /// A pause of the number, its WABA, its app or its access token (set with [`Breaker::set_account`]), and of
    /// nothing else ([`PauseSpec`]). Never a health failure: the window does not see it.
    Pause(PauseSpec),
}

impl OutcomeKind {
    /// The kind of a transient failure answered with Meta's error `code` (0: no Meta error body).
    pub fn transient(code: i64) -> OutcomeKind {
        if evidence::declares_unavailable(code) { OutcomeKind::Unavailable } else { OutcomeKind::Transient }
    }

    /// A transient failure: counts in the breaker's window and fast trip.
    pub fn is_transient(self) -> bool {
        matches!(self, OutcomeKind::Transient | OutcomeKind::Unavailable)
    }
}

/// A pause to record: its scope (token, app, WABA or phone number; other scopes have no pause key here), the
/// Meta code behind it, how it ends, and who asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PauseSpec {
    pub scope: PauseScope,
    pub code: i64,
    pub end: PauseEnd,
    /// Only marketing sends are held (WABA scope).
    pub marketing_only: bool,
    pub source: PauseSource,
}

/// How a pause ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseEnd {
    /// After this many ms.
    For(u64),
    /// After this many ms (or twice the last such pause of the key, up to
    /// [`bw_common::classify::PROBE_PAUSE_MAX_MS`]); then one send probes (number scope; a pause above the
    /// number simply ends and the next answer tells).
    Probe(u64),
    /// When a person lifts it ([`Breaker::clear_parent`]), or, for a token, when the token changes. The key
    /// expires after `token_halt_ttl_ms`; the next send then probes.
    Lifted,
}

/// Who set a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PauseSource {
    /// Meta's answer to a send.
    Answer,
    /// A webhook of Meta (a failed status, an account update).
    Webhook,
    /// An operator.
    Operator,
}

impl PauseSource {
    pub fn label(self) -> &'static str {
        match self {
            PauseSource::Answer => "answer",
            PauseSource::Webhook => "webhook",
            PauseSource::Operator => "operator",
        }
    }
}

/// One outcome to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeItem {
    pub recipient_key: String,
    pub kind: OutcomeKind,
    /// The `canary` flag of the admission that let this send through.
    pub canary: bool,
}

/// Answer to [`Breaker::record`].
#[derive(Debug, Clone, PartialEq)]
pub struct RecordResult {
    pub state: BreakerState,
    pub incident_id: String,
    /// Transitions this batch caused (already published when the breaker has a NATS client).
    pub transitions: Vec<BreakerTransition>,
    pub degraded: bool,
}

/// Operator override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forced {
    Open,
    Closed,
    /// Remove an override; the scope returns to CLOSED (with the usual ramp-up).
    Clear,
}

/// Current state of a scope, with live counters beyond the BW_SCOPES snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeStatus {
    pub snapshot: proto::ScopeSnapshot,
    pub failures_in_window: u64,
    /// Tokens in the sender bucket now.
    pub tokens: f64,
    /// Last Meta usage percent still valid (0 when none).
    pub usage_percent: u32,
    /// Trips within the current incident (drives the cooldown growth).
    pub trip_streak: u32,
    /// Learned share of the configured rate (AIMD on 130429; 1 = the configured rate).
    pub adaptive_share: f64,
    /// Whether Meta's answers carry usage headers for this scope.
    pub quota_visibility: QuotaVisibility,
    /// Wait the next admitted send would get for its slot, ms.
    pub next_slot_wait_ms: u64,
}

/// Whether Breakwater can see the scope's Meta quota (usage headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaVisibility {
    /// The last answer carried usage headers.
    Seen,
    /// The last answer carried none: conservative limits apply (`blind_rate_factor`).
    Blind,
    /// No answer seen yet.
    Unknown,
}

/// A scope with a pause key: the number itself, or a scope above it whose pause covers many numbers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Parent {
    /// The number alone (its own pause key, in its hash tag).
    Number(Scope),
    /// An app, by app id.
    App(String),
    /// A WABA, by id.
    Waba(String),
    /// An access token, by [`token_fingerprint`].
    Token(String),
}

impl Parent {
    /// Its Redis key.
    pub fn key(&self) -> String {
        match self {
            Parent::Number(scope) => scripts::number_pause_key(scope),
            Parent::App(id) => scripts::app_pause_key(id),
            Parent::Waba(id) => scripts::waba_pause_key(id),
            Parent::Token(fp) => scripts::token_halt_key(fp),
        }
    }

    /// Its level: number, WABA, app or token.
    pub fn level(&self) -> PauseScope {
        match self {
            Parent::Number(_) => PauseScope::PhoneNumber,
            Parent::App(_) => PauseScope::App,
            Parent::Waba(_) => PauseScope::Waba,
            Parent::Token(_) => PauseScope::Token,
        }
    }

    /// The paused scope's id (phone_number_id, WABA id, app id, token fingerprint).
    pub fn id(&self) -> &str {
        match self {
            Parent::Number(scope) => &scope.phone_number_id,
            Parent::App(id) | Parent::Waba(id) | Parent::Token(id) => id,
        }
    }

    fn deny_reason(&self) -> DenyReason {
        match self {
            Parent::Number(_) => DenyReason::NumberPaused,
            Parent::App(_) => DenyReason::AppPaused,
            Parent::Waba(_) => DenyReason::WabaPaused,
            Parent::Token(_) => DenyReason::TokenHalted,
        }
    }
}

/// State of a pause (of a number, WABA, app or token).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParentStatus {
    /// Unix ms until which it is paused (0: not paused, or paused until lifted: see `halted`).
    pub paused_until_unix_ms: i64,
    pub reason: String,
    /// Paused until lifted (an operator, a new token; a token halt, a WABA restriction, a number's registration).
    pub halted: bool,
    /// Meta code behind it (0: none).
    pub code: i64,
    /// Start of the pause in force, Unix ms (0: none).
    pub since_unix_ms: i64,
    /// Who set it: "answer", "webhook" or "operator" (empty: none).
    pub source: String,
    /// What ends it: "time", "probe", "operator" or "new_token" (empty: none).
    pub lift: String,
    /// Holds marketing sends only.
    pub marketing_only: bool,
}

impl ParentStatus {
    /// In force now: halted, or paused past `now_ms`.
    pub fn active(&self, now_ms: i64) -> bool {
        self.halted || self.paused_until_unix_ms > now_ms
    }

    /// The pause as the scope snapshot shows it.
    pub fn to_proto(&self, parent: &Parent) -> proto::ScopePause {
        proto::ScopePause {
            level: parent.level().label().to_string(),
            id: parent.id().to_string(),
            code: self.code,
            reason: self.reason.clone(),
            since_unix_ms: self.since_unix_ms,
            until_unix_ms: if self.halted { 0 } else { self.paused_until_unix_ms },
            lift: self.lift.clone(),
            source: self.source.clone(),
            marketing_only: self.marketing_only,
        }
    }

    fn from_reply(reply: &scripts::ParentReply) -> ParentStatus {
        ParentStatus {
            paused_until_unix_ms: reply.paused_until_ms,
            reason: reply.reason.clone(),
            halted: reply.halted,
            code: reply.code,
            since_unix_ms: reply.since_ms,
            source: reply.source.clone(),
            lift: reply.lift.clone(),
            marketing_only: reply.marketing,
        }
    }
}

/// Fingerprint of an access token used in Redis keys: the first 16 hex digits of its SHA-256. The token itself
/// never reaches Redis, logs or metrics.
pub fn token_fingerprint(access_token: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(access_token.as_bytes());
    hex::encode(&digest[..8])
}

/// The app and token a scope's sends use, as the dispatchers record them for the coordinator
/// ([`Breaker::scope_accounts`]): the pauses above the number that cover it are these and its WABA's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeAccount {
    /// The app key of its app pause (the app id; `tok-<fingerprint>` or `default` when none is configured).
    pub app: String,
    /// The token's fingerprint, if a token is set.
    pub token_fp: Option<String>,
}

impl ScopeAccount {
    fn encode(&self) -> String {
        format!("{}\t{}", self.app, self.token_fp.as_deref().unwrap_or(""))
    }

    fn decode(value: &str) -> Option<ScopeAccount> {
        let (app, fp) = value.split_once('\t')?;
        Some(ScopeAccount { app: app.to_string(), token_fp: (!fp.is_empty()).then(|| fp.to_string()) })
    }

    /// The pauses above the number that cover `scope` under this account: its WABA, the app and the token.
    pub fn parents(&self, scope: &Scope) -> Vec<Parent> {
        let mut out = vec![Parent::Waba(scope.waba_id.clone())];
        if !self.app.is_empty() {
            out.push(Parent::App(self.app.clone()));
        }
        if let Some(fp) = &self.token_fp {
            out.push(Parent::Token(fp.clone()));
        }
        out
    }
}

/// The app and token this breaker's sends use.
#[derive(Debug, Clone, Default)]
struct Account {
    app_id: String,
    token_fp: Option<String>,
}

/// What this process knows of a pause above the number.
#[derive(Debug, Clone)]
struct ParentEntry {
    fetched: tokio::time::Instant,
    /// Redis time of the read.
    server_now_ms: i64,
    paused_until_ms: i64,
    halted: bool,
    marketing_only: bool,
    /// Retry-after of an untimed hold, ms (0: the configured `token_halt_retry_ms`).
    retry_ms: u64,
    /// End of the last pause seen (Redis ms), kept after it ended so the ramp can start there.
    last_end_ms: i64,
}

/// Why a non-send-path breaker call failed.
#[derive(Debug, thiserror::Error)]
pub enum BreakerError {
    #[error("breaker has no redis connection")]
    NoRedis,
    #[error("redis call `{script}` timed out after {timeout_ms} ms")]
    Timeout { script: &'static str, timeout_ms: u64 },
    #[error("redis call failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("unexpected script reply: {0}")]
    BadReply(String),
}

/// Redis connection: a single node or a cluster (every key of a scope shares one hash tag, so the same
/// scripts run unchanged on both). Defined in `bw_common::redis_conn`, shared by every service.
pub use bw_common::redis_conn::RedisConn;

pub(crate) async fn invoke(conn: &RedisConn, inv: &redis::ScriptInvocation<'_>) -> redis::RedisResult<redis::Value> {
    let mut conn = conn.clone();
    inv.invoke_async(&mut conn).await
}

async fn sadd(conn: &RedisConn, key: &str, member: &str) -> redis::RedisResult<()> {
    let mut conn = conn.clone();
    redis::cmd("SADD").arg(key).arg(member).query_async::<()>(&mut conn).await
}

struct Inner {
    redis: Option<RedisConn>,
    nats: Option<async_nats::Client>,
    cfg: BreakerConfig,
    defaults: String,
    local: Mutex<local::LocalBreakers>,
    /// Last state Redis reported per scope, to seed the fallback.
    last_known: Mutex<HashMap<String, (BreakerState, String)>>,
    registered: Mutex<HashSet<String>>,
    /// Last usage band sent per scope, and when.
    usage_sent: Mutex<HashMap<String, (i8, tokio::time::Instant)>>,
    /// Unix ms until which calls go straight to the fallback.
    redis_down_until: AtomicI64,
    /// When a script call last got its answer (unix ms): a timeout while others are answered is congestion.
    redis_answered_at: AtomicI64,
    /// Scopes Redis last reported OPEN, until their cooldown ends, with the incident: admissions for them are
    /// refused here without a round trip. Only used once [`Breaker::follow_transitions`] keeps it fresh.
    open_until: Mutex<HashMap<String, (tokio::time::Instant, String)>>,
    cache_open: std::sync::atomic::AtomicBool,
    round_trips: AtomicU64,
    metrics: metrics::Metrics,
    account: Mutex<Account>,
    parents: Mutex<HashMap<String, ParentEntry>>,
}

/// Client of the distributed breaker; cheap to clone.
#[derive(Clone)]
pub struct Breaker {
    inner: Arc<Inner>,
}

/// Records what is known of scope `key`: OPEN for `open_for_ms` more (with its incident), or nothing.
fn know_open(inner: &Inner, key: String, state: BreakerState, open_for_ms: i64, incident_id: &str) {
    let mut open = lock(&inner.open_until);
    if state == BreakerState::Open && open_for_ms > 0 {
        let until = tokio::time::Instant::now() + Duration::from_millis(open_for_ms as u64);
        open.insert(key, (until, incident_id.to_string()));
    } else {
        open.remove(&key);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Breaker {
    /// A breaker over a single Redis (None: always the local fallback) publishing transitions on `nats`.
    pub fn new(
        redis: Option<redis::aio::ConnectionManager>,
        nats: Option<async_nats::Client>,
        cfg: BreakerConfig,
    ) -> Breaker {
        Breaker::with_conn(redis.map(RedisConn::Single), nats, cfg)
    }

    /// A breaker over any [`RedisConn`].
    pub fn with_conn(redis: Option<RedisConn>, nats: Option<async_nats::Client>, cfg: BreakerConfig) -> Breaker {
        let defaults = cfg.defaults.encode();
        Breaker {
            inner: Arc::new(Inner {
                redis,
                nats,
                cfg,
                defaults,
                local: Mutex::new(local::LocalBreakers::new()),
                last_known: Mutex::new(HashMap::new()),
                registered: Mutex::new(HashSet::new()),
                usage_sent: Mutex::new(HashMap::new()),
                redis_down_until: AtomicI64::new(0),
                redis_answered_at: AtomicI64::new(0),
                open_until: Mutex::new(HashMap::new()),
                cache_open: std::sync::atomic::AtomicBool::new(false),
                round_trips: AtomicU64::new(0),
                metrics: metrics::Metrics::default(),
                account: Mutex::new(Account::default()),
                parents: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Registers the library's metrics (call once per process).
    pub fn register_metrics(&self, registry: &bw_common::admin::MetricsRegistry) {
        if let Ok(mut registry) = registry.lock() {
            self.inner.metrics.register(&mut registry);
        }
    }

    /// Redis script round trips made by this breaker (and its clones) so far.
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    /// The client config.
    pub fn config(&self) -> &BreakerConfig {
        &self.inner.cfg
    }

    async fn call(&self, script: &'static str, inv: redis::ScriptInvocation<'_>) -> Result<redis::Value, BreakerError> {
        let redis = self.inner.redis.as_ref().ok_or(BreakerError::NoRedis)?;
        let timeout_ms = self.inner.cfg.command_timeout_ms;
        self.inner.round_trips.fetch_add(1, Ordering::Relaxed);
        metrics::Metrics::inc(&self.inner.metrics.round_trips, "script", script);
        match tokio::time::timeout(Duration::from_millis(timeout_ms), invoke(redis, &inv)).await {
            Ok(Ok(value)) => {
                self.inner.redis_answered_at.store(bw_common::time::now_ms(), Ordering::Relaxed);
                Ok(value)
            }
            Ok(Err(e)) => Err(BreakerError::Redis(e)),
            Err(_) => Err(BreakerError::Timeout { script, timeout_ms }),
        }
    }

    /// True when the send path should skip Redis for now (a recent failure).
    fn redis_skipped(&self) -> bool {
        self.inner.redis.is_none() || bw_common::time::now_ms() < self.inner.redis_down_until.load(Ordering::Relaxed)
    }

    /// After a failed call: Redis counts as unreachable (every call answered locally for
    /// `redis_retry_after_ms`) unless the failure was a timeout while other calls were still being answered
    /// within the command timeout. That is congestion (this process's own burst of calls queued on the
    /// connection), not an outage: marking Redis down for it sent a loaded dispatcher's every admission to the
    /// local fallback (5 msg/s per scope) and the pipeline bench from about 1,000 msg/s to 20-65 msg/s.
    fn mark_down(&self, op: &'static str, error: &BreakerError) {
        let timed_out = match error {
            BreakerError::Timeout { .. } => true,
            // The connection's own response timeout.
            BreakerError::Redis(e) => e.is_timeout(),
            _ => false,
        };
        if timed_out {
            let answered = self.inner.redis_answered_at.load(Ordering::Relaxed);
            if bw_common::time::now_ms() - answered <= self.inner.cfg.command_timeout_ms as i64 {
                tracing::debug!(op, error = %error, "redis call timed out while others are answered: congestion");
                return;
            }
        }
        let until = bw_common::time::now_ms() + self.inner.cfg.redis_retry_after_ms as i64;
        let previous = self.inner.redis_down_until.swap(until, Ordering::Relaxed);
        if previous < bw_common::time::now_ms() {
            tracing::warn!(op, error = %error, "breaker redis unreachable; answering from the local fallback");
        }
    }

    /// Adds the scope to the index of scopes (once per process), and records the account this process sends it
    /// with, so the coordinator knows which app and token pauses cover it.
    async fn register_scope(&self, scope: &Scope) {
        let member = scope.index_member();
        if lock(&self.inner.registered).contains(&member) {
            return;
        }
        if let Some(redis) = &self.inner.redis {
            let timeout = Duration::from_millis(self.inner.cfg.command_timeout_ms);
            let account = self.account();
            let registered = async {
                sadd(redis, bw_wire::names::SCOPES_INDEX_KEY, &member).await?;
                if let Some(account) = &account {
                    let mut conn = redis.clone();
                    redis::cmd("HSET")
                        .arg(scripts::SCOPE_ACCOUNTS_KEY)
                        .arg(&member)
                        .arg(account.encode())
                        .query_async::<()>(&mut conn)
                        .await?;
                }
                Ok::<(), redis::RedisError>(())
            };
            if let Ok(Ok(())) = tokio::time::timeout(timeout, registered).await {
                lock(&self.inner.registered).insert(member);
            }
        }
    }

    fn remember(&self, scope: &Scope, head: &scripts::Head) {
        let key = scope.index_member();
        lock(&self.inner.local).forget(&key);
        lock(&self.inner.last_known).insert(key.clone(), (head.state, head.incident_id.clone()));
        // While OPEN nothing but an operator (force, reset: both publish a transition) changes the state before
        // the cooldown ends, so until then the answer is known without asking Redis.
        let open_for = head.open_until_ms - head.now_ms;
        know_open(&self.inner, key, head.state, open_for, &head.incident_id);
    }

    /// Keeps the OPEN cache fresh from the transitions every process publishes, and turns it on: from then on
    /// admissions for a scope known to be OPEN (from a Redis reply or a trip event) are refused without a Redis
    /// round trip until its cooldown ends or another transition of the scope arrives. Needs the NATS client;
    /// the subscription lives as long as the breaker.
    pub async fn follow_transitions(&self) -> Result<(), async_nats::SubscribeError> {
        let Some(nats) = &self.inner.nats else { return Ok(()) };
        let mut events = nats.subscribe(bw_wire::names::breaker_subject("*")).await?;
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            use futures::StreamExt;
            while let Some(msg) = events.next().await {
                let Some(inner) = inner.upgrade() else { return };
                if let Ok(event) = BreakerTransition::decode(msg.payload.as_ref())
                    && let Some(scope) = &event.scope
                {
                    let key = Scope { waba_id: scope.waba_id.clone(), phone_number_id: scope.phone_number_id.clone() }
                        .index_member();
                    // A trip seen by another instance is known here at once; any other transition ends what
                    // this instance knew.
                    let open_for = event.open_until_unix_ms - bw_common::time::now_ms();
                    know_open(&inner, key, event.to(), open_for, &event.incident_id);
                }
            }
        });
        self.inner.cache_open.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The refusal for a scope known to be OPEN, if it is.
    fn known_open(&self, scope: &Scope, n: usize) -> Option<Admission> {
        if !self.inner.cache_open.load(Ordering::Relaxed) {
            return None;
        }
        let key = scope.index_member();
        let mut open = lock(&self.inner.open_until);
        let (until, incident_id) = open.get(&key)?.clone();
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            open.remove(&key);
            return None;
        }
        let deny = Decision::Deny { reason: DenyReason::BreakerOpen, retry_after_ms: left.as_millis().max(1) as u64 };
        Some(Admission {
            decisions: vec![deny; n],
            state: BreakerState::Open,
            incident_id,
            degraded: false,
            server_now_ms: bw_common::time::now_ms(),
            blockers: Vec::new(),
            slot_gap_ms: 0.0,
        })
    }

    fn last_known(&self, scope: &Scope) -> Option<(BreakerState, String)> {
        lock(&self.inner.last_known).get(&scope.index_member()).cloned()
    }

    /// Admits a batch of sends of one scope in one round trip. Never fails: without Redis it answers from the
    /// local fallback with `degraded = true`.
    pub async fn admit(&self, scope: &Scope, items: &[AdmitItem]) -> Admission {
        self.admit_ordered(scope, items, &[]).await
    }

    /// [`Breaker::admit`] with the per-recipient order gate: `operation_ids[i]` is the operation of `items[i]`
    /// (missing or empty: not gated). An operation registered in its recipient's order set
    /// ([`OrderBook::register`]) behind one still waiting is refused with [`DenyReason::OrderWait`], and
    /// [`Admission::blockers`] names the earliest one. Same single round trip; the local fallback (Redis
    /// unreachable) does not gate.
    ///
    /// A gated batch skips the refusals decided without the script (a scope known to be OPEN, a parent pause):
    /// the gate is read first, so a message behind an earlier one waits for it instead of following it into
    /// the DLQ. It costs the round trip the OPEN cache would have saved; under a parent pause the refusal then
    /// replaces every decision but order_wait. While Redis is unreachable every message gets the local
    /// fallback's answer (a bounded rate): the order sets cannot be read, so order is not kept then.
    pub async fn admit_ordered(&self, scope: &Scope, items: &[AdmitItem], operation_ids: &[String]) -> Admission {
        let gated = operation_ids.iter().any(|op| !op.is_empty());
        if !gated && let Some(admission) = self.admit_known_open(scope, items.len()) {
            return admission;
        }
        let parents = self.parent_check(scope).await;
        if let Some((reason, retry_after_ms)) = parents.block {
            let deny = Decision::Deny { reason, retry_after_ms: retry_after_ms.max(1) };
            let admission = if gated {
                let mut admission = self.admit_uncached(scope, items, operation_ids, parents.ended_ms).await;
                for d in &mut admission.decisions {
                    if !matches!(d, Decision::Deny { reason: DenyReason::OrderWait, .. }) {
                        *d = deny;
                    }
                }
                admission
            } else {
                self.refused_here(scope, vec![deny; items.len()])
            };
            self.count_decisions(&admission);
            return admission;
        }
        let admission = match parents.marketing_block {
            Some((reason, retry_after_ms)) => {
                let deny = Decision::Deny { reason, retry_after_ms: retry_after_ms.max(1) };
                self.admit_without_marketing(scope, items, operation_ids, parents.ended_ms, deny).await
            }
            None => self.admit_uncached(scope, items, operation_ids, parents.ended_ms).await,
        };
        self.count_decisions(&admission);
        admission
    }

    /// An admission decided here without the scope script (a pause above the number refuses every item).
    fn refused_here(&self, scope: &Scope, decisions: Vec<Decision>) -> Admission {
        let (state, incident_id) = self.last_known(scope).unwrap_or((BreakerState::Closed, String::new()));
        Admission {
            decisions,
            state,
            incident_id,
            degraded: false,
            server_now_ms: bw_common::time::now_ms(),
            blockers: Vec::new(),
            slot_gap_ms: 0.0,
        }
    }

    /// Under a marketing-only pause (131063 on the WABA): marketing and marketing replays are refused with
    /// `deny` without taking tokens or slots; the others are admitted as usual.
    async fn admit_without_marketing(
        &self,
        scope: &Scope,
        items: &[AdmitItem],
        operation_ids: &[String],
        parent_ended_ms: i64,
        deny: Decision,
    ) -> Admission {
        let held = |item: &AdmitItem| matches!(item.class, TrafficClass::Marketing | TrafficClass::Replay);
        let rest: Vec<usize> = (0..items.len()).filter(|&i| !held(&items[i])).collect();
        if rest.is_empty() {
            return self.refused_here(scope, vec![deny; items.len()]);
        }
        let sub_items: Vec<AdmitItem> = rest.iter().map(|&i| items[i].clone()).collect();
        let sub_ops: Vec<String> = rest.iter().map(|&i| operation_ids.get(i).cloned().unwrap_or_default()).collect();
        let sub = self.admit_uncached(scope, &sub_items, &sub_ops, parent_ended_ms).await;
        let mut decisions = vec![deny; items.len()];
        let mut blockers = if sub.blockers.is_empty() { Vec::new() } else { vec![None; items.len()] };
        for (j, &i) in rest.iter().enumerate() {
            if let Some(d) = sub.decisions.get(j) {
                decisions[i] = *d;
            }
            if let Some(b) = sub.blockers.get(j) {
                blockers[i] = b.clone();
            }
        }
        Admission { decisions, blockers, ..sub }
    }

    /// Sets the app and the access token this breaker's sends use (call at start-up and whenever the token
    /// changes). App pauses are keyed by `app_id` (by the token's fingerprint when it is empty), token halts by
    /// the token's fingerprint: a new token is not under the old token's halt. The token is not kept. The scopes
    /// this process sends for are recorded with it for the coordinator ([`Breaker::scope_accounts`]).
    pub fn set_account(&self, app_id: &str, access_token: &str) {
        let token_fp = (!access_token.is_empty()).then(|| token_fingerprint(access_token));
        *lock(&self.inner.account) = Account { app_id: app_id.to_string(), token_fp };
        lock(&self.inner.registered).clear();
    }

    /// The account of this process's sends (app key and token fingerprint), None before [`Breaker::set_account`].
    fn account(&self) -> Option<ScopeAccount> {
        let account = lock(&self.inner.account).clone();
        if account.app_id.is_empty() && account.token_fp.is_none() {
            return None;
        }
        Some(ScopeAccount { app: app_key(&account), token_fp: account.token_fp })
    }

    /// The parents whose pauses cover `scope`: its WABA, the app and the token (when set).
    fn parents_of(&self, scope: &Scope) -> Vec<Parent> {
        let account = lock(&self.inner.account).clone();
        ScopeAccount { app: app_key(&account), token_fp: account.token_fp }.parents(scope)
    }

    /// Reads (or takes from the cache) the pauses of the scope's parents: the first refusal (for every send, and
    /// for marketing sends only), and the end of a parent pause that ended within `pause_ramp_ms` (0 if none)
    /// for the ramp.
    async fn parent_check(&self, scope: &Scope) -> ParentCheck {
        let parents = self.parents_of(scope);
        let refresh = Duration::from_millis(self.inner.cfg.parent_refresh_ms);
        let stale: Vec<&Parent> = {
            let cache = lock(&self.inner.parents);
            parents.iter().filter(|p| cache.get(&p.key()).is_none_or(|e| e.fetched.elapsed() >= refresh)).collect()
        };
        if !stale.is_empty() && !self.redis_skipped() {
            let reads = futures::future::join_all(stale.iter().map(|p| async move {
                let key = p.key();
                let inv = scripts::parent_invocation(&key, "read", &scripts::PauseArgs::default());
                (key, self.call("parent_pause", inv).await.and_then(scripts::parent_reply))
            }))
            .await;
            // A failed read keeps what was known (or nothing) and leaves it to the admission call to find out
            // whether Redis is down: a slow parent read alone never sends the scope to the local fallback.
            for (key, reply) in reads {
                match reply {
                    Ok(reply) => self.remember_parent(key, &reply),
                    Err(e) => tracing::debug!(parent = %key, error = %e, "parent pause read failed"),
                }
            }
        }
        let cache = lock(&self.inner.parents);
        let ramp = self.inner.cfg.defaults.pause_ramp_ms as i64;
        let mut check = ParentCheck::default();
        for parent in &parents {
            let Some(e) = cache.get(&parent.key()) else { continue };
            let server_now = e.server_now_ms + e.fetched.elapsed().as_millis() as i64;
            let block = if e.halted {
                let retry = if e.retry_ms > 0 { e.retry_ms } else { self.inner.cfg.token_halt_retry_ms };
                Some((parent.deny_reason(), retry))
            } else if e.paused_until_ms > server_now {
                Some((parent.deny_reason(), (e.paused_until_ms - server_now) as u64))
            } else {
                None
            };
            let slot = if e.marketing_only { &mut check.marketing_block } else { &mut check.block };
            if slot.is_none() {
                *slot = block;
            }
            if e.last_end_ms > 0 && e.last_end_ms <= server_now && e.last_end_ms + ramp > server_now {
                check.ended_ms = check.ended_ms.max(e.last_end_ms);
            }
        }
        check
    }

    fn remember_parent(&self, key: String, reply: &scripts::ParentReply) {
        let mut cache = lock(&self.inner.parents);
        let last_end_ms = match cache.get(&key) {
            Some(old) if reply.paused_until_ms == 0 => old.last_end_ms.max(old.paused_until_ms),
            _ => reply.paused_until_ms,
        };
        cache.insert(
            key,
            ParentEntry {
                fetched: tokio::time::Instant::now(),
                server_now_ms: reply.now_ms,
                paused_until_ms: reply.paused_until_ms,
                halted: reply.halted,
                marketing_only: reply.marketing,
                retry_ms: reply.retry_ms,
                last_end_ms,
            },
        );
    }

    /// Reads a pause (no change). Fails without Redis.
    pub async fn parent_status(&self, parent: &Parent) -> Result<ParentStatus, BreakerError> {
        let key = parent.key();
        let inv = scripts::parent_invocation(&key, "read", &scripts::PauseArgs::default());
        let reply = scripts::parent_reply(self.call("parent_pause", inv).await?)?;
        self.remember_parent(key, &reply);
        Ok(ParentStatus::from_reply(&reply))
    }

    /// Operator: lifts a pause or a token halt at once (a number's at once everywhere, the others for every
    /// dispatcher within `parent_refresh_ms`).
    pub async fn clear_parent(&self, parent: &Parent) -> Result<ParentStatus, BreakerError> {
        let key = parent.key();
        let inv = scripts::parent_invocation(&key, "clear", &scripts::PauseArgs::default());
        let reply = scripts::parent_reply(self.call("parent_pause", inv).await?)?;
        tracing::info!(level = parent.level().label(), id = %parent.id(), "pause lifted by an operator");
        self.remember_parent(key, &reply);
        Ok(ParentStatus::from_reply(&reply))
    }

    /// Pauses `parent` as `spec` says (an operator's or a webhook's pause; answers' pauses come through
    /// [`Breaker::record`]). The scope of `spec` is ignored: `parent` names it. Fails without Redis.
    pub async fn pause(&self, parent: &Parent, spec: PauseSpec) -> Result<ParentStatus, BreakerError> {
        self.pause_because(parent, spec, None).await
    }

    /// [`Breaker::pause`] with the reason `bwctl scope` shows (a webhook's own words: "account_update
    /// ACCOUNT_RESTRICTION ..."); `None` derives it from the code and scope.
    pub async fn pause_because(
        &self,
        parent: &Parent,
        spec: PauseSpec,
        reason: Option<&str>,
    ) -> Result<ParentStatus, BreakerError> {
        let key = parent.key();
        let (mode, mut args) = self.pause_args(spec);
        if let Some(reason) = reason {
            args.reason = reason.to_string();
        }
        let reply =
            scripts::parent_reply(self.call("parent_pause", scripts::parent_invocation(&key, mode, &args)).await?)?;
        self.noted_pause(parent, &reply);
        self.remember_parent(key, &reply);
        Ok(ParentStatus::from_reply(&reply))
    }

    /// The mode and arguments of `parent_pause.lua` for a pause.
    fn pause_args(&self, spec: PauseSpec) -> (&'static str, scripts::PauseArgs) {
        let lifted_by = if spec.scope == PauseScope::Token { "new_token" } else { "operator" };
        let reason = pause_reason(spec.code, spec.scope);
        let base = scripts::PauseArgs {
            reason,
            code: spec.code,
            source: spec.source.label(),
            marketing: spec.marketing_only,
            ..Default::default()
        };
        match spec.end {
            PauseEnd::For(ms) => ("pause", scripts::PauseArgs { ms: ms.max(1), lift: "time", ..base }),
            PauseEnd::Probe(ms) => (
                "pause",
                scripts::PauseArgs {
                    ms: ms.max(1),
                    lift: "probe",
                    extra_ms: bw_common::classify::PROBE_PAUSE_MAX_MS.max(ms),
                    ..base
                },
            ),
            PauseEnd::Lifted => (
                "halt",
                scripts::PauseArgs {
                    ms: self.inner.cfg.token_halt_ttl_ms,
                    lift: lifted_by,
                    extra_ms: self.inner.cfg.token_halt_retry_ms,
                    ..base
                },
            ),
        }
    }

    /// Logs and counts a pause just written.
    fn noted_pause(&self, parent: &Parent, reply: &scripts::ParentReply) {
        tracing::warn!(
            level = parent.level().label(),
            id = %parent.id(),
            code = reply.code,
            paused_until_unix_ms = reply.paused_until_ms,
            halted = reply.halted,
            lift = %reply.lift,
            source = %reply.source,
            reason = %reply.reason,
            "scope paused"
        );
        self.inner
            .metrics
            .pauses
            .get_or_create(&vec![
                ("level".to_string(), parent.level().label().to_string()),
                ("code".to_string(), reply.code.to_string()),
            ])
            .inc();
    }

    /// Records the pauses a batch of outcomes calls for, each on its scope's key: the number's own, its WABA's,
    /// the app's, the token's (a token pause without a token set falls to the number: never wider than known).
    /// One script call per key, the longest pause of the batch. Errors leave the scope's own fallback to act.
    async fn record_pauses(&self, scope: &Scope, outcomes: &[OutcomeItem]) {
        let account = lock(&self.inner.account).clone();
        let mut specs: HashMap<String, (Parent, PauseSpec)> = HashMap::new();
        for item in outcomes {
            let spec = match item.kind {
                OutcomeKind::Pause(spec) => spec,
                OutcomeKind::RateLimited { scope: s @ (RateScope::App | RateScope::Waba), pause_ms } => PauseSpec {
                    scope: s.scope(),
                    code: 0,
                    end: PauseEnd::For(pause_ms),
                    marketing_only: false,
                    source: PauseSource::Answer,
                },
                _ => continue,
            };
            let parent = match spec.scope {
                PauseScope::PhoneNumber => Parent::Number(scope.clone()),
                PauseScope::Waba => Parent::Waba(scope.waba_id.clone()),
                PauseScope::App => Parent::App(app_key(&account)),
                PauseScope::Token => match &account.token_fp {
                    Some(fp) => Parent::Token(fp.clone()),
                    None => Parent::Number(scope.clone()),
                },
                _ => continue,
            };
            match specs.get_mut(&parent.key()) {
                Some((_, kept)) => *kept = longer(*kept, spec),
                None => {
                    specs.insert(parent.key(), (parent, spec));
                }
            }
        }
        if specs.is_empty() || self.redis_skipped() {
            return;
        }
        let calls = futures::future::join_all(specs.into_values().map(|(parent, spec)| async move {
            let (mode, args) = self.pause_args(spec);
            let reply = self.call("parent_pause", scripts::parent_invocation(&parent.key(), mode, &args)).await;
            (parent, reply.and_then(scripts::parent_reply))
        }))
        .await;
        for (parent, reply) in calls {
            match reply {
                Ok(reply) => {
                    self.noted_pause(&parent, &reply);
                    self.remember_parent(parent.key(), &reply);
                }
                Err(e) => self.mark_down("parent_pause", &e),
            }
        }
    }

    /// The account (app key, token fingerprint) each scope's dispatchers send with, as they recorded it: scopes
    /// by `waba:phone` ([`Scope::index_member`]). Fails without Redis.
    pub async fn scope_accounts(&self) -> Result<HashMap<String, ScopeAccount>, BreakerError> {
        let redis = self.inner.redis.as_ref().ok_or(BreakerError::NoRedis)?;
        let mut conn = redis.clone();
        let timeout = Duration::from_millis(self.inner.cfg.command_timeout_ms.max(1_000));
        let all: HashMap<String, String> = match tokio::time::timeout(
            timeout,
            redis::cmd("HGETALL").arg(scripts::SCOPE_ACCOUNTS_KEY).query_async(&mut conn),
        )
        .await
        {
            Ok(result) => result?,
            Err(_) => {
                return Err(BreakerError::Timeout { script: "scope_accounts", timeout_ms: timeout.as_millis() as u64 });
            }
        };
        Ok(all.into_iter().filter_map(|(k, v)| ScopeAccount::decode(&v).map(|a| (k, a))).collect())
    }

    /// Refuses `n` sends of a scope known to be OPEN, at once and without I/O; None when the scope is not known
    /// to be OPEN (then ask [`Breaker::admit`]). Always None unless [`Breaker::follow_transitions`] was called.
    pub fn admit_known_open(&self, scope: &Scope, n: usize) -> Option<Admission> {
        let admission = self.known_open(scope, n)?;
        metrics::Metrics::inc(&self.inner.metrics.known_open, "op", "admit");
        self.count_decisions(&admission);
        Some(admission)
    }

    fn count_decisions(&self, admission: &Admission) {
        for d in &admission.decisions {
            let label = match d {
                Decision::Allow { canary: false, .. } => "allow",
                Decision::Allow { canary: true, .. } => "canary",
                Decision::Deny { reason, .. } => reason.label(),
            };
            metrics::Metrics::inc(&self.inner.metrics.decisions, "reason", label);
        }
    }

    async fn admit_uncached(
        &self,
        scope: &Scope,
        items: &[AdmitItem],
        operation_ids: &[String],
        parent_ended_ms: i64,
    ) -> Admission {
        match self.admit_redis(scope, items, operation_ids, parent_ended_ms).await {
            Some(admission) => admission,
            None => {
                metrics::Metrics::inc(&self.inner.metrics.degraded, "op", "admit");
                let last = self.last_known(scope);
                // Without Redis the order sets cannot be read: the fallback's bounded rate applies to every message
                // (sending goes on, slowly), and order is not kept until Redis answers again.
                lock(&self.inner.local).admit(&self.inner.cfg, &scope.index_member(), last, items)
            }
        }
    }

    async fn admit_redis(
        &self,
        scope: &Scope,
        items: &[AdmitItem],
        operation_ids: &[String],
        parent_ended_ms: i64,
    ) -> Option<Admission> {
        if self.redis_skipped() {
            return None;
        }
        let rand: f64 = rand::rng().random();
        let inv = scripts::admit_invocation(scope, &self.inner.defaults, rand, parent_ended_ms, items, operation_ids);
        let parsed = match self.call("admit_send", inv).await {
            Ok(value) => parse_admit(value, items.len()),
            Err(e) => Err(e),
        };
        match parsed {
            Ok((admission, head, transitions)) => {
                self.remember(scope, &head);
                self.register_scope(scope).await;
                self.publish(scope, &head, transitions).await;
                Some(admission)
            }
            Err(e) => {
                self.mark_down("admit", &e);
                None
            }
        }
    }

    /// Records a batch of outcomes of one scope in one round trip; returns the state and the transitions.
    /// Never fails: without Redis the outcomes feed the local fallback breaker.
    pub async fn record(&self, scope: &Scope, outcomes: &[OutcomeItem]) -> RecordResult {
        self.record_releasing(scope, outcomes, &[]).await
    }

    /// [`Breaker::record`], and in the same round trip removes `releases` from their recipients' order sets
    /// (operations Meta accepted or that ended for good, see `lua/order_register.lua`). Without Redis the
    /// releases are lost; the dispatcher a lost release blocks heals it from the ledger.
    pub async fn record_releasing(
        &self,
        scope: &Scope,
        outcomes: &[OutcomeItem],
        releases: &[OrderRelease],
    ) -> RecordResult {
        self.record_pauses(scope, outcomes).await;
        if !self.redis_skipped() {
            let rand: f64 = rand::rng().random();
            let inv = scripts::record_invocation(scope, &self.inner.defaults, rand, outcomes, releases);
            let parsed = match self.call("record_outcomes", inv).await {
                Ok(value) => parse_record(value),
                Err(e) => Err(e),
            };
            match parsed {
                Ok((head, raw)) => {
                    self.remember(scope, &head);
                    self.register_scope(scope).await;
                    let transitions = self.publish(scope, &head, raw).await;
                    return RecordResult {
                        state: head.state,
                        incident_id: head.incident_id,
                        transitions,
                        degraded: false,
                    };
                }
                Err(e) => self.mark_down("record", &e),
            }
        }
        metrics::Metrics::inc(&self.inner.metrics.degraded, "op", "record");
        let last = self.last_known(scope);
        let (state, incident_id) =
            lock(&self.inner.local).record(&self.inner.cfg, &scope.index_member(), last, outcomes);
        RecordResult { state, incident_id, transitions: Vec::new(), degraded: true }
    }

    /// Feeds the Meta usage percent (X-Business-Use-Case-Usage). Sent to Redis only when the throttle band
    /// changes or the last report is getting old, so it costs almost no round trips. The scripts fade a
    /// reading over `usage_ttl_ms` (Meta's hourly window), so a reading in a throttling band is refreshed every
    /// twentieth of it (it fades by at most 5 % before the next one), a calm reading every third.
    pub async fn observe_usage(&self, scope: &Scope, usage_percent: u32) {
        let limits = &self.inner.cfg.defaults;
        let band: i8 = if usage_percent >= limits.throttle_pause_percent {
            2
        } else if usage_percent >= limits.throttle_slow_percent {
            1
        } else {
            0
        };
        let refresh = Duration::from_millis(if band > 0 { limits.usage_ttl_ms / 20 } else { limits.usage_ttl_ms / 3 });
        self.inner.metrics.visibility(&scope.index_member(), true);
        if self.send_usage(scope, band, refresh, usage_percent.to_string()).await {
            self.publish_quota(scope, usage_percent).await;
        }
    }

    /// Publishes the `quota` signal alerting's QuotaUsage rule consumes (fires at 80 %, critical at 90 %,
    /// resolves below): as often as the reading goes to Redis, i.e. when its band changes or it is refreshed,
    /// never per send.
    async fn publish_quota(&self, scope: &Scope, usage_percent: u32) {
        let Some(nats) = &self.inner.nats else { return };
        let signal = proto::Signal {
            kind: "quota".into(),
            waba_id: scope.waba_id.clone(),
            phone_number_id: scope.phone_number_id.clone(),
            meta_code: 0,
            detail: format!("usage {usage_percent}% of Meta's business use case quota (X-Business-Use-Case-Usage)"),
            at_unix_ms: bw_common::time::now_ms(),
            operation_id: String::new(),
        };
        if let Err(e) = nats.publish(bw_wire::names::signal_subject("quota"), signal.encode_to_vec().into()).await {
            tracing::debug!(error = %e, "quota signal not published");
        }
    }

    /// Meta answered a send of the scope without usage headers: the scope is quota blind (metric
    /// `bw_breaker_quota_visibility` = 0) and admission applies `blind_rate_factor` to its rate until an answer
    /// carries them again. Costs a round trip only when the visibility changes (or every 30 s).
    pub async fn observe_no_usage(&self, scope: &Scope) {
        self.inner.metrics.visibility(&scope.index_member(), false);
        self.send_usage(scope, -1, Duration::from_secs(30), "none".to_string()).await;
    }

    /// Claims one late send from the sender's fleet-wide late allowance (`claim_late.lua`): a token bucket in
    /// the scope's state hash, shared by every dispatcher process, holding at most `burst` late sends (or what
    /// one ms refills, if more: Redis time is whole ms) and refilled by one per `refill_ms`. `Some(true)` when
    /// this late send may go now, `Some(false)` when it may not; `None` when Redis did not answer (the caller then
    /// falls back to an allowance of its own process).
    /// Costs a round trip per late send, none on time.
    pub async fn claim_late(&self, scope: &Scope, refill_ms: f64, burst: f64) -> Option<bool> {
        self.claim_late_many(scope, refill_ms, burst, 1).await.map(|granted| granted == 1)
    }

    /// Claims `wanted` late sends at once from the same allowance as [`Breaker::claim_late`], in one round trip:
    /// how many of them may go now (0 to `wanted`), or `None` when Redis did not answer.
    pub async fn claim_late_many(&self, scope: &Scope, refill_ms: f64, burst: f64, wanted: u32) -> Option<u32> {
        if self.redis_skipped() {
            return None;
        }
        let wanted = wanted.max(1);
        let mut inv = scripts::CLAIM_LATE.prepare_invoke();
        inv.key(scripts::cfg_key(scope))
            .key(scripts::state_key(scope))
            .arg(format!("{refill_ms:.6}"))
            .arg(burst)
            .arg(wanted);
        match self.call("claim_late", inv).await {
            Ok(redis::Value::Int(granted)) if (0..=i64::from(wanted)).contains(&granted) => Some(granted as u32),
            Ok(other) => {
                tracing::warn!(reply = ?other, "claim_late answered an unexpected reply");
                None
            }
            // Not a sign that Redis is down: at a high rate on a loaded machine many late claims queue on the
            // connection at once and one passes the command timeout. Marking Redis down for that sent every
            // admission to the local fallback (5 msg/s per scope) for a second and the pipeline bench from about
            // 1,000 msg/s to 20-65 msg/s. The caller uses its own process's allowance for this claim; admission
            // decides whether Redis is down.
            Err(e) => {
                tracing::debug!(error = %e, "late claim unanswered; this process's own allowance decides");
                None
            }
        }
    }

    /// Sends a usage reading to Redis unless the same band went there within `refresh`; true when sent.
    ///
    /// The reading is claimed before its call goes out, so the answers that arrive while it is on its way do not
    /// send it again: at a dispatcher's start (or when the band changes) thousands of answers come back within
    /// the first round trip, and each used to send the same reading. They queued past the command timeout, which
    /// took Redis for down and sent every admission to the local fallback (5 msg/s per scope) for a second at a
    /// time: the pipeline bench lost about half its throughput to it. A failed call gives the claim back.
    async fn send_usage(&self, scope: &Scope, band: i8, refresh: Duration, arg: String) -> bool {
        let key = scope.index_member();
        let previous = {
            let mut sent = lock(&self.inner.usage_sent);
            if let Some((last_band, at)) = sent.get(&key)
                && *last_band == band
                && at.elapsed() < refresh
            {
                return false;
            }
            if self.redis_skipped() {
                return false;
            }
            sent.insert(key.clone(), (band, tokio::time::Instant::now()))
        };
        let mut inv = scripts::OBSERVE_USAGE.prepare_invoke();
        inv.key(scripts::cfg_key(scope)).key(scripts::state_key(scope)).arg(arg);
        match self.call("observe_usage", inv).await {
            Ok(_) => true,
            Err(e) => {
                let mut sent = lock(&self.inner.usage_sent);
                match previous {
                    Some(p) => sent.insert(key, p),
                    None => sent.remove(&key),
                };
                drop(sent);
                self.mark_down("observe_usage", &e);
                false
            }
        }
    }

    /// Reads the current state of a scope (no change). Unlike the send path this fails without Redis.
    pub async fn snapshot(&self, scope: &Scope) -> Result<proto::ScopeSnapshot, BreakerError> {
        Ok(self.status(scope).await?.snapshot)
    }

    /// Like [`Breaker::snapshot`], with live counters.
    pub async fn status(&self, scope: &Scope) -> Result<ScopeStatus, BreakerError> {
        let inv = scripts::scope_invocation(&scripts::READ_SCOPE, scope, &self.inner.defaults);
        let value = self.call("read_scope", inv).await?;
        let (status, _) = parse_status(scope, value)?;
        Ok(status)
    }

    /// Moves an OPEN scope whose cooldown ended to HALF_OPEN (the coordinator ticks known scopes with this)
    /// and returns its state; publishes the transition if one happened.
    pub async fn tick(&self, scope: &Scope) -> Result<(ScopeStatus, Vec<BreakerTransition>), BreakerError> {
        let inv = scripts::scope_invocation(&scripts::TICK_SCOPE, scope, &self.inner.defaults);
        self.status_call("tick_scope", scope, inv).await
    }

    /// Operator override; publishes the transition.
    pub async fn force(
        &self,
        scope: &Scope,
        forced: Forced,
    ) -> Result<(ScopeStatus, Vec<BreakerTransition>), BreakerError> {
        let mode = match forced {
            Forced::Open => "open",
            Forced::Closed => "closed",
            Forced::Clear => "clear",
        };
        let mut inv = scripts::scope_invocation(&scripts::FORCE_BREAKER, scope, &self.inner.defaults);
        inv.arg(mode);
        self.status_call("force_breaker", scope, inv).await
    }

    /// Wipes window, counters, pause, incident and override; the scope is CLOSED at full rate.
    pub async fn reset(&self, scope: &Scope) -> Result<(ScopeStatus, Vec<BreakerTransition>), BreakerError> {
        let mut inv = scripts::scope_invocation(&scripts::FORCE_BREAKER, scope, &self.inner.defaults);
        inv.arg("reset");
        self.status_call("force_breaker", scope, inv).await
    }

    async fn status_call(
        &self,
        script: &'static str,
        scope: &Scope,
        inv: redis::ScriptInvocation<'_>,
    ) -> Result<(ScopeStatus, Vec<BreakerTransition>), BreakerError> {
        let value = self.call(script, inv).await?;
        let (status, raw) = parse_status(scope, value)?;
        let head = scripts::Head {
            state: status.snapshot.state(),
            incident_id: status.snapshot.incident_id.clone(),
            open_until_ms: status.snapshot.open_until_unix_ms,
            calls: status.snapshot.calls_in_window,
            failures: status.failures_in_window,
            now_ms: status.snapshot.updated_at_unix_ms,
        };
        self.remember(scope, &head);
        let transitions = self.publish(scope, &head, raw).await;
        Ok((status, transitions))
    }

    /// Turns raw transitions into events and publishes them (core NATS, captured by BW_EVENTS).
    async fn publish(
        &self,
        scope: &Scope,
        head: &scripts::Head,
        raw: Vec<scripts::RawTransition>,
    ) -> Vec<BreakerTransition> {
        let mut out = Vec::with_capacity(raw.len());
        for t in raw {
            let event = BreakerTransition {
                scope: Some(scope.to_proto()),
                from: t.from as i32,
                to: t.to as i32,
                at_unix_ms: t.at_ms,
                incident_id: t.incident_id,
                reason: t.reason,
                failure_rate: failure_rate(head.calls, head.failures),
                calls_in_window: head.calls,
                open_until_unix_ms: if t.to == BreakerState::Open { head.open_until_ms } else { 0 },
            };
            tracing::info!(
                phone_number_id = %scope.phone_number_id,
                from = t.from.as_str_name(),
                to = t.to.as_str_name(),
                incident_id = %event.incident_id,
                reason = %event.reason,
                "breaker transition"
            );
            metrics::Metrics::inc(&self.inner.metrics.transitions, "to", t.to.as_str_name());
            if let Some(nats) = &self.inner.nats {
                let subject = bw_wire::names::breaker_subject(&scope.phone_number_id);
                if let Err(e) = nats.publish(subject, event.encode_to_vec().into()).await {
                    tracing::warn!(error = %e, "cannot publish breaker transition");
                }
            }
            out.push(event);
        }
        out
    }
}

/// Result of reading the parent pauses of a scope.
#[derive(Debug, Default)]
struct ParentCheck {
    /// The refusal every send of the scope gets now, with its retry-after.
    block: Option<(DenyReason, u64)>,
    /// The refusal marketing sends (and marketing replays) get now (a marketing-only pause), with its retry-after.
    marketing_block: Option<(DenyReason, u64)>,
    /// End (Redis ms) of a parent pause that ended less than `pause_ramp_ms` ago, or 0.
    ended_ms: i64,
}

/// The app key of an account: the app id, else the token's fingerprint, else `default`.
fn app_key(account: &Account) -> String {
    if !account.app_id.is_empty() {
        account.app_id.clone()
    } else if let Some(fp) = &account.token_fp {
        format!("tok-{fp}")
    } else {
        "default".to_string()
    }
}

/// The reason text of a pause.
fn pause_reason(code: i64, scope: PauseScope) -> String {
    if code == 0 { format!("{} paused", scope.label()) } else { format!("{} paused: Meta code {code}", scope.label()) }
}

/// Of two pauses of one key in one batch, the one that lasts longer (until lifted beats any time).
fn longer(a: PauseSpec, b: PauseSpec) -> PauseSpec {
    let rank = |s: &PauseSpec| match s.end {
        PauseEnd::Lifted => u64::MAX,
        PauseEnd::For(ms) | PauseEnd::Probe(ms) => ms,
    };
    if rank(&b) > rank(&a) { b } else { a }
}

fn failure_rate(calls: u64, failures: u64) -> f64 {
    if calls == 0 { 0.0 } else { failures as f64 / calls as f64 }
}

type Parsed<T> = Result<T, BreakerError>;

fn parse_admit(value: redis::Value, n: usize) -> Parsed<(Admission, scripts::Head, Vec<scripts::RawTransition>)> {
    let mut reply = scripts::Reply::new(value)?;
    let head = scripts::head(&mut reply)?;
    let slot_gap_ms = reply.int()?.max(0) as f64 / 1000.0;
    let mut decisions = Vec::with_capacity(n);
    let mut blockers = Vec::with_capacity(n);
    for _ in 0..n {
        let code = reply.int()?;
        let retry_after_ms = reply.int()?.max(0) as u64;
        let blocker = reply.string()?;
        let blocker_age_ms = reply.int()?.max(0) as u64;
        let code = scripts::Code::from_i64(code)
            .ok_or_else(|| BreakerError::BadReply(format!("unknown decision code {code}")))?;
        decisions.push(match code.deny_reason() {
            None => Decision::Allow { canary: code == scripts::Code::Canary, wait_ms: retry_after_ms },
            Some(reason) => Decision::Deny { reason, retry_after_ms },
        });
        blockers.push(
            (code == scripts::Code::OrderWait && !blocker.is_empty())
                .then_some(Blocker { operation_id: blocker, age_ms: blocker_age_ms }),
        );
    }
    let transitions = scripts::transitions(&mut reply)?;
    let admission = Admission {
        decisions,
        state: head.state,
        incident_id: head.incident_id.clone(),
        degraded: false,
        server_now_ms: head.now_ms,
        blockers,
        slot_gap_ms,
    };
    Ok((admission, head, transitions))
}

fn parse_record(value: redis::Value) -> Parsed<(scripts::Head, Vec<scripts::RawTransition>)> {
    let mut reply = scripts::Reply::new(value)?;
    let head = scripts::head(&mut reply)?;
    let _paused_until = reply.int()?;
    let transitions = scripts::transitions(&mut reply)?;
    Ok((head, transitions))
}

fn parse_status(scope: &Scope, value: redis::Value) -> Parsed<(ScopeStatus, Vec<scripts::RawTransition>)> {
    let mut reply = scripts::Reply::new(value)?;
    let head = scripts::head(&mut reply)?;
    let tail = scripts::snapshot_tail(&mut reply)?;
    let number = scripts::number_pause_tail(&mut reply)?;
    let transitions = scripts::transitions(&mut reply)?;
    let number_pause = ParentStatus {
        paused_until_unix_ms: if number.paused_until_ms > head.now_ms { number.paused_until_ms } else { 0 },
        reason: number.reason,
        halted: number.halted,
        code: number.code,
        since_unix_ms: number.since_ms,
        source: number.source,
        lift: number.lift,
        marketing_only: number.marketing,
    };
    // A number pause that ended is still reported while a probe is due (its key lives): replay then waits too,
    // and sends go only once the probe let them.
    let pending_probe = number_pause.lift == "probe" && number.paused_until_ms > 0;
    let pauses = if number_pause.active(head.now_ms) || pending_probe {
        vec![number_pause.to_proto(&Parent::Number(scope.clone()))]
    } else {
        Vec::new()
    };
    let snapshot = proto::ScopeSnapshot {
        scope: Some(scope.to_proto()),
        state: head.state as i32,
        since_unix_ms: tail.since_ms,
        incident_id: head.incident_id,
        open_until_unix_ms: head.open_until_ms,
        paused_until_unix_ms: if tail.paused_until_ms > head.now_ms { tail.paused_until_ms } else { 0 },
        pause_reason: if tail.paused_until_ms > head.now_ms { tail.pause_reason } else { String::new() },
        failure_rate: failure_rate(head.calls, head.failures),
        calls_in_window: head.calls,
        ramp_fraction: tail.ramp_fraction,
        trips: tail.trips,
        updated_at_unix_ms: head.now_ms,
        pauses,
    };
    let status = ScopeStatus {
        snapshot,
        failures_in_window: head.failures,
        tokens: tail.tokens,
        usage_percent: tail.usage_percent,
        trip_streak: tail.trip_streak,
        adaptive_share: tail.adaptive_share,
        quota_visibility: match tail.visibility {
            1 => QuotaVisibility::Seen,
            0 => QuotaVisibility::Blind,
            _ => QuotaVisibility::Unknown,
        },
        next_slot_wait_ms: tail.next_slot_wait_ms,
    };
    Ok((status, transitions))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeout while other calls are being answered is congestion: Redis is not marked down. A timeout after
    /// nothing answered for the whole command timeout, or a connection error, marks it down.
    #[tokio::test]
    async fn only_a_timeout_with_no_answer_for_the_whole_timeout_marks_redis_down() {
        let redis = bw_testkit::RedisServer::start();
        let conn = bw_common::redis_conn::connect(&redis.url(), Duration::from_millis(500), Duration::from_secs(5))
            .await
            .expect("redis connects");
        let breaker = Breaker::new(Some(conn), None, BreakerConfig::default());
        let scope = Scope::new("111", "222");
        let answered = breaker.admit(&scope, &[]).await;
        assert!(!answered.degraded, "{answered:?}");
        let timeout = BreakerError::Timeout { script: "claim_late", timeout_ms: breaker.config().command_timeout_ms };
        breaker.mark_down("admit", &timeout);
        assert!(!breaker.redis_skipped(), "a call answered just now: congestion, Redis stays in use");
        let stale = bw_common::time::now_ms() - breaker.config().command_timeout_ms as i64 - 1;
        breaker.inner.redis_answered_at.store(stale, Ordering::Relaxed);
        breaker.mark_down("admit", &timeout);
        assert!(breaker.redis_skipped(), "nothing answered for the whole timeout: Redis counts as down");
    }
}
