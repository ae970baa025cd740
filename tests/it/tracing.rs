//! One message produces one trace across the services: producer span → ingest intake → dispatch, exported
//! through the real `bw_common::telemetry::init` over OTLP/HTTP to a tiny receiver that decodes
//! `ExportTraceServiceRequest` protobuf.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use bw_common::proto::{Category, OperationState};
use bw_e2e::{Harness, WABA_ID};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument;

const PHONE: &str = "106540352242933";

/// A span as the receiver saw it.
#[derive(Debug, Clone)]
struct SeenSpan {
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    service: String,
    attributes: Vec<(String, String)>,
}

type Seen = Arc<Mutex<Vec<SeenSpan>>>;

async fn receive(State(seen): State<Seen>, body: Bytes) -> (axum::http::StatusCode, Vec<u8>) {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (axum::http::StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut out = Vec::new();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .map(|kv| format!("{:?}", kv.value))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                let attributes = span.attributes.iter().map(|kv| (kv.key.clone(), format!("{:?}", kv.value))).collect();
                out.push(SeenSpan {
                    name: span.name,
                    trace_id: span.trace_id,
                    span_id: span.span_id,
                    parent_span_id: span.parent_span_id,
                    service: service.clone(),
                    attributes,
                });
            }
        }
    }
    seen.lock().expect("receiver lock").extend(out);
    (axum::http::StatusCode::OK, Vec::new())
}

async fn start_receiver() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new().route("/v1/traces", post(receive)).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind otlp receiver");
    let url = format!("http://{}/v1/traces", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_is_one_trace_from_producer_through_ingest_to_dispatch() {
    let (endpoint, seen) = start_receiver().await;
    // Only the spans this test looks at (and warnings) are enabled, so the global subscriber stays quiet for
    // the other tests of this binary.
    let cfg = bw_common::config::TelemetryConfig {
        log_level: "warn,[e2e.produce]=info,[ingest.intake]=info,[dispatch]=info".into(),
        log_format: "text".into(),
        otlp_endpoint: endpoint,
    };
    // The exporter uses a blocking HTTP client: build and flush it off the async workers.
    let guard = tokio::task::spawn_blocking(move || bw_common::telemetry::init("bw-e2e", &cfg)).await.expect("init");

    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    let request =
        bw_client::Request::template("e2e-trace-1", WABA_ID, PHONE, "+5491155550001", "order_confirmation", "es_AR")
            .param("42")
            .category(Category::Transactional)
            .build();
    let producer = h.producer();
    let reply = producer.send(&request).instrument(tracing::info_span!("e2e.produce")).await.expect("ingest answers");
    assert!(reply.accepted, "rejected: {}", reply.error);
    assert!(
        h.wait_state(
            "e2e-trace-1",
            &[OperationState::Sent, OperationState::Delivered, OperationState::Read],
            Duration::from_secs(20)
        )
        .await
    );
    // Dropping the guard flushes the batch exporter.
    tokio::task::spawn_blocking(move || drop(guard)).await.expect("flush");

    let find = |name: &str| -> Option<SeenSpan> {
        let spans = seen.lock().expect("lock");
        spans
            .iter()
            .find(|s| s.name == name && s.attributes.iter().any(|(_, v)| v.contains("e2e-trace-1")))
            .or_else(|| if name == "e2e.produce" { spans.iter().find(|s| s.name == name) } else { None })
            .cloned()
    };
    let all_there = bw_testkit::wait_until(Duration::from_secs(20), || async {
        find("e2e.produce").is_some() && find("ingest.intake").is_some() && find("dispatch").is_some()
    })
    .await;
    let names: Vec<String> = seen.lock().expect("lock").iter().map(|s| s.name.clone()).collect();
    assert!(all_there, "spans exported: {names:?}");
    let produce = find("e2e.produce").expect("producer span");
    let intake = find("ingest.intake").expect("intake span");
    let dispatch = find("dispatch").expect("dispatch span");

    assert_eq!(produce.trace_id.len(), 16);
    assert!(produce.service.contains("bw-e2e"), "service.name resource: {}", produce.service);
    assert_eq!(intake.trace_id, produce.trace_id, "ingest continues the producer's trace");
    assert_eq!(intake.parent_span_id, produce.span_id, "intake is a child of the producer span");
    assert_eq!(dispatch.trace_id, produce.trace_id, "the dispatcher continues the same trace");
    assert_eq!(dispatch.parent_span_id, intake.span_id, "dispatch is a child of the intake span");
    assert_ne!(dispatch.span_id, intake.span_id);
}
