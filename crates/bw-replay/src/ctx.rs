//! The state replay's tasks share ([`Ctx`]) and what it knows of a scope ([`ScopeView`]), in a leaf module: the
//! workers, the incident reports and the depth poller each read it.

use crate::config::Config;
use crate::{lease, metrics};
use bw_ops::moves::Mover;
use bw_proto::v1::{BreakerState, ScopePause, ScopeSnapshot};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// DLQ depth per scope (phone_number_id), as last polled.
pub(crate) type Depths = Arc<BTreeMap<String, u64>>;

/// What replay needs to know about a scope, from its `ScopeSnapshot`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScopeView {
    pub waba_id: String,
    pub state: BreakerState,
    pub since_unix_ms: i64,
    pub paused_until_unix_ms: i64,
    /// Share of the sender rate allowed while the breaker ramps up after a close (0 or 1: full).
    pub ramp_fraction: f64,
    /// Every pause that holds the scope's sends (number, WABA, app, token), as the coordinator last saw them.
    pub pauses: Vec<ScopePause>,
}

impl ScopeView {
    pub(crate) fn from_snapshot(s: &ScopeSnapshot) -> ScopeView {
        ScopeView {
            waba_id: s.scope.as_ref().map(|x| x.waba_id.clone()).unwrap_or_default(),
            state: s.state(),
            since_unix_ms: s.since_unix_ms,
            paused_until_unix_ms: s.paused_until_unix_ms,
            ramp_fraction: s.ramp_fraction,
            pauses: s.pauses.clone(),
        }
    }

    /// How long the pauses that hold `marketing` (true) or every (false) entry of the scope still last at
    /// `now_ms`: None when none holds, `Some(None)` while one lasts until lifted, else the longest time left. A
    /// pause whose time passed but whose number still waits for a probe holds for a second more: the probe's
    /// answer decides (the snapshot drops the pause once it has).
    pub fn paused_for(&self, now_ms: i64, marketing: bool) -> Option<Option<Duration>> {
        let mut longest: Option<Option<Duration>> = None;
        for p in self.pauses.iter().filter(|p| marketing || !p.marketing_only) {
            let left = if p.until_unix_ms == 0 {
                None
            } else if p.until_unix_ms > now_ms {
                Some(Duration::from_millis((p.until_unix_ms - now_ms) as u64))
            } else if p.lift == "probe" {
                Some(Duration::from_secs(1))
            } else {
                continue;
            };
            longest = Some(match (longest, left) {
                (Some(None), _) | (_, None) => None,
                (Some(Some(a)), Some(b)) => Some(a.max(b)),
                (None, b) => b,
            });
        }
        longest
    }

    /// Ok when the scope may be replayed at `now_ms`; else how long until it may (None: not foreseeable).
    pub fn replayable(&self, now_ms: i64, soak_ms: u64) -> Result<(), Option<Duration>> {
        let closed = matches!(self.state, BreakerState::Closed | BreakerState::ForcedClosed);
        if !closed {
            return Err(None);
        }
        if self.paused_until_unix_ms > now_ms {
            return Err(Some(Duration::from_millis((self.paused_until_unix_ms - now_ms) as u64)));
        }
        if let Some(left) = self.paused_for(now_ms, false) {
            return Err(left);
        }
        let soaked_at = self.since_unix_ms.max(0) + soak_ms as i64;
        if soaked_at > now_ms {
            return Err(Some(Duration::from_millis((soaked_at - now_ms) as u64)));
        }
        Ok(())
    }

    /// True when the breaker is HALF_OPEN and not paused: canaries may be replayed.
    pub fn probing(&self, now_ms: i64) -> bool {
        self.state == BreakerState::HalfOpen
            && self.paused_until_unix_ms <= now_ms
            && self.paused_for(now_ms, false).is_none()
    }

    /// The rate multiplier while the breaker ramps up after a close.
    pub fn rate_factor(&self) -> f64 {
        if self.ramp_fraction > 0.0 && self.ramp_fraction < 1.0 { self.ramp_fraction } else { 1.0 }
    }
}

/// Shared state of the service's tasks.
pub(crate) struct Ctx {
    pub cfg: Config,
    pub js: async_nats::jetstream::Context,
    pub mover: Mover,
    pub leases: lease::Leases,
    /// Replay progress per breaker incident (BW_INCIDENTS).
    pub incidents: bw_ops::incident::Incidents,
    pub metrics: metrics::Metrics,
    pub views: RwLock<HashMap<String, ScopeView>>,
    /// DLQ depth per scope, polled by the stats task.
    pub depths: watch::Sender<Depths>,
    pub shutdown: CancellationToken,
}

impl Ctx {
    pub(crate) fn view(&self, scope: &str) -> Option<ScopeView> {
        self.views.read().ok().and_then(|v| v.get(scope).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replayable_only_when_closed_soaked_and_not_paused() {
        let view = |state, since, paused| ScopeView {
            state,
            since_unix_ms: since,
            paused_until_unix_ms: paused,
            ..Default::default()
        };
        let now = 1_000_000;
        assert_eq!(view(BreakerState::Closed, now - 5_000, 0).replayable(now, 3_000), Ok(()));
        assert_eq!(view(BreakerState::ForcedClosed, now - 5_000, 0).replayable(now, 3_000), Ok(()));
        assert_eq!(
            view(BreakerState::Closed, now - 1_000, 0).replayable(now, 3_000),
            Err(Some(Duration::from_millis(2_000)))
        );
        assert_eq!(view(BreakerState::Closed, 0, now + 500).replayable(now, 0), Err(Some(Duration::from_millis(500))));
        for s in [BreakerState::Open, BreakerState::HalfOpen, BreakerState::ForcedOpen, BreakerState::Unspecified] {
            assert_eq!(view(s, 0, 0).replayable(now, 0), Err(None), "{s:?}");
        }
    }

    #[test]
    fn every_pause_that_holds_the_scope_holds_its_replay() {
        let now = 1_000_000;
        let pause = |level: &str, until: i64, lift: &str, marketing_only: bool| ScopePause {
            level: level.into(),
            until_unix_ms: until,
            lift: lift.into(),
            marketing_only,
            ..Default::default()
        };
        let view = |pauses: Vec<ScopePause>| ScopeView {
            state: BreakerState::Closed,
            since_unix_ms: now - 60_000,
            pauses,
            ..Default::default()
        };
        assert_eq!(view(vec![]).replayable(now, 0), Ok(()));
        // A WABA restriction until lifted: nothing is replayed, and no end is foreseeable.
        assert_eq!(view(vec![pause("waba", 0, "operator", false)]).replayable(now, 0), Err(None));
        // Timed pauses of the number and the app: the longest.
        let timed = view(vec![pause("number", now + 5_000, "time", false), pause("app", now + 9_000, "time", false)]);
        assert_eq!(timed.replayable(now, 0), Err(Some(Duration::from_millis(9_000))));
        assert!(!ScopeView { state: BreakerState::HalfOpen, ..timed.clone() }.probing(now));
        // Ended: a timed pause no longer holds; a probing one holds until its probe answered.
        assert_eq!(view(vec![pause("number", now - 1, "time", false)]).replayable(now, 0), Ok(()));
        assert_eq!(
            view(vec![pause("number", now - 1, "probe", false)]).replayable(now, 0),
            Err(Some(Duration::from_secs(1)))
        );
        // A marketing-only pause holds the marketing entries alone.
        let marketing = view(vec![pause("waba", 0, "operator", true)]);
        assert_eq!(marketing.replayable(now, 0), Ok(()));
        assert_eq!(marketing.paused_for(now, true), Some(None));
        assert_eq!(marketing.paused_for(now, false), None);
    }
}
