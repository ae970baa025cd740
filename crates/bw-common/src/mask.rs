//! Masking of personal data for logs, spans, CLI output and Redis keys.
//!
//! Full phone numbers never leave the process in clear: logs get [`phone`], Redis keys get [`recipient_key`].
//! A recipient is either an E.164 phone number or a business-scoped user id (BSUID, reference §6); both are
//! personal data, and both functions take either form.

use sha2::{Digest, Sha256};

/// True for a business-scoped user id: an ISO country code, `.`, an optional `ENT.` (parent id), then 1 to 128
/// letters or digits (`US.13491208655302741918`, `US.ENT.11815799212886844830`).
pub fn is_user_id(s: &str) -> bool {
    let Some((cc, rest)) = s.split_once('.') else { return false };
    let rest = rest.strip_prefix("ENT.").unwrap_or(rest);
    cc.len() == 2
        && cc.bytes().all(|b| b.is_ascii_uppercase())
        && (1..=128).contains(&rest.len())
        && rest.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Masks a user id like a phone number: the country and the last 3 characters (`US.*****************918`).
pub fn user_id(id: &str) -> String {
    let (cc, rest) = id.split_once('.').unwrap_or(("", id));
    let rest: Vec<char> = rest.chars().collect();
    if rest.len() < 7 {
        return format!("{cc}.***");
    }
    let tail: String = rest[rest.len() - 3..].iter().collect();
    format!("{cc}.{}{tail}", "*".repeat(rest.len() - 3))
}

/// Masks a recipient keeping the country prefix hint and the last 3 digits: `+549******234`; a user id as
/// [`user_id`] does.
pub fn phone(number: &str) -> String {
    if is_user_id(number) {
        return user_id(number);
    }
    let digits: Vec<char> = number.chars().filter(|c| c.is_ascii_digit()).collect();
    if digits.len() < 7 {
        return "***".to_string();
    }
    let head: String = digits[..3].iter().collect();
    let tail: String = digits[digits.len() - 3..].iter().collect();
    format!("+{head}{}{tail}", "*".repeat(digits.len() - 6))
}

/// A stable, non-reversible key for a recipient (first 16 hex chars of sha256 of the digits),
/// used for pair-rate keys so Redis never holds phone numbers.
pub fn recipient_key(number: &str) -> String {
    if is_user_id(number) {
        // The prefix keeps a user id's key apart from a phone with the same digits (`US.1650...` vs `+1650...`).
        return hex::encode(&Sha256::digest(format!("user_id:{number}").as_bytes())[..8]);
    }
    let digits: String = number.chars().filter(|c| c.is_ascii_digit()).collect();
    let hash = Sha256::digest(digits.as_bytes());
    hex::encode(&hash[..8])
}

/// Replaces every run of at least `min_digits` digits in free text (a phone number, perhaps) by `replace(run)`;
/// shorter runs (Meta's error codes) stay. A run may start with a `+` that does not follow a digit; `replace`
/// gets the run with it.
pub fn digit_runs(text: &str, min_digits: usize, replace: impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.trim_start_matches('+').len() >= min_digits {
            out.push_str(&replace(run));
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() || (c == '+' && run.is_empty()) {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Masks free text that may hold personal data: keeps its length only.
pub fn body(text: &str) -> String {
    format!("<{} chars>", text.chars().count())
}

#[cfg(test)]
mod tests {
    #[test]
    fn masks_keep_no_full_number() {
        let masked = super::phone("+5491155551234");
        assert_eq!(masked, "+549*******234");
        assert!(!masked.contains("5491155551234"));
        assert_eq!(super::phone("+12"), "***");
        assert_eq!(super::recipient_key("+5491155551234"), super::recipient_key("5491155551234"));
        assert_eq!(super::recipient_key("+5491155551234").len(), 16);
        assert_eq!(super::body("hola"), "<4 chars>");
    }

    #[test]
    fn digit_runs_are_replaced_from_their_length_and_codes_stay() {
        let phones = |t: &str| super::digit_runs(t, 8, super::phone);
        assert_eq!(phones("to +5491155551234: 131026"), "to +549*******234: 131026");
        assert_eq!(phones("code 1234567 stays"), "code 1234567 stays");
        let hidden = |t: &str| super::digit_runs(t, 7, |_| "<digits>".into());
        assert_eq!(hidden("a +"), "a +");
        assert_eq!(hidden("5491155551234x"), "<digits>x");
    }

    #[test]
    fn user_ids_are_masked_and_keyed_apart_from_phones() {
        let id = "US.13491208655302741918";
        assert!(super::is_user_id(id) && super::is_user_id("US.ENT.11815799212886844830"));
        for bad in ["+13491208655302741918", "us.1349", "USA.1349", "US.", "US.12-34", "US.ENT."] {
            assert!(!super::is_user_id(bad), "{bad}");
        }
        assert_eq!(super::phone(id), "US.*****************918");
        assert!(!super::phone(id).contains("1349120865530274"));
        assert_eq!(super::phone("US.12"), "US.***");
        assert_ne!(super::recipient_key(id), super::recipient_key("+13491208655302741918"));
        assert_eq!(super::recipient_key(id).len(), 16);
        assert_ne!(super::recipient_key(id), super::recipient_key("US.13491208655302741919"));
    }
}
