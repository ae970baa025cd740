//! The command line: global options and the top-level commands; each command's own arguments live in its module.

use crate::coordinator::{BreakerCommand, OperatorToken, PauseCommand};
use crate::dlq::DlqCommand;
use crate::ledger::LedgerCommand;
use crate::limits::{TemplatePaceCommand, ThroughputCommand};
use crate::partitions::SendCommand;
use crate::quarantine::QuarantineCommand;
use crate::{op, senders, signals};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bwctl", about = "Breakwater operator CLI", version)]
pub struct Cli {
    /// NATS server URL(s), comma-separated.
    #[arg(long, env = "BW_NATS_URL", default_value = "nats://127.0.0.1:4222", global = true)]
    pub nats_url: String,
    /// PEM file of the CA of the NATS servers' certificates: the connection then requires TLS (the Kubernetes
    /// NATS cluster, reached through `kubectl port-forward`: its certificate names `localhost`).
    #[arg(long, env = "BW_NATS_TLS_CA", global = true)]
    pub nats_tls_ca: Option<String>,
    /// Base URL of the breaker-coordinator admin API.
    #[arg(long, env = "BW_COORDINATOR_URL", default_value = "http://127.0.0.1:9103", global = true)]
    pub coordinator_url: String,
    /// Operator token for the coordinator's state-changing routes (sent as a bearer token, never printed).
    /// Prefer the environment variable: a flag shows in the shell history and the process list.
    #[arg(long, env = "BW_OPERATOR_TOKEN", hide_env_values = true, global = true)]
    pub operator_token: Option<OperatorToken>,
    /// The breaker's Redis, where template holds live (`bwctl quarantine ls|release`). A single node; its URL
    /// may hold a password, so its environment value is never shown.
    #[arg(long, env = "BW_REDIS_URL", hide_env_values = true, default_value = "redis://127.0.0.1:6379", global = true)]
    pub redis_url: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List scopes and their breaker states (from BW_SCOPES), then every pause that holds a scope: its number's,
    /// its WABA's, its app's, its token's (code, since, until or what lifts it, who set it), then each business
    /// portfolio's messaging-limit budget (used, limit, who set it, what it holds), then the numbers' stated
    /// throughput and the templates paced while RED.
    Scopes,
    /// A number's throughput as Meta stated it (THROUGHPUT_UPGRADE): show it, or clear it so the configured rate
    /// applies again (audited).
    #[command(subcommand)]
    Throughput(ThroughputCommand),
    /// A template's marketing pace while Meta rates it RED: show it, or clear it (audited).
    #[command(subcommand)]
    TemplatePace(TemplatePaceCommand),
    /// Dead-letter queue.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Quarantine.
    #[command(subcommand)]
    Quarantine(QuarantineCommand),
    /// Breaker overrides (through the breaker-coordinator admin API).
    #[command(subcommand)]
    Breaker(BreakerCommand),
    /// Pauses of a number, WABA, app or token (through the breaker-coordinator admin API).
    #[command(subcommand)]
    Pause(PauseCommand),
    /// Print the sha256 (hex) of an operator token read from standard input, for the coordinator's
    /// `operator.token_sha256` (the token itself is never printed).
    OperatorTokenHash,
    /// One operation's state and journey (ledger + outcome feed), personal data masked; exits 1 if unknown.
    Op(op::OpArgs),
    /// Every partition of BW_SEND, BW_DLQ and the ledger (`nats.send_partitions`, `nats.ledger_partitions`): its
    /// stream, messages, cluster leader and, for BW_SEND, when a dispatcher last took a message from it (an
    /// unserved partition shows messages and no recent delivery).
    Partitions,
    /// The ledger's partitions.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// BW_SEND's and the DLQ's partitions.
    #[command(subcommand)]
    Send(SendCommand),
    /// The sender registry: which tenant (producer) owns which number, and the producers' NATS users.
    #[command(subcommand)]
    Senders(senders::SendersCommand),
    /// The newest account signals Meta sent (restrictions, bans, tiers, templates, alerts...: BW_ACCOUNT), users as
    /// hashes; deploy/runbooks/account-signals.md.
    Signals(signals::SignalsArgs),
    /// Prove every accepted operation is in exactly one place; exits 2 when any is lost.
    Account {
        /// File with operation ids a producer got accepted, one per line; any missing counts as lost.
        #[arg(long)]
        expected: Option<std::path::PathBuf>,
    },
}

impl Cli {
    /// The NATS connection the command line asks for.
    pub fn nats_config(&self) -> bw_common::config::NatsConfig {
        bw_common::config::NatsConfig {
            tls_ca_file: self.nats_tls_ca.clone().unwrap_or_default(),
            ..bw_common::config::NatsConfig::single(self.nats_url.clone(), "bwctl")
        }
    }
}
