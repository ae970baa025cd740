//! `bwctl ledger repartition` (the ledger's partition count) and `bwctl ledger migrate-tenants` (entries from
//! before tenants to their tenant's key).

use crate::exit::{EXIT_ABORTED, confirm};
use crate::partitions::{RepartitionArgs, confirmed_admin};
use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_wire::names;
use clap::Subcommand;
use std::io::Write;

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Change the ledger's partition count (`nats.ledger_partitions`) of a STOPPED deployment: moves every
    /// entry and wamid link to its partition under the new count, then every service must start with it.
    /// Needs a NATS user allowed to create, update and delete streams (an administrator's). Safe to run
    /// again after an interruption; services refuse to start while it is under way.
    Repartition(RepartitionArgs),
    /// Move ledger entries from before tenants (keyed by the bare operation id) whose number the registry gives
    /// a tenant other than `default` to that tenant's key (`<tenant>/<id>`), re-pointing their wamid links.
    /// Refuses while BW_SEND, BW_DLQ, BW_UNKNOWN or BW_QUARANTINE hold a message of such a number. Safe to run
    /// again; entries of `default` and of unregistered numbers stay as they are.
    MigrateTenants {
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// `bwctl ledger repartition --to M`.
pub(crate) async fn repartition(
    nats: &bw_common::config::NatsConfig,
    to: usize,
    yes: bool,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let what = format!(
        "move every ledger entry and wamid link to its partition under {to} partitions; every Breakwater service \
         must be stopped, and started again with nats.ledger_partitions = {to}"
    );
    let Some(js) = confirmed_admin(nats, yes, &what, out).await? else {
        return Ok(EXIT_ABORTED);
    };
    let report = bw_ops::repartition::repartition_ledger(&js, to).await?;
    let from = report.from.map(|n| n.to_string()).unwrap_or_else(|| "? (an interrupted repartition)".into());
    writeln!(out, "ledger partitions: {from} -> {}", report.to)?;
    writeln!(
        out,
        "moved {} entries and {} wamid links; {} already in place",
        report.entries_moved, report.links_moved, report.kept
    )?;
    if !report.created.is_empty() {
        writeln!(out, "created: {}", report.created.join(", "))?;
    }
    if !report.deleted.is_empty() {
        writeln!(out, "deleted (empty): {}", report.deleted.join(", "))?;
    }
    writeln!(
        out,
        "start every service with nats.ledger_partitions = {to} (BW_<SERVICE>__NATS__LEDGER_PARTITIONS), and \
         grant the NATS users the new partitions: scripts/nats-accounts.sh {to}"
    )?;
    Ok(0)
}

/// `bwctl ledger migrate-tenants`.
pub(crate) async fn migrate_tenants(
    js: &jetstream::Context,
    buckets: &Buckets,
    yes: bool,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    if js.get_key_value(names::SENDERS_BUCKET).await.is_err() {
        anyhow::bail!("no sender is registered (bwctl senders add): there is no tenant to move entries to");
    }
    let registry = bw_common::registry::Registry::open(js, 1).await?;
    let what = "move every ledger entry from before tenants whose number belongs to a tenant other than `default` \
                to that tenant's key";
    if !confirm(yes, what, out)? {
        return Ok(EXIT_ABORTED);
    }
    let report = bw_ops::tenants::migrate_tenants(js, buckets, &registry).await?;
    let per_tenant: Vec<String> = report.moved.iter().map(|(t, n)| format!("{t} {n}")).collect();
    writeln!(
        out,
        "moved {} entries to their tenant's key{}; re-pointed {} wamid links",
        report.moved_total(),
        if per_tenant.is_empty() { String::new() } else { format!(" ({})", per_tenant.join(", ")) },
        report.links
    )?;
    writeln!(
        out,
        "left as they are: {} of tenant `default`, {} already under a tenant key, {} of unregistered numbers",
        report.default_tenant, report.keyed, report.unregistered
    )?;
    if report.unregistered > 0 {
        writeln!(out, "register those numbers (bwctl senders add) and run this again to move their entries")?;
    }
    if !report.corrupt.is_empty() {
        writeln!(out, "undecodable entries left alone (bwctl op <id>): {}", report.corrupt.join(", "))?;
        return Ok(1);
    }
    Ok(0)
}
