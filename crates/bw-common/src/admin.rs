//! The admin server every service runs on its own port: `/livez`, `/readyz`, `/metrics`, plus optional
//! service-specific routes (the coordinator mounts its admin API here).
//!
//! The three probes are read-only and answer anyone (kubelet probes, Prometheus): they carry no personal data
//! and no secret, and answer only GET. Mounted routes sit behind an [`OperatorGate`]: every request that could
//! change state (any method but GET and HEAD) needs `Authorization: Bearer <token>` whose sha256 the service is
//! configured with, and is refused while none is, so a route added later cannot be left open by mistake. The
//! listener itself may bind 0.0.0.0 (probes come from the node); who may reach it is the network's business
//! (`deploy/k8s/network-policies.yaml`).

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio_util::sync::CancellationToken;

/// Longest accepted operator token, bytes (longer is `malformed`).
const MAX_TOKEN_LEN: usize = 1024;

/// Why a state-changing admin request was refused; [`Refusal::label`] is the `reason` of a refusal counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No token hash is configured: operator actions are off.
    Disabled,
    /// No `Authorization` header.
    Missing,
    /// Not `Bearer <token>`, or an empty or overlong token.
    Malformed,
    /// A token that matches no configured hash.
    Invalid,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Disabled => "disabled",
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Invalid => "invalid",
        }
    }

    /// 403 `disabled` / `invalid`, 401 `missing` / `malformed` (with the scheme in `WWW-Authenticate`), as JSON
    /// `{"error": "..."}` that never repeats what the request sent.
    fn response(self) -> Response {
        let (status, message) = match self {
            Refusal::Disabled => (
                StatusCode::FORBIDDEN,
                "operator actions are disabled: no operator token is configured \
                 (set operator.token_sha256 in this service's config)",
            ),
            Refusal::Missing => {
                (StatusCode::UNAUTHORIZED, "operator token required: send `Authorization: Bearer <token>`")
            }
            Refusal::Malformed => {
                (StatusCode::UNAUTHORIZED, "malformed Authorization header: expected `Bearer <token>`")
            }
            Refusal::Invalid => (StatusCode::FORBIDDEN, "operator token rejected"),
        };
        let mut response = (status, axum::Json(serde_json::json!({ "error": message }))).into_response();
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer realm=\"breakwater-operator\""));
        response
    }
}

/// Who may change state through the admin server: a request whose bearer token has one of the configured
/// sha256 hashes (two during a rotation), compared in constant time. With no hash every such request is
/// refused. Cheap to clone.
#[derive(Clone, Default)]
pub struct OperatorGate {
    hashes: Arc<[[u8; 32]]>,
    on_refusal: Option<Arc<dyn Fn(Refusal) + Send + Sync>>,
}

impl std::fmt::Debug for OperatorGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorGate").field("token_hashes", &self.hashes.len()).finish_non_exhaustive()
    }
}

impl OperatorGate {
    /// A gate accepting the tokens with these sha256 hashes; none: every state-changing request is refused.
    pub fn new(hashes: Vec<[u8; 32]>) -> OperatorGate {
        OperatorGate { hashes: hashes.into(), on_refusal: None }
    }

    /// Calls `count` with each refusal (a service counts them in its own metric).
    pub fn on_refusal(mut self, count: impl Fn(Refusal) + Send + Sync + 'static) -> OperatorGate {
        self.on_refusal = Some(Arc::new(count));
        self
    }

    /// Checks the request's operator token.
    pub fn authorize(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if self.hashes.is_empty() {
            return Err(Refusal::Disabled);
        }
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(Refusal::Missing);
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN_LEN)
            .ok_or(Refusal::Malformed)?;
        let presented = Sha256::digest(token.as_bytes());
        let mut matched = subtle::Choice::from(0u8);
        for hash in self.hashes.iter() {
            matched |= subtle::ConstantTimeEq::ct_eq(presented.as_slice(), hash.as_slice());
        }
        if bool::from(matched) { Ok(()) } else { Err(Refusal::Invalid) }
    }

    /// None when the request may pass; else its refusal, counted, logged (path and reason, never the header)
    /// and answered.
    fn refuse(&self, request: &Request) -> Option<Response> {
        let refusal = self.authorize(request.headers()).err()?;
        if let Some(count) = &self.on_refusal {
            count(refusal);
        }
        tracing::warn!(path = %request.uri().path(), reason = refusal.label(), "operator action refused");
        Some(refusal.response())
    }

    /// `router` with every one of its routes behind the gate, whatever the method.
    pub fn protect<S: Clone + Send + Sync + 'static>(&self, router: Router<S>) -> Router<S> {
        let gate = self.clone();
        router.route_layer(axum::middleware::from_fn(move |request: Request, next: Next| {
            let gate = gate.clone();
            async move {
                match gate.refuse(&request) {
                    None => next.run(request).await,
                    Some(refused) => refused,
                }
            }
        }))
    }
}

/// Whether a request may change state: any method but GET and HEAD.
fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD)
}

/// Service-specific admin routes, mounted by the service once it has built what they need (the coordinator's
/// breaker API). The admin server is started before the service runs and answers them as soon as they are
/// mounted; until then they are 404.
#[derive(Clone, Default)]
pub struct AdminRoutes {
    routes: Arc<RwLock<Option<(Router, OperatorGate)>>>,
}

impl AdminRoutes {
    /// Mounts `router` beside `/livez`, `/readyz` and `/metrics` (replacing an earlier mount). Every request to
    /// it that could change state (any method but GET and HEAD) passes `operator` first.
    pub fn mount(&self, router: Router, operator: OperatorGate) {
        if let Ok(mut slot) = self.routes.write() {
            *slot = Some((router, operator));
        }
    }

    /// A router that forwards every request it gets to the mounted routes, state-changing ones through the gate.
    fn forwarder(&self) -> Router {
        let routes = self.routes.clone();
        Router::new().fallback(move |request: Request| {
            let mounted = routes.read().ok().and_then(|r| r.clone());
            async move {
                use tower::ServiceExt;
                let Some((router, operator)) = mounted else {
                    return (StatusCode::NOT_FOUND, "not found\n").into_response();
                };
                if changes_state(request.method())
                    && let Some(refused) = operator.refuse(&request)
                {
                    return refused;
                }
                match router.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
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

/// Binds `listen` and serves the admin routes (plus `extra`, which guards its own state-changing routes:
/// [`OperatorGate::protect`]) until `shutdown`. Returns the bound address.
pub async fn serve(
    listen: &str,
    health: Arc<Health>,
    registry: MetricsRegistry,
    extra: Option<Router>,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let router = app(health, registry, extra);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind admin server on {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).with_graceful_shutdown(shutdown.cancelled_owned()).await;
    });
    Ok(addr)
}

/// The probes and `/metrics`, plus `extra`.
fn app(health: Arc<Health>, registry: MetricsRegistry, extra: Option<Router>) -> Router {
    let router = Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(AdminState { health, registry });
    match extra {
        Some(extra) => router.merge(extra),
        None => router,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::post;
    use std::sync::atomic::AtomicUsize;
    use tower::ServiceExt as _;

    const TOKEN: &str = "test-operator-token";

    fn hash(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    fn headers(value: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = value {
            h.insert(header::AUTHORIZATION, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn each_refusal_has_its_reason() {
        let gate = OperatorGate::new(vec![hash("old-token"), hash("new-token")]);
        assert_eq!(OperatorGate::default().authorize(&headers(Some("Bearer new-token"))), Err(Refusal::Disabled));
        assert_eq!(gate.authorize(&headers(None)), Err(Refusal::Missing));
        assert_eq!(gate.authorize(&headers(Some("Basic bmV3LXRva2Vu"))), Err(Refusal::Malformed));
        assert_eq!(gate.authorize(&headers(Some("Bearer "))), Err(Refusal::Malformed));
        let long = format!("Bearer {}", "x".repeat(MAX_TOKEN_LEN + 1));
        assert_eq!(gate.authorize(&headers(Some(&long))), Err(Refusal::Malformed));
        assert_eq!(gate.authorize(&headers(Some("Bearer new-tokeN"))), Err(Refusal::Invalid));
        assert_eq!(gate.authorize(&headers(Some("Bearer new-token"))), Ok(()));
        assert_eq!(gate.authorize(&headers(Some("Bearer old-token"))), Ok(()), "both during a rotation");
        assert!(!format!("{gate:?}").contains(&hex::encode(hash("new-token"))), "Debug shows no hash");
    }

    /// The admin server of a service that mounted one state-changing route (it counts its calls) and one
    /// read-only route, behind `gate`.
    fn server(gate: OperatorGate, changes: Arc<AtomicUsize>) -> Router {
        let health = Health::new(None, None);
        health.set_started();
        let mounted = Router::new()
            .route(
                "/admin/change",
                post(move || async move {
                    changes.fetch_add(1, Ordering::SeqCst);
                    "changed\n"
                }),
            )
            .route("/admin/view", get(|| async { "view\n" }));
        let routes = AdminRoutes::default();
        routes.mount(mounted, gate);
        app(health, new_registry(), Some(routes.forwarder()))
    }

    async fn call(router: &Router, method: Method, path: &str, bearer: Option<&str>) -> (u16, String) {
        let mut request = axum::http::Request::builder().method(method).uri(path);
        if let Some(token) = bearer {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = router.clone().oneshot(request.body(Body::empty()).expect("request")).await.expect("answer");
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn state_changing_requests_need_the_operator_token_and_the_probes_stay_open() {
        let refused = Arc::new(AtomicUsize::new(0));
        let counted = refused.clone();
        let changes = Arc::new(AtomicUsize::new(0));
        // No hash configured (every service's default): refused whatever the token, and counted.
        let closed = server(
            OperatorGate::default().on_refusal(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            }),
            changes.clone(),
        );
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            for bearer in [None, Some(TOKEN)] {
                let (status, body) = call(&closed, method.clone(), "/admin/change", bearer).await;
                assert_eq!(status, 403, "{method} {bearer:?}: {body}");
                assert!(body.contains("no operator token is configured") && !body.contains(TOKEN), "{body}");
            }
        }
        assert_eq!((changes.load(Ordering::SeqCst), refused.load(Ordering::SeqCst)), (0, 8));
        // Probes, metrics and read-only routes answer without a token; the probes change nothing on POST.
        for path in ["/livez", "/readyz", "/metrics", "/admin/view"] {
            assert_eq!(call(&closed, Method::GET, path, None).await.0, 200, "{path}");
        }
        for path in ["/livez", "/readyz", "/metrics"] {
            assert_eq!(call(&closed, Method::POST, path, None).await.0, 405, "{path}");
        }

        let open = server(OperatorGate::new(vec![hash(TOKEN)]), changes.clone());
        assert_eq!(call(&open, Method::POST, "/admin/change", None).await.0, 401);
        assert_eq!(call(&open, Method::POST, "/admin/change", Some("another-token")).await.0, 403);
        assert_eq!(changes.load(Ordering::SeqCst), 0, "a refused request changes nothing");
        assert_eq!(call(&open, Method::POST, "/admin/change", Some(TOKEN)).await, (200, "changed\n".to_string()));
        assert_eq!(changes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_protected_router_served_on_its_own_refuses_without_the_token() {
        let changes = Arc::new(AtomicUsize::new(0));
        let seen = changes.clone();
        let gate = OperatorGate::new(vec![hash(TOKEN)]);
        let extra = gate.protect(Router::new().route(
            "/admin/change",
            post(move || async move {
                seen.fetch_add(1, Ordering::SeqCst);
                "changed\n"
            }),
        ));
        let router = app(Health::new(None, None), new_registry(), Some(extra));
        assert_eq!(call(&router, Method::POST, "/admin/change", None).await.0, 401);
        assert_eq!(changes.load(Ordering::SeqCst), 0);
        assert_eq!(call(&router, Method::POST, "/admin/change", Some(TOKEN)).await.0, 200);
        assert_eq!(changes.load(Ordering::SeqCst), 1);
    }
}
