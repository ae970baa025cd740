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

mod admission;
mod breaker;
pub mod budget;
mod config;
mod error;
pub mod evidence;
mod local;
mod metrics;
mod operator;
pub mod order;
mod outcomes;
mod parent;
mod pauses;
mod pool;
pub mod recipient;
pub mod scripts;
pub mod template_rules;
pub mod templates;
pub mod throughput;
mod types;

pub use breaker::Breaker;
pub use config::{BreakerConfig, ScopeLimits};
pub use error::{BreakerError, RedisConn};
pub use order::{Blocker, OrderBook, OrderRelease, Registration};
pub use parent::{Parent, ParentStatus, ScopeAccount, token_fingerprint};
pub use pool::PoolResult;
pub use types::{
    Admission, AdmitItem, Decision, DenyReason, Forced, OutcomeItem, OutcomeKind, PauseEnd, PauseSource, PauseSpec,
    QuotaVisibility, RecordResult, Scope, ScopeStatus, TrafficClass,
};
