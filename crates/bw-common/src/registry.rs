//! The sender registry: phone_number_id → WABA → owning tenant, in the KV bucket BW_SENDERS.
//!
//! Written only by `bwctl senders add|rm`; read by ingest (who may send as which number, which WABA it is), the
//! dispatcher and replay (a number removed after acceptance is not sent). Readers keep a [`RegistryView`]: the
//! whole map loaded at start and kept current by a KV watch, with a direct read on a miss so a number added a
//! moment ago is found at once. A record moves between tenants only by `rm` then `add`, never by overwrite.

use async_nats::jetstream::{self, kv, stream};
use bw_proto::v1::SenderRecord;
use bw_wire::names;
use bw_wire::tenancy;
use futures::StreamExt;
use prost::Message;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Registry failures.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("sender registry unavailable: {0}")]
    Unavailable(String),
    #[error("sender registry entry for a number is corrupt")]
    Corrupt,
    #[error("{0}")]
    Invalid(String),
    #[error("the number is registered to tenant `{0}`; remove it first (bwctl senders rm)")]
    OwnedByAnother(String),
}

/// Checks a record before it is written: digits for the ids, a valid tenant.
pub fn validate(record: &SenderRecord) -> Result<(), RegistryError> {
    let digits = |s: &str| !s.is_empty() && s.len() <= 32 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(&record.phone_number_id) {
        return Err(RegistryError::Invalid("phone_number_id must be 1..=32 digits".into()));
    }
    if !digits(&record.waba_id) {
        return Err(RegistryError::Invalid("waba_id must be 1..=32 digits".into()));
    }
    if !record.portfolio_id.is_empty() && !digits(&record.portfolio_id) {
        return Err(RegistryError::Invalid("portfolio_id must be digits".into()));
    }
    if !tenancy::valid_tenant(&record.tenant) {
        return Err(RegistryError::Invalid(
            "tenant must be 1..=32 characters of [a-z0-9-], starting and ending with a letter or digit".into(),
        ));
    }
    Ok(())
}

/// The registry bucket.
#[derive(Clone)]
pub struct Registry {
    store: kv::Store,
}

impl Registry {
    /// Opens BW_SENDERS, creating it if missing (one revision per number; small: 1,000 numbers are ~100 KB).
    pub async fn open(js: &jetstream::Context, replicas: usize) -> anyhow::Result<Registry> {
        let config = kv::Config {
            bucket: names::SENDERS_BUCKET.to_string(),
            history: 1,
            storage: stream::StorageType::File,
            num_replicas: replicas.max(1),
            max_bytes: 64 * 1024 * 1024,
            ..Default::default()
        };
        Ok(Registry { store: crate::nats::open_bucket(js, config).await? })
    }

    /// The record of a number, if registered.
    pub async fn get(&self, phone_number_id: &str) -> Result<Option<SenderRecord>, RegistryError> {
        if !phone_number_id.bytes().all(|b| b.is_ascii_digit()) || phone_number_id.is_empty() {
            return Ok(None);
        }
        match self.store.get(phone_number_id).await {
            Ok(Some(bytes)) => SenderRecord::decode(bytes).map(Some).map_err(|_| RegistryError::Corrupt),
            Ok(None) => Ok(None),
            Err(e) => Err(RegistryError::Unavailable(e.to_string())),
        }
    }

    /// Registers a number to a tenant, or updates its WABA or portfolio. Refuses to move a number that another
    /// tenant owns (its operations, feed and permissions are that tenant's until an operator removes it).
    pub async fn add(&self, record: &SenderRecord) -> Result<(), RegistryError> {
        validate(record)?;
        let entry =
            self.store.entry(&record.phone_number_id).await.map_err(|e| RegistryError::Unavailable(e.to_string()))?;
        let live = entry.filter(|e| e.operation == kv::Operation::Put);
        if let Some(e) = &live {
            let current = SenderRecord::decode(e.value.clone()).map_err(|_| RegistryError::Corrupt)?;
            if current.tenant != record.tenant {
                return Err(RegistryError::OwnedByAnother(current.tenant));
            }
        }
        let bytes = record.encode_to_vec().into();
        let written = match &live {
            Some(e) => self
                .store
                .update(&record.phone_number_id, bytes, e.revision)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            None => self.store.create(&record.phone_number_id, bytes).await.map(|_| ()).map_err(|e| e.to_string()),
        };
        // A concurrent add of the same number lost the race: report it rather than overwrite.
        written
            .map_err(|e| RegistryError::Unavailable(format!("{e} (another change to the same number? run it again)")))
    }

    /// Removes a number; true when it was registered.
    pub async fn remove(&self, phone_number_id: &str) -> Result<bool, RegistryError> {
        let existed = self.get(phone_number_id).await?.is_some();
        if existed {
            self.store.delete(phone_number_id).await.map_err(|e| RegistryError::Unavailable(e.to_string()))?;
        }
        Ok(existed)
    }

    /// Every registered number, ordered by tenant then number.
    pub async fn list(&self) -> Result<Vec<SenderRecord>, RegistryError> {
        let mut keys = self.store.keys().await.map_err(|e| RegistryError::Unavailable(e.to_string()))?;
        let mut out = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| RegistryError::Unavailable(e.to_string()))?;
            if let Some(record) = self.get(&key).await? {
                out.push(record);
            }
        }
        out.sort_by(|a, b| (&a.tenant, &a.phone_number_id).cmp(&(&b.tenant, &b.phone_number_id)));
        Ok(out)
    }
}

/// Who owns a sender, as a service sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Registered (or dev mode, where [`tenancy::DEFAULT_TENANT`] owns every number with any WABA).
    Known { tenant: String, waba_id: String, portfolio_id: String },
    /// Not in the registry.
    Unregistered,
}

impl Owner {
    /// The owning tenant, if any.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Owner::Known { tenant, .. } => Some(tenant),
            Owner::Unregistered => None,
        }
    }
}

/// Why a sender may not be used for a request or an operation. Checked in this order, so a number of another
/// tenant is refused as not owned before its WABA is compared (its WABA is not disclosed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderRefusal {
    /// The number is not in the registry.
    NotRegistered,
    /// The number belongs to another tenant than the caller's (or than the operation's).
    NotOwned,
    /// The request names another WABA than the registry records for the number.
    WabaMismatch,
}

impl SenderRefusal {
    /// Short label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            SenderRefusal::NotRegistered => "sender_not_registered",
            SenderRefusal::NotOwned => "sender_not_owned",
            SenderRefusal::WabaMismatch => "waba_mismatch",
        }
    }
}

impl SenderRefusal {
    /// Why an accepted operation was not sent (its quarantine detail): names the number, never a tenant.
    pub fn revoked_detail(self, phone_number_id: &str) -> String {
        let why = match self {
            SenderRefusal::NotRegistered => "is no longer in the sender registry",
            SenderRefusal::NotOwned => "is now registered to another tenant than the operation's",
            SenderRefusal::WabaMismatch => "is now registered under another WABA than the request's",
        };
        format!("not sent: phone_number_id {phone_number_id} {why}")
    }
}

impl Owner {
    /// Whether a request naming `waba_id` may use this owner's number on behalf of `tenant` (None: whoever owns
    /// it, as on NATS, where the subject's number decides the tenant). Ok holds the owning tenant.
    pub fn admit(&self, tenant: Option<&str>, waba_id: &str) -> Result<&str, SenderRefusal> {
        let Owner::Known { tenant: owner, waba_id: registered, .. } = self else {
            return Err(SenderRefusal::NotRegistered);
        };
        if tenant.is_some_and(|t| t != owner) {
            return Err(SenderRefusal::NotOwned);
        }
        if registered != waba_id {
            return Err(SenderRefusal::WabaMismatch);
        }
        Ok(owner)
    }
}

/// A service's view of the registry (see the module docs); cheap to clone.
#[derive(Clone)]
pub struct RegistryView {
    inner: Option<Arc<ViewInner>>,
}

struct ViewInner {
    registry: Registry,
    map: RwLock<HashMap<String, SenderRecord>>,
}

impl RegistryView {
    /// Dev mode: every number is the default tenant's, with whatever WABA the request names.
    pub fn dev() -> RegistryView {
        RegistryView { inner: None }
    }

    /// Registry mode: loads every record, then follows changes until `shutdown`.
    pub async fn start(
        registry: Registry,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<RegistryView> {
        // Watch first, then load: a change between the two is seen by the watch (applied twice, idempotent).
        let mut watch = registry
            .store
            .watch_all()
            .await
            .map_err(|e| anyhow::anyhow!("cannot watch {}: {e}", names::SENDERS_BUCKET))?;
        let mut map = HashMap::new();
        for record in registry.list().await? {
            map.insert(record.phone_number_id.clone(), record);
        }
        let inner = Arc::new(ViewInner { registry, map: RwLock::new(map) });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    next = watch.next() => next,
                };
                let Some(inner) = weak.upgrade() else { return };
                match next {
                    Some(Ok(entry)) => inner.apply(&entry),
                    Some(Err(e)) => tracing::warn!(error = %e, "sender registry watch error"),
                    None => {
                        // The watch ended (connection lost for good): lookups fall back to direct reads on a miss,
                        // and a removal is then seen only after a restart; say so loudly.
                        tracing::error!("sender registry watch ended; removals are not followed until a restart");
                        return;
                    }
                }
            }
        });
        Ok(RegistryView { inner: Some(inner) })
    }

    /// Whether an accepted request (its `operation_id` holds the operation key) may still be sent from its
    /// number: the registry must still assign the number to the key's tenant, under the request's WABA. Always
    /// Ok(None) in dev mode.
    pub async fn revoked(&self, request: &bw_proto::v1::SendRequest) -> Result<Option<SenderRefusal>, RegistryError> {
        if self.is_dev() {
            return Ok(None);
        }
        let (tenant, _) = tenancy::split_operation_key(&request.operation_id);
        let owner = self.owner(&request.phone_number_id, &request.waba_id).await?;
        Ok(owner.admit(Some(tenant), &request.waba_id).err())
    }

    /// True in dev mode.
    pub fn is_dev(&self) -> bool {
        self.inner.is_none()
    }

    /// Who owns `phone_number_id`. `waba_hint` is the request's WABA, used only in dev mode (where nothing
    /// records the WABA); in registry mode the registry's WABA is the truth.
    pub async fn owner(&self, phone_number_id: &str, waba_hint: &str) -> Result<Owner, RegistryError> {
        let Some(inner) = &self.inner else {
            return Ok(Owner::Known {
                tenant: tenancy::DEFAULT_TENANT.to_string(),
                waba_id: waba_hint.to_string(),
                portfolio_id: String::new(),
            });
        };
        let cached = inner
            .map
            .read()
            .map_err(|_| RegistryError::Unavailable("registry view poisoned".into()))?
            .get(phone_number_id)
            .cloned();
        let record = match cached {
            Some(r) => Some(r),
            None => {
                let fresh = inner.registry.get(phone_number_id).await?;
                if let Some(r) = &fresh
                    && let Ok(mut map) = inner.map.write()
                {
                    map.insert(r.phone_number_id.clone(), r.clone());
                }
                fresh
            }
        };
        Ok(match record {
            Some(r) => Owner::Known { tenant: r.tenant, waba_id: r.waba_id, portfolio_id: r.portfolio_id },
            None => Owner::Unregistered,
        })
    }
}

/// The view a service runs with: in registry mode the registry's (opened, loaded and watched within the
/// start-up budget, so a service that cannot read it does not report ready), in dev mode [`RegistryView::dev`].
pub async fn view_for(
    mode: tenancy::TenancyMode,
    deps: &crate::service::Deps,
    replicas: usize,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<RegistryView> {
    if mode == tenancy::TenancyMode::Dev {
        return Ok(RegistryView::dev());
    }
    let budget = std::time::Duration::from_secs(30);
    let registry = deps.startup_step("sender registry", budget, || Registry::open(&deps.js, replicas)).await?;
    deps.startup_step("sender registry view", budget, || RegistryView::start(registry.clone(), shutdown.clone())).await
}

impl ViewInner {
    fn apply(&self, entry: &kv::Entry) {
        let Ok(mut map) = self.map.write() else { return };
        match entry.operation {
            kv::Operation::Put => match SenderRecord::decode(entry.value.clone()) {
                Ok(r) => {
                    map.insert(entry.key.clone(), r);
                }
                Err(_) => tracing::warn!("corrupt sender registry entry ignored"),
            },
            kv::Operation::Delete | kv::Operation::Purge => {
                map.remove(&entry.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_admit_only_their_tenant_and_waba() {
        let owner = Owner::Known { tenant: "crm".into(), waba_id: "1001".into(), portfolio_id: String::new() };
        assert_eq!(owner.admit(None, "1001"), Ok("crm"));
        assert_eq!(owner.admit(Some("crm"), "1001"), Ok("crm"));
        assert_eq!(owner.admit(Some("shop"), "1001"), Err(SenderRefusal::NotOwned));
        // Another tenant's number is refused as not owned whatever WABA it names.
        assert_eq!(owner.admit(Some("shop"), "9"), Err(SenderRefusal::NotOwned));
        assert_eq!(owner.admit(Some("crm"), "9"), Err(SenderRefusal::WabaMismatch));
        assert_eq!(Owner::Unregistered.admit(None, "1001"), Err(SenderRefusal::NotRegistered));
    }

    #[test]
    fn records_are_validated() {
        let ok = SenderRecord {
            phone_number_id: "106540352242922".into(),
            waba_id: "102290129340398".into(),
            tenant: "crm".into(),
            ..Default::default()
        };
        assert!(validate(&ok).is_ok());
        for bad in [
            SenderRecord { phone_number_id: "+1555".into(), ..ok.clone() },
            SenderRecord { waba_id: String::new(), ..ok.clone() },
            SenderRecord { tenant: "CRM".into(), ..ok.clone() },
            SenderRecord { portfolio_id: "p1".into(), ..ok.clone() },
        ] {
            assert!(matches!(validate(&bad), Err(RegistryError::Invalid(_))), "{bad:?}");
        }
    }
}
