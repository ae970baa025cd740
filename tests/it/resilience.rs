//! Resilience suite: the failures Breakwater must survive without losing a message, each under load and each
//! judged by the accounting check (`bw_ops::account::account_expected`: every accepted operation is in exactly
//! one place) and the simulator's oracle (how often Meta accepted each operation).
//!
//! - `processes`: kill -9 of real dispatcher and replay processes (the binaries, spawned by `bw_drill::stack`);
//! - `servers`: nats-server restart, a 3-node NATS cluster losing its stream leader, Redis restart and outage;
//! - `meta`: Meta hanging past the client timeout, and a burst of 10,000 (or 100,000) messages;
//! - `journal`: the wire journal (`dispatch.wire_guarantee = "journal"`): kill -9 at each crash point and two
//!   owners racing at take-over;
//! - `order`: per-recipient order across a kill -9 of one of two dispatcher processes;
//! - `clusters`: a 3-node NATS cluster, a 3-master Redis Cluster and two processes of every service through a
//!   Meta outage (breaker trip, DLQ, replay) with one NATS node and one Redis master killed.
//!
//! The process tests need the service binaries next to the test binary: run
//! `cargo build -p bw-dispatcher -p bw-ingest -p bw-replay -p bw-breaker-coordinator` first.

mod clusters;
mod common;
mod journal;
mod meta;
mod order;
mod processes;
mod servers;
mod stall;
