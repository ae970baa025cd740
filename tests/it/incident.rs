//! Incidents you can name: every DLQ entry written while a scope is OPEN carries the breaker's incident id
//! (whatever the reason), `bwctl dlq stats` groups by incident and shows what replay holds, `bwctl dlq replay
//! --incident` replays exactly that group in per-recipient acceptance order (two dispatchers and two replay
//! workers running), a held category stays in the DLQ until released, and each finished incident gets one
//! "replayed" event with its report.

use bw_breaker::{Breaker, BreakerConfig, Forced, OutcomeItem, OutcomeKind, Scope};
use bw_common::classify::RateScope;
use bw_common::nats::publish_durable;
use bw_e2e::{Harness, WABA_ID};
use bw_meta_sim::{Fault, FaultKind, Latency, Scenario, Selection, SimConfig, Window};
use bw_ops::incident::Incidents;
use bw_ops::scan::{scan_stream, subject_counts};
use bw_proto::v1::*;
use bw_testkit::wait_until;
use bw_wire::names;
use futures::StreamExt;
use prost::Message as _;
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

fn sim() -> SimConfig {
    let mut cfg = SimConfig::default();
    cfg.limits.throughput_mps = 1_000.0;
    cfg.limits.throughput_burst = 1_000;
    cfg.limits.pair_enabled = false;
    cfg
}

async fn test_breaker(h: &Harness) -> Breaker {
    let redis = bw_common::redis_conn::connect(&h.redis.url(), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("redis");
    // No NATS client: the dispatchers learn of its changes only from Redis, as from any other process.
    Breaker::new(Some(redis), None, BreakerConfig::default())
}

async fn dlq_envelopes(h: &Harness, phone: &str) -> Vec<DlqEnvelope> {
    scan_stream(&h.js, names::DLQ_STREAM, &names::dlq_scope_filter(phone))
        .await
        .expect("scan")
        .into_iter()
        .map(|m| DlqEnvelope::decode(m.payload.as_ref()).expect("envelope"))
        .collect()
}

async fn dlq_envelope_of(h: &Harness, phone: &str, op: &str) -> Option<DlqEnvelope> {
    dlq_envelopes(h, phone).await.into_iter().find(|e| e.request.as_ref().is_some_and(|r| r.operation_id == op))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_entries_written_while_open_carry_the_incident_whatever_the_reason() {
    const PHONE: &str = "106540352242961";
    let mut h = Harness::start(sim()).await;
    // Every call fails with a transient error after 1.2 s, so the last automatic retry is still at Meta when the
    // breaker opens.
    h.sim.set_scenario(Scenario {
        name: "slow-failures".into(),
        seed: Some(3),
        selection: Selection::Deterministic,
        latency: Some(Latency::Fixed { ms: 1_200 }),
        windows: vec![Window {
            name: "fail".into(),
            start_ms: 0,
            duration_ms: None,
            error_rate: 1.0,
            faults: vec![Fault {
                kind: FaultKind::Error { code: 131000, http_status: None, subcode: None },
                weight: 1,
            }],
            latency: None,
            phone_number_ids: vec![],
        }],
        ..Scenario::default()
    });
    h.start_ingest(&[]).await;
    h.start_dispatcher(&[]).await;
    let breaker = test_breaker(&h).await;
    let scope = Scope::new(WABA_ID, PHONE);

    let order = |op: &str, to: &str| {
        bw_client::Request::template(op, WABA_ID, PHONE, to, "order_confirmation", "es_AR")
            .param("1")
            .category(Category::Transactional)
            .build()
    };
    let reply = h.producer().send(&order("exhausted-1", "+5491155500001")).await.expect("ingest answers");
    assert!(reply.accepted, "{}", reply.error);
    // Three failed tries recorded and the fourth (the last: max_retries = 3) on the wire: open the breaker now.
    assert!(
        wait_until(WAIT, || async {
            h.ledger_entry("exhausted-1")
                .await
                .is_some_and(|v| v.entry.attempts == 3 && v.entry.in_flight_since_unix_ms > 0)
        })
        .await,
        "the last try never started: {:?}",
        h.ledger_entry("exhausted-1").await
    );
    let (status, _) = breaker.force(&scope, Forced::Open).await.expect("force open");
    let incident = status.snapshot.incident_id.clone();
    assert!(!incident.is_empty(), "opening mints an incident");
    assert!(h.wait_state("exhausted-1", &[OperationState::Dlq], WAIT).await);
    let env = dlq_envelope_of(&h, PHONE, "exhausted-1").await.expect("in the dlq");
    assert_eq!(env.reason(), DlqReason::RetriesExhausted);
    assert_eq!(env.incident_id, incident, "retries exhausted while OPEN: the entry names the incident");
    assert_eq!(h.ledger_entry("exhausted-1").await.expect("ledger").entry.incident_id, incident);

    // A long pause of the sender while it is OPEN: admission refuses for the pause (checked first), not for the
    // breaker, and the DLQ entry still names the incident.
    breaker
        .record(
            &scope,
            &[OutcomeItem {
                recipient_key: bw_common::mask::recipient_key("+5491155500002"),
                kind: OutcomeKind::RateLimited { scope: RateScope::PhoneNumber, pause_ms: 600_000 },
                canary: false,
            }],
        )
        .await;
    let reply = h.producer().send(&order("paused-1", "+5491155500003")).await.expect("ingest answers");
    assert!(reply.accepted, "{}", reply.error);
    assert!(h.wait_state("paused-1", &[OperationState::Dlq], WAIT).await);
    let env = dlq_envelope_of(&h, PHONE, "paused-1").await.expect("in the dlq");
    assert_eq!(env.reason(), DlqReason::SenderPaused, "refused for the pause, not for the breaker");
    assert_eq!(env.incident_id, incident, "{:?} while OPEN: the entry names the incident", env.reason());

    // Closed again: a new DLQ entry names no incident.
    breaker.reset(&scope).await.expect("reset");
    let reply = h.producer().send(&order("closed-1", "+5491155500004")).await.expect("ingest answers");
    assert!(reply.accepted, "{}", reply.error);
    assert!(h.wait_state("closed-1", &[OperationState::Dlq], Duration::from_secs(60)).await);
    let env = dlq_envelope_of(&h, PHONE, "closed-1").await.expect("in the dlq");
    assert_eq!((env.reason(), env.incident_id.as_str()), (DlqReason::RetriesExhausted, ""));
}

/// One seeded DLQ entry: its request, ledger entry (DLQ) and envelope carrying `incident`.
struct Seed {
    op: String,
    request: SendRequest,
    incident: String,
}

fn marketing(phone: &str, op: &str, to: &str, accepted_at: i64) -> SendRequest {
    SendRequest {
        accepted_at_unix_ms: accepted_at,
        ..bw_client::Request::template(op, WABA_ID, phone, to, "spring_sale", "es_AR")
            .param("1")
            .category(Category::Marketing)
            .build()
    }
}

async fn seed(h: &Harness, s: &Seed) {
    let entry = bw_common::ledger::entry_for(&s.request, OperationState::Dlq);
    h.ledger
        .update(&s.op, |_| Some(LedgerEntry { incident_id: s.incident.clone(), ..entry.clone() }))
        .await
        .expect("ledger");
    let env = DlqEnvelope {
        request: Some(s.request.clone()),
        reason: DlqReason::BreakerOpen as i32,
        incident_id: s.incident.clone(),
        dead_lettered_at_unix_ms: bw_common::time::now_ms(),
        ..Default::default()
    };
    publish_durable(
        &h.js,
        names::dlq_subject(s.request.category(), &s.request.phone_number_id),
        names::msg_id_headers(&format!("{}.seed", s.op)),
        env.encode_to_vec().into(),
    )
    .await
    .expect("dlq publish");
}

async fn set_closed(h: &Harness, phone: &str) {
    let snapshot = ScopeSnapshot {
        scope: Some(bw_proto::v1::Scope { waba_id: WABA_ID.into(), phone_number_id: phone.into() }),
        state: BreakerState::Closed as i32,
        since_unix_ms: bw_common::time::now_ms() - 60_000,
        updated_at_unix_ms: bw_common::time::now_ms(),
        ..Default::default()
    };
    h.buckets.scopes.put(phone, snapshot.encode_to_vec().into()).await.expect("scope snapshot");
}

async fn bwctl(h: &Harness, args: &[&str]) -> (i32, String) {
    crate::bwctl(&h.nats.url(), args).await
}

async fn incident_events(h: &Harness, phone: &str) -> u64 {
    subject_counts(&h.js, names::EVENTS_STREAM, &names::incident_subject(phone)).await.expect("counts").values().sum()
}

/// The row of `incident` in the per-incident table of `bwctl dlq stats`: (depth, held).
fn stats_row(out: &str, incident: &str) -> Option<(u64, u64)> {
    let line = out.lines().find(|l| l.starts_with(incident))?;
    let cells: Vec<&str> = line.split_whitespace().collect();
    Some((cells.get(2)?.parse().ok()?, cells.get(3)?.parse().ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_incident_is_released_by_the_operator_in_order_and_reported_once() {
    const PHONE: &str = "106540352242962";
    let inc_a = format!("{PHONE}-1700000000000001");
    let inc_b = format!("{PHONE}-1700000000000002");
    let mut h = Harness::start(sim()).await;
    let now = bw_common::time::now_ms();

    // Incident A: three recipients with three marketing messages each, dead-lettered in the reverse of their
    // acceptance order (so only sorting puts them back), plus one past its deadline and one free-form text
    // outside the 24 h window.
    let mut seeds = Vec::new();
    for k in 0..9 {
        let to = format!("+549116660000{}", k % 3);
        let op = format!("a-{k}");
        seeds.push(Seed {
            request: marketing(PHONE, &op, &to, now - 100_000 + k as i64 * 10),
            op,
            incident: inc_a.clone(),
        });
    }
    seeds.reverse();
    let expired =
        SendRequest { deadline_unix_ms: now - 1, ..marketing(PHONE, "a-expired", "+5491166600009", now - 200_000) };
    let window = SendRequest {
        payload: Some(send_request::Payload::Text(TextPayload { body: "hola".into(), preview_url: false })),
        customer_last_inbound_unix_ms: now - 48 * 3600 * 1000,
        ..marketing(PHONE, "a-window", "+5491166600008", now - 150_000)
    };
    seeds.push(Seed { op: "a-expired".into(), request: expired, incident: inc_a.clone() });
    seeds.push(Seed { op: "a-window".into(), request: window, incident: inc_a.clone() });
    // Incident B: two marketing messages (held) and one transactional (not held: replays on close).
    for k in 0..2 {
        let op = format!("b-m{k}");
        seeds.push(Seed {
            request: marketing(PHONE, &op, "+5491166600100", now - 50_000 + k),
            op,
            incident: inc_b.clone(),
        });
    }
    let b_t = SendRequest {
        category: Category::Transactional as i32,
        ..marketing(PHONE, "b-t0", "+5491166600101", now - 40_000)
    };
    seeds.push(Seed { op: "b-t0".into(), request: b_t, incident: inc_b.clone() });
    for s in &seeds {
        seed(&h, s).await;
    }
    set_closed(&h, PHONE).await;

    let hold = [("replay.hold_categories", r#"["marketing"]"#.to_string())];
    for _ in 0..2 {
        h.start_dispatcher(&[]).await;
        h.start_replay(&hold).await;
    }
    let incidents = Incidents::open(&h.js, 1).await.expect("incidents bucket");
    // Closed: the category that is not held replays at once; the held ones are seen and left alone.
    assert!(h.wait_state("b-t0", &[OperationState::Sent, OperationState::Delivered, OperationState::Read], WAIT).await);
    for inc in [&inc_a, &inc_b] {
        assert!(
            wait_until(WAIT, || async {
                incidents.get(PHONE, inc).await.ok().flatten().is_some_and(|p| p.held_categories == ["marketing"])
            })
            .await,
            "replay never held {inc}"
        );
    }
    for s in seeds.iter().filter(|s| s.request.category() == Category::Marketing) {
        let e = h.ledger_entry(&s.op).await.expect("ledger").entry;
        assert_eq!((e.state(), e.replays), (OperationState::Dlq, 0), "{} held, untouched", s.op);
    }
    let (code, out) = bwctl(&h, &["dlq", "stats"]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(stats_row(&out, &inc_a), Some((11, 11)), "{out}");
    assert_eq!(stats_row(&out, &inc_b), Some((2, 2)), "{out}");

    // Release A: exactly its entries go, in acceptance order per recipient.
    let mut lane = h.client.subscribe(names::outbox_subject(names::Lane::Replay, PHONE)).await.expect("subscribe");
    let mut events = h.client.subscribe(names::incident_subject(PHONE)).await.expect("subscribe");
    h.client.flush().await.expect("flush");
    let (code, out) = bwctl(&h, &["dlq", "replay", "--incident", &inc_a, "--rate", "200"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&format!("incident {inc_a} finished")), "{out}");
    let mut seen: Vec<SendRequest> = Vec::new();
    while seen.len() < 9 {
        let msg = tokio::time::timeout(WAIT, lane.next()).await.expect("replay lane message").expect("subscription");
        seen.push(SendRequest::decode(msg.payload.as_ref()).expect("request"));
    }
    let mut per_recipient: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for r in &seen {
        assert!(r.operation_id.starts_with("a-"), "{} is not of incident A", r.operation_id);
        per_recipient.entry(r.recipient.clone()).or_default().push(r.accepted_at_unix_ms);
    }
    assert_eq!(per_recipient.len(), 3);
    for (to, times) in &per_recipient {
        assert!(
            times.windows(2).all(|w| w[0] < w[1]),
            "recipient {} out of order: {times:?}",
            bw_common::mask::phone(to)
        );
    }
    let a_ops: Vec<String> = (0..9).map(|k| format!("a-{k}")).collect();
    let sent = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
    assert!(h.wait_all(&a_ops, &sent, WAIT).await, "two dispatchers send what the release put on the lane");
    assert_eq!(h.ledger_entry("a-expired").await.expect("ledger").entry.state(), OperationState::Expired);
    assert_eq!(h.ledger_entry("a-window").await.expect("ledger").entry.state(), OperationState::Quarantined);

    // One event with the report.
    let msg = tokio::time::timeout(WAIT, events.next()).await.expect("incident event").expect("subscription");
    let report = IncidentReplayed::decode(msg.payload.as_ref()).expect("report");
    assert_eq!(report.incident_id, inc_a);
    assert_eq!((report.messages, report.replayed, report.expired, report.quarantined, report.other), (11, 9, 1, 1, 0));
    assert!(report.released_by_operator);
    assert!(report.finished_at_unix_ms >= report.started_at_unix_ms && report.took_ms >= 0);
    // B is still held, whole: another incident's entries stay.
    let left: Vec<String> =
        dlq_envelopes(&h, PHONE).await.into_iter().map(|e| e.request.expect("request").operation_id).collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().all(|op| op.starts_with("b-m")), "{left:?}");
    // Running it again finds nothing and announces nothing twice.
    let (code, out) = bwctl(&h, &["dlq", "replay", "--incident", &inc_a]).await;
    assert_eq!(code, 1, "{out}");
    assert_eq!(incident_events(&h, PHONE).await, 1);

    // Release B: its held marketing messages go; its report counts the transactional one replayed on close.
    let (code, out) = bwctl(&h, &["dlq", "replay", "--incident", &inc_b, "--rate", "200"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(h.wait_all(&["b-m0".into(), "b-m1".into()], &sent, WAIT).await);
    let msg = tokio::time::timeout(WAIT, events.next()).await.expect("incident event").expect("subscription");
    let report = IncidentReplayed::decode(msg.payload.as_ref()).expect("report");
    assert_eq!((report.incident_id.as_str(), report.messages, report.replayed), (inc_b.as_str(), 3, 3));
    assert!(wait_until(WAIT, || async { dlq_envelopes(&h, PHONE).await.is_empty() }).await);
    assert_eq!(incident_events(&h, PHONE).await, 2);
    let (code, out) = bwctl(&h, &["account"]).await;
    assert_eq!(code, 0, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incident_replayed_on_close_is_reported_once_across_two_replay_workers() {
    const PHONE: &str = "106540352242963";
    let inc = format!("{PHONE}-1700000000000003");
    let mut h = Harness::start(sim()).await;
    let now = bw_common::time::now_ms();
    let mut seeds: Vec<Seed> = (0..6)
        .map(|k| {
            let op = format!("c-{k}");
            let request = SendRequest {
                category: Category::Transactional as i32,
                ..marketing(PHONE, &op, &format!("+54911777000{k:02}"), now - 10_000 + k)
            };
            Seed { op, request, incident: inc.clone() }
        })
        .collect();
    seeds[4].request.deadline_unix_ms = now - 1;
    seeds[5].request.payload =
        Some(send_request::Payload::Text(TextPayload { body: "hola".into(), preview_url: false }));
    seeds[5].request.customer_last_inbound_unix_ms = now - 48 * 3600 * 1000;
    for s in &seeds {
        seed(&h, s).await;
    }
    let mut events = h.client.subscribe(names::incident_subject(PHONE)).await.expect("subscribe");
    h.client.flush().await.expect("flush");
    for _ in 0..2 {
        h.start_dispatcher(&[]).await;
        h.start_replay(&[]).await;
    }
    set_closed(&h, PHONE).await;
    let msg = tokio::time::timeout(WAIT, events.next()).await.expect("incident event").expect("subscription");
    let report = IncidentReplayed::decode(msg.payload.as_ref()).expect("report");
    assert_eq!(report.incident_id, inc);
    assert_eq!((report.messages, report.replayed, report.expired, report.quarantined), (6, 4, 1, 1));
    assert!(!report.released_by_operator);
    let incidents = Incidents::open(&h.js, 1).await.expect("incidents bucket");
    assert!(
        wait_until(WAIT, || async {
            incidents.get(PHONE, &inc).await.ok().flatten().is_some_and(|p| p.announced_at_unix_ms > 0)
        })
        .await
    );
    let ops: Vec<String> = (0..4).map(|k| format!("c-{k}")).collect();
    assert!(h.wait_all(&ops, &[OperationState::Sent, OperationState::Delivered, OperationState::Read], WAIT).await);
    assert_eq!(incident_events(&h, PHONE).await, 1, "one event however many workers checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replay_finishes_what_a_dead_one_left_and_announces_it_once() {
    const PHONE: &str = "106540352242964";
    let mut h = Harness::start(sim()).await;
    Incidents::open(&h.js, 1).await.expect("incidents bucket");
    let store = h.js.get_key_value(names::INCIDENTS_BUCKET).await.expect("bucket");
    let now = bw_common::time::now_ms();
    // One instance died after the incident's last entry left the DLQ, before its finish check; another died
    // after marking its incident finished, before the event went out.
    let drained = IncidentProgress {
        incident_id: format!("{PHONE}-1700000000000004"),
        phone_number_id: PHONE.into(),
        started_at_unix_ms: now - 5_000,
        updated_at_unix_ms: now - 1_000,
        replayed: 7,
        expired: 2,
        ..Default::default()
    };
    let unannounced = IncidentProgress {
        incident_id: format!("{PHONE}-1700000000000005"),
        phone_number_id: PHONE.into(),
        started_at_unix_ms: now - 9_000,
        finished_at_unix_ms: now - 4_000,
        replayed: 3,
        quarantined: 1,
        ..Default::default()
    };
    for p in [&drained, &unannounced] {
        let key = names::incident_key(PHONE, &p.incident_id);
        store.put(key, p.encode_to_vec().into()).await.expect("record");
    }
    set_closed(&h, PHONE).await;
    let mut events = h.client.subscribe(names::incident_subject(PHONE)).await.expect("subscribe");
    h.client.flush().await.expect("flush");
    let first = h.start_replay(&[]).await;
    let mut reports = BTreeMap::new();
    for _ in 0..2 {
        let msg = tokio::time::timeout(WAIT, events.next()).await.expect("incident event").expect("subscription");
        let r = IncidentReplayed::decode(msg.payload.as_ref()).expect("report");
        reports.insert(r.incident_id.clone(), r);
    }
    let r = &reports[&drained.incident_id];
    assert_eq!((r.messages, r.replayed, r.expired), (9, 7, 2));
    let r = &reports[&unannounced.incident_id];
    assert_eq!((r.messages, r.quarantined, r.finished_at_unix_ms, r.took_ms), (4, 1, now - 4_000, 5_000));
    let incidents = Incidents::open(&h.js, 1).await.expect("incidents bucket");
    for p in [&drained, &unannounced] {
        assert!(
            wait_until(WAIT, || async {
                incidents.get(PHONE, &p.incident_id).await.ok().flatten().is_some_and(|x| x.announced_at_unix_ms > 0)
            })
            .await
        );
    }
    // Restarted again (two instances) with a third incident left drained: the restart check finishes the third
    // and announces neither of the first two again, so the third's is the next event.
    h.stop(first).await.expect("replay stops");
    let third = IncidentProgress {
        incident_id: format!("{PHONE}-1700000000000006"),
        started_at_unix_ms: now - 2_000,
        replayed: 1,
        ..drained.clone()
    };
    store.put(names::incident_key(PHONE, &third.incident_id), third.encode_to_vec().into()).await.expect("record");
    h.start_replay(&[]).await;
    h.start_replay(&[]).await;
    let msg = tokio::time::timeout(WAIT, events.next()).await.expect("incident event").expect("subscription");
    let r = IncidentReplayed::decode(msg.payload.as_ref()).expect("report");
    assert_eq!((r.incident_id.as_str(), r.messages), (third.incident_id.as_str(), 1 + 2), "{r:?}");
    assert_eq!(incident_events(&h, PHONE).await, 3, "one stored event per incident");
}
