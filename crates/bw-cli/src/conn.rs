//! The NATS connection of one CLI run: the existing buckets, opened without creating topology.

use anyhow::Context as _;
use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_wire::names;

/// Connections of one CLI run.
pub struct Conn {
    pub js: jetstream::Context,
    pub buckets: Buckets,
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
