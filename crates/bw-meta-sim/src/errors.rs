//! Meta's error catalog and error bodies: `{"error":{"message":"(#code) title","type",...,"fbtrace_id"}}`
//! (reference §2.1) for the synchronous answer, and `{code,title,message,error_data.details,href}` for the
//! `errors[]` of a `failed` status or a value-level error webhook (§2.1, §4.4).
//!
//! [`TABLE_CODES`] lists every code of the reference's §2.3 table ("Pause scope by error code"), with the range
//! 200–299 written out. Titles and details paraphrase Meta's error-codes page. The HTTP status per code follows
//! the older Meta table of §2.2 (and the Marketing Messages table for 131009 and 132018); throttling codes take
//! the configured throttle status instead, because BSPs report HTTP 400 where Meta's table says 429 (UNCERTAIN
//! in the reference). Codes neither table lists answer 400, except the transient 131016, 131057, 133004 and
//! 2494100, which answer 503 (an inference: they say the service or account is temporarily unavailable).
//! `error_subcode` is set only where the reference shows one (130429: 2494055; an expired token: 463), because
//! Meta documents subcodes as deprecated; a scenario can set one on any code.

use crate::ids;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The channel the reference gives a code (§2.3 "Arrives").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// The HTTP response of `POST /messages` (S, S? and request-level errors).
    Sync,
    /// A `failed` status webhook (A).
    Async,
    /// Either (S/A).
    Both,
    /// The registration call, not `/messages` (133000, 133015); a send can still be answered with it.
    RegisterCall,
    /// Only on inbound message webhooks (131052: media the user sent could not be downloaded).
    Inbound,
}

impl Channel {
    /// The mode an injection of this code uses when the scenario names none: async for codes the reference
    /// says arrive by webhook only, sync otherwise.
    pub fn default_async(self) -> bool {
        self == Channel::Async
    }
}

/// One catalog row.
#[derive(Debug, Clone, Copy)]
pub struct CodeInfo {
    pub title: &'static str,
    pub details: &'static str,
    pub http_status: u16,
    pub error_type: &'static str,
    /// Codes that are rate limits take the configured throttle status instead of `http_status`.
    pub throttle: bool,
    /// Where the reference says the code arrives.
    pub channel: Channel,
    /// The `error_subcode` Meta's own example shows for this code, if any.
    pub subcode: Option<i64>,
}

/// Every code of the reference's §2.3 table, the range 200–299 expanded (see [`table_codes`]).
pub const TABLE_CODES: &[i64] = &[
    0, 190, 3, 10, 131005, 4, 17, 32, 613, 80007, 80008, 368, 131031, 130497, 131042, 131063, 131064, 33, 131045,
    133010, 133000, 133015, 133016, 131037, 130429, 131048, 131057, 2494100, 131056, 132000, 132001, 132005, 132007,
    132012, 132015, 132016, 132018, 132068, 132069, 131026, 131047, 131049, 131050, 130472, 130403, 131021, 131062,
    100, 131008, 131009, 131051, 131053, 135000, 131052, 1, 2, 131000, 131016, 133004,
];

/// [`TABLE_CODES`] plus 200..=299: every code the simulator answers with its own catalog row.
pub fn table_codes() -> Vec<i64> {
    let mut codes = TABLE_CODES.to_vec();
    codes.extend(200..=299);
    codes
}

/// Whether `code` has a row of its own (unknown codes get a generic row with HTTP 400).
pub fn is_known(code: i64) -> bool {
    (200..=299).contains(&code) || TABLE_CODES.contains(&code)
}

/// Looks up a code; unknown codes get a generic row with HTTP 400.
pub fn info(code: i64) -> CodeInfo {
    use Channel::{Async, Both, Inbound, RegisterCall, Sync};
    let row = |title, details, http_status, channel| CodeInfo {
        title,
        details,
        http_status,
        error_type: "OAuthException",
        throttle: false,
        channel,
        subcode: None,
    };
    let throttle = |title, details| CodeInfo {
        title,
        details,
        http_status: 429,
        error_type: "OAuthException",
        throttle: true,
        channel: Sync,
        subcode: None,
    };
    match code {
        // Token and app.
        0 => row("AuthException", "We were unable to authenticate the app user.", 401, Sync),
        190 => row(
            "Error validating access token: Session has expired",
            "The access token has expired or is invalid.",
            401,
            Sync,
        ),
        3 => row("API Method", "Capability or permissions issue.", 500, Sync),
        10 => row(
            "Permission Denied",
            "Permission is either not granted or has been removed, or the app is not eligible for this API.",
            403,
            Sync,
        ),
        200..=299 => row("API Permission", "Permission is either not granted or has been removed.", 403, Sync),
        131005 => row("Access denied", "Permission is either not granted or has been removed.", 403, Sync),
        4 => throttle("API Too Many Calls", "The app has reached its API call rate limit."),
        17 => throttle("User request limit reached", "The user has reached its API call rate limit."),
        32 => throttle("Page request limit reached", "The page has reached its API call rate limit."),
        613 => throttle("Calls to this api have exceeded the rate limit.", "A custom rate limit has been reached."),
        // WABA and portfolio.
        80007 => throttle("Rate limit issues", "The WhatsApp Business Account has reached its rate limit."),
        80008 => throttle(
            "There have been too many calls to this WhatsApp Business account",
            "The WhatsApp Business Management API business use case rate limit has been reached.",
        ),
        368 => row(
            "Temporarily blocked for policies violations",
            "The WhatsApp Business Account associated with the app has been restricted or disabled for \
                 violating a platform policy.",
            403,
            Sync,
        ),
        131031 => row(
            "Account has been locked",
            "The WhatsApp Business Account is restricted or disabled, or data in the request failed verification.",
            403,
            Sync,
        ),
        130497 => row(
            "Business account is restricted from messaging users in this country",
            "The WhatsApp Business Account is restricted from messaging users in this country.",
            403,
            Sync,
        ),
        131042 => {
            row("Business eligibility payment issue", "There was an error related to your payment method.", 400, Sync)
        }
        131063 => row(
            "Marketing messages disabled on Cloud API",
            "Marketing template messages are disabled on Cloud API for this WhatsApp Business Account \
                 (disable_marketing_messages_on_cloud_api).",
            400,
            Sync,
        ),
        131064 => row(
            "Messaging limit reached for template classification violations",
            "Messages cannot be sent until the enforcement period for template classification violations ends.",
            400,
            Sync,
        ),
        // Business phone number.
        33 => row("Parameter value is not valid", "The business phone number has been deleted.", 400, Sync),
        131045 => {
            row("Incorrect certificate", "Message failed to send due to a phone number registration error.", 400, Sync)
        }
        133010 => row(
            "Phone number Not Registered",
            "The phone number is not registered on the WhatsApp Business Platform.",
            400,
            Sync,
        ),
        133000 => row("Incomplete Deregistration", "A previous deregistration attempt failed.", 400, RegisterCall),
        133015 => row(
            "Please wait a few minutes before attempting to register this phone number",
            "The phone number was recently deleted and its deletion is not complete. Try again in 5 minutes.",
            400,
            RegisterCall,
        ),
        133016 => row(
            "Account register deregister rate limit exceeded",
            "Registration or deregistration failed because there were too many attempts for this phone number \
                 in a short period of time.",
            400,
            Sync,
        ),
        131037 => row(
            "WhatsApp provided number needs display name approval before message can be sent.",
            "The 555 business phone number needs an approved display name before it can send messages.",
            400,
            Sync,
        ),
        130429 => CodeInfo {
            subcode: Some(2_494_055),
            ..throttle("Rate limit hit", "Cloud API message throughput has been reached.")
        },
        131048 => throttle(
            "Spam rate limit hit",
            "Message failed to send because there are restrictions on how many messages can be sent from this \
                 phone number.",
        ),
        131057 => row(
            "Account in maintenance mode",
            "Business Account is in maintenance mode (for example during a throughput upgrade); it lasts up to \
                 about a minute.",
            503,
            Sync,
        ),
        2_494_100 => row(
            "Account in maintenance mode",
            "The account is in maintenance mode. Try again in a few minutes.",
            503,
            Sync,
        ),
        // Pair, template and Flow.
        131056 => throttle(
            "(Business Account, Consumer Account) pair rate limit hit",
            "Message failed to send because there were too many messages sent from this phone number to the \
                 same phone number in a short period of time.",
        ),
        132000 => row(
            "Number of parameters does not match the expected number of params",
            "The number of variable parameter values included in the request did not match the number of \
                 variable parameters defined in the template.",
            400,
            Sync,
        ),
        132001 => row(
            "Template name does not exist in the translation",
            "The template does not exist in the specified language or the template has not been approved.",
            400,
            Sync,
        ),
        132005 => {
            row("Translated text too long", "Translated text is too long once the parameters are hydrated.", 400, Sync)
        }
        132007 => {
            row("Template Format Character Policy Violated", "Template content violates a WhatsApp policy.", 400, Sync)
        }
        132012 => {
            row("Template Parameter Format Mismatch", "Variable parameter values are formatted incorrectly.", 400, Sync)
        }
        132015 => row("Template is Paused", "Template is paused due to low quality so it cannot be sent.", 400, Both),
        132016 => row(
            "Template is Disabled",
            "Template has been paused too many times due to low quality and is now permanently disabled.",
            400,
            Sync,
        ),
        132018 => row(
            "There was an issue with the parameters in your template.",
            "Template parameter validation failed.",
            400,
            Sync,
        ),
        132068 => row("Flow is in blocked state", "The Flow is blocked.", 400, Sync),
        132069 => row(
            "Flow is in throttled state",
            "10 messages using this Flow were already sent in the last hour.",
            400,
            Sync,
        ),
        // Recipient and message.
        131026 => row(
            "Message undeliverable",
            "Unable to deliver message. Reasons can include: the recipient phone number is not a WhatsApp \
                 phone number.",
            400,
            Async,
        ),
        131047 => row(
            "Re-engagement message",
            "More than 24 hours have passed since the recipient last replied to the sender number.",
            400,
            Async,
        ),
        131049 => row(
            "This message was not delivered to maintain healthy ecosystem engagement.",
            "In order to maintain a healthy ecosystem engagement, the message failed to be delivered.",
            400,
            Async,
        ),
        131050 => row(
            "Unable to deliver the message. This recipient has chosen to stop receiving marketing messages on \
                 WhatsApp from your business.",
            "The user stopped marketing messages from this business.",
            400,
            Async,
        ),
        130472 => {
            row("User's number is part of an experiment", "Message was not sent as part of an experiment.", 400, Async)
        }
        130403 => row(
            "Recipient blocked by the business",
            "The business has blocked this user; messages to them are not sent until they are unblocked.",
            400,
            Sync,
        ),
        131021 => row("Recipient cannot be sender", "Sender and recipient phone number is the same.", 400, Sync),
        131062 => row(
            "Business-scoped user ID recipients are not supported for this message",
            "This message type cannot be sent to a business-scoped user ID (one-tap, zero-tap and copy-code \
                 authentication templates); send it to the phone number.",
            400,
            Sync,
        ),
        100 => row("Invalid parameter", "Invalid parameter", 400, Sync),
        131008 => row("Required parameter is missing", "The request is missing a required parameter.", 400, Sync),
        131009 => row("Parameter value is not valid", "One or more parameter values are invalid.", 400, Sync),
        131051 => row("Unsupported message type", "Unsupported message type.", 400, Sync),
        131053 => row("Media upload error", "Unable to upload the media used in the message.", 400, Async),
        135000 => row(
            "Generic user error",
            "Message failed to send because of an unknown error with your request parameters.",
            400,
            Sync,
        ),
        131052 => row("Media download error", "Unable to download the media sent by the user.", 400, Inbound),
        // Transient.
        1 => row("API Unknown", "Invalid request or possible server error.", 400, Sync),
        2 => row("API Service", "Temporary due to downtime or due to being overloaded.", 503, Sync),
        131000 => row("Something went wrong", "Message failed to send due to an unknown error.", 500, Both),
        131016 => row("Service unavailable", "A service is temporarily unavailable.", 503, Sync),
        133004 => row("Server temporarily unavailable", "Server is temporarily unavailable.", 503, Sync),
        _ => row("Unknown error", "An unknown error occurred.", 400, Sync),
    }
}

/// The HTTP status Meta answers `code` with, given the configured status for throttling codes.
pub fn http_status(code: i64, throttle_status: u16) -> u16 {
    let i = info(code);
    if i.throttle { throttle_status } else { i.http_status }
}

/// What a scenario may change in an error body.
#[derive(Debug, Clone, Default)]
pub struct Overrides<'a> {
    /// `error_data.details` instead of the catalog text.
    pub details: Option<&'a str>,
    /// `error_subcode` instead of the catalog's (if any).
    pub subcode: Option<i64>,
    /// Graph's optional `error_user_title` / `error_user_msg`.
    pub user_title: Option<&'a str>,
    pub user_msg: Option<&'a str>,
}

/// Builds Meta's error body. `details` overrides the catalog text (validation errors name the parameter);
/// `subcode` overrides the catalog's subcode.
pub fn body(code: i64, details: Option<&str>, subcode: Option<i64>) -> Value {
    body_with(code, &Overrides { details, subcode, ..Overrides::default() })
}

/// [`body`] with every override.
pub fn body_with(code: i64, o: &Overrides<'_>) -> Value {
    let i = info(code);
    let mut error = json!({
        "message": format!("(#{code}) {}", i.title),
        "type": i.error_type,
        "code": code,
        "error_data": {
            "messaging_product": "whatsapp",
            "details": o.details.unwrap_or(i.details),
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
    if let Some(sub) = o.subcode.or(i.subcode) {
        error["error_subcode"] = json!(sub);
    }
    if let Some(t) = o.user_title {
        error["error_user_title"] = json!(t);
    }
    if let Some(m) = o.user_msg {
        error["error_user_msg"] = json!(m);
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

/// Where Meta's error webhooks point (`href`).
pub const ERROR_CODES_HREF: &str = "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/";

/// The body a status webhook carries in `statuses[].errors[]` for an asynchronous failure, and a value-level
/// error webhook in `value.errors[]`: `message` equals `title` (Meta: "the same as the title property value").
pub fn webhook_error(code: i64) -> Value {
    webhook_error_with(code, None)
}

/// [`webhook_error`] with `error_data.details` replaced.
pub fn webhook_error_with(code: i64, details: Option<&str>) -> Value {
    let i = info(code);
    json!({
        "code": code,
        "title": i.title,
        "message": i.title,
        "error_data": { "details": details.unwrap_or(i.details) },
        "href": ERROR_CODES_HREF,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_code_has_its_own_row_and_the_old_tables_status() {
        for code in table_codes() {
            assert_ne!(info(code).title, "Unknown error", "{code} has a row");
            assert!(is_known(code));
        }
        // Reference §2.2 (older Meta table; throttles take the configured status).
        let old: &[(&[i64], u16)] = &[
            (&[0, 190], 401),
            (&[3, 131000], 500),
            (&[10, 200, 250, 299, 368, 131005, 131031, 130497], 403),
            (&[1, 100, 131009, 132018], 400),
            (&[2], 503),
        ];
        for (codes, status) in old {
            for code in *codes {
                assert_eq!(http_status(*code, 400), *status, "{code}");
            }
        }
        for code in [4, 80007, 130429, 131048, 131056] {
            assert!(info(code).throttle, "{code} is a throttle");
            assert_eq!(http_status(code, 429), 429);
        }
        assert_eq!(info(130429).subcode, Some(2_494_055), "the subcode of Meta's own example");
        assert!(!is_known(999_999));
    }

    #[test]
    fn bodies_have_metas_shape() {
        let b = body(130429, None, None);
        assert_eq!(b["error"]["message"], "(#130429) Rate limit hit");
        assert_eq!(b["error"]["error_subcode"], 2_494_055);
        assert_eq!(b["error"]["error_data"]["messaging_product"], "whatsapp");
        let b = body_with(
            368,
            &Overrides { details: Some("d"), subcode: Some(7), user_title: Some("t"), user_msg: Some("m") },
        );
        assert_eq!(
            (&b["error"]["error_data"]["details"], &b["error"]["error_subcode"], &b["error"]["error_user_msg"]),
            (&json!("d"), &json!(7), &json!("m"))
        );
        let w = webhook_error(131049);
        assert_eq!(w["message"], w["title"]);
        assert!(w["error_data"]["details"].is_string() && w["href"].is_string());
    }
}
