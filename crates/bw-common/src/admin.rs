//! The admin server every service runs on its own port: `/livez`, `/readyz`, `/metrics`, plus optional
//! service-specific routes (the coordinator mounts its admin API here).

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio_util::sync::CancellationToken;

/// Service-specific admin routes, mounted by the service once it has built what they need (the coordinator's
/// breaker API). The admin server is started before the service runs and answers them as soon as they are
/// mounted; until then they are 404.
#[derive(Clone, Default)]
pub struct AdminRoutes {
    routes: Arc<RwLock<Option<Router>>>,
}

impl AdminRoutes {
    /// Mounts `router` beside `/livez`, `/readyz` and `/metrics` (replacing an earlier mount).
    pub fn mount(&self, router: Router) {
        if let Ok(mut slot) = self.routes.write() {
            *slot = Some(router);
        }
    }

    /// A router that forwards every request it gets to the mounted routes.
    fn forwarder(&self) -> Router {
        let routes = self.routes.clone();
        Router::new().fallback(move |request: axum::extract::Request| {
            let mounted = routes.read().ok().and_then(|r| r.clone());
            async move {
                use tower::ServiceExt;
                match mounted {
                    Some(router) => match router.oneshot(request).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    },
                    None => (StatusCode::NOT_FOUND, "not found\n").into_response(),
                }
            }
        })
    }
}

/// Shared Prometheus registry; services register their metrics at start.
pub type MetricsRegistry = Arc<Mutex<Registry>>;

/// A new empty registry.
pub fn new_registry() -> MetricsRegistry {
    Arc::new(Mutex::new(Registry::default()))
}

/// Readiness: started latch, shutting-down flag and the dependencies to check.
pub struct Health {
    started: AtomicBool,
    shutting_down: AtomicBool,
    nats: Option<async_nats::Client>,
    redis: Option<crate::redis_conn::RedisConn>,
}

impl Health {
    /// Health over the given dependencies; not ready until [`Health::set_started`].
    pub fn new(nats: Option<async_nats::Client>, redis: Option<crate::redis_conn::RedisConn>) -> Arc<Health> {
        Arc::new(Health { started: AtomicBool::new(false), shutting_down: AtomicBool::new(false), nats, redis })
    }

    /// Releases the start-up latch (the service is consuming).
    pub fn set_started(&self) {
        self.started.store(true, Ordering::SeqCst);
    }

    /// Flips readiness to 503 for the rest of the process life.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Checks every dependency; returns the failing ones.
    pub async fn check(&self) -> Vec<&'static str> {
        let mut failing = Vec::new();
        if !self.started.load(Ordering::SeqCst) {
            failing.push("starting");
        }
        if self.shutting_down.load(Ordering::SeqCst) {
            failing.push("shutting_down");
        }
        if let Some(n) = &self.nats
            && n.connection_state() != async_nats::connection::State::Connected
        {
            failing.push("nats");
        }
        if let Some(r) = &self.redis {
            let mut conn = r.clone();
            if !crate::redis_conn::ping(&mut conn).await {
                failing.push("redis");
            }
        }
        failing
    }
}

#[derive(Clone)]
struct AdminState {
    health: Arc<Health>,
    registry: MetricsRegistry,
}

async fn livez() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    let failing = state.health.check().await;
    if failing.is_empty() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", failing.join(", ")))
    }
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let mut out = String::new();
    let encoded = match state.registry.lock() {
        Ok(registry) => prometheus_client::encoding::text::encode(&mut out, &registry).is_ok(),
        Err(_) => false,
    };
    if encoded {
        (StatusCode::OK, [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], out)
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "text/plain")], "metrics unavailable\n".to_string())
    }
}

/// Binds `listen` and serves the admin routes plus whatever the service mounts on `routes`, until `shutdown`.
/// The skeleton cancels `shutdown` only after the service has settled and NATS is drained, so probes and
/// `/metrics` answer through the whole wind-down. Returns the bound address.
pub async fn serve_with(
    listen: &str,
    health: Arc<Health>,
    registry: MetricsRegistry,
    routes: &AdminRoutes,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    serve(listen, health, registry, Some(routes.forwarder()), shutdown).await
}

/// Binds `listen` and serves the admin routes (plus `extra`) until `shutdown`. Returns the bound address.
pub async fn serve(
    listen: &str,
    health: Arc<Health>,
    registry: MetricsRegistry,
    extra: Option<Router>,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let router = Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AdminState { health, registry });
    let router = match extra {
        Some(extra) => router.merge(extra),
        None => router,
    };
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind admin server on {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).with_graceful_shutdown(shutdown.cancelled_owned()).await;
    });
    Ok(addr)
}
