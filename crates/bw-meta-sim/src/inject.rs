//! Targeted error injections: a scenario's `[[injections]]` aim one Meta error code at the calls of one phone
//! number, WABA, token, template (name + language), recipient, message type or template category, for a time
//! span and a share of the matching calls, answered synchronously (the HTTP error of reference §2.1) or
//! asynchronously (accepted with a wamid, then a `failed` status webhook with `errors[]`, §4.4).
//!
//! ```toml
//! [[injections]]
//! name = "waba-policy-block"        # key in Counters::injections (default "#<index>")
//! code = 368                        # any code; the catalog (errors.rs) gives its status, title and details
//! start_ms = 0                      # offset from the scenario start
//! duration_ms = 60000               # omit: open-ended
//! rate = 1.0                        # share of matching calls (scenario `selection` decides random/exact)
//! max = 100                         # optional: at most this many calls get it
//! mode = "sync"                     # "sync" | "async"; default: the reference's channel (A → async, else sync)
//! # Targets: every list given must match; none given = every call.
//! phone_number_ids = ["106540352242922"]
//! waba_ids = ["102290129340398"]
//! tokens = ["sim-token"]
//! templates = [{ name = "order_update", language = "en_US" }]   # language optional; en-US == en_US
//! recipients = ["+16505551234", "US.13491208655302741918"]      # phone numbers (any format) or user ids
//! message_types = ["template"]
//! categories = ["marketing"]        # template category (config `templates` or a category webhook)
//! # The answer:
//! http_status = 403                 # instead of the catalog status
//! subcode = 2494055                 # error_subcode (default: the reference's, where it shows one)
//! details = "..."                   # error_data.details
//! user_title = "..."                # error_user_title / error_user_msg (Graph's optional fields)
//! user_msg = "..."
//! regain_minutes = 15               # estimated_time_to_regain_access in X-Business-Use-Case-Usage
//! retry_after_s = 30                # Retry-After (Meta documents none for WhatsApp errors)
//! delay_ms = 200                    # async: the failed status this long after acceptance
//!                                   # (default: webhook.sent_delay_ms)
//! after_sent = true                 # async: a `sent` status first, then `failed` (a failure can follow sent)
//! ```

use crate::errors;
use serde::{Deserialize, Serialize};

/// Synchronous or asynchronous.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The HTTP response of `POST /messages`; nothing is accepted.
    Sync,
    /// Accepted (200, wamid, in the oracle), then a `failed` status webhook.
    Async,
}

/// A template by name and (optionally) language.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TemplateRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

fn one() -> f64 {
    1.0
}

fn is_one(x: &f64) -> bool {
    *x == 1.0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One targeted injection (see the module docs for the TOML form).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Injection {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub code: i64,
    #[serde(default)]
    pub start_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub rate: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phone_number_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waba_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub templates: Vec<TemplateRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recipients: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub message_types: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subcode: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_msg: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regain_minutes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub after_sent: bool,
}

/// What a call looks like to the targeting (parsed leniently before validation).
#[derive(Debug, Default)]
pub struct Call<'a> {
    pub phone_number_id: &'a str,
    pub waba_id: &'a str,
    pub token: &'a str,
    /// (name, language) of a template send.
    pub template: Option<(&'a str, &'a str)>,
    /// The recipient's phone digits, when known.
    pub wa_id: Option<&'a str>,
    /// The recipient's business-scoped user id, when known.
    pub user_id: Option<&'a str>,
    pub message_type: &'a str,
    /// The template's category, lower case.
    pub category: Option<&'a str>,
}

/// `en-US` and `en_US` are the same language (webhooks use the first, sends the second).
pub fn same_language(a: &str, b: &str) -> bool {
    let norm = |c: u8| if c == b'-' { b'_' } else { c.to_ascii_lowercase() };
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| norm(x) == norm(y))
}

impl Injection {
    /// A sync or async injection of `code` on every call from now on.
    pub fn new(code: i64) -> Injection {
        Injection {
            name: String::new(),
            code,
            start_ms: 0,
            duration_ms: None,
            rate: 1.0,
            max: None,
            mode: None,
            phone_number_ids: vec![],
            waba_ids: vec![],
            tokens: vec![],
            templates: vec![],
            recipients: vec![],
            message_types: vec![],
            categories: vec![],
            http_status: None,
            subcode: None,
            details: None,
            user_title: None,
            user_msg: None,
            regain_minutes: None,
            retry_after_s: None,
            delay_ms: None,
            after_sent: false,
        }
    }

    /// Whether this injection answers asynchronously.
    pub fn is_async(&self) -> bool {
        match self.mode {
            Some(m) => m == Mode::Async,
            None => errors::info(self.code).channel.default_async(),
        }
    }

    /// Whether `now` (ms since the scenario start) is in the injection's span.
    pub fn active_at(&self, now: u64) -> bool {
        now >= self.start_ms && self.duration_ms.is_none_or(|len| now < self.start_ms.saturating_add(len))
    }

    /// Whether the call is one of the injection's targets.
    pub fn targets(&self, c: &Call<'_>) -> bool {
        let any = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x == v);
        if !any(&self.phone_number_ids, c.phone_number_id) || !any(&self.waba_ids, c.waba_id) {
            return false;
        }
        if !any(&self.tokens, c.token) || !any(&self.message_types, c.message_type) {
            return false;
        }
        if !self.categories.is_empty()
            && !c.category.is_some_and(|cat| self.categories.iter().any(|x| x.eq_ignore_ascii_case(cat)))
        {
            return false;
        }
        if !self.templates.is_empty() {
            let Some((name, lang)) = c.template else { return false };
            let hit = self
                .templates
                .iter()
                .any(|t| t.name == name && t.language.as_deref().is_none_or(|l| same_language(l, lang)));
            if !hit {
                return false;
            }
        }
        if !self.recipients.is_empty() {
            let hit = self.recipients.iter().any(|r| {
                if crate::ids::is_user_id(r) {
                    c.user_id == Some(r.as_str())
                } else {
                    let digits = crate::ids::wa_id(r);
                    !digits.is_empty() && c.wa_id == Some(digits.as_str())
                }
            });
            if !hit {
                return false;
            }
        }
        true
    }

    /// A precise complaint about the first invalid setting.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.rate) || self.rate == 0.0 {
            return Err(format!("rate must be in (0, 1], not {}", self.rate));
        }
        if self.duration_ms == Some(0) {
            return Err("duration_ms must be positive (omit it for an open-ended injection)".into());
        }
        if self.max == Some(0) {
            return Err("max must be at least 1 (omit it for no cap)".into());
        }
        if let Some(s) = self.http_status
            && !(400..=599).contains(&s)
        {
            return Err(format!("http_status must be 4xx or 5xx, not {s}"));
        }
        if self.code < 0 {
            return Err(format!("code must not be negative, not {}", self.code));
        }
        if self.tokens.iter().any(String::is_empty) {
            return Err("tokens must not contain an empty token".into());
        }
        if self.templates.iter().any(|t| t.name.is_empty()) {
            return Err("templates need a name".into());
        }
        for r in &self.recipients {
            if !crate::ids::is_user_id(r) && crate::ids::wa_id(r).is_empty() {
                // It has no digits, so it is no phone number that would need masking.
                return Err(format!("recipient `{r}` is neither a phone number nor a business-scoped user id"));
            }
        }
        let mode_async = self.is_async();
        if !mode_async && (self.delay_ms.is_some() || self.after_sent) {
            return Err("delay_ms and after_sent apply to async injections only (set mode = \"async\")".into());
        }
        if mode_async && (self.http_status.is_some() || self.retry_after_s.is_some() || self.regain_minutes.is_some()) {
            return Err("http_status, retry_after_s and regain_minutes apply to sync injections only".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targeting_needs_every_given_list_to_match() {
        let mut inj = Injection::new(132015);
        inj.templates = vec![TemplateRef { name: "promo".into(), language: Some("en-US".into()) }];
        inj.recipients = vec!["+1 650 555 1234".into(), "US.1349".into()];
        let mut call = Call {
            phone_number_id: "p",
            waba_id: "w",
            token: "t",
            template: Some(("promo", "en_US")),
            wa_id: Some("16505551234"),
            user_id: None,
            message_type: "template",
            category: Some("marketing"),
        };
        assert!(inj.targets(&call), "same language in either spelling, same digits");
        call.template = Some(("promo", "es_AR"));
        assert!(!inj.targets(&call));
        call.template = Some(("promo", "en_US"));
        call.wa_id = None;
        call.user_id = Some("US.1349");
        assert!(inj.targets(&call), "user id recipient");
        inj.waba_ids = vec!["other".into()];
        assert!(!inj.targets(&call));
        assert!(!Injection::new(368).is_async() && Injection::new(131049).is_async(), "the reference's channel");
    }

    #[test]
    fn invalid_settings_are_named() {
        let bad = |f: fn(&mut Injection), want: &str| {
            let mut i = Injection::new(368);
            f(&mut i);
            let e = i.validate().expect_err(want);
            assert!(e.contains(want), "{e}");
        };
        bad(|i| i.rate = 0.0, "rate");
        bad(|i| i.duration_ms = Some(0), "duration_ms");
        bad(|i| i.http_status = Some(200), "http_status");
        bad(|i| i.delay_ms = Some(5), "async injections only");
        bad(|i| i.recipients = vec!["nobody".into()], "neither");
        bad(|i| i.max = Some(0), "max");
    }
}
