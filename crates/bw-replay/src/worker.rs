//! One task per scope: waits for the breaker to be CLOSED and soaked, takes the scope's lease, and drains the
//! scope's DLQ into the replay lanes.
//!
//! Priority follows the message: a session drains the scope's priority entries (`bw.dlq.v1.p.<phone>`, consumer
//! `replay-p-<phone>`) before its marketing ones (`bw.dlq.v1.m.<phone>`, `replay-m-<phone>`). Priority entries
//! go to the `rh` lane after `priority_soak_ms` (default 0: as soon as the breaker closes), at up to
//! `priority_rate_per_s` — the dispatcher admits them as priority traffic and its send slots pace them at the
//! sender's rate, so this rate and the lane depth bound only keep replay from running far ahead. Marketing
//! entries go to the `rp` lane after the full `soak_ms`, paced to spare rate as before. Within a class the DLQ
//! is FIFO: the older entry goes first. A marketing session stops and the drain starts again from the priority
//! class whenever new priority entries reach the DLQ, and whenever the rp lane is full while any priority entry
//! waits: the dispatcher holds marketing back while a priority entry is in the DLQ, so a full rp lane would
//! otherwise never drain and the session never end (`priority_waiting`).

use crate::ctx::{Ctx, ScopeView};
use async_nats::jetstream::{Message, consumer::pull};
use bw_common::disposition::{Label, Settle};
use bw_common::telemetry;
use bw_common::time::now_ms;
use bw_ops::moves::{Outcome, Target};
use bw_ops::pace::Gate;
use bw_ops::scan::subject_depth;
use bw_proto::v1::{BreakerState, DlqEnvelope, DlqReason};
use bw_wire::names;
use bw_wire::names::{replay_class_consumer, replay_consumer};
use futures::StreamExt;
use prost::Message as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

/// What a worker should do right now.
#[derive(Debug, Clone, PartialEq)]
enum Mode {
    /// Nothing; look again after this long (or when the scope changes).
    Wait(Option<Duration>),
    /// Replay the scope's DLQ through its own sender.
    Native,
    /// HALF_OPEN: replay a trickle of entries through its own sender as the canaries that can close it.
    Probe,
    /// Replay eligible entries through a secondary sender.
    Failover(Target),
}

/// What one fetched DLQ entry ended in (metric `bw_replay_skipped_total{reason}` for everything but
/// `replayed`, which counts in `bw_replay_replayed_total{scope}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryResult {
    Replayed,
    AlreadySent,
    AlreadyFinal,
    Expired,
    Poison,
    WindowClosed,
    Quarantined,
    NotBefore,
    Changed,
    Skipped,
    Purged,
    /// The pacing gate closed before the move, or the drain session ended (scope changed, shutdown, lease
    /// lost): nothing changed, redelivered at once for whoever drains next.
    Stopped,
    FailoverCategory,
    /// Its incident is held for manual release (`replay.hold_categories`): left untouched in the DLQ.
    Held,
    Undecodable,
    Error,
}

impl Label for EntryResult {
    fn label(self) -> &'static str {
        match self {
            EntryResult::Replayed => "replayed",
            EntryResult::AlreadySent => "already_sent",
            EntryResult::AlreadyFinal => "already_final",
            EntryResult::Expired => "expired",
            EntryResult::Poison => "poison",
            EntryResult::WindowClosed => "window_closed",
            EntryResult::Quarantined => "quarantined",
            EntryResult::NotBefore => "not_before",
            EntryResult::Changed => "changed",
            EntryResult::Skipped => "skipped",
            EntryResult::Purged => "purged",
            EntryResult::Stopped => "stopped",
            EntryResult::FailoverCategory => "failover_category",
            EntryResult::Held => "held",
            EntryResult::Undecodable => "undecodable",
            EntryResult::Error => "error",
        }
    }
}

/// What the broker is told about a DLQ entry after a move: the source goes once the move has put the
/// operation somewhere else (or found it already elsewhere); otherwise it comes back after the move's wait.
fn settle_for(outcome: &Outcome) -> Settle<EntryResult> {
    use bw_proto::v1::QuarantineReason;
    let result = match outcome {
        Outcome::Replayed { .. } => EntryResult::Replayed,
        Outcome::AlreadyAccepted => EntryResult::AlreadySent,
        Outcome::AlreadyFinal => EntryResult::AlreadyFinal,
        Outcome::Expired => EntryResult::Expired,
        Outcome::Quarantined(QuarantineReason::Poison) => EntryResult::Poison,
        Outcome::Quarantined(QuarantineReason::WindowClosed) => EntryResult::WindowClosed,
        Outcome::Quarantined(_) => EntryResult::Quarantined,
        Outcome::NotYet(_) => EntryResult::NotBefore,
        Outcome::Changed => EntryResult::Changed,
        Outcome::Skipped(_) => EntryResult::Skipped,
        Outcome::Purged => EntryResult::Purged,
        Outcome::Stopped => EntryResult::Stopped,
    };
    match outcome {
        o if o.source_done() => Settle::ack(result),
        Outcome::NotYet(wait) => Settle::nak(result, *wait),
        Outcome::Stopped => Settle::nak(result, Duration::ZERO),
        _ => Settle::nak(result, Duration::from_secs(1)),
    }
}

/// Applies the decision for one DLQ entry: the acknowledgement, the span field and the metric.
async fn settle(ctx: &Ctx, scope: &str, msg: &Message, settle: Settle<EntryResult>) {
    bw_common::disposition::apply(msg, settle, &tracing::Span::current(), |label| {
        if label == EntryResult::Replayed.label() {
            ctx.metrics.replayed(scope);
        } else {
            ctx.metrics.skipped(label);
        }
    })
    .await;
}

/// How a drain session ended.
enum Ended {
    Drained,
    Interrupted,
    LeaseLost,
    Failed,
    /// The priority entries are drained; the marketing ones wait until the full soak is over (this long).
    Soaking(Duration),
    /// A marketing session stopped because priority entries are waiting in the scope's DLQ: drain again, priority
    /// class first.
    PriorityWaiting,
}

/// One class of a scope's DLQ and the lane its entries go back through, in draining order.
#[derive(Debug, Clone, Copy)]
struct Class {
    token: &'static str,
    lane: names::Lane,
}

const CLASSES: [Class; 2] = [
    Class { token: names::DLQ_PRIORITY_CLASS, lane: names::Lane::PriorityReplay },
    Class { token: names::DLQ_MARKETING_CLASS, lane: names::Lane::Replay },
];

fn mode(ctx: &Ctx, scope: &str, view: &ScopeView, not_closed_since: Option<i64>) -> Mode {
    let now = now_ms();
    // Native replay starts once the priority soak is over; marketing entries wait for the full soak (drain).
    match view.replayable(now, ctx.cfg.replay.priority_soak()) {
        Ok(()) => Mode::Native,
        Err(_) if ctx.cfg.replay.probe_rate_per_s > 0.0 && view.probing(now) => Mode::Probe,
        Err(wait) => {
            let f = &ctx.cfg.failover;
            let open = matches!(view.state, BreakerState::Open | BreakerState::HalfOpen | BreakerState::ForcedOpen);
            if f.enabled
                && open
                && let (Some(since), Some(secondary)) = (not_closed_since, f.secondaries.get(scope))
            {
                let due = since + f.open_for_ms as i64;
                if due > now {
                    return Mode::Wait(Some(Duration::from_millis((due - now) as u64)));
                }
                let ready =
                    ctx.view(&secondary.phone_number_id).map(|v| v.replayable(now, ctx.cfg.replay.priority_soak()));
                if ready == Some(Ok(())) {
                    return Mode::Failover(Target {
                        waba_id: secondary.waba_id.clone(),
                        phone_number_id: secondary.phone_number_id.clone(),
                    });
                }
                return Mode::Wait(Some(Duration::from_millis(ctx.cfg.replay.idle_ms)));
            }
            Mode::Wait(wait)
        }
    }
}

/// How long replay waits after a pause of a scope was lifted: twice the dispatchers' `parent_refresh_ms` (1 s
/// by default), the longest they may still hold a lifted pause above the number.
const PAUSE_SETTLE: Duration = Duration::from_secs(2);

pub(crate) async fn scope_worker(ctx: Arc<Ctx>, scope: String, mut rx: watch::Receiver<ScopeView>) {
    let idle = Duration::from_millis(ctx.cfg.replay.idle_ms.max(10));
    let mut not_closed_since: Option<i64> = None;
    let mut depths = ctx.depths.subscribe();
    // An instance that died between an incident's last entry and its finish check left it unfinished: look
    // once when this worker first finds the scope replayable with nothing to drain.
    let mut finish_check_due = true;
    // Whether the last view showed a pause of the scope, and when one was last seen lifted.
    let (mut was_paused, mut lifted_at): (bool, Option<tokio::time::Instant>) = (false, None);
    loop {
        if ctx.shutdown.is_cancelled() {
            return;
        }
        let view = rx.borrow_and_update().clone();
        if matches!(view.state, BreakerState::Closed | BreakerState::ForcedClosed) {
            not_closed_since = None;
        } else if not_closed_since.is_none() {
            not_closed_since = Some(if view.since_unix_ms > 0 { view.since_unix_ms } else { now_ms() });
        }
        let has_work = depths.borrow_and_update().get(&scope).copied().unwrap_or(0) > 0;
        let paused = view.paused_for(now_ms(), false).is_some();
        if was_paused && !paused {
            lifted_at = Some(tokio::time::Instant::now());
        }
        was_paused = paused;
        // A pause was just lifted: the dispatchers may still hold one above the number for parent_refresh_ms (they
        // read it at most that often), and an entry replayed into that would go back to the DLQ for the hold's
        // retry-after. Wait that out first.
        let settling = lifted_at.map(|at| PAUSE_SETTLE.saturating_sub(at.elapsed())).filter(|d| !d.is_zero());
        let wait = match mode(&ctx, &scope, &view, not_closed_since) {
            Mode::Wait(wait) => wait,
            _ if settling.is_some() => settling,
            // Nothing to replay: wait for the next depth poll (or a scope change) without touching the lease.
            Mode::Native if !has_work && finish_check_due => {
                finish_check_due = false;
                crate::incident::finish(&ctx, &scope).await;
                None
            }
            _ if !has_work => None,
            active => match ctx.leases.acquire(&scope).await {
                Ok(Some(held)) => {
                    ctx.metrics.draining_scopes.inc();
                    let native = active == Mode::Native;
                    let (ended, held, moved) = drain(&ctx, &scope, &mut rx, active, held, not_closed_since).await;
                    ctx.metrics.draining_scopes.dec();
                    // Only a CLOSED scope's incident can be over (while HALF_OPEN or failing over it may grow).
                    if native && matches!(ended, Ended::Drained) && (moved > 0 || finish_check_due) {
                        finish_check_due = false;
                        crate::incident::finish(&ctx, &scope).await;
                    }
                    if let Some(held) = held {
                        ctx.leases.release(&scope, held).await;
                    }
                    match ended {
                        Ended::Drained | Ended::Failed | Ended::LeaseLost => Some(idle),
                        // Look again for new priority entries at least every idle interval meanwhile.
                        Ended::Soaking(left) => Some(left.min(idle)),
                        Ended::Interrupted | Ended::PriorityWaiting => continue,
                    }
                }
                Ok(None) => Some(Duration::from_millis(ctx.cfg.replay.lease_ttl_ms / 2)),
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), "scope lease unavailable");
                    Some(idle)
                }
            },
        };
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            changed = rx.changed() => if changed.is_err() { return },
            changed = depths.changed(), if !has_work => if changed.is_err() { return },
            _ = sleep_opt(wait) => {}
        }
    }
}

async fn sleep_opt(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

async fn consumer(
    ctx: &Ctx,
    scope: &str,
    class: Class,
) -> anyhow::Result<async_nats::jetstream::consumer::PullConsumer> {
    let send = ctx.mover.send_partitions();
    let stream = ctx.js.get_stream(send.dlq_stream_of(scope)).await?;
    let name = replay_class_consumer(class.token, scope);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some(format!("replay of the class {} dlq entries of scope {scope}", class.token)),
        filter_subject: send.dlq_class_filter(class.token, scope),
        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_millis(ctx.cfg.replay.ack_wait_ms),
        max_ack_pending: 4096,
        inactive_threshold: Duration::from_secs(24 * 3600),
        ..Default::default()
    };
    match stream.get_or_create_consumer(&name, config.clone()).await {
        Ok(c) => Ok(c),
        Err(first) => {
            // The one consumer per scope of earlier versions overlaps the per-class ones, which a work-queue
            // stream refuses: retire it (its unacked entries go back to the stream) and try again.
            if stream.delete_consumer(&replay_consumer(scope)).await.is_err() {
                return Err(first.into());
            }
            tracing::info!("retired the dlq consumer of the scope from before the per-class consumers");
            Ok(stream.get_or_create_consumer(&name, config).await?)
        }
    }
}

/// Drains the scope until it is empty, its mode changes, the lease is lost or shutdown. Returns the lease
/// still held (if any) so the caller can release it, and how many entries left the DLQ.
async fn drain(
    ctx: &Arc<Ctx>,
    scope: &str,
    rx: &mut watch::Receiver<ScopeView>,
    active: Mode,
    mut held: crate::lease::Held,
    not_closed_since: Option<i64>,
) -> (Ended, Option<crate::lease::Held>, u64) {
    let mut moved = 0;
    for class in CLASSES {
        if active == Mode::Native && class.lane == names::Lane::Replay {
            let view = rx.borrow().clone();
            let marketing_paused = view.paused_for(now_ms(), true).map(Err).unwrap_or(Ok(()));
            if let Err(wait) = view.replayable(now_ms(), ctx.cfg.replay.soak_ms).and(marketing_paused) {
                let left = wait.unwrap_or(Duration::from_millis(ctx.cfg.replay.idle_ms));
                return (Ended::Soaking(left), Some(held), moved);
            }
        }
        let (ended, still, n) = drain_class(ctx, scope, rx, &active, held, not_closed_since, class).await;
        moved += n;
        match (ended, still) {
            (Ended::Drained, Some(h)) => held = h,
            (ended, still) => return (ended, still, moved),
        }
    }
    (Ended::Drained, Some(held), moved)
}

/// Drains one class of the scope's DLQ until it is empty, the mode changes, the lease is lost or shutdown;
/// returns how many entries left the DLQ.
async fn drain_class(
    ctx: &Arc<Ctx>,
    scope: &str,
    rx: &mut watch::Receiver<ScopeView>,
    active: &Mode,
    mut held: crate::lease::Held,
    not_closed_since: Option<i64>,
    class: Class,
) -> (Ended, Option<crate::lease::Held>, u64) {
    let active = active.clone();
    // A marketing session yields to priority entries that reach the DLQ meanwhile (see `priority_waiting`).
    let priority = if class.lane == names::Lane::Replay {
        match consumer(ctx, scope, CLASSES[0]).await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = format!("{e:#}"), "cannot bind the priority dlq consumer");
                return (Ended::Failed, Some(held), 0);
            }
        }
    } else {
        None
    };
    let consumer = match consumer(ctx, scope, class).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = format!("{e:#}"), class = class.token, "cannot bind the dlq consumer");
            return (Ended::Failed, Some(held), 0);
        }
    };
    let mut session = crate::incident::Session::default();
    let target = match &active {
        Mode::Failover(t) => Some(t.clone()),
        _ => None,
    };
    let lane_phone = target.as_ref().map(|t| t.phone_number_id.clone()).unwrap_or_else(|| scope.to_string());
    let send = ctx.mover.send_partitions();
    let (lane_stream, lane_subject) = (send.stream_of(&lane_phone), send.outbox_subject(class.lane, &lane_phone));
    let pacing = match (&active, class.lane) {
        (Mode::Probe, _) => ctx.cfg.replay.probe_pacing(),
        (_, names::Lane::PriorityReplay) => ctx.cfg.replay.priority_pacing(&lane_phone),
        _ => ctx.cfg.replay.pacing(&lane_phone),
    };
    // Priority replays are paced by the dispatcher's admission (the ramp included), not by spare rate here.
    let ramped = class.lane == names::Lane::Replay;
    let factor = if ramped { ctx.view(&lane_phone).map(|v| v.rate_factor()).unwrap_or(1.0) } else { 1.0 };
    // One gate per session: it starts empty (no burst when a breaker closes) and closes when the session
    // ends, so entries still waiting for a token give up without touching the ledger.
    let gate = Arc::new(Gate::new(pacing.rate_per_s * factor, pacing.burst));
    // Entries fetched at once must be handled well within the ack wait and the lease renewal period.
    let horizon_ms = (ctx.cfg.replay.ack_wait_ms / 2).min(ctx.cfg.replay.lease_ttl_ms / 3) as f64;
    let rate_cap = ((pacing.rate_per_s * horizon_ms / 1000.0) as usize).max(1);
    let in_flight = Arc::new(Semaphore::new(ctx.cfg.replay.max_in_flight));
    let categories: Vec<String> = ctx.cfg.failover.categories.clone();
    tracing::info!(lane = %lane_subject, rate_per_s = pacing.rate_per_s * factor, failover = target.is_some(), "draining dlq");
    let ended = 'session: loop {
        if ctx.shutdown.is_cancelled() {
            break 'session Ended::Interrupted;
        }
        if rx.has_changed().unwrap_or(true) {
            let view = rx.borrow_and_update().clone();
            if stops(ctx, scope, &view, &active, class, not_closed_since) {
                break 'session Ended::Interrupted;
            }
            let factor = if ramped { ctx.view(&lane_phone).map(|v| v.rate_factor()).unwrap_or(1.0) } else { 1.0 };
            gate.set_rate(pacing.rate_per_s * factor).await;
        }
        if held.due() {
            match ctx.leases.renew(scope, held).await {
                Some(h) => held = h,
                None => break 'session Ended::LeaseLost,
            }
        }
        let mut room = ctx.cfg.replay.batch_size.min(rate_cap);
        if pacing.max_lane_depth > 0 {
            let depth = match subject_depth(&ctx.js, &lane_stream, &lane_subject).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the replay lane depth");
                    break 'session Ended::Failed;
                }
            };
            let free = pacing.max_lane_depth.saturating_sub(depth) as usize;
            if let Some(p) = &priority
                && priority_waiting(p, free == 0).await
            {
                break 'session Ended::PriorityWaiting;
            }
            if free == 0 {
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => break 'session Ended::Interrupted,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
            room = room.min(free);
        } else if let Some(p) = &priority
            && priority_waiting(p, false).await
        {
            break 'session Ended::PriorityWaiting;
        }
        let fetched = consumer
            .fetch()
            .max_messages(room)
            .expires(Duration::from_millis(ctx.cfg.replay.fetch_wait_ms.max(50)))
            .messages()
            .await;
        let mut batch = match fetched {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "dlq fetch failed");
                break 'session Ended::Failed;
            }
        };
        let mut tasks = JoinSet::new();
        let mut got = 0usize;
        let mut stop: Option<Ended> = None;
        while let Some(next) = batch.next().await {
            let Ok(msg) = next else { continue };
            got += 1;
            if stop.is_none() && ctx.shutdown.is_cancelled() {
                stop = Some(Ended::Interrupted);
            }
            if stop.is_none() && rx.has_changed().unwrap_or(true) {
                let view = rx.borrow_and_update().clone();
                if stops(ctx, scope, &view, &active, class, not_closed_since) {
                    stop = Some(Ended::Interrupted);
                }
            }
            if stop.is_some() {
                gate.close();
                settle(ctx, scope, &msg, Settle::nak(EntryResult::Stopped, Duration::ZERO)).await;
                continue;
            }
            let envelope = DlqEnvelope::decode(msg.payload.as_ref()).ok().filter(|e| e.request.is_some());
            if let Some(env) = &envelope {
                // Cheap checks first: they need no ledger read and no token.
                if let Some(wait) = not_before_wait(env, now_ms(), ctx.cfg.replay.hold_recheck_ms) {
                    settle(ctx, scope, &msg, Settle::nak(EntryResult::NotBefore, wait)).await;
                    continue;
                }
                if target.is_some() && !eligible_for_failover(env, &categories) {
                    let later = Settle::nak(EntryResult::FailoverCategory, Duration::from_secs(30));
                    settle(ctx, scope, &msg, later).await;
                    continue;
                }
                if session.held(ctx, scope, env).await {
                    let later = Settle::nak(EntryResult::Held, Duration::from_millis(ctx.cfg.replay.hold_recheck_ms));
                    settle(ctx, scope, &msg, later).await;
                    continue;
                }
            }
            if held.due() {
                match ctx.leases.renew(scope, held).await {
                    Some(h) => held = h,
                    None => {
                        stop = Some(Ended::LeaseLost);
                        gate.close();
                        settle(ctx, scope, &msg, Settle::nak(EntryResult::Stopped, Duration::ZERO)).await;
                        continue;
                    }
                }
            }
            let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
            let task_ctx = ctx.clone();
            let task_scope = scope.to_string();
            let task_target = target.clone();
            let task_gate = gate.clone();
            let span = tracing::info_span!("replay.entry", scope = %scope);
            telemetry::set_parent_from(&span, msg.headers.as_ref());
            tasks.spawn(
                async move {
                    let counted = handle(&task_ctx, &task_scope, msg, envelope, task_target.as_ref(), &task_gate).await;
                    drop(permit);
                    counted
                }
                .instrument(span),
            );
        }
        // Wait for the batch, closing the gate at once if the scope stops being replayable meanwhile.
        loop {
            tokio::select! {
                joined = tasks.join_next() => match joined {
                    None => break,
                    Some(Ok((incident, counted))) => session.note(&incident, counted),
                    Some(Err(_)) => {}
                },
                _ = ctx.shutdown.cancelled(), if gate.is_open() => {
                    gate.close();
                    stop.get_or_insert(Ended::Interrupted);
                }
                changed = rx.changed(), if gate.is_open() => {
                    let differs = changed.is_err()
                        || stops(ctx, scope, &rx.borrow_and_update().clone(), &active, class, not_closed_since);
                    if differs {
                        gate.close();
                        stop.get_or_insert(Ended::Interrupted);
                    }
                }
            }
        }
        session.flush(ctx, scope).await;
        match stop {
            Some(ended) => break 'session ended,
            None if got == 0 => break 'session Ended::Drained,
            None => {}
        }
    };
    gate.close();
    session.flush(ctx, scope).await;
    match ended {
        Ended::LeaseLost => (ended, None, session.moved),
        other => (other, Some(held), session.moved),
    }
}

/// Whether a drain session must stop for this view of its scope: its mode changed (a breaker, a pause of every
/// entry), or a marketing-only pause now holds the marketing entries it drains.
fn stops(ctx: &Ctx, scope: &str, view: &ScopeView, active: &Mode, class: Class, not_closed_since: Option<i64>) -> bool {
    mode(ctx, scope, view, not_closed_since) != *active
        || (class.lane == names::Lane::Replay && view.paused_for(now_ms(), true).is_some())
}

/// How long an entry must still wait before replay may take it, if at all.
///
/// A not-before time is Meta's own wait (Retry-After, 131049's cool-off) and is always honoured, except for an
/// entry held by a sender pause or a halted token: its not-before is only a recheck hint (`token_halt_retry_ms`,
/// 10 minutes by default), and this drain session runs only while no pause covers the scope. Such an entry goes
/// as soon as it has been in the DLQ for `recheck_ms`, the time the scope view needs to show a pause that was
/// set when it was dead-lettered; a session working from an older view naks it for at most `recheck_ms`
/// instead of replaying it into the pause (a bounce that would count towards POISON).
fn not_before_wait(env: &DlqEnvelope, now: i64, recheck_ms: u64) -> Option<Duration> {
    if env.not_before_unix_ms <= now {
        return None;
    }
    let left = (env.not_before_unix_ms - now).max(1) as u64;
    if !matches!(env.reason(), DlqReason::SenderPaused | DlqReason::Credentials) {
        return Some(Duration::from_millis(left));
    }
    let seen_for = now.saturating_sub(env.dead_lettered_at_unix_ms).max(0) as u64;
    if seen_for >= recheck_ms {
        return None;
    }
    Some(Duration::from_millis(left.min(recheck_ms - seen_for).max(1)))
}

/// Whether a marketing session should stop and let the scope's priority entries go first: new priority entries
/// arrived in the DLQ (never delivered to the priority consumer), or, when the marketing replay lane is full,
/// any priority entry at all (one waiting for its not-before time included).
///
/// Why the second case matters: the dispatcher holds a sender's marketing back while it has priority entries
/// in the DLQ (`bw_dispatcher::priority`), so a full marketing lane does not drain while one waits there; a
/// session that only waited for room in the lane would wait for ever, and the priority entry with it. While the
/// lane has room, priority entries that only wait for their not-before time do not stop the marketing session
/// (it would stop again at once after every look at them). A reading that fails stops nothing.
async fn priority_waiting(priority: &async_nats::jetstream::consumer::PullConsumer, lane_full: bool) -> bool {
    match priority.get_info().await {
        Ok(info) => info.num_pending > 0 || (lane_full && info.num_ack_pending > 0),
        Err(e) => {
            tracing::debug!(error = %e, "priority dlq consumer unreadable");
            false
        }
    }
}

fn eligible_for_failover(env: &DlqEnvelope, categories: &[String]) -> bool {
    let category = env.request.as_ref().map(|r| r.category().label()).unwrap_or("unspecified");
    categories.iter().any(|c| c == category)
}

async fn handle(
    ctx: &Ctx,
    scope: &str,
    msg: Message,
    envelope: Option<DlqEnvelope>,
    target: Option<&Target>,
    gate: &Gate,
) -> (String, Option<bw_ops::incident::Counted>) {
    let Some(envelope) = envelope else {
        let sequence = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        tracing::error!(sequence, "undecodable dlq entry; keeping its bytes in the quarantine");
        let stream = ctx.mover.send_partitions().dlq_stream_of(scope);
        match ctx.mover.quarantine_undecodable(scope, &stream, sequence, msg.payload.clone()).await {
            Ok(()) => settle(ctx, scope, &msg, Settle::ack(EntryResult::Undecodable)).await,
            Err(e) => {
                tracing::warn!(error = %e, "cannot quarantine an undecodable dlq entry");
                settle(ctx, scope, &msg, Settle::nak(EntryResult::Error, Duration::from_secs(5))).await;
            }
        }
        return (String::new(), None);
    };
    let op = envelope.request.as_ref().map(|r| r.operation_id.clone()).unwrap_or_default();
    match ctx.mover.replay_dlq_entry(&envelope, target, Some(gate)).await {
        Ok(outcome) => {
            match &outcome {
                Outcome::Replayed { replay, duplicate } => {
                    tracing::debug!(operation_id = %op, replay, duplicate, "replayed");
                }
                Outcome::Quarantined(reason) => {
                    if *reason == bw_proto::v1::QuarantineReason::Poison {
                        ctx.metrics.poison.inc();
                    }
                    tracing::info!(operation_id = %op, reason = ?reason, "quarantined instead of replayed");
                }
                _ => {}
            }
            settle(ctx, scope, &msg, settle_for(&outcome)).await;
            (envelope.incident_id, bw_ops::incident::Counted::of(&outcome))
        }
        Err(e) => {
            tracing::warn!(operation_id = %op, error = %e, "replay failed; will retry");
            settle(ctx, scope, &msg, Settle::nak(EntryResult::Error, Duration::from_secs(2))).await;
            (String::new(), None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_common::disposition::Disposition;
    use bw_proto::v1::QuarantineReason;

    #[test]
    fn each_move_outcome_settles_its_dlq_entry() {
        let rows = [
            (Outcome::Replayed { replay: 1, duplicate: false }, Disposition::Ack, "replayed"),
            (Outcome::AlreadyAccepted, Disposition::Ack, "already_sent"),
            (Outcome::AlreadyFinal, Disposition::Ack, "already_final"),
            (Outcome::Expired, Disposition::Ack, "expired"),
            (Outcome::Quarantined(QuarantineReason::Poison), Disposition::Ack, "poison"),
            (Outcome::Quarantined(QuarantineReason::WindowClosed), Disposition::Ack, "window_closed"),
            (Outcome::Purged, Disposition::Ack, "purged"),
            (Outcome::NotYet(Duration::from_secs(7)), Disposition::Nak(Duration::from_secs(7)), "not_before"),
            (Outcome::Changed, Disposition::Nak(Duration::from_secs(1)), "changed"),
            (Outcome::Skipped("x".into()), Disposition::Nak(Duration::from_secs(1)), "skipped"),
            (Outcome::Stopped, Disposition::Nak(Duration::ZERO), "stopped"),
        ];
        for (outcome, disposition, label) in rows {
            let settle = settle_for(&outcome);
            assert_eq!((settle.disposition, settle.result.label()), (disposition, label), "{outcome:?}");
        }
    }

    fn entry(reason: DlqReason, dead_lettered: i64, not_before: i64) -> DlqEnvelope {
        DlqEnvelope {
            reason: reason as i32,
            dead_lettered_at_unix_ms: dead_lettered,
            not_before_unix_ms: not_before,
            ..Default::default()
        }
    }

    #[test]
    fn a_pauses_recheck_hint_ends_with_the_pause_but_metas_own_wait_is_kept() {
        let (now, recheck) = (1_000_000i64, 30_000u64);
        let ms = Duration::from_millis;
        let rows = [
            // Meta's own waits: always the whole of it.
            (entry(DlqReason::RateLimited, now - 60_000, now + 5_000), Some(ms(5_000))),
            (entry(DlqReason::RecipientDeferred, now - 60_000, now + 86_000_000), Some(ms(86_000_000))),
            // Nothing to wait for.
            (entry(DlqReason::SenderPaused, now - 1_000, now), None),
            (entry(DlqReason::BreakerOpen, now - 1_000, 0), None),
            // A pause's hint: this session runs only without a covering pause, so it goes once the scope view
            // has had recheck_ms to show a pause set at dead-lettering, and waits at most that long before.
            (entry(DlqReason::SenderPaused, now - 30_000, now + 570_000), None),
            (entry(DlqReason::Credentials, now - 400_000, now + 200_000), None),
            (entry(DlqReason::SenderPaused, now - 1_000, now + 599_000), Some(ms(29_000))),
            (entry(DlqReason::Credentials, now - 29_999, now + 570_001), Some(ms(1))),
            (entry(DlqReason::SenderPaused, now - 1_000, now + 2_000), Some(ms(2_000))),
        ];
        for (env, want) in rows {
            assert_eq!(not_before_wait(&env, now, recheck), want, "{:?}", env.reason());
        }
    }
}
