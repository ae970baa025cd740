//! A send request's body as Graph validates it (100 / 131008 / 131009 / 132001; `to` or a user-id
//! `recipient`): [`validate`] turns it into a [`Send`] or the code and message Meta answers.

use crate::account::UserInfo;
use crate::ids;
use crate::state::Inner;
use serde_json::Value;

const TYPES: &[&str] = &[
    "text",
    "image",
    "audio",
    "document",
    "video",
    "sticker",
    "location",
    "contacts",
    "interactive",
    "template",
    "reaction",
];

/// A validated send.
pub(crate) struct Send {
    /// `to`, or the `recipient` user id when no `to` was sent (the response's `contacts[].input`).
    pub(crate) input: String,
    /// The recipient's phone digits, when known.
    pub(crate) wa_id: Option<String>,
    /// The directory's entry (None with user ids off and a phone-addressed send).
    pub(crate) user: Option<UserInfo>,
    /// Addressed by `recipient` only.
    pub(crate) by_user_id: bool,
    pub(crate) mtype: String,
    pub(crate) biz_opaque: Option<String>,
    /// (name, language) of a template.
    pub(crate) template: Option<(String, String)>,
}

impl Send {
    /// The key limits and state use for this user: the phone digits when known, else the user id.
    pub(crate) fn user_key(&self) -> &str {
        match (&self.wa_id, &self.user) {
            (Some(w), _) => w,
            (None, Some(u)) => &u.user_id,
            (None, None) => &self.input,
        }
    }
}

pub(crate) fn validate(
    st: &Inner,
    phone: &str,
    parsed: Result<Value, serde_json::Error>,
) -> Result<Send, (i64, String)> {
    let invalid = |code: i64, d: &str| Err((code, d.to_string()));
    let Ok(body) = parsed else {
        return invalid(100, "Request body is not valid JSON.");
    };
    if !body.is_object() {
        return invalid(100, "Request body must be a JSON object.");
    }
    match body.get("messaging_product").and_then(Value::as_str) {
        None => return invalid(100, "The parameter messaging_product is required."),
        Some("whatsapp") => {}
        Some(_) => return invalid(100, "Param messaging_product must be one of {WHATSAPP}."),
    }
    match body.get("recipient_type").map(|v| v.as_str()) {
        None | Some(Some("individual")) | Some(Some("group")) => {}
        _ => {
            return invalid(100, "Param recipient_type must be one of {INDIVIDUAL, GROUP}.");
        }
    }
    let to = body.get("to").and_then(Value::as_str).filter(|t| !t.trim().is_empty());
    let recipient = match body.get("recipient") {
        None | Some(Value::Null) => None,
        Some(Value::String(r)) if ids::is_user_id(r) => Some(r.as_str()),
        // The value is not echoed: it may be a phone number.
        Some(_) => return invalid(131009, "Parameter 'recipient' is not a valid business-scoped user ID."),
    };
    // `to` wins when both are sent (reference §1).
    let (input, wa_id, user, by_user_id) = match (to, recipient) {
        (Some(t), _) => {
            let wa_id = ids::wa_id(t);
            let allowed = t.chars().all(|c| c.is_ascii_digit() || " +-()".contains(c));
            if !allowed || !(7..=15).contains(&wa_id.len()) {
                return invalid(131009, "Parameter 'to' is not a valid phone number.");
            }
            // The phone decides who the user is, whatever `recipient` says.
            let user = (st.cfg.user_ids || recipient.is_some())
                .then(|| st.account.user_by_phone(&st.cfg, st.cfg.portfolio_of(phone), &wa_id));
            (t.to_string(), Some(wa_id), user, false)
        }
        (None, Some(r)) => {
            let user = st.account.user_by_id(&st.cfg, r);
            (r.to_string(), user.wa_id.clone(), Some(user), true)
        }
        (None, None) => return invalid(100, "The parameter to is required."),
    };
    let mtype = match body.get("type") {
        None => "text".to_string(),
        Some(Value::String(t)) if TYPES.contains(&t.as_str()) => t.clone(),
        Some(_) => {
            return invalid(
                100,
                "Param type must be one of {TEXT, IMAGE, AUDIO, DOCUMENT, VIDEO, STICKER, LOCATION, CONTACTS, INTERACTIVE, TEMPLATE, REACTION}.",
            );
        }
    };
    let biz_opaque = match body.get("biz_opaque_callback_data") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.chars().count() <= 512 => Some(s.clone()),
        Some(Value::String(_)) => {
            return invalid(100, "Param biz_opaque_callback_data must be at most 512 characters long.");
        }
        Some(_) => return invalid(100, "Param biz_opaque_callback_data must be a string."),
    };
    let Some(nested) = body.get(&mtype).filter(|v| v.is_object() || (mtype == "contacts" && v.is_array())) else {
        return invalid(131008, &format!("Parameter '{mtype}' is required."));
    };
    let mut template = None;
    match mtype.as_str() {
        "text" => match nested.get("body") {
            Some(Value::String(b)) if b.chars().count() > 4096 => {
                return invalid(100, "Param text['body'] must be at most 4096 characters long.");
            }
            Some(Value::String(b)) if !b.is_empty() => {}
            _ => return invalid(100, "The parameter text['body'] is required."),
        },
        "template" => template = Some(validate_template(st, nested)?),
        "image" | "audio" | "document" | "video" | "sticker"
            if nested.get("id").and_then(Value::as_str).is_none()
                && nested.get("link").and_then(Value::as_str).is_none() =>
        {
            return invalid(131008, &format!("Parameter '{mtype}.link' or '{mtype}.id' is required."));
        }
        _ => {}
    }
    Ok(Send { input, wa_id, user, by_user_id, mtype, biz_opaque, template })
}

fn validate_template(st: &Inner, t: &Value) -> Result<(String, String), (i64, String)> {
    let invalid = |code: i64, d: String| Err((code, d));
    let Some(name) = t.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
        return invalid(131008, "Parameter 'template.name' is required.".into());
    };
    let Some(lang) = t.get("language").and_then(|l| l.get("code")).and_then(Value::as_str).filter(|c| !c.is_empty())
    else {
        return invalid(131008, "Parameter 'template.language.code' is required.".into());
    };
    if let Some(components) = t.get("components") {
        let Some(list) = components.as_array() else {
            return invalid(131009, "Parameter 'template.components' must be an array.".into());
        };
        for c in list {
            let ok_type = c
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|ty| ["header", "body", "button", "footer"].contains(&ty));
            let ok_params = c.get("parameters").is_none_or(Value::is_array);
            if !ok_type || !ok_params {
                return invalid(131009, "Parameter 'template.components' has an invalid component.".into());
            }
        }
    }
    if !st.cfg.known_templates.is_empty() && !st.cfg.known_templates.iter().any(|k| k == name) {
        return invalid(132001, format!("template name ({name}) does not exist in {lang}"));
    }
    Ok((name.to_string(), lang.to_string()))
}
