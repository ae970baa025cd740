//! Replay's side of breaker incidents (`bw_ops::incident`): holding an incident's entries of the categories in
//! `replay.hold_categories` for manual release, counting what a drain did to each incident's entries, and the
//! finish check after a drain of a CLOSED scope (the "replayed" event with its report, published once however
//! many instances run, and again after a restart only if it never went out).

use crate::ctx::Ctx;
use bw_ops::incident::{Counted, Counts};
use bw_proto::v1::DlqEnvelope;
use std::collections::HashMap;

/// Per drain session: incident hold answers already read, and counts not yet written.
#[derive(Default)]
pub(crate) struct Session {
    holds: HashMap<(String, &'static str), bool>,
    counts: HashMap<String, Counts>,
    /// Entries moved out of the DLQ in this session.
    pub(crate) moved: u64,
}

impl Session {
    /// Whether replay must leave this entry in the DLQ: it belongs to an incident, its category is held, and no
    /// operator released the incident. Fails open to "held" when the incident record cannot be read (nothing is
    /// lost by waiting; a replay the operator wanted held cannot be undone).
    pub(crate) async fn held(&mut self, ctx: &Ctx, scope: &str, env: &DlqEnvelope) -> bool {
        if env.incident_id.is_empty() || ctx.cfg.replay.hold_categories.is_empty() {
            return false;
        }
        let category = env.request.as_ref().map(|r| r.category().label()).unwrap_or("unspecified");
        if !ctx.cfg.replay.hold_categories.iter().any(|c| c == category) {
            return false;
        }
        let key = (env.incident_id.clone(), category);
        if let Some(held) = self.holds.get(&key) {
            return *held;
        }
        let held = match ctx.incidents.hold(scope, &env.incident_id, category).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, "incident record unavailable; entry stays held");
                return true;
            }
        };
        if held {
            tracing::info!(incident = %env.incident_id, category, "incident held for manual release");
        }
        self.holds.insert(key, held);
        held
    }

    /// Notes what one entry ended in.
    pub(crate) fn note(&mut self, incident: &str, counted: Option<Counted>) {
        let Some(c) = counted else { return };
        self.moved += 1;
        if !incident.is_empty() {
            self.counts.entry(incident.to_string()).or_default().add(c);
        }
    }

    /// Writes the counts gathered so far into the incidents' records (one compare-and-set per incident).
    pub(crate) async fn flush(&mut self, ctx: &Ctx, scope: &str) {
        for (incident, counts) in std::mem::take(&mut self.counts) {
            if let Err(e) = ctx.incidents.count(scope, &incident, &counts).await {
                tracing::warn!(incident = %incident, error = %e, "incident progress not recorded");
            }
        }
    }
}

/// After a drain of a CLOSED scope: finishes its incidents that have no entry left (see
/// `bw_ops::incident::Incidents::finish_drained`).
pub(crate) async fn finish(ctx: &Ctx, scope: &str) {
    match ctx.incidents.finish_drained(&ctx.js, ctx.mover.send_partitions(), scope).await {
        Ok(events) => {
            for e in events {
                ctx.metrics.incidents_finished.inc();
                tracing::debug!(incident = %e.incident_id, messages = e.messages, "incident replayed event published");
            }
        }
        Err(e) => tracing::warn!(error = %e, "incident finish check failed; next drain tries again"),
    }
}
