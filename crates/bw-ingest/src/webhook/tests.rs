use super::examples::*;
use super::*;

#[test]
fn documented_sent_status() {
    let parsed = parse(STATUS_SENT.as_bytes()).expect("parses");
    assert_eq!(parsed.statuses.len(), 1);
    let s = &parsed.statuses[0];
    assert_eq!(s.wamid, "wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBJDQjZCMzlEQUE4OTJBMTE4RTUA");
    assert_eq!(s.status(), DeliveryStatus::Sent);
    assert_eq!(s.timestamp_unix_s, 1_750_030_073);
    assert_eq!(s.operation_id, "order-42");
    assert_eq!(s.phone_number_id, "106540352242922");
    assert_eq!(s.error_code, 0);
    assert!(parsed.inbound.is_empty() && parsed.errors.is_empty());
}

#[test]
fn documented_inbound_text() {
    let parsed = parse(INBOUND_TEXT.as_bytes()).expect("parses");
    assert_eq!(parsed.inbound.len(), 1);
    let m = &parsed.inbound[0];
    assert_eq!(m.waba_id, "102290129340398");
    assert_eq!(m.phone_number_id, "106540352242922");
    assert_eq!(m.from, "16505551234");
    assert_eq!(m.r#type, "text");
    assert_eq!(m.timestamp_unix_s, 1_749_416_383);
    let json: serde_json::Value = serde_json::from_str(&m.message_json).expect("message json kept");
    assert_eq!(json["text"]["body"], "Does it come in another color?");
}

#[test]
fn documented_failed_status() {
    let parsed = parse(STATUS_FAILED.as_bytes()).expect("parses");
    let s = &parsed.statuses[0];
    assert_eq!(s.status(), DeliveryStatus::Failed);
    assert_eq!(s.error_code, 131049);
    assert!(s.error_title.contains("healthy ecosystem"));
    assert!(s.operation_id.is_empty(), "no callback data on this one");
}

#[test]
fn value_errors_other_fields_and_bad_bodies() {
    let body = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[
        {"field":"messages","value":{"metadata":{"phone_number_id":"2"},
          "errors":[{"code":130429,"title":"Rate limit hit","message":"x","error_data":{"details":"y"}}]}},
        {"field":"message_template_status_update","value":{"event":"APPROVED"}},
        {"field":"messages","value":{"metadata":{"phone_number_id":"2"},
          "statuses":[{"id":"wamid.X","status":"deleted","timestamp":1}]}}]}]}"#;
    let parsed = parse(body.as_bytes()).expect("parses");
    assert_eq!(
        parsed.errors,
        vec![ValueError {
            waba_id: "1".into(),
            phone_number_id: "2".into(),
            code: 130429,
            title: "Rate limit hit".into()
        }]
    );
    assert_eq!(parsed.ignored_changes, 1);
    assert_eq!(parsed.unknown_statuses, 1);
    assert!(matches!(parse(b"{not json"), Err(ParseError::Json(_))));
    assert!(matches!(parse(br#"{"object":"page","entry":[]}"#), Err(ParseError::Object(_))));
    assert!(matches!(parse(br#"{"object":"whatsapp_business_account","entry":"x"}"#), Err(ParseError::Json(_))));
}

#[test]
fn signatures() {
    let secret = b"app-secret";
    let body = STATUS_SENT.as_bytes();
    let header = sign(secret, body);
    assert!(header.starts_with("sha256=") && header.len() == 7 + 64);
    assert!(signature_valid(secret, body, Some(&header)));
    assert!(!signature_valid(b"other-secret", body, Some(&header)));
    let mut tampered = body.to_vec();
    tampered[10] ^= 1;
    assert!(!signature_valid(secret, &tampered, Some(&header)));
    assert!(!signature_valid(secret, body, None));
    assert!(!signature_valid(secret, body, Some(&header[7..])), "prefix required");
    assert!(!signature_valid(secret, body, Some("sha256=zz")));
    assert!(!signature_valid(secret, body, Some(&header[..header.len() - 2])), "short signature");
    assert!(!signature_valid(b"", body, Some(&sign(b"", body))), "empty secret never validates");
}

#[test]
fn dedup_keys_are_kv_safe_and_distinct() {
    let a = status_dedup_key("wamid.HBgL+/=", DeliveryStatus::Sent);
    let b = status_dedup_key("wamid.HBgL+/=", DeliveryStatus::Read);
    assert_ne!(a, b);
    assert!(a.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'.'));
    assert_ne!(inbound_dedup_key("wamid.A"), inbound_dedup_key("wamid.B"));
}
