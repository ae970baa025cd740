use super::*;
use bw_proto::v1::{TemplatePayload, TextPayload};

const NOW: i64 = 1_700_000_000_000;

fn good() -> SendRequest {
    SendRequest {
        operation_id: "order-1".into(),
        waba_id: "1001".into(),
        phone_number_id: "2002".into(),
        recipient: "+5491155551234".into(),
        category: Category::Transactional as i32,
        payload: Some(Payload::Text(TextPayload { body: "hello".into(), preview_url: false })),
        ..Default::default()
    }
}

fn check(edit: impl FnOnce(&mut SendRequest), expect: Option<(RejectReason, &str)>) {
    let mut request = good();
    edit(&mut request);
    let got = validate(&request, Some("2002"), 100, &Limits::default(), NOW);
    match (got, expect) {
        (Ok(_), None) => {}
        (Err(r), Some((reason, text))) => {
            assert_eq!(r.reason, reason, "{}", r.error);
            assert!(r.error.contains(text), "error `{}` lacks `{text}`", r.error);
        }
        (got, expect) => panic!("got {got:?}, expected {expect:?}"),
    }
}

#[test]
fn accepts_good_text_and_template() {
    check(|_| {}, None);
    check(
        |r| {
            r.payload = Some(Payload::Template(TemplatePayload {
                name: "order_update".into(),
                language: "es_AR".into(),
                body_parameters: vec!["A-1".into(), "mañana".into()],
                components_json: String::new(),
            }))
        },
        None,
    );
    check(|r| r.deadline_unix_ms = NOW + 1, None);
    check(|r| r.recipient = "+12025550123".into(), None);
    check(|r| r.recipient = "US.13491208655302741918".into(), None);
    check(|r| r.recipient = "US.ENT.11815799212886844830".into(), None);
}

#[test]
fn each_bad_input_has_its_reason() {
    use RejectReason::*;
    check(|r| r.operation_id.clear(), Some((MissingField, "operation_id is required")));
    check(|r| r.operation_id = "a b".into(), Some((BadOperationId, "operation_id must be")));
    check(|r| r.operation_id = "x".repeat(129), Some((BadOperationId, "1..=128")));
    check(|r| r.waba_id.clear(), Some((MissingField, "waba_id is required")));
    check(|r| r.waba_id = "12a".into(), Some((BadPayload, "waba_id must be digits")));
    check(|r| r.phone_number_id.clear(), Some((MissingField, "phone_number_id is required")));
    check(|r| r.recipient.clear(), Some((MissingField, "recipient is required")));
    check(|r| r.recipient = "5491155551234".into(), Some((BadRecipient, "leading '+'")));
    check(|r| r.recipient = "+549115555123456789".into(), Some((BadRecipient, "8 to 15 digits")));
    check(|r| r.recipient = "+1234567".into(), Some((BadRecipient, "8 to 15 digits")));
    check(|r| r.recipient = "+05491155551234".into(), Some((BadRecipient, "must not start with 0")));
    check(|r| r.recipient = "+54 911 5555".into(), Some((BadRecipient, "only digits")));
    check(|r| r.recipient = "US.1349-1208".into(), Some((BadRecipient, "user id must be a country code")));
    check(|r| r.recipient = format!("US.{}", "1".repeat(129)), Some((BadRecipient, "1 to 128 letters")));
    check(|r| r.recipient = "us.1349".into(), Some((BadRecipient, "leading '+', or a user id")));
    check(|r| r.category = 0, Some((UnknownCategory, "unspecified")));
    check(|r| r.category = 42, Some((UnknownCategory, "category 42 is unknown")));
    check(|r| r.payload = None, Some((MissingField, "payload is required")));
    check(
        |r| r.payload = Some(Payload::Text(TextPayload { body: "x".repeat(4097), preview_url: false })),
        Some((Oversize, "4097 characters; the limit is 4096")),
    );
    check(
        |r| r.payload = Some(Payload::Text(TextPayload { body: "  ".into(), preview_url: false })),
        Some((BadPayload, "text body must not be empty")),
    );
    check(|r| r.deadline_unix_ms = NOW - 5, Some((DeadlinePassed, "deadline passed 5 ms ago")));
    check(|r| r.phone_number_id = "2003".into(), Some((SubjectMismatch, "does not match the subject")));
    check(|r| r.attempts.push(Default::default()), Some((BadPayload, "attempts are filled by the pipeline")));
}

#[test]
fn template_rules() {
    use RejectReason::*;
    let template = |name: &str, lang: &str, params: Vec<String>, components: &str| {
        let (name, lang, components) = (name.to_string(), lang.to_string(), components.to_string());
        move |r: &mut SendRequest| {
            r.payload = Some(Payload::Template(TemplatePayload {
                name,
                language: lang,
                body_parameters: params,
                components_json: components,
            }))
        }
    };
    check(template("", "en_US", vec![], ""), Some((MissingField, "template name is required")));
    check(template("Bad Name", "en_US", vec![], ""), Some((BadPayload, "[a-z0-9_]")));
    check(template("ok", "", vec![], ""), Some((MissingField, "template language is required")));
    check(template("ok", "en US!", vec![], ""), Some((BadPayload, "en_US")));
    check(template("ok", "en", vec!["p".into(); 101], ""), Some((Oversize, "101 body parameters")));
    check(template("ok", "en", vec!["".into()], ""), Some((BadPayload, "parameter 1 is empty")));
    check(template("ok", "en", vec!["x".repeat(1025)], ""), Some((Oversize, "parameter 1 has 1025")));
    check(template("ok", "en", vec![], "{\"a\":1}"), Some((BadPayload, "JSON array")));
    check(template("ok", "en", vec![], "[{\"type\":\"body\"}]"), None);
}

#[test]
fn size_and_subject_checks_come_first() {
    let request = good();
    let limits = Limits { max_request_bytes: 10, ..Limits::default() };
    let r = validate(&request, Some("2002"), 11, &limits, NOW).expect_err("oversize");
    assert_eq!(r.reason, RejectReason::Oversize);
    assert!(r.error.contains("11 bytes; the limit is 10 bytes"), "{}", r.error);
    let r = validate(&request, Some("abc"), 10, &Limits::default(), NOW).expect_err("bad subject");
    assert_eq!(r.reason, RejectReason::SubjectMismatch);
    assert!(validate(&request, None, 10, &Limits::default(), NOW).is_ok(), "http intake has no subject");
}

#[test]
fn errors_never_echo_personal_data() {
    let mut request = good();
    request.recipient = "5491155551234".into();
    let r = validate(&request, Some("2002"), 10, &Limits::default(), NOW).expect_err("bad recipient");
    assert!(!r.error.contains("5491155551234"));
}
