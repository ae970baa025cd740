//! The drill's middle phase: the producer's load, the scenario's clock, chaos and operator lifts on their
//! schedule, one timeline sample a second, until the system settles or the settle timeout (counted from the
//! producer's end) ends it.

use crate::chart::Sample;
use crate::model::{Mark, MarkKind};
use crate::observe::{Live, depths, heal_alerts, heal_states};
use crate::options::say;
use crate::producer::{self, Produced};
use crate::setup::{OPERATOR_TOKEN, Plan, Stack};
use crate::{chaos, chart, scoped};
use bw_proto::v1::BreakerState;
use bw_wire::names;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What the run produced besides the observed events.
pub(crate) struct Drive {
    pub samples: Vec<Sample>,
    pub marks: Vec<Mark>,
    /// WABA pauses the drill lifted as an operator: (seconds since start, WABA).
    pub lifts: Vec<(f64, String)>,
    pub chaos_log: Vec<(f64, String)>,
    /// When the DLQ drained after its peak, seconds since start, and that peak.
    pub drained_at: Option<f64>,
    pub max_dlq: u64,
    pub settled: bool,
    /// The producer, finished once the run settled.
    pub producer: tokio::task::JoinHandle<Produced>,
}

/// Runs the load until the system settles (three quiet seconds in a row) or the settle timeout.
pub(crate) async fn drive(plan: &Plan, stack: &mut Stack, live: &Live) -> anyhow::Result<Drive> {
    let (opts, scenario) = (&plan.opts, &plan.scenario);
    let Live { nats, js, buckets, observed, started, .. } = live;
    let started = *started;
    // The scenario's clock starts with the producer (the drill's time 0, give or take a millisecond).
    stack.sim.set_scenario(scenario.clone());
    let mut marks = scenario_marks(scenario);
    // When a restriction of one WABA ends, the drill lifts that WABA's pause as an operator does: a 368 holds
    // its WABA until lifted, and the scenario sends no `account_update` webhook that would end it.
    let mut lift_plan = scoped::restrictions(scenario);
    lift_plan.sort_by(|a, b| b.end_s.total_cmp(&a.end_s));
    let mut lifts: Vec<(f64, String)> = Vec::new();
    let producer_s = opts.messages as f64 / opts.rate.max(1.0);
    let mut chaos_plan: Vec<chaos::ChaosEvent> = opts
        .chaos_seed
        .map(|seed| chaos::schedule(seed, producer_s * 0.15, producer_s * 0.85, opts.dispatchers, opts.replays))
        .unwrap_or_default();
    chaos_plan.reverse();
    let mut restarts: Vec<(f64, usize, String)> = Vec::new();
    let mut chaos_log: Vec<(f64, String)> = Vec::new();
    if let Some(seed) = opts.chaos_seed {
        say(opts, &format!("chaos seed {seed}: {} events planned", chaos_plan.len()));
    }
    let run_id = format!("drill{}", bw_common::time::now_ms() % 1_000_000);
    let progress = Arc::new(producer::ProducerProgress::default());
    let client = bw_client::Client::new(nats.clone());
    let producer = tokio::spawn(producer::produce(
        client,
        producer::Load {
            run_id: run_id.clone(),
            wabas: stack.wabas.clone(),
            senders: stack.senders.clone(),
            total: opts.messages,
            rate: opts.rate,
            concurrency: opts.concurrency,
        },
        progress.clone(),
    ));

    let mut samples = Vec::new();
    let mut last_sent = 0u64;
    let mut last_calls = 0u64;
    let mut last_failed = 0u64;
    let mut last_errors = 0u64;
    // Each loop takes a second plus its own work, so counts are divided by the time since the previous sample.
    let mut last_t = started.elapsed().as_secs_f64();
    let mut settled_for = 0u32;
    let mut alert_states: Option<async_nats::jetstream::kv::Store> = None;
    // The settle timeout counts from the producer's end, so a long run still gets the whole timeout to settle.
    let mut settle_deadline: Option<Instant> = None;
    let settled;
    let mut drained_at: Option<f64> = None;
    let mut max_dlq = 0u64;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut t = started.elapsed().as_secs_f64();
        // Chaos: due events first, then due restarts of killed processes.
        while chaos_plan.last().is_some_and(|e| e.at_s <= t) {
            let Some(event) = chaos_plan.pop() else { break };
            let label = event.kind.label();
            match event.kind {
                chaos::ChaosKind::KillDispatcher(n) | chaos::ChaosKind::KillReplay(n) => {
                    let service =
                        if matches!(event.kind, chaos::ChaosKind::KillDispatcher(_)) { "dispatcher" } else { "replay" };
                    if let Some(idx) = stack.services.procs.iter().position(|p| p.service == service && p.instance == n)
                    {
                        stack.services.kill9(idx);
                        restarts.push((t + event.down_s, idx, format!("start {service}-{n} again")));
                    }
                }
                chaos::ChaosKind::RestartNats => tokio::task::block_in_place(|| stack.nats_server.restart()),
                chaos::ChaosKind::RestartRedis => tokio::task::block_in_place(|| stack.redis_server.restart()),
            }
            say(opts, &format!("[{t:5.1}s] chaos: {label}"));
            marks.push(Mark { t, label: label.clone(), kind: MarkKind::Chaos });
            chaos_log.push((t, label));
        }
        let mut i = 0;
        while i < restarts.len() {
            if restarts[i].0 <= t {
                let (_, idx, label) = restarts.remove(i);
                stack.services.restart(idx)?;
                say(opts, &format!("[{t:5.1}s] chaos: {label}"));
                chaos_log.push((t, label));
            } else {
                i += 1;
            }
        }
        if lift_plan.last().is_some_and(|r| r.end_s <= t)
            && let Some(r) = lift_plan.pop()
        {
            let admin = stack.services.procs[stack.coordinator_idx].admin.clone();
            match lift_waba(&admin, &r.waba_id).await {
                Ok(()) => {
                    let label = format!("operator lifts WABA {} pause", r.waba_id);
                    say(opts, &format!("[{t:5.1}s] {label}"));
                    marks.push(Mark { t, label, kind: MarkKind::Recovery });
                    lifts.push((t, r.waba_id.clone()));
                }
                Err(e) => {
                    // Tried again next second (the settle timeout bounds it).
                    say(opts, &format!("[{t:5.1}s] lifting WABA {} pause failed: {e}", r.waba_id));
                    lift_plan.push(r);
                }
            }
        }
        t = started.elapsed().as_secs_f64();
        heal_states(&buckets.scopes, observed).await;
        if let Some(kv) = &alert_states {
            heal_alerts(kv, observed).await;
        } else {
            alert_states = js.get_key_value(names::ALERTS_BUCKET).await.ok();
        }
        let depths = depths(js).await;
        let (sent_per_s, error_rate, errors_per_s, open, half_open) = {
            let o = observed.lock().await;
            let calls = o.calls_total - last_calls;
            let failed = o.failed_calls_total - last_failed;
            let dt = (t - last_t).max(1e-3);
            last_t = t;
            let sample = (
                (o.sent_total - last_sent) as f64 / dt,
                if calls > 0 { failed as f64 / calls as f64 } else { 0.0 },
                (o.error_answers_total - last_errors) as f64 / dt,
                o.states.values().filter(|s| matches!(s, BreakerState::Open | BreakerState::ForcedOpen)).count() as u32,
                o.states.values().filter(|s| **s == BreakerState::HalfOpen).count() as u32,
            );
            last_sent = o.sent_total;
            last_calls = o.calls_total;
            last_failed = o.failed_calls_total;
            last_errors = o.error_answers_total;
            sample
        };
        max_dlq = max_dlq.max(depths.dlq);
        samples.push(chart::Sample {
            t,
            sent_per_s,
            error_rate,
            errors_per_s,
            scopes_open: open + half_open,
            scopes_half_open: half_open,
            dlq_depth: depths.dlq,
        });
        if opts.live {
            println!(
                "[{t:5.0}s] produced {:>6}/{:<6} accepted {:>6} | sent/s {:>5.0} err {:>4.1}% | breakers open {open} half-open {half_open} | queue {:>6} dlq {:>6} unknown {:>4} quarantine {:>4}",
                progress.submitted.load(Ordering::Relaxed),
                opts.messages,
                progress.accepted.load(Ordering::Relaxed),
                sent_per_s,
                error_rate * 100.0,
                depths.send,
                depths.dlq,
                depths.unknown,
                depths.quarantine,
            );
        }
        if max_dlq > 0 && depths.dlq == 0 && drained_at.is_none() {
            drained_at = Some(t);
        }
        let alerts_firing = observed.lock().await.alerts.values().filter(|a| a.resolved_at_unix_ms == 0).count();
        let produced = producer.is_finished();
        if produced && settle_deadline.is_none() {
            settle_deadline = Some(Instant::now() + Duration::from_secs(opts.settle_timeout_s));
        }
        let quiet = produced
            && depths.read
            && alerts_firing == 0
            && chaos_plan.is_empty()
            && restarts.is_empty()
            && lift_plan.is_empty()
            && depths.send == 0
            && depths.dlq == 0
            && depths.unknown == 0
            && open + half_open == 0;
        settled_for = if quiet { settled_for + 1 } else { 0 };
        if settled_for >= 3 || settle_deadline.is_some_and(|d| Instant::now() > d) {
            settled = settled_for >= 3;
            break;
        }
    }
    Ok(Drive { samples, marks, lifts, chaos_log, drained_at, max_dlq, settled, producer })
}

/// Outage and recovery marks of every fault window of the scenario (seconds since its clock started).
pub fn scenario_marks(scenario: &bw_meta_sim::Scenario) -> Vec<Mark> {
    let mut marks = Vec::new();
    for r in scoped::restrictions(scenario) {
        marks.push(Mark {
            t: r.start_s,
            label: format!("WABA {} restricted ({} on every send)", r.waba_id, r.code),
            kind: MarkKind::Outage,
        });
    }
    for w in scenario.windows.iter().filter(|w| w.error_rate > 0.0 || w.latency.is_some()) {
        let name = if w.name.is_empty() { "fault window".to_string() } else { w.name.clone() };
        marks.push(Mark {
            t: w.start_ms as f64 / 1000.0,
            label: format!("{name} starts ({:.0}% errors)", w.error_rate * 100.0),
            kind: MarkKind::Outage,
        });
        if let Some(d) = w.duration_ms {
            marks.push(Mark {
                t: (w.start_ms + d) as f64 / 1000.0,
                label: format!("{name} ends: Meta recovers"),
                kind: MarkKind::Recovery,
            });
        }
    }
    marks
}

/// Lifts every pause of `waba_id` through the coordinator's admin API (`admin`: its host:port), as an operator
/// does: `POST /admin/pauses/waba/{id}/lift` with the operator token.
async fn lift_waba(admin: &str, waba_id: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = r#"{"reason":"drill: Meta lifted the restriction"}"#;
    let request = format!(
        "POST /admin/pauses/waba/{waba_id}/lift HTTP/1.1\r\nHost: {admin}\r\nAuthorization: Bearer {OPERATOR_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(admin).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange).await??;
    let text = String::from_utf8_lossy(&response);
    let status_line = text.lines().next().unwrap_or("no answer");
    anyhow::ensure!(status_line.split_whitespace().nth(1) == Some("200"), "coordinator answered `{status_line}`");
    Ok(())
}
