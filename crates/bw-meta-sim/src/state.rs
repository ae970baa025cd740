//! The simulator's shared state ([`Inner`]), in a leaf module: the Graph API, the admin API and the webhook
//! events read it; fire.rs adds the methods that schedule events and inbound messages.

use crate::account::Account;
use crate::config::SimConfig;
use crate::limits::{Limiter, Limits};
use crate::oracle::Oracle;
use crate::scenario::Active;
use crate::webhook::Webhooks;
use anyhow::Context as _;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use tokio_util::sync::CancellationToken;

/// Shared simulator state.
pub(crate) struct Inner {
    pub(crate) cfg: SimConfig,
    pub(crate) limits: RwLock<Limits>,
    pub(crate) limiter: Limiter,
    pub(crate) scenario: RwLock<Arc<Active>>,
    pub(crate) oracle: Arc<Oracle>,
    pub(crate) webhooks: Webhooks,
    pub(crate) shutdown: CancellationToken,
    /// Tokens expired or revoked by the admin API → the code every call with them gets (190 or 0).
    pub(crate) dead_tokens: RwLock<BTreeMap<String, i64>>,
    /// What Meta announced about the account, and the traffic state behind the messaging limit.
    pub(crate) account: Account,
    /// Stops the active scenario's event task when the scenario is replaced.
    pub(crate) events_cancel: Mutex<CancellationToken>,
    /// Answers held back after Meta accepted (`SimHandle::hold_answers`), so a status can overtake its answer.
    pub(crate) answer_gate: Mutex<Option<AnswerGate>>,
}

/// Accepted messages of `phone_number_id` whose answers wait for a release: the next `pass` go through, the
/// ones after wait. The webhooks of a held message go out as usual, as Meta's may before its answer arrives.
pub(crate) struct AnswerGate {
    pub(crate) phone_number_id: String,
    pub(crate) pass: u32,
    pub(crate) released: tokio::sync::watch::Sender<bool>,
    pub(crate) held: Arc<std::sync::atomic::AtomicU32>,
}

impl Inner {
    /// Waits while this accepted message's answer is held; true to answer (false: shutting down).
    pub(crate) async fn answer_when_released(&self, phone_number_id: &str) -> bool {
        let (mut released, held) = {
            let mut gate = self.answer_gate.lock().unwrap_or_else(|e| e.into_inner());
            let Some(g) = gate.as_mut().filter(|g| g.phone_number_id == phone_number_id) else { return true };
            if g.pass > 0 {
                g.pass -= 1;
                return true;
            }
            (g.released.subscribe(), g.held.clone())
        };
        held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let answered = tokio::select! {
            _ = self.shutdown.cancelled() => false,
            r = released.wait_for(|r| *r) => r.is_ok(),
        };
        held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        answered
    }
}

pub(crate) fn lock_read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn lock_write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    /// The limits in force now: the active scenario's, else the configured ones.
    pub(crate) fn current_limits(&self) -> Limits {
        let active = lock_read(&self.scenario).clone();
        active.scenario.limits.clone().unwrap_or_else(|| lock_read(&self.limits).clone())
    }

    /// A number's throughput: a throughput upgrade Meta announced, else the limits' override, else the number's
    /// configuration, else the default.
    pub(crate) fn mps_for(&self, limits: &Limits, phone_number_id: &str) -> f64 {
        self.account.number_mps(phone_number_id).unwrap_or_else(|| {
            let configured = self.cfg.phone_numbers.get(phone_number_id).and_then(|p| p.throughput_mps);
            limits.mps_for(phone_number_id, configured)
        })
    }

    /// A unit of the number's throughput for a message it did not send through the API (Meta counts inbound
    /// messages too); never refused.
    pub(crate) fn inbound_throughput(&self, phone_number_id: &str) {
        let limits = self.current_limits();
        if limits.enabled {
            let mps = self.mps_for(&limits, phone_number_id);
            self.limiter.throughput_inbound(phone_number_id, mps, limits.throughput_burst);
        }
    }

    /// A message the business sent from the WhatsApp Business app: a unit of the pair limit and of the number's
    /// throughput, never refused.
    pub(crate) fn echo_sent(&self, phone_number_id: &str, wa_id: &str) {
        let limits = self.current_limits();
        if limits.enabled {
            self.inbound_throughput(phone_number_id);
            if limits.pair_enabled {
                self.limiter.pair_force(phone_number_id, wa_id, &limits);
            }
        }
    }

    /// The code a dead token gets (`*` kills every token).
    pub(crate) fn token_state(&self, token: &str) -> Option<i64> {
        let dead = lock_read(&self.dead_tokens);
        dead.get(token).or_else(|| dead.get("*")).copied()
    }

    /// Expires (190) or invalidates (0) a token; `*` for every token. Err for another code.
    pub(crate) fn kill_token(&self, token: &str, code: i64) -> Result<(), String> {
        if ![0, 190].contains(&code) {
            return Err(format!("code must be 190 or 0, not {code}"));
        }
        if token.is_empty() {
            return Err("token must not be empty (use \"*\" for every token)".into());
        }
        lock_write(&self.dead_tokens).insert(token.to_string(), code);
        Ok(())
    }

    /// Makes a dead token valid again (`*`: every token); true when it was dead.
    pub(crate) fn restore_token(&self, token: &str) -> bool {
        let mut dead = lock_write(&self.dead_tokens);
        if token == "*" {
            let any = !dead.is_empty();
            dead.clear();
            return any;
        }
        dead.remove(token).is_some()
    }

    pub(crate) fn restart_clock(self: &Arc<Self>) {
        let s = lock_read(&self.scenario).scenario.clone();
        self.set_scenario(s);
    }

    pub(crate) fn reset(self: &Arc<Self>) {
        self.oracle.clear();
        self.limiter.clear();
        self.restore_token("*");
        self.account.reset_all(&self.cfg);
        self.restart_clock();
    }

    pub(crate) fn dump(&self, path: &Path) -> anyhow::Result<()> {
        let snap = self.oracle.snapshot();
        let text = serde_json::to_vec_pretty(&snap)?;
        std::fs::write(path, text).with_context(|| format!("cannot write oracle dump `{}`", path.display()))
    }
}
