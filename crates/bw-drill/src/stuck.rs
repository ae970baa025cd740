//! What held a drill that did not settle: read once at the settle timeout, while the services still run, so
//! the report says where the remaining work sits and what it waits for instead of only that it is there.
//!
//! Every line names senders (phone_number_id, not personal data), subjects, consumers and counts; never a
//! recipient: order sets appear only as counts, ledger entries only grouped by state, category and reason.

use bw_proto::v1::{BreakerState, LedgerEntry, OperationState, ScopeSnapshot};
use bw_wire::names;
use futures::StreamExt;
use prost::Message as _;
use std::collections::BTreeMap;
use std::time::Duration;

/// The diagnosis, one finding per line.
pub async fn diagnose(
    js: &async_nats::jetstream::Context,
    scopes: &async_nats::jetstream::kv::Store,
    redis: &bw_common::config::RedisConfig,
    senders: &[String],
    states: &BTreeMap<String, BreakerState>,
) -> Vec<String> {
    let mut lines = Vec::new();
    let not_closed: Vec<String> = states
        .iter()
        .filter(|(_, s)| !matches!(s, BreakerState::Closed | BreakerState::ForcedClosed))
        .map(|(phone, s)| format!("{phone} {}", s.as_str_name()))
        .collect();
    if !not_closed.is_empty() {
        lines.push(format!("breakers not CLOSED (as observed): {}", not_closed.join(", ")));
    }
    lines.extend(snapshots(scopes, senders).await);
    let send = bw_common::nats::send_partitions(js).await.unwrap_or_default();
    for stream in send.streams().chain(send.dlq_streams()).chain([names::UNKNOWN_STREAM.to_string()]) {
        lines.extend(subjects(js, &stream).await);
        lines.extend(consumers(js, &stream).await);
    }
    lines.push(order_sets(redis).await);
    lines
}

/// Ledger entries that are not final, grouped by state, category, reason and replay count (at most 12 groups).
pub fn waiting_entries(entries: &[LedgerEntry]) -> Vec<String> {
    let mut groups: BTreeMap<(String, String, String, u32), u64> = BTreeMap::new();
    for e in entries {
        if matches!(e.state(), OperationState::Queued | OperationState::Dlq) {
            let key = (
                e.state().as_str_name().to_string(),
                e.category().as_str_name().to_string(),
                if e.reason.is_empty() { "no reason".to_string() } else { e.reason.clone() },
                e.replays,
            );
            *groups.entry(key).or_default() += 1;
        }
    }
    let mut rows: Vec<_> = groups.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1));
    rows.into_iter()
        .take(12)
        .map(|((state, category, reason, replays), n)| {
            format!("ledger: {n} {state} {category}, replays {replays}: {reason}")
        })
        .collect()
}

async fn snapshots(scopes: &async_nats::jetstream::kv::Store, senders: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let now = bw_common::time::now_ms();
    for phone in senders {
        let Ok(Some(bytes)) = scopes.get(phone).await else {
            out.push(format!("scope snapshot {phone}: none"));
            continue;
        };
        let Ok(s) = ScopeSnapshot::decode(bytes) else {
            out.push(format!("scope snapshot {phone}: undecodable"));
            continue;
        };
        let state = BreakerState::try_from(s.state).map(|s| s.as_str_name()).unwrap_or("unknown state");
        let paused = if s.paused_until_unix_ms > now {
            format!(", paused {} ms more", s.paused_until_unix_ms - now)
        } else {
            String::new()
        };
        let since = if s.since_unix_ms > 0 { format!(" for {} ms", now - s.since_unix_ms) } else { String::new() };
        out.push(format!(
            "scope snapshot {phone}: {state}{since}{paused}, ramp {:.2}, {} calls in the window, failure rate {:.2}",
            s.ramp_fraction, s.calls_in_window, s.failure_rate
        ));
    }
    out
}

async fn subjects(js: &async_nats::jetstream::Context, stream: &str) -> Vec<String> {
    let Ok(handle) = js.get_stream(stream).await else {
        return vec![format!("{stream}: unreadable")];
    };
    let Ok(mut subjects) = handle.info_with_subjects(">").await else {
        return vec![format!("{stream}: subjects unreadable")];
    };
    let mut counts = BTreeMap::new();
    while let Some(Ok((subject, count))) = subjects.next().await {
        if count > 0 {
            counts.insert(subject, count);
        }
    }
    if counts.is_empty() {
        return vec![format!("{stream}: empty")];
    }
    let list: Vec<String> = counts.iter().map(|(s, n)| format!("{s} {n}")).collect();
    vec![format!("{stream}: {}", list.join(", "))]
}

async fn consumers(js: &async_nats::jetstream::Context, stream: &str) -> Vec<String> {
    let Ok(handle) = js.get_stream(stream).await else { return Vec::new() };
    let mut infos = handle.consumers();
    let mut out = Vec::new();
    while let Some(Ok(info)) = infos.next().await {
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            continue;
        }
        out.push(format!(
            "consumer {stream}/{}: {} pending, {} unacknowledged, {} redelivered, {} pulls waiting",
            info.name, info.num_pending, info.num_ack_pending, info.num_redelivered, info.num_waiting
        ));
    }
    out
}

/// How many per-recipient order sets exist and how many operations they hold (counts only).
async fn order_sets(redis: &bw_common::config::RedisConfig) -> String {
    let read = async {
        // The services' own connection path, with their credentials.
        let mut conn = bw_common::redis_conn::connect_config(redis, Duration::from_secs(2)).await?;
        let mut cursor: u64 = 0;
        let (mut sets, mut members, mut waiting) = (0u64, 0u64, 0u64);
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(names::ORDER_KEYS_PATTERN)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await?;
            for key in keys {
                let n: u64 = redis::cmd("ZCARD").arg(&key).query_async(&mut conn).await?;
                sets += 1;
                members += n;
                waiting += n.saturating_sub(1);
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok::<_, anyhow::Error>((sets, members, waiting))
    };
    match tokio::time::timeout(Duration::from_secs(5), read).await {
        Ok(Ok((sets, members, waiting))) => format!(
            "order sets: {sets} holding {members} operations ({waiting} behind an earlier one of the same recipient)"
        ),
        Ok(Err(e)) => format!("order sets unreadable: {e}"),
        Err(_) => "order sets unreadable: timed out".into(),
    }
}
