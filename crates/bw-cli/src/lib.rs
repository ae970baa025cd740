//! `bwctl`, the operator CLI: scopes and breaker states, DLQ and quarantine statistics (the DLQ's also per
//! breaker incident, [`dlq`]) and (masked) inspection, replay now (or exactly one incident, [`dlq`]), purge with
//! confirmation, breaker overrides through the coordinator's admin API ([`coordinator`]), the accounting check,
//! the sender registry with the producers' NATS users generated from it ([`senders`]), and Meta's stated
//! throughput of a number and a template's RED pace, shown and cleared ([`limits`]).
//!
//! It reads the work-queue streams without consuming them and moves entries only through `bw_ops`, so it
//! obeys the same ledger rules as the replay service and can run alongside it. It never prints recipients in
//! clear or message bodies. Entry point: [`run`], which returns the process exit code; each command lives in
//! its own module, which owns its arguments.

pub mod account;
pub mod budget;
pub mod cli;
pub mod conn;
pub mod coordinator;
pub mod dlq;
pub mod exit;
pub mod fmt;
pub mod ledger;
pub mod limits;
pub mod op;
pub mod partitions;
pub mod quarantine;
pub mod scopes;
pub mod senders;
pub mod signals;
pub mod stats;

pub use cli::{Cli, Command};
pub use conn::{Conn, connect, connect_with};
pub use coordinator::{OperatorToken, operator_token_hash};
pub use exit::{EXIT_ABORTED, EXIT_LOST};

use ledger::LedgerCommand;
use partitions::{RepartitionArgs, SendCommand};
use std::io::{BufRead, Write};

/// Runs one command, writing its report to `out`; returns the exit code.
pub async fn run(cli: Cli, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    if let Command::Breaker(cmd) = &cli.command {
        return coordinator::breaker(&cli.coordinator_url, cli.operator_token.as_ref(), cmd, out).await;
    }
    if let Command::Senders(cmd) = &cli.command {
        return senders::run(&cli.nats_url, cmd, out).await;
    }
    if let Command::Pause(cmd) = &cli.command {
        return coordinator::pause(&cli.coordinator_url, cli.operator_token.as_ref(), cmd, out).await;
    }
    if let Command::Ledger(LedgerCommand::Repartition(RepartitionArgs { to, yes })) = &cli.command {
        // Not through `connect`: while a repartition is under way the ledger does not say its partition count.
        return ledger::repartition(&cli.nats_config(), *to, *yes, out).await;
    }
    if let Command::Send(SendCommand::Repartition(RepartitionArgs { to, yes })) = &cli.command {
        return partitions::repartition_send(&cli.nats_config(), *to, *yes, out).await;
    }
    if let Command::OperatorTokenHash = &cli.command {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        let token: OperatorToken = line.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        writeln!(out, "{}", operator_token_hash(token.expose()))?;
        return Ok(0);
    }
    let conn = connect_with(&cli.nats_config()).await?;
    let (js, buckets) = (&conn.js, &conn.buckets);
    match cli.command {
        Command::Scopes => scopes::scopes(buckets, &cli.redis_url, out).await,
        Command::Signals(args) => signals::run(js, &args, out).await,
        Command::Partitions => partitions::partitions(js, buckets, out).await,
        Command::Dlq(cmd) => dlq::run(js, buckets, cmd, out).await,
        Command::Quarantine(cmd) => quarantine::run(js, buckets, &cli.redis_url, cmd, out).await,
        Command::Account { expected } => account::run(js, buckets, expected, out).await,
        Command::Op(args) => op::run(js, buckets, &args, out).await,
        Command::Throughput(cmd) => limits::throughput(js, buckets, &cli.redis_url, &cmd, out).await,
        Command::TemplatePace(cmd) => limits::template_pace(js, &cli.redis_url, &cmd, out).await,
        Command::Ledger(LedgerCommand::MigrateTenants { yes }) => ledger::migrate_tenants(js, buckets, yes, out).await,
        Command::Breaker(_)
        | Command::Pause(_)
        | Command::OperatorTokenHash
        | Command::Ledger(LedgerCommand::Repartition(_))
        | Command::Send(_)
        | Command::Senders(_) => Ok(0),
    }
}
