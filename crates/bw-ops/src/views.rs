//! Read-only views for operator tools beyond `bwctl`'s own (the console): one operation's feed events, the
//! firing alerts, and free texts with phone-number-like digit runs masked. Nothing here writes.

use crate::OpsError;
use async_nats::jetstream::{self, consumer};
use bw_proto::v1::{Alert, AlertStatus, OutcomeEvent};
use bw_wire::tenancy;
use futures::StreamExt;
use prost::Message as _;
use std::time::Duration;

/// The outcome feed's stream (written by ingest's feed publisher).
pub const FEED_STREAM: &str = "BW_FEED";
/// At most this many feed events are read for one operation.
pub const MAX_EVENTS: usize = 500;

/// The feed events of operation `key` (`<tenant>/<id>` or a bare id of `default`) of sender `phone`, oldest
/// first, read through an ephemeral consumer that acknowledges nothing. Empty when the feed does not exist.
pub async fn feed_events(js: &jetstream::Context, phone: &str, key: &str) -> Result<Vec<OutcomeEvent>, OpsError> {
    let Ok(stream) = js.get_stream(FEED_STREAM).await else { return Ok(Vec::new()) };
    let (tenant, op) = tenancy::split_operation_key(key);
    let mut filters = vec![tenancy::feed_subject(tenant, phone, op)];
    if tenant == tenancy::DEFAULT_TENANT {
        // Events published before tenants existed.
        filters.push(format!("bw.feed.v1.{phone}.{op}"));
    }
    let config = consumer::pull::Config {
        filter_subjects: filters,
        deliver_policy: consumer::DeliverPolicy::All,
        ack_policy: consumer::AckPolicy::None,
        inactive_threshold: Duration::from_secs(30),
        ..Default::default()
    };
    let mut c = stream.create_consumer(config).await.map_err(|e| OpsError::nats(FEED_STREAM, e))?;
    let pending = c.info().await.map_err(|e| OpsError::nats(FEED_STREAM, e))?.num_pending as usize;
    let mut out = Vec::new();
    if pending > 0 {
        let mut batch = c
            .fetch()
            .max_messages(pending.min(MAX_EVENTS))
            .expires(Duration::from_secs(5))
            .messages()
            .await
            .map_err(|e| OpsError::nats(FEED_STREAM, e))?;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| OpsError::nats(FEED_STREAM, e))?;
            if let Ok(ev) = OutcomeEvent::decode(m.payload.as_ref()) {
                out.push(ev);
            }
        }
    }
    let name = c.cached_info().name.clone();
    let _ = stream.delete_consumer(&name).await;
    Ok(out)
}

/// Masks runs of 8 or more digits (a phone number in a free text) with `bw_common::mask::phone`; Meta error
/// codes (at most 6 digits) stay readable.
pub fn mask_digits(text: &str) -> String {
    bw_common::mask::digit_runs(text, 8, bw_common::mask::phone)
}

/// The value alerting keeps per alert in its state bucket: field 1 is the alert (bw-alerting `AlertState`; only
/// the field read here is declared, so newer fields are skipped).
#[derive(Clone, PartialEq, prost::Message)]
struct AlertStateView {
    #[prost(message, optional, tag = "1")]
    alert: Option<Alert>,
}

/// Every alert the alerting service holds as firing now (its KV bucket `BW_ALERTS`), newest first. Empty when
/// the bucket does not exist (alerting never ran).
pub async fn firing_alerts(js: &jetstream::Context) -> Result<Vec<Alert>, OpsError> {
    let bucket_name = bw_wire::names::ALERTS_BUCKET;
    let Ok(bucket) = js.get_key_value(bucket_name).await else { return Ok(Vec::new()) };
    let mut keys = bucket.keys().await.map_err(|e| OpsError::nats(bucket_name, e))?;
    let mut out = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| OpsError::nats(bucket_name, e))?;
        let Some(value) = bucket.get(&key).await.map_err(|e| OpsError::nats(bucket_name, e))? else { continue };
        if let Some(alert) = AlertStateView::decode(value.as_ref()).ok().and_then(|s| s.alert)
            && !alert.dedup_key.is_empty()
            && alert.status == AlertStatus::Firing as i32
        {
            out.push(alert);
        }
    }
    out.sort_by_key(|a| std::cmp::Reverse(a.started_at_unix_ms));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_digit_runs_are_masked_and_codes_stay() {
        let shown = mask_digits("to +5491155551234 failed with 131026");
        assert!(!shown.contains("5491155551234"), "{shown}");
        assert!(shown.contains("131026"), "{shown}");
    }

    #[test]
    fn an_alert_state_decodes_to_its_alert() {
        let alert = Alert { dedup_key: "k".into(), status: AlertStatus::Firing as i32, ..Default::default() };
        let bytes = AlertStateView { alert: Some(alert.clone()) }.encode_to_vec();
        assert_eq!(AlertStateView::decode(bytes.as_slice()).expect("decodes").alert, Some(alert));
    }
}
