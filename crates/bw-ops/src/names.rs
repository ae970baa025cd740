//! Names used by replay and the operator tools: they live in `bw_common::names` with every other name; this
//! module re-exports them for the crates that import them from here.

pub use bw_common::names::{
    REPLAY_HEADER, REPLAY_LEASE_BUCKET, UNDECODABLE_HEADER, phone_of_subject, quarantine_msg_id, replay_class_consumer,
    replay_consumer, replay_msg_id,
};
