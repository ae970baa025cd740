//! The sender page: the breaker's window (calls, failure rate), its state timeline from the breaker's
//! transition events (BW_EVENTS `bw.breaker.v1.<phone_number_id>`, as a chart and a table), its pauses, its DLQ
//! entries per reason and the most recent ones, its recent dispatch outcomes (`bw.outcome.v1.<phone_number_id>`),
//! the breaker actions, and from Redis its pair back-offs, its recipients' holds and Meta's stated throughput
//! ([`crate::holds`]).

use crate::auth::{Principal, require};
use crate::html::{self, action_button, age, bars, esc, state_label, table, utc};
use crate::view::View;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use bw_common::time::now_ms;
use bw_proto::v1::{BreakerState, BreakerTransition, DispatchOutcome};
use prost::Message as _;
use std::fmt::Write as _;

/// Transitions shown on the page (the newest).
const TIMELINE: usize = 50;
/// DLQ entries and dispatch outcomes listed on the page (the newest).
const RECENT: usize = 20;
/// How far back the page reads the sender's dispatch outcomes, and at most how many.
const OUTCOMES_SPAN: std::time::Duration = std::time::Duration::from_secs(120);
const OUTCOMES_MAX: usize = 2_000;

fn state_name(s: BreakerState) -> String {
    s.as_str_name().trim_start_matches("BREAKER_STATE_").to_string()
}

/// The state timeline as an inline SVG strip: one segment per state held, labelled with the state's name.
pub fn timeline_svg(transitions: &[BreakerTransition], now: i64) -> String {
    let Some(first) = transitions.first() else {
        return "<p>No breaker transition recorded for this sender.</p>".into();
    };
    let start = first.at_unix_ms;
    let span = (now - start).max(1) as f64;
    let mut out = String::from(
        "<svg class=\"chart\" role=\"img\" aria-label=\"Breaker state timeline\" viewBox=\"0 0 800 60\" \
         width=\"800\" height=\"60\"><title>Breaker state timeline</title>",
    );
    for (i, t) in transitions.iter().enumerate() {
        let end = transitions.get(i + 1).map(|n| n.at_unix_ms).unwrap_or(now);
        let x = ((t.at_unix_ms - start) as f64 / span * 780.0) + 10.0;
        let w = (((end - t.at_unix_ms) as f64 / span) * 780.0).max(1.0);
        let name = state_name(t.to());
        let fill = match t.to() {
            BreakerState::Closed | BreakerState::ForcedClosed => "#1a7f37",
            BreakerState::HalfOpen => "#9a6700",
            _ => "#cf222e",
        };
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" y=\"8\" width=\"{w:.1}\" height=\"20\" fill=\"{fill}\">\
             <title>{name} from {}</title></rect>",
            utc(t.at_unix_ms)
        );
        if w > 60.0 {
            let _ = write!(out, "<text x=\"{:.1}\" y=\"45\">{name}</text>", x + 2.0);
        }
    }
    let _ = write!(out, "<text x=\"10\" y=\"58\">{}</text><text x=\"640\" y=\"58\">now</text></svg>", utc(start));
    out
}

/// The dispatcher's outcomes of `phone` over the last [`OUTCOMES_SPAN`] (BW_EVENTS `bw.outcome.v1.<phone>`; no
/// recipient in them), oldest first, at most [`OUTCOMES_MAX`], read through an ephemeral consumer.
pub async fn recent_outcomes(js: &async_nats::jetstream::Context, phone: &str) -> Vec<DispatchOutcome> {
    use async_nats::jetstream::consumer;
    use futures::StreamExt as _;
    let Ok(stream) = js.get_stream(bw_wire::names::EVENTS_STREAM).await else { return Vec::new() };
    let start = time::OffsetDateTime::now_utc() - OUTCOMES_SPAN;
    let config = consumer::pull::Config {
        filter_subject: bw_wire::names::outcome_subject(phone),
        deliver_policy: consumer::DeliverPolicy::ByStartTime { start_time: start },
        ack_policy: consumer::AckPolicy::None,
        inactive_threshold: std::time::Duration::from_secs(30),
        ..Default::default()
    };
    let Ok(mut c) = stream.create_consumer(config).await else { return Vec::new() };
    let pending = c.info().await.map(|i| i.num_pending as usize).unwrap_or(0);
    let mut out = Vec::new();
    if pending > 0
        && let Ok(mut batch) = c
            .fetch()
            .max_messages(pending.min(OUTCOMES_MAX))
            .expires(std::time::Duration::from_secs(2))
            .messages()
            .await
    {
        while let Some(Ok(m)) = batch.next().await {
            if let Ok(o) = DispatchOutcome::decode(m.payload.as_ref()) {
                out.push(o);
            }
        }
    }
    let name = c.cached_info().name.clone();
    let _ = stream.delete_consumer(&name).await;
    out
}

/// The dispatch outcomes part of the page: counts by result (an SVG chart) and the newest ones.
pub fn outcomes_section(outcomes: &[DispatchOutcome]) -> String {
    let mut by: std::collections::BTreeMap<String, u64> = Default::default();
    for o in outcomes {
        *by.entry(if o.result.is_empty() { "unknown".into() } else { o.result.clone() }).or_default() += 1;
    }
    let mut out = format!(
        "<h2>Recent outcomes: {} dispatch tries in the last {} s</h2>",
        outcomes.len(),
        OUTCOMES_SPAN.as_secs()
    );
    out.push_str(&bars("Dispatch outcomes by result", &by.into_iter().collect::<Vec<_>>()));
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .rev()
        .take(RECENT)
        .map(|o| {
            vec![
                utc(o.at_unix_ms),
                format!("<a href=\"/op?id={}\">{}</a>", html::url(&o.operation_id), esc(&o.operation_id)),
                esc(&o.result),
                esc(&o.decision),
                if o.meta_code == 0 { "-".into() } else { o.meta_code.to_string() },
                if o.http_status == 0 { "-".into() } else { o.http_status.to_string() },
                o.attempt.to_string(),
                esc(&o.lane),
            ]
        })
        .collect();
    out.push_str(&table(
        "The newest dispatch outcomes",
        &["At", "Operation", "Result", "Admission", "Code", "HTTP", "Attempt", "Lane"],
        &rows,
    ));
    out
}

/// The whole sender page body.
pub fn render(phone: &str, view: &View, transitions: &[BreakerTransition], who: &Principal, now: i64) -> String {
    let mut out = String::new();
    match view.scopes.get(phone) {
        Some(s) => {
            let state = state_name(s.state());
            let _ = write!(
                out,
                "<dl><dt>Breaker</dt><dd>{} since {} ({} ago){}</dd><dt>Window</dt><dd>{}</dd>\
                 <dt>Rate allowed</dt><dd>{}</dd><dt>Trips</dt><dd>{}</dd>\
                 <dt>Incident</dt><dd>{}</dd></dl>",
                state_label(&state),
                utc(s.since_unix_ms),
                age(now - s.since_unix_ms),
                if s.open_until_unix_ms > now {
                    format!(", may probe from {}", utc(s.open_until_unix_ms))
                } else {
                    String::new()
                },
                crate::pages::failure_text(s, view.limits.get(phone)),
                crate::pages::rate_text(s, view.limits.get(phone)),
                s.trips,
                if s.incident_id.is_empty() { "-".into() } else { esc(&s.incident_id) },
            );
            let pauses: Vec<Vec<String>> = s
                .pauses
                .iter()
                .map(|p| {
                    vec![
                        esc(&p.level),
                        esc(&p.id),
                        if p.code == 0 { "-".into() } else { p.code.to_string() },
                        esc(&bw_ops::views::mask_digits(&p.reason)),
                        utc(p.since_unix_ms),
                        if p.until_unix_ms > 0 { utc(p.until_unix_ms) } else { "until lifted".into() },
                        format!("{}{}", esc(&p.lift), if p.marketing_only { " (marketing only)" } else { "" }),
                        esc(&p.source),
                    ]
                })
                .collect();
            out.push_str(&table(
                "Pauses holding this sender (number, WABA, app, token)",
                &["Level", "Id", "Code", "Reason", "Since", "Until", "Lifted by", "Set by"],
                &pauses,
            ));
        }
        None => out.push_str("<p>No breaker snapshot for this sender (the coordinator has not seen it).</p>"),
    }
    let scope = [("scope", phone)];
    out.push_str("<h2>Breaker actions</h2><p>");
    out.push_str(&action_button(who, "breaker_force_open", "Force open", &scope));
    out.push_str(&action_button(who, "breaker_force_closed", "Force closed", &scope));
    out.push_str(&action_button(who, "breaker_clear", "Clear override", &scope));
    out.push_str(&action_button(who, "breaker_reset", "Reset breaker", &scope));
    if !who.may_act() {
        out.push_str("Actions need the operator role.");
    }
    out.push_str("</p><h2>State timeline</h2>");
    out.push_str(&timeline_svg(transitions, now));
    let rows: Vec<Vec<String>> = transitions
        .iter()
        .rev()
        .map(|t| {
            vec![
                utc(t.at_unix_ms),
                format!("{} → {}", state_label(&state_name(t.from())), state_label(&state_name(t.to()))),
                esc(&bw_ops::views::mask_digits(&t.reason)),
                format!("{:.1}% of {}", t.failure_rate * 100.0, t.calls_in_window),
                esc(&t.incident_id),
            ]
        })
        .collect();
    out.push_str(&table("Transitions (newest first)", &["At", "Change", "Why", "Failures", "Incident"], &rows));
    let mine: Vec<&crate::view::DlqRow> = view.dlq.iter().filter(|r| r.scope == phone).collect();
    let mut reasons: std::collections::BTreeMap<&str, u64> = Default::default();
    for r in &mine {
        *reasons.entry(r.reason).or_default() += 1;
    }
    let _ = write!(out, "<h2>DLQ: {} entries</h2>", mine.len());
    out.push_str(&bars(
        "This sender's DLQ entries by reason",
        &reasons.iter().map(|(k, v)| (k.to_string(), *v)).collect::<Vec<_>>(),
    ));
    let recent: Vec<Vec<String>> = mine
        .iter()
        .rev()
        .take(RECENT)
        .map(|r| {
            vec![
                format!("<a href=\"/op?id={}\">{}</a>", html::url(&r.operation_id), esc(&r.operation_id)),
                esc(&r.recipient),
                esc(r.category),
                esc(r.reason),
                if r.meta_code == 0 { "-".into() } else { r.meta_code.to_string() },
                utc(r.dead_lettered_at_ms),
            ]
        })
        .collect();
    out.push_str(&table(
        "The newest DLQ entries (recipient masked)",
        &["Operation", "Recipient", "Category", "Reason", "Code", "Dead-lettered"],
        &recent,
    ));
    let _ = write!(out, "<p><a href=\"/dlq?sender={}\">Every DLQ entry of this sender</a></p>", html::url(phone));
    out
}

/// The section of the sender's holds in Redis (or why they could not be read).
pub fn holds_section(holds: &Result<crate::holds::Holds, String>) -> String {
    let mut out = String::from("<h2>Pair and recipient holds</h2>");
    let h = match holds {
        Ok(h) => h,
        Err(e) => {
            let _ =
                write!(out, "<p class=\"error\" role=\"alert\">Not read: {}</p>", esc(&bw_ops::views::mask_digits(e)));
            return out;
        }
    };
    let stated = if h.throughput.mps > 0 {
        format!(
            "Meta's stated throughput: {} messages/s ({} at {}); bwctl throughput clear forgets it.",
            h.throughput.mps,
            esc(&h.throughput.event),
            utc(h.throughput.at_ms)
        )
    } else {
        "Meta's stated throughput: none recorded (the configured rate applies).".to_string()
    };
    let _ = write!(out, "<p id=\"stated-throughput\">{stated}</p>");
    let until = |ms: i64| format!("{} (in {})", utc(ms), age(ms - h.now_ms));
    let pairs: Vec<Vec<String>> = h
        .pairs
        .iter()
        .map(|p| vec![esc(&p.recipient), "131056 pair rate back-off".into(), p.backoffs.to_string(), until(p.until_ms)])
        .collect();
    out.push_str(&table(
        "Pair back-offs of this sender (recipient masked)",
        &["Recipient", "Reason", "Back-offs in a row", "Ends"],
        &pairs,
    ));
    let recipients: Vec<Vec<String>> = h
        .recipients
        .iter()
        .map(|r| {
            let (reason, end) = match r.code {
                131_049 => ("131049 marketing cool-off (every sender of the tenant)", until(r.until_ms)),
                131_050 => ("131050 the user stopped marketing", "when the user resumes".to_string()),
                code => (if code == 130_472 { "130472 Meta's marketing experiment" } else { "suppressed" }, "-".into()),
            };
            vec![esc(&r.recipient), esc(reason), end]
        })
        .collect();
    out.push_str(&table(
        "Recipient holds on this sender's recent recipients (recipient masked; marketing only)",
        &["Recipient", "Reason", "Ends"],
        &recipients,
    ));
    if h.partial {
        let _ = write!(
            out,
            "<p class=\"note\">Partial: the page stops after {} SCAN steps or {} pairs.</p>",
            crate::holds::SCAN_STEPS,
            crate::holds::MAX_PAIRS
        );
    }
    out
}

/// The tenant `phone` sends for (the sender registry; unregistered numbers send for the default tenant).
async fn tenant_of(js: &async_nats::jetstream::Context, phone: &str) -> String {
    let record = match js.get_key_value(bw_wire::names::SENDERS_BUCKET).await {
        Ok(kv) => kv.get(phone).await.ok().flatten(),
        Err(_) => None,
    };
    record
        .and_then(|b| bw_proto::v1::SenderRecord::decode(b).ok())
        .map(|r| r.tenant)
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| bw_wire::tenancy::DEFAULT_TENANT.to_string())
}

/// The newest transitions of `phone`, oldest first.
pub async fn transitions(js: &async_nats::jetstream::Context, phone: &str) -> Vec<BreakerTransition> {
    let subject = bw_wire::names::breaker_subject(phone);
    let messages = bw_ops::scan::scan_stream(js, bw_wire::names::EVENTS_STREAM, &subject).await.unwrap_or_default();
    let skip = messages.len().saturating_sub(TIMELINE);
    messages.iter().skip(skip).filter_map(|m| BreakerTransition::decode(m.payload.as_ref()).ok()).collect()
}

pub async fn page(State(app): State<crate::app::Shared>, headers: HeaderMap, Path(phone): Path<String>) -> Response {
    let who = match require(&app, &headers) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    if phone.is_empty() || phone.len() > 32 || !phone.bytes().all(|b| b.is_ascii_digit()) {
        return crate::pages::refusal(StatusCode::BAD_REQUEST, &who, "a sender is a phone_number_id (digits)");
    }
    let view = app.view.borrow().clone();
    // Only senders Breakwater knows get a page: a phone number typed by mistake is never echoed back.
    if !view.scopes.contains_key(&phone) && !view.dlq.iter().any(|r| r.scope == phone) {
        return crate::pages::refusal(
            StatusCode::NOT_FOUND,
            &who,
            "no such sender (no breaker snapshot, no DLQ entry)",
        );
    }
    let transitions = transitions(&app.js, &phone).await;
    let outcomes = recent_outcomes(&app.js, &phone).await;
    let waba = view.scopes.get(&phone).and_then(|s| s.scope.as_ref()).map(|s| s.waba_id.clone());
    let holds = match (&app.redis, waba) {
        (Some(redis), Some(waba)) => {
            let scope = bw_breaker::Scope::new(waba, phone.clone());
            let tenant = tenant_of(&app.js, &phone).await;
            crate::holds::read(redis, &scope, &tenant).await.map_err(|e| e.to_string())
        }
        (None, _) => Err("the console runs without Redis (redis.url is empty)".to_string()),
        (_, None) => Err("no breaker snapshot names this sender's WABA".to_string()),
    };
    let body = format!(
        "{}{}{}",
        render(&phone, &view, &transitions, &who, now_ms()),
        holds_section(&holds),
        outcomes_section(&outcomes)
    );
    let title = format!("Sender {phone}");
    let live = format!("/senders/{phone}");
    (StatusCode::OK, Html(html::page(&title, &who, &body, Some(&live)))).into_response()
}
