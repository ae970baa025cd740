//! Masking of personal data for logs, spans, CLI output and Redis keys.
//!
//! Full phone numbers never leave the process in clear: logs get [`phone`], Redis keys get [`recipient_key`].

use sha2::{Digest, Sha256};

/// Masks a phone number keeping the country prefix hint and the last 3 digits: `+549******234`.
pub fn phone(number: &str) -> String {
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
    let digits: String = number.chars().filter(|c| c.is_ascii_digit()).collect();
    let hash = Sha256::digest(digits.as_bytes());
    hex::encode(&hash[..8])
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
}
