//! The pages' view of Breakwater: breaker snapshots (BW_SCOPES), DLQ entries (masked), incident progress, the
//! quarantine's scopes and the firing alerts, read through `bw_ops` as `bwctl` reads them.
//!
//! A view is read again every refresh and replaced whole; it is never written back and nothing acts on it
//! (actions read live), so it is a picture of the truth at `read_at_ms`, not a second copy of it. DLQ entries
//! are kept masked ([`DlqRow`]): a recipient in clear never reaches the console's memory past the read.

use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_common::time::now_ms;
use bw_ops::incident::{IncidentStats, Incidents};
use bw_ops::inspect::{self, masked};
use bw_ops::quarantine::ScopeSummary;
use bw_proto::v1::{Alert, IncidentProgress, ScopeSnapshot};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// One DLQ entry as the pages show it: personal data masked.
#[derive(Debug, Clone)]
pub struct DlqRow {
    pub sequence: u64,
    pub scope: String,
    pub operation_id: String,
    pub incident_id: String,
    pub reason: &'static str,
    pub category: &'static str,
    pub recipient: String,
    pub payload: String,
    pub meta_code: i64,
    pub replays: u32,
    pub dead_lettered_at_ms: i64,
    pub deadline_ms: i64,
}

/// Everything the list pages render.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// When the read finished, Unix ms (0: never read).
    pub read_at_ms: i64,
    /// How long the read took, milliseconds.
    pub read_took_ms: u64,
    /// The last read's error, when it failed (the view is then the previous one's).
    pub error: Option<String>,
    pub scopes: BTreeMap<String, ScopeSnapshot>,
    /// Oldest first, as the streams hold them.
    pub dlq: Vec<DlqRow>,
    pub dlq_undecodable: usize,
    pub incidents: Vec<IncidentProgress>,
    pub incident_stats: Vec<IncidentStats>,
    pub quarantine: Vec<ScopeSummary>,
    pub alerts: Vec<Alert>,
    /// Each sender's limits as the breaker-coordinator's read-only admin API reports them (empty while it is not
    /// reachable: pages then say the limit is unknown).
    pub limits: BTreeMap<String, Limits>,
    /// Aggregates of the above, computed once per read ([`View::indexed`]) so no page walks every entry for them.
    pub index: Index,
}

/// The limits of one sender that the pages compare against (`GET /admin/breakers` of the coordinator).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct Limits {
    pub rate_per_s: f64,
    pub failure_threshold: f64,
    #[serde(default)]
    pub min_calls: u64,
    #[serde(default)]
    pub window_ms: u64,
}

/// How often the limits are asked again (they change only on a coordinator reload).
const LIMITS_EVERY: Duration = Duration::from_secs(30);

/// Every known sender's limits from the coordinator's read-only admin API (no token needed).
pub async fn coordinator_limits(base: &str) -> anyhow::Result<BTreeMap<String, Limits>> {
    #[derive(serde::Deserialize)]
    struct One {
        phone_number_id: String,
        limits: Limits,
    }
    #[derive(serde::Deserialize)]
    struct All {
        scopes: Vec<One>,
    }
    let url = format!("{}/admin/breakers", base.trim_end_matches('/'));
    let all: All = reqwest::Client::new()
        .get(&url)
        .timeout(Duration::from_secs(5))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(all.scopes.into_iter().map(|o| (o.phone_number_id, o.limits)).collect())
}

/// Figures derived from a view's DLQ entries and snapshots.
#[derive(Debug, Clone, Default)]
pub struct Index {
    pub senders: Vec<String>,
    pub depth_by_scope: BTreeMap<String, u64>,
    pub by_reason: Counts,
    pub by_category: Counts,
    pub incident_ids: Vec<String>,
}

/// DLQ depth by one label.
pub type Counts = BTreeMap<&'static str, u64>;

impl View {
    pub fn empty() -> View {
        View::default()
    }

    /// Reads the whole view once.
    pub async fn read(js: &jetstream::Context, buckets: &Buckets) -> anyhow::Result<View> {
        let started = std::time::Instant::now();
        let scopes = bw_ops::ops::scope_snapshots(buckets).await?;
        let (items, bad) = inspect::dlq_items(js, buckets.send, None).await?;
        // The bucket exists once replay ran; without it nothing is held.
        let incidents = match js.get_key_value(bw_wire::names::INCIDENTS_BUCKET).await {
            Ok(_) => Incidents::open(js, 1).await?.list(None).await?,
            Err(_) => Vec::new(),
        };
        let incident_stats = bw_ops::incident::dlq_incident_stats(&items, &incidents);
        let dlq = items.iter().map(row).collect();
        let quarantine = bw_ops::quarantine::scopes(js).await?;
        let alerts = bw_ops::views::firing_alerts(js).await?;
        Ok(View {
            read_at_ms: now_ms(),
            read_took_ms: started.elapsed().as_millis() as u64,
            error: None,
            scopes,
            dlq,
            dlq_undecodable: bad.len(),
            incidents,
            incident_stats,
            quarantine,
            alerts,
            limits: BTreeMap::new(),
            index: Index::default(),
        }
        .indexed())
    }

    /// The view with its [`Index`] computed.
    pub fn indexed(mut self) -> View {
        let mut ix = Index::default();
        let mut incidents = std::collections::BTreeSet::new();
        for r in &self.dlq {
            match ix.depth_by_scope.get_mut(&r.scope) {
                Some(n) => *n += 1,
                None => {
                    ix.depth_by_scope.insert(r.scope.clone(), 1);
                }
            }
            *ix.by_reason.entry(r.reason).or_default() += 1;
            *ix.by_category.entry(r.category).or_default() += 1;
            if !r.incident_id.is_empty() && !incidents.contains(r.incident_id.as_str()) {
                incidents.insert(r.incident_id.clone());
            }
        }
        let mut senders: Vec<String> = self.scopes.keys().cloned().collect();
        senders.extend(ix.depth_by_scope.keys().cloned());
        senders.sort();
        senders.dedup();
        ix.senders = senders;
        ix.incident_ids = incidents.into_iter().collect();
        self.index = ix;
        self
    }

    /// Senders known from snapshots or DLQ entries, sorted.
    pub fn senders(&self) -> &[String] {
        &self.index.senders
    }

    pub fn dlq_depth_by_scope(&self) -> &BTreeMap<String, u64> {
        &self.index.depth_by_scope
    }

    pub fn dlq_by_reason(&self) -> &Counts {
        &self.index.by_reason
    }

    pub fn dlq_by_category(&self) -> &Counts {
        &self.index.by_category
    }
}

/// Masks one DLQ item for the pages.
pub fn row(item: &inspect::DlqItem) -> DlqRow {
    let e = &item.envelope;
    let m = masked(&e.request.clone().unwrap_or_default());
    DlqRow {
        sequence: item.sequence,
        scope: bw_wire::names::phone_of_subject(&item.subject).to_string(),
        operation_id: m.operation_id,
        incident_id: e.incident_id.clone(),
        reason: e.reason().label(),
        category: m.category,
        recipient: m.recipient,
        payload: m.payload,
        meta_code: e.last_error.as_ref().map(|x| x.meta_code).unwrap_or(0),
        replays: e.replay_attempts,
        dead_lettered_at_ms: e.dead_lettered_at_unix_ms,
        deadline_ms: m.deadline_unix_ms,
    }
}

/// Reads the view every `every` (or sooner when asked through `now`) and publishes it when it changed, so
/// live pages get at most one update per refresh. A failed read keeps the previous view with its error.
pub async fn refresh_loop(
    js: jetstream::Context,
    buckets: Buckets,
    coordinator_url: String,
    every: Duration,
    tx: watch::Sender<Arc<View>>,
    now: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut limits = BTreeMap::new();
    let mut limits_at: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
            _ = now.notified() => {}
        }
        if limits_at.is_none_or(|at| at.elapsed() >= LIMITS_EVERY) {
            match coordinator_limits(&coordinator_url).await {
                Ok(l) => {
                    limits = l;
                    limits_at = Some(std::time::Instant::now());
                }
                Err(e) => tracing::debug!(error = %e, "coordinator limits not readable"),
            }
        }
        let next = match View::read(&js, &buckets).await {
            Ok(mut v) => {
                v.limits = limits.clone();
                v
            }
            Err(e) => {
                tracing::warn!(error = %e, "console view read failed");
                let mut v = (**tx.borrow()).clone();
                v.error = Some(e.to_string());
                v
            }
        };
        tx.send_replace(Arc::new(next));
    }
}
