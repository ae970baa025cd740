//! Non-consuming reads of JetStream streams, safe on work-queue streams.
//!
//! Work-queue streams refuse a second consumer whose filter overlaps an existing one (and ordered consumers,
//! which do not ack), so inspection reads messages with the stream's `MSG.GET` API instead: "next message at
//! or after sequence S on subject F". The sequence range is split into chunks read in parallel, each chunk
//! walking from message to message, so deleted gaps cost nothing.

use crate::OpsError;
use async_nats::jetstream::{self, message::StreamMessage};
use futures::StreamExt;
use std::collections::BTreeMap;

/// Parallel chunks of a scan.
const SCAN_CHUNKS: u64 = 16;

/// Every message of `stream` whose subject matches `filter` (wildcards allowed), in sequence order.
/// A message deleted or consumed while the scan runs may or may not be included.
pub async fn scan_stream(js: &jetstream::Context, stream: &str, filter: &str) -> Result<Vec<StreamMessage>, OpsError> {
    let handle = js.get_stream(stream).await.map_err(|e| OpsError::nats(stream, e))?;
    let state = handle.get_info().await.map_err(|e| OpsError::nats(stream, e))?.state;
    if state.messages == 0 {
        return Ok(Vec::new());
    }
    let (first, last) = (state.first_sequence.max(1), state.last_sequence);
    if last < first {
        return Ok(Vec::new());
    }
    let span = last - first + 1;
    let chunk = span.div_ceil(SCAN_CHUNKS).max(1);
    let ranges: Vec<(u64, u64)> = (0..SCAN_CHUNKS)
        .map(|i| (first + i * chunk, (first + (i + 1) * chunk - 1).min(last)))
        .filter(|(a, b)| a <= b)
        .collect();
    let results: Vec<Result<Vec<StreamMessage>, OpsError>> = futures::stream::iter(ranges)
        .map(|(from, to)| scan_range(&handle, stream, filter, from, to))
        .buffered(SCAN_CHUNKS as usize)
        .collect()
        .await;
    let mut out = Vec::with_capacity(state.messages as usize);
    for part in results {
        out.extend(part?);
    }
    Ok(out)
}

async fn scan_range(
    handle: &jetstream::stream::Stream,
    stream: &str,
    filter: &str,
    from: u64,
    to: u64,
) -> Result<Vec<StreamMessage>, OpsError> {
    use async_nats::jetstream::stream::RawMessageErrorKind;
    let mut out = Vec::new();
    let mut seq = from;
    while seq <= to {
        match handle.get_first_raw_message_by_subject(filter, seq).await {
            Ok(msg) if msg.sequence <= to => {
                seq = msg.sequence + 1;
                out.push(msg);
            }
            Ok(_) => break,
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
            Err(e) => return Err(OpsError::nats(stream, e)),
        }
    }
    Ok(out)
}

/// Message count per subject of `stream` for subjects matching `filter` (one stream-info request, paged).
pub async fn subject_counts(
    js: &jetstream::Context,
    stream: &str,
    filter: &str,
) -> Result<BTreeMap<String, u64>, OpsError> {
    let handle = js.get_stream(stream).await.map_err(|e| OpsError::nats(stream, e))?;
    let mut subjects = handle.info_with_subjects(filter).await.map_err(|e| OpsError::nats(stream, e))?;
    let mut out = BTreeMap::new();
    while let Some(item) = subjects.next().await {
        let (subject, count) = item.map_err(|e| OpsError::nats(stream, e))?;
        out.insert(subject, count as u64);
    }
    Ok(out)
}

/// Entries per DLQ subject of every DLQ partition (`BW_DLQ`, `BW_DLQ_1`, …; subjects are distinct across
/// partitions): who has dead letters, and how many of each class.
pub async fn dlq_subject_counts(
    js: &jetstream::Context,
    send: bw_wire::names::SendPartitions,
) -> Result<BTreeMap<String, u64>, OpsError> {
    use bw_wire::names::SendPartitions;
    let mut out = BTreeMap::new();
    for (partition, stream) in send.dlq_streams().enumerate() {
        out.extend(subject_counts(js, &stream, &SendPartitions::dlq_all(partition)).await?);
    }
    Ok(out)
}

/// Messages currently stored on exactly `subject` in `stream` (0 if none).
pub async fn subject_depth(js: &jetstream::Context, stream: &str, subject: &str) -> Result<u64, OpsError> {
    // Wildcards allowed: the sum over every matching subject.
    Ok(subject_counts(js, stream, subject).await?.values().sum())
}

/// The oldest message stored on `subject` (wildcards allowed), if any.
pub async fn first_message(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
) -> Result<Option<StreamMessage>, OpsError> {
    use async_nats::jetstream::stream::RawMessageErrorKind;
    let handle = js.get_stream(stream).await.map_err(|e| OpsError::nats(stream, e))?;
    match handle.get_first_raw_message_by_subject(subject, 1).await {
        Ok(msg) => Ok(Some(msg)),
        Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(OpsError::nats(stream, e)),
    }
}

/// Deletes one message by sequence. Returns false when it was already gone.
pub async fn delete(js: &jetstream::Context, stream: &str, sequence: u64) -> Result<bool, OpsError> {
    let handle = js.get_stream(stream).await.map_err(|e| OpsError::nats(stream, e))?;
    match handle.delete_message(sequence).await {
        Ok(deleted) => Ok(deleted),
        Err(e) if e.to_string().contains("no message found") || e.to_string().contains("not found") => Ok(false),
        Err(e) => Err(OpsError::nats(stream, e)),
    }
}
