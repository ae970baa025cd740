//! The audit stream `BW_AUDIT` (`bw_wire::names`): one JSON message per operator action and outcome (the
//! console's and bwctl's), on `bw.audit.v1.<action>`: who (the key's name or the proxy's user) with their role, what, when, on which scope,
//! and how it ended. Scopes are phone_number_ids, incident ids, operation keys and quarantine scope keys;
//! free texts (reasons) have their digit runs masked. No recipient, token or key ever goes in.

use async_nats::jetstream;
use bw_wire::names;
use std::collections::BTreeMap;

/// How long audit entries are kept.
const KEEP: std::time::Duration = std::time::Duration::from_secs(400 * 24 * 3600);

/// One audit entry.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Entry {
    pub at_unix_ms: i64,
    pub who: String,
    pub role: String,
    pub action: String,
    /// `requested`, then `done`, `refused` or `failed`.
    pub outcome: String,
    pub scope: BTreeMap<String, String>,
    pub detail: String,
}

/// Creates the audit stream when it does not exist.
pub async fn ensure_stream(js: &jetstream::Context, replicas: usize) -> anyhow::Result<()> {
    let config = jetstream::stream::Config {
        name: names::AUDIT_STREAM.to_string(),
        subjects: vec![names::AUDIT_SUBJECTS.to_string()],
        max_age: KEEP,
        num_replicas: replicas.max(1),
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    };
    js.get_or_create_stream(config).await.map_err(|e| anyhow::anyhow!("audit stream {}: {e}", names::AUDIT_STREAM))?;
    Ok(())
}

/// Writes `entry` and waits for the stream's acknowledgement.
pub async fn write(js: &jetstream::Context, entry: &Entry) -> anyhow::Result<()> {
    let mut entry = entry.clone();
    entry.detail = crate::views::mask_digits(&entry.detail);
    let body = serde_json::to_vec(&entry)?;
    js.publish(names::audit_subject(&entry.action), body.into())
        .await
        .map_err(|e| anyhow::anyhow!("audit publish: {e}"))?
        .await
        .map_err(|e| anyhow::anyhow!("audit ack: {e}"))?;
    Ok(())
}

/// Every audit entry, oldest first (for tests and the docs' example).
pub async fn read_all(js: &jetstream::Context) -> anyhow::Result<Vec<Entry>> {
    let messages = crate::scan::scan_stream(js, names::AUDIT_STREAM, names::AUDIT_SUBJECTS).await?;
    Ok(messages.iter().filter_map(|m| serde_json::from_slice(&m.payload).ok()).collect())
}
