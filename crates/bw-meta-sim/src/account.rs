//! The account state Meta announces by webhook and enforces on sends (reference §3.3, §3.5, §4.5, §6):
//! WABA restrictions and bans, template status, category and quality, users who stopped marketing,
//! per-number throughput upgrades and maintenance, portfolio messaging-limit tiers, and the traffic state
//! behind them (unique users reached per portfolio, open customer service windows, the user directory).
//!
//! Two lifetimes: the *announced* state (what events set: restrictions, bans, templates, stops, tiers,
//! upgrades) goes back to the configuration whenever a scenario is set or restarted and on `/_sim/reset`,
//! because a scenario's events are its timeline (messages held by template pacing are discarded with it:
//! accepted in the oracle, never reported); the *traffic* state (users reached, open windows, derived user ids)
//! is cleared only on `/_sim/reset`, like the limiter.
//!
//! Effects on sends, in the order `api` checks them (codes are the reference's, choices are inferences):
//! - a WABA stopped by `DISABLED_UPDATE` `DISABLE` (or deleted, offboarded, partner removed): 131031, sync;
//! - a number in maintenance (the minute of a throughput upgrade): 131057, sync;
//! - an active `ACCOUNT_RESTRICTION` of the WABA until its `expiration`: 368, sync, for the send class it
//!   names (`RESTRICTED_BIZ_INITIATED_MESSAGING`: sends to users without an open window;
//!   `RESTRICTED_CUSTOMER_INITIATED_MESSAGING`: sends inside one; `RESTRICTED_DIRECT_SEND_UTILITY_TEMPLATES`:
//!   utility templates);
//! - a template `PAUSED` 132015, `DISABLED` 132016, not approved (rejected, archived, deleted, pending...)
//!   132001, sync (paused templates are rejected and not charged, §3.5);
//! - a user-id send of a one-tap, zero-tap or copy-code authentication template: 131062, sync;
//! - after acceptance: marketing to a user who stopped marketing 131050, marketing to a US number
//!   `us_marketing_code`, a non-template send outside a window 131047 (when enforced), then the portfolio
//!   messaging limit (see `MessagingLimitConfig`), each a `failed` status.

use crate::config::{OtpType, SimConfig};
use crate::ids;
use crate::limits::Tier;
use crate::webhook::StatusEvent;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, RwLock};

/// The customer service window: 24 h from the user's last message (reference §5).
pub const SERVICE_WINDOW_MS: u64 = 24 * 3_600_000;

/// `en-US` → `en_US`: webhooks spell languages with a hyphen, sends with an underscore.
pub fn norm_language(lang: &str) -> String {
    lang.replace('-', "_")
}

/// `en_US` → `en-US`, the form Meta's template webhooks show.
pub fn webhook_language(lang: &str) -> String {
    lang.replace('_', "-")
}

/// A stable `message_template_id` for a template without a configured one.
pub fn template_id(name: &str, language: &str) -> u64 {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(format!("{name}:{}", norm_language(language)).as_bytes());
    1_000_000_000_000_000 + u64::from_be_bytes(h[..8].try_into().unwrap_or([0; 8])) % 900_000_000_000_000
}

/// A template's state.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TemplateState {
    pub name: String,
    /// None: every language of the name (a configured template without a language).
    pub language: Option<String>,
    pub id: u64,
    pub status: String,
    pub category: String,
    pub quality: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otp_type: Option<OtpType>,
    /// Under pacing: sends are held until a release or a pause.
    pub paced: bool,
    /// Messages held now.
    pub held: usize,
}

/// An active restriction of a WABA.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Restriction {
    pub restriction_type: String,
    /// Unix ms; None: until lifted by another event.
    pub until_unix_ms: Option<u64>,
    pub code: i64,
}

#[derive(Debug, Default)]
struct Announced {
    restrictions: HashMap<String, Vec<Restriction>>,
    /// WABA → (the event that stopped it, the code sends get).
    stopped: HashMap<String, (String, i64)>,
    /// name → languages (normalised; "" = every language) → state.
    templates: HashMap<String, Vec<(String, TemplateState)>>,
    /// (WABA, user key) pairs that stopped marketing.
    marketing_stopped: HashSet<(String, String)>,
    number_mps: HashMap<String, f64>,
    /// Number → unix ms its maintenance ends.
    maintenance: HashMap<String, u64>,
    tiers: HashMap<String, Tier>,
}

/// One user as the directory knows them.
#[derive(Debug, Clone, PartialEq)]
pub struct UserInfo {
    pub user_id: String,
    /// Phone digits, when known.
    pub wa_id: Option<String>,
    pub username: Option<String>,
    pub share_phone: bool,
}

#[derive(Debug, Default)]
struct Directory {
    /// user id → (phone digits, portfolio) for derived ids.
    derived: HashMap<String, String>,
}

/// One event that fired, for `GET /_sim/state`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FiredEvent {
    pub name: String,
    pub kind: String,
    pub field: String,
    pub waba_id: String,
    pub at_unix_ms: u64,
    /// Whether it changed the simulator's state (`effect = false` only announces).
    pub applied: bool,
}

/// Events kept in the log.
pub const EVENTS_KEPT: usize = 1000;

/// The live account state.
#[derive(Debug, Default)]
pub struct Account {
    announced: RwLock<Announced>,
    /// Portfolio → user key → unix ms of the last business-initiated message that reached them.
    reached: Mutex<HashMap<String, HashMap<String, u64>>>,
    /// (number, user key) → unix ms of the user's last message to it.
    windows: RwLock<HashMap<(String, String), u64>>,
    directory: RwLock<Directory>,
    fired: Mutex<Vec<FiredEvent>>,
    /// (template name, normalised language) → statuses held by pacing, with the operation id for the oracle.
    held: Mutex<HashMap<(String, String), Vec<StatusEvent>>>,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which send a restriction applies to.
#[derive(Debug, Clone, Copy)]
pub struct SendClass<'a> {
    /// The recipient wrote to this number within 24 h.
    pub in_window: bool,
    pub template: Option<(&'a str, &'a str)>,
    /// Upper-case template category, when a template.
    pub category: Option<&'a str>,
}

impl Account {
    /// The announced state as configured.
    pub fn new(cfg: &SimConfig) -> Account {
        let a = Account::default();
        a.reset_announced(cfg);
        a
    }

    /// Back to the configuration's templates and tiers; no restriction, ban, stop, upgrade or maintenance.
    pub fn reset_announced(&self, cfg: &SimConfig) {
        let mut s = Announced::default();
        for t in &cfg.templates {
            let lang = t.language.as_deref().map(norm_language).unwrap_or_default();
            let state = TemplateState {
                name: t.name.clone(),
                language: t.language.as_deref().map(norm_language),
                id: t.id.unwrap_or_else(|| template_id(&t.name, &lang)),
                status: t.status.to_ascii_uppercase(),
                category: t.category.to_ascii_uppercase(),
                quality: "UNKNOWN".into(),
                otp_type: t.otp_type,
                paced: t.paced,
                held: 0,
            };
            s.templates.entry(t.name.clone()).or_default().push((lang, state));
        }
        for (id, p) in &cfg.portfolios {
            s.tiers.insert(id.clone(), p.tier);
        }
        *write(&self.announced) = s;
        lock(&self.fired).clear();
        lock(&self.held).clear();
    }

    /// Clears the traffic state too.
    pub fn reset_all(&self, cfg: &SimConfig) {
        self.reset_announced(cfg);
        lock(&self.reached).clear();
        write(&self.windows).clear();
        *write(&self.directory) = Directory::default();
    }

    // ----- templates -----

    /// The state of template `name` in `language` (an exact language first, then a configured any-language one).
    pub fn template(&self, name: &str, language: &str) -> Option<TemplateState> {
        let s = read(&self.announced);
        let list = s.templates.get(name)?;
        let lang = norm_language(language);
        list.iter()
            .find(|(l, _)| *l == lang)
            .or_else(|| list.iter().find(|(l, _)| l.is_empty()))
            .map(|(_, t)| t.clone())
    }

    /// Creates the template's own entry (exact language) from its current state if needed, then changes it.
    pub fn update_template(&self, name: &str, language: &str, f: impl FnOnce(&mut TemplateState)) -> TemplateState {
        let current = self.template(name, language);
        let lang = norm_language(language);
        let mut s = write(&self.announced);
        let list = s.templates.entry(name.to_string()).or_default();
        let idx = match list.iter().position(|(l, _)| *l == lang) {
            Some(i) => i,
            None => {
                let mut t = current.unwrap_or_else(|| TemplateState {
                    name: name.to_string(),
                    language: None,
                    id: template_id(name, &lang),
                    status: "APPROVED".into(),
                    category: "UTILITY".into(),
                    quality: "UNKNOWN".into(),
                    otp_type: None,
                    paced: false,
                    held: 0,
                });
                t.language = Some(lang.clone());
                list.push((lang, t));
                list.len() - 1
            }
        };
        f(&mut list[idx].1);
        list[idx].1.clone()
    }

    /// Holds the statuses of a message sent with a paced template (reference §3.5).
    pub fn hold(&self, name: &str, language: &str, status: StatusEvent) {
        let key = (name.to_string(), norm_language(language));
        lock(&self.held).entry(key).or_default().push(status);
        self.update_template(name, language, |t| t.held += 1);
    }

    /// Takes every message held for a template (a release or a pause decides what happens to them).
    pub fn take_held(&self, name: &str, language: &str) -> Vec<StatusEvent> {
        let key = (name.to_string(), norm_language(language));
        let held = lock(&self.held).remove(&key).unwrap_or_default();
        if !held.is_empty() {
            self.update_template(name, language, |t| t.held = 0);
        }
        held
    }

    // ----- WABA -----

    pub fn stop_waba(&self, waba_id: &str, event: &str, code: i64) {
        write(&self.announced).stopped.insert(waba_id.to_string(), (event.to_string(), code));
    }

    /// Lifts a ban and every restriction (a reinstatement).
    pub fn resume_waba(&self, waba_id: &str) {
        let mut s = write(&self.announced);
        s.stopped.remove(waba_id);
        s.restrictions.remove(waba_id);
    }

    pub fn restrict(&self, waba_id: &str, r: Restriction) {
        let mut s = write(&self.announced);
        let list = s.restrictions.entry(waba_id.to_string()).or_default();
        list.retain(|x| x.restriction_type != r.restriction_type);
        list.push(r);
    }

    // ----- users -----

    pub fn set_marketing_stopped(&self, waba_id: &str, user_key: &str, stopped: bool) {
        let key = (waba_id.to_string(), user_key.to_string());
        let mut s = write(&self.announced);
        if stopped {
            s.marketing_stopped.insert(key);
        } else {
            s.marketing_stopped.remove(&key);
        }
    }

    pub fn marketing_stopped(&self, waba_id: &str, user_key: &str) -> bool {
        let s = read(&self.announced);
        !s.marketing_stopped.is_empty() && s.marketing_stopped.contains(&(waba_id.to_string(), user_key.to_string()))
    }

    /// The directory entry for phone digits `wa_id` in `portfolio`: a configured user, else a derived user id.
    pub fn user_by_phone(&self, cfg: &SimConfig, portfolio: &str, wa_id: &str) -> UserInfo {
        if let Some(u) = cfg.users.iter().find(|u| ids::wa_id(&u.phone) == wa_id) {
            let user_id = u.user_id.clone().unwrap_or_else(|| ids::derive_user_id(portfolio, wa_id));
            if u.user_id.is_none() {
                write(&self.directory).derived.entry(user_id.clone()).or_insert_with(|| wa_id.to_string());
            }
            return UserInfo {
                user_id,
                wa_id: Some(wa_id.to_string()),
                username: u.username.clone(),
                share_phone: u.share_phone,
            };
        }
        let user_id = ids::derive_user_id(portfolio, wa_id);
        {
            let dir = read(&self.directory);
            if dir.derived.contains_key(&user_id) {
                return UserInfo { user_id, wa_id: Some(wa_id.to_string()), username: None, share_phone: true };
            }
        }
        write(&self.directory).derived.insert(user_id.clone(), wa_id.to_string());
        UserInfo { user_id, wa_id: Some(wa_id.to_string()), username: None, share_phone: true }
    }

    /// The directory entry for a user id: a configured user, a derived id the simulator gave out, else a user
    /// whose phone the simulator does not know.
    pub fn user_by_id(&self, cfg: &SimConfig, user_id: &str) -> UserInfo {
        if let Some(u) = cfg.users.iter().find(|u| u.user_id.as_deref() == Some(user_id)) {
            return UserInfo {
                user_id: user_id.to_string(),
                wa_id: Some(ids::wa_id(&u.phone)),
                username: u.username.clone(),
                share_phone: u.share_phone,
            };
        }
        let phone = read(&self.directory).derived.get(user_id).cloned();
        match phone {
            Some(wa_id) => {
                let configured = cfg.users.iter().find(|u| ids::wa_id(&u.phone) == wa_id);
                UserInfo {
                    user_id: user_id.to_string(),
                    wa_id: Some(wa_id),
                    username: configured.and_then(|u| u.username.clone()),
                    share_phone: configured.is_none_or(|u| u.share_phone),
                }
            }
            None => UserInfo { user_id: user_id.to_string(), wa_id: None, username: None, share_phone: false },
        }
    }

    /// Records that `user_id` now names the user with phone digits `wa_id` (a `user_changed_*` system message).
    pub fn link_user_id(&self, user_id: &str, wa_id: &str) {
        write(&self.directory).derived.insert(user_id.to_string(), wa_id.to_string());
    }

    // ----- windows and the portfolio limit -----

    /// A user message from `user_key` to `phone_number_id` opens (or renews) the customer service window.
    pub fn user_wrote(&self, phone_number_id: &str, user_key: &str, now_ms: u64) {
        write(&self.windows).insert((phone_number_id.to_string(), user_key.to_string()), now_ms);
    }

    pub fn in_window(&self, phone_number_id: &str, user_key: &str, now_ms: u64) -> bool {
        let w = read(&self.windows);
        !w.is_empty()
            && w.get(&(phone_number_id.to_string(), user_key.to_string()))
                .is_some_and(|t| now_ms.saturating_sub(*t) < SERVICE_WINDOW_MS)
    }

    pub fn tier(&self, portfolio: &str) -> Tier {
        read(&self.announced).tiers.get(portfolio).copied().unwrap_or(Tier::UNLIMITED)
    }

    pub fn set_tier(&self, portfolio: &str, tier: Tier) {
        write(&self.announced).tiers.insert(portfolio.to_string(), tier);
    }

    /// A business-initiated message to `user_key` from `portfolio`: Ok when the user was reached within the
    /// window already or the portfolio is under its tier (the user is then counted), Err(limit) past the tier.
    pub fn reach(&self, portfolio: &str, user_key: &str, now_ms: u64, window_ms: u64) -> Result<(), u64> {
        let Some(limit) = self.tier(portfolio).0 else {
            return Ok(());
        };
        let mut all = lock(&self.reached);
        let users = all.entry(portfolio.to_string()).or_default();
        let live = |t: &u64| now_ms.saturating_sub(*t) < window_ms;
        if users.get(user_key).is_some_and(live) {
            users.insert(user_key.to_string(), now_ms);
            return Ok(());
        }
        if users.len() as u64 >= limit {
            users.retain(|_, t| live(t));
        }
        if users.len() as u64 >= limit {
            return Err(limit);
        }
        users.insert(user_key.to_string(), now_ms);
        Ok(())
    }

    /// Unique users a portfolio reached within the window.
    pub fn reached(&self, portfolio: &str, now_ms: u64, window_ms: u64) -> u64 {
        lock(&self.reached)
            .get(portfolio)
            .map_or(0, |u| u.values().filter(|t| now_ms.saturating_sub(**t) < window_ms).count() as u64)
    }

    // ----- numbers -----

    /// A throughput set by an upgrade webhook; it wins over the configuration.
    pub fn number_mps(&self, phone_number_id: &str) -> Option<f64> {
        let s = read(&self.announced);
        if s.number_mps.is_empty() { None } else { s.number_mps.get(phone_number_id).copied() }
    }

    pub fn set_number_mps(&self, phone_number_id: &str, mps: f64) {
        write(&self.announced).number_mps.insert(phone_number_id.to_string(), mps);
    }

    pub fn set_maintenance(&self, phone_number_id: &str, until_unix_ms: Option<u64>) {
        let mut s = write(&self.announced);
        match until_unix_ms {
            Some(t) => s.maintenance.insert(phone_number_id.to_string(), t),
            None => s.maintenance.remove(phone_number_id),
        };
    }

    // ----- the sync check -----

    /// The code a send gets from the announced state before it is accepted, if any.
    pub fn refusal(&self, phone_number_id: &str, waba_id: &str, class: SendClass<'_>, now_ms: u64) -> Option<i64> {
        let s = read(&self.announced);
        if let Some((_, code)) = s.stopped.get(waba_id) {
            return Some(*code);
        }
        if s.maintenance.get(phone_number_id).is_some_and(|until| now_ms < *until) {
            return Some(131_057);
        }
        for r in s.restrictions.get(waba_id).into_iter().flatten() {
            if r.until_unix_ms.is_some_and(|until| now_ms >= until) {
                continue;
            }
            let hit = match r.restriction_type.as_str() {
                "RESTRICTED_BIZ_INITIATED_MESSAGING" => !class.in_window,
                "RESTRICTED_CUSTOMER_INITIATED_MESSAGING" => class.in_window,
                "RESTRICTED_DIRECT_SEND_UTILITY_TEMPLATES" => class.category == Some("UTILITY"),
                _ => false,
            };
            if hit {
                return Some(r.code);
            }
        }
        None
    }

    // ----- the event log and the snapshot -----

    pub fn log(&self, ev: FiredEvent) {
        let mut f = lock(&self.fired);
        if f.len() < EVENTS_KEPT {
            f.push(ev);
        }
    }

    pub fn fired(&self) -> Vec<FiredEvent> {
        lock(&self.fired).clone()
    }

    /// A serializable copy (user keys masked).
    pub fn snapshot(&self, cfg: &SimConfig, now_ms: u64) -> AccountSnapshot {
        let s = read(&self.announced);
        let mut wabas: BTreeMap<String, WabaSnapshot> = BTreeMap::new();
        for (waba, (event, code)) in &s.stopped {
            let w = wabas.entry(waba.clone()).or_default();
            w.stopped_by = Some(event.clone());
            w.stopped_code = Some(*code);
        }
        for (waba, list) in &s.restrictions {
            let live: Vec<Restriction> =
                list.iter().filter(|r| r.until_unix_ms.is_none_or(|u| now_ms < u)).cloned().collect();
            if !live.is_empty() {
                wabas.entry(waba.clone()).or_default().restrictions = live;
            }
        }
        let mut templates: Vec<TemplateState> =
            s.templates.values().flat_map(|l| l.iter().map(|(_, t)| t.clone())).collect();
        templates.sort_by(|a, b| (&a.name, &a.language).cmp(&(&b.name, &b.language)));
        let mut portfolios = BTreeMap::new();
        let mut ids: HashSet<&String> = s.tiers.keys().collect();
        let reached = lock(&self.reached);
        ids.extend(reached.keys());
        for id in ids {
            let tier = s.tiers.get(id).copied().unwrap_or(Tier::UNLIMITED);
            let used = reached.get(id).map_or(0, |u| {
                u.values().filter(|t| now_ms.saturating_sub(**t) < cfg.messaging_limit.window_ms).count() as u64
            });
            portfolios.insert(id.clone(), PortfolioSnapshot { tier, reached: used });
        }
        let numbers = s
            .number_mps
            .iter()
            .map(|(n, mps)| (n.clone(), NumberSnapshot { throughput_mps: Some(*mps), maintenance_until_unix_ms: None }))
            .chain(s.maintenance.iter().filter(|(_, u)| now_ms < **u).map(|(n, u)| {
                (
                    n.clone(),
                    NumberSnapshot {
                        throughput_mps: s.number_mps.get(n).copied(),
                        maintenance_until_unix_ms: Some(*u),
                    },
                )
            }))
            .collect();
        let mut marketing_stopped: Vec<(String, String)> = s
            .marketing_stopped
            .iter()
            .map(|(w, u)| {
                let masked = if ids::is_user_id(u) { ids::mask_user_id(u) } else { ids::mask_phone(u) };
                (w.clone(), masked)
            })
            .collect();
        marketing_stopped.sort();
        AccountSnapshot { wabas, templates, portfolios, numbers, marketing_stopped, events: self.fired() }
    }
}

/// `GET /_sim/state`: what the simulator's account looks like now.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AccountSnapshot {
    /// WABAs with a ban or an active restriction.
    pub wabas: BTreeMap<String, WabaSnapshot>,
    pub templates: Vec<TemplateState>,
    /// Portfolios with a tier or traffic: tier and unique users reached in the current window.
    pub portfolios: BTreeMap<String, PortfolioSnapshot>,
    /// Numbers with an upgraded throughput or in maintenance.
    pub numbers: BTreeMap<String, NumberSnapshot>,
    /// (WABA, masked user) pairs that stopped marketing.
    pub marketing_stopped: Vec<(String, String)>,
    /// Events fired since the scenario started (first [`EVENTS_KEPT`]).
    pub events: Vec<FiredEvent>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct WabaSnapshot {
    pub stopped_by: Option<String>,
    pub stopped_code: Option<i64>,
    pub restrictions: Vec<Restriction>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PortfolioSnapshot {
    pub tier: Tier,
    pub reached: u64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NumberSnapshot {
    pub throughput_mps: Option<f64>,
    pub maintenance_until_unix_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::template_status_effect;

    #[test]
    fn the_portfolio_counts_unique_users_in_a_rolling_window() {
        let a = Account::default();
        a.set_tier("p", Tier(Some(2)));
        assert_eq!(a.reach("p", "u1", 0, 1000), Ok(()));
        assert_eq!(a.reach("p", "u1", 10, 1000), Ok(()), "the same user again is not a new one");
        assert_eq!(a.reach("p", "u2", 20, 1000), Ok(()));
        assert_eq!(a.reach("p", "u3", 30, 1000), Err(2), "past the tier");
        assert_eq!(a.reached("p", 30, 1000), 2);
        assert_eq!(a.reach("other", "u3", 30, 1000), Ok(()), "an unlimited portfolio");
        assert_eq!(a.reach("p", "u3", 1015, 1000), Ok(()), "u1 left the window at 1010");
        assert_eq!(a.reach("p", "u4", 1016, 1000), Err(2), "u2 (20) and u3 (1015) are in it");
    }

    #[test]
    fn restrictions_follow_the_send_class_and_expire() {
        let a = Account::default();
        a.restrict(
            "w",
            Restriction {
                restriction_type: "RESTRICTED_BIZ_INITIATED_MESSAGING".into(),
                until_unix_ms: Some(100),
                code: 368,
            },
        );
        let biz = SendClass { in_window: false, template: None, category: None };
        let reply = SendClass { in_window: true, ..biz };
        assert_eq!(a.refusal("n", "w", biz, 50), Some(368));
        assert_eq!(a.refusal("n", "w", reply, 50), None, "replies inside a window still flow");
        assert_eq!(a.refusal("n", "other", biz, 50), None, "another WABA");
        assert_eq!(a.refusal("n", "w", biz, 100), None, "expired");
        a.stop_waba("w", "DISABLED_UPDATE", 131_031);
        assert_eq!(a.refusal("n", "w", reply, 50), Some(131_031));
        a.resume_waba("w");
        assert_eq!(a.refusal("n", "w", biz, 50), None);
    }

    #[test]
    fn template_state_is_per_language_and_statuses_map_to_codes() {
        let a = Account::default();
        assert!(a.template("t", "en_US").is_none());
        let t = a.update_template("t", "en-US", |t| t.status = "PAUSED".into());
        assert_eq!((t.language.as_deref(), t.status.as_str()), (Some("en_US"), "PAUSED"));
        assert_eq!(a.template("t", "en_US").map(|t| t.status), Some("PAUSED".into()));
        assert!(a.template("t", "es_AR").is_none());
        assert_eq!(template_status_effect("paused"), Ok(Some(132_015)));
        assert_eq!(template_status_effect("REINSTATED"), Ok(None));
        assert!(template_status_effect("BOGUS").is_err());
    }
}
