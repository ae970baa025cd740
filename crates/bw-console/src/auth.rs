//! The sign-in, sign-out and key-check handlers, over [`crate::keys::Auth`] (keys, sessions, CSRF).

use crate::config::{AuthMode, Role};
use crate::keys::COOKIE;
pub use crate::keys::{Auth, Principal};
use axum::Form;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};

/// The principal, or the response that asks for a key.
pub fn require(app: &crate::app::App, headers: &HeaderMap) -> Result<Principal, Redirect> {
    app.auth.principal(headers).ok_or_else(|| Redirect::to("/login"))
}

pub async fn login_page(State(app): State<crate::app::Shared>) -> Response {
    login_form(&app, None, StatusCode::OK)
}

fn login_form(app: &crate::app::App, error: Option<&str>, status: StatusCode) -> Response {
    let body = if app.auth.mode() == AuthMode::Proxy {
        "<p>This console signs you in through the reverse proxy in front of it.</p>".to_string()
    } else {
        let err = error
            .map(|e| format!("<p class=\"error\" role=\"alert\" id=\"login-error\">{}</p>", crate::html::esc(e)))
            .unwrap_or_default();
        format!(
            "{err}<form method=\"post\" action=\"/login\" class=\"login\">\
             <label for=\"key\">Console key</label>\
             <input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"current-password\" required>\
             <button type=\"submit\">Sign in</button></form>"
        )
    };
    let viewer = Principal { name: "not signed in".into(), role: Role::Viewer, signed_in: false, csrf: String::new() };
    (status, Html(crate::html::page("Sign in", &viewer, &body, None))).into_response()
}

#[derive(serde::Deserialize)]
pub struct LoginForm {
    key: String,
}

pub async fn login(State(app): State<crate::app::Shared>, Form(form): Form<LoginForm>) -> Response {
    if app.auth.mode() == AuthMode::Proxy {
        return login_form(&app, None, StatusCode::NOT_FOUND);
    }
    match app.auth.sign_in(&form.key) {
        Some(id) => {
            let ttl = app.cfg.auth.session_ttl_s;
            let cookie = format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={ttl}");
            ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
        }
        // Never echoes the key.
        None => login_form(&app, Some("That key is not a console key."), StatusCode::UNAUTHORIZED),
    }
}

pub async fn logout(State(app): State<crate::app::Shared>, headers: HeaderMap) -> Response {
    app.auth.sign_out(&headers);
    let cookie = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response()
}
