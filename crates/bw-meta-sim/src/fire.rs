//! Fires [`Event`]s: builds each webhook `value` in the shape of the reference's examples (§4.5, §4.4, §6),
//! changes the simulator's account state as Meta would (unless `effect = false`), sends the webhook signed like
//! every other, and logs the event for `GET /_sim/state`. A scenario's events run on a task of their own that
//! ends when the scenario is replaced.

use crate::account::{FiredEvent, Restriction, webhook_language};
use crate::errors;
use crate::events::{Event, EventKind};
use crate::ids;
use crate::limits::Tier;
use crate::scenario::event_name;
use crate::scenario::{Active, Scenario};
use crate::state::{Inner, lock_write};
use crate::webhook::{Failure, StatusEvent};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Runs a scenario's events at their offsets from `started` until `cancel` fires.
pub(crate) fn schedule(st: &Arc<Inner>, events: Vec<Event>, started: std::time::Instant, cancel: CancellationToken) {
    if events.is_empty() {
        return;
    }
    let st = st.clone();
    tokio::spawn(async move {
        let mut order: Vec<(usize, Event)> = events.into_iter().enumerate().collect();
        order.sort_by_key(|(i, e)| (e.at_ms, *i));
        let base = tokio::time::Instant::from_std(started);
        for (i, ev) in order {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(at(base, ev.at_ms)) => {}
            }
            fire(&st, &ev, &event_name(&ev, i), &cancel);
        }
    });
}

/// `base + ms`, or a date decades away when that does not fit (a hostile offset must not panic).
fn at(base: tokio::time::Instant, ms: u64) -> tokio::time::Instant {
    base.checked_add(Duration::from_millis(ms)).unwrap_or_else(|| base + Duration::from_secs(30 * 365 * 86_400))
}

/// Fires `ev` `at_ms` from now (admin calls), unless the simulator stops first.
pub(crate) fn later(st: &Arc<Inner>, ev: Event, label: String) {
    let st = st.clone();
    let cancel = st.shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = cancel.cancelled() => {}
            () = tokio::time::sleep_until(at(tokio::time::Instant::now(), ev.at_ms)) => fire(&st, &ev, &label, &cancel),
        }
    });
}

/// The WABA an event is about: its own `waba_id`, else its number's, else the configured one.
fn waba(st: &Inner, waba_id: &Option<String>, phone: Option<&str>) -> String {
    match (waba_id, phone) {
        (Some(w), _) => w.clone(),
        (None, Some(p)) => st.cfg.waba_of(p).to_string(),
        (None, None) => st.cfg.waba_id.clone(),
    }
}

/// "December 6, 2026": the date form of `ban_info.waba_ban_date`.
fn long_date(unix_ms: u64) -> String {
    let at = i64::try_from(unix_ms).ok().and_then(chrono::DateTime::from_timestamp_millis).unwrap_or_default();
    at.format("%B %-d, %Y").to_string()
}

/// Fires one event now.
pub(crate) fn fire(st: &Arc<Inner>, ev: &Event, label: &str, cancel: &CancellationToken) {
    let now = ids::now_ms();
    let now_s = now / 1000;
    let (waba_id, applied) = match &ev.kind {
        EventKind::AccountUpdate {
            waba_id,
            event,
            restriction_type,
            expiration,
            expires_in_ms,
            remediation,
            ban_state,
            ban_date,
            violation_type,
            code,
            effect,
        } => {
            let waba = waba(st, waba_id, None);
            let mut value = json!({ "event": event });
            match event.as_str() {
                "ACCOUNT_RESTRICTION" => {
                    let rt = restriction_type.clone().unwrap_or_else(|| "RESTRICTED_BIZ_INITIATED_MESSAGING".into());
                    let until_ms =
                        expires_in_ms.map(|ms| now.saturating_add(ms)).or(expiration.map(|s| s.saturating_mul(1000)));
                    let mut info = json!({ "restriction_type": rt });
                    // Whole seconds, rounded up: a sender that waits until `expiration` never meets the block.
                    if let Some(u) = until_ms {
                        info["expiration"] = json!(u.div_ceil(1000));
                    }
                    if let Some(r) = remediation {
                        info["remediation"] = json!(r);
                    }
                    value["restriction_info"] = json!([info]);
                    if *effect {
                        let r =
                            Restriction { restriction_type: rt, until_unix_ms: until_ms, code: code.unwrap_or(368) };
                        st.account.restrict(&waba, r);
                    }
                }
                "DISABLED_UPDATE" => {
                    let state = ban_state.clone().unwrap_or_else(|| "DISABLE".into());
                    let date = ban_date.clone().unwrap_or_else(|| long_date(now));
                    value["ban_info"] = json!({ "waba_ban_state": state, "waba_ban_date": date });
                    if *effect {
                        match state.as_str() {
                            "DISABLE" => st.account.stop_waba(&waba, event, code.unwrap_or(131_031)),
                            "REINSTATE" => st.account.resume_waba(&waba),
                            _ => {}
                        }
                    }
                }
                "ACCOUNT_VIOLATION" => {
                    value["violation_info"] = json!({ "violation_type": violation_type });
                }
                "ACCOUNT_DELETED" | "PARTNER_REMOVED" | "PARTNER_APP_UNINSTALLED" | "ACCOUNT_OFFBOARDED" if *effect => {
                    st.account.stop_waba(&waba, event, code.unwrap_or(131_031));
                }
                "ACCOUNT_RECONNECTED" if *effect => st.account.resume_waba(&waba),
                _ => {}
            }
            st.webhooks.change(&waba, "account_update", value);
            (waba, *effect)
        }
        EventKind::BusinessCapabilityUpdate {
            waba_id,
            max_daily_conversations_per_business,
            max_phone_numbers_per_waba,
            effect,
        } => {
            let waba = waba(st, waba_id, None);
            let value = json!({
                "max_daily_conversations_per_business": max_daily_conversations_per_business,
                "max_phone_numbers_per_waba": max_phone_numbers_per_waba.unwrap_or(25),
            });
            if *effect && let Ok(tier) = Tier::from_json(max_daily_conversations_per_business) {
                st.account.set_tier(st.cfg.portfolio_of_waba(&waba), tier);
            }
            st.webhooks.change(&waba, "business_capability_update", value);
            (waba, *effect)
        }
        EventKind::PhoneNumberQualityUpdate {
            phone_number_id,
            event,
            current_limit,
            old_limit,
            max_daily_conversations_per_business,
            throughput_mps,
            maintenance_ms,
            effect,
        } => {
            let waba = st.cfg.waba_of(phone_number_id).to_string();
            let portfolio = st.cfg.portfolio_of(phone_number_id).to_string();
            let tier = json!(st.account.tier(&portfolio).name());
            let mut value = json!({
                "display_phone_number": st.webhooks.display(phone_number_id),
                "event": event,
                "current_limit": current_limit.clone().unwrap_or_else(|| tier.clone()),
                "max_daily_conversations_per_business": max_daily_conversations_per_business.clone().unwrap_or(tier),
            });
            if let Some(old) = old_limit {
                value["old_limit"] = old.clone();
            }
            if *effect
                && let Some(t) = max_daily_conversations_per_business.as_ref().and_then(|v| Tier::from_json(v).ok())
            {
                st.account.set_tier(&portfolio, t);
            }
            let upgrade = (*effect && event == "THROUGHPUT_UPGRADE").then(|| throughput_mps.unwrap_or(1_000.0));
            let wait = maintenance_ms.unwrap_or(0);
            if wait > 0 && upgrade.is_some() {
                // The number is unusable (131057) during the upgrade; the webhook announces its end.
                st.account.set_maintenance(phone_number_id, Some(now.saturating_add(wait)));
                let (st2, phone, cancel) = (st.clone(), phone_number_id.clone(), cancel.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        () = cancel.cancelled() => {}
                        () = tokio::time::sleep_until(at(tokio::time::Instant::now(), wait)) => {
                            st2.account.set_maintenance(&phone, None);
                            if let Some(mps) = upgrade {
                                st2.account.set_number_mps(&phone, mps);
                                st2.limiter.forget_number(&phone);
                            }
                            let waba = st2.cfg.waba_of(&phone).to_string();
                            st2.webhooks.change(&waba, "phone_number_quality_update", value);
                        }
                    }
                });
            } else {
                if let Some(mps) = upgrade {
                    st.account.set_number_mps(phone_number_id, mps);
                    st.limiter.forget_number(phone_number_id);
                }
                st.webhooks.change(&waba, "phone_number_quality_update", value);
            }
            (waba, *effect)
        }
        EventKind::AccountAlerts {
            waba_id,
            alert_type,
            entity_type,
            entity_id,
            alert_severity,
            alert_status,
            alert_description,
        } => {
            let waba = waba(st, waba_id, None);
            let entity_type = entity_type.clone().unwrap_or_else(|| "BUSINESS".into());
            let entity_id = entity_id.clone().unwrap_or_else(|| st.cfg.portfolio_of_waba(&waba).to_string());
            let value = json!({
                "entity_type": entity_type,
                "entity_id": entity_id,
                "alert_info": {
                    "alert_severity": alert_severity.clone().unwrap_or_else(|| "WARNING".into()),
                    "alert_status": alert_status.clone().unwrap_or_else(|| "ACTIVE".into()),
                    "alert_type": alert_type,
                    "alert_description": alert_description.clone().unwrap_or_else(|| alert_text(alert_type)),
                },
            });
            st.webhooks.change(&waba, "account_alerts", value);
            (waba, false)
        }
        EventKind::MessageTemplateStatusUpdate {
            waba_id,
            template,
            language,
            event,
            reason,
            title,
            description,
            template_id,
            effect,
        } => {
            let waba = waba(st, waba_id, None);
            let t = if *effect {
                st.account.update_template(template, language, |t| t.status = event.clone())
            } else {
                st.account
                    .template(template, language)
                    .unwrap_or_else(|| st.account.update_template(template, language, |_| {}))
            };
            let mut value = json!({
                "event": event,
                "message_template_id": template_id.unwrap_or(t.id),
                "message_template_name": template,
                "message_template_language": webhook_language(language),
                "reason": reason.clone().unwrap_or_else(|| "NONE".into()),
                "message_template_category": t.category,
            });
            let title = title.clone().or_else(|| match event.as_str() {
                "PAUSED" => Some("FIRST_PAUSE".into()),
                "DISABLED" => Some("DISABLED".into()),
                _ => None,
            });
            if let Some(title) = title {
                let description = description.clone().unwrap_or_else(|| pause_text(&title));
                value["other_info"] = json!({ "title": title, "description": description });
            }
            if event == "DISABLED" {
                value["disable_info"] = json!({ "disable_date": now_s });
            }
            st.webhooks.change(&waba, "message_template_status_update", value);
            // Bad feedback during pacing drops every held message with 132015 (reference §3.5); a template
            // disabled while messages are held drops them with 132016 (an inference).
            let drop_code = match event.as_str() {
                "PAUSED" => Some(132_015),
                "DISABLED" => Some(132_016),
                _ => None,
            };
            if *effect && let Some(code) = drop_code {
                if event == "PAUSED" {
                    st.account.update_template(template, language, |t| t.paced = false);
                }
                for held in st.account.take_held(template, language) {
                    st.oracle.record_failure(crate::oracle::FailedMessage {
                        operation_id: held.biz_opaque_callback_data.clone(),
                        wamid: held.wamid.clone(),
                        phone_number_id: held.phone_number_id.clone(),
                        code,
                        cause: crate::oracle::FailureCause::Account,
                        injection: None,
                    });
                    let base = StatusEvent { timestamp: now_s, ..held };
                    st.webhooks.message_accepted_failing(base, Some(Failure::code(code)), Duration::ZERO, false);
                }
            }
            (waba, *effect)
        }
        EventKind::MessageTemplateQualityUpdate {
            waba_id,
            template,
            language,
            new_quality_score,
            previous_quality_score,
            template_id,
            effect,
        } => {
            let waba = waba(st, waba_id, None);
            let before = st.account.template(template, language).map(|t| t.quality);
            let t = if *effect {
                st.account.update_template(template, language, |t| t.quality = new_quality_score.clone())
            } else {
                st.account.update_template(template, language, |_| {})
            };
            let previous = previous_quality_score.clone().or(before).unwrap_or_else(|| "UNKNOWN".into());
            let value = json!({
                "previous_quality_score": previous,
                "new_quality_score": new_quality_score,
                "message_template_id": template_id.unwrap_or(t.id),
                "message_template_name": template,
                "message_template_language": webhook_language(language),
            });
            st.webhooks.change(&waba, "message_template_quality_update", value);
            (waba, *effect)
        }
        EventKind::TemplateCategoryUpdate {
            waba_id,
            template,
            language,
            new_category,
            notice,
            notice_ms,
            template_id,
            effect,
        } => {
            let waba = waba(st, waba_id, None);
            let current = st.account.update_template(template, language, |_| {});
            let target = new_category.to_ascii_uppercase();
            let mut value = json!({
                "message_template_id": template_id.unwrap_or(current.id),
                "message_template_name": template,
                "message_template_language": webhook_language(language),
            });
            let applied = if *notice {
                // The notice: `new_category` is still the current one; the change comes at the timestamp.
                value["new_category"] = json!(current.category);
                value["correct_category"] = json!(target);
                value["category_update_timestamp"] =
                    json!(now_s.saturating_add(notice_ms.unwrap_or(86_400_000) / 1000));
                false
            } else {
                value["previous_category"] = json!(current.category);
                value["new_category"] = json!(target);
                if *effect {
                    st.account.update_template(template, language, |t| t.category = target.clone());
                }
                *effect
            };
            st.webhooks.change(&waba, "template_category_update", value);
            (waba, applied)
        }
        EventKind::UserPreferences { phone_number_id, user, user_id, value, category, detail, effect } => {
            let waba = st.cfg.waba_of(phone_number_id).to_string();
            let portfolio = st.cfg.portfolio_of(phone_number_id);
            let info = match (user, user_id) {
                (Some(phone), Some(id)) => crate::account::UserInfo {
                    user_id: id.clone(),
                    wa_id: Some(ids::wa_id(phone)),
                    username: None,
                    share_phone: true,
                },
                (Some(phone), None) => st.account.user_by_phone(&st.cfg, portfolio, &ids::wa_id(phone)),
                (None, Some(id)) => st.account.user_by_id(&st.cfg, id),
                (None, None) => return,
            };
            let key = info.wa_id.clone().unwrap_or_else(|| info.user_id.clone());
            if *effect {
                st.account.set_marketing_stopped(&waba, &key, value == "stop");
            }
            let mut contact = json!({ "user_id": info.user_id });
            let mut pref = json!({
                "user_id": info.user_id,
                "category": category.clone().unwrap_or_else(|| "marketing_messages".into()),
                "detail": detail.clone().unwrap_or_else(|| format!("User requested to {value} marketing messages")),
                "value": value,
                "timestamp": now_s,
            });
            if let Some(w) = info.wa_id.as_ref().filter(|_| info.share_phone) {
                contact["wa_id"] = json!(w);
                pref["wa_id"] = json!(w);
            }
            let body = json!({
                "messaging_product": "whatsapp",
                "metadata": st.webhooks.metadata(phone_number_id),
                "contacts": [contact],
                "user_preferences": [pref],
            });
            st.webhooks.change(&waba, "user_preferences", body);
            (waba, *effect)
        }
        EventKind::SmbMessageEchoes { phone_number_id, to, text, effect } => {
            let waba = st.cfg.waba_of(phone_number_id).to_string();
            let wa_id = ids::wa_id(to);
            let display = st.webhooks.display(phone_number_id);
            let value = json!({
                "messaging_product": "whatsapp",
                "metadata": st.webhooks.metadata(phone_number_id),
                "message_echoes": [{
                    "from": display,
                    "to": to,
                    "id": ids::wamid(&wa_id),
                    "timestamp": now_s.to_string(),
                    "type": "text",
                    "text": { "body": text.clone().unwrap_or_else(|| "Sent from the WhatsApp Business app".into()) },
                }],
            });
            if *effect {
                // A message the business sent from the app counts against the pair and the number's throughput
                // like one sent through the API (an inference: Meta limits the number, whatever sent it).
                st.echo_sent(phone_number_id, &wa_id);
            }
            st.webhooks.change(&waba, "smb_message_echoes", value);
            (waba, *effect)
        }
        EventKind::ValueErrors { phone_number_id, errors: list } => {
            let waba = st.cfg.waba_of(phone_number_id).to_string();
            let errors: Vec<Value> =
                list.iter().map(|e| errors::webhook_error_with(e.code, e.details.as_deref())).collect();
            st.webhooks.messages_value(phone_number_id, json!({ "errors": errors }), false, Duration::ZERO);
            (waba, false)
        }
        EventKind::Inbound { phone_number_id, from, from_user_id, hide_phone, name, username, text, error_code } => {
            let waba = st.cfg.waba_of(phone_number_id).to_string();
            inbound(
                st,
                &Inbound {
                    phone_number_id: phone_number_id.clone(),
                    from: from.clone(),
                    from_user_id: from_user_id.clone(),
                    hide_phone: *hide_phone,
                    name: name.clone().unwrap_or_default(),
                    username: username.clone(),
                    text: text.clone().unwrap_or_else(|| "Hi".into()),
                    error_code: *error_code,
                },
            );
            (waba, true)
        }
        EventKind::TemplatePacing { template, language, action } => {
            let hold = action == "hold";
            st.account.update_template(template, language, |t| t.paced = hold);
            if !hold {
                for held in st.account.take_held(template, language) {
                    let base = StatusEvent { timestamp: now_s, ..held };
                    st.webhooks.message_accepted_failing(base, None, Duration::ZERO, false);
                }
            }
            (st.cfg.waba_id.clone(), true)
        }
        EventKind::System { phone_number_id, system_type, from, new_phone, user_id, body } => {
            let waba = st.cfg.waba_of(phone_number_id).to_string();
            let portfolio = st.cfg.portfolio_of(phone_number_id);
            let old = st.account.user_by_phone(&st.cfg, portfolio, &ids::wa_id(from));
            let new_wa_id =
                new_phone.as_deref().map(ids::wa_id).unwrap_or_else(|| old.wa_id.clone().unwrap_or_default());
            // A new phone gets a new user id (reference §6: "regenerated when the user changes phone number").
            let new_id = user_id.clone().unwrap_or_else(|| {
                let seed = if system_type == "user_changed_user_id" {
                    format!("{portfolio}:{now}")
                } else {
                    portfolio.to_string()
                };
                ids::derive_user_id(&seed, &new_wa_id)
            });
            st.account.link_user_id(&new_id, &new_wa_id);
            let mut system = json!({
                "body": body.clone().unwrap_or_else(|| "The user's contact details changed.".into()),
                "type": system_type,
                "user_id": new_id,
                "previous_user_id": old.user_id,
            });
            if system_type == "user_changed_number" {
                system["wa_id"] = json!(new_wa_id);
            }
            let mut message = json!({
                "id": ids::wamid(&new_wa_id),
                "timestamp": now_s.to_string(),
                "type": "system",
                "system": system,
            });
            if old.share_phone {
                message["from"] = json!(old.wa_id);
            }
            st.webhooks.messages_value(phone_number_id, json!({ "messages": [message] }), false, Duration::ZERO);
            (waba, true)
        }
        EventKind::Raw { waba_id, field, value } => {
            let waba = waba(st, waba_id, None);
            st.webhooks.change(&waba, field, value.clone());
            (waba, false)
        }
    };
    st.account.log(FiredEvent {
        name: label.to_string(),
        kind: ev.kind.kind_name().to_string(),
        field: ev.kind.field().to_string(),
        waba_id,
        at_unix_ms: now,
        applied,
    });
}

fn alert_text(alert_type: &str) -> String {
    match alert_type {
        "INCREASED_CAPABILITIES_ELIGIBILITY_DEFERRED" => {
            "Your business is not yet eligible for a higher messaging limit. Meta will review it again later.".into()
        }
        "INCREASED_CAPABILITIES_ELIGIBILITY_FAILED" => {
            "Your business is not eligible for a higher messaging limit.".into()
        }
        "INCREASED_CAPABILITIES_ELIGIBILITY_NEED_MORE_INFO" => {
            "More information is needed to review your business for a higher messaging limit.".into()
        }
        other => format!("Alert {other}."),
    }
}

fn pause_text(title: &str) -> String {
    match title {
        "FIRST_PAUSE" => "Your message template has been paused for 3 hours due to low quality.".into(),
        "SECOND_PAUSE" => "Your message template has been paused for 6 hours due to low quality.".into(),
        "RATE_LIMITING_PAUSE" => "Your message template has been paused during pacing; unpause it manually.".into(),
        "UNPAUSE" => "Your message template has been unpaused.".into(),
        _ => "Your message template has been disabled due to low quality.".into(),
    }
}

/// An inbound user message.
#[derive(Debug, Clone, Default)]
pub(crate) struct Inbound {
    pub phone_number_id: String,
    pub from: Option<String>,
    pub from_user_id: Option<String>,
    pub hide_phone: bool,
    pub name: String,
    pub username: Option<String>,
    pub text: String,
    pub error_code: Option<i64>,
}

/// Sends an inbound message webhook (text, or unsupported with `errors[]`), opens the sender's service window
/// and takes a unit of the number's throughput (Meta counts inbound too). Returns the wamid; None without a
/// webhook URL or when the queue is full (the window and throughput are taken anyway: the user did write).
pub(crate) fn inbound(st: &Inner, m: &Inbound) -> Option<String> {
    let now = ids::now_ms();
    let portfolio = st.cfg.portfolio_of(&m.phone_number_id);
    let user = match (&m.from, &m.from_user_id) {
        (Some(from), given) => {
            let mut u = st.account.user_by_phone(&st.cfg, portfolio, &ids::wa_id(from));
            if let Some(id) = given {
                u.user_id = id.clone();
            }
            u
        }
        (None, Some(id)) => st.account.user_by_id(&st.cfg, id),
        (None, None) => return None,
    };
    let key = user.wa_id.clone().unwrap_or_else(|| user.user_id.clone());
    st.account.user_wrote(&m.phone_number_id, &key, now);
    st.inbound_throughput(&m.phone_number_id);
    let show_phone = user.wa_id.is_some() && user.share_phone && !m.hide_phone;
    let wamid = ids::wamid(user.wa_id.as_deref().unwrap_or_default());
    let mut profile = json!({ "name": m.name });
    if let Some(u) = m.username.as_ref().or(user.username.as_ref()) {
        profile["username"] = json!(u);
    }
    let mut contact = json!({ "profile": profile });
    let mut message = json!({ "id": wamid, "timestamp": (now / 1000).to_string() });
    if show_phone {
        contact["wa_id"] = json!(user.wa_id);
        message["from"] = json!(user.wa_id);
    }
    if st.cfg.user_ids || !show_phone {
        contact["user_id"] = json!(user.user_id);
        message["from_user_id"] = json!(user.user_id);
    }
    match m.error_code {
        Some(code) => {
            message["type"] = json!("unsupported");
            message["errors"] = json!([errors::webhook_error(code)]);
        }
        None => {
            message["type"] = json!("text");
            message["text"] = json!({ "body": m.text });
        }
    }
    let value = json!({ "contacts": [contact], "messages": [message] });
    st.webhooks.messages_value(&m.phone_number_id, value, true, Duration::ZERO).then_some(wamid)
}

impl Inner {
    /// Makes `s` the active scenario, its clock starting now: the announced account state goes back to the
    /// configuration and the scenario's events are scheduled (the previous scenario's stop).
    pub(crate) fn set_scenario(self: &Arc<Self>, s: Scenario) {
        let events = s.events.clone();
        let active = Arc::new(Active::start(s));
        let cancel = self.shutdown.child_token();
        let previous =
            std::mem::replace(&mut *self.events_cancel.lock().unwrap_or_else(|e| e.into_inner()), cancel.clone());
        previous.cancel();
        self.account.reset_announced(&self.cfg);
        let started = active.started;
        *lock_write(&self.scenario) = active;
        schedule(self, events, started, cancel);
    }

    /// An inbound customer text message: its webhook, the user's service window, and a unit of the number's
    /// throughput.
    pub(crate) fn inbound(&self, phone_number_id: &str, from: &str, name: &str, text: &str) -> Option<String> {
        let m = Inbound {
            phone_number_id: phone_number_id.to_string(),
            from: Some(from.to_string()),
            name: name.to_string(),
            text: text.to_string(),
            ..Inbound::default()
        };
        inbound(self, &m)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ban_dates_read_like_metas() {
        assert_eq!(super::long_date(0), "January 1, 1970");
        assert_eq!(super::long_date(1_744_848_000_000), "April 17, 2025");
    }
}
