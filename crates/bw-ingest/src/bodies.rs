//! Webhook bodies too large for one NATS message (nats-server's default `max_payload` is 1 MiB; Meta signs
//! deliveries of up to 3 MB).
//!
//! Such a body is put first into the JetStream object store [`BODIES_BUCKET`] (chunked, each chunk acked by
//! the broker) under a name derived from its sha256; then the small record that points to it is published with
//! the header [`OBJECT_HEADER`] naming the object and an empty body field. Only after both are stored is Meta
//! answered 200. This works with any server `max_payload`, so nothing in the deployment has to be raised for
//! it. Bodies are deleted by the processor once every item in them is handled; what is left expires with the
//! bucket's max age (7 days), as do signed bodies that could not be parsed, kept for inspection under
//! `rejected.<sha256>`. The bucket has a byte limit (`nats.limits.bodies_max_bytes`) and refuses a put when full
//! (a 503 Meta retries). Rejected producer input does not come here: a producer's flood must not fill the bucket
//! Meta's deliveries need (BW_REJECTED keeps what fits in a record, or the input's first bytes and its size).

use async_nats::jetstream::{self, object_store};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Object store bucket of large bodies (created by ingest at start-up).
pub use bw_wire::names::BODIES_BUCKET;
/// NATS header of a record whose body lives in [`BODIES_BUCKET`]: the object's name.
pub use bw_wire::names::BODY_OBJECT_HEADER as OBJECT_HEADER;
/// Room kept in one NATS message for the record around the body (headers, protobuf framing, other fields).
const RECORD_MARGIN: usize = 64 * 1024;
/// Chunk size of stored objects.
const CHUNK: usize = 256 * 1024;

/// Access to the large-body bucket.
#[derive(Clone)]
pub(crate) struct Bodies {
    store: object_store::ObjectStore,
    /// Largest body kept inline in its record.
    inline_max: usize,
}

/// Largest body kept inline in a record, for a server `max_payload`.
pub(crate) fn inline_max(max_payload: usize) -> usize {
    max_payload.saturating_sub(RECORD_MARGIN).max(1024)
}

impl Bodies {
    /// Binds to (or creates) the bucket, with a byte limit of `max_bytes` (applied to an existing bucket too).
    /// `max_payload` is the server's limit (from its INFO).
    pub(crate) async fn ensure(
        js: &jetstream::Context,
        replicas: usize,
        max_payload: usize,
        max_bytes: i64,
    ) -> anyhow::Result<Bodies> {
        let store = match js.get_object_store(BODIES_BUCKET).await {
            Ok(s) => s,
            Err(_) => js
                .create_object_store(object_store::Config {
                    bucket: BODIES_BUCKET.to_string(),
                    description: Some("Breakwater ingest: webhook bodies over max_payload".into()),
                    max_age: Duration::from_secs(7 * 24 * 3600),
                    max_bytes,
                    num_replicas: replicas.max(1),
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await
                .map_err(|e| anyhow::anyhow!("cannot create object store {BODIES_BUCKET}: {e}"))?,
        };
        let stream = js.get_stream(format!("OBJ_{BODIES_BUCKET}")).await?;
        let wanted = jetstream::stream::Config {
            max_bytes,
            discard: jetstream::stream::DiscardPolicy::New,
            ..stream.cached_info().config.clone()
        };
        if let Err(e) = bw_common::nats::apply_stream_limits(js, stream.cached_info(), &wanted).await {
            crate::capacity::limits_not_applied(&wanted.name, &format!("{e:#}"));
        }
        Ok(Bodies { store, inline_max: inline_max(max_payload) })
    }

    /// True when a body of `len` bytes fits inline in its record.
    pub(crate) fn fits_inline(&self, len: usize) -> bool {
        len <= self.inline_max
    }

    /// Stores `body` under `name` (idempotent: an object of that name and size is kept as is).
    pub(crate) async fn put(&self, name: &str, body: &[u8]) -> Result<(), String> {
        if let Ok(info) = self.store.info(name).await
            && !info.deleted
            && info.size == body.len()
        {
            return Ok(());
        }
        let meta =
            object_store::ObjectMetadata { name: name.to_string(), chunk_size: Some(CHUNK), ..Default::default() };
        let mut reader = body;
        self.store.put(meta, &mut reader).await.map(|_| ()).map_err(|e| format!("object {name} not stored: {e}"))
    }

    /// The body stored under `name`; None when it is gone (deleted after processing, or expired).
    pub(crate) async fn get(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let mut object = match self.store.get(name).await {
            Ok(o) => o,
            Err(e) if e.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("object {name} unreadable: {e}")),
        };
        let mut out = Vec::with_capacity(object.info().size);
        object.read_to_end(&mut out).await.map_err(|e| format!("object {name} unreadable: {e}"))?;
        Ok(Some(out))
    }

    /// Deletes an object (best effort: the bucket's max age removes what is left).
    pub(crate) async fn delete(&self, name: &str) {
        if let Err(e) = self.store.delete(name).await {
            tracing::debug!(error = %e, "large body not deleted; it expires with the bucket's max age");
        }
    }
}

/// The object name of a webhook body.
pub(crate) fn webhook_object(body_sha256: &str) -> String {
    bw_wire::names::webhook_body_object(body_sha256)
}

/// The object name of a signed webhook body that could not be parsed, kept for inspection.
pub(crate) fn rejected_object(body_sha256: &str) -> String {
    bw_wire::names::rejected_body_object(body_sha256)
}
