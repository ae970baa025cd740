//! Operator actions. Each goes: a button (shown to operators only) → `GET /confirm` (what will happen, with a
//! form carrying the CSRF token) → `POST /actions/<action>` (role, CSRF token and `confirm=yes` checked, the
//! request written to the audit stream, then done through `bw_ops` or the coordinator's admin API as `bwctl`
//! does it, and the outcome audited). An action that cannot be audited is not done.

use crate::audit::{self, Entry};
use crate::auth::{Principal, require};
use crate::html::esc;
use crate::pages::{key_of, refusal};
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use bw_common::time::now_ms;
use bw_proto::v1::BreakerState;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// What an operator may do, with the fields each takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    ReplayIncident { scope: String, incident: String },
    ReleaseHeld { scope: String, incident: String },
    QuarantineRelease { scope_key: String },
    QuarantineDrop { scope_key: String, reason: String },
    Breaker { scope: String, verb: &'static str },
    Resend { key: String, reason: String },
}

fn digits(v: Option<&String>) -> Result<String, &'static str> {
    v.filter(|s| !s.is_empty() && s.len() <= 32 && s.bytes().all(|b| b.is_ascii_digit()))
        .cloned()
        .ok_or("scope must be a phone_number_id (digits)")
}

fn incident(v: Option<&String>) -> Result<String, &'static str> {
    v.filter(|s| !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_:".contains(c)))
        .cloned()
        .ok_or("incident must be an incident id (letters, digits, '-', '_', ':')")
}

fn reason(v: Option<&String>) -> Result<String, &'static str> {
    v.map(|s| s.trim())
        .filter(|s| !s.is_empty() && s.chars().count() <= 200 && !s.chars().any(char::is_control))
        .map(bw_ops::views::mask_digits)
        .ok_or("reason must be 1 to 200 printable characters (it is kept; no personal data)")
}

impl Action {
    /// Parses an action and its fields; the refusal never echoes a value.
    pub fn parse(name: &str, f: &HashMap<String, String>, with_reason: bool) -> Result<Action, &'static str> {
        let quarantine_key = || {
            let key = f.get("scope").map(String::as_str).unwrap_or("");
            bw_breaker::templates::ScopeKey::parse(key)
                .map(|k| k.to_string())
                .map_err(|_| "scope must be a quarantine scope key as the quarantine page lists it")
        };
        let breaker = |verb| Ok(Action::Breaker { scope: digits(f.get("scope"))?, verb });
        match name {
            "replay_incident" => {
                Ok(Action::ReplayIncident { scope: digits(f.get("scope"))?, incident: incident(f.get("incident"))? })
            }
            "release_held" => {
                Ok(Action::ReleaseHeld { scope: digits(f.get("scope"))?, incident: incident(f.get("incident"))? })
            }
            "quarantine_release" => Ok(Action::QuarantineRelease { scope_key: quarantine_key()? }),
            "quarantine_drop" => Ok(Action::QuarantineDrop {
                scope_key: quarantine_key()?,
                reason: if with_reason { reason(f.get("reason"))? } else { String::new() },
            }),
            "breaker_force_open" => breaker("force-open"),
            "breaker_force_closed" => breaker("force-closed"),
            "breaker_clear" => breaker("clear"),
            "breaker_reset" => breaker("reset"),
            "resend" => Ok(Action::Resend {
                key: key_of(f.get("op").map(String::as_str).unwrap_or(""), None)?,
                reason: if with_reason { reason(f.get("reason"))? } else { String::new() },
            }),
            _ => Err("no such action"),
        }
    }

    /// The audit stream's action name.
    pub fn name(&self) -> String {
        match self {
            Action::ReplayIncident { .. } => "replay_incident".into(),
            Action::ReleaseHeld { .. } => "release_held".into(),
            Action::QuarantineRelease { .. } => "quarantine_release".into(),
            Action::QuarantineDrop { .. } => "quarantine_drop".into(),
            Action::Breaker { verb, .. } => format!("breaker_{}", verb.replace('-', "_")),
            Action::Resend { .. } => "resend".into(),
        }
    }

    fn fields(&self) -> Vec<(&'static str, String)> {
        match self {
            Action::ReplayIncident { scope, incident } | Action::ReleaseHeld { scope, incident } => {
                vec![("scope", scope.clone()), ("incident", incident.clone())]
            }
            Action::QuarantineRelease { scope_key } | Action::QuarantineDrop { scope_key, .. } => {
                vec![("scope", scope_key.clone())]
            }
            Action::Breaker { scope, .. } => vec![("scope", scope.clone())],
            Action::Resend { key, .. } => vec![("op", key.clone())],
        }
    }

    fn needs_reason(&self) -> bool {
        matches!(self, Action::QuarantineDrop { .. } | Action::Resend { .. })
    }

    /// What will happen, for the confirmation page.
    fn describe(&self, view: &crate::view::View) -> String {
        match self {
            Action::ReplayIncident { scope, incident } => {
                let n = view.dlq.iter().filter(|r| &r.incident_id == incident && &r.scope == scope).count();
                format!(
                    "Replay incident {incident} of sender {scope}: its {n} DLQ entries go back to the replay lane in \
                     per-recipient acceptance order, releasing any held category. The ledger prevents duplicates. \
                     Refused unless the sender's breaker is CLOSED."
                )
            }
            Action::ReleaseHeld { scope, incident } => format!(
                "Release the categories replay holds for incident {incident} of sender {scope}: the replay service \
                 then drains them like any other entry."
            ),
            Action::QuarantineRelease { scope_key } => format!(
                "Release quarantine scope {scope_key}: lift its hold and re-queue each of its held messages once."
            ),
            Action::QuarantineDrop { scope_key, .. } => format!(
                "Drop quarantine scope {scope_key}: every message held under it ends FAILED, never sent, with your \
                 reason in its ledger entry."
            ),
            Action::Breaker { scope, verb } => format!(
                "{} the breaker of sender {scope} (through the breaker-coordinator, as bwctl breaker {verb}).",
                match *verb {
                    "force-open" => "Force OPEN (nothing is sent until cleared)",
                    "force-closed" => "Force CLOSED (failures no longer trip it until cleared)",
                    "clear" => "Remove the override of",
                    _ => "Reset (window, counters, pause, incident and override wiped: CLOSED at full rate)",
                }
            ),
            Action::Resend { key, .. } => format!(
                "Send operation {key} again as a new attempt (it failed). If its outcome was unknown once, a \
                 duplicate at Meta is possible."
            ),
        }
    }
}

fn forbidden(who: &Principal) -> Response {
    refusal(StatusCode::FORBIDDEN, who, "this needs the operator role: sign in with an operator key")
}

pub async fn confirm(
    State(app): State<crate::app::Shared>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let who = match require(&app, &headers) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    if !who.may_act() {
        return forbidden(&who);
    }
    let name = q.get("action").cloned().unwrap_or_default();
    let action = match Action::parse(&name, &q, false) {
        Ok(a) => a,
        Err(why) => return refusal(StatusCode::BAD_REQUEST, &who, why),
    };
    let view = app.view.borrow().clone();
    let mut body = format!(
        "<section class=\"confirm\" aria-labelledby=\"confirm-what\"><p id=\"confirm-what\">{}</p>\
         <form method=\"post\" action=\"/actions/{}\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <input type=\"hidden\" name=\"confirm\" value=\"yes\">",
        esc(&action.describe(&view)),
        esc(&name),
        esc(&who.csrf)
    );
    for (k, v) in action.fields() {
        let _ = write!(body, "<input type=\"hidden\" name=\"{k}\" value=\"{}\">", esc(&v));
    }
    if action.needs_reason() {
        body.push_str(
            "<p><label for=\"reason\">Reason (kept; no personal data)</label> \
             <input id=\"reason\" name=\"reason\" required maxlength=\"200\"></p>",
        );
    }
    body.push_str(
        "<p><button type=\"submit\" id=\"confirm-button\">Confirm</button> <a href=\"/\">Cancel</a></p></form>\
         </section>",
    );
    (StatusCode::OK, Html(crate::html::page("Confirm", &who, &body, None))).into_response()
}

fn entry(who: &Principal, action: &Action, outcome: &str, detail: String) -> Entry {
    Entry {
        at_unix_ms: now_ms(),
        who: who.name.clone(),
        role: who.role.label().into(),
        action: action.name(),
        outcome: outcome.into(),
        scope: action.fields().into_iter().map(|(k, v)| (k.to_string(), v)).collect::<BTreeMap<_, _>>(),
        detail,
    }
}

pub async fn act(
    State(app): State<crate::app::Shared>,
    headers: HeaderMap,
    Path(name): Path<String>,
    form: Result<Form<HashMap<String, String>>, axum::extract::rejection::FormRejection>,
) -> Response {
    let who = match require(&app, &headers) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    if !who.may_act() {
        return forbidden(&who);
    }
    let f = form.map(|Form(f)| f).unwrap_or_default();
    if !app.auth.csrf_ok(&who, f.get("csrf").map(String::as_str).unwrap_or("")) {
        return refusal(StatusCode::FORBIDDEN, &who, "the form's CSRF token is missing or stale: open the page again");
    }
    if f.get("confirm").map(String::as_str) != Some("yes") {
        return refusal(StatusCode::BAD_REQUEST, &who, "the action was not confirmed");
    }
    let action = match Action::parse(&name, &f, true) {
        Ok(a) => a,
        Err(why) => return refusal(StatusCode::BAD_REQUEST, &who, why),
    };
    if let Err(e) = audit::write(&app.js, &entry(&who, &action, "requested", String::new())).await {
        tracing::error!(error = %e, "audit stream not writable; action refused");
        return refusal(StatusCode::SERVICE_UNAVAILABLE, &who, "the audit stream cannot be written: nothing was done");
    }
    let (status, outcome, detail) = match run(&app, &who, &action).await {
        Ok(Done::Now(detail)) => (StatusCode::OK, "done", detail),
        Ok(Done::Started(detail)) => (StatusCode::ACCEPTED, "started", detail),
        Err(Refused(status, why)) => (status, "refused", why),
    };
    if let Err(e) = audit::write(&app.js, &entry(&who, &action, outcome, detail.clone())).await {
        tracing::error!(error = %e, action = %action.name(), "audit of an outcome failed");
    }
    app.refresh_now.notify_one();
    let body = format!(
        "<p role=\"status\" id=\"action-result\">{}: {}</p><p><a href=\"/\">Overview</a> · \
         <a href=\"/incidents\">Incidents</a> · <a href=\"/dlq\">DLQ</a></p>",
        esc(outcome),
        esc(&detail)
    );
    (status, Html(crate::html::page("Action", &who, &body, None))).into_response()
}

enum Done {
    Now(String),
    Started(String),
}

struct Refused(StatusCode, String);

fn failed(e: impl std::fmt::Display) -> Refused {
    Refused(StatusCode::SERVICE_UNAVAILABLE, format!("failed, nothing more was done: {e}"))
}

async fn run(app: &crate::app::Shared, who: &Principal, action: &Action) -> Result<Done, Refused> {
    let rate = app.cfg.console.action_rate_per_s;
    match action.clone() {
        Action::ReplayIncident { scope, incident } => {
            let states = bw_ops::ops::scope_snapshots(&app.buckets).await.map_err(failed)?;
            let closed = move |phone: &str| {
                states
                    .get(phone)
                    .is_some_and(|s| matches!(s.state(), BreakerState::Closed | BreakerState::ForcedClosed))
            };
            if !closed(&scope) {
                return Err(Refused(
                    StatusCode::CONFLICT,
                    format!("the breaker of sender {scope} is not CLOSED: reset it or wait, then replay"),
                ));
            }
            let incidents = bw_ops::incident::Incidents::open(&app.js, 1).await.map_err(failed)?;
            bw_ops::incident::ensure_event_subjects(&app.js).await.map_err(failed)?;
            let (app2, who2, action2) = (app.clone(), who.clone(), action.clone());
            app.tasks.spawn(async move {
                let select =
                    bw_ops::incident::IncidentSelect { incident: &incident, scope: Some(&scope), rate_per_s: rate };
                let mut progress = |_: usize, _: usize| {};
                let result = bw_ops::incident::replay_incident(
                    &app2.js,
                    &app2.buckets,
                    &incidents,
                    select,
                    &closed,
                    &mut progress,
                )
                .await;
                let (outcome, detail) = match result {
                    Ok(r) => (
                        "done",
                        format!("{} selected; {:?}; errors {}", r.batch.selected, r.batch.outcomes, r.batch.errors),
                    ),
                    Err(e) => ("failed", e.to_string()),
                };
                let _ = audit::write(&app2.js, &entry(&who2, &action2, outcome, detail)).await;
                app2.refresh_now.notify_one();
            });
            Ok(Done::Started("the incident replay is running; the incidents page shows its progress".into()))
        }
        Action::ReleaseHeld { scope, incident } => {
            let incidents = bw_ops::incident::Incidents::open(&app.js, 1).await.map_err(failed)?;
            incidents.release(&scope, &incident).await.map_err(failed)?;
            Ok(Done::Now(format!("incident {incident} of {scope} released: replay drains its held categories")))
        }
        Action::QuarantineRelease { scope_key } => {
            let key = bw_breaker::templates::ScopeKey::parse(&scope_key).map_err(|_| failed("bad scope key"))?;
            let holds = match (&app.redis, key.is_template()) {
                (Some(r), true) => Some(bw_breaker::templates::TemplateHolds::new(r.clone())),
                (None, true) => {
                    return Err(Refused(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Redis is not connected: a template hold cannot be lifted".into(),
                    ));
                }
                _ => None,
            };
            let lift = async move {
                match &holds {
                    Some(h) => h.release_everywhere(&key).await.map(|was| was.is_some()).map_err(|e| e.to_string()),
                    None => Ok(false),
                }
            };
            let mut progress = |_: usize, _: usize| {};
            let r = bw_ops::quarantine::release_scope(&app.js, &app.buckets, &scope_key, lift, rate, &mut progress)
                .await
                .map_err(failed)?;
            Ok(Done::Now(format!(
                "hold {}; {} selected; {:?}; errors {}",
                if r.hold_lifted { "lifted" } else { "was not in force" },
                r.report.selected,
                r.report.outcomes,
                r.report.errors
            )))
        }
        Action::QuarantineDrop { scope_key, reason } => {
            let mut progress = |_: usize, _: usize| {};
            let r = bw_ops::quarantine::drop_scope(&app.js, &app.buckets, &scope_key, &reason, &mut progress)
                .await
                .map_err(failed)?;
            Ok(Done::Now(format!("{} selected; {:?}; errors {}", r.selected, r.outcomes, r.errors)))
        }
        Action::Breaker { scope, verb } => breaker(app, who, &scope, verb).await.map(Done::Now),
        Action::Resend { key, reason } => {
            let ledger = bw_common::ledger::Ledger::new(&app.buckets);
            match bw_ops::resend::resend(&app.js, &ledger, app.buckets.send, &key, &reason).await.map_err(failed)? {
                bw_ops::resend::Resent::Queued { resend } => Ok(Done::Now(format!("queued {key} as resend {resend}"))),
                bw_ops::resend::Resent::Refused(r) => Err(Refused(StatusCode::CONFLICT, r.to_string())),
            }
        }
    }
}

/// `POST <coordinator>/admin/breakers/<scope>/<verb>` with the operator token, as `bwctl breaker` does.
async fn breaker(app: &crate::app::Shared, who: &Principal, scope: &str, verb: &str) -> Result<String, Refused> {
    let token = app.cfg.console.operator_token.trim();
    if token.is_empty() {
        return Err(Refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "console.operator_token is not set: breaker actions go through the coordinator, which needs it".into(),
        ));
    }
    let url = format!("{}/admin/breakers/{scope}/{verb}", app.cfg.console.coordinator_url.trim_end_matches('/'));
    let body = serde_json::json!({ "reason": format!("console: {}", who.name) }).to_string();
    let response = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .bearer_auth(token)
        .body(body)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| {
            failed(format!("the breaker-coordinator is not reachable at {}: {e}", app.cfg.console.coordinator_url))
        })?;
    let status = response.status();
    // Whatever comes back, the token never reaches the page.
    let text = response.text().await.unwrap_or_default().replace(token, "<redacted>");
    let text: String = bw_ops::views::mask_digits(text.trim()).chars().take(300).collect();
    if status.is_success() {
        Ok(format!("{verb} of {scope}: {text}"))
    } else {
        Err(Refused(StatusCode::BAD_GATEWAY, format!("the coordinator answered HTTP {}: {text}", status.as_u16())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn actions_parse_and_refuse_without_echoing() {
        let a = Action::parse("replay_incident", &f(&[("scope", "1001"), ("incident", "1001-17")]), true);
        assert_eq!(a, Ok(Action::ReplayIncident { scope: "1001".into(), incident: "1001-17".into() }));
        let err = Action::parse("breaker_reset", &f(&[("scope", "+5491155551234")]), true).expect_err("refused");
        assert!(!err.contains("5491155551234"));
        assert!(Action::parse("resend", &f(&[("op", "op-1")]), true).is_err(), "a resend needs a reason");
        let r = Action::parse("resend", &f(&[("op", "op-1"), ("reason", "call +5491155551234")]), true);
        match r {
            Ok(Action::Resend { reason, .. }) => assert!(!reason.contains("5491155551234"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(Action::parse("rm_rf", &f(&[]), true), Err("no such action"));
        assert_eq!(
            Action::parse("breaker_force_open", &f(&[("scope", "1")]), true).map(|a| a.name()),
            Ok("breaker_force_open".into())
        );
    }
}
