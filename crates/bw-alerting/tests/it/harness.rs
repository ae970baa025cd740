//! Test harness: a recording sink receiver (axum), an in-process alerting service, and small helpers.

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use bw_common::service::Deps;
use bw_testkit::NatsServer;
use prost::Message;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Recorded {
    accepted: Vec<(String, Value)>,
    attempts: HashMap<String, usize>,
    failures_left: HashMap<String, (usize, u16)>,
}

/// Stands in for the three sinks: `/webhook`, `/slack`, `/pd`. Records accepted bodies; can fail on purpose.
#[derive(Clone)]
pub(crate) struct Receiver {
    url: String,
    state: Arc<Mutex<Recorded>>,
}

async fn receive(
    State(state): State<Arc<Mutex<Recorded>>>,
    Path(sink): Path<String>,
    axum::Json(body): axum::Json<Value>,
) -> StatusCode {
    let mut s = state.lock().expect("receiver lock");
    *s.attempts.entry(sink.clone()).or_default() += 1;
    if let Some((left, code)) = s.failures_left.get_mut(&sink)
        && *left > 0
    {
        *left -= 1;
        return StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    }
    s.accepted.push((sink, body));
    StatusCode::ACCEPTED
}

impl Receiver {
    pub(crate) async fn start() -> Receiver {
        let state = Arc::new(Mutex::new(Recorded::default()));
        let app = Router::new().route("/{sink}", post(receive)).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { url, state }
    }

    /// The next `times` requests to `sink` are answered with `code`.
    pub(crate) fn fail(&self, sink: &str, times: usize, code: u16) {
        self.state.lock().expect("lock").failures_left.insert(sink.into(), (times, code));
    }

    pub(crate) fn count(&self, sink: &str) -> usize {
        self.count_where(sink, |_| true)
    }

    pub(crate) fn attempts(&self, sink: &str) -> usize {
        self.state.lock().expect("lock").attempts.get(sink).copied().unwrap_or(0)
    }

    pub(crate) fn count_where(&self, sink: &str, pred: impl Fn(&Value) -> bool) -> usize {
        self.state.lock().expect("lock").accepted.iter().filter(|(s, b)| s == sink && pred(b)).count()
    }

    pub(crate) fn find(&self, sink: &str, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        self.state.lock().expect("lock").accepted.iter().find(|(s, b)| s == sink && pred(b)).map(|(_, b)| b.clone())
    }

    /// Sum of the integer field `field` over matching bodies.
    pub(crate) fn sum_where(&self, sink: &str, pred: impl Fn(&Value) -> bool, field: &str) -> u64 {
        self.state
            .lock()
            .expect("lock")
            .accepted
            .iter()
            .filter(|(s, b)| s == sink && pred(b))
            .map(|(_, b)| b[field].as_u64().unwrap_or(0))
            .sum()
    }
}

/// One in-process alerting instance.
pub(crate) struct Service {
    pub deps: Deps,
    token: CancellationToken,
    handle: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Service {
    /// Starts an instance with fast test settings, all three sinks pointing at `sinks`, plus `overrides`
    /// (`SECTION__FIELD`, value) applied as `BW_ALERTING__*` environment layers.
    pub(crate) async fn start(nats: &NatsServer, sinks: &Receiver, overrides: &[(&str, &str)]) -> Service {
        let mut env: HashMap<String, String> = [
            ("NATS__URL", nats.url()),
            ("ADMIN__LISTEN", "127.0.0.1:0".into()),
            ("ALERTING__POLL_INTERVAL_MS", "100".into()),
            ("ALERTING__ACK_WAIT_MS", "5000".into()),
            ("DELIVERY__BACKOFF_BASE_MS", "10".into()),
            ("DELIVERY__BACKOFF_CAP_MS", "50".into()),
            ("DELIVERY__TIMEOUT_MS", "2000".into()),
            ("STORM__INTERVAL_MS", "3000".into()),
            ("DISPLAY__RUNBOOK_BASE_URL", "https://runbooks.test".into()),
            ("DISPLAY__SOURCE", "breakwater-test".into()),
            ("SINKS__WEBHOOK__ENABLED", "true".into()),
            ("SINKS__WEBHOOK__URL", format!("{}/webhook", sinks.url)),
            ("SINKS__SLACK__ENABLED", "true".into()),
            ("SINKS__SLACK__URL", format!("{}/slack", sinks.url)),
            ("SINKS__PAGERDUTY__ENABLED", "true".into()),
            ("SINKS__PAGERDUTY__URL", format!("{}/pd", sinks.url)),
            ("SINKS__PAGERDUTY__ROUTING_KEY", "rk-test".into()),
        ]
        .into_iter()
        .map(|(k, v)| (format!("BW_ALERTING__{k}"), v))
        .collect();
        for (k, v) in overrides {
            env.insert(format!("BW_ALERTING__{k}"), v.to_string());
        }
        let cfg: bw_alerting::Config =
            bw_common::config::load("alerting", bw_alerting::DEFAULT_CONFIG, None, &env).expect("test config loads");
        bw_common::crypto::install_crypto();
        let deps = Deps::connect("alerting", &cfg.nats, None, Duration::from_secs(10)).await.expect("connect");
        let token = CancellationToken::new();
        let handle = tokio::spawn(bw_alerting::run(cfg, deps.clone(), token.clone()));
        let health = deps.health.clone();
        assert!(
            bw_testkit::wait_until(Duration::from_secs(10), || async { health.check().await.is_empty() }).await,
            "alerting did not become ready"
        );
        Service { deps, token, handle }
    }

    /// Sum of every sample of metric `name` (all label sets).
    pub(crate) fn metric(&self, name: &str) -> f64 {
        self.metric_with(name, "")
    }

    /// Sum of the samples of `name` whose label text contains `label`.
    pub(crate) fn metric_with(&self, name: &str, label: &str) -> f64 {
        let mut text = String::new();
        if let Ok(registry) = self.deps.metrics.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        }
        text.lines()
            .filter(|l| {
                l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                    && l.contains(label)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub(crate) async fn stop(self) {
        self.token.cancel();
        let result = tokio::time::timeout(Duration::from_secs(15), self.handle).await;
        assert!(matches!(result, Ok(Ok(Ok(())))), "run did not stop cleanly");
    }
}

/// Publishes `msg` durably on `subject`.
pub(crate) async fn publish(js: &async_nats::jetstream::Context, subject: String, msg: impl Message) {
    js.publish(subject, msg.encode_to_vec().into()).await.expect("publish").await.expect("ack");
}

/// Whether the alerting consumer has nothing pending or unacked.
pub(crate) async fn consumer_drained(js: &async_nats::jetstream::Context) -> bool {
    let Ok(stream) = js.get_stream(bw_wire::names::EVENTS_STREAM).await else {
        return false;
    };
    let Ok(mut consumer) =
        stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>(bw_alerting::CONSUMER).await
    else {
        return false;
    };
    match consumer.info().await {
        Ok(info) => info.num_pending == 0 && info.num_ack_pending == 0,
        Err(_) => false,
    }
}
