//! Telemetry: structured logs (text or JSON) through `tracing`, optional OTLP/HTTP trace export, and W3C trace
//! context carried in NATS headers so one trace follows a message across every service.
//!
//! Never put tokens, app secrets, message bodies or full phone numbers in span fields or log lines.

use crate::config::TelemetryConfig;
use bw_wire::trace::inject;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the tracer provider alive; flushes spans when dropped.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.force_flush();
            let _ = p.shutdown();
        }
    }
}

/// Installs the global subscriber: env filter (RUST_LOG, else `cfg.log_level`), fmt output, and the OTLP
/// layer when `cfg.otlp_endpoint` is set. Safe to call more than once (later calls only return a guard).
pub fn init(service_name: &str, cfg: &TelemetryConfig) -> TelemetryGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&cfg.log_level));
    let fmt_layer = if cfg.log_format == "json" {
        tracing_subscriber::fmt::layer().json().with_target(true).boxed()
    } else {
        tracing_subscriber::fmt::layer().with_target(false).boxed()
    };
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    // The OTLP exporter's HTTP client needs the process-wide rustls provider.
    crate::crypto::install_crypto();
    let provider = if cfg.otlp_endpoint.is_empty() { None } else { build_provider(service_name, &cfg.otlp_endpoint) };
    let otel_layer =
        provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service_name.to_string())));
    let installed = tracing_subscriber::registry().with(filter).with(fmt_layer).with(otel_layer).try_init();
    if installed.is_ok()
        && let Some(p) = &provider
    {
        opentelemetry::global::set_tracer_provider(p.clone());
    }
    TelemetryGuard { provider }
}

fn build_provider(service_name: &str, endpoint: &str) -> Option<SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder().with_http().with_endpoint(endpoint).build();
    match exporter {
        Ok(exporter) => Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder().with_service_name(service_name.to_string()).build(),
                )
                .build(),
        ),
        Err(e) => {
            eprintln!("otlp exporter disabled: {e}");
            None
        }
    }
}

struct HeaderExtractor<'a>(&'a async_nats::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

/// The W3C `traceparent` of `span`, empty when it has no valid trace context (no exporter configured).
pub fn traceparent(span: &tracing::Span) -> String {
    let mut headers = async_nats::HeaderMap::new();
    inject(span, &mut headers);
    headers.get("traceparent").map(|v| v.as_str().to_string()).unwrap_or_default()
}

/// The trace id (32 hex digits) of a W3C `traceparent`, empty when it is not one.
pub fn trace_id_of(traceparent: &str) -> String {
    let mut parts = traceparent.split('-');
    match (parts.next(), parts.next()) {
        (Some(_version), Some(id)) if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) => id.to_string(),
        _ => String::new(),
    }
}

/// Adds to `span` a link to the span a W3C `traceparent` names (another trace: a status webhook's processing
/// points to the operation it concerns). Nothing when the traceparent is empty or invalid.
pub fn link_to(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() {
        return;
    }
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("traceparent", traceparent);
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(&headers));
    use opentelemetry::trace::TraceContextExt as _;
    let linked = cx.span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}

/// Makes `span` a child of the trace context found in `headers`, if any.
pub fn set_parent_from(span: &tracing::Span, headers: Option<&async_nats::HeaderMap>) {
    if let Some(h) = headers
        && h.get("traceparent").is_some()
    {
        let cx = TraceContextPropagator::new().extract(&HeaderExtractor(h));
        let _ = span.set_parent(cx);
    }
}
