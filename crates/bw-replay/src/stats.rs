//! Periodic DLQ statistics for the metrics: depth and oldest age per scope (two cheap stream requests per
//! non-empty scope, never a scan).

use crate::Ctx;
use bw_common::names;
use bw_common::proto::DlqEnvelope;
use bw_common::time::now_ms;
use bw_ops::names::phone_of_subject;
use bw_ops::scan::{first_message, subject_counts};
use prost::Message;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

pub(crate) async fn refresh(ctx: Arc<Ctx>) {
    let every = Duration::from_millis(ctx.cfg.replay.stats_interval_ms.max(100));
    let mut known: BTreeSet<String> = BTreeSet::new();
    loop {
        match subject_counts(&ctx.js, names::DLQ_STREAM, "bw.dlq.v1.>").await {
            Ok(counts) => {
                let mut seen = BTreeSet::new();
                for (subject, depth) in counts {
                    let scope = phone_of_subject(&subject).to_string();
                    let oldest = match first_message(&ctx.js, names::DLQ_STREAM, &subject).await {
                        Ok(Some(m)) => {
                            DlqEnvelope::decode(m.payload.as_ref()).map(|e| e.dead_lettered_at_unix_ms).unwrap_or(0)
                        }
                        _ => 0,
                    };
                    let age_s = if oldest > 0 { (now_ms() - oldest).max(0) / 1000 } else { 0 };
                    ctx.metrics.set_depth(&scope, depth, age_s);
                    seen.insert(scope);
                }
                for gone in known.difference(&seen) {
                    ctx.metrics.set_depth(gone, 0, 0);
                }
                known = seen;
            }
            Err(e) => tracing::debug!(error = %e, "dlq stats unavailable"),
        }
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
