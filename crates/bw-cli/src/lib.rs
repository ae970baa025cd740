//! `bwctl`, the operator CLI: scopes and breaker states, DLQ and quarantine statistics (the DLQ's also per
//! breaker incident, [`dlq`]) and (masked) inspection, replay now (or exactly one incident, [`dlq`]), purge with
//! confirmation, breaker overrides through the coordinator's admin API, the accounting check, and the sender
//! registry with the producers' NATS users generated from it ([`senders`]).
//!
//! It reads the work-queue streams without consuming them and moves entries only through `bw_ops`, so it
//! obeys the same ledger rules as the replay service and can run alongside it. It never prints recipients in
//! clear or message bodies. Entry point: [`run`], which returns the process exit code.

pub mod budget;
pub mod dlq;
pub mod fmt;
pub mod op;
pub mod quarantine;
pub mod senders;
pub mod signals;

use anyhow::Context as _;
use async_nats::jetstream;
use bw_common::names;
use bw_common::nats::Buckets;
use bw_common::proto::BreakerState;
use bw_common::time::now_ms;
use bw_ops::inspect::{self, QueueStats, dlq_reason_label, masked, quarantine_reason_label};
use bw_ops::ops::{self, BatchReport, QuarantineFilter};
use clap::{Args, Parser, Subcommand};
use std::io::{BufRead, Write};

/// Exit code when accounting finds lost operations.
pub const EXIT_LOST: i32 = 2;
/// Exit code when the operator did not confirm.
pub const EXIT_ABORTED: i32 = 3;

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
    /// portfolio's messaging-limit budget (used, limit, who set it, what it holds).
    Scopes,
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

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Depth, oldest age and reasons per scope, then per breaker incident (depth, held for manual release,
    /// oldest, categories).
    Stats(ScopeArg),
    /// Entries, personal data masked.
    Inspect {
        #[command(flatten)]
        scope: ScopeArg,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Replay now into the replay lane (same operation ids; the ledger prevents duplicates).
    Replay {
        #[command(flatten)]
        scope: ScopeArg,
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Entries moved per second.
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
        /// Also replay scopes whose breaker is not CLOSED.
        #[arg(long)]
        force: bool,
        /// Replay exactly the entries of this breaker incident (as `dlq stats` shows it), in per-recipient
        /// acceptance order, releasing it if replay holds it; prints the incident's report.
        #[arg(long)]
        incident: Option<String>,
    },
    /// Remove entries for good: each ends EXPIRED in the ledger ("purged by operator from dlq").
    Purge {
        #[command(flatten)]
        scope: ScopeArg,
        #[arg(long, default_value_t = usize::MAX, hide_default_value = true)]
        limit: usize,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// Depth, oldest age and reasons per scope.
    Stats(ScopeArg),
    /// Quarantine scopes (a held template, an unclassified code): messages, code, age, and the hold.
    Ls,
    /// Lift a scope's hold and re-queue each of its held messages once.
    Release {
        /// The scope key as `ls` prints it: `tpl:<waba_id>:<language>:<name>` or `code:<code>`.
        #[arg(long)]
        scope: String,
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
    },
    /// End every message held under a scope FAILED, never sent, with the reason in its ledger entry.
    Drop {
        /// The scope key as `ls` prints it.
        #[arg(long)]
        scope: String,
        /// Why (kept in each message's ledger entry, shown to its producer).
        #[arg(long)]
        reason: String,
        #[arg(long)]
        yes: bool,
    },
    /// Entries, personal data masked.
    Inspect {
        #[command(flatten)]
        select: QuarantineSelect,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Replay now into the replay lane (the replay limit does not apply; deadline and 24 h window do).
    Replay {
        #[command(flatten)]
        select: QuarantineSelect,
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
    },
    /// Remove entries for good: each ends EXPIRED in the ledger ("purged by operator from quarantined").
    Purge {
        #[command(flatten)]
        select: QuarantineSelect,
        #[arg(long, default_value_t = usize::MAX, hide_default_value = true)]
        limit: usize,
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum BreakerCommand {
    /// Force the breaker OPEN (nothing is sent for the scope until cleared).
    ForceOpen(BreakerArgs),
    /// Force the breaker CLOSED (failures no longer trip it until cleared).
    ForceClosed(BreakerArgs),
    /// Remove an override; the breaker decides again.
    Clear(BreakerArgs),
    /// Wipe window, counters, pause, incident and override: the scope is CLOSED at full rate.
    Reset(BreakerArgs),
    /// Which coordinator instance holds the leader lease (read-only; no token needed).
    Leader,
}

/// An operator token: its `Debug` is redacted so it never reaches output or logs.
#[derive(Clone)]
pub struct OperatorToken(String);

impl OperatorToken {
    /// The token, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperatorToken(<redacted>)")
    }
}

impl std::str::FromStr for OperatorToken {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.is_empty() || t.len() > 1024 || t.chars().any(|c| c.is_control() || c == ' ') {
            return Err("the operator token must be 1 to 1024 printable characters without spaces".into());
        }
        Ok(OperatorToken(t.to_string()))
    }
}

/// Lower-case hex sha256 of an operator token, as `operator.token_sha256` wants it.
pub fn operator_token_hash(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.trim().as_bytes()))
}

#[derive(Debug, Subcommand)]
pub enum PauseCommand {
    /// Pause one scope (every message it covers waits; replay too) for `--for-ms`, or until lifted.
    Set(PauseArgs),
    /// Lift the pause of one scope, whoever set it (Meta's answer, a webhook, an operator).
    Lift(PauseArgs),
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    /// number, waba, app or token.
    #[arg(long)]
    pub level: String,
    /// The phone_number_id, WABA id, app id, or the token's fingerprint (as `bwctl scopes` shows it).
    #[arg(long)]
    pub id: String,
    /// `set`: pause this many milliseconds (default: until lifted).
    #[arg(long)]
    pub for_ms: Option<u64>,
    /// Why (logged by the coordinator).
    #[arg(long, default_value = "operator")]
    pub reason: String,
}

#[derive(Debug, Args)]
pub struct BreakerArgs {
    /// phone_number_id of the scope.
    #[arg(long)]
    pub scope: String,
    /// Why (kept in the transition event).
    #[arg(long, default_value = "operator")]
    pub reason: String,
}

#[derive(Debug, Args, Clone, Default)]
pub struct ScopeArg {
    /// phone_number_id of one scope (default: every scope).
    #[arg(long)]
    pub scope: Option<String>,
}

#[derive(Debug, Args, Clone, Default)]
pub struct QuarantineSelect {
    #[arg(long)]
    pub scope: Option<String>,
    /// permanent_error, poison, unknown_review, window_closed, operator, sender_revoked.
    #[arg(long)]
    pub reason: Option<String>,
    /// Operation ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<String>,
}

impl QuarantineSelect {
    fn filter(&self) -> anyhow::Result<QuarantineFilter> {
        let reason = match &self.reason {
            Some(label) => Some(
                inspect::parse_quarantine_reason(label)
                    .with_context(|| format!("unknown quarantine reason `{label}`"))?,
            ),
            None => None,
        };
        Ok(QuarantineFilter { scope: self.scope.clone(), reason, operation_ids: self.ids.clone() })
    }
}

/// Connections of one CLI run.
pub struct Conn {
    pub js: jetstream::Context,
    pub buckets: Buckets,
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

/// Opens the existing buckets (the CLI never creates topology).
pub async fn connect(nats_url: &str) -> anyhow::Result<Conn> {
    connect_with(&bw_common::config::NatsConfig::single(nats_url.to_string(), "bwctl")).await
}

/// [`connect`] with a whole NATS config (TLS).
pub async fn connect_with(cfg: &bw_common::config::NatsConfig) -> anyhow::Result<Conn> {
    let client = bw_common::nats::connect(cfg, "bwctl", std::time::Duration::from_secs(5)).await?;
    let js = jetstream::new(client);
    let open = |name: String| {
        let js = js.clone();
        async move {
            js.get_key_value(&name)
                .await
                .with_context(|| format!("kv bucket `{name}` not found; is Breakwater running?"))
        }
    };
    // Every ledger partition: partition 0 records how many there are.
    let first = open(names::ledger_bucket(0)).await?;
    let partitions = bw_common::nats::ledger_partitions_of(&first).with_context(|| {
        format!("kv bucket `{}` does not say how many ledger partitions exist", names::LEDGER_BUCKET)
    })?;
    let mut ledger = vec![first];
    for partition in 1..partitions {
        ledger.push(open(names::ledger_bucket(partition)).await?);
    }
    let mut wamid = Vec::with_capacity(partitions);
    for partition in 0..partitions {
        wamid.push(open(names::wamid_bucket(partition)).await?);
    }
    let buckets = Buckets {
        send: bw_common::nats::send_partitions(&js).await?,
        ledger,
        wamid,
        scopes: open(names::SCOPES_BUCKET.into()).await?,
        webhook_dedup: open(names::WEBHOOK_DEDUP_BUCKET.into()).await?,
    };
    Ok(Conn { js, buckets })
}

/// Runs one command, writing its report to `out`; returns the exit code.
pub async fn run(cli: Cli, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    if let Command::Breaker(cmd) = &cli.command {
        return breaker(&cli.coordinator_url, cli.operator_token.as_ref(), cmd, out).await;
    }
    if let Command::Senders(cmd) = &cli.command {
        return senders::run(&cli.nats_url, cmd, out).await;
    }
    if let Command::Pause(cmd) = &cli.command {
        return pause(&cli.coordinator_url, cli.operator_token.as_ref(), cmd, out).await;
    }
    if let Command::Ledger(LedgerCommand::Repartition(RepartitionArgs { to, yes })) = &cli.command {
        // Not through `connect`: while a repartition is under way the ledger does not say its partition count.
        return repartition(&cli.nats_config(), *to, *yes, out).await;
    }
    if let Command::Send(SendCommand::Repartition(RepartitionArgs { to, yes })) = &cli.command {
        return repartition_send(&cli.nats_config(), *to, *yes, out).await;
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
        Command::Scopes => {
            let code = scopes(buckets, out).await?;
            budget::show(&cli.redis_url, out).await?;
            Ok(code)
        }
        Command::Signals(args) => signals::run(js, &args, out).await,
        Command::Partitions => partitions(js, buckets, out).await,
        Command::Dlq(DlqCommand::Stats(s)) => {
            let (items, bad) = inspect::dlq_items(js, buckets.send, s.scope.as_deref()).await?;
            let code = write_stats(out, &inspect::dlq_stats(&items), bad.len())?;
            writeln!(out)?;
            dlq::write_incident_stats(js, &items, out).await?;
            Ok(code)
        }
        Command::Quarantine(QuarantineCommand::Stats(s)) => {
            let (items, bad) = inspect::quarantine_items(js, s.scope.as_deref()).await?;
            write_stats(out, &inspect::quarantine_stats(&items), bad.len())
        }
        Command::Dlq(DlqCommand::Inspect { scope, limit }) => {
            let (items, _) = inspect::dlq_items(js, buckets.send, scope.scope.as_deref()).await?;
            let rows = items
                .iter()
                .take(limit)
                .map(|i| {
                    let e = &i.envelope;
                    let m = masked(&e.request.clone().unwrap_or_default());
                    let code = e.last_error.as_ref().map(|x| x.meta_code.to_string()).unwrap_or_else(|| "-".into());
                    vec![
                        i.sequence.to_string(),
                        m.operation_id,
                        m.phone_number_id,
                        m.recipient,
                        m.category.into(),
                        m.payload,
                        dlq_reason_label(e.reason()).into(),
                        code,
                        e.replay_attempts.to_string(),
                        fmt::utc(e.dead_lettered_at_unix_ms),
                        fmt::utc(e.not_before_unix_ms),
                    ]
                })
                .collect::<Vec<_>>();
            let header = [
                "SEQ",
                "OPERATION",
                "SCOPE",
                "RECIPIENT",
                "CATEGORY",
                "PAYLOAD",
                "REASON",
                "CODE",
                "REPLAYS",
                "DEAD-LETTERED",
                "NOT-BEFORE",
            ];
            write!(out, "{}", fmt::table(&header, &rows))?;
            writeln!(out, "{} of {} shown", rows.len(), items.len())?;
            Ok(0)
        }
        Command::Quarantine(QuarantineCommand::Inspect { select, limit }) => {
            let filter = select.filter()?;
            let (items, _) = inspect::quarantine_items(js, filter.scope.as_deref()).await?;
            let rows = items
                .iter()
                .filter(|i| filter.reason.is_none_or(|r| i.entry.reason() == r))
                .filter(|i| {
                    filter.operation_ids.is_empty()
                        || filter
                            .operation_ids
                            .iter()
                            .any(|id| i.entry.request.as_ref().is_some_and(|r| &r.operation_id == id))
                })
                .take(limit)
                .map(|i| {
                    let m = masked(&i.entry.request.clone().unwrap_or_default());
                    let code = i.entry.error.as_ref().map(|x| x.meta_code.to_string()).unwrap_or_else(|| "-".into());
                    vec![
                        i.sequence.to_string(),
                        m.operation_id,
                        m.phone_number_id,
                        m.recipient,
                        m.category.into(),
                        m.payload,
                        quarantine_reason_label(i.entry.reason()).into(),
                        code,
                        i.entry.detail.clone(),
                        fmt::utc(i.entry.quarantined_at_unix_ms),
                    ]
                })
                .collect::<Vec<_>>();
            let header = [
                "SEQ",
                "OPERATION",
                "SCOPE",
                "RECIPIENT",
                "CATEGORY",
                "PAYLOAD",
                "REASON",
                "CODE",
                "DETAIL",
                "QUARANTINED",
            ];
            write!(out, "{}", fmt::table(&header, &rows))?;
            writeln!(out, "{} of {} shown", rows.len(), items.len())?;
            Ok(0)
        }
        Command::Dlq(DlqCommand::Replay { scope, limit, rate, force, incident }) => {
            anyhow::ensure!(rate > 0.0 && rate.is_finite(), "--rate must be a positive number");
            if let Some(id) = incident {
                let id = dlq::parse_incident(&id)?;
                return dlq::replay_incident(js, buckets, &id, scope.scope.as_deref(), rate, force, out).await;
            }
            let states = ops::scope_snapshots(buckets).await?;
            let allow = |phone: &str| {
                force
                    || states
                        .get(phone)
                        .is_some_and(|s| matches!(s.state(), BreakerState::Closed | BreakerState::ForcedClosed))
            };
            let held: Vec<String> =
                inspect::dlq_stats(&inspect::dlq_items(js, buckets.send, scope.scope.as_deref()).await?.0)
                    .into_iter()
                    .map(|s| s.scope)
                    .filter(|p| !allow(p))
                    .collect();
            for phone in &held {
                writeln!(out, "scope {phone}: breaker not CLOSED; skipped (use --force to replay anyway)")?;
            }
            let mut bar = fmt::ProgressBar::new("replay");
            let mut progress = |d: usize, t: usize| bar.update(d, t);
            let report =
                ops::replay_dlq_now(js, buckets, scope.scope.as_deref(), &allow, limit, rate, &mut progress).await?;
            write_batch(out, &report)
        }
        Command::Quarantine(QuarantineCommand::Ls) => quarantine::ls(js, &cli.redis_url, out).await,
        Command::Quarantine(QuarantineCommand::Release { scope, rate }) => {
            quarantine::release(js, buckets, &cli.redis_url, &scope, rate, out).await
        }
        Command::Quarantine(QuarantineCommand::Drop { scope, reason, yes }) => {
            quarantine::drop(js, buckets, &scope, &reason, yes, out).await
        }
        Command::Quarantine(QuarantineCommand::Replay { select, limit, rate }) => {
            anyhow::ensure!(rate > 0.0, "--rate must be positive");
            let filter = select.filter()?;
            let mut bar = fmt::ProgressBar::new("replay");
            let mut progress = |d: usize, t: usize| bar.update(d, t);
            let report = ops::replay_quarantine_now(js, buckets, &filter, limit, rate, &mut progress).await?;
            write_batch(out, &report)
        }
        Command::Dlq(DlqCommand::Purge { scope, limit, yes }) => {
            let n = inspect::dlq_items(js, buckets.send, scope.scope.as_deref()).await?.0.len().min(limit);
            if !confirm(yes, &format!("purge {n} DLQ entries (they end EXPIRED, never sent)"), out)? {
                return Ok(EXIT_ABORTED);
            }
            let mut bar = fmt::ProgressBar::new("purge");
            let mut progress = |d: usize, t: usize| bar.update(d, t);
            let report = ops::purge_dlq(js, buckets, scope.scope.as_deref(), limit, &mut progress).await?;
            write_batch(out, &report)
        }
        Command::Quarantine(QuarantineCommand::Purge { select, limit, yes }) => {
            let filter = select.filter()?;
            let (items, _) = inspect::quarantine_items(js, filter.scope.as_deref()).await?;
            let n = items.iter().filter(|i| filter.reason.is_none_or(|r| i.entry.reason() == r)).count().min(limit);
            if !confirm(yes, &format!("purge up to {n} quarantine entries (they end EXPIRED, never sent)"), out)? {
                return Ok(EXIT_ABORTED);
            }
            let mut bar = fmt::ProgressBar::new("purge");
            let mut progress = |d: usize, t: usize| bar.update(d, t);
            let report = ops::purge_quarantine(js, buckets, &filter, limit, &mut progress).await?;
            write_batch(out, &report)
        }
        Command::Account { expected } => {
            let ids: Vec<String> = match expected {
                Some(path) => std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(String::from)
                    .collect(),
                None => Vec::new(),
            };
            let report = bw_ops::account::account_expected(js, buckets, &ids).await?;
            write!(out, "{report}")?;
            if report.lost_count() > 0 {
                writeln!(out, "LOST: {} operation(s)", report.lost_count())?;
                return Ok(EXIT_LOST);
            }
            writeln!(
                out,
                "{}",
                if report.is_clean() {
                    "OK: every operation is in exactly one place"
                } else {
                    "OK: nothing lost (see findings above)"
                }
            )?;
            Ok(0)
        }
        Command::Op(args) => op::run(js, buckets, &args, out).await,
        Command::Ledger(LedgerCommand::MigrateTenants { yes }) => migrate_tenants(js, buckets, yes, out).await,
        Command::Breaker(_)
        | Command::Pause(_)
        | Command::OperatorTokenHash
        | Command::Ledger(LedgerCommand::Repartition(_))
        | Command::Send(_)
        | Command::Senders(_) => Ok(0),
    }
}

async fn scopes(buckets: &Buckets, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let now = now_ms();
    let snapshots = ops::scope_snapshots(buckets).await?;
    let pauses: Vec<Vec<String>> =
        snapshots.iter().flat_map(|(phone, s)| s.pauses.iter().map(move |p| pause_row(phone, p))).collect();
    let rows: Vec<Vec<String>> = snapshots
        .into_iter()
        .map(|(phone, s)| {
            let held: Vec<String> = s
                .pauses
                .iter()
                .map(|p| if p.code == 0 { p.level.clone() } else { format!("{}:{}", p.level, p.code) })
                .collect();
            let state = format!("{:?}", s.state()).to_ascii_uppercase();
            let paused = if s.paused_until_unix_ms > now { fmt::utc(s.paused_until_unix_ms) } else { "-".into() };
            vec![
                phone,
                s.scope.map(|x| x.waba_id).unwrap_or_default(),
                state,
                fmt::utc(s.since_unix_ms),
                if s.since_unix_ms > 0 { fmt::age(now - s.since_unix_ms) } else { "-".into() },
                format!("{:.3}", s.failure_rate),
                s.calls_in_window.to_string(),
                format!("{:.2}", if s.ramp_fraction > 0.0 { s.ramp_fraction } else { 1.0 }),
                if s.incident_id.is_empty() { "-".into() } else { s.incident_id },
                paused,
                if held.is_empty() { "-".into() } else { held.join(",") },
            ]
        })
        .collect();
    let header =
        ["SCOPE", "WABA", "STATE", "SINCE", "FOR", "FAIL-RATE", "CALLS", "RAMP", "INCIDENT", "PAUSED-UNTIL", "PAUSES"];
    write!(out, "{}", fmt::table(&header, &rows))?;
    if !pauses.is_empty() {
        writeln!(out)?;
        let header = ["SCOPE", "LEVEL", "ID", "CODE", "SINCE", "UNTIL", "LIFT", "SOURCE", "REASON"];
        write!(out, "{}", fmt::table(&header, &pauses))?;
    }
    Ok(0)
}

/// One row of the pause table of `bwctl scopes`.
fn pause_row(phone: &str, p: &bw_common::proto::ScopePause) -> Vec<String> {
    vec![
        phone.to_string(),
        p.level.clone(),
        p.id.clone(),
        if p.code == 0 { "-".into() } else { p.code.to_string() },
        fmt::utc(p.since_unix_ms),
        if p.until_unix_ms > 0 { fmt::utc(p.until_unix_ms) } else { "until lifted".into() },
        p.lift.clone() + if p.marketing_only { " (marketing only)" } else { "" },
        p.source.clone(),
        p.reason.clone(),
    ]
}

/// After the operator confirmed `what` (or gave --yes): a JetStream context on `nats` without opening the
/// topology (a repartition runs while it is incomplete). None when not confirmed.
async fn confirmed_admin(
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

/// `bwctl ledger repartition --to M`.
async fn repartition(
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
async fn migrate_tenants(
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

/// `bwctl send repartition --to M`.
async fn repartition_send(
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
async fn partitions(js: &jetstream::Context, buckets: &Buckets, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
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

fn write_stats(out: &mut (dyn Write + Send), stats: &[QueueStats], undecodable: usize) -> anyhow::Result<i32> {
    let now = now_ms();
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            let reasons = s.reasons.iter().map(|(r, n)| format!("{r}={n}")).collect::<Vec<_>>().join(" ");
            vec![
                s.scope.clone(),
                s.depth.to_string(),
                fmt::utc(s.oldest_at_unix_ms),
                fmt::age(s.oldest_age_ms(now)),
                reasons,
            ]
        })
        .collect();
    write!(out, "{}", fmt::table(&["SCOPE", "DEPTH", "OLDEST", "AGE", "REASONS"], &rows))?;
    let total: u64 = stats.iter().map(|s| s.depth).sum();
    writeln!(out, "total {total} in {} scope(s); {undecodable} undecodable", stats.len())?;
    Ok(0)
}

pub(crate) fn write_batch(out: &mut (dyn Write + Send), report: &BatchReport) -> anyhow::Result<i32> {
    writeln!(out, "selected {}", report.selected)?;
    for (label, n) in &report.outcomes {
        writeln!(out, "  {label:<20} {n:>8}")?;
    }
    for (op, why) in report.left.iter().take(20) {
        writeln!(out, "  left {op}: {why}")?;
    }
    if report.errors > 0 {
        writeln!(out, "  errors {:>8} (left in place; run again)", report.errors)?;
        return Ok(1);
    }
    Ok(0)
}

pub(crate) fn confirm(yes: bool, what: &str, out: &mut (dyn Write + Send)) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    write!(out, "About to {what}. Type yes to continue: ")?;
    out.flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    let ok = line.trim() == "yes";
    if !ok {
        writeln!(out, "aborted; nothing changed")?;
    }
    Ok(ok)
}

/// Calls the coordinator admin API: `POST {base}/admin/breakers/{scope}/{force-open|force-closed|clear|reset}`
/// with a JSON body `{"reason": "..."}` and the operator token as `Authorization: Bearer`.
async fn breaker(
    base: &str,
    token: Option<&OperatorToken>,
    cmd: &BreakerCommand,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let (action, args) = match cmd {
        BreakerCommand::ForceOpen(a) => ("force-open", a),
        BreakerCommand::ForceClosed(a) => ("force-closed", a),
        BreakerCommand::Clear(a) => ("clear", a),
        BreakerCommand::Reset(a) => ("reset", a),
        BreakerCommand::Leader => return leader(base, out).await,
    };
    anyhow::ensure!(
        !args.scope.is_empty() && args.scope.bytes().all(|b| b.is_ascii_digit()),
        "--scope must be a phone_number_id (digits)"
    );
    let path = format!("/admin/breakers/{}/{action}", args.scope);
    let body = format!("{{\"reason\":{}}}", json_string(&args.reason));
    operator_post(base, token, &path, body, &format!("scope {}: {action}", args.scope), out).await
}

/// Calls the coordinator admin API: `POST {base}/admin/pauses/{level}/{id}/{pause|lift}` with
/// `{"for_ms": N, "reason": "..."}` and the operator token as `Authorization: Bearer`.
async fn pause(
    base: &str,
    token: Option<&OperatorToken>,
    cmd: &PauseCommand,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let (action, args) = match cmd {
        PauseCommand::Set(a) => ("pause", a),
        PauseCommand::Lift(a) => ("lift", a),
    };
    anyhow::ensure!(
        matches!(args.level.as_str(), "number" | "waba" | "app" | "token"),
        "--level must be number, waba, app or token"
    );
    anyhow::ensure!(
        !args.id.is_empty()
            && args.id.len() <= 64
            && args.id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
        "--id must be 1 to 64 letters, digits, '-', '_' or '.'"
    );
    let for_ms = match (action, args.for_ms) {
        ("pause", Some(0)) => anyhow::bail!("--for-ms must be positive (leave it out to pause until lifted)"),
        ("pause", Some(ms)) => format!("\"for_ms\":{ms},"),
        _ => String::new(),
    };
    let path = format!("/admin/pauses/{}/{}/{action}", args.level, args.id);
    let body = format!("{{{for_ms}\"reason\":{}}}", json_string(&args.reason));
    operator_post(base, token, &path, body, &format!("{} {}: {action}", args.level, args.id), out).await
}

/// POSTs an operator action to the coordinator and reports its answer under `what`.
async fn operator_post(
    base: &str,
    token: Option<&OperatorToken>,
    path: &str,
    body: String,
    what: &str,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    bw_common::service::install_crypto();
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut request = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .body(body)
        .timeout(std::time::Duration::from_secs(10));
    if let Some(token) = token {
        request = request.bearer_auth(token.expose());
    }
    let response = request.send().await.with_context(|| format!("coordinator not reachable at {base}"))?;
    let status = response.status();
    let mut text = response.text().await.unwrap_or_default();
    if let Some(token) = token {
        // Nothing the coordinator says should echo it, but never print it whatever comes back.
        text = text.replace(token.expose(), "<redacted>");
    }
    if status.is_success() {
        writeln!(out, "{what} ok {}", text.trim())?;
        Ok(0)
    } else {
        writeln!(out, "{what} failed: HTTP {status} {}", text.trim())?;
        if status.as_u16() == 401 || status.as_u16() == 403 {
            let hint = if token.is_none() {
                "set BW_OPERATOR_TOKEN (or --operator-token) to the operator token"
            } else {
                "check BW_OPERATOR_TOKEN against the coordinator's operator.token_sha256 (bwctl operator-token-hash)"
            };
            writeln!(out, "hint: {hint}")?;
        }
        Ok(1)
    }
}

/// `GET {base}/admin/leader`: the lease holder, and whether the instance that answered leads.
async fn leader(base: &str, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    bw_common::service::install_crypto();
    let url = format!("{}/admin/leader", base.trim_end_matches('/'));
    let response = reqwest::Client::new()
        .get(&url)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .with_context(|| format!("coordinator not reachable at {base}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let body: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if !status.is_success() {
        writeln!(out, "leader: HTTP {status} {}", text.trim())?;
        return Ok(1);
    }
    match body["holder"].as_str() {
        Some(holder) => writeln!(out, "leader: {holder}")?,
        None => writeln!(out, "leader: none (no instance holds the lease; ticks and snapshots are paused)")?,
    }
    writeln!(
        out,
        "answered by: {} ({})",
        body["instance"].as_str().unwrap_or("?"),
        if body["leader"].as_bool() == Some(true) { "leader" } else { "follower" }
    )?;
    Ok(if body["holder"].is_string() { 0 } else { 1 })
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
