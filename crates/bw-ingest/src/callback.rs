//! Signed HTTP callbacks to producers: every outcome event of the feed POSTed as JSON to a producer's URL.
//!
//! Each configured callback (`[callbacks.<name>]`) belongs to one tenant and is a durable pull consumer
//! `callback-<name>` on [`FEED_STREAM`](crate::feed::FEED_STREAM), filtered to that tenant's subjects only
//! (`bw.feed.v1.<tenant>.<phone_number_id>.>` per listed sender, or `bw.feed.v1.<tenant>.>` for `"*"`), so a
//! callback never carries another tenant's events. Listed senders the registry does not assign to the tenant are
//! left out at start-up (with a warning). The consumer is shared by every ingest instance, so each event is
//! handled by one instance at a time. The consumer starts at new events (a first start does not replay the
//! feed's 7 days); after that it resumes where it stopped.
//!
//! One event is one POST of [`body_of`] (a stable JSON shape, no recipient and no body: events carry none) with
//! `Content-Type: application/json`, [`SIGNATURE_HEADER`] (`sha256=<hex HMAC-SHA256 of the exact body keyed
//! with the callback's secret>`, the scheme of Meta's `X-Hub-Signature-256`), [`EVENT_ID_HEADER`]
//! (`<operation_id>.<revision>`, the producer's own id) and [`ATTEMPT_HEADER`] (1, 2, ...). Delivery is at
//! least once, like Meta's webhooks: a crash between the answer and the acknowledgement repeats an event, so a
//! receiver treats an event id it already processed as done. Events of one operation may arrive out of order
//! (retries, concurrency): `revision` increases with every change of an operation; keep the highest.
//!
//! What the answer means ([`decide`], the one place): 2xx → delivered (ack); any other 4xx than 408 and 429 →
//! refused for good (term, a warning); 408, 429, 5xx, other statuses, timeouts and connection errors → retried
//! after the next delay of `retry_ms` (the last one repeats), or after the receiver's `Retry-After` seconds
//! (capped by `retry_after_max_ms`). An event is retried while it is younger than `max_age_ms` (counted from
//! its `at_ms`); a retry that would fall later drops it (term, an error log). The event stays in the feed
//! either way, where the producer can still read it (feed consumer or status query).
//!
//! JetStream redelivers a nak at most [`NAK_DELAY_MAX`] later, and the schedule's delays may be longer. So a
//! failed attempt writes the event's retry state (attempts so far, when the next one is due) into the KV
//! bucket [`STATE_BUCKET`]; a redelivery before that time only naks again (result `waiting`, no POST), and
//! attempts are numbered from the state (without one, from the broker's delivery count). The key is deleted
//! once the event is delivered, refused or dropped (the bucket's max age removes any left behind).

use crate::metrics::Metrics;
use crate::secret;
use async_nats::jetstream::{self, consumer, kv};
use bw_common::disposition::{Label, NAK_DELAY_MAX, NAK_DELAY_MIN, Settle, apply};
use bw_common::registry::{Owner, RegistryView};
use bw_common::time::now_ms;
use bw_proto::v1::{OutcomeEvent, OutcomeKind};
use bw_wire::tenancy::{self, DEFAULT_TENANT, TenancyMode};
use prost::Message as _;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Prefix of a callback's durable consumer name on BW_FEED (`callback-<name>`).
pub use bw_wire::names::CALLBACK_CONSUMER_PREFIX as CONSUMER_PREFIX;
/// KV bucket of the retry state of events whose delivery failed (key `<callback>.<operation_id>.<revision>`).
pub use bw_wire::names::CALLBACK_RETRIES_BUCKET as STATE_BUCKET;
/// Signature of the body: `sha256=<hex HMAC-SHA256 of the exact body keyed with the callback's secret>`.
pub const SIGNATURE_HEADER: &str = "X-Breakwater-Signature-256";
/// The event's id, `<operation_id>.<revision>` (the producer's own id): the receiver's deduplication key.
pub const EVENT_ID_HEADER: &str = "X-Breakwater-Event-Id";
/// Which attempt at delivering this event the request is (1, 2, ...).
pub const ATTEMPT_HEADER: &str = "X-Breakwater-Delivery-Attempt";
/// Ack wait of the callback consumers; a request in flight longer is reported in progress every
/// [`PROGRESS_EVERY`].
const ACK_WAIT: Duration = Duration::from_secs(30);
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// Events a callback consumer holds unacknowledged (in flight or waiting for their retry) before the broker
/// stops handing it new ones.
const MAX_ACK_PENDING: i64 = 50_000;
/// Longest `max_age_ms`: the feed keeps events 7 days.
const MAX_AGE_LIMIT_MS: u64 = 7 * 24 * 3600 * 1000;
/// Retry states older than this are removed by the bucket (longer than any `max_age_ms`).
const STATE_MAX_AGE: Duration = Duration::from_secs(8 * 24 * 3600);
/// Bytes of a receiver's answer read (and discarded) so the connection can be reused.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Compiled defaults of the optional keys of a callback (documented in default.toml).
pub mod defaults {
    /// Whole request, connect to last byte of the answer.
    pub const TIMEOUT_MS: u64 = 5_000;
    /// Requests in flight at once per callback and instance.
    pub const MAX_IN_FLIGHT: usize = 16;
    /// Delay after the 1st, 2nd, ... failed attempt; the last repeats: 1 s, 5 s, 30 s, 2 min, 10 min, then 1 h.
    pub const RETRY_MS: [u64; 6] = [1_000, 5_000, 30_000, 120_000, 600_000, 3_600_000];
    /// Longest wait a receiver's `Retry-After` may ask for.
    pub const RETRY_AFTER_MAX_MS: u64 = 3_600_000;
    /// Events older than this are not retried any more (24 h).
    pub const MAX_AGE_MS: u64 = 86_400_000;

    pub(super) fn timeout_ms() -> u64 {
        TIMEOUT_MS
    }
    pub(super) fn max_in_flight() -> usize {
        MAX_IN_FLIGHT
    }
    pub(super) fn retry_ms() -> Vec<u64> {
        RETRY_MS.to_vec()
    }
    pub(super) fn retry_after_max_ms() -> u64 {
        RETRY_AFTER_MAX_MS
    }
    pub(super) fn max_age_ms() -> u64 {
        MAX_AGE_MS
    }
}

/// One callback (`[callbacks.<name>]`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallbackConfig {
    /// `http://` or `https://` URL the events are POSTed to.
    #[serde(default)]
    pub url: String,
    /// HMAC key of the signature header (set it through `BW_INGEST__CALLBACKS__<NAME>__SECRET`).
    #[serde(default, deserialize_with = "secret::string")]
    pub secret: String,
    /// The tenant whose events are delivered (required with `tenancy.mode = "registry"`; dev mode: `default`).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Senders whose events are delivered; `["*"]` for every sender.
    #[serde(default, deserialize_with = "secret::id_list")]
    pub phone_number_ids: Vec<String>,
    /// Event kinds delivered (lowercase: accepted, sent, delivered, read, failed, ...); empty for every kind.
    #[serde(default, deserialize_with = "secret::id_list")]
    pub kinds: Vec<String>,
    #[serde(default = "defaults::timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "defaults::max_in_flight")]
    pub max_in_flight: usize,
    /// Delay after each failed attempt, ms; the last one repeats.
    #[serde(default = "defaults::retry_ms")]
    pub retry_ms: Vec<u64>,
    #[serde(default = "defaults::retry_after_max_ms")]
    pub retry_after_max_ms: u64,
    #[serde(default = "defaults::max_age_ms")]
    pub max_age_ms: u64,
}

impl std::fmt::Debug for CallbackConfig {
    // The secret never appears in logs, even through a debug print of the config; the URL only masked.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackConfig")
            .field("url", &masked_url(&self.url))
            .field("secret", &"<redacted>")
            .field("tenant", &self.tenant)
            .field("phone_number_ids", &self.phone_number_ids)
            .field("kinds", &self.kinds)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_in_flight", &self.max_in_flight)
            .field("retry_ms", &self.retry_ms)
            .field("retry_after_max_ms", &self.retry_after_max_ms)
            .field("max_age_ms", &self.max_age_ms)
            .finish()
    }
}

/// `url` without its userinfo and query (and fragment), for logs; `<invalid url>` when it does not parse.
pub fn masked_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or("");
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            let query = if u.query().is_some() { "?<masked>" } else { "" };
            let user = if u.username().is_empty() && u.password().is_none() { "" } else { "<masked>@" };
            format!("{}://{user}{host}{port}{}{query}", u.scheme(), u.path())
        }
        Err(_) => "<invalid url>".to_string(),
    }
}

/// The lowercase name of an event kind (`delivered`, `dead_lettered`, ...), as in the JSON and `kinds`.
pub fn kind_name(kind: OutcomeKind) -> String {
    kind.as_str_name().trim_start_matches("OUTCOME_KIND_").to_ascii_lowercase()
}

/// Every kind name a `kinds` filter may list.
pub fn kind_names() -> Vec<String> {
    (1..=64).filter_map(|i| OutcomeKind::try_from(i).ok()).map(kind_name).collect()
}

/// The tenant a callback delivers the events of (`default` in dev mode, where it owns every number).
pub fn tenant_of(c: &CallbackConfig, mode: TenancyMode) -> &str {
    match (mode, c.tenant.as_deref()) {
        (TenancyMode::Registry, Some(t)) => t,
        _ => DEFAULT_TENANT,
    }
}

/// Checks one callback's config. Messages name the key, never the secret (nor the URL, which may hold
/// credentials).
pub fn validate(name: &str, c: &CallbackConfig, mode: TenancyMode) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 64
        || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(format!(
            "callbacks: the name `{name}` must be 1..=64 characters of [a-z0-9_] (it names the consumer \
             callback-<name> and the environment keys BW_INGEST__CALLBACKS__<NAME>__*)"
        ));
    }
    let key = |k: &str| format!("callbacks.{name}.{k}");
    match (c.tenant.as_deref(), mode) {
        (Some(t), _) if !bw_wire::tenancy::valid_tenant(t) => {
            return Err(format!(
                "{} must be 1..=32 characters of [a-z0-9-], starting and ending with a letter or digit",
                key("tenant")
            ));
        }
        (None, TenancyMode::Registry) => {
            return Err(format!(
                "{} is required (tenancy.mode = \"registry\"): the tenant whose events the callback delivers",
                key("tenant")
            ));
        }
        _ => {}
    }
    match reqwest::Url::parse(&c.url) {
        Err(_) => return Err(format!("{} must be an absolute http:// or https:// URL (value not shown)", key("url"))),
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            return Err(format!("{}: scheme `{}` is not http or https", key("url"), u.scheme()));
        }
        Ok(u) if u.host_str().is_none_or(str::is_empty) => {
            return Err(format!("{} has no host", key("url")));
        }
        Ok(_) => {}
    }
    if c.secret.is_empty() {
        return Err(format!(
            "{} is empty: set it through the environment (BW_INGEST__CALLBACKS__{}__SECRET)",
            key("secret"),
            name.to_ascii_uppercase()
        ));
    }
    if c.phone_number_ids.is_empty() {
        return Err(format!(
            "{} is empty: list the senders' phone_number_ids, or [\"*\"] for every sender",
            key("phone_number_ids")
        ));
    }
    if let Some(bad) = c
        .phone_number_ids
        .iter()
        .find(|p| p.as_str() != "*" && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())))
    {
        return Err(format!(
            "{}: `{}` is not a phone_number_id (digits) nor \"*\"",
            key("phone_number_ids"),
            crate::secret::mask_values(bad)
        ));
    }
    let known = kind_names();
    if let Some(bad) = c.kinds.iter().find(|k| !known.contains(k)) {
        return Err(format!("{}: unknown kind `{bad}` (expected one of {})", key("kinds"), known.join(", ")));
    }
    if c.timeout_ms == 0 {
        return Err(format!("{} must be > 0", key("timeout_ms")));
    }
    if c.max_in_flight == 0 {
        return Err(format!("{} must be > 0", key("max_in_flight")));
    }
    if c.retry_ms.is_empty() || c.retry_ms.contains(&0) {
        return Err(format!("{} must list at least one delay, each > 0", key("retry_ms")));
    }
    if c.retry_after_max_ms == 0 {
        return Err(format!("{} must be > 0", key("retry_after_max_ms")));
    }
    if c.max_age_ms == 0 || c.max_age_ms > MAX_AGE_LIMIT_MS {
        return Err(format!(
            "{} must be > 0 and at most {MAX_AGE_LIMIT_MS} (the feed keeps 7 days)",
            key("max_age_ms")
        ));
    }
    Ok(())
}

/// The durable consumer name of a callback.
pub fn consumer_name(name: &str) -> String {
    bw_wire::names::callback_consumer(name)
}

/// The feed subjects a callback of `tenant` reads: only that tenant's.
pub fn filters(tenant: &str, phone_number_ids: &[String]) -> Vec<String> {
    if phone_number_ids.iter().any(|p| p == "*") {
        return vec![tenancy::feed_filter(tenant)];
    }
    let mut out: Vec<String> = phone_number_ids.iter().map(|p| tenancy::feed_sender_filter(tenant, p)).collect();
    out.sort();
    out.dedup();
    out
}

/// An RFC 3339 UTC time with milliseconds.
fn rfc3339(ms: i64) -> Option<String> {
    use chrono::TimeZone as _;
    chrono::Utc.timestamp_millis_opt(ms).single().map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
}

/// The JSON body of one event (keys in alphabetical order; optional keys absent when empty):
///
/// ```json
/// {"accepted_at": "2026-12-02T03:58:38.120Z", "accepted_at_ms": 1796183918120, "at": "2026-12-02T03:58:39.004Z",
///  "at_ms": 1796183919004, "attempts": 1, "category": "transactional", "code": 131026, "details": "...",
///  "event_id": "order-81723.42", "flagged_unknown": false, "incident": "...", "kind": "failed",
///  "operation_id": "order-81723", "phone_number_id": "106540352242922", "replays": 0, "revision": 42,
///  "state": "failed", "tenant": "crm", "waba_id": "102290129340398", "wamid": "wamid.HBgL..."}
/// ```
///
/// `code` (Meta's error code), `details` (a reason without personal data), `incident` (breaker incident id),
/// `wamid`, `accepted_at*` appear only when set. No recipient and no message body, ever.
pub fn body_of(e: &OutcomeEvent) -> Vec<u8> {
    let mut m = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        m.insert(k.to_string(), v);
    };
    put("event_id", format!("{}.{}", e.operation_id, e.revision).into());
    put("operation_id", e.operation_id.clone().into());
    put("tenant", e.tenant.clone().into());
    put("revision", e.revision.into());
    put("phone_number_id", e.phone_number_id.clone().into());
    put("waba_id", e.waba_id.clone().into());
    put("category", e.category().label().into());
    put("kind", kind_name(e.kind()).into());
    put("state", e.state().label().into());
    if !e.wamid.is_empty() {
        put("wamid", e.wamid.clone().into());
    }
    if e.meta_code != 0 {
        put("code", e.meta_code.into());
    }
    if !e.reason.is_empty() {
        put("details", e.reason.clone().into());
    }
    if !e.incident_id.is_empty() {
        put("incident", e.incident_id.clone().into());
    }
    put("attempts", e.attempts.into());
    put("replays", e.replays.into());
    put("flagged_unknown", e.flagged_unknown.into());
    put("at_ms", e.at_unix_ms.into());
    put("at", rfc3339(e.at_unix_ms).map_or(serde_json::Value::Null, Into::into));
    if e.accepted_at_unix_ms > 0 {
        put("accepted_at_ms", e.accepted_at_unix_ms.into());
        put("accepted_at", rfc3339(e.accepted_at_unix_ms).map_or(serde_json::Value::Null, Into::into));
    }
    serde_json::Value::Object(m).to_string().into_bytes()
}

/// What became of one delivery of an event (the `result` label of `bw_callback_deliveries_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The receiver answered 2xx.
    Delivered,
    /// Not taken this time (408, 429, 5xx, timeout, connection error): redelivered after the retry delay.
    Retried,
    /// The receiver refused it for good (4xx other than 408 / 429): not retried.
    Refused,
    /// No retry before the event's max age: dropped (it stays in the feed).
    Expired,
    /// Redelivered before its retry is due (a delay longer than the broker's longest): no request.
    Waiting,
    /// Its kind is not in the callback's `kinds`.
    Skipped,
    /// Not an outcome event (never written by ingest): dropped.
    Undecodable,
}

impl Label for Delivery {
    fn label(self) -> &'static str {
        match self {
            Delivery::Delivered => "delivered",
            Delivery::Retried => "retried",
            Delivery::Refused => "refused",
            Delivery::Expired => "expired",
            Delivery::Waiting => "waiting",
            Delivery::Skipped => "skipped",
            Delivery::Undecodable => "undecodable",
        }
    }
}

/// What one request got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// An HTTP status, with the `Retry-After` seconds if the receiver sent them.
    Status { status: u16, retry_after: Option<Duration> },
    /// No complete answer within `timeout_ms`.
    Timeout,
    /// Connect refused, DNS, TLS, connection lost (the text has no URL).
    Transport(String),
}

/// The retry policy of one callback.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub retry: Vec<Duration>,
    pub retry_after_max: Duration,
    pub max_age_ms: i64,
}

impl Policy {
    fn from_config(c: &CallbackConfig) -> Policy {
        Policy {
            retry: c.retry_ms.iter().map(|ms| Duration::from_millis(*ms)).collect(),
            retry_after_max: Duration::from_millis(c.retry_after_max_ms),
            max_age_ms: i64::try_from(c.max_age_ms).unwrap_or(i64::MAX),
        }
    }

    /// The wait after failed attempt number `attempt` (1-based): the schedule's entry, the last one repeating.
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let i = (attempt.max(1) as usize - 1).min(self.retry.len().saturating_sub(1));
        self.retry.get(i).copied().unwrap_or(Duration::from_secs(1))
    }
}

/// What to do after an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    Delivered,
    Refused(u16),
    Retry(Duration),
    /// The next attempt would come after the event's max age.
    Expired,
}

/// The one table of what an answer means (module docs). `now_ms` is when the answer came, `deadline_ms` the
/// end of the event's max age.
pub(crate) fn decide(answer: &Answer, attempt: u32, now_ms: i64, deadline_ms: i64, policy: &Policy) -> Decision {
    let retry_after = match answer {
        Answer::Status { status, .. } if (200..300).contains(status) => return Decision::Delivered,
        Answer::Status { status, .. } if (400..500).contains(status) && !matches!(status, 408 | 429) => {
            return Decision::Refused(*status);
        }
        Answer::Status { retry_after, .. } => *retry_after,
        Answer::Timeout | Answer::Transport(_) => None,
    };
    let delay = retry_after.map_or_else(|| policy.delay(attempt), |d| d.min(policy.retry_after_max));
    let delay = delay.max(NAK_DELAY_MIN);
    if now_ms.saturating_add(delay.as_millis() as i64) > deadline_ms {
        Decision::Expired
    } else {
        Decision::Retry(delay)
    }
}

/// `Retry-After` in seconds (an HTTP date is ignored: the schedule applies).
pub(crate) fn retry_after(value: Option<&str>) -> Option<Duration> {
    value.and_then(|v| v.trim().parse::<u64>().ok()).map(Duration::from_secs)
}

/// The retry state of an event whose delivery failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RetryState {
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due, Unix ms.
    pub next_at_ms: i64,
}

/// What a delivery of an event does before any request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Its retry is not due yet: nak for this long.
    Wait(Duration),
    /// Make attempt number n.
    Attempt(u32),
}

/// The plan of a delivery: `state` is the event's retry state (None when it has none or it could not be read),
/// `delivered` the broker's delivery count.
pub(crate) fn plan(state: Option<RetryState>, delivered: i64, now_ms: i64) -> Plan {
    match state {
        Some(s) if s.next_at_ms - now_ms > NAK_DELAY_MIN.as_millis() as i64 => {
            Plan::Wait(Duration::from_millis((s.next_at_ms - now_ms) as u64).min(NAK_DELAY_MAX))
        }
        Some(s) => Plan::Attempt(s.attempts.saturating_add(1)),
        None => Plan::Attempt(u32::try_from(delivered.max(1)).unwrap_or(u32::MAX)),
    }
}

/// Opens (or creates) the retry-state bucket, with a byte limit of `max_bytes` (applied to an existing bucket
/// too). A full bucket refuses a state write: the retry then comes early (a warning), nothing is lost.
pub(crate) async fn open_state(js: &jetstream::Context, replicas: usize, max_bytes: i64) -> anyhow::Result<kv::Store> {
    let config = kv::Config {
        bucket: STATE_BUCKET.to_string(),
        description: "Breakwater ingest: retry state of producer callbacks".into(),
        history: 1,
        max_age: STATE_MAX_AGE,
        max_bytes,
        num_replicas: replicas.max(1),
        storage: jetstream::stream::StorageType::File,
        ..Default::default()
    };
    let store = bw_common::nats::open_bucket(js, config.clone()).await?;
    let wanted = bw_common::nats::kv_stream_config(&config);
    if let Err(e) = bw_common::nats::apply_stream_limits(js, store.stream.cached_info(), &wanted).await {
        crate::capacity::limits_not_applied(&wanted.name, &format!("{e:#}"));
    }
    Ok(store)
}

/// Creates (or updates, when its tenant or senders changed) the durable consumer of a callback on BW_FEED;
/// `phone_number_ids` are the configured ones the registry confirmed as `tenant`'s ([`owned_senders`]).
pub(crate) async fn consumer(
    js: &jetstream::Context,
    name: &str,
    c: &CallbackConfig,
    tenant: &str,
    phone_number_ids: &[String],
) -> anyhow::Result<consumer::pull::Stream> {
    let stream = js.get_stream(crate::feed::FEED_STREAM).await?;
    let mut filters = filters(tenant, phone_number_ids);
    let mut config = consumer::pull::Config {
        durable_name: Some(consumer_name(name)),
        description: Some(format!("Breakwater ingest: HTTP callback {name}")),
        deliver_policy: consumer::DeliverPolicy::New,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_deliver: -1,
        max_ack_pending: MAX_ACK_PENDING,
        ..Default::default()
    };
    if filters.len() == 1 {
        config.filter_subject = filters.remove(0);
    } else {
        config.filter_subjects = filters;
    }
    // Create or update: a changed tenant or list of senders (or the filters from before tenants) takes effect at
    // the next start.
    let consumer = stream.create_consumer(config).await?;
    Ok(consumer.stream().max_messages_per_batch(c.max_in_flight.max(1)).messages().await?)
}

/// The configured senders of a callback that `registry` assigns to `tenant` (all of them, `"*"` included, in
/// dev mode); each other one is left out with a warning. Err when the registry cannot be read.
pub(crate) async fn owned_senders(
    name: &str,
    c: &CallbackConfig,
    tenant: &str,
    registry: &RegistryView,
) -> Result<Vec<String>, bw_common::registry::RegistryError> {
    let mut out = Vec::new();
    for phone in &c.phone_number_ids {
        if phone == "*" || registry.is_dev() {
            out.push(phone.clone());
            continue;
        }
        match registry.owner(phone, "").await? {
            Owner::Known { tenant: owner, .. } if owner == tenant => out.push(phone.clone()),
            _ => tracing::warn!(
                callback = %name,
                phone_number_id = %phone,
                tenant = %tenant,
                "callback sender left out: the sender registry does not assign it to the callback's tenant"
            ),
        }
    }
    Ok(out)
}

/// One running callback.
pub(crate) struct Callback {
    name: String,
    url: reqwest::Url,
    shown_url: String,
    secret: Vec<u8>,
    kinds: Vec<String>,
    policy: Policy,
    http: reqwest::Client,
    state: kv::Store,
    metrics: Metrics,
}

impl Callback {
    /// Builds a callback from its validated config. Its connections go only where `egress` allows: the
    /// client's resolver checks every lookup, and it uses no proxy.
    pub(crate) fn new(
        name: &str,
        c: &CallbackConfig,
        state: kv::Store,
        metrics: Metrics,
        egress: std::sync::Arc<crate::egress::Policy>,
    ) -> anyhow::Result<Callback> {
        bw_common::crypto::install_crypto();
        let url = reqwest::Url::parse(&c.url).map_err(|_| anyhow::anyhow!("callbacks.{name}.url is not a URL"))?;
        let http = crate::egress::client_builder(egress)
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_millis(c.timeout_ms))
            .connect_timeout(Duration::from_millis(c.timeout_ms))
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("breakwater-callback/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| anyhow::anyhow!("callbacks.{name}: cannot build the HTTP client: {}", e.without_url()))?;
        Ok(Callback {
            name: name.to_string(),
            shown_url: masked_url(&c.url),
            url,
            secret: c.secret.as_bytes().to_vec(),
            kinds: c.kinds.clone(),
            policy: Policy::from_config(c),
            http,
            state,
            metrics,
        })
    }

    /// Handles one feed event and settles it (the one place its acknowledgement is decided).
    pub(crate) async fn handle(&self, msg: jetstream::Message) {
        let span = tracing::info_span!(
            "ingest.callback",
            callback = %self.name,
            event_id = tracing::field::Empty,
            attempt = tracing::field::Empty,
            result = tracing::field::Empty
        );
        // A request may take longer than the ack wait (a long timeout_ms): say it is in progress meanwhile.
        let work = self.settle(&msg, &span).instrument(span.clone());
        let settle = bw_common::disposition::with_progress(&msg, PROGRESS_EVERY, work).await;
        apply(&msg, settle, &span, |label| self.metrics.callback(&self.name, label)).await;
    }

    async fn settle(&self, msg: &jetstream::Message, span: &tracing::Span) -> Settle<Delivery> {
        let Ok(event) = OutcomeEvent::decode(msg.payload.as_ref()) else {
            tracing::warn!(callback = %self.name, "feed message is not an outcome event; dropped");
            return Settle::term(Delivery::Undecodable);
        };
        if !self.kinds.is_empty() && !self.kinds.contains(&kind_name(event.kind())) {
            return Settle::ack(Delivery::Skipped);
        }
        let event_id = format!("{}.{}", event.operation_id, event.revision);
        span.record("event_id", event_id.as_str());
        let key = bw_wire::names::callback_retry_key(&self.name, &event_id);
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        // Only a redelivery can have a retry state: the first delivery costs no read.
        let state = if delivered > 1 { self.load(&key).await } else { None };
        let now = now_ms();
        let attempt = match plan(state, delivered, now) {
            Plan::Wait(delay) => return Settle::nak(Delivery::Waiting, delay),
            Plan::Attempt(n) => n,
        };
        span.record("attempt", attempt);
        // The age counts from the revision's time; an event without one is as old as now.
        let written = if event.at_unix_ms > 0 { event.at_unix_ms } else { now };
        let deadline = written.saturating_add(self.policy.max_age_ms);
        if now > deadline {
            return self.expire(&event_id, &key, attempt.saturating_sub(1), state.is_some()).await;
        }
        let answer = self.post(body_of(&event), &event_id, attempt).await;
        let answered = now_ms();
        match decide(&answer, attempt, answered, deadline, &self.policy) {
            Decision::Delivered => {
                if state.is_some() || attempt > 1 {
                    self.forget(&key).await;
                }
                self.metrics.callback_delivered(&self.name, (answered - written).max(0) as f64 / 1000.0);
                Settle::ack(Delivery::Delivered)
            }
            Decision::Refused(status) => {
                tracing::warn!(
                    callback = %self.name,
                    url = %self.shown_url,
                    event_id = %event_id,
                    attempt,
                    http_status = status,
                    "callback receiver refused the event for good; not retried (it stays in the feed)"
                );
                if state.is_some() || attempt > 1 {
                    self.forget(&key).await;
                }
                Settle::term(Delivery::Refused)
            }
            Decision::Expired => self.expire(&event_id, &key, attempt, true).await,
            Decision::Retry(delay) => {
                tracing::info!(
                    callback = %self.name,
                    url = %self.shown_url,
                    event_id = %event_id,
                    attempt,
                    answer = %describe(&answer),
                    retry_in_ms = delay.as_millis() as u64,
                    "callback not delivered; retrying"
                );
                let next =
                    RetryState { attempts: attempt, next_at_ms: answered.saturating_add(delay.as_millis() as i64) };
                self.store(&key, next).await;
                Settle::nak(Delivery::Retried, delay.min(NAK_DELAY_MAX))
            }
        }
    }

    async fn expire(&self, event_id: &str, key: &str, attempts: u32, had_state: bool) -> Settle<Delivery> {
        tracing::error!(
            callback = %self.name,
            url = %self.shown_url,
            event_id = %event_id,
            attempts,
            max_age_ms = self.policy.max_age_ms,
            "callback event not delivered within its max age; dropped (it stays in the feed)"
        );
        if had_state {
            self.forget(key).await;
        }
        Settle::term(Delivery::Expired)
    }

    /// POSTs one event.
    async fn post(&self, body: Vec<u8>, event_id: &str, attempt: u32) -> Answer {
        let signature = crate::webhook::sign(&self.secret, &body);
        let started = Instant::now();
        let sent = self
            .http
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .header(EVENT_ID_HEADER, event_id)
            .header(ATTEMPT_HEADER, attempt.to_string())
            .body(body)
            .send()
            .await;
        let answer = match sent {
            Ok(mut response) => {
                let status = response.status().as_u16();
                let retry_after =
                    retry_after(response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()));
                // Read a little of the answer so the connection can be reused; its content does not matter.
                let mut read = 0;
                while read < MAX_ANSWER_BYTES {
                    match response.chunk().await {
                        Ok(Some(chunk)) => read += chunk.len(),
                        _ => break,
                    }
                }
                Answer::Status { status, retry_after }
            }
            Err(e) if e.is_timeout() => Answer::Timeout,
            Err(e) if crate::egress::is_refused(&e) => {
                // The name resolves (now) only to addresses callbacks may not reach: retried like a connection
                // error, and counted apart.
                self.metrics.callback_egress_refused(&self.name);
                Answer::Transport(
                    "destination refused: its host resolves only to addresses callbacks may not reach \
                     (egress.allow_cidrs)"
                        .to_string(),
                )
            }
            Err(e) => Answer::Transport(bw_common::error_chain(&e.without_url())),
        };
        self.metrics.callback_request(&self.name, started.elapsed().as_secs_f64());
        answer
    }

    async fn load(&self, key: &str) -> Option<RetryState> {
        match self.state.get(key).await {
            Ok(Some(bytes)) => serde_json::from_slice(&bytes).ok(),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(
                    callback = %self.name,
                    error = %e,
                    "callback retry state unreadable; attempts counted by deliveries"
                );
                None
            }
        }
    }

    async fn store(&self, key: &str, state: RetryState) {
        let Ok(bytes) = serde_json::to_vec(&state) else { return };
        if let Err(e) = self.state.put(key, bytes.into()).await {
            let name = &self.name;
            tracing::warn!(callback = %name, error = %e, "callback retry state not stored; the retry may come early");
        }
    }

    async fn forget(&self, key: &str) {
        if let Err(e) = self.state.delete(key).await {
            tracing::debug!(callback = %self.name, error = %e, "callback retry state not deleted; it expires");
        }
    }
}

/// A short text of an answer for logs.
fn describe(answer: &Answer) -> String {
    match answer {
        Answer::Status { status, .. } => format!("http {status}"),
        Answer::Timeout => "timeout".to_string(),
        Answer::Transport(e) => e.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_config() -> CallbackConfig {
        CallbackConfig {
            url: "https://crm.example/x".into(),
            secret: "s".into(),
            tenant: None,
            phone_number_ids: vec!["*".into()],
            kinds: vec![],
            timeout_ms: defaults::TIMEOUT_MS,
            max_in_flight: defaults::MAX_IN_FLIGHT,
            retry_ms: defaults::retry_ms(),
            retry_after_max_ms: defaults::RETRY_AFTER_MAX_MS,
            max_age_ms: defaults::MAX_AGE_MS,
        }
    }

    fn policy() -> Policy {
        Policy::from_config(&policy_config())
    }

    const DAY: i64 = 86_400_000;

    #[test]
    fn answers_map_to_one_decision_each() {
        let p = policy();
        let status = |s: u16| Answer::Status { status: s, retry_after: None };
        assert_eq!(decide(&status(200), 1, 0, DAY, &p), Decision::Delivered);
        assert_eq!(decide(&status(204), 3, 0, DAY, &p), Decision::Delivered);
        for s in [400, 401, 403, 404, 410, 422] {
            assert_eq!(decide(&status(s), 1, 0, DAY, &p), Decision::Refused(s), "{s}");
        }
        for s in [408, 429, 500, 502, 503, 301] {
            assert_eq!(decide(&status(s), 1, 0, DAY, &p), Decision::Retry(Duration::from_secs(1)), "{s}");
        }
        assert_eq!(decide(&Answer::Timeout, 2, 0, DAY, &p), Decision::Retry(Duration::from_secs(5)));
        assert_eq!(
            decide(&Answer::Transport("refused".into()), 3, 0, DAY, &p),
            Decision::Retry(Duration::from_secs(30))
        );
    }

    #[test]
    fn the_schedule_increases_then_repeats_its_last_delay_and_retry_after_is_capped() {
        let p = policy();
        let secs: Vec<u64> = (1..=8).map(|a| p.delay(a).as_secs()).collect();
        assert_eq!(secs, vec![1, 5, 30, 120, 600, 3600, 3600, 3600]);
        let later = |s: u64| Answer::Status { status: 429, retry_after: Some(Duration::from_secs(s)) };
        assert_eq!(decide(&later(7), 1, 0, DAY, &p), Decision::Retry(Duration::from_secs(7)));
        assert_eq!(decide(&later(86_400), 1, 0, DAY, &p), Decision::Retry(Duration::from_secs(3600)));
        assert_eq!(retry_after(Some(" 120 ")), Some(Duration::from_secs(120)));
        assert_eq!(retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")), None);
        assert_eq!(retry_after(None), None);
    }

    #[test]
    fn a_retry_past_the_max_age_drops_the_event() {
        let p = policy();
        let fail = Answer::Status { status: 500, retry_after: None };
        assert_eq!(decide(&fail, 6, DAY - 3_600_000, DAY, &p), Decision::Retry(Duration::from_secs(3600)));
        assert_eq!(decide(&fail, 6, DAY - 3_599_999, DAY, &p), Decision::Expired);
    }

    #[test]
    fn long_delays_wait_in_steps_the_broker_allows_and_attempts_count_from_the_state() {
        let now = 1_000_000;
        assert_eq!(plan(None, 1, now), Plan::Attempt(1));
        assert_eq!(plan(None, 3, now), Plan::Attempt(3));
        let waiting = RetryState { attempts: 6, next_at_ms: now + 3_600_000 };
        assert_eq!(plan(Some(waiting), 9, now), Plan::Wait(NAK_DELAY_MAX));
        let soon = RetryState { attempts: 6, next_at_ms: now + 2_000 };
        assert_eq!(plan(Some(soon), 9, now), Plan::Wait(Duration::from_secs(2)));
        let due = RetryState { attempts: 6, next_at_ms: now };
        assert_eq!(plan(Some(due), 20, now), Plan::Attempt(7));
    }

    #[test]
    fn filters_stay_inside_the_tenant() {
        assert_eq!(filters("crm", &["*".to_string()]), vec!["bw.feed.v1.crm.>"]);
        assert_eq!(
            filters("crm", &["2003".to_string(), "2002".to_string(), "2002".to_string()]),
            vec!["bw.feed.v1.crm.2002.>", "bw.feed.v1.crm.2003.>"]
        );
        let mut c = policy_config();
        assert!(
            validate("crm", &c, TenancyMode::Registry).is_err_and(|e| e.contains("callbacks.crm.tenant is required"))
        );
        assert_eq!(tenant_of(&c, TenancyMode::Dev), DEFAULT_TENANT);
        c.tenant = Some("crm".into());
        assert!(validate("crm", &c, TenancyMode::Registry).is_ok());
        assert_eq!(tenant_of(&c, TenancyMode::Registry), "crm");
        assert_eq!(tenant_of(&c, TenancyMode::Dev), DEFAULT_TENANT, "dev mode: every number is default's");
        c.tenant = Some("a.b".into());
        assert!(validate("crm", &c, TenancyMode::Dev).is_err_and(|e| e.contains("callbacks.crm.tenant must be")));
    }

    #[test]
    fn urls_are_shown_without_credentials_or_query() {
        assert_eq!(
            masked_url("https://bot:hunter2@crm.example:8443/hooks/bw?token=abc#x"),
            "https://<masked>@crm.example:8443/hooks/bw?<masked>"
        );
        assert_eq!(masked_url("http://127.0.0.1:9000/cb"), "http://127.0.0.1:9000/cb");
        assert_eq!(masked_url("not a url"), "<invalid url>");
        let c = CallbackConfig {
            url: "https://u:pw@crm.example/cb?k=v".into(),
            secret: "s3cr3t-value".into(),
            tenant: Some("crm".into()),
            phone_number_ids: vec!["*".into()],
            kinds: vec![],
            timeout_ms: 1,
            max_in_flight: 1,
            retry_ms: vec![1],
            retry_after_max_ms: 1,
            max_age_ms: 1,
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cr3t-value") && !shown.contains("pw") && !shown.contains("k=v"), "{shown}");
    }

    #[test]
    fn the_body_names_the_event_and_leaves_out_what_is_unset() {
        let e = OutcomeEvent {
            operation_id: "op-1".into(),
            tenant: "crm".into(),
            revision: 42,
            kind: OutcomeKind::DeadLettered as i32,
            state: bw_proto::v1::OperationState::Dlq as i32,
            phone_number_id: "2002".into(),
            at_unix_ms: 1_796_183_919_004,
            ..Default::default()
        };
        let v: serde_json::Value = serde_json::from_slice(&body_of(&e)).expect("json");
        assert_eq!(v["event_id"], "op-1.42");
        assert_eq!(v["tenant"], "crm");
        assert_eq!(v["kind"], "dead_lettered");
        assert_eq!(v["state"], "dlq");
        assert_eq!(v["at"], "2026-12-02T03:58:39.004Z");
        for absent in ["wamid", "code", "details", "incident", "accepted_at", "accepted_at_ms"] {
            assert!(v.get(absent).is_none(), "{absent} in {v}");
        }
        assert!(kind_names().contains(&"resolved".to_string()) && !kind_names().contains(&"unspecified".to_string()));
    }

    /// A name that resolves only to a refused address (DNS rebinding after set-up looks the same to the
    /// connection): the attempt fails without a connection, is retried like a connection error, and is counted.
    #[tokio::test]
    async fn a_refused_destination_fails_the_attempt_retried_and_counted() {
        use futures::FutureExt as _;
        let server = bw_testkit::NatsServer::start();
        let nats = async_nats::connect(server.url()).await.expect("nats");
        let js = jetstream::new(nats);
        let state = open_state(&js, 1, 1 << 20).await.expect("state bucket");
        let registry = bw_common::admin::new_registry();
        let metrics = Metrics::register(&registry);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://localhost:{}/hooks", listener.local_addr().expect("addr").port());
        let c = CallbackConfig { url, ..policy_config() };
        let cb = Callback::new("crm", &c, state, metrics, std::sync::Arc::new(crate::egress::Policy::default()))
            .expect("callback");
        let answer = cb.post(b"{}".to_vec(), "op-1.1", 1).await;
        assert!(matches!(&answer, Answer::Transport(e) if e.contains("destination refused")), "{answer:?}");
        assert!(matches!(decide(&answer, 1, 0, DAY, &cb.policy), Decision::Retry(_)));
        assert!(listener.accept().now_or_never().is_none(), "no connection was made");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry.lock().expect("registry")).expect("encode");
        assert!(text.contains(r#"bw_callback_egress_refused_total{callback="crm"} 1"#), "{text}");
    }
}
