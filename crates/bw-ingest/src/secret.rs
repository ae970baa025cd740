//! Config values that must be strings whatever they look like (secrets, ids), and masking of values in
//! decoder error texts.
//!
//! The config loader parses an environment value as a TOML scalar when it parses, so
//! `BW_INGEST__WEBHOOK__VERIFY_TOKEN=8675309123` arrives as an integer; a plain `String` field then fails with
//! serde's "invalid type: integer `8675309123`", which prints the secret. [`Config::load`](crate::Config::load)
//! therefore takes secret keys from the environment verbatim (never through the scalar parser), and
//! [`string`] accepts integers and booleans from a file as their text and refuses other types without
//! showing the value.

use serde::Deserializer;
use serde::de::{self, Visitor};

struct AnyScalar {
    what: &'static str,
}

impl Visitor<'_> for AnyScalar {
    type Value = String;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} as a string (quote it); the value is not shown", self.what)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<String, E> {
        Err(E::custom(format!("{} must be a quoted string (a number would lose its text); value not shown", self.what)))
    }
}

/// A secret string field: strings, integers and booleans are taken as text; the value never appears in errors.
pub(crate) fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_any(AnyScalar { what: "a secret" })
}

/// A list of ids (phone_number_ids, WABA ids): strings or integers.
pub(crate) fn id_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Ids;
    impl<'de> Visitor<'de> for Ids {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of ids")
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            #[derive(serde::Deserialize)]
            struct Id(#[serde(deserialize_with = "string")] String);
            let mut out = Vec::new();
            while let Some(Id(id)) = seq.next_element()? {
                out.push(id);
            }
            Ok(out)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<String>, E> {
            Ok(v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Vec<String>, E> {
            Ok(vec![v.to_string()])
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Vec<String>, E> {
            Ok(vec![v.to_string()])
        }
    }
    d.deserialize_any(Ids)
}

/// Masks values a decoder error may quote: runs of 6 or more digits (phone numbers) keep only a hint
/// (`bw_common::mask::phone`), and double-quoted strings are replaced by their length. Field names (quoted
/// with backticks by serde) stay, so "unknown field `recipent`" is still precise.
pub(crate) fn mask_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            let end = chars[i + 1..].iter().position(|&x| x == '"').map(|p| i + 1 + p);
            if let Some(end) = end {
                out.push_str(&format!("\"<{} chars>\"", end - i - 1));
                i = end + 1;
                continue;
            }
        }
        if c.is_ascii_digit() || (c == '+' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            let start = i;
            let mut j = if c == '+' { i + 1 } else { i };
            while j < chars.len() && chars[j].is_ascii_digit() {
                j += 1;
            }
            let run: String = chars[start..j].iter().collect();
            let digits = run.trim_start_matches('+').len();
            if digits >= 6 {
                out.push_str(&bw_common::mask::phone(&run));
            } else {
                out.push_str(&run);
            }
            i = j;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoder_errors_lose_their_personal_values() {
        let e = "invalid type: integer `5491155550099`, expected a string at line 1 column 80";
        let m = mask_values(e);
        assert!(!m.contains("5491155550099") && m.contains("+549*******099") && m.contains("column 80"), "{m}");
        let m = mask_values(r#"invalid type: string "Hola Juan", expected i64"#);
        assert_eq!(m, r#"invalid type: string "<9 chars>", expected i64"#);
        assert_eq!(mask_values("unknown field `recipent`"), "unknown field `recipent`");
    }

    #[test]
    fn secrets_and_ids_are_strings_whatever_they_look_like() {
        #[derive(serde::Deserialize)]
        struct T {
            #[serde(deserialize_with = "string")]
            s: String,
            #[serde(deserialize_with = "id_list")]
            ids: Vec<String>,
        }
        // As the config loader does: TOML text to a table, then the typed config from the merged value.
        let typed = |text: &str| {
            let table: toml::Table = toml::from_str(text).expect("toml");
            <T as serde::Deserialize>::deserialize(toml::Value::Table(table))
        };
        let t = typed("s = 8675309123\nids = [106540352242922, \"7\"]").expect("parses");
        assert_eq!((t.s.as_str(), t.ids), ("8675309123", vec!["106540352242922".to_string(), "7".to_string()]));
        let err = typed("s = 8675309.123\nids = []").err().expect("float refused").to_string();
        assert!(!err.contains("8675309"), "{err}");
    }
}
