//! The coordinator's loops: the leader lease, the breaker events, Meta's account signals, discovery of scopes
//! (the Redis index, the DLQ) and the tick loop.

use crate::coordinator::Coordinator;
use crate::leader;
use bw_breaker::Scope;
use bw_proto::v1::{BreakerState, BreakerTransition};
use futures::StreamExt;
use prost::Message as _;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Queue group of coordinators on the breaker events.
const EVENTS_QUEUE_GROUP: &str = "bw-breaker-coordinator";

impl Coordinator {
    /// Learns the scopes that have entries in the DLQ (one stream-info request for the subjects; the first
    /// entry of an unknown sender names its WABA). The Redis scope index can be lost with a Redis master, and a
    /// sender whose messages all wait in the DLQ sends nothing that would index it again: without this its
    /// breaker would never get a snapshot in BW_SCOPES, and replay, which follows the snapshots, would never
    /// drain it.
    pub(crate) async fn discover_dlq(&self) {
        use bw_wire::names;
        // Only the leader ticks and writes snapshots; an instance that takes the lease discovers at once.
        if !self.is_leader() {
            return;
        }
        let send = self.inner.send;
        let Ok(counts) = bw_ops::scan::dlq_subject_counts(&self.inner.js, send).await else {
            return;
        };
        let unknown: std::collections::BTreeSet<&str> =
            counts.keys().map(|s| names::phone_of_subject(s)).filter(|p| self.scope(p).is_none()).collect();
        for phone in unknown {
            let (stream, filter) = (send.dlq_stream_of(phone), send.dlq_scope_filter(phone));
            let Ok(Some(first)) = bw_ops::scan::first_message(&self.inner.js, &stream, &filter).await else {
                continue;
            };
            let Ok(envelope) = bw_proto::v1::DlqEnvelope::decode(first.payload.as_ref()) else { continue };
            let Some(request) = envelope.request.as_ref() else { continue };
            let scope = Scope::new(request.waba_id.clone(), request.phone_number_id.clone());
            if scope.waba_id.is_empty() || scope.phone_number_id.is_empty() || !self.learn(&scope) {
                continue;
            }
            tracing::info!(phone_number_id = %scope.phone_number_id, "scope learned from its dlq entries");
            if let Err(e) = self.write_config(&scope).await {
                tracing::warn!(phone_number_id = %scope.phone_number_id, error = %e, "cannot write scope config");
            }
        }
    }

    /// Reads the scope index other services fill (and the account each scope is sent with); writes the config of
    /// newly seen scopes.
    pub(crate) async fn discover(&self) {
        self.discover_dlq().await;
        match self.inner.breaker.scope_accounts().await {
            Ok(accounts) => *self.inner.accounts.write().unwrap_or_else(|p| p.into_inner()) = accounts,
            Err(e) => tracing::debug!(error = %e, "cannot read the scope accounts"),
        }
        let mut conn = self.inner.redis.clone();
        let members: Vec<String> =
            match redis::cmd("SMEMBERS").arg(bw_wire::names::SCOPES_INDEX_KEY).query_async(&mut conn).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the scope index");
                    return;
                }
            };
        for member in members {
            if let Some(scope) = Scope::from_index_member(&member)
                && self.learn(&scope)
                && let Err(e) = self.write_config(&scope).await
            {
                tracing::warn!(phone_number_id = %scope.phone_number_id, error = %e, "cannot write scope config");
            }
        }
    }

    /// Handles one transition event published by any instance (each event reaches one coordinator: queue
    /// group). Every instance counts the trips it receives; only the leader writes and ticks.
    pub(crate) async fn on_event(&self, event: BreakerTransition) {
        let Some(s) = event.scope.as_ref() else {
            return;
        };
        let scope = Scope::new(s.waba_id.clone(), s.phone_number_id.clone());
        if scope.waba_id.is_empty() || scope.phone_number_id.is_empty() {
            return;
        }
        if event.to() == BreakerState::Open {
            self.inner.metrics.trips.get_or_create(&vec![("scope".into(), scope.phone_number_id.clone())]).inc();
        }
        if self.learn(&scope)
            && let Err(e) = self.write_config(&scope).await
        {
            tracing::warn!(phone_number_id = %scope.phone_number_id, error = %e, "cannot write scope config");
        }
        if self.is_leader() {
            self.tick_scope(&scope, true).await;
        }
    }

    /// Runs the loops until `shutdown`: the leader lease, the event subscription and the tick loop (which
    /// ticks and writes only while this instance leads). Dropping the returned future stops the loops as a
    /// crash would (the lease is not given back and expires); `shutdown` releases it for a fast hand-over.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let c = &self.inner.cfg.coordinator;
        let leadership = leader::open(
            &self.inner.js,
            self.inner.instance.clone(),
            Duration::from_millis(c.leader_lease_ms),
            self.inner.cfg.nats.replicas,
            self.inner.cfg.nats.limits.service_bucket_max_bytes,
        )
        .await?;
        if self.inner.leader.set(leadership).is_err() {
            anyhow::bail!("Coordinator::run called twice on one coordinator");
        }
        let events = self
            .inner
            .nats
            .queue_subscribe(bw_wire::names::BREAKER_WILDCARD, EVENTS_QUEUE_GROUP.to_string())
            .await
            .map_err(|e| anyhow::anyhow!("cannot subscribe to breaker events: {e}"))?;
        // The loops stop on `stop`: the shutdown token, or this future dropped (the guard).
        let stop = shutdown.child_token();
        let _guard = stop.clone().drop_guard();
        let tracker = TaskTracker::new();

        let this = self.clone();
        let token = stop.clone();
        let graceful = shutdown.clone();
        tracker.spawn(
            async move {
                let Some(lease) = this.inner.leader.get() else {
                    return;
                };
                let renew = Duration::from_millis(this.inner.cfg.coordinator.leader_renew_ms.max(10));
                let mut every = tokio::time::interval(renew);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = every.tick() => {}
                    }
                    let change = lease.step().await;
                    this.inner.metrics.leader.set(i64::from(lease.is_held()));
                    match change {
                        leader::Change::Acquired => {
                            let instance = lease.instance();
                            tracing::info!(%instance, "coordinator lease taken: this instance leads");
                            this.inner.metrics.leader_changes.inc();
                            this.inner.resync_due.store(true, Ordering::SeqCst);
                        }
                        leader::Change::Lost => {
                            let instance = lease.instance();
                            tracing::warn!(%instance, "coordinator lease lost: this instance follows");
                            this.inner.metrics.state.clear();
                        }
                        leader::Change::Same => {}
                    }
                }
                if graceful.is_cancelled() {
                    lease.release().await;
                    this.inner.metrics.leader.set(0);
                    tracing::info!(instance = %lease.instance(), "coordinator lease released");
                }
            }
            .instrument(tracing::info_span!("coordinator.lease")),
        );

        let this = self.clone();
        let token = stop.clone();
        tracker.spawn(
            async move {
                let mut events = events;
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        msg = events.next() => match msg {
                            Some(msg) => match BreakerTransition::decode(msg.payload.as_ref()) {
                                Ok(event) => this.on_event(event).await,
                                Err(e) => {
                                    tracing::warn!(subject = %msg.subject, error = %e, "undecodable breaker event")
                                }
                            },
                            None => break,
                        },
                    }
                }
            }
            .instrument(tracing::info_span!("coordinator.events")),
        );

        // Meta's account signals (`account`): every instance binds the one consumer; retried until it runs.
        let this = self.clone();
        let token = stop.clone();
        tracker.spawn(
            async move {
                while let Err(e) = this.clone().consume_account_signals(token.clone()).await {
                    tracing::warn!(error = %e, "account signals not consumed yet; retrying");
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
            .instrument(tracing::info_span!("coordinator.account")),
        );

        let this = self.clone();
        let token = stop.clone();
        tracker.spawn(
            async move {
                let c = &this.inner.cfg.coordinator;
                let mut tick = tokio::time::interval(Duration::from_millis(c.tick_ms.max(10)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut last_discovery = Instant::now();
                let mut last_resync = Instant::now();
                let mut last_poll = Instant::now();
                let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = tick.tick() => {}
                        Some(()) = hangup_signal(hangup.as_mut()) => {
                            tracing::info!("SIGHUP: reloading limits");
                            let _ = this.reload().await;
                            continue;
                        }
                    }
                    if last_poll.elapsed() >= Duration::from_millis(c.limits_poll_ms) {
                        last_poll = Instant::now();
                        if this.limits_file_changed() {
                            tracing::info!(file = %c.limits_file, "limits file changed: reloading");
                            let _ = this.reload().await;
                        }
                    }
                    if last_discovery.elapsed() >= Duration::from_millis(c.scope_discovery_ms) {
                        last_discovery = Instant::now();
                        this.discover().await;
                    }
                    if !this.is_leader() {
                        continue;
                    }
                    if this.inner.resync_due.swap(false, Ordering::SeqCst) {
                        // Just took the lease: what the previous leader wrote may be stale or missing.
                        last_resync = Instant::now();
                        this.discover().await;
                        this.write_all_configs().await;
                        this.tick_all(true).await;
                        continue;
                    }
                    if last_resync.elapsed() >= Duration::from_millis(c.config_resync_ms) {
                        last_resync = Instant::now();
                        this.write_all_configs().await;
                    }
                    this.tick_all(false).await;
                }
            }
            .instrument(tracing::info_span!("coordinator.tick")),
        );

        stop.cancelled().await;
        tracker.close();
        if tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await.is_err() {
            tracing::warn!("coordinator tasks did not stop within 5 s");
        }
        Ok(())
    }
}

/// The next SIGHUP, or never when the handler could not be installed.
async fn hangup_signal(hangup: Option<&mut tokio::signal::unix::Signal>) -> Option<()> {
    match hangup {
        Some(h) => h.recv().await,
        None => std::future::pending().await,
    }
}
