//! The list pages (overview, DLQ browser, incidents, quarantine), the message lookup, live refresh and the
//! embedded assets. Rendering is pure (`render_*` take a [`View`]), so the bench measures it directly.

use crate::auth::{Principal, require};
use crate::html::{self, action_button, age, bars, counts, esc, state_label, table, url, utc};
use crate::view::{DlqRow, View};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use bw_common::time::now_ms;
use std::fmt::Write as _;
use std::time::Duration;

/// A page, or the refusal page with its status.
fn respond(status: StatusCode, title: &str, who: &Principal, body: &str, live: Option<&str>) -> Response {
    (status, Html(html::page(title, who, body, live))).into_response()
}

/// A precise refusal that never echoes what was sent.
pub fn refusal(status: StatusCode, who: &Principal, what: &str) -> Response {
    let body =
        format!("<p class=\"error\" role=\"alert\">{}</p><p><a href=\"/\">Back to the overview</a></p>", esc(what));
    respond(status, "Refused", who, &body, None)
}

fn freshness(view: &View, now: i64) -> String {
    let mut out = format!(
        "<p class=\"note\">As read at {} ({} ago, in {} ms).</p>",
        utc(view.read_at_ms),
        age(now - view.read_at_ms),
        view.read_took_ms
    );
    if let Some(e) = &view.error {
        let _ = write!(out, "<p class=\"error\" role=\"alert\">The last read failed: {}</p>", esc(e));
    }
    out
}

fn sender_link(phone: &str) -> String {
    format!("<a href=\"/senders/{}\">{}</a>", url(phone), esc(phone))
}

fn pause_text(p: &bw_proto::v1::ScopePause, now: i64) -> String {
    let end = if p.until_unix_ms > 0 {
        format!("until {} (in {})", utc(p.until_unix_ms), age(p.until_unix_ms - now))
    } else {
        "until lifted".to_string()
    };
    let code = if p.code == 0 { String::new() } else { format!(" code {}", p.code) };
    format!(
        "{} {}{code}: {} — {end}, lifted by {}{}",
        esc(&p.level),
        esc(&p.id),
        esc(&bw_ops::views::mask_digits(&p.reason)),
        esc(&p.lift),
        if p.marketing_only { " (marketing only)" } else { "" }
    )
}

/// The rate the breaker allows now against the sender's limit (the ramp's share of it).
pub fn rate_text(s: &bw_proto::v1::ScopeSnapshot, limits: Option<&crate::view::Limits>) -> String {
    use bw_proto::v1::BreakerState;
    let limit = limits.map(|l| format!(" of {:.1}/s", l.rate_per_s)).unwrap_or_default();
    match s.state() {
        BreakerState::Open | BreakerState::ForcedOpen => return format!("none while OPEN{limit}"),
        BreakerState::HalfOpen => return format!("canaries only while HALF_OPEN{limit}"),
        _ => {}
    }
    let share = if s.ramp_fraction > 0.0 { s.ramp_fraction } else { 1.0 };
    match limits {
        Some(l) => format!("{:.1}/s of {:.1}/s ({:.0}%)", share * l.rate_per_s, l.rate_per_s, share * 100.0),
        None => format!("{:.0}% of its limit (limit unknown: coordinator not reachable)", share * 100.0),
    }
}

/// The window's failure rate against the trip threshold.
pub fn failure_text(s: &bw_proto::v1::ScopeSnapshot, limits: Option<&crate::view::Limits>) -> String {
    let rate = format!("{:.1}% of {} calls", s.failure_rate * 100.0, s.calls_in_window);
    match limits {
        Some(l) => format!(
            "{rate}; trips at {:.0}% once {} calls in {} s",
            l.failure_threshold * 100.0,
            l.min_calls,
            l.window_ms / 1000
        ),
        None => format!("{rate} (threshold unknown: coordinator not reachable)"),
    }
}

/// The overview: senders, DLQ depth by reason and category, incidents, firing alerts.
pub fn render_overview(view: &View, who: &Principal, now: i64) -> String {
    let mut out = freshness(view, now);
    let depth = view.dlq_depth_by_scope();
    let rows: Vec<Vec<String>> = view
        .senders()
        .iter()
        .map(|phone| {
            let s = view.scopes.get(phone);
            let state = s.map(|s| s.state().as_str_name().trim_start_matches("BREAKER_STATE_").to_string());
            let pauses: Vec<String> =
                s.map(|s| s.pauses.iter().map(|p| pause_text(p, now)).collect()).unwrap_or_default();
            vec![
                sender_link(phone),
                state.as_deref().map(state_label).unwrap_or_else(|| "no snapshot".into()),
                s.map(|s| format!("{} ago", age(now - s.since_unix_ms))).unwrap_or_default(),
                s.map(|s| rate_text(s, view.limits.get(phone))).unwrap_or_default(),
                s.map(|s| failure_text(s, view.limits.get(phone))).unwrap_or_default(),
                if pauses.is_empty() { "none".into() } else { pauses.join("<br>") },
                depth.get(phone).copied().unwrap_or(0).to_string(),
            ]
        })
        .collect();
    out.push_str(&table(
        "Senders",
        &[
            "Sender",
            "Breaker",
            "Since",
            "Rate allowed now / limit",
            "Failures in window / threshold",
            "Pauses (scope, reason, end)",
            "DLQ",
        ],
        &rows,
    ));
    let _ = write!(out, "<h2>DLQ: {} entries</h2>", view.dlq.len());
    let by_reason: Vec<(String, u64)> = view.dlq_by_reason().iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let by_cat: Vec<(String, u64)> = view.dlq_by_category().iter().map(|(k, v)| (k.to_string(), *v)).collect();
    out.push_str(&bars("DLQ depth by reason", &by_reason));
    out.push_str(&bars("DLQ depth by category", &by_cat));
    out.push_str(&incident_table(view, who, true));
    let alerts: Vec<Vec<String>> = view
        .alerts
        .iter()
        .map(|a| {
            vec![
                esc(&a.rule),
                esc(a.severity().as_str_name().trim_start_matches("SEVERITY_")),
                esc(&a.scope),
                esc(&bw_ops::views::mask_digits(&a.summary)),
                utc(a.started_at_unix_ms),
            ]
        })
        .collect();
    out.push_str(&table("Firing alerts", &["Rule", "Severity", "Scope", "Summary", "Since"], &alerts));
    out
}

/// Incidents with DLQ entries or replay progress: depth, held, replayed so far, and the actions.
pub fn incident_table(view: &View, who: &Principal, open_only: bool) -> String {
    let rows: Vec<Vec<String>> = view
        .incident_stats
        .iter()
        .filter(|s| !s.incident_id.is_empty())
        .map(|s| {
            let p = view.incidents.iter().find(|p| p.incident_id == s.incident_id && p.phone_number_id == s.scope);
            let done = p.map(|p| p.replayed + p.expired + p.quarantined + p.other).unwrap_or(0);
            let total = done + s.depth;
            let rate = p
                .filter(|p| p.updated_at_unix_ms > p.started_at_unix_ms)
                .map(|p| {
                    format!("{:.1}/s", done as f64 * 1000.0 / (p.updated_at_unix_ms - p.started_at_unix_ms) as f64)
                })
                .unwrap_or_else(|| "-".into());
            let held =
                p.filter(|p| p.released_at_unix_ms == 0).map(|p| p.held_categories.join(", ")).unwrap_or_default();
            let mut actions = action_button(
                who,
                "replay_incident",
                "Replay incident",
                &[("scope", &s.scope), ("incident", &s.incident_id)],
            );
            if s.held > 0 {
                actions.push_str(&action_button(
                    who,
                    "release_held",
                    "Release held categories",
                    &[("scope", &s.scope), ("incident", &s.incident_id)],
                ));
            }
            vec![
                format!("<a href=\"/dlq?incident={}\">{}</a>", url(&s.incident_id), esc(&s.incident_id)),
                sender_link(&s.scope),
                s.depth.to_string(),
                format!("{done} of {total} handled ({}%)", (done * 100).checked_div(total).unwrap_or(100)),
                rate,
                if held.is_empty() { "nothing held".into() } else { format!("{} held: {}", s.held, esc(&held)) },
                counts(s.categories.iter().map(|(k, v)| (*k, v))),
                utc(s.oldest_at_unix_ms),
                actions,
            ]
        })
        .collect();
    let caption = if open_only { "Open incidents (with DLQ entries)" } else { "Incidents with DLQ entries" };
    table(
        caption,
        &[
            "Incident",
            "Sender",
            "In DLQ",
            "Replay progress",
            "Replay rate",
            "Held for release",
            "Categories",
            "Oldest",
            "Actions",
        ],
        &rows,
    )
}

/// The incidents page: open ones, then every incident replay recorded (finished ones too).
pub fn render_incidents(view: &View, who: &Principal, now: i64) -> String {
    let mut out = freshness(view, now);
    out.push_str(&incident_table(view, who, false));
    let rows: Vec<Vec<String>> = view
        .incidents
        .iter()
        .map(|p| {
            vec![
                esc(&p.incident_id),
                sender_link(&p.phone_number_id),
                utc(p.started_at_unix_ms),
                utc(p.updated_at_unix_ms),
                format!(
                    "replayed {}, expired {}, quarantined {}, other {}",
                    p.replayed, p.expired, p.quarantined, p.other
                ),
                if p.released_at_unix_ms > 0 {
                    format!("released {}", utc(p.released_at_unix_ms))
                } else {
                    esc(&p.held_categories.join(", "))
                },
                if p.finished_at_unix_ms > 0 {
                    format!("finished {}", utc(p.finished_at_unix_ms))
                } else {
                    "replaying".into()
                },
            ]
        })
        .collect();
    out.push_str(&table(
        "Incident replays (timeline and counts)",
        &["Incident", "Sender", "Started", "Last entry", "Counts", "Held / released", "Status"],
        &rows,
    ));
    out
}

/// Filters of the DLQ browser, checked.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct DlqQuery {
    pub sender: Option<String>,
    pub incident: Option<String>,
    pub reason: Option<String>,
    pub category: Option<String>,
    pub page: Option<usize>,
}

fn ok_id(s: &str) -> bool {
    s.len() <= 128 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_:.".contains(c))
}

impl DlqQuery {
    /// The refusal text for a malformed filter (never the value itself).
    pub fn check(&self) -> Result<(), &'static str> {
        if self.sender.as_deref().is_some_and(|s| s.len() > 32 || !s.bytes().all(|b| b.is_ascii_digit())) {
            return Err("sender must be a phone_number_id (digits)");
        }
        if self.incident.as_deref().is_some_and(|s| !ok_id(s)) {
            return Err("incident must be an incident id (letters, digits, '-', '_', ':')");
        }
        for v in [&self.reason, &self.category] {
            if v.as_deref().is_some_and(|s| s.len() > 40 || !s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')) {
                return Err("reason and category must be labels as the DLQ page lists them");
            }
        }
        Ok(())
    }

    fn matches(&self, r: &DlqRow) -> bool {
        let is = |f: &Option<String>, v: &str| f.as_deref().is_none_or(|f| f.is_empty() || f == v);
        is(&self.sender, &r.scope)
            && is(&self.incident, &r.incident_id)
            && is(&self.reason, r.reason)
            && is(&self.category, r.category)
    }

    fn link(&self, page: usize) -> String {
        let mut q = Vec::new();
        for (k, v) in [
            ("sender", &self.sender),
            ("incident", &self.incident),
            ("reason", &self.reason),
            ("category", &self.category),
        ] {
            if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                q.push(format!("{k}={}", url(v)));
            }
        }
        q.push(format!("page={page}"));
        format!("/dlq?{}", q.join("&amp;"))
    }
}

fn select(name: &str, label: &str, current: Option<&str>, options: &[String]) -> String {
    let mut out = format!(
        "<label for=\"f-{name}\">{label}</label><select id=\"f-{name}\" name=\"{name}\"><option value=\"\">any</option>"
    );
    for o in options {
        let sel = if current == Some(o.as_str()) { " selected" } else { "" };
        let _ = write!(out, "<option value=\"{}\"{sel}>{}</option>", esc(o), esc(o));
    }
    out.push_str("</select> ");
    out
}

/// The DLQ browser: filters, one page of masked entries, paging links.
pub fn render_dlq(view: &View, who: &Principal, q: &DlqQuery, page_size: usize, now: i64) -> String {
    let mut out = freshness(view, now);
    let labels = |c: &crate::view::Counts| c.keys().map(|k| k.to_string()).collect::<Vec<_>>();
    out.push_str("<form method=\"get\" action=\"/dlq\" class=\"filters\">");
    out.push_str(&select("sender", "Sender", q.sender.as_deref(), view.senders()));
    out.push_str(&select("incident", "Incident", q.incident.as_deref(), &view.index.incident_ids));
    out.push_str(&select("reason", "Reason", q.reason.as_deref(), &labels(view.dlq_by_reason())));
    out.push_str(&select("category", "Category", q.category.as_deref(), &labels(view.dlq_by_category())));
    out.push_str("<button type=\"submit\">Filter</button></form>");
    let page = q.page.unwrap_or(1).max(1);
    let skip = (page - 1).saturating_mul(page_size);
    let mut matched = 0usize;
    let mut rows = Vec::with_capacity(page_size);
    for r in view.dlq.iter().filter(|r| q.matches(r)) {
        if matched >= skip && rows.len() < page_size {
            rows.push(vec![
                r.sequence.to_string(),
                format!("<a href=\"/op?id={}\">{}</a>", url(&r.operation_id), esc(&r.operation_id)),
                sender_link(&r.scope),
                esc(&r.recipient),
                esc(r.category),
                esc(&r.payload),
                esc(r.reason),
                if r.meta_code == 0 { "-".into() } else { r.meta_code.to_string() },
                if r.incident_id.is_empty() { "-".into() } else { esc(&r.incident_id) },
                r.replays.to_string(),
                utc(r.dead_lettered_at_ms),
                utc(r.deadline_ms),
            ]);
        }
        matched += 1;
    }
    let pages = matched.div_ceil(page_size).max(1);
    let _ = write!(out, "<p id=\"dlq-count\">{matched} matching entries; page {page} of {pages}.</p>");
    out.push_str(&table(
        "DLQ entries (recipient masked, bodies never shown)",
        &[
            "Seq",
            "Operation",
            "Sender",
            "Recipient",
            "Category",
            "Request",
            "Reason",
            "Code",
            "Incident",
            "Replays",
            "Dead-lettered",
            "Deadline",
        ],
        &rows,
    ));
    out.push_str("<nav aria-label=\"DLQ pages\"><p>");
    if page > 1 {
        let _ = write!(out, "<a href=\"{}\" rel=\"prev\">Previous page</a> ", q.link(page - 1));
    }
    if page < pages {
        let _ = write!(out, "<a href=\"{}\" rel=\"next\">Next page</a>", q.link(page + 1));
    }
    out.push_str("</p></nav>");
    if let Some(inc) = q.incident.as_deref().filter(|i| !i.is_empty())
        && let Some(scope) = view.dlq.iter().find(|r| r.incident_id == inc).map(|r| r.scope.clone())
    {
        out.push_str(&action_button(
            who,
            "replay_incident",
            "Replay incident",
            &[("scope", &scope), ("incident", inc)],
        ));
    }
    out
}

/// The quarantine's scopes with their actions.
pub fn render_quarantine(view: &View, who: &Principal, now: i64) -> String {
    let mut out = freshness(view, now);
    let rows: Vec<Vec<String>> = view
        .quarantine
        .iter()
        .map(|s| {
            let mut actions = action_button(who, "quarantine_release", "Release", &[("scope", &s.scope_key)]);
            actions.push_str(&action_button(who, "quarantine_drop", "Drop", &[("scope", &s.scope_key)]));
            vec![
                esc(&s.scope_key),
                s.entries.to_string(),
                esc(s.reason),
                if s.meta_code == 0 { "-".into() } else { s.meta_code.to_string() },
                utc(s.oldest_unix_ms),
                actions,
            ]
        })
        .collect();
    out.push_str(&table("Quarantine scopes", &["Scope", "Messages", "Reason", "Code", "Oldest", "Actions"], &rows));
    out
}

fn current(app: &crate::app::App) -> std::sync::Arc<View> {
    app.view.borrow().clone()
}

pub async fn overview(State(app): State<crate::app::Shared>, headers: HeaderMap) -> Response {
    let who = match require(&app, &headers) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    respond(StatusCode::OK, "Overview", &who, &render_overview(&current(&app), &who, now_ms()), Some("/"))
}

pub async fn incidents(State(app): State<crate::app::Shared>, headers: HeaderMap) -> Response {
    let who = match require(&app, &headers) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    respond(StatusCode::OK, "Incidents", &who, &render_incidents(&current(&app), &who, now_ms()), Some("/incidents"))
}

pub async fn quarantine(State(app): State<crate::app::Shared>, headers: HeaderMap) -> Response {
    let who = match require(&app, &headers) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    respond(StatusCode::OK, "Quarantine", &who, &render_quarantine(&current(&app), &who, now_ms()), Some("/quarantine"))
}

pub async fn dlq(
    State(app): State<crate::app::Shared>,
    headers: HeaderMap,
    q: Result<Query<DlqQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let who = match require(&app, &headers) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let Ok(Query(q)) = q else {
        return refusal(StatusCode::BAD_REQUEST, &who, "the DLQ filters could not be read (page must be a number)");
    };
    if let Err(why) = q.check() {
        return refusal(StatusCode::BAD_REQUEST, &who, why);
    }
    let body = render_dlq(&current(&app), &who, &q, app.cfg.console.page_size, now_ms());
    respond(StatusCode::OK, "DLQ", &who, &body, None)
}

/// Message lookup query.
#[derive(Debug, Default, serde::Deserialize)]
pub struct OpQuery {
    pub id: Option<String>,
    pub tenant: Option<String>,
}

/// The operation key a lookup names, or why not (never echoing the input).
pub fn key_of(id: &str, tenant: Option<&str>) -> Result<String, &'static str> {
    use bw_wire::tenancy;
    match tenant.filter(|t| !t.is_empty()) {
        Some(t) if !tenancy::valid_tenant(t) => Err("not a tenant: 1 to 32 characters of a-z, 0-9 and '-'"),
        Some(_) if !bw_wire::tenancy::valid_operation_id(id) => Err("not an operation id: 1 to 128 of [A-Za-z0-9_=.-]"),
        Some(t) => Ok(tenancy::operation_key(t, id)),
        None if !tenancy::valid_operation_key(id) => {
            Err("not an operation key: an operation id (1 to 128 of [A-Za-z0-9_=.-]) or <tenant>/<id>")
        }
        None => Ok(id.to_string()),
    }
}

/// One operation's journey from its ledger entry and its feed events; no recipient is stored in either.
pub fn render_op(
    key: &str,
    entry: &bw_proto::v1::LedgerEntry,
    events: &[bw_proto::v1::OutcomeEvent],
    who: &Principal,
) -> String {
    use bw_ops::views::mask_digits;
    let mut facts = vec![
        ("Operation", esc(key)),
        ("State", format!("<strong>{}</strong>", esc(entry.state().label()))),
        ("Sender", format!("WABA {} · {}", esc(&entry.waba_id), sender_link(&entry.phone_number_id))),
        ("Category", esc(entry.category().label())),
        ("Attempts", format!("{} (replays {}, resends {})", entry.attempts, entry.replays, entry.resends)),
        ("Last code", if entry.last_code == 0 { "-".into() } else { entry.last_code.to_string() }),
        ("Reason", esc(&mask_digits(&entry.reason))),
        ("Incident", if entry.incident_id.is_empty() { "-".into() } else { esc(&entry.incident_id) }),
        (
            "Flags",
            if entry.flagged_unknown {
                "outcome was unknown once: a duplicate at Meta cannot be ruled out".into()
            } else {
                "none".into()
            },
        ),
        ("Accepted", utc(entry.accepted_at_unix_ms)),
        ("Updated", utc(entry.updated_at_unix_ms)),
    ];
    if !entry.wamid.is_empty() {
        facts.push(("wamid", esc(&entry.wamid)));
    }
    let mut out = String::from("<dl>");
    for (k, v) in facts {
        let _ = write!(out, "<dt>{k}</dt><dd>{v}</dd>");
    }
    out.push_str("</dl>");
    if bw_ops::resend::check(entry).is_ok() {
        out.push_str(&action_button(who, "resend", "Resend operation", &[("op", key)]));
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                utc(e.at_unix_ms),
                esc(&e.kind().as_str_name().trim_start_matches("OUTCOME_KIND_").to_ascii_lowercase().replace('_', " ")),
                esc(e.state().label()),
                e.attempts.to_string(),
                if e.meta_code == 0 { "-".into() } else { e.meta_code.to_string() },
                esc(&mask_digits(&e.reason)),
            ]
        })
        .collect();
    out.push_str(&table("Journey (outcome feed)", &["At", "Event", "State", "Attempts", "Code", "Reason"], &rows));
    out
}

pub async fn op(
    State(app): State<crate::app::Shared>,
    headers: HeaderMap,
    q: Result<Query<OpQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let who = match require(&app, &headers) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let q = q.map(|Query(q)| q).unwrap_or_default();
    let form = format!(
        "<form method=\"get\" action=\"/op\" class=\"filters\"><label for=\"op-id\">Operation id</label> \
         <input id=\"op-id\" name=\"id\" value=\"{}\" required> <label for=\"op-tenant\">Tenant (optional)</label> \
         <input id=\"op-tenant\" name=\"tenant\" value=\"{}\"> <button type=\"submit\">Look up</button></form>",
        q.id.as_deref().filter(|i| bw_wire::tenancy::valid_operation_key(i)).map(esc).unwrap_or_default(),
        q.tenant.as_deref().filter(|t| bw_wire::tenancy::valid_tenant(t)).map(esc).unwrap_or_default()
    );
    let Some(id) = q.id.as_deref().map(str::trim).filter(|i| !i.is_empty()) else {
        return respond(StatusCode::OK, "Message lookup", &who, &form, None);
    };
    let key = match key_of(id, q.tenant.as_deref()) {
        Ok(k) => k,
        Err(why) => {
            let body = format!("{form}<p class=\"error\" role=\"alert\">{}</p>", esc(why));
            return respond(StatusCode::BAD_REQUEST, "Message lookup", &who, &body, None);
        }
    };
    let ledger = bw_common::ledger::Ledger::new(&app.buckets);
    let entry = match ledger.get(&key).await {
        Ok(Some(v)) => v.entry,
        Ok(None) => {
            let body = format!(
                "{form}<p role=\"status\">No ledger entry for that operation (never accepted, or expired).</p>"
            );
            return respond(StatusCode::NOT_FOUND, "Message lookup", &who, &body, None);
        }
        Err(e) => return refusal(StatusCode::SERVICE_UNAVAILABLE, &who, &format!("the ledger did not answer: {e}")),
    };
    let events = bw_ops::views::feed_events(&app.js, &entry.phone_number_id, &key).await.unwrap_or_default();
    let body = format!("{form}{}", render_op(&key, &entry, &events, &who));
    respond(StatusCode::OK, "Message lookup", &who, &body, None)
}

/// Server-sent events: one `view` event per new view, at most one a second.
pub async fn events(State(app): State<crate::app::Shared>, headers: HeaderMap) -> Response {
    if app.auth.principal(&headers).is_none() {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let (rx, stop) = (app.view.clone(), app.stop.clone());
    let stream = futures::stream::unfold((rx, None::<tokio::time::Instant>), move |(mut rx, last)| {
        let stop = stop.clone();
        async move {
            if let Some(last) = last {
                tokio::time::sleep_until(last + Duration::from_secs(1)).await;
            }
            // Ends at shutdown, so the server's graceful stop does not wait for open pages.
            tokio::select! {
                _ = stop.cancelled() => return None,
                changed = rx.changed() => changed.ok()?,
            }
            let at = rx.borrow_and_update().read_at_ms;
            let event = Event::default().data(at.to_string());
            Some((Ok::<_, std::convert::Infallible>(event), (rx, Some(tokio::time::Instant::now()))))
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

pub async fn css() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("../assets/console.css")).into_response()
}

pub async fn js() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], include_str!("../assets/live.js")).into_response()
}

pub async fn not_found(State(app): State<crate::app::Shared>, headers: HeaderMap) -> Response {
    let who = app.auth.principal(&headers).unwrap_or(Principal {
        name: "not signed in".into(),
        role: crate::config::Role::Viewer,
        signed_in: false,
        csrf: String::new(),
    });
    refusal(StatusCode::NOT_FOUND, &who, "no such page")
}
