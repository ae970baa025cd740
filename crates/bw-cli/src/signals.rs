//! `bwctl signals`: the last account signals Meta sent (BW_ACCOUNT, published by ingest from webhook fields
//! beyond `messages`), newest last, optionally of one WABA. Users are shown as the hashes the signals carry;
//! nothing personal is in them (proto/bw/v1/account.proto).

use crate::fmt;
use async_nats::jetstream;
use bw_proto::v1::AccountSignal;
use bw_proto::v1::account_signal::Kind;
use bw_wire::names;
use prost::Message as _;
use std::io::Write;

/// Arguments of `bwctl signals`.
#[derive(Debug, clap::Args)]
pub struct SignalsArgs {
    /// Only the signals of this WABA.
    #[arg(long)]
    pub waba: Option<String>,
    /// How many of the newest to show.
    #[arg(long, default_value_t = 50)]
    pub last: usize,
}

/// One line of what a signal says.
pub fn describe(kind: Option<&Kind>) -> String {
    let or_dash = |s: &str| if s.is_empty() { "-".to_string() } else { s.to_string() };
    match kind {
        None => "-".into(),
        Some(Kind::Restriction(r)) => {
            let until = if r.expiration_unix_s > 0 { fmt::utc(r.expiration_unix_s * 1000) } else { "lifted".into() };
            format!("restriction {} until {until}", r.restriction_type)
        }
        Some(Kind::Ban(b)) => format!("ban {} {}", b.ban_state, b.ban_date),
        Some(Kind::AccountEvent(e)) => format!("event {} {}", e.event, e.detail).trim_end().to_string(),
        Some(Kind::Throughput(t)) => format!("throughput {} {} mps ({})", t.event, t.mps, or_dash(&t.current_limit)),
        Some(Kind::MessagingLimit(m)) => {
            let users = match m.unique_users_per_24h {
                -1 => "unlimited".to_string(),
                0 => "not understood".to_string(),
                n => format!("{n} users/24h"),
            };
            format!("messaging limit {users} ({})", or_dash(&m.raw))
        }
        Some(Kind::TemplateStatus(t)) => {
            format!("template {} {} {} {}", t.event, t.template_name, t.template_language, or_dash(&t.other_title))
        }
        Some(Kind::TemplateQuality(t)) => {
            format!(
                "template quality {}→{} {} {}",
                or_dash(&t.previous_quality),
                t.new_quality,
                t.template_name,
                t.template_language
            )
        }
        Some(Kind::TemplateCategory(t)) if t.takes_effect_unix_s > 0 => format!(
            "template category notice {} → {} at {} {}",
            t.new_category,
            t.correct_category,
            fmt::utc(t.takes_effect_unix_s * 1000),
            t.template_name
        ),
        Some(Kind::TemplateCategory(t)) => {
            format!("template category {}→{} {}", or_dash(&t.previous_category), t.new_category, t.template_name)
        }
        Some(Kind::UserPreference(p)) => format!("user {} {} {}", p.recipient_key_hash, p.value, p.category),
        Some(Kind::Echo(e)) => format!("echo to user {}", e.recipient_key_hash),
        Some(Kind::Alert(a)) => format!("alert {} {} {} {}", a.severity, a.status, a.alert_type, a.description),
        Some(Kind::ValueError(e)) => format!("error {} {}", e.code, e.title),
        Some(Kind::Unknown(u)) => format!("not acted on; keys {}", u.value_keys.join(",")),
    }
}

/// Prints the table; exits 0.
pub async fn run(js: &jetstream::Context, args: &SignalsArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let filter = match &args.waba {
        Some(waba) => {
            // The subject's last token is the WABA id as `names::account_subject` writes it.
            let subject = names::account_subject("any", waba);
            anyhow::ensure!(subject.ends_with(&format!(".{waba}")), "--waba must be a WABA id ([A-Za-z0-9_-])");
            subject.replacen(".any.", ".*.", 1)
        }
        None => names::ACCOUNT_SUBJECTS.to_string(),
    };
    let messages = bw_ops::scan::scan_stream(js, names::ACCOUNT_STREAM, &filter).await?;
    let skip = messages.len().saturating_sub(args.last);
    let mut rows = Vec::new();
    for msg in messages.into_iter().skip(skip) {
        let row = match AccountSignal::decode(msg.payload.as_ref()) {
            Ok(s) => vec![
                fmt::utc(s.at_unix_ms),
                s.field.clone(),
                s.waba_id.clone(),
                if s.phone_number_id.is_empty() { "-".into() } else { s.phone_number_id.clone() },
                describe(s.kind.as_ref()),
            ],
            Err(e) => vec!["-".into(), msg.subject.to_string(), "-".into(), "-".into(), format!("undecodable: {e}")],
        };
        rows.push(row);
    }
    if rows.is_empty() {
        writeln!(out, "no account signals in {}", names::ACCOUNT_STREAM)?;
        return Ok(0);
    }
    write!(out, "{}", fmt::table(&["RECEIVED", "FIELD", "WABA", "NUMBER", "WHAT"], &rows))?;
    Ok(0)
}
