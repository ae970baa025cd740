//! The dispatcher's state and the message it works on, which every step shares: [`Worker`] (one per process:
//! connections, ledger, breaker, registry, gates, metrics) and [`Work`] (a fetched message that passed its
//! pre-checks). The steps add `impl Worker` blocks in their own modules: `fetch` (prepare), `process` (a batch:
//! admit, hold, record), `send` (slot, mark, call), `settle` (the message's next place), `gates`, `order`,
//! `attempt`; none of this module's types depends on them.

use crate::config::DispatchConfig;
use crate::meta::MetaClient;
use crate::metrics::Metrics;
use async_nats::jetstream;
use bw_breaker::recipient::RecipientMarketing;
use bw_breaker::template_rules::TemplateRules;
use bw_breaker::templates::TemplateHolds;
use bw_breaker::{Breaker, Scope, TrafficClass};
use bw_common::ledger::{Ledger, Versioned};
use bw_common::time::now_ms;
use bw_proto::v1::SendRequest;
use bw_wire::names::Lane;
use std::collections::HashMap;
use std::time::{Duration, Instant};

pub(crate) struct Worker {
    pub js: jetstream::Context,
    /// Which BW_SEND and BW_DLQ partition each sender is in (`nats.send_partitions`).
    pub send: bw_wire::names::SendPartitions,
    pub nats: async_nats::Client,
    pub ledger: Ledger,
    /// Who owns which sender (checked before each send in registry mode).
    pub registry: bw_common::registry::RegistryView,
    pub breaker: Breaker,
    pub meta: MetaClient,
    pub cfg: DispatchConfig,
    pub metrics: Metrics,
    pub shutdown: tokio_util::sync::CancellationToken,
    /// This instance's id in on-the-wire mark tokens.
    pub instance: String,
    /// Every sender's priority backlog, for the priority gate (`priority.rs`).
    pub backlog: crate::priority::Backlog,
    /// Per sender, this process's own allowance for late sends and when it was last refilled, used only while
    /// Redis does not answer (`claim_late_here`; the fleet-wide one lives in Redis).
    pub late_allowance: std::sync::Mutex<HashMap<String, (f64, Instant)>>,
    /// Concurrent late claims of one sender, joined into one round trip (`late.rs`).
    pub(crate) late_claims: crate::late::Coalescer,
    /// When this process last raised the `dlq_limit` signal per sender (`settle.rs`).
    pub dlq_limit_signalled: std::sync::Mutex<HashMap<String, Instant>>,
    /// How long the on-the-wire mark's write takes here (`MarkLead`): the mark starts that long before the send
    /// slot, so the request leaves at its slot instead of a write's latency after it.
    pub(crate) mark_lead: MarkLead,
    /// Quarantine scopes and recipient marketing state (`gates.rs`).
    pub(crate) gates: Gates,
    /// The wire journals of the served partitions (`dispatch.wire_guarantee = "journal"`); None: the mark.
    pub(crate) journals: Option<crate::journal::Journals>,
}

/// A running estimate of the on-the-wire mark's write latency in this process, microseconds: a fast rise
/// (half of the way to a slower write) and a slow fall (an eighth of the way to a faster one), so the lead
/// covers most writes. Capped at [`MARK_LEAD_MAX`]: a broker stall is not something to plan slots around
/// (the late-send rule handles it).
#[derive(Default)]
pub(crate) struct MarkLead(std::sync::atomic::AtomicU64);

/// The longest lead the mark gets before its send slot.
const MARK_LEAD_MAX: Duration = Duration::from_millis(100);

impl MarkLead {
    pub(crate) fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(std::sync::atomic::Ordering::Relaxed)).min(MARK_LEAD_MAX)
    }

    pub(crate) fn observe(&self, took: Duration) {
        let took = took.min(MARK_LEAD_MAX * 2).as_micros() as u64;
        let _ =
            self.0.fetch_update(std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed, |cur| {
                Some(if took > cur { cur + (took - cur) / 2 } else { cur - (cur - took) / 8 })
            });
    }
}

/// A message that passed the pre-checks and waits for admission.
pub(crate) struct Work {
    pub lane: Lane,
    pub msg: jetstream::Message,
    pub request: SendRequest,
    pub ledger: Versioned,
    pub span: tracing::Span,
    /// When this delivery was handed to the worker.
    pub received: Instant,
    /// Admission decision label, for outcome events.
    pub decision: &'static str,
    /// Time from `received` to the admission decision, less the time spent waiting in memory for a slot.
    pub decided_after: Duration,
    /// Time spent waiting in memory for an admission slot.
    pub waited: Duration,
    /// Set when the order gate refused it: what it waits for (`crate::order`).
    pub order_wait: Option<Waiting>,
    /// Times this delivery reached the wire too late for its send slot and went back to admission.
    pub slot_misses: u8,
    /// How often this delivery was refused with order_wait (its in-memory re-admission backs off).
    pub order_polls: u8,
    /// The sender's slot spacing (ms) in the admission that admitted it (0: unknown).
    pub slot_gap_ms: f64,
    /// Journal mode: this try's journal entry, resolved by `settle` once its outcome is durable.
    pub on_wire: Option<crate::journal::OnWire>,
}

impl Work {
    pub(crate) fn scope(&self) -> Scope {
        Scope { waba_id: self.request.waba_id.clone(), phone_number_id: self.request.phone_number_id.clone() }
    }

    /// Admission class. Priority follows the message: a priority replay (`rh`) is priority traffic, and goes
    /// before the sender's live priority traffic fleet-wide (older first), as does a live one close to its
    /// deadline (`priority.rs`, rule 3); only a marketing replay (`rp`) takes the replay class (spare rate only).
    pub(crate) fn class(&self, live_priority_hold_max_ms: u64) -> TrafficClass {
        match self.lane {
            Lane::Replay => TrafficClass::Replay,
            Lane::PriorityReplay => TrafficClass::OlderPriority,
            _ if self.request.category().is_priority() => {
                let near =
                    crate::priority::near_deadline(self.request.deadline_unix_ms, now_ms(), live_priority_hold_max_ms);
                if near { TrafficClass::OlderPriority } else { TrafficClass::Priority }
            }
            _ => TrafficClass::Marketing,
        }
    }

    pub(crate) fn attempt(&self) -> u32 {
        self.ledger.entry.attempts + 1
    }
}

/// The Redis side of the gates (`gates.rs`; absent without Redis: every gate passes).
#[derive(Clone, Default)]
pub(crate) struct Gates {
    pub holds: Option<TemplateHolds>,
    pub marketing: Option<RecipientMarketing>,
    /// The portfolio messaging-limit budget (`budget.rs`); absent when off or without Redis.
    pub budget: Option<std::sync::Arc<crate::budget::Budget>>,
    /// Template category moves and RED paces (`bw_breaker::template_rules`); absent without Redis.
    pub rules: Option<TemplateRules>,
}

impl Gates {
    pub(crate) fn new(redis: Option<bw_breaker::RedisConn>) -> Gates {
        Gates {
            holds: redis.clone().map(TemplateHolds::new),
            rules: redis.clone().map(TemplateRules::new),
            marketing: redis.map(RecipientMarketing::new),
            budget: None,
        }
    }

    pub(crate) fn with_budget(mut self, budget: Option<crate::budget::Budget>) -> Gates {
        self.budget = budget.map(std::sync::Arc::new);
        self
    }
}

/// What the dispatcher found out about the message a refused one waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub blocker: String,
    /// The blocker sits in the DLQ (a long wait).
    pub in_dlq: bool,
    /// The blocker had ended (or never arrived) and was removed from the set just now: admit again at once.
    pub released: bool,
}
