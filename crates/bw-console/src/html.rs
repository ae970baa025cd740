//! HTML building blocks: escaping, the page layout, state labels (always text, colour only repeats it), tables,
//! times, and inline SVG bar charts. Every dynamic text goes through [`esc`].

use crate::keys::Principal;
use std::fmt::Write as _;

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a query value.
pub fn url(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A whole page. `live`: the path the live-refresh script re-reads on each server-sent event.
pub fn page(title: &str, who: &Principal, main: &str, live: Option<&str>) -> String {
    let nav = [
        ("/", "Overview"),
        ("/dlq", "DLQ"),
        ("/incidents", "Incidents"),
        ("/quarantine", "Quarantine"),
        ("/op", "Message lookup"),
    ]
    .iter()
    .map(|(href, label)| format!("<li><a href=\"{href}\">{label}</a></li>"))
    .collect::<String>();
    let user = if who.signed_in {
        format!(
            "<span>Signed in as <strong>{}</strong> ({})</span> <form method=\"post\" action=\"/logout\" \
             class=\"inline\"><button type=\"submit\">Sign out</button></form>",
            esc(&who.name),
            who.role.label()
        )
    } else {
        "<span>Viewing without a key (read only)</span> <a href=\"/login\">Sign in</a>".to_string()
    };
    let live_attr = live.map(|p| format!(" data-live=\"{}\"", esc(p))).unwrap_or_default();
    let script = if live.is_some() { "<script src=\"/assets/live.js\" defer></script>" } else { "" };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t} · Breakwater console</title><link rel=\"stylesheet\" href=\"/assets/console.css\">{script}</head>\
         <body><a class=\"skip\" href=\"#main\">Skip to content</a>\
         <header><p class=\"brand\">Breakwater console</p><nav aria-label=\"Main\"><ul>{nav}</ul></nav>\
         <div class=\"user\">{user}</div></header>\
         <main id=\"main\"{live_attr}><h1>{t}</h1>{main}</main></body></html>",
        t = esc(title)
    )
}

/// A breaker state as a text label (the colour only repeats it).
pub fn state_label(state: &str) -> String {
    let class = match state {
        "CLOSED" | "FORCED_CLOSED" => "ok",
        "HALF_OPEN" => "warn",
        _ => "bad",
    };
    format!("<span class=\"state {class}\">{}</span>", esc(state))
}

/// `2026-12-06 23:58:28 UTC`, or `-` for 0.
pub fn utc(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "-".into())
}

/// `3h 12m`, `45s`.
pub fn age(ms: i64) -> String {
    let s = (ms.max(0) / 1000) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

/// A table with a caption and column headers; cells are already HTML.
pub fn table(caption: &str, header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!("<table><caption>{}</caption><thead><tr>", esc(caption));
    for h in header {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        let _ = write!(out, "<tr><td colspan=\"{}\">none</td></tr>", header.len());
    }
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            let _ = write!(out, "<td>{c}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A horizontal bar chart as inline SVG, each bar labelled with its name and value in text.
pub fn bars(title: &str, items: &[(String, u64)]) -> String {
    let max = items.iter().map(|(_, v)| *v).max().unwrap_or(0).max(1);
    let row_h = 22;
    let h = (items.len().max(1) * row_h) as u32 + 8;
    let mut out = format!(
        "<figure><figcaption>{}</figcaption><svg class=\"chart\" role=\"img\" aria-label=\"{}\" \
         viewBox=\"0 0 600 {h}\" width=\"600\" height=\"{h}\"><title>{}</title>",
        esc(title),
        esc(title),
        esc(title)
    );
    if items.is_empty() {
        out.push_str("<text x=\"4\" y=\"18\">no data</text>");
    }
    for (i, (label, v)) in items.iter().enumerate() {
        let y = 4 + i * row_h;
        let w = (*v as f64 / max as f64 * 380.0).round() as u64;
        let _ = write!(
            out,
            "<text x=\"4\" y=\"{}\">{}</text><rect x=\"170\" y=\"{}\" width=\"{w}\" height=\"16\" class=\"bar\"/>\
             <text x=\"{}\" y=\"{}\">{v}</text>",
            y + 13,
            esc(label),
            y,
            175 + w,
            y + 13
        );
    }
    out.push_str("</svg></figure>");
    out
}

/// A line of `label=value` counts, or `none`.
pub fn counts<'a>(items: impl IntoIterator<Item = (&'a str, &'a u64)>) -> String {
    let parts: Vec<String> = items.into_iter().map(|(k, v)| format!("{}&nbsp;{v}", esc(k))).collect();
    if parts.is_empty() { "none".into() } else { parts.join(", ") }
}

/// An action button: a GET form to the confirmation page, shown only to those who may act.
pub fn action_button(who: &Principal, action: &str, label: &str, fields: &[(&str, &str)]) -> String {
    if !who.may_act() {
        return String::new();
    }
    let mut out = format!(
        "<form method=\"get\" action=\"/confirm\" class=\"inline\"><input type=\"hidden\" name=\"action\" \
         value=\"{}\">",
        esc(action)
    );
    for (k, v) in fields {
        let _ = write!(out, "<input type=\"hidden\" name=\"{}\" value=\"{}\">", esc(k), esc(v));
    }
    let _ = write!(out, "<button type=\"submit\">{}</button></form>", esc(label));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_and_labels() {
        assert_eq!(esc("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
        assert_eq!(url("a b/c"), "a%20b%2Fc");
        assert!(state_label("OPEN").contains(">OPEN<"), "the state is text, not only colour");
        assert_eq!(age(3_725_000), "1h 2m");
        assert_eq!(utc(0), "-");
        assert!(bars("t", &[("x".into(), 3)]).contains(">3<"));
    }
}
