//! Meta's account, number, portfolio and template signals: the webhook fields beyond `messages` and every
//! value-level `errors[]` item (meta-cloud-api.md §4.4, §4.5), parsed from a stored delivery into typed
//! `AccountSignal`s and published on `bw.account.v1.<field>.<waba_id>` (stream BW_ACCOUNT), where the
//! coordinator applies them to the pause state and raises the operator alerts.
//!
//! Persistence is the one statuses have: the HTTP handler stores the signed body in BW_WEBHOOKS before its 200,
//! and the processor calls [`Processor::account_signals`] for a delivery that holds a change of another field or
//! a value-level error. A publish that fails redelivers the whole delivery (statuses are idempotent); each
//! signal's message id is a hash of its content, so a repeat within the stream's window is dropped and a later
//! one is applied idempotently (a pause only extends, an alert deduplicates).
//!
//! Bad input loses nothing and never stops the consumer: a malformed change is logged with a precise error (the
//! field and the path of what is wrong, never the value: it may hold a phone number), counted, and its raw
//! `value` kept in BW_REJECTED (`bw.rejected.v1.webhook_field`); the other changes of the delivery go on. A
//! field Breakwater does not act on is published as `UnknownWebhookField` (its value's top-level keys only),
//! kept raw the same way, and counted: never refused (Meta would retry it for 7 days).
//!
//! No personal data leaves this module: users are named by the hash of their recipient key, wamids by their
//! hash, a display phone number is dropped, and free text from Meta is cut to 200 characters with every run of
//! 7 or more digits replaced (a description may quote a number).

use crate::processing::Processor;
use crate::webhook::scrub;
use bw_proto::v1::account_signal::Kind;
use bw_proto::v1::{
    AccountAlert, AccountBanState, AccountEvent, AccountRestriction, AccountSignal, MessageEcho, MessagingLimitChange,
    TemplateCategoryChange, TemplateQualityChange, TemplateStatusChange, ThroughputChange, UnknownWebhookField,
    UserPreference, WebhookValueError,
};
use bw_wire::names;
use prost::Message as _;
use serde_json::{Map, Value};

/// The fields of meta-cloud-api.md §4.5 a sender must react to, parsed into typed signals.
pub const SIGNAL_FIELDS: [&str; 9] = [
    "account_update",
    "business_capability_update",
    "phone_number_quality_update",
    "account_alerts",
    "message_template_status_update",
    "message_template_quality_update",
    "template_category_update",
    "user_preferences",
    "smb_message_echoes",
];

/// Fields the reference names that Breakwater does not act on yet: stored and counted under their own name.
/// Any other field is counted as `other` (metric labels stay bounded whatever Meta sends).
const NAMED_OTHER_FIELDS: [&str; 11] = [
    "account_review_update",
    "phone_number_name_update",
    "security",
    "history",
    "smb_app_state_sync",
    "automatic_events",
    "partner_solutions",
    "payment_configuration_update",
    "message_template_components_update",
    "business_username_update",
    "business_status_update",
];

/// Keys of an unknown value kept in its signal, at most.
const UNKNOWN_KEYS: usize = 32;

/// The metric label of a field: its own name when the reference names it, else `other`.
pub fn field_label(field: &str) -> &'static str {
    SIGNAL_FIELDS
        .iter()
        .chain(NAMED_OTHER_FIELDS.iter())
        .chain(["messages"].iter())
        .find(|f| **f == field)
        .copied()
        .unwrap_or("other")
}

/// What is wrong in one change, precisely enough to find it in the raw body; never the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("webhook field `{field}`: `{path}` {problem}")]
pub struct FieldError {
    /// The field's metric label ([`field_label`]): a hostile field name is not echoed either.
    pub field: &'static str,
    pub path: String,
    pub problem: &'static str,
}

/// One signal ready to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub subject: String,
    /// `Nats-Msg-Id`: a hash of the field, WABA, value and the item's index in it.
    pub msg_id: String,
    pub signal: AccountSignal,
}

/// A change kept raw in BW_REJECTED: unknown or malformed.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub label: &'static str,
    pub msg_id: String,
    pub raw: String,
    /// The precise error of a malformed change; None for an unknown field.
    pub error: Option<FieldError>,
}

/// Everything of one delivery beyond statuses and inbound messages.
#[derive(Debug, Default, PartialEq)]
pub struct Extracted {
    pub items: Vec<Item>,
    pub kept: Vec<Kept>,
}

/// Parses the changes of a webhook body into signals. `Err` only when the body is not a JSON object (the
/// processor has refused such a body before this is called).
pub fn extract(body: &[u8], webhook_sha256: &str, at_unix_ms: i64) -> Result<Extracted, String> {
    let root: Value = serde_json::from_slice(body).map_err(|e| format!("webhook body is not valid json: {e}"))?;
    let mut out = Extracted::default();
    let entries = root.get("entry").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    for entry in entries {
        let waba_id = id_text(entry.get("id")).unwrap_or_default();
        let meta_time = entry.get("time").and_then(|t| seconds(t).ok()).unwrap_or(0);
        let changes = entry.get("changes").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        for change in changes {
            let field = change.get("field").and_then(Value::as_str).unwrap_or_default();
            let Some(value) = change.get("value") else { continue };
            let base = AccountSignal {
                field: field.to_string(),
                waba_id: waba_id.clone(),
                phone_number_id: phone_number_id(value),
                at_unix_ms,
                meta_time_unix_s: meta_time,
                webhook_sha256: webhook_sha256.to_string(),
                kind: None,
            };
            let content = format!("{field}|{waba_id}|{value}");
            let push = |kinds: Vec<Kind>, offset: usize, out: &mut Extracted| {
                for (i, kind) in kinds.into_iter().enumerate() {
                    out.items.push(Item {
                        subject: names::account_subject(field, &waba_id),
                        msg_id: format!("acct.{}", hash(&format!("{content}|{}", offset + i))),
                        signal: AccountSignal { kind: Some(kind), ..base.clone() },
                    });
                }
            };
            let label = field_label(field);
            // Value-level errors may come under any field (`messages` above all).
            let errors = value_errors(label, value);
            let first = match &errors {
                Ok(kinds) => kinds.len(),
                Err(_) => 0,
            };
            let parsed = match errors {
                Ok(kinds) => {
                    push(kinds, 0, &mut out);
                    if field == "messages" {
                        continue;
                    }
                    parse_change(label, value)
                }
                Err(e) => Err(e),
            };
            match parsed {
                Ok(Some(kinds)) => push(kinds, first, &mut out),
                Ok(None) => {
                    let keys = value
                        .as_object()
                        .map(|m| m.keys().take(UNKNOWN_KEYS).map(|k| word_or_underscore(k)).collect())
                        .unwrap_or_default();
                    push(vec![Kind::Unknown(UnknownWebhookField { value_keys: keys })], first, &mut out);
                    out.kept.push(Kept {
                        label,
                        msg_id: format!("acct.raw.{}", hash(&content)),
                        raw: value.to_string(),
                        error: None,
                    });
                }
                Err(error) => out.kept.push(Kept {
                    label,
                    msg_id: format!("acct.raw.{}", hash(&content)),
                    raw: value.to_string(),
                    error: Some(error),
                }),
            }
        }
    }
    Ok(out)
}

/// The typed signals of one change of a known field; `None` for a field Breakwater does not act on.
fn parse_change(label: &'static str, value: &Value) -> Result<Option<Vec<Kind>>, FieldError> {
    let p = Parser { field: label };
    let kinds = match label {
        "account_update" => p.account_update(value)?,
        "business_capability_update" => vec![Kind::MessagingLimit(p.messaging_limit(p.object(value, "value")?)?)],
        "phone_number_quality_update" => p.throughput(value)?,
        "account_alerts" => vec![Kind::Alert(p.alert(value)?)],
        "message_template_status_update" => vec![Kind::TemplateStatus(p.template_status(value)?)],
        "message_template_quality_update" => vec![Kind::TemplateQuality(p.template_quality(value)?)],
        "template_category_update" => vec![Kind::TemplateCategory(p.template_category(value)?)],
        "user_preferences" => p.user_preferences(value)?,
        "smb_message_echoes" => p.echoes(value)?,
        _ => return Ok(None),
    };
    Ok(Some(kinds))
}

/// `value.errors[]` of any field.
fn value_errors(label: &'static str, value: &Value) -> Result<Vec<Kind>, FieldError> {
    let p = Parser { field: label };
    let Some(errors) = value.as_object().and_then(|m| m.get("errors")) else { return Ok(Vec::new()) };
    let list = p.array(errors, "errors")?;
    let mut out = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let path = format!("errors[{i}]");
        let m = p.object(e, &path)?;
        let code = p.int(m, &path, "code")?.ok_or_else(|| p.error(format!("{path}.code"), "is missing"))?;
        let details = match m.get("error_data") {
            Some(d) if !d.is_null() => p.text(p.object(d, &format!("{path}.error_data"))?, &path, "details")?,
            _ => String::new(),
        };
        out.push(Kind::ValueError(WebhookValueError { code, title: p.text(m, &path, "title")?, details }));
    }
    Ok(out)
}

/// Reads typed values out of a change, each failure naming its path.
struct Parser {
    field: &'static str,
}

impl Parser {
    fn error(&self, path: impl Into<String>, problem: &'static str) -> FieldError {
        FieldError { field: self.field, path: path.into(), problem }
    }

    fn object<'a>(&self, v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, FieldError> {
        v.as_object().ok_or_else(|| self.error(path, "is not an object"))
    }

    fn array<'a>(&self, v: &'a Value, path: &str) -> Result<&'a Vec<Value>, FieldError> {
        v.as_array().ok_or_else(|| self.error(path, "is not an array"))
    }

    fn path(at: &str, key: &str) -> String {
        if at.is_empty() { key.to_string() } else { format!("{at}.{key}") }
    }

    /// An enumeration word of Meta's (`ACCOUNT_RESTRICTION`, `stop`, `en-US`): `[A-Za-z0-9_.-]`, 1 to 64
    /// characters; absent or null → empty.
    fn word(&self, m: &Map<String, Value>, at: &str, key: &str) -> Result<String, FieldError> {
        match m.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) if is_word(s) => Ok(s.clone()),
            Some(Value::String(_)) => {
                Err(self.error(Self::path(at, key), "is not a word of [A-Za-z0-9_.-], 1-64 chars"))
            }
            Some(_) => Err(self.error(Self::path(at, key), "is not a string")),
        }
    }

    fn required_word(&self, m: &Map<String, Value>, at: &str, key: &str) -> Result<String, FieldError> {
        let w = self.word(m, at, key)?;
        if w.is_empty() {
            return Err(self.error(Self::path(at, key), "is missing"));
        }
        Ok(w)
    }

    /// Free text: cut and scrubbed ([`scrub`]); absent or null → empty.
    fn text(&self, m: &Map<String, Value>, at: &str, key: &str) -> Result<String, FieldError> {
        match m.get(key) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(scrub(s)),
            Some(_) => Err(self.error(Self::path(at, key), "is not a string")),
        }
    }

    /// An integer given as a JSON number or a string of digits (Meta uses both); absent or null → None.
    fn int(&self, m: &Map<String, Value>, at: &str, key: &str) -> Result<Option<i64>, FieldError> {
        match m.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => seconds(v).map(Some).map_err(|problem| self.error(Self::path(at, key), problem)),
        }
    }

    fn account_update(&self, value: &Value) -> Result<Vec<Kind>, FieldError> {
        let m = self.object(value, "value")?;
        let event = self.required_word(m, "", "event")?;
        match event.as_str() {
            "ACCOUNT_RESTRICTION" => {
                let list = match m.get("restriction_info") {
                    None | Some(Value::Null) => &Vec::new(),
                    Some(v) => self.array(v, "restriction_info")?,
                };
                if list.is_empty() {
                    // No restriction named: nothing to pause; shown as the event itself.
                    return Ok(vec![Kind::AccountEvent(AccountEvent { event, detail: "no restriction_info".into() })]);
                }
                let mut out = Vec::with_capacity(list.len());
                for (i, r) in list.iter().enumerate() {
                    let at = format!("restriction_info[{i}]");
                    let r = self.object(r, &at)?;
                    out.push(Kind::Restriction(AccountRestriction {
                        restriction_type: self.required_word(r, &at, "restriction_type")?,
                        expiration_unix_s: self.int(r, &at, "expiration")?.unwrap_or(0),
                        remediation: self.text(r, &at, "remediation")?,
                    }));
                }
                Ok(out)
            }
            "DISABLED_UPDATE" => {
                let ban = m.get("ban_info").ok_or_else(|| self.error("ban_info", "is missing"))?;
                let ban = self.object(ban, "ban_info")?;
                Ok(vec![Kind::Ban(AccountBanState {
                    ban_state: self.required_word(ban, "ban_info", "waba_ban_state")?,
                    ban_date: self.text(ban, "ban_info", "waba_ban_date")?,
                })])
            }
            _ => {
                let detail = match m.get("violation_info") {
                    Some(v) if !v.is_null() => {
                        self.word(self.object(v, "violation_info")?, "violation_info", "violation_type")?
                    }
                    _ => String::new(),
                };
                Ok(vec![Kind::AccountEvent(AccountEvent { event, detail })])
            }
        }
    }

    /// The portfolio's limit, from `max_daily_conversations_per_business` (or the legacy per-phone key).
    fn messaging_limit(&self, m: &Map<String, Value>) -> Result<MessagingLimitChange, FieldError> {
        let (key, raw) = match ["max_daily_conversations_per_business", "max_daily_conversation_per_phone"]
            .into_iter()
            .find_map(|k| m.get(k).filter(|v| !v.is_null()).map(|v| (k, v)))
        {
            Some(found) => found,
            None => ("", &Value::Null),
        };
        let (unique, raw) = match raw {
            Value::Null => (0, String::new()),
            Value::String(s) if is_word(s) => (bw_breaker::budget::tier_users(s), s.clone()),
            Value::Number(n) => {
                let n = n.as_i64().ok_or_else(|| self.error(key, "is not an integer"))?;
                (if n < 0 { -1 } else { n }, n.to_string())
            }
            _ => return Err(self.error(key, "is not a tier word or an integer")),
        };
        let phones = ["max_phone_numbers_per_waba", "max_phone_numbers_per_business"]
            .into_iter()
            .map(|k| self.int(m, "", k))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .flatten()
            .next()
            .unwrap_or(0);
        Ok(MessagingLimitChange {
            unique_users_per_24h: unique,
            raw,
            portfolio_id: String::new(),
            max_phone_numbers_per_waba: u32::try_from(phones.max(0)).unwrap_or(u32::MAX),
        })
    }

    fn throughput(&self, value: &Value) -> Result<Vec<Kind>, FieldError> {
        let m = self.object(value, "value")?;
        let event = self.required_word(m, "", "event")?;
        // Since October 2025 THROUGHPUT_UPGRADE means 1,000 messages per second (reference §3.1, §4.5).
        let mps = if event == "THROUGHPUT_UPGRADE" { 1000 } else { 0 };
        let mut out = vec![Kind::Throughput(ThroughputChange {
            mps,
            current_limit: self.word(m, "", "current_limit")?,
            old_limit: self.word(m, "", "old_limit")?,
            event,
        })];
        // The portfolio's tier rides along on this field too.
        if m.get("max_daily_conversations_per_business").is_some_and(|v| !v.is_null()) {
            out.push(Kind::MessagingLimit(self.messaging_limit(m)?));
        }
        Ok(out)
    }

    fn alert(&self, value: &Value) -> Result<AccountAlert, FieldError> {
        let m = self.object(value, "value")?;
        let info = m.get("alert_info").ok_or_else(|| self.error("alert_info", "is missing"))?;
        let info = self.object(info, "alert_info")?;
        let entity_id = match m.get("entity_id") {
            None | Some(Value::Null) => String::new(),
            v => id_text(v).ok_or_else(|| self.error("entity_id", "is not an id of [A-Za-z0-9_.-]"))?,
        };
        Ok(AccountAlert {
            entity_type: self.word(m, "", "entity_type")?,
            entity_id,
            severity: self.word(info, "alert_info", "alert_severity")?,
            status: self.word(info, "alert_info", "alert_status")?,
            alert_type: self.required_word(info, "alert_info", "alert_type")?,
            description: self.text(info, "alert_info", "alert_description")?,
        })
    }

    /// Template id, name and language (normalised to the send form `en_US`).
    fn template(&self, m: &Map<String, Value>) -> Result<(i64, String, String), FieldError> {
        let id = self.int(m, "", "message_template_id")?.unwrap_or(0);
        let name = self.word(m, "", "message_template_name")?;
        if id == 0 && name.is_empty() {
            return Err(self.error("message_template_id", "and message_template_name are both missing"));
        }
        Ok((id, name, self.word(m, "", "message_template_language")?.replace('-', "_")))
    }

    fn template_status(&self, value: &Value) -> Result<TemplateStatusChange, FieldError> {
        let m = self.object(value, "value")?;
        let (template_id, template_name, template_language) = self.template(m)?;
        let other_title = match m.get("other_info") {
            Some(v) if !v.is_null() => self.word(self.object(v, "other_info")?, "other_info", "title")?,
            _ => String::new(),
        };
        Ok(TemplateStatusChange {
            event: self.required_word(m, "", "event")?,
            template_id,
            template_name,
            template_language,
            reason: self.text(m, "", "reason")?,
            category: self.word(m, "", "message_template_category")?,
            other_title,
        })
    }

    fn template_quality(&self, value: &Value) -> Result<TemplateQualityChange, FieldError> {
        let m = self.object(value, "value")?;
        let (template_id, template_name, template_language) = self.template(m)?;
        Ok(TemplateQualityChange {
            template_id,
            template_name,
            template_language,
            previous_quality: self.word(m, "", "previous_quality_score")?,
            new_quality: self.required_word(m, "", "new_quality_score")?,
        })
    }

    fn template_category(&self, value: &Value) -> Result<TemplateCategoryChange, FieldError> {
        let m = self.object(value, "value")?;
        let (template_id, template_name, template_language) = self.template(m)?;
        Ok(TemplateCategoryChange {
            template_id,
            template_name,
            template_language,
            previous_category: self.word(m, "", "previous_category")?,
            new_category: self.required_word(m, "", "new_category")?,
            correct_category: self.word(m, "", "correct_category")?,
            takes_effect_unix_s: self.int(m, "", "category_update_timestamp")?.unwrap_or(0),
        })
    }

    /// The hash of the user an item names: its phone (`wa_id_key`) or, without one, its business-scoped id.
    fn user_hash(&self, m: &Map<String, Value>, at: &str, wa_id_key: &str) -> Result<String, FieldError> {
        match (m.get(wa_id_key), m.get("user_id")) {
            (Some(Value::String(phone)), _) if phone.chars().any(|c| c.is_ascii_digit()) => {
                Ok(bw_common::mask::recipient_key(phone))
            }
            (Some(v), _) if !v.is_null() => Err(self.error(Self::path(at, wa_id_key), "is not a phone number")),
            (_, Some(Value::String(id))) if bw_common::mask::is_user_id(id) => Ok(bw_common::mask::recipient_key(id)),
            (_, Some(Value::String(id))) if !id.is_empty() => {
                Err(self.error(Self::path(at, "user_id"), "is not a business-scoped user id"))
            }
            _ => Err(self.error(Self::path(at, wa_id_key), "and user_id are both missing")),
        }
    }

    fn user_preferences(&self, value: &Value) -> Result<Vec<Kind>, FieldError> {
        let m = self.object(value, "value")?;
        let list = m.get("user_preferences").ok_or_else(|| self.error("user_preferences", "is missing"))?;
        let list = self.array(list, "user_preferences")?;
        let mut out = Vec::with_capacity(list.len());
        for (i, p) in list.iter().enumerate() {
            let at = format!("user_preferences[{i}]");
            let p = self.object(p, &at)?;
            out.push(Kind::UserPreference(UserPreference {
                recipient_key_hash: self.user_hash(p, &at, "wa_id")?,
                category: self.word(p, &at, "category")?,
                value: self.required_word(p, &at, "value")?,
                timestamp_unix_s: self.int(p, &at, "timestamp")?.unwrap_or(0),
            }));
        }
        Ok(out)
    }

    fn echoes(&self, value: &Value) -> Result<Vec<Kind>, FieldError> {
        let m = self.object(value, "value")?;
        let list = m.get("message_echoes").ok_or_else(|| self.error("message_echoes", "is missing"))?;
        let list = self.array(list, "message_echoes")?;
        let mut out = Vec::with_capacity(list.len());
        for (i, e) in list.iter().enumerate() {
            let at = format!("message_echoes[{i}]");
            let e = self.object(e, &at)?;
            // A wamid encodes the recipient's number: only its hash is kept (as the ledger's wamid links).
            let wamid = match e.get("id") {
                Some(Value::String(id)) if !id.is_empty() => bw_common::ledger::wamid_key(id),
                _ => String::new(),
            };
            out.push(Kind::Echo(MessageEcho {
                recipient_key_hash: self.user_hash(e, &at, "to")?,
                wamid,
                timestamp_unix_s: self.int(e, &at, "timestamp")?.unwrap_or(0),
            }));
        }
        Ok(out)
    }
}

fn is_word(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn word_or_underscore(s: &str) -> String {
    if is_word(s) { s.to_string() } else { "_".into() }
}

/// An id given as a string or a number (`entry[].id`, `entity_id`), when it is a plain word.
fn id_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if is_word(s) => Some(s.clone()),
        Value::Number(n) if n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// `value.metadata.phone_number_id` when present and a plain id.
fn phone_number_id(value: &Value) -> String {
    id_text(value.get("metadata").and_then(|m| m.get("phone_number_id"))).unwrap_or_default()
}

/// Seconds (or any integer) as Meta sends them: a number or a string of digits.
fn seconds(v: &Value) -> Result<i64, &'static str> {
    match v {
        Value::Number(n) => n.as_i64().ok_or("is not an integer"),
        Value::String(s) => s.trim().parse().map_err(|_| "is not an integer or a string of digits"),
        _ => Err("is not an integer or a string of digits"),
    }
}

fn hash(s: &str) -> String {
    crate::webhook::body_sha256(s.as_bytes())
}

/// Source of raw unknown and malformed changes in BW_REJECTED.
pub const REJECTED_SOURCE: &str = "webhook_field";

impl Processor {
    /// Publishes the account signals of a stored delivery (see the module). `Err` when the broker did not take
    /// one: the delivery is then redelivered, and the ones already taken are dropped as duplicates.
    pub(crate) async fn account_signals(&self, body: &[u8], body_sha256: &str) -> Result<(), String> {
        let extracted = match extract(body, body_sha256, bw_common::time::now_ms()) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, body_sha256, "account signals not parsed");
                return Ok(());
            }
        };
        for kept in &extracted.kept {
            let result = if let Some(error) = &kept.error {
                tracing::warn!(%error, body_sha256, "webhook change malformed: kept raw in BW_REJECTED, not applied");
                "malformed"
            } else {
                tracing::info!(field = kept.label, body_sha256, "webhook field not acted on: stored and counted");
                "unknown"
            };
            self.keep_change(kept).await?;
            self.metrics
                .webhook_fields
                .get_or_create(&vec![("field", kept.label.into()), ("result", result.into())])
                .inc();
        }
        for item in &extracted.items {
            let headers = names::msg_id_headers(&item.msg_id);
            let duplicate = bw_common::nats::publish_durable(
                &self.js,
                item.subject.clone(),
                headers,
                item.signal.encode_to_vec().into(),
            )
            .await
            .map_err(|e| format!("account signal not published: {e}"))?;
            if !duplicate && !matches!(item.signal.kind, Some(Kind::Unknown(_))) {
                let label = field_label(&item.signal.field);
                self.metrics
                    .webhook_fields
                    .get_or_create(&vec![("field", label.into()), ("result", "published".into())])
                    .inc();
            }
        }
        Ok(())
    }

    /// Keeps an unknown or malformed change's raw value for inspection (BW_REJECTED, 7 days). A value over the
    /// inline limit is not copied: the log line names its delivery.
    async fn keep_change(&self, kept: &Kept) -> Result<(), String> {
        if !self.bodies.fits_inline(kept.raw.len()) {
            tracing::warn!(field = kept.label, bytes = kept.raw.len(), "webhook change too large to keep a raw copy");
            return Ok(());
        }
        let rejected = bw_proto::v1::RejectedRequest {
            raw: kept.raw.clone().into_bytes(),
            source: REJECTED_SOURCE.into(),
            reason: bw_proto::v1::RejectReason::Unspecified as i32,
            error: match &kept.error {
                Some(e) => e.to_string(),
                None => format!("webhook field `{}` is not acted on: stored and counted", kept.label),
            },
            at_unix_ms: bw_common::time::now_ms(),
            raw_size: kept.raw.len() as u64,
        };
        bw_common::nats::publish_durable(
            &self.js,
            names::rejected_subject(REJECTED_SOURCE),
            names::msg_id_headers(&kept.msg_id),
            rejected.encode_to_vec().into(),
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("webhook change not kept: {e}"))
    }
}

#[cfg(test)]
mod tests;
