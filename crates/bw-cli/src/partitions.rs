//! `bwctl partitions` (every partition stream, its leader and last delivery) and `bwctl send repartition`; the
//! administrator's connection that the repartitions share.

use crate::exit::{EXIT_ABORTED, confirm};
use crate::fmt;
use anyhow::Context as _;
use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_common::time::now_ms;
use clap::{Args, Subcommand};
use std::io::Write;

/// The new count of a repartition.
#[derive(Debug, Args)]
pub struct RepartitionArgs {
    /// The new partition count (1 to 64).
    #[arg(long)]
    pub to: usize,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Subcommand)]
pub enum SendCommand {
    /// Change the send partition count (`nats.send_partitions`: BW_SEND and BW_DLQ) of a DRAINED, STOPPED
    /// deployment: refuses while any BW_SEND or BW_DLQ partition holds a message, then replaces the (empty)
    /// streams by the new count's. Needs a NATS user allowed to create and delete streams (an administrator's).
    Repartition(RepartitionArgs),
}

/// After the operator confirmed `what` (or gave --yes): a JetStream context on `nats` without opening the
/// topology (a repartition runs while it is incomplete). None when not confirmed.
pub(crate) async fn confirmed_admin(
    nats: &bw_common::config::NatsConfig,
    yes: bool,
    what: &str,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<Option<jetstream::Context>> {
    if !confirm(yes, what, out)? {
        return Ok(None);
    }
    let client = bw_common::nats::connect(nats, "bwctl", std::time::Duration::from_secs(5)).await?;
    Ok(Some(jetstream::new(client)))
}

/// `bwctl send repartition --to M`.
pub(crate) async fn repartition_send(
    nats: &bw_common::config::NatsConfig,
    to: usize,
    yes: bool,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let what = format!(
        "replace the empty BW_SEND and BW_DLQ streams by {to} partitions of each; every Breakwater service must be \
         stopped, and started again with nats.send_partitions = {to}"
    );
    let Some(js) = confirmed_admin(nats, yes, &what, out).await? else {
        return Ok(EXIT_ABORTED);
    };
    let report = bw_ops::repartition::repartition_send(&js, to).await?;
    writeln!(out, "send partitions: {} -> {}", report.from, report.to)?;
    writeln!(out, "deleted (empty): {}", report.deleted.join(", "))?;
    writeln!(out, "created: {}", report.created.join(", "))?;
    writeln!(
        out,
        "start every service with nats.send_partitions = {to} (BW_<SERVICE>__NATS__SEND_PARTITIONS), check \
         dispatch.partitions, and grant the NATS users the new partitions: scripts/nats-accounts.sh <ledger> --send {to}"
    )?;
    Ok(0)
}

/// `bwctl partitions`: one row per partition stream.
pub(crate) async fn partitions(
    js: &jetstream::Context,
    buckets: &Buckets,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let now = now_ms();
    let send = buckets.send;
    let mut streams: Vec<(&str, usize, String)> = Vec::new();
    streams.extend(send.streams().enumerate().map(|(p, s)| ("send", p, s)));
    streams.extend(send.dlq_streams().enumerate().map(|(p, s)| ("dlq", p, s)));
    streams.extend(buckets.ledger.iter().enumerate().map(|(p, s)| ("ledger", p, s.stream_name.clone())));
    let mut rows = Vec::new();
    for (kind, partition, name) in streams {
        let stream = js.get_stream(&name).await.with_context(|| format!("stream `{name}`"))?;
        let info = stream.cached_info();
        let leader = info.cluster.as_ref().and_then(|c| c.leader.clone()).unwrap_or_else(|| "-".into());
        let mut last_delivery = "-".to_string();
        if kind == "send" {
            // The latest delivery to any dispatcher lane consumer of this partition.
            let lanes = bw_common::nats::dispatcher_lanes(&stream).await.unwrap_or_default();
            last_delivery = match lanes.iter().filter_map(|l| l.last).max() {
                Some(ms) => format!("{} ago", fmt::age(now - ms)),
                None => "never".into(),
            };
        }
        rows.push(vec![
            kind.to_string(),
            partition.to_string(),
            name,
            info.state.messages.to_string(),
            leader,
            last_delivery,
        ]);
    }
    let header = ["KIND", "PARTITION", "STREAM", "MESSAGES", "LEADER", "LAST-DELIVERY"];
    write!(out, "{}", fmt::table(&header, &rows))?;
    writeln!(out, "send partitions: {}, ledger partitions: {}", send.count(), buckets.ledger.len())?;
    Ok(0)
}
