//! Ingest metrics, registered into the service's shared registry.

use bw_common::admin::MetricsRegistry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

type Labels = Vec<(&'static str, String)>;

/// Counters and histograms of ingest.
#[derive(Clone)]
pub(crate) struct Metrics {
    /// Producer requests by source (nats, http), outcome (accepted, duplicate, rejected) and reject reason.
    pub intake: Family<Labels, Counter>,
    /// Time from receiving a webhook POST to answering it (signature check + durable store).
    pub webhook_ack_seconds: Histogram,
    /// Webhook POSTs by result: stored, duplicate_body, invalid_signature, missing_signature, rate_limited,
    /// too_large, busy, read_timeout, store_failed.
    pub webhooks_received: Family<Labels, Counter>,
    /// Stored webhooks processed, by result: ok, retry, bad_json, undecodable.
    pub webhooks_processed: Family<Labels, Counter>,
    /// Statuses applied to the ledger by status word; `stale` counts out-of-order statuses kept out.
    pub statuses: Family<Labels, Counter>,
    /// Statuses by status word and whether they carried `biz_opaque_callback_data` naming an operation
    /// (`callback_data`: present, absent): the evidence for `dispatch.wamid_link`.
    pub callback_data: Family<Labels, Counter>,
    /// Duplicate deliveries dropped, by kind (status, inbound).
    pub duplicates_dropped: Family<Labels, Counter>,
    /// Inbound customer messages forwarded to BW_INBOUND.
    pub inbound_forwarded: Counter,
    /// Reconciler decisions: resolved, waiting, resend, quarantine, expire, undecodable.
    pub reconciler: Family<Labels, Counter>,
    /// HTTP requests refused before validation: missing_key, unknown_key, forbidden_sender,
    /// unsupported_media_type, busy (max_in_flight reached).
    pub refused: Family<Labels, Counter>,
    /// Ledger revisions handled by the feed publisher: published, deleted, undecodable, retry.
    pub feed: Family<Labels, Counter>,
    /// NATS requests not processed because their reply subject is not under the requester's inbox prefix, by
    /// source (intake, status).
    pub reply_refused: Family<Labels, Counter>,
    /// Feed events handled by the HTTP callbacks, by callback and result: delivered, retried, refused, expired,
    /// waiting, skipped, undecodable.
    pub callbacks: Family<Labels, Counter>,
    /// Duration of each callback request (any answer, timeouts included), by callback.
    pub callback_request_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// Time from an event's ledger revision to its receiver's 2xx, by callback.
    pub callback_delivery_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    /// Callback attempts that failed because the host resolved only to addresses the egress policy refuses.
    pub callback_egress_refused: Family<Labels, Counter>,
    /// Sources whose bad webhook signatures are being counted (bounded by webhook.bad_signature_sources).
    pub bad_signature_sources: prometheus_client::metrics::gauge::Gauge,
    /// Webhook changes beyond `messages` (and value-level errors) by field and result: published, unknown,
    /// malformed. `field` is one of the fields of meta-cloud-api.md §4.5, else `other`.
    pub webhook_fields: Family<Labels, Counter>,
    /// Template requests whose category intake checked against Meta's, by result: marketing (moved to
    /// MARKETING, accepted as marketing), unavailable (the rules could not be read; the producer's category stood).
    pub template_category: Family<Labels, Counter>,
}

fn request_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

fn delivery_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 4.0, 12))
}

impl Metrics {
    pub(crate) fn register(registry: &MetricsRegistry) -> Metrics {
        let m = Metrics {
            intake: Family::default(),
            webhook_ack_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            webhooks_received: Family::default(),
            webhooks_processed: Family::default(),
            statuses: Family::default(),
            callback_data: Family::default(),
            duplicates_dropped: Family::default(),
            inbound_forwarded: Counter::default(),
            reconciler: Family::default(),
            refused: Family::default(),
            feed: Family::default(),
            reply_refused: Family::default(),
            callbacks: Family::default(),
            callback_request_seconds: Family::new_with_constructor(request_buckets),
            callback_delivery_seconds: Family::new_with_constructor(delivery_buckets),
            callback_egress_refused: Family::default(),
            bad_signature_sources: Default::default(),
            webhook_fields: Family::default(),
            template_category: Family::default(),
        };
        if let Ok(mut r) = registry.lock() {
            r.register("bw_intake_requests", "Producer requests by source, outcome and reason", m.intake.clone());
            r.register(
                "bw_webhook_ack_seconds",
                "Time to acknowledge a Meta webhook POST (verify and store durably)",
                m.webhook_ack_seconds.clone(),
            );
            r.register("bw_webhooks_received", "Webhook POSTs by result", m.webhooks_received.clone());
            r.register(
                "bw_webhook_bad_signature_sources",
                "Sources whose badly signed webhook requests are counted against their budget",
                m.bad_signature_sources.clone(),
            );
            r.register("bw_webhooks_processed", "Stored webhooks processed by result", m.webhooks_processed.clone());
            r.register(
                "bw_webhook_fields",
                "Webhook changes beyond messages and value-level errors, by field and result",
                m.webhook_fields.clone(),
            );
            r.register(
                "bw_intake_template_category",
                "Template requests whose category intake changed to Meta's, or could not check, by result",
                m.template_category.clone(),
            );
            r.register("bw_statuses_applied", "Status updates applied to the ledger by status", m.statuses.clone());
            r.register(
                "bw_status_callback_data",
                "Status webhooks by status and whether they carried biz_opaque_callback_data",
                m.callback_data.clone(),
            );
            r.register("bw_duplicates_dropped", "Duplicate deliveries dropped by kind", m.duplicates_dropped.clone());
            r.register("bw_inbound_forwarded", "Inbound customer messages forwarded", m.inbound_forwarded.clone());
            r.register("bw_intake_refused", "HTTP requests refused before validation, by reason", m.refused.clone());
            r.register(
                "bw_intake_reply_refused",
                "NATS requests not processed: reply subject outside the requester's inbox prefix, by source",
                m.reply_refused.clone(),
            );
            r.register("bw_feed_events", "Ledger revisions handled by the feed publisher, by result", m.feed.clone());
            r.register("bw_reconciler_decisions", "Unknown-outcome reconciler decisions", m.reconciler.clone());
            r.register(
                "bw_callback_deliveries",
                "Feed events handled by HTTP callbacks, by callback and result",
                m.callbacks.clone(),
            );
            r.register(
                "bw_callback_request_seconds",
                "Duration of HTTP callback requests, by callback",
                m.callback_request_seconds.clone(),
            );
            r.register(
                "bw_callback_egress_refused",
                "Callback attempts refused because the host resolved only to addresses callbacks may not reach",
                m.callback_egress_refused.clone(),
            );
            r.register(
                "bw_callback_delivery_seconds",
                "Time from an event's ledger revision to its callback receiver's 2xx, by callback",
                m.callback_delivery_seconds.clone(),
            );
        }
        m
    }

    pub(crate) fn intake(&self, source: &str, outcome: &str, reason: &str) {
        self.intake
            .get_or_create(&vec![
                ("source", source.to_string()),
                ("outcome", outcome.to_string()),
                ("reason", reason.to_string()),
            ])
            .inc();
    }

    pub(crate) fn received(&self, result: &str) {
        self.webhooks_received.get_or_create(&vec![("result", result.to_string())]).inc();
    }

    pub(crate) fn processed(&self, result: &str) {
        self.webhooks_processed.get_or_create(&vec![("result", result.to_string())]).inc();
    }

    pub(crate) fn status(&self, status: &str) {
        self.statuses.get_or_create(&vec![("status", status.to_string())]).inc();
    }

    pub(crate) fn callback_data(&self, status: &str, present: bool) {
        let presence = if present { "present" } else { "absent" };
        self.callback_data
            .get_or_create(&vec![("status", status.to_string()), ("callback_data", presence.to_string())])
            .inc();
    }

    pub(crate) fn duplicate(&self, kind: &str) {
        self.duplicates_dropped.get_or_create(&vec![("kind", kind.to_string())]).inc();
    }

    pub(crate) fn refused(&self, reason: &str) {
        self.refused.get_or_create(&vec![("reason", reason.to_string())]).inc();
    }

    pub(crate) fn reply_refused(&self, source: &str) {
        self.reply_refused.get_or_create(&vec![("source", source.to_string())]).inc();
    }

    pub(crate) fn feed(&self, result: &str) {
        self.feed.get_or_create(&vec![("result", result.to_string())]).inc();
    }

    pub(crate) fn callback(&self, callback: &str, result: &str) {
        self.callbacks.get_or_create(&vec![("callback", callback.to_string()), ("result", result.to_string())]).inc();
    }

    pub(crate) fn callback_egress_refused(&self, callback: &str) {
        self.callback_egress_refused.get_or_create(&vec![("callback", callback.to_string())]).inc();
    }

    pub(crate) fn callback_request(&self, callback: &str, seconds: f64) {
        self.callback_request_seconds.get_or_create(&vec![("callback", callback.to_string())]).observe(seconds);
    }

    pub(crate) fn callback_delivered(&self, callback: &str, seconds: f64) {
        self.callback_delivery_seconds.get_or_create(&vec![("callback", callback.to_string())]).observe(seconds);
    }

    pub(crate) fn template_category(&self, result: &str) {
        self.template_category.get_or_create(&vec![("result", result.to_string())]).inc();
    }

    pub(crate) fn reconciled(&self, action: &str) {
        self.reconciler.get_or_create(&vec![("action", action.to_string())]).inc();
    }
}
