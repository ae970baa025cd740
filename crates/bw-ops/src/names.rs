//! Names used only by replay and the operator tools.
//!
//! These belong next to the others in `bw_common::names`; they live here until the lead moves them.

/// KV bucket of replay leases: key phone_number_id, value `<instance>|<expires unix ms>`. The lease makes one
/// replay instance at a time drain a scope, so the per-scope replay rate holds across instances.
pub const REPLAY_LEASE_BUCKET: &str = "BW_REPLAY_LEASES";

/// Durable consumer of replay on BW_DLQ for one scope (filter `bw.dlq.v1.<phone>`). Work-queue streams need
/// non-overlapping filters, so there is exactly one per scope and every replay instance binds to it.
pub fn replay_consumer(phone_number_id: &str) -> String {
    format!("replay-{phone_number_id}")
}

/// Nats-Msg-Id of the `replay`-th replay of an operation into the replay lane. A redelivered or repeated
/// replay of the same DLQ entry reuses the number, so JetStream drops the second publish.
pub fn replay_msg_id(operation_id: &str, replay: u32) -> String {
    format!("{operation_id}.r{replay}")
}

/// Nats-Msg-Id of a quarantine entry written by replay or the CLI.
pub fn quarantine_msg_id(operation_id: &str, replays: u32, reason: &str) -> String {
    format!("{operation_id}.q{replays}.{reason}")
}

/// Header carrying the replay number on replay-lane messages (informational).
pub const REPLAY_HEADER: &str = "Bw-Replay";

/// Header set on a quarantine entry that holds undecodable bytes from another stream.
pub const UNDECODABLE_HEADER: &str = "Bw-Undecodable";

/// The phone_number_id of a `bw.<domain>.v1.[<lane>.]<phone>` subject: its last token.
pub fn phone_of_subject(subject: &str) -> &str {
    subject.rsplit('.').next().unwrap_or(subject)
}
