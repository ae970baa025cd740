//! Meta's error catalog and error body: `{"error":{"message":"(#code) title","type",...,"fbtrace_id"}}`.
//!
//! Titles and details follow Meta's error-codes page; the HTTP status per code follows the older Meta table,
//! except throttling codes, whose status is configurable because BSPs report HTTP 400 where Meta's table says 429.

use crate::ids;
use serde_json::{Value, json};

/// One catalog row.
#[derive(Debug, Clone, Copy)]
pub struct CodeInfo {
    pub title: &'static str,
    pub details: &'static str,
    pub http_status: u16,
    pub error_type: &'static str,
    /// Codes that are rate limits take the configured throttle status instead of `http_status`.
    pub throttle: bool,
}

/// Looks up a code; unknown codes get a generic row with HTTP 400.
pub fn info(code: i64) -> CodeInfo {
    let row = |title, details, http_status| CodeInfo {
        title,
        details,
        http_status,
        error_type: "OAuthException",
        throttle: false,
    };
    let throttle =
        |title, details| CodeInfo { title, details, http_status: 429, error_type: "OAuthException", throttle: true };
    match code {
        0 => row("AuthException", "We were unable to authenticate the app user.", 401),
        1 => row("API Unknown", "Invalid request or possible server error.", 400),
        2 => row("API Service", "Temporary due to downtime or due to being overloaded.", 503),
        3 => row("API Method", "Capability or permissions issue.", 500),
        4 => throttle("API Too Many Calls", "The app has reached its API call rate limit."),
        10 => row("Permission Denied", "Permission is either not granted or has been removed.", 403),
        100 => row("Invalid parameter", "Invalid parameter", 400),
        190 => row(
            "Error validating access token: Session has expired",
            "The access token has expired or is invalid.",
            401,
        ),
        368 => row(
            "Temporarily blocked for policies violations",
            "The WhatsApp Business Account associated with the app has been restricted or disabled for violating a platform policy.",
            403,
        ),
        80007 => throttle("Rate limit issues", "The WhatsApp Business Account has reached its rate limit."),
        80008 => throttle(
            "There have been too many calls to this WhatsApp Business account",
            "The WhatsApp Business Management API business use case rate limit has been reached.",
        ),
        130429 => throttle("Rate limit hit", "Cloud API message throughput has been reached."),
        130472 => row("User's number is part of an experiment", "Message was not sent as part of an experiment.", 400),
        131000 => row("Something went wrong", "Message failed to send due to an unknown error.", 500),
        131005 => row("Access denied", "Permission is either not granted or has been removed.", 403),
        131008 => row("Required parameter is missing", "The request is missing a required parameter.", 400),
        131009 => row("Parameter value is not valid", "One or more parameter values are invalid.", 400),
        131016 => row("Service unavailable", "A service is temporarily unavailable.", 503),
        131021 => row("Recipient cannot be sender", "Sender and recipient phone number is the same.", 400),
        131026 => row(
            "Message undeliverable",
            "Unable to deliver message. Reasons can include: the recipient phone number is not a WhatsApp phone number.",
            400,
        ),
        131031 => row("Account has been locked", "The WhatsApp Business Account is restricted or disabled.", 403),
        131042 => row("Business eligibility payment issue", "There was an error related to your payment method.", 400),
        131047 => row(
            "Re-engagement message",
            "More than 24 hours have passed since the recipient last replied to the sender number.",
            400,
        ),
        131048 => throttle(
            "Spam rate limit hit",
            "Message failed to send because there are restrictions on how many messages can be sent from this phone number.",
        ),
        131049 => row(
            "This message was not delivered to maintain healthy ecosystem engagement.",
            "In order to maintain a healthy ecosystem engagement, the message failed to be delivered.",
            400,
        ),
        131056 => throttle(
            "(Business Account, Consumer Account) pair rate limit hit",
            "Message failed to send because there were too many messages sent from this phone number to the same phone number in a short period of time.",
        ),
        131057 => row("Account in maintenance mode", "Business Account is in maintenance mode.", 503),
        132000 => row(
            "Number of parameters does not match the expected number of params",
            "The number of variable parameter values included in the request did not match the number of variable parameters defined in the template.",
            400,
        ),
        132001 => row(
            "Template name does not exist in the translation",
            "The template does not exist in the specified language or the template has not been approved.",
            400,
        ),
        132015 => row("Template is Paused", "Template is paused due to low quality so it cannot be sent.", 400),
        133004 => row("Server temporarily unavailable", "Server is temporarily unavailable.", 503),
        133010 => row(
            "Phone number Not Registered",
            "The phone number is not registered on the WhatsApp Business Platform.",
            400,
        ),
        _ => row("Unknown error", "An unknown error occurred.", 400),
    }
}

/// The HTTP status Meta answers `code` with, given the configured status for throttling codes.
pub fn http_status(code: i64, throttle_status: u16) -> u16 {
    let i = info(code);
    if i.throttle { throttle_status } else { i.http_status }
}

/// Builds Meta's error body. `details` overrides the catalog text (validation errors name the parameter).
pub fn body(code: i64, details: Option<&str>, subcode: Option<i64>) -> Value {
    let i = info(code);
    let mut error = json!({
        "message": format!("(#{code}) {}", i.title),
        "type": i.error_type,
        "code": code,
        "error_data": {
            "messaging_product": "whatsapp",
            "details": details.unwrap_or(i.details),
        },
        "fbtrace_id": ids::fbtrace_id(),
    });
    if code == 190 {
        // Graph's token errors carry no error_data; the message names the problem instead.
        error["message"] = json!("Invalid OAuth access token - Cannot parse access token");
        if let Some(obj) = error.as_object_mut() {
            obj.remove("error_data");
        }
    }
    if let Some(sub) = subcode {
        error["error_subcode"] = json!(sub);
    }
    json!({ "error": error })
}

/// The error body for a token that was valid and is not any more (expired or revoked by a scenario or the
/// admin API): 190 "Session has expired" (subcode 463, parse it only as a hint) or 0 AuthException.
pub fn dead_token_body(code: i64) -> Value {
    if code != 190 {
        return body(code, None, None);
    }
    json!({ "error": {
        "message": "Error validating access token: Session has expired.",
        "type": "OAuthException",
        "code": 190,
        "error_subcode": 463,
        "fbtrace_id": ids::fbtrace_id(),
    }})
}

/// The body a status webhook carries in `statuses[].errors[]` for an asynchronous failure.
pub fn webhook_error(code: i64) -> Value {
    let i = info(code);
    json!({
        "code": code,
        "title": i.title,
        "message": i.title,
        "error_data": { "details": i.details },
        "href": "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/",
    })
}

/// The default Meta error code carried by a 5xx with a Meta body.
pub fn default_code_for_status(status: u16) -> i64 {
    match status {
        500 => 131000,
        502 => 1,
        503 => 2,
        504 => 133004,
        _ => 1,
    }
}
