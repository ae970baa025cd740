//! How full the streams that hold accepted work are, so intake refuses new work before they refuse a write.
//!
//! BW_SEND (each partition) and the ledger (each partition's bucket) refuse a write when full (DiscardNew): a
//! request accepted just before would then be half stored. So once any of them holds `storage_full_ratio` of
//! its byte or message limit, intake refuses new operations with `REJECT_REASON_STORAGE_FULL` (a retry of an
//! accepted one is still answered "duplicate"), and the alerting service's stream_near_limit (and the
//! StreamNearLimit Prometheus rule) have fired well before. The fill comes from stream info read in the
//! background at most once per `refresh` (one request per stream, never one per producer request); until the
//! first reading, and while readings fail, nothing is refused on its account.

use async_nats::jetstream;
use bw_wire::names;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

type Labels = Vec<(&'static str, String)>;

/// One stream's last reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fill {
    pub bytes: u64,
    pub max_bytes: i64,
    pub messages: u64,
    pub max_messages: i64,
}

impl Fill {
    /// The larger of the byte and message fill (0 without limits), and which it is.
    pub(crate) fn ratio(&self) -> (f64, &'static str) {
        let of = |n: u64, max: i64| if max > 0 { n as f64 / max as f64 } else { 0.0 };
        let (bytes, messages) = (of(self.bytes, self.max_bytes), of(self.messages, self.max_messages));
        if bytes >= messages { (bytes, "bytes") } else { (messages, "messages") }
    }
}

/// The streams watched and their last readings.
pub(crate) struct Capacity {
    ratio: f64,
    /// BW_SEND partition streams, by partition.
    send: Vec<String>,
    /// The ledger partitions' streams.
    ledger: Vec<String>,
    readings: RwLock<std::collections::HashMap<String, Fill>>,
    gauge: Family<Labels, Gauge<f64, AtomicU64>>,
}

impl Capacity {
    /// Watches `send`'s partitions and `ledger_partitions` ledger buckets; refuses at `ratio` (0 < ratio <= 1).
    pub(crate) fn new(
        send: names::SendPartitions,
        ledger_partitions: usize,
        ratio: f64,
        registry: &bw_common::admin::MetricsRegistry,
    ) -> Capacity {
        let gauge = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        if let Ok(mut r) = registry.lock() {
            r.register(
                "bw_ingest_storage_fill_ratio",
                "Fill of BW_SEND and ledger streams as ingest last read it (the larger of bytes and messages)",
                gauge.clone(),
            );
        }
        Capacity {
            ratio,
            send: send.streams().collect(),
            ledger: (0..ledger_partitions.max(1)).map(|p| format!("KV_{}", names::ledger_bucket(p))).collect(),
            readings: RwLock::new(Default::default()),
            gauge,
        }
    }

    /// Why a new operation of a sender whose requests go to `send_stream` must be refused now, if it must.
    pub(crate) fn refusal(&self, send_stream: &str) -> Option<String> {
        let readings = self.readings.read().unwrap_or_else(|p| p.into_inner());
        let watched = std::iter::once(send_stream).chain(self.ledger.iter().map(String::as_str));
        for stream in watched {
            let Some(fill) = readings.get(stream) else { continue };
            let (ratio, what) = fill.ratio();
            if ratio >= self.ratio {
                let shown = if stream.starts_with("KV_") { "the ledger" } else { "BW_SEND" };
                return Some(format!(
                    "{shown} ({stream}) is {:.0}% full ({what}); new requests are refused until it drains or its \
                     limit is raised; retry later with the same operation_id",
                    (ratio * 100.0).floor()
                ));
            }
        }
        None
    }

    /// Reads every watched stream once.
    pub(crate) async fn refresh(&self, js: &jetstream::Context) {
        for stream in self.send.iter().chain(&self.ledger) {
            match js.get_stream(stream).await {
                Ok(s) => {
                    let info = s.cached_info();
                    let fill = Fill {
                        bytes: info.state.bytes,
                        max_bytes: info.config.max_bytes,
                        messages: info.state.messages,
                        max_messages: info.config.max_messages,
                    };
                    self.gauge.get_or_create(&vec![("stream", stream.clone())]).set(fill.ratio().0);
                    self.readings.write().unwrap_or_else(|p| p.into_inner()).insert(stream.clone(), fill);
                }
                Err(e) => tracing::debug!(stream = %stream, error = %e, "stream info unavailable; last reading kept"),
            }
        }
    }

    /// Refreshes every `every` until `shutdown`.
    pub(crate) async fn run(self: Arc<Self>, js: jetstream::Context, every: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => self.refresh(&js).await,
            }
        }
    }
}

/// Reports a stream whose byte limit could not be applied: it keeps working as before, without the disk bound.
pub(crate) fn limits_not_applied(stream: &str, error: &str) {
    tracing::error!(
        stream,
        error,
        "stream byte limit not applied: it can fill the disk; give ingest's NATS user $JS.API.STREAM.UPDATE on it \
         (deploy/nats/accounts.conf) and restart ingest, or set max_bytes on the stream as a NATS administrator"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fuller_of_bytes_and_messages_counts() {
        let f = Fill { bytes: 90, max_bytes: 100, messages: 1, max_messages: 1000 };
        assert_eq!(f.ratio(), (0.9, "bytes"));
        let f = Fill { bytes: 1, max_bytes: 100, messages: 950, max_messages: 1000 };
        assert_eq!(f.ratio(), (0.95, "messages"));
        let f = Fill { bytes: 5, max_bytes: -1, messages: 5, max_messages: -1 };
        assert_eq!(f.ratio().0, 0.0, "no limits, never full");
    }

    #[test]
    fn a_near_full_stream_refuses_and_names_itself() {
        let c = Capacity::new(names::SendPartitions::new(2), 1, 0.9, &bw_common::admin::new_registry());
        assert_eq!(c.refusal("BW_SEND"), None, "nothing read yet");
        let put = |stream: &str, bytes: u64| {
            let fill = Fill { bytes, max_bytes: 1000, messages: 0, max_messages: -1 };
            c.readings.write().expect("lock").insert(stream.to_string(), fill);
        };
        put("BW_SEND_1", 950);
        put("BW_SEND", 100);
        put("KV_BW_LEDGER", 100);
        assert_eq!(c.refusal("BW_SEND"), None, "another partition's fill does not refuse this sender");
        let why = c.refusal("BW_SEND_1").expect("refused");
        assert!(why.contains("BW_SEND (BW_SEND_1) is 95% full (bytes)"), "{why}");
        put("KV_BW_LEDGER", 900);
        assert!(c.refusal("BW_SEND").expect("ledger full").contains("the ledger (KV_BW_LEDGER) is 90% full"));
    }
}
