//! Breakwater's wire addressing: what a producer client and every service must agree on besides the messages
//! themselves (`bw-proto`). [`names`]: every subject, stream, consumer, bucket, header and key name;
//! [`tenancy`]: operation keys, feed subjects, inboxes and NATS users per tenant; [`trace`]: the W3C trace
//! context in NATS headers.
//!
//! A leaf: it depends on `bw-proto` and no other crate of ours, so `bw-client` links it without the services'
//! plumbing (`bw-common`, which re-exports `names` and `tenancy` under their old paths).

pub mod names;
pub mod tenancy;
pub mod trace;
