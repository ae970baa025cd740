//! `bwctl senders`: the sender registry (which tenant owns which number, `bw_common::registry`) and the
//! producers' NATS users generated from it (`bw_ops::senders`).
//!
//! Phone number ids and WABA ids are Meta's ids of the business's own numbers, not personal data: they are
//! printed in full. Passwords are never printed: a generated user names the environment variable nats-server
//! reads its password from.

use anyhow::Context as _;
use async_nats::jetstream;
use bw_common::registry::{Registry, RegistryError};
use bw_proto::v1::SenderRecord;
use bw_wire::names;
use bw_wire::tenancy;
use clap::{Args, Subcommand};
use std::io::{Read as _, Write};

/// `bwctl senders ...`.
#[derive(Debug, Subcommand)]
pub enum SendersCommand {
    /// Register a number to a tenant (or change its WABA or portfolio). A number another tenant owns is refused:
    /// remove it first. Then generate the producers' NATS users again (`bwctl senders nats-accounts`).
    Add(AddArgs),
    /// Remove a number from the registry: its producer may no longer send from it, and what is still queued for
    /// it is not sent (the dispatcher quarantines it). Then generate the NATS users again.
    Rm {
        /// The number's phone_number_id.
        phone_number_id: String,
    },
    /// List the registered numbers, by tenant.
    Ls {
        /// Only this tenant's numbers.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Print the NATS accounts config with one producer user per tenant of the registry (replacing the lines
    /// between `# BEGIN PRODUCERS` and `# END PRODUCERS` of the base); passwords stay environment variables.
    NatsAccounts {
        /// The accounts config to start from; `-` reads standard input (e.g. the output of
        /// scripts/nats-accounts.sh).
        #[arg(long, default_value = "deploy/nats/accounts.conf")]
        base: String,
    },
}

/// Arguments of `bwctl senders add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// The number's phone_number_id (Meta's id, digits).
    pub phone_number_id: String,
    /// The WhatsApp Business Account the number belongs to (digits).
    #[arg(long)]
    pub waba: String,
    /// The owning tenant: 1 to 32 characters of [a-z0-9-], starting and ending with a letter or digit.
    #[arg(long)]
    pub tenant: String,
    /// The Meta business portfolio of the WABA (digits), when known.
    #[arg(long)]
    pub portfolio: Option<String>,
    /// Replicas of the BW_SENDERS bucket if this creates it (no service has started yet): the deployment's
    /// `nats.replicas`.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
}

/// A JetStream context on `nats_url` (the registry needs none of the other buckets).
async fn jetstream(nats_url: &str) -> anyhow::Result<jetstream::Context> {
    let cfg = bw_common::config::NatsConfig::single(nats_url.to_string(), "bwctl");
    let client = bw_common::nats::connect(&cfg, "bwctl", std::time::Duration::from_secs(5)).await?;
    Ok(jetstream::new(client))
}

/// The registry if its bucket exists (None: nothing was ever registered).
async fn existing(js: &jetstream::Context) -> anyhow::Result<Option<Registry>> {
    if js.get_key_value(names::SENDERS_BUCKET).await.is_err() {
        return Ok(None);
    }
    Ok(Some(Registry::open(js, 1).await?))
}

/// Runs one `bwctl senders` command; returns the exit code.
pub async fn run(nats_url: &str, cmd: &SendersCommand, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let js = jetstream(nats_url).await?;
    match cmd {
        SendersCommand::Add(args) => add(&js, args, out).await,
        SendersCommand::Rm { phone_number_id } => rm(&js, phone_number_id, out).await,
        SendersCommand::Ls { tenant } => ls(&js, tenant.as_deref(), out).await,
        SendersCommand::NatsAccounts { base } => nats_accounts(&js, base, out).await,
    }
}

async fn add(js: &jetstream::Context, args: &AddArgs, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let record = SenderRecord {
        phone_number_id: args.phone_number_id.clone(),
        waba_id: args.waba.clone(),
        tenant: args.tenant.clone(),
        portfolio_id: args.portfolio.clone().unwrap_or_default(),
        updated_at_unix_ms: bw_common::time::now_ms(),
    };
    // Checked before the bucket is touched: a typo never creates it.
    bw_common::registry::validate(&record)?;
    let registry = Registry::open(js, args.replicas).await?;
    let before = registry.get(&record.phone_number_id).await?;
    match registry.add(&record).await {
        Ok(()) => {}
        Err(RegistryError::OwnedByAnother(owner)) => anyhow::bail!(
            "number {phone} is registered to tenant `{owner}`; a number moves to another tenant only by removing it \
             first: `bwctl senders rm {phone}` (operations already accepted for it stay `{owner}`'s), then `bwctl \
             senders add {phone} --waba {waba} --tenant {tenant}`",
            phone = record.phone_number_id,
            waba = record.waba_id,
            tenant = record.tenant,
        ),
        Err(e) => return Err(e.into()),
    }
    let verb = match before {
        Some(b) if b == SenderRecord { updated_at_unix_ms: b.updated_at_unix_ms, ..record.clone() } => "unchanged",
        Some(_) => "updated",
        None => "registered",
    };
    writeln!(
        out,
        "{verb}: number {} of WABA {} belongs to tenant `{}`",
        record.phone_number_id, record.waba_id, record.tenant
    )?;
    writeln!(
        out,
        "producer: NATS user {}, password from ${} in nats-server's environment, inbox prefix {}, feed consumer {}",
        tenancy::nats_user(&record.tenant),
        bw_ops::senders::password_var(&record.tenant),
        tenancy::inbox_prefix(&record.tenant),
        tenancy::feed_consumer(&record.tenant),
    )?;
    writeln!(out, "next: bwctl senders nats-accounts > accounts.conf, then reload nats-server (docs/producers.md)")?;
    Ok(0)
}

async fn rm(js: &jetstream::Context, phone: &str, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let Some(registry) = existing(js).await? else {
        anyhow::bail!("number {phone} is not registered (no sender was ever registered)");
    };
    let Some(record) = registry.get(phone).await? else {
        anyhow::bail!("number {phone} is not registered (bwctl senders ls)");
    };
    registry.remove(phone).await?;
    writeln!(out, "removed: number {phone} no longer belongs to tenant `{}`", record.tenant)?;
    match queued(js, phone).await {
        Ok(waiting) if waiting.is_empty() => {}
        Ok(waiting) => writeln!(
            out,
            "warning: {} still hold(s) messages of this number; they are not sent (the dispatcher and replay \
             quarantine them: bwctl quarantine stats)",
            waiting.join(", ")
        )?,
        Err(e) => writeln!(out, "warning: could not check for queued messages of this number: {e:#}")?,
    }
    writeln!(out, "next: bwctl senders nats-accounts > accounts.conf, then reload nats-server")?;
    Ok(0)
}

/// `<stream> (<n>)` of each work stream holding messages of `phone`.
async fn queued(js: &jetstream::Context, phone: &str) -> anyhow::Result<Vec<String>> {
    if js.get_stream(names::SEND_STREAM).await.is_err() {
        // No topology yet (no service ever started): nothing can be queued.
        return Ok(Vec::new());
    }
    let send = bw_common::nats::send_partitions(js).await?;
    let mut checks: Vec<(String, String)> =
        names::Lane::ALL.iter().map(|lane| (send.stream_of(phone), send.outbox_subject(*lane, phone))).collect();
    // Messages the portfolio budget holds wait out of their lanes, on the held subjects.
    checks.extend(names::Lane::ALL.iter().map(|lane| (send.stream_of(phone), send.held_subject(*lane, phone))));
    checks.push((send.dlq_stream_of(phone), send.dlq_scope_filter(phone)));
    checks.push((names::UNKNOWN_STREAM.into(), names::unknown_subject(phone)));
    let mut held: std::collections::BTreeMap<String, u64> = Default::default();
    for (stream, subject) in checks {
        let n = bw_ops::scan::subject_depth(js, &stream, &subject).await?;
        if n > 0 {
            *held.entry(stream).or_default() += n;
        }
    }
    Ok(held.into_iter().map(|(stream, n)| format!("{stream} ({n})")).collect())
}

async fn ls(js: &jetstream::Context, tenant: Option<&str>, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    if let Some(t) = tenant {
        anyhow::ensure!(
            tenancy::valid_tenant(t),
            "--tenant must be 1 to 32 characters of [a-z0-9-], starting and ending with a letter or digit"
        );
    }
    let records = match existing(js).await? {
        Some(registry) => registry.list().await?,
        None => Vec::new(),
    };
    let rows: Vec<Vec<String>> = records
        .iter()
        .filter(|r| tenant.is_none_or(|t| r.tenant == t))
        .map(|r| {
            vec![
                r.tenant.clone(),
                r.phone_number_id.clone(),
                r.waba_id.clone(),
                if r.portfolio_id.is_empty() { "-".into() } else { r.portfolio_id.clone() },
                crate::fmt::utc(r.updated_at_unix_ms),
            ]
        })
        .collect();
    let tenants: std::collections::BTreeSet<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    write!(out, "{}", crate::fmt::table(&["TENANT", "PHONE_NUMBER_ID", "WABA", "PORTFOLIO", "UPDATED"], &rows))?;
    writeln!(out, "{} number(s) of {} tenant(s)", rows.len(), tenants.len())?;
    Ok(0)
}

async fn nats_accounts(js: &jetstream::Context, base: &str, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let text = if base == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read the base accounts config from stdin")?;
        text
    } else {
        std::fs::read_to_string(base).with_context(|| {
            format!("cannot read the base accounts config {base} (run from the repository root, or pass --base)")
        })?
    };
    let records = match existing(js).await? {
        Some(registry) => registry.list().await?,
        None => Vec::new(),
    };
    let rendered = bw_ops::senders::render_accounts(&text, &records)?;
    out.write_all(rendered.as_bytes())?;
    // What nats-server's environment must define, on stderr: stdout is the file.
    let tenants: std::collections::BTreeSet<&str> = records.iter().map(|r| r.tenant.as_str()).collect();
    if tenants.is_empty() {
        eprintln!("bwctl: no sender is registered: the config has no producer user (bwctl senders add)");
    }
    for t in tenants {
        let n = records.iter().filter(|r| r.tenant == t).count();
        eprintln!(
            "bwctl: producer {} ({n} number(s)): nats-server needs ${} in its environment",
            tenancy::nats_user(t),
            bw_ops::senders::password_var(t)
        );
    }
    Ok(0)
}
