//! DLQ depth polling: one stream-info request per `idle_ms` for the whole fleet tells every worker whether its
//! scope has anything to replay (so idle scopes cost nothing), and every `stats_interval_ms` the depth and
//! oldest-age metrics are refreshed (one extra request per non-empty scope, never a scan).

use crate::ctx::Ctx;
use bw_common::time::now_ms;
use bw_ops::scan::first_message;
use bw_proto::v1::DlqEnvelope;
use bw_wire::names::phone_of_subject;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

pub(crate) async fn poll(ctx: Arc<Ctx>) {
    let every = Duration::from_millis(ctx.cfg.replay.idle_ms.max(10));
    let stats_every = Duration::from_millis(ctx.cfg.replay.stats_interval_ms.max(100));
    let mut next_stats = Instant::now();
    let mut known: BTreeSet<String> = BTreeSet::new();
    loop {
        match bw_ops::scan::dlq_subject_counts(&ctx.js, ctx.mover.send_partitions()).await {
            Ok(counts) => {
                // One subject per class and sender: a sender's depth is the sum of its classes.
                let mut depths: BTreeMap<String, u64> = BTreeMap::new();
                for (subject, n) in counts {
                    *depths.entry(phone_of_subject(&subject).to_string()).or_default() += n;
                }
                if Instant::now() >= next_stats {
                    next_stats = Instant::now() + stats_every;
                    refresh_metrics(&ctx, &depths, &mut known).await;
                }
                ctx.depths.send_replace(Arc::new(depths));
            }
            Err(e) => tracing::debug!(error = %e, "dlq depths unavailable"),
        }
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

async fn refresh_metrics(ctx: &Ctx, depths: &BTreeMap<String, u64>, known: &mut BTreeSet<String>) {
    let mut seen = BTreeSet::new();
    for (scope, depth) in depths {
        let send = ctx.mover.send_partitions();
        let oldest = match first_message(&ctx.js, &send.dlq_stream_of(scope), &send.dlq_scope_filter(scope)).await {
            Ok(Some(m)) => DlqEnvelope::decode(m.payload.as_ref()).map(|e| e.dead_lettered_at_unix_ms).unwrap_or(0),
            _ => 0,
        };
        let age_s = if oldest > 0 { (now_ms() - oldest).max(0) / 1000 } else { 0 };
        ctx.metrics.set_depth(scope, *depth, age_s);
        seen.insert(scope.clone());
    }
    for gone in known.difference(&seen) {
        ctx.metrics.set_depth(gone, 0, 0);
    }
    *known = seen;
}
