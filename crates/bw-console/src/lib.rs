//! `bw-console`: the operator console. Server-rendered pages readable without JavaScript (overview, sender,
//! DLQ browser, message lookup, incidents, quarantine), live refresh by server-sent events at most once a
//! second, and operator actions behind a role, a confirmation page and a CSRF token, each written to the
//! audit stream `BW_AUDIT`.
//!
//! It reads the state `bwctl` reads, through the same `bw_ops` functions, and keeps no copy of it: the pages
//! render from a [`view::View`] read again from the streams and buckets every `console.refresh_ms`, and every
//! action reads and moves live through `bw_ops`. Recipients are masked before anything reaches a page.

pub mod actions;
pub mod app;
pub mod audit;
pub mod auth;
pub mod config;
pub mod holds;
pub mod html;
pub mod keys;
pub mod pages;
pub mod sender;
pub mod view;

pub use app::{App, Shared};
use axum::Router;
use axum::routing::{get, post};
use bw_common::service::Deps;
pub use config::Config;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Compiled defaults, every key commented.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// The console's routes.
pub fn router(app: Shared) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/dlq", get(pages::dlq))
        .route("/op", get(pages::op))
        .route("/incidents", get(pages::incidents))
        .route("/quarantine", get(pages::quarantine))
        .route("/senders/{phone}", get(sender::page))
        .route("/events", get(pages::events))
        .route("/assets/console.css", get(pages::css))
        .route("/assets/live.js", get(pages::js))
        .route("/login", get(auth::login_page).post(auth::login))
        .route("/logout", post(auth::logout))
        .route("/confirm", get(actions::confirm))
        .route("/actions/{action}", post(actions::act))
        .fallback(pages::not_found)
        .with_state(app)
}

/// Runs the console until `shutdown` is cancelled.
pub async fn run(cfg: Config, deps: Deps, shutdown: CancellationToken) -> anyhow::Result<()> {
    cfg.check().map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    audit::ensure_stream(&deps.js, cfg.nats.replicas).await?;
    let first = view::View::read(&deps.js, &deps.buckets).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "first read of the console's view failed; retrying every refresh");
        view::View::empty()
    });
    let (tx, rx) = watch::channel(Arc::new(first));
    let refresh_now = Arc::new(tokio::sync::Notify::new());
    let tasks = tokio_util::task::TaskTracker::new();
    tasks.spawn(view::refresh_loop(
        deps.js.clone(),
        deps.buckets.clone(),
        cfg.console.coordinator_url.clone(),
        std::time::Duration::from_millis(cfg.console.refresh_ms),
        tx,
        refresh_now.clone(),
        shutdown.clone(),
    ));
    let listener = tokio::net::TcpListener::bind(&cfg.console.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind console on {}: {e}", cfg.console.listen))?;
    let addr = listener.local_addr()?;
    let auth = keys::Auth::new(&cfg.auth)?;
    let app = Arc::new(App {
        cfg,
        js: deps.js.clone(),
        buckets: deps.buckets.clone(),
        redis: deps.redis.clone(),
        auth,
        view: rx,
        refresh_now,
        tasks: tasks.clone(),
        stop: shutdown.clone(),
    });
    tracing::info!(url = %format!("http://{addr}/"), "console serving");
    let stop = shutdown.clone();
    axum::serve(listener, router(app)).with_graceful_shutdown(async move { stop.cancelled().await }).await?;
    tasks.close();
    tasks.wait().await;
    Ok(())
}
