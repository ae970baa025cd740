//! Scenario events: webhooks Meta sends about the account, its numbers, templates and users (reference §4.5,
//! §2.1 value-level errors, §6 user-id-only inbound messages), fired at an offset from the scenario start, and
//! what each does to the simulator's own state (see `account`), so the simulator goes on to enforce what it
//! announced. Every event is also accepted by `POST /_sim/events` (fired `at_ms` after the call).
//!
//! Parsing is strict: `kind` picks the event, and each kind takes only its own keys (plus `name`, `at_ms`).
//! Values the reference lists (account events, restriction types, template events, quality scores, alert
//! types...) are checked; `kind = "raw"` sends any `field` with any `value` (an unknown field, a new event).
//! `effect = false` announces without changing the simulator's state.
//!
//! ```toml
//! [[events]]
//! at_ms = 2000
//! kind = "account_update"                     # restriction until an expiration
//! event = "ACCOUNT_RESTRICTION"
//! restriction_type = "RESTRICTED_BIZ_INITIATED_MESSAGING"   # default
//! expires_in_ms = 60000                       # or expiration = <unix s>; omit both: until reinstated
//! waba_id = "102290129340398"                 # default: the config's waba_id
//! # code = 368                                # what restricted sends get (default 368)
//!
//! [[events]]
//! kind = "account_update"                     # a ban (sends get 131031), then a reinstatement
//! event = "DISABLED_UPDATE"
//! ban_state = "DISABLE"                       # DISABLE | REINSTATE | SCHEDULE_FOR_DISABLE
//!
//! [[events]]
//! kind = "business_capability_update"         # the portfolio's tier (the WABA's portfolio)
//! max_daily_conversations_per_business = "TIER_10K"   # or 10000, "10000", "UNLIMITED" (format UNCERTAIN)
//!
//! [[events]]
//! kind = "phone_number_quality_update"        # the number's throughput rises to throughput_mps
//! phone_number_id = "106540352242922"
//! event = "THROUGHPUT_UPGRADE"                # or ONBOARDING, and the legacy UPGRADE, DOWNGRADE, FLAGGED, UNFLAGGED
//! throughput_mps = 1000.0                     # default 1000 for THROUGHPUT_UPGRADE
//! maintenance_ms = 0                          # > 0: 131057 on that number for this long, then the upgrade
//! # max_daily_conversations_per_business = "TIER_100K"  # given: also the portfolio's new tier
//!
//! [[events]]
//! kind = "message_template_status_update"
//! template = "order_confirmation"
//! language = "en_US"                          # sent as "en-US", as Meta's webhooks spell it
//! event = "PAUSED"                            # APPROVED, REJECTED, DISABLED, REINSTATED, ARCHIVED, ...
//! title = "FIRST_PAUSE"                       # other_info.title: FIRST_PAUSE, SECOND_PAUSE,
//!                                             # RATE_LIMITING_PAUSE, UNPAUSE, DISABLED
//!
//! [[events]]
//! kind = "message_template_quality_update"
//! template = "welcome_template"
//! new_quality_score = "RED"                   # GREEN, YELLOW, RED, UNKNOWN
//!
//! [[events]]
//! kind = "template_category_update"
//! template = "welcome_template"
//! new_category = "MARKETING"
//! notice = true                               # the 24 h notice (correct_category); false: the change itself
//!
//! [[events]]
//! kind = "user_preferences"                   # marketing templates to this user fail 131050 until "resume"
//! phone_number_id = "106540352242922"
//! user = "+16505551234"                       # and/or user_id = "US.1349..."
//! value = "stop"
//!
//! [[events]]
//! kind = "account_alerts"
//! alert_type = "INCREASED_CAPABILITIES_ELIGIBILITY_DEFERRED"
//!
//! [[events]]
//! kind = "smb_message_echoes"                 # a message the business sent from the WhatsApp Business app
//! phone_number_id = "106540352242922"
//! to = "+16505551234"
//!
//! [[events]]
//! kind = "value_errors"                       # entry[].changes[].value.errors[] (field "messages")
//! phone_number_id = "106540352242922"
//! errors = [{ code = 130429 }]
//!
//! [[events]]
//! kind = "inbound"                            # a user message; opens the 24 h window
//! phone_number_id = "106540352242922"
//! from = "+16505551234"                       # omit, or hide_phone = true: a user-id-only webhook
//! from_user_id = "US.13491208655302741918"    # default: the directory's
//! error_code = 131052                         # optional: an unsupported message with errors[]
//!
//! [[events]]
//! kind = "template_pacing"                    # no webhook: sends answer held_for_quality_assessment
//! template = "flash_sale"
//! action = "hold"                             # or "release": the held messages' statuses follow
//!
//! [[events]]
//! kind = "system"                             # user_changed_number / user_changed_user_id (§6)
//! phone_number_id = "106540352242922"
//! system_type = "user_changed_number"
//! from = "+16505551234"
//! new_phone = "+16505559999"                  # user_changed_number only
//!
//! [[events]]
//! kind = "raw"
//! field = "some_new_field"
//! value = { anything = "goes" }
//! ```

use crate::limits::Tier;
use crate::templates::{check_category, template_status_effect};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// One scheduled event.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Event {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Offset from the scenario start (or from the admin call).
    pub at_ms: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Strict parsing: `name`, `at_ms`, and the keys of the event's `kind`, nothing else.
impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Event, D::Error> {
        use serde::de::Error as _;
        let mut v = Value::deserialize(d)?;
        let Some(map) = v.as_object_mut() else {
            return Err(D::Error::custom("an event must be a table like { kind = \"account_update\", ... }"));
        };
        let name = match map.remove("name") {
            None => String::new(),
            Some(Value::String(s)) => s,
            Some(other) => return Err(D::Error::custom(format!("event name must be a string, not {other}"))),
        };
        let at_ms = match map.remove("at_ms") {
            None => 0,
            Some(t) => t
                .as_u64()
                .ok_or_else(|| D::Error::custom(format!("event at_ms must be a non-negative integer, not {t}")))?,
        };
        let kind = serde_json::from_value::<EventKind>(v).map_err(|e| D::Error::custom(format!("event: {e}")))?;
        Ok(Event { name, at_ms, kind })
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn en_us() -> String {
    "en_US".into()
}

/// One error of a value-level error webhook.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ErrorSpec {
    pub code: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
}

/// What an event is (`kind`), with its keys.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EventKind {
    AccountUpdate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waba_id: Option<String>,
        event: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        restriction_type: Option<String>,
        /// Unix seconds.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expiration: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_in_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        remediation: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ban_state: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ban_date: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        violation_type: Option<String>,
        /// The code restricted or stopped sends get (default 368 for a restriction, 131031 for a stop).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i64>,
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        effect: bool,
    },
    BusinessCapabilityUpdate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waba_id: Option<String>,
        max_daily_conversations_per_business: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_phone_numbers_per_waba: Option<u64>,
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        effect: bool,
    },
    PhoneNumberQualityUpdate {
        phone_number_id: String,
        #[serde(default = "throughput_upgrade")]
        event: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        current_limit: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        old_limit: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_daily_conversations_per_business: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        throughput_mps: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        maintenance_ms: Option<u64>,
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        effect: bool,
    },
    AccountAlerts {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waba_id: Option<String>,
        alert_type: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entity_type: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entity_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alert_severity: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alert_status: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alert_description: Option<String>,
    },
    MessageTemplateStatusUpdate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waba_id: Option<String>,
        template: String,
        #[serde(default = "en_us")]
        language: String,
        event: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        template_id: Option<u64>,
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        effect: bool,
    },
    MessageTemplateQualityUpdate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waba_id: Option<String>,
        template: String,
        #[serde(default = "en_us")]
        language: String,
        new_quality_score: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_quality_score: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        template_id: Option<u64>,
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        effect: bool,
    },
    TemplateCategoryUpdate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waba_id: Option<String>,
        template: String,
        #[serde(default = "en_us")]
        language: String,
        new_category: String,
        /// The 24 h notice (no state change) instead of the change.
        #[serde(default, skip_serializing_if = "is_false")]
        notice: bool,
        /// The notice's `category_update_timestamp` is this far ahead (default 24 h).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        notice_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        template_id: Option<u64>,
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        effect: bool,
    },
    UserPreferences {
        phone_number_id: String,
        /// The user's phone number.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_id: Option<String>,
        value: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        category: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        effect: bool,
    },
    SmbMessageEchoes {
        phone_number_id: String,
        to: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        effect: bool,
    },
    ValueErrors {
        phone_number_id: String,
        errors: Vec<ErrorSpec>,
    },
    Inbound {
        phone_number_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_user_id: Option<String>,
        /// The webhook carries the user id only (`from` and `wa_id` absent), as for a user with a username.
        #[serde(default, skip_serializing_if = "is_false")]
        hide_phone: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        username: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// An unsupported message carrying `errors[]` with this code (e.g. 131052).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_code: Option<i64>,
    },
    /// Template pacing (reference §3.5), which Meta announces in the send answer, not by webhook: `hold` makes
    /// sends of the template answer `message_status: "held_for_quality_assessment"` and withholds their
    /// statuses; `release` sends the held messages' statuses (good feedback). A `PAUSED` status event drops the
    /// held messages as `failed` 132015 (`DISABLED`: 132016).
    TemplatePacing {
        template: String,
        #[serde(default = "en_us")]
        language: String,
        action: String,
    },
    /// A system message (reference §6): `user_changed_number` (with the new phone) or `user_changed_user_id`
    /// (only the user id changed). No `contacts` array.
    System {
        phone_number_id: String,
        system_type: String,
        /// The user's phone before the change.
        from: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        new_phone: Option<String>,
        /// The new user id (default: derived for the new phone, or a fresh one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
    },
    Raw {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        waba_id: Option<String>,
        field: String,
        value: Value,
    },
}

fn throughput_upgrade() -> String {
    "THROUGHPUT_UPGRADE".into()
}

/// `event` values of `account_update` (reference §4.5).
pub const ACCOUNT_EVENTS: &[&str] = &[
    "ACCOUNT_RESTRICTION",
    "DISABLED_UPDATE",
    "ACCOUNT_VIOLATION",
    "ACCOUNT_DELETED",
    "PARTNER_REMOVED",
    "PARTNER_APP_UNINSTALLED",
    "ACCOUNT_OFFBOARDED",
    "ACCOUNT_RECONNECTED",
    "VOLUME_BASED_PRICING_TIER_UPDATE",
    "PARTNER_ADDED",
    "AD_ACCOUNT_LINKED",
    "MM_LITE_TERMS_SIGNED",
    "AUTH_INTL_PRICE_ELIGIBILITY_UPDATE",
    "BUSINESS_PRIMARY_LOCATION_COUNTRY_UPDATE",
    "PARTNER_CLIENT_CERTIFICATION_STATUS_UPDATE",
];

/// Named restriction types; the reference also mentions unnamed "calling types", so any `RESTRICTED_*` passes.
pub const RESTRICTION_TYPES: &[&str] = &[
    "RESTRICTED_BIZ_INITIATED_MESSAGING",
    "RESTRICTED_CUSTOMER_INITIATED_MESSAGING",
    "RESTRICTED_DIRECT_SEND_UTILITY_TEMPLATES",
    "RESTRICTED_UTILITY_TEMPLATES",
    "RESTRICTED_ADD_PHONE_NUMBER_ACTION",
];

pub const BAN_STATES: &[&str] = &["DISABLE", "REINSTATE", "SCHEDULE_FOR_DISABLE"];
pub const QUALITY_EVENTS: &[&str] =
    &["THROUGHPUT_UPGRADE", "ONBOARDING", "UPGRADE", "DOWNGRADE", "FLAGGED", "UNFLAGGED"];
pub const ALERT_TYPES: &[&str] = &[
    "INCREASED_CAPABILITIES_ELIGIBILITY_DEFERRED",
    "INCREASED_CAPABILITIES_ELIGIBILITY_FAILED",
    "INCREASED_CAPABILITIES_ELIGIBILITY_NEED_MORE_INFO",
    "OBA_APPROVED",
    "OBA_REJECTED",
    "PROFILE_PICTURE_LOST",
];
pub const ENTITY_TYPES: &[&str] = &["BUSINESS", "PHONE_NUMBER", "CURRENT_STATUS_ID"];
pub const PAUSE_TITLES: &[&str] = &["FIRST_PAUSE", "SECOND_PAUSE", "RATE_LIMITING_PAUSE", "UNPAUSE", "DISABLED"];
pub const QUALITY_SCORES: &[&str] = &["GREEN", "YELLOW", "RED", "UNKNOWN"];

fn one_of(what: &str, v: &str, allowed: &[&str]) -> Result<(), String> {
    if allowed.contains(&v) { Ok(()) } else { Err(format!("{what} `{v}` is not one of {}", allowed.join(", "))) }
}

impl EventKind {
    /// The webhook field this event is sent under.
    pub fn field(&self) -> &str {
        match self {
            EventKind::AccountUpdate { .. } => "account_update",
            EventKind::BusinessCapabilityUpdate { .. } => "business_capability_update",
            EventKind::PhoneNumberQualityUpdate { .. } => "phone_number_quality_update",
            EventKind::AccountAlerts { .. } => "account_alerts",
            EventKind::MessageTemplateStatusUpdate { .. } => "message_template_status_update",
            EventKind::MessageTemplateQualityUpdate { .. } => "message_template_quality_update",
            EventKind::TemplateCategoryUpdate { .. } => "template_category_update",
            EventKind::UserPreferences { .. } => "user_preferences",
            EventKind::SmbMessageEchoes { .. } => "smb_message_echoes",
            EventKind::ValueErrors { .. } | EventKind::Inbound { .. } | EventKind::System { .. } => "messages",
            EventKind::TemplatePacing { .. } => "",
            EventKind::Raw { field, .. } => field,
        }
    }

    /// The `kind` key.
    pub fn kind_name(&self) -> &'static str {
        match self {
            EventKind::AccountUpdate { .. } => "account_update",
            EventKind::BusinessCapabilityUpdate { .. } => "business_capability_update",
            EventKind::PhoneNumberQualityUpdate { .. } => "phone_number_quality_update",
            EventKind::AccountAlerts { .. } => "account_alerts",
            EventKind::MessageTemplateStatusUpdate { .. } => "message_template_status_update",
            EventKind::MessageTemplateQualityUpdate { .. } => "message_template_quality_update",
            EventKind::TemplateCategoryUpdate { .. } => "template_category_update",
            EventKind::UserPreferences { .. } => "user_preferences",
            EventKind::SmbMessageEchoes { .. } => "smb_message_echoes",
            EventKind::ValueErrors { .. } => "value_errors",
            EventKind::Inbound { .. } => "inbound",
            EventKind::TemplatePacing { .. } => "template_pacing",
            EventKind::System { .. } => "system",
            EventKind::Raw { .. } => "raw",
        }
    }

    /// A precise complaint about the first invalid value.
    pub fn validate(&self) -> Result<(), String> {
        let digits = |s: &str| crate::ids::wa_id(s).len() >= 7;
        match self {
            EventKind::AccountUpdate {
                event,
                restriction_type,
                ban_state,
                violation_type,
                expiration,
                expires_in_ms,
                ..
            } => {
                one_of("account_update event", event, ACCOUNT_EVENTS)?;
                if let Some(rt) = restriction_type {
                    if event != "ACCOUNT_RESTRICTION" {
                        return Err("restriction_type belongs to event ACCOUNT_RESTRICTION".into());
                    }
                    if !rt.starts_with("RESTRICTED_") {
                        one_of("restriction_type", rt, RESTRICTION_TYPES)?;
                    }
                }
                if expiration.is_some() && expires_in_ms.is_some() {
                    return Err("set expiration or expires_in_ms, not both".into());
                }
                if (expiration.is_some() || expires_in_ms.is_some()) && event != "ACCOUNT_RESTRICTION" {
                    return Err("expiration belongs to event ACCOUNT_RESTRICTION".into());
                }
                if let Some(b) = ban_state {
                    if event != "DISABLED_UPDATE" {
                        return Err("ban_state belongs to event DISABLED_UPDATE".into());
                    }
                    one_of("ban_state", b, BAN_STATES)?;
                }
                if event == "ACCOUNT_VIOLATION" && violation_type.is_none() {
                    return Err("event ACCOUNT_VIOLATION needs violation_type".into());
                }
            }
            EventKind::BusinessCapabilityUpdate { max_daily_conversations_per_business, .. } => {
                Tier::from_json(max_daily_conversations_per_business)?;
            }
            EventKind::PhoneNumberQualityUpdate {
                event,
                throughput_mps,
                max_daily_conversations_per_business,
                current_limit,
                old_limit,
                ..
            } => {
                one_of("phone_number_quality_update event", event, QUALITY_EVENTS)?;
                if let Some(mps) = throughput_mps
                    && !(mps.is_finite() && *mps > 0.0)
                {
                    return Err(format!("throughput_mps must be positive, not {mps}"));
                }
                if throughput_mps.is_some() && event != "THROUGHPUT_UPGRADE" {
                    return Err("throughput_mps belongs to event THROUGHPUT_UPGRADE".into());
                }
                for v in [max_daily_conversations_per_business, current_limit, old_limit].into_iter().flatten() {
                    Tier::from_json(v)?;
                }
            }
            EventKind::AccountAlerts { alert_type, entity_type, .. } => {
                one_of("alert_type", alert_type, ALERT_TYPES)?;
                if let Some(e) = entity_type {
                    one_of("entity_type", e, ENTITY_TYPES)?;
                }
            }
            EventKind::MessageTemplateStatusUpdate { template, event, title, .. } => {
                if template.is_empty() {
                    return Err("template must not be empty".into());
                }
                template_status_effect(event)?;
                if let Some(t) = title {
                    one_of("title", t, PAUSE_TITLES)?;
                }
            }
            EventKind::MessageTemplateQualityUpdate { template, new_quality_score, previous_quality_score, .. } => {
                if template.is_empty() {
                    return Err("template must not be empty".into());
                }
                one_of("new_quality_score", new_quality_score, QUALITY_SCORES)?;
                if let Some(p) = previous_quality_score {
                    one_of("previous_quality_score", p, QUALITY_SCORES)?;
                }
            }
            EventKind::TemplateCategoryUpdate { template, new_category, .. } => {
                if template.is_empty() {
                    return Err("template must not be empty".into());
                }
                check_category(new_category)?;
            }
            EventKind::UserPreferences { user, user_id, value, category, .. } => {
                one_of("value", value, &["stop", "resume"])?;
                if let Some(c) = category {
                    one_of("category", c, &["marketing_messages"])?;
                }
                if user.is_none() && user_id.is_none() {
                    return Err("user_preferences needs user (a phone number) or user_id".into());
                }
                if user.as_deref().is_some_and(|u| !digits(u)) {
                    return Err("user is not a phone number".into());
                }
                if user_id.as_deref().is_some_and(|u| !crate::ids::is_user_id(u)) {
                    return Err("user_id is not a business-scoped user id".into());
                }
            }
            EventKind::SmbMessageEchoes { to, .. } => {
                if !digits(to) {
                    return Err("to is not a phone number".into());
                }
            }
            EventKind::ValueErrors { errors, .. } => {
                if errors.is_empty() {
                    return Err("value_errors needs at least one error".into());
                }
            }
            EventKind::Inbound { from, from_user_id, hide_phone, .. } => {
                if from.is_none() && from_user_id.is_none() {
                    return Err("inbound needs from (a phone number) or from_user_id".into());
                }
                if from.as_deref().is_some_and(|f| !digits(f)) {
                    return Err("from is not a phone number".into());
                }
                if from_user_id.as_deref().is_some_and(|u| !crate::ids::is_user_id(u)) {
                    return Err("from_user_id is not a business-scoped user id".into());
                }
                if *hide_phone && from.is_none() {
                    return Err("hide_phone needs from (the phone to hide)".into());
                }
            }
            EventKind::TemplatePacing { template, action, .. } => {
                if template.is_empty() {
                    return Err("template must not be empty".into());
                }
                one_of("action", action, &["hold", "release"])?;
            }
            EventKind::System { system_type, from, new_phone, user_id, .. } => {
                one_of("system_type", system_type, &["user_changed_number", "user_changed_user_id"])?;
                if !digits(from) {
                    return Err("from is not a phone number".into());
                }
                match (system_type.as_str(), new_phone) {
                    ("user_changed_number", None) => return Err("user_changed_number needs new_phone".into()),
                    ("user_changed_user_id", Some(_)) => {
                        return Err("user_changed_user_id keeps the phone: drop new_phone".into());
                    }
                    (_, Some(p)) if !digits(p) => return Err("new_phone is not a phone number".into()),
                    _ => {}
                }
                if user_id.as_deref().is_some_and(|u| !crate::ids::is_user_id(u)) {
                    return Err("user_id is not a business-scoped user id".into());
                }
            }
            EventKind::Raw { field, .. } => {
                if field.is_empty() {
                    return Err("field must not be empty".into());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_strictly_and_round_trip() {
        let text = r#"
            [[events]]
            at_ms = 5
            name = "restrict"
            kind = "account_update"
            event = "ACCOUNT_RESTRICTION"
            expires_in_ms = 1000
            [[events]]
            kind = "business_capability_update"
            max_daily_conversations_per_business = 2000
            [[events]]
            kind = "raw"
            field = "brand_new"
            value = { a = 1 }
        "#;
        #[derive(Deserialize)]
        struct Doc {
            events: Vec<Event>,
        }
        let doc: Doc = toml::from_str(text).expect("parses");
        assert_eq!(doc.events.len(), 3);
        assert_eq!((doc.events[0].at_ms, doc.events[0].name.as_str()), (5, "restrict"));
        assert!(doc.events.iter().all(|e| e.kind.validate().is_ok()));
        let json = serde_json::to_string(&doc.events[0]).expect("serializes");
        let back: Event = serde_json::from_str(&json).expect("reparses");
        assert_eq!(back, doc.events[0]);

        let err = toml::from_str::<Doc>("[[events]]\nkind = \"account_update\"\nevent = \"X\"\nexpiry = 5\n")
            .err()
            .expect("unknown key");
        assert!(err.to_string().contains("expiry"), "{err}");
        let bad = EventKind::AccountUpdate {
            waba_id: None,
            event: "ACCOUNT_RESTRICTON".into(),
            restriction_type: None,
            expiration: None,
            expires_in_ms: None,
            remediation: None,
            ban_state: None,
            ban_date: None,
            violation_type: None,
            code: None,
            effect: true,
        };
        assert!(bad.validate().expect_err("typo").contains("ACCOUNT_RESTRICTION"));
    }
}
