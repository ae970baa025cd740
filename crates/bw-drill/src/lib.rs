//! The flash-sale drill: Breakwater's main job on a laptop.
//!
//! It starts real `nats-server` and `redis-server` processes in a fresh directory, the Meta simulator with the
//! flash-sale outage scenario, every service as its own OS process (several dispatchers and replay workers),
//! then a producer publishing a mixed load across several sender numbers. While it runs it prints a live view
//! (progress, breaker states, DLQ depth); at the end it proves the outcome with the accounting check and the
//! simulator's oracle, and writes `report.json`, `timeline.svg` and `report.html` to the drill directory.
//!
//! Must not: claim success from logs; "lost" comes only from `bw_ops::account_expected`, duplicates only from
//! the simulator's oracle.
//!
//! Entry point: [`run`], in phases: [`setup`] (plan, start the stack), [`drive`] (the load until it settles),
//! [`finish`] (evidence, [`report`] and [`render`]). [`model`] is the report as data, a leaf.

// The report's JSON literal is large.
#![recursion_limit = "512"]

pub mod budget;
pub mod chaos;
pub mod chart;
pub mod drive;
pub mod errors;
pub mod figures;
pub mod finish;
pub mod html;
pub mod journey;
pub mod model;
pub mod observe;
pub mod options;
pub mod producer;
pub mod render;
pub mod report;
pub mod scoped;
pub mod setup;
pub mod stack;
pub mod stuck;
pub mod validation;

pub use model::DrillReport;
pub use observe::{Depths, depths};
pub use options::DrillOptions;

/// Runs the drill and returns its report (also written to `opts.dir`).
pub async fn run(opts: DrillOptions) -> anyhow::Result<DrillReport> {
    bw_common::crypto::install_crypto();
    let plan = setup::plan(opts)?;
    let mut stack = setup::start(&plan.opts, &plan.scenario).await?;
    let live = observe::Live::connect(&stack.nats_url).await?;
    let drive = drive::drive(&plan, &mut stack, &live).await?;
    finish::finish(&plan, stack, drive, live).await
}
