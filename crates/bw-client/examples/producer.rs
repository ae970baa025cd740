//! A minimal Breakwater producer in Rust with `bw-client`, the same as examples/producer-ts and producer-py.
//!
//! It runs as a tenant of the sender registry (`BW_TENANT`, default `default`; the number must be registered to
//! it with `bwctl senders add`): it connects as the tenant's NATS user `producer-<tenant>` with `NATS_PASSWORD`
//! (unset: no credentials, a local server without accounts) on the tenant's inbox prefix `_INBOX_<tenant>`,
//! sends one text message (retried with the same operation id: ingest keeps each operation id of a tenant
//! once), follows it on the tenant's feed consumer `feed-<tenant>` (this number's events) until a final event or
//! `FOLLOW_SECONDS` (default 60), and prints the status query's answer. One line per fact, `key=value` pairs;
//! the recipient is never printed.
//!
//! ```text
//! NATS_URL=nats://127.0.0.1:4222 BW_TENANT=crm NATS_PASSWORD=... \
//!   cargo run -q -p bw-client --example producer -- <operation_id> <waba_id> <phone_number_id> <+recipient> <text>
//! ```

use bw_client::{Client, Request};
use bw_proto::v1::OutcomeKind;
use std::time::{Duration, Instant};

fn kind(k: OutcomeKind) -> String {
    k.as_str_name().trim_start_matches("OUTCOME_KIND_").to_ascii_lowercase()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [op, waba, phone, recipient, text] = args.as_slice() else {
        eprintln!("usage: producer <operation_id> <waba_id> <phone_number_id> <+recipient> <text>");
        std::process::exit(64);
    };
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let tenant = std::env::var("BW_TENANT").unwrap_or_else(|_| "default".into());
    let options = match std::env::var("NATS_PASSWORD") {
        Ok(password) => bw_client::tenant_options(&tenant, password),
        Err(_) => bw_client::with_tenant_inbox(async_nats::ConnectOptions::new(), &tenant),
    };
    let nats = options.connect(url.as_str()).await?;
    let client = Client::new(nats.clone());

    let reply = client.send(&Request::text(op, waba, phone, recipient, text).build()).await?;
    println!(
        "reply accepted={} duplicate={} operation_id={} reason={} error={:?}",
        reply.accepted,
        reply.duplicate,
        reply.operation_id,
        reply.reason().as_str_name(),
        reply.error
    );
    if !reply.accepted {
        std::process::exit(1);
    }

    let seconds: u64 = std::env::var("FOLLOW_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let js = async_nats::jetstream::new(nats);
    let mut feed = bw_client::follow(&js, &tenant, Some(phone)).await?;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(Some(item)) = tokio::time::timeout(left, feed.next()).await else { break };
        let item = item?;
        item.ack().await?;
        let event = &item.event;
        if event.operation_id != *op {
            continue;
        }
        println!(
            "event kind={} wamid={} meta_code={} attempts={}",
            kind(event.kind()),
            event.wamid,
            event.meta_code,
            event.attempts
        );
        if matches!(
            event.kind(),
            OutcomeKind::Delivered
                | OutcomeKind::Read
                | OutcomeKind::Failed
                | OutcomeKind::Quarantined
                | OutcomeKind::Expired
        ) {
            break;
        }
    }

    let status = client.status(phone, op).await?;
    let journey: Vec<String> = status.journey.iter().map(|e| kind(e.kind())).collect();
    println!(
        "status found={} current={} journey={}",
        status.found,
        status.current.as_ref().map(|c| kind(c.kind())).unwrap_or_default(),
        journey.join(",")
    );
    Ok(())
}
