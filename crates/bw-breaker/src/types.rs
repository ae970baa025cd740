//! The value types the breaker's modules share: scopes, admission and outcome items and answers.

use crate::evidence;
use bw_common::classify::{PauseScope, RateScope};
use bw_proto::v1::{self as proto, BreakerState, BreakerTransition};

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

    pub(crate) fn to_proto(&self) -> proto::Scope {
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
}

/// Answer to [`crate::Breaker::admit`]: one decision per item, in order.
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
    /// admission carried no operation ids ([`crate::Breaker::admit`]) or was answered without the scope script.
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
    /// A pause of the number, its WABA, its app or its access token (set with [`crate::Breaker::set_account`]), and of
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
    /// When a person lifts it ([`crate::Breaker::clear_parent`]), or, for a token, when the token changes. The key
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

/// Answer to [`crate::Breaker::record`].
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

/// The operation an [`crate::DenyReason::OrderWait`] refusal waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    /// The earliest operation still in the recipient's order set.
    pub operation_id: String,
    /// Milliseconds since it was registered (Redis time).
    pub age_ms: u64,
}

/// An operation leaving its recipient's order set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRelease {
    /// `bw_common::mask::recipient_key` of the recipient.
    pub recipient_key: String,
    pub operation_id: String,
}
