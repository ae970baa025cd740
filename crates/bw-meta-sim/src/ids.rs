//! Identifiers (wamids, fbtrace ids), a lock-free seeded RNG, and phone-number masking.

use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicU64, Ordering};

/// A SplitMix64 generator on an atomic counter: lock-free, and deterministic for a given seed when calls are
/// sequential (tests send one request at a time when they need exact sequences).
#[derive(Debug)]
pub struct Rng {
    state: AtomicU64,
}

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: AtomicU64::new(seed) }
    }

    pub fn reseed(&self, seed: u64) {
        self.state.store(seed, Ordering::Relaxed);
    }

    pub fn next_u64(&self) -> u64 {
        let mut z = self.state.fetch_add(GAMMA, Ordering::Relaxed).wrapping_add(GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Process-wide RNG for ids (not part of any scenario's determinism).
static ID_RNG: AtomicU64 = AtomicU64::new(0);

fn id_u64() -> u64 {
    if ID_RNG.load(Ordering::Relaxed) == 0 {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        let _ = ID_RNG.compare_exchange(0, seed, Ordering::Relaxed, Ordering::Relaxed);
    }
    let mut z = ID_RNG.fetch_add(GAMMA, Ordering::Relaxed).wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(B64[(n >> 18) as usize & 63] as char);
        out.push(B64[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 { B64[(n >> 6) as usize & 63] as char } else { '=' });
        out.push(if chunk.len() > 2 { B64[n as usize & 63] as char } else { '=' });
    }
    out
}

/// A wamid shaped like Meta's: `wamid.` + base64 of a small protobuf-like blob holding the recipient's digits
/// and a random 18-character hex message key (`wamid.HBgL...`).
pub fn wamid(wa_id: &str) -> String {
    let digits: Vec<u8> = wa_id.bytes().filter(u8::is_ascii_digit).take(20).collect();
    let mut blob = Vec::with_capacity(48);
    blob.extend_from_slice(&[0x1C, 0x18, digits.len() as u8]);
    blob.extend_from_slice(&digits);
    blob.extend_from_slice(&[0x15, 0x02, 0x00, 0x11, 0x18, 0x12]);
    let key = format!("{:016X}{:02X}", id_u64(), id_u64() & 0xFF);
    blob.extend_from_slice(key.as_bytes());
    blob.push(0x00);
    format!("wamid.{}", base64(&blob))
}

/// An fbtrace id like `Az8or2yhqkZfEZ-_4Qn_Bam` (23 url-safe characters).
pub fn fbtrace_id() -> String {
    const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(23);
    let mut bits = id_u64();
    for i in 0..23 {
        if i == 10 {
            bits = id_u64();
        }
        out.push(URL[(bits & 63) as usize] as char);
        bits >>= 6;
    }
    out
}

/// A random hex id of `n` bytes (conversation ids).
pub fn hex_id(n: usize) -> String {
    let mut bytes = Vec::with_capacity(n);
    while bytes.len() < n {
        bytes.extend_from_slice(&id_u64().to_le_bytes());
    }
    bytes.truncate(n);
    hex::encode(bytes)
}

/// Digits only: Meta's `wa_id` for a `to` of `+16505551234` is `16505551234`.
pub fn wa_id(to: &str) -> String {
    to.chars().filter(char::is_ascii_digit).collect()
}

/// Masks a phone number keeping the country prefix hint and the last 3 digits (`+549*******234`); the same
/// rule as `bw_common::mask::phone`.
pub fn mask_phone(number: &str) -> String {
    let digits: Vec<char> = number.chars().filter(char::is_ascii_digit).collect();
    if digits.len() < 7 {
        return "***".to_string();
    }
    let head: String = digits[..3].iter().collect();
    let tail: String = digits[digits.len() - 3..].iter().collect();
    format!("+{head}{}{tail}", "*".repeat(digits.len() - 6))
}

/// A stable non-reversible recipient key: first 16 hex characters of sha256 of the digits; the same rule as
/// `bw_common::mask::recipient_key`, so tests can correlate the oracle with Breakwater's own keys.
pub fn recipient_key(number: &str) -> String {
    // A user id is hashed whole: its digits alone would drop the country and the `ENT.` marker.
    let digits = if is_user_id(number) { number.to_string() } else { wa_id(number) };
    let hash = Sha256::digest(digits.as_bytes());
    hex::encode(&hash[..8])
}

/// Whether `s` is a business-scoped user id (reference §6): an ISO 3166 alpha-2 country code, `.`, an optional
/// `ENT.` (parent ids), then 1 to 128 ASCII letters or digits.
pub fn is_user_id(s: &str) -> bool {
    let Some((cc, rest)) = s.split_once('.') else { return false };
    let rest = rest.strip_prefix("ENT.").unwrap_or(rest);
    cc.len() == 2
        && cc.bytes().all(|b| b.is_ascii_uppercase())
        && (1..=128).contains(&rest.len())
        && rest.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Masks a user id like a phone number: the country and the last 3 characters (`US.*****************918`).
pub fn mask_user_id(user_id: &str) -> String {
    let (cc, rest) = user_id.split_once('.').unwrap_or(("", user_id));
    let n = rest.chars().count();
    if n < 4 {
        return format!("{cc}.***");
    }
    let tail: String = rest.chars().skip(n - 3).collect();
    format!("{cc}.{}{tail}", "*".repeat(n - 3))
}

/// The ISO country of a phone number's calling code, for the user ids the simulator derives ("ZZ" when the
/// code is not in this short list).
pub fn country_of(wa_id: &str) -> &'static str {
    const CODES: &[(&str, &str)] = &[
        ("1", "US"),
        ("7", "RU"),
        ("20", "EG"),
        ("27", "ZA"),
        ("31", "NL"),
        ("33", "FR"),
        ("34", "ES"),
        ("39", "IT"),
        ("44", "GB"),
        ("49", "DE"),
        ("52", "MX"),
        ("54", "AR"),
        ("55", "BR"),
        ("56", "CL"),
        ("57", "CO"),
        ("62", "ID"),
        ("63", "PH"),
        ("65", "SG"),
        ("81", "JP"),
        ("82", "KR"),
        ("90", "TR"),
        ("91", "IN"),
        ("234", "NG"),
        ("254", "KE"),
        ("966", "SA"),
        ("971", "AE"),
    ];
    CODES.iter().filter(|(code, _)| wa_id.starts_with(code)).max_by_key(|(code, _)| code.len()).map_or("ZZ", |c| c.1)
}

/// The business-scoped user id the simulator gives `wa_id` in `portfolio`: stable, unique per portfolio × user
/// (reference §6), 20 digits after the country.
pub fn derive_user_id(portfolio: &str, wa_id: &str) -> String {
    let hash = Sha256::digest(format!("{portfolio}:{wa_id}").as_bytes());
    let n = u128::from_be_bytes(hash[..16].try_into().unwrap_or([0; 16])) % 10u128.pow(20);
    format!("{}.{n:020}", country_of(wa_id))
}

/// Whether a `+1` number is a US number, for Meta's pause of marketing templates to US numbers (reference §7):
/// NANP numbers whose area code belongs to Canada or a Caribbean country are not (an approximation: the
/// reference says "a US area code" without a list).
pub fn is_us_number(wa_id: &str) -> bool {
    const NOT_US: &[&str] = &[
        "204", "226", "236", "249", "250", "263", "289", "306", "343", "354", "365", "367", "368", "382", "403", "416",
        "418", "428", "431", "437", "438", "450", "474", "506", "514", "519", "548", "579", "581", "584", "587", "604",
        "613", "639", "647", "672", "683", "705", "709", "742", "753", "778", "780", "782", "807", "819", "825", "867",
        "873", "879", "902", "905", "242", "246", "264", "268", "284", "345", "441", "473", "649", "658", "664", "721",
        "758", "767", "784", "809", "829", "849", "868", "869", "876",
    ];
    wa_id.len() == 11 && wa_id.starts_with('1') && !NOT_US.contains(&&wa_id[1..4])
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_vectors() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn wamids_look_like_meta_and_are_unique() {
        let a = wamid("16505551234");
        let b = wamid("16505551234");
        assert!(a.starts_with("wamid.HBgL"), "{a}");
        assert_ne!(a, b);
        assert!(a.len() <= 128);
        assert_eq!(fbtrace_id().len(), 23);
    }

    #[test]
    fn seeded_rng_repeats() {
        let a = Rng::new(7);
        let b = Rng::new(7);
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        assert!((0..1000).map(|_| a.next_f64()).all(|f| (0.0..1.0).contains(&f)));
    }

    #[test]
    fn user_ids_are_recognised_derived_and_masked() {
        assert!(is_user_id("US.13491208655302741918") && is_user_id("US.ENT.11815799212886844830"));
        assert!(!is_user_id("+16505551234") && !is_user_id("us.123") && !is_user_id("US.") && !is_user_id("US.a-b"));
        let a = derive_user_id("p1", "16505551234");
        assert!(a.starts_with("US.") && a.len() == 23 && is_user_id(&a), "{a}");
        assert_eq!(a, derive_user_id("p1", "16505551234"));
        assert_ne!(a, derive_user_id("p2", "16505551234"), "unique per portfolio");
        assert_eq!(mask_user_id("US.13491208655302741918"), "US.*****************918");
        assert_eq!(country_of("5491155551234"), "AR");
        assert!(is_us_number("16505551234") && !is_us_number("14165551234") && !is_us_number("5491155551234"));
    }

    #[test]
    fn masking_hides_the_number() {
        assert_eq!(mask_phone("+5491155551234"), "+549*******234");
        assert_eq!(recipient_key("+5491155551234"), recipient_key("5491155551234"));
        assert_eq!(recipient_key("+5491155551234").len(), 16);
    }
}
