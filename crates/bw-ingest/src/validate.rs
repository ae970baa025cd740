//! Validation of producer send requests. Pure functions, no I/O: the same rules serve the NATS and HTTP intake.
//!
//! Every refusal carries a [`RejectReason`] and a precise, non-personal error text (it never echoes the
//! recipient or the message body).

use bw_proto::v1::{Category, RejectReason, SendRequest, send_request::Payload};

/// Limits applied to producer input.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Max encoded size of one request, bytes.
    pub max_request_bytes: usize,
    /// Max characters of a text body (Meta's limit is 4096).
    pub max_text_chars: usize,
    /// Max template body parameters.
    pub max_template_params: usize,
    /// Max characters of one template parameter.
    pub max_param_chars: usize,
    /// Max bytes of `components_json`.
    pub max_components_bytes: usize,
    /// Max labels per request.
    pub max_labels: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_bytes: 65_536,
            max_text_chars: 4096,
            max_template_params: 100,
            max_param_chars: 1024,
            max_components_bytes: 32_768,
            max_labels: 32,
        }
    }
}

/// A refusal: the reason code and the precise error text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: RejectReason,
    pub error: String,
}

impl Rejection {
    pub fn new(reason: RejectReason, error: impl Into<String>) -> Rejection {
        Rejection { reason, error: error.into() }
    }
}

fn reject<T>(reason: RejectReason, error: impl Into<String>) -> Result<T, Rejection> {
    Err(Rejection::new(reason, error))
}

/// True when `id` is a non-empty string of ASCII digits (Meta phone number ids and WABA ids).
pub fn is_digits(id: &str) -> bool {
    !id.is_empty() && id.len() <= 32 && id.bytes().all(|b| b.is_ascii_digit())
}

/// Checks an E.164 number: a leading '+', then 8..=15 digits, the first not 0.
pub fn check_e164(recipient: &str) -> Result<(), &'static str> {
    let Some(digits) = recipient.strip_prefix('+') else {
        return Err("recipient must be E.164 with a leading '+', or a user id such as US.1349...");
    };
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("recipient must hold only digits after the leading '+'");
    }
    if !(8..=15).contains(&digits.len()) {
        return Err("recipient must have 8 to 15 digits after the leading '+'");
    }
    if digits.starts_with('0') {
        return Err("recipient country code must not start with 0");
    }
    Ok(())
}

/// A recipient is an E.164 phone number or a business-scoped user id (reference §6: `US.1349...`, sent whole
/// as Meta's `recipient`). Anything starting with two capital letters and a dot is judged as a user id, so its
/// error names that form.
pub fn check_recipient(recipient: &str) -> Result<(), &'static str> {
    let b = recipient.as_bytes();
    if b.len() > 3 && b[..2].iter().all(u8::is_ascii_uppercase) && b[2] == b'.' {
        return if bw_common::mask::is_user_id(recipient) {
            Ok(())
        } else {
            Err("recipient user id must be a country code, '.', then 1 to 128 letters or digits")
        };
    }
    check_e164(recipient)
}

/// The category of a request, refusing unspecified and unknown values.
pub fn category(request: &SendRequest) -> Result<Category, Rejection> {
    match Category::try_from(request.category) {
        Ok(Category::Unspecified) => reject(RejectReason::UnknownCategory, "category is unspecified"),
        Ok(c) => Ok(c),
        Err(_) => reject(RejectReason::UnknownCategory, format!("category {} is unknown", request.category)),
    }
}

/// Validates a decoded request. `subject_phone` is the phone number id taken from the NATS subject (None for
/// HTTP); `encoded_len` is the size of the request as received; `now_ms` is the wall clock.
pub fn validate(
    request: &SendRequest,
    subject_phone: Option<&str>,
    encoded_len: usize,
    limits: &Limits,
    now_ms: i64,
) -> Result<Category, Rejection> {
    use RejectReason::*;
    if encoded_len > limits.max_request_bytes {
        return Err(oversize(encoded_len, limits));
    }
    if let Some(phone) = subject_phone
        && !is_digits(phone)
    {
        return reject(SubjectMismatch, "phone number id in the subject must be digits");
    }
    if request.operation_id.is_empty() {
        return reject(MissingField, "operation_id is required");
    }
    if !bw_wire::tenancy::valid_operation_id(&request.operation_id) {
        return reject(
            BadOperationId,
            "operation_id must be 1..=128 characters of [A-Za-z0-9_=.-], not starting or ending with '.' and without '..'",
        );
    }
    if request.waba_id.is_empty() {
        return reject(MissingField, "waba_id is required");
    }
    if !is_digits(&request.waba_id) {
        return reject(BadPayload, "waba_id must be digits");
    }
    if request.phone_number_id.is_empty() {
        return reject(MissingField, "phone_number_id is required");
    }
    if !is_digits(&request.phone_number_id) {
        return reject(BadPayload, "phone_number_id must be digits");
    }
    if let Some(phone) = subject_phone
        && phone != request.phone_number_id
    {
        return reject(SubjectMismatch, "phone_number_id in the body does not match the subject");
    }
    if request.recipient.is_empty() {
        return reject(MissingField, "recipient is required");
    }
    if let Err(e) = check_recipient(&request.recipient) {
        return reject(BadRecipient, e);
    }
    let category = category(request)?;
    match &request.payload {
        None => return reject(MissingField, "payload is required (text or template)"),
        Some(Payload::Text(text)) => {
            if text.body.trim().is_empty() {
                return reject(BadPayload, "text body must not be empty");
            }
            let chars = text.body.chars().count();
            if chars > limits.max_text_chars {
                return reject(
                    Oversize,
                    format!("text body has {chars} characters; the limit is {}", limits.max_text_chars),
                );
            }
        }
        Some(Payload::Template(t)) => check_template(t, limits)?,
    }
    if request.deadline_unix_ms < 0 {
        return reject(DeadlinePassed, "deadline_unix_ms must not be negative");
    }
    if request.deadline_unix_ms > 0 && request.deadline_unix_ms <= now_ms {
        return reject(DeadlinePassed, format!("deadline passed {} ms ago", now_ms - request.deadline_unix_ms));
    }
    if request.labels.len() > limits.max_labels {
        return reject(BadPayload, format!("at most {} labels are allowed", limits.max_labels));
    }
    if !request.attempts.is_empty() {
        return reject(BadPayload, "attempts are filled by the pipeline; producers must leave them empty");
    }
    Ok(category)
}

/// The rejection of a request of `len` bytes over `limits.max_request_bytes`.
pub fn oversize(len: usize, limits: &Limits) -> Rejection {
    Rejection::new(
        RejectReason::Oversize,
        format!("request is {len} bytes; the limit is {} bytes", limits.max_request_bytes),
    )
}

/// The refusal of a request that sets both payloads.
pub fn both_payloads() -> Rejection {
    Rejection::new(RejectReason::BadPayload, "set either text or template, not both")
}

/// True when the encoded `SendRequest` carries both field 6 (text) and field 7 (template) at the top level.
pub fn has_both_payloads(raw: &[u8]) -> bool {
    use prost::encoding::{DecodeContext, decode_key, skip_field};
    let mut buf = raw;
    let (mut text, mut template) = (false, false);
    while !buf.is_empty() {
        let Ok((tag, wire_type)) = decode_key(&mut buf) else { return false };
        match tag {
            6 => text = true,
            7 => template = true,
            _ => {}
        }
        if skip_field(wire_type, tag, &mut buf, DecodeContext::default()).is_err() {
            return false;
        }
    }
    text && template
}

fn check_template(t: &bw_proto::v1::TemplatePayload, limits: &Limits) -> Result<(), Rejection> {
    use RejectReason::*;
    if t.name.is_empty() {
        return reject(MissingField, "template name is required");
    }
    let name_ok =
        t.name.len() <= 512 && t.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !name_ok {
        return reject(BadPayload, "template name must be up to 512 characters of [a-z0-9_]");
    }
    if t.language.is_empty() {
        return reject(MissingField, "template language is required");
    }
    let lang_ok =
        t.language.len() <= 16 && t.language.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !lang_ok {
        return reject(BadPayload, "template language must look like `en_US`");
    }
    if t.body_parameters.len() > limits.max_template_params {
        return reject(
            Oversize,
            format!(
                "template has {} body parameters; the limit is {}",
                t.body_parameters.len(),
                limits.max_template_params
            ),
        );
    }
    for (i, p) in t.body_parameters.iter().enumerate() {
        if p.trim().is_empty() {
            return reject(BadPayload, format!("template body parameter {} is empty", i + 1));
        }
        let chars = p.chars().count();
        if chars > limits.max_param_chars {
            return reject(
                Oversize,
                format!(
                    "template body parameter {} has {chars} characters; the limit is {}",
                    i + 1,
                    limits.max_param_chars
                ),
            );
        }
    }
    if !t.components_json.is_empty() {
        if t.components_json.len() > limits.max_components_bytes {
            return reject(Oversize, format!("template components_json is over {} bytes", limits.max_components_bytes));
        }
        match serde_json::from_str::<serde_json::Value>(&t.components_json) {
            Ok(serde_json::Value::Array(_)) => {}
            _ => return reject(BadPayload, "template components_json must be a JSON array"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
