//! `bwctl op <operation_id>`: where one operation is and how it got there, for a human.
//!
//! Reads the ledger entry (BW_LEDGER, by operation key: the producer's id for the tenant `default`,
//! `<tenant>/<id>` for the others, `bw_wire::tenancy::operation_key`) and the events the outcome feed holds for
//! it (BW_FEED, subject `bw.feed.v1.<tenant>.<phone_number_id>.<operation_id>`, written by ingest's feed
//! publisher; for `default` also the subject from before tenants, `bw.feed.v1.<phone_number_id>.<operation_id>`),
//! so it works while ingest is down. Ledger entries and feed events hold no recipient and no body; reasons are non-personal texts.

use async_nats::jetstream::{self, consumer};
use bw_common::nats::Buckets;
use bw_proto::v1::{LedgerEntry, OutcomeEvent};
use futures::StreamExt;
use prost::Message as _;
use std::io::Write;
use std::time::Duration;

/// Arguments of `bwctl op`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct OpArgs {
    #[command(subcommand)]
    pub action: Option<OpAction>,
    /// The operation key (`<tenant>/<id>`, or the bare id of the tenant `default`), or with --tenant the
    /// producer's operation id.
    #[arg(required = true)]
    pub operation_id: Option<String>,
    /// The tenant whose operation id this is.
    #[arg(long)]
    pub tenant: Option<String>,
}

/// What to do with one operation.
#[derive(Debug, clap::Subcommand)]
pub enum OpAction {
    /// Send a FAILED operation (or a flagged-unknown one that expired) again as a new attempt, with the reason in
    /// its journey. Refuses (exit 1, nothing changed) when the operation is unknown, delivered or read, or still
    /// in flight. Needs the operator's NATS user (as `dlq purge` does); digits runs in the reason are masked.
    Resend {
        /// The operation key, or with --tenant the producer's operation id.
        operation_id: String,
        /// The tenant whose operation id this is.
        #[arg(long)]
        tenant: Option<String>,
        /// Why it is sent again (kept in the journey, at most 200 characters; no personal data).
        #[arg(long)]
        reason: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

const MAX_EVENTS: usize = 500;

async fn journey(js: &jetstream::Context, phone: &str, key: &str) -> anyhow::Result<Vec<OutcomeEvent>> {
    use bw_wire::tenancy;
    let Ok(stream) = js.get_stream(bw_wire::names::FEED_STREAM).await else { return Ok(Vec::new()) };
    let (tenant, op) = tenancy::split_operation_key(key);
    let mut filters = vec![tenancy::feed_subject(tenant, phone, op)];
    if tenant == tenancy::DEFAULT_TENANT {
        // Events published before tenants existed.
        filters.push(tenancy::feed_subject_before_tenants(phone, op));
    }
    let config = consumer::pull::Config {
        filter_subjects: filters,
        deliver_policy: consumer::DeliverPolicy::All,
        ack_policy: consumer::AckPolicy::None,
        inactive_threshold: Duration::from_secs(30),
        ..Default::default()
    };
    let mut c = stream.create_consumer(config).await?;
    let pending = c.info().await?.num_pending as usize;
    let mut out = Vec::new();
    if pending > 0 {
        let mut batch =
            c.fetch().max_messages(pending.min(MAX_EVENTS)).expires(Duration::from_secs(5)).messages().await?;
        while let Some(m) = batch.next().await {
            if let Ok(ev) = OutcomeEvent::decode(m.map_err(|e| anyhow::anyhow!("{e}"))?.payload.as_ref()) {
                out.push(ev);
            }
        }
    }
    let name = c.cached_info().name.clone();
    let _ = stream.delete_consumer(&name).await;
    Ok(out)
}

/// Masks runs of 8 or more digits (a phone number in a free text) with `bw_common::mask::phone`; Meta error
/// codes (at most 6 digits) stay readable.
fn mask_digits(text: &str) -> String {
    bw_common::mask::digit_runs(text, 8, bw_common::mask::phone)
}

fn event_name(e: &OutcomeEvent) -> String {
    e.kind().as_str_name().trim_start_matches("OUTCOME_KIND_").to_ascii_lowercase().replace('_', " ")
}

/// Writes the journey of `entry` (and its feed events) for a human.
pub fn render(entry: &LedgerEntry, events: &[OutcomeEvent], out: &mut (dyn Write + Send)) -> std::io::Result<()> {
    writeln!(out, "operation  {}", entry.operation_id)?;
    writeln!(out, "state      {}", entry.state().label())?;
    writeln!(out, "sender     waba {}  phone_number_id {}", entry.waba_id, entry.phone_number_id)?;
    writeln!(out, "category   {}", entry.category().label())?;
    if !entry.wamid.is_empty() {
        writeln!(out, "wamid      {}", entry.wamid)?;
    }
    let trace_id = bw_common::telemetry::trace_id_of(&entry.traceparent);
    if !trace_id.is_empty() {
        writeln!(out, "trace      {trace_id}")?;
    }
    writeln!(out, "attempts   {}   replays {}", entry.attempts, entry.replays)?;
    if entry.last_code != 0 {
        writeln!(out, "last code  {}", entry.last_code)?;
    }
    if !entry.reason.is_empty() {
        writeln!(out, "reason     {}", mask_digits(&entry.reason))?;
    }
    if !entry.incident_id.is_empty() {
        writeln!(out, "incident   {}", entry.incident_id)?;
    }
    if entry.flagged_unknown {
        writeln!(out, "flag       outcome was unknown once: a duplicate at Meta cannot be ruled out")?;
    }
    writeln!(out, "accepted   {}", crate::fmt::utc(entry.accepted_at_unix_ms))?;
    writeln!(out, "updated    {}", crate::fmt::utc(entry.updated_at_unix_ms))?;
    writeln!(out)?;
    if events.is_empty() {
        writeln!(
            out,
            "journey    (no feed events: older than the feed's 7 days, or the feed publisher is not running)"
        )?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                crate::fmt::utc(e.at_unix_ms),
                event_name(e),
                e.attempts.to_string(),
                if e.meta_code == 0 { "-".into() } else { e.meta_code.to_string() },
                mask_digits(&e.reason),
            ]
        })
        .collect();
    write!(out, "{}", crate::fmt::table(&["at (UTC)", "event", "attempts", "code", "reason"], &rows))
}

/// The operation key named by `operation_id` and `tenant`, or the line saying why it is not one.
fn key_of(operation_id: &str, tenant: Option<&str>) -> Result<String, &'static str> {
    use bw_wire::tenancy;
    match tenant {
        Some(t) if !tenancy::valid_tenant(t) => {
            Err("not a tenant: 1..=32 characters of [a-z0-9-], starting and ending with a letter or digit")
        }
        Some(_) if !bw_wire::tenancy::valid_operation_id(operation_id) => {
            Err("not an operation id: 1..=128 characters of [A-Za-z0-9_=.-]")
        }
        Some(t) => Ok(tenancy::operation_key(t, operation_id)),
        None if !tenancy::valid_operation_key(operation_id) => {
            Err("not an operation key: an operation id (1..=128 characters of [A-Za-z0-9_=.-]), or <tenant>/<id> \
             (or pass --tenant)")
        }
        None => Ok(operation_id.to_string()),
    }
}

/// Runs `bwctl op`; exit code 0, or 1 when the operation is unknown (or a resend is refused), or
/// [`crate::exit::EXIT_ABORTED`] when the operator did not confirm a resend.
pub async fn run(
    js: &jetstream::Context,
    buckets: &Buckets,
    args: &OpArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    if let Some(OpAction::Resend { operation_id, tenant, reason, yes }) = &args.action {
        return resend(js, buckets, operation_id, tenant.as_deref(), reason, *yes, out).await;
    }
    let ledger = bw_common::ledger::Ledger::new(buckets);
    let key = match key_of(args.operation_id.as_deref().unwrap_or_default(), args.tenant.as_deref()) {
        Ok(key) => key,
        Err(why) => {
            writeln!(out, "{why}")?;
            return Ok(1);
        }
    };
    let Some(current) = ledger.get(&key).await? else {
        writeln!(out, "no ledger entry for `{key}` (never accepted, or expired)")?;
        return Ok(1);
    };
    let events = journey(js, &current.entry.phone_number_id, &key).await?;
    render(&current.entry, &events, out)?;
    Ok(0)
}

/// `bwctl op resend`: asks for confirmation, then re-queues the operation (`bw_ops::resend`).
async fn resend(
    js: &jetstream::Context,
    buckets: &Buckets,
    operation_id: &str,
    tenant: Option<&str>,
    reason: &str,
    yes: bool,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    use bw_ops::resend::{Resent, check};
    let key = match key_of(operation_id, tenant) {
        Ok(key) => key,
        Err(why) => {
            writeln!(out, "{why}")?;
            return Ok(1);
        }
    };
    let ledger = bw_common::ledger::Ledger::new(buckets);
    // Refusals are told before the question: only a resend that may go asks for confirmation.
    match ledger.get(&key).await? {
        None => {
            writeln!(out, "refused: {}", bw_ops::resend::Refusal::Unknown)?;
            return Ok(1);
        }
        Some(v) => {
            if let Err(refusal) = check(&v.entry) {
                writeln!(out, "refused: {refusal}")?;
                return Ok(1);
            }
            let flagged =
                if v.entry.flagged_unknown { " (its outcome was unknown once: a duplicate is possible)" } else { "" };
            let what = format!("send operation `{key}` ({}) again as a new attempt{flagged}", v.entry.state().label());
            if !crate::exit::confirm(yes, &what, out)? {
                writeln!(out, "aborted")?;
                return Ok(crate::exit::EXIT_ABORTED);
            }
        }
    }
    let reason = mask_digits(reason);
    match bw_ops::resend::resend(js, &ledger, buckets.send, &key, &reason).await? {
        Resent::Queued { resend } => {
            writeln!(out, "queued `{key}` as a new attempt (resend {resend}); follow it with bwctl op {key}")?;
            Ok(0)
        }
        Resent::Refused(refusal) => {
            writeln!(out, "refused: {refusal}")?;
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_proto::v1::{OperationState, OutcomeKind};

    #[test]
    fn journey_is_readable_and_masked() {
        let mut entry = LedgerEntry {
            operation_id: "op-1".into(),
            waba_id: "1001".into(),
            phone_number_id: "2002".into(),
            wamid: "wamid.X".into(),
            attempts: 2,
            last_code: 131_049,
            reason: "failed status: 131049 for +5491155550099".into(),
            accepted_at_unix_ms: 1_796_118_258_268,
            updated_at_unix_ms: 1_796_118_259_000,
            ..Default::default()
        };
        entry.set_state(OperationState::Failed);
        let ev = |kind: OutcomeKind, at: i64, code: i64| OutcomeEvent {
            kind: kind as i32,
            at_unix_ms: at,
            meta_code: code,
            attempts: 1,
            reason: "retrying after 130429".into(),
            ..Default::default()
        };
        let events = vec![
            ev(OutcomeKind::Accepted, 1_796_118_258_268, 0),
            ev(OutcomeKind::DeadLettered, 1_796_118_258_300, 130_429),
            ev(OutcomeKind::Failed, 1_796_118_259_000, 131_049),
        ];
        let mut out = Vec::new();
        render(&entry, &events, &mut out).expect("renders");
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains("state      failed"), "{text}");
        assert!(text.contains("dead lettered") && text.contains("131049") && text.contains("2026-"), "{text}");
        assert!(!text.contains("5491155550099"), "{text}");
    }

    #[tokio::test]
    async fn bwctl_op_reads_the_ledger_and_the_feed_of_a_real_server() {
        use clap::Parser as _;
        let server = bw_testkit::NatsServer::start();
        let cfg = bw_common::config::NatsConfig::single(server.url(), "");
        let deps = bw_common::service::Deps::connect("test", &cfg, None, Duration::from_secs(10)).await.expect("deps");
        let mut entry = LedgerEntry {
            operation_id: "op-9".into(),
            waba_id: "1001".into(),
            phone_number_id: "2002".into(),
            wamid: "wamid.NINE".into(),
            attempts: 1,
            ..Default::default()
        };
        entry.set_state(OperationState::Delivered);
        bw_common::ledger::Ledger::new(&deps.buckets).create(&entry).await.expect("ledger");
        deps.js
            .get_or_create_stream(jetstream::stream::Config {
                name: bw_wire::names::FEED_STREAM.into(),
                subjects: vec![bw_wire::names::FEED_ALL.into()],
                ..Default::default()
            })
            .await
            .expect("feed stream");
        // The default tenant's events: one from before tenants (no tenant token), one after.
        let publish = |subject: &'static str, op: &'static str, kind: OutcomeKind, at: i64| {
            let js = deps.js.clone();
            async move {
                let ev =
                    OutcomeEvent { operation_id: op.into(), kind: kind as i32, at_unix_ms: at, ..Default::default() };
                js.publish(subject, ev.encode_to_vec().into()).await.expect("publish").await.expect("stored");
            }
        };
        publish("bw.feed.v1.2002.op-9", "op-9", OutcomeKind::Accepted, 1_796_118_258_268).await;
        publish("bw.feed.v1.default.2002.op-9", "op-9", OutcomeKind::Delivered, 1_796_118_259_000).await;
        // Tenant crm's operation of the same id: its own key and feed subjects.
        let mut crm = entry.clone();
        crm.operation_id = "crm/op-9".into();
        crm.set_state(OperationState::Failed);
        bw_common::ledger::Ledger::new(&deps.buckets).create(&crm).await.expect("ledger");
        publish("bw.feed.v1.crm.2002.op-9", "op-9", OutcomeKind::Failed, 1_796_118_259_500).await;
        let run = |args: Vec<String>| async move {
            let mut out = Vec::new();
            let code = crate::run(crate::Cli::parse_from(args), &mut out).await.expect("runs");
            (code, String::from_utf8(out).expect("utf8"))
        };
        let url = server.url();
        let args = |extra: &[&str]| {
            let mut v = vec!["bwctl".to_string(), "--nats-url".into(), url.clone(), "op".into()];
            v.extend(extra.iter().map(|s| s.to_string()));
            v
        };
        let (code, text) = run(args(&["op-9"])).await;
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("state      delivered") && text.contains("wamid.NINE"), "{text}");
        let accepted = text.find("accepted  ").expect("accepted row");
        assert!(text[accepted..].contains("delivered"), "journey in order: {text}");
        assert!(!text.contains("failed"), "not crm's event: {text}");
        for key in [&["crm/op-9"][..], &["--tenant", "crm", "op-9"]] {
            let (code, text) = run(args(key)).await;
            assert_eq!(code, 0, "{text}");
            assert!(text.contains("operation  crm/op-9") && text.contains("state      failed"), "{text}");
            let journey = &text[text.find("at (UTC)").expect("journey")..];
            assert!(journey.contains("failed") && !journey.contains("delivered"), "crm's events only: {text}");
        }
        let (code, text) = run(args(&["op-404"])).await;
        assert_eq!(code, 1, "{text}");
        for bad in [&["default/op-9"][..], &["--tenant", "Crm", "op-9"], &["--tenant", "crm", "crm/op-9"]] {
            let (code, text) = run(args(bad)).await;
            assert_eq!(code, 1, "{bad:?}: {text}");
            assert!(text.starts_with("not a"), "{bad:?}: {text}");
        }
    }

    #[tokio::test]
    async fn bwctl_op_resend_requeues_a_failed_operation_and_refuses_the_rest() {
        use bw_common::ledger::{Ledger, WamidLink};
        use bw_proto::v1::SendRequest;
        use clap::Parser as _;
        let server = bw_testkit::NatsServer::start();
        let cfg = bw_common::config::NatsConfig::single(server.url(), "");
        let deps = bw_common::service::Deps::connect("test", &cfg, None, Duration::from_secs(10)).await.expect("deps");
        let ledger = Ledger::new(&deps.buckets);
        let request = SendRequest {
            operation_id: "crm/op-f".into(),
            waba_id: "1001".into(),
            phone_number_id: "2002".into(),
            recipient: "+5491155550099".into(),
            ..Default::default()
        };
        let put = |id: &str, state: OperationState, wamid: &str| {
            let mut e = LedgerEntry {
                operation_id: id.into(),
                waba_id: "1001".into(),
                phone_number_id: "2002".into(),
                wamid: wamid.into(),
                attempts: 1,
                ..Default::default()
            };
            e.set_state(state);
            e
        };
        ledger.create(&put("crm/op-f", OperationState::Failed, "wamid.F")).await.expect("ledger");
        let link = WamidLink { operation_id: "crm/op-f".into(), attempt: 1, request: request.encode_to_vec() };
        ledger.link_attempt("wamid.F", &link).await.expect("link");
        ledger.create(&put("crm/op-d", OperationState::Delivered, "wamid.D")).await.expect("ledger");
        ledger.create(&put("crm/op-q", OperationState::Queued, "")).await.expect("ledger");
        let url = server.url();
        let run = |extra: &[&str]| {
            let mut v = vec!["bwctl".to_string(), "--nats-url".into(), url.clone(), "op".into(), "resend".into()];
            v.extend(extra.iter().map(|s| s.to_string()));
            async move {
                let mut out = Vec::new();
                let code = crate::run(crate::Cli::parse_from(v), &mut out).await.expect("runs");
                (code, String::from_utf8(out).expect("utf8"))
            }
        };
        let sent_requests = || async {
            let mut stream = deps.js.get_stream(bw_wire::names::SEND_STREAM).await.expect("BW_SEND");
            stream.info().await.expect("info").state.messages
        };
        // Refusals change nothing and exit 1.
        for (id, says) in [("crm/op-d", "delivered"), ("crm/op-q", "queued"), ("crm/op-404", "no such operation")] {
            let (code, text) = run(&[id, "--reason", "customer asked", "--yes"]).await;
            assert_eq!(code, 1, "{id}: {text}");
            assert!(text.starts_with("refused:") && text.contains(says), "{id}: {text}");
        }
        assert_eq!(ledger.get("crm/op-d").await.expect("get").expect("entry").entry.state(), OperationState::Delivered);
        assert_eq!(sent_requests().await, 0, "a refusal queues nothing");
        // The failed one goes back to QUEUED with the (masked) reason, and its request to BW_SEND, once.
        let (code, text) = run(&["op-f", "--tenant", "crm", "--reason", "number +5491155550099 fixed", "--yes"]).await;
        assert_eq!(code, 0, "{text}");
        let entry = ledger.get("crm/op-f").await.expect("get").expect("entry").entry;
        assert_eq!((entry.state(), entry.resends), (OperationState::Queued, 1));
        assert!(entry.reason.contains("operator resend 1 after failed") && entry.reason.contains("fixed"), "{entry:?}");
        assert!(!entry.reason.contains("5491155550099"), "masked: {}", entry.reason);
        assert_eq!(sent_requests().await, 1);
        // Now in flight: a second resend is refused.
        let (code, text) = run(&["crm/op-f", "--reason", "again", "--yes"]).await;
        assert_eq!(code, 1, "{text}");
        assert!(text.contains("queued"), "{text}");
        assert_eq!(sent_requests().await, 1);
    }
}
