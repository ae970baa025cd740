//! Layered configuration: the shared base ([`BASE`], the sections a service's defaults name in `base = [...]`) →
//! the service's compiled defaults → optional TOML file → environment, later wins.
//!
//! Environment keys are `BW_<SERVICE>__<SECTION>__<FIELD>` (double underscore separates levels), for example
//! `BW_DISPATCHER__NATS__URL=nats://10.0.0.5:4222`. Values are parsed as TOML scalars when they parse
//! (numbers, booleans), else taken as strings. The loader takes the environment as a map so tests never touch
//! the process environment.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::path::Path;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file `{path}`: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("invalid TOML in {origin}: {source}")]
    Toml { origin: String, source: toml::de::Error },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The sections every service shares (`[nats]`, `[redis]`, `[admin]`, `[telemetry]`), each key documented once.
pub const BASE: &str = include_str!("../base.toml");

/// The top-level key of a service's compiled defaults that names the [`BASE`] sections it takes.
pub const BASE_KEY: &str = "base";

/// A service's compiled defaults over the [`BASE`] sections they name in `base = [...]` (none when absent).
pub fn defaults_table(defaults: &str) -> Result<toml::Table, ConfigError> {
    let mut own: toml::Table =
        toml::from_str(defaults).map_err(|source| ConfigError::Toml { origin: "compiled defaults".into(), source })?;
    let Some(wanted) = own.remove(BASE_KEY) else { return Ok(own) };
    let mut base: toml::Table =
        toml::from_str(BASE).map_err(|source| ConfigError::Toml { origin: "the shared base".into(), source })?;
    let known = base.keys().cloned().collect::<Vec<_>>().join(", ");
    let names = wanted.as_array().cloned().unwrap_or_default();
    if names.is_empty() {
        return Err(ConfigError::Invalid(format!("compiled defaults: `{BASE_KEY}` must list sections of {known}")));
    }
    let mut merged = toml::Table::new();
    for name in names {
        let section = name.as_str().and_then(|n| base.remove(n).map(|t| (n.to_string(), t)));
        let Some((name, table)) = section else {
            return Err(ConfigError::Invalid(format!(
                "compiled defaults: `{BASE_KEY}` names {name}, not one of {known}"
            )));
        };
        merged.insert(name, table);
    }
    merge(&mut merged, own);
    Ok(merged)
}

/// Loads `T` from the [`BASE`] sections `defaults` names, then `defaults` (TOML text), then `file`, then env keys
/// starting with `BW_<SERVICE>__`.
pub fn load<T: DeserializeOwned>(
    service: &str,
    defaults: &str,
    file: Option<&Path>,
    env: &HashMap<String, String>,
) -> Result<T, ConfigError> {
    let mut merged = defaults_table(defaults)?;
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        let layer: toml::Table =
            toml::from_str(&text).map_err(|source| ConfigError::Toml { origin: path.display().to_string(), source })?;
        merge(&mut merged, layer);
    }
    let prefix = format!("BW_{}__", service.to_ascii_uppercase().replace('-', "_"));
    let mut env_keys: Vec<(&String, &String)> = env.iter().filter(|(k, _)| k.starts_with(&prefix)).collect();
    env_keys.sort();
    for (key, value) in env_keys {
        let path: Vec<String> = key[prefix.len()..].split("__").map(|s| s.to_ascii_lowercase()).collect();
        set_path(&mut merged, &path, parse_scalar(value));
    }
    T::deserialize(toml::Value::Table(merged)).map_err(|e| ConfigError::Invalid(without_values(&e.to_string())))
}

/// A deserialization error without the offending value: serde quotes it in backticks (`invalid type: integer
/// `8675309123`, expected a string`), and the value may be a secret or a phone number. Field and variant names
/// (after "expected" / "unknown field") stay, they are what the reader needs.
/// True when every URL of a comma-separated list (`nats://a:4222,nats://b:4222`, `http://127.0.0.1:9400`) points
/// at this machine: the local stack, the drill, tests. Start-up warnings about local defaults use it.
pub fn points_at_this_machine(urls: &str) -> bool {
    urls.split(',').all(|u| {
        let u = u.trim();
        let host = u.split_once("://").map_or(u, |(_, rest)| rest);
        let host = host.rsplit('@').next().unwrap_or(host);
        host.starts_with("127.") || host.starts_with("localhost") || host.starts_with("[::1]")
    })
}

fn without_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for line in message.lines() {
        if !out.is_empty() {
            out.push('\n');
        }
        match (line.find("invalid type: "), line.find("invalid value: ")) {
            (Some(at), _) | (None, Some(at)) => {
                let (head, rest) = line.split_at(at);
                out.push_str(head);
                // Keep "invalid type: integer" / "invalid value: string", drop the quoted value.
                let mut kept = rest.to_string();
                if let Some(open) = kept.find('`')
                    && let Some(close) = kept[open + 1..].find('`')
                {
                    kept.replace_range(open..open + close + 2, "(value not shown)");
                }
                out.push_str(&kept);
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// Deserializes a text field (token, secret, id) from whatever the layers hold: an environment value that looks
/// like a number or a boolean (`BW_INGEST__WEBHOOK__VERIFY_TOKEN=8675309123`) is parsed as a TOML scalar, yet it
/// is still the text the operator wrote. Use with `#[serde(deserialize_with = "bw_common::config::text")]`.
pub fn text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Integer(i64),
        Float(f64),
        Bool(bool),
    }
    Ok(match Scalar::deserialize(d)? {
        Scalar::Text(s) => s,
        Scalar::Integer(n) => n.to_string(),
        Scalar::Float(f) => f.to_string(),
        Scalar::Bool(b) => b.to_string(),
    })
}

fn parse_scalar(raw: &str) -> toml::Value {
    #[derive(Deserialize)]
    struct Probe {
        v: toml::Value,
    }
    match toml::from_str::<Probe>(&format!("v = {raw}")) {
        Ok(p) => p.v,
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) {
    match path {
        [] => {}
        [last] => {
            table.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = table.entry(first.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(inner) = entry {
                set_path(inner, rest, value);
            }
        }
    }
}

fn merge(base: &mut toml::Table, layer: toml::Table) {
    for (key, value) in layer {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(l)) => merge(b, l),
            (_, v) => {
                base.insert(key, v);
            }
        }
    }
}

/// NATS connection settings, shared by every service.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// Comma-separated server URLs.
    pub url: String,
    /// Connection name shown in NATS monitoring.
    #[serde(default)]
    pub name: String,
    /// Prefix of this connection's reply inboxes (request/reply, JetStream API answers, push deliveries), e.g.
    /// `_INBOX_dispatcher` for a NATS user that may subscribe only to `_INBOX_dispatcher.>`
    /// (`deploy/nats/accounts.conf`). Empty: the client's default `_INBOX`.
    #[serde(default)]
    pub inbox_prefix: String,
    /// Stream replicas when creating streams (1 locally, 3 on a cluster).
    #[serde(default = "one")]
    pub replicas: usize,
    /// Ledger partitions (`BW_LEDGER`, `BW_LEDGER_1`, …, by operation id): each is its own stream, so on a
    /// cluster their leaders (and the ledger's write load) spread over the nodes. Fixed when the ledger is first
    /// created: every service must be given that number, and one that is not refuses to start
    /// ([`crate::nats::ensure_topology`]). 1 on one machine.
    #[serde(default = "one")]
    pub ledger_partitions: usize,
    /// BW_SEND and DLQ partitions (`BW_SEND`, `BW_SEND_1`, …, `BW_DLQ`, `BW_DLQ_1`, …, by sender:
    /// [`bw_wire::names::SendPartitions`]): each is its own stream, so on a cluster the send load's leaders spread
    /// over the nodes, and dispatchers can each serve some (`dispatch.partitions`). Fixed when BW_SEND is first
    /// created, like `ledger_partitions`: a service given another number refuses to start. 1 on one machine.
    #[serde(default = "one")]
    pub send_partitions: usize,
    /// PEM file of the CA that signed the NATS servers' certificates. Set: every connection requires TLS and
    /// trusts this CA (the Kubernetes NATS cluster: `deploy/k8s/nats.yaml`). Empty: the system's roots, and TLS
    /// only when the server or a `tls://` URL asks for it.
    #[serde(default)]
    pub tls_ca_file: String,
    /// Stream limits used when the streams are first created.
    #[serde(default)]
    pub limits: StreamLimits,
}

impl NatsConfig {
    /// One server (or a comma-separated list) with single-replica streams, the default limits and the client's
    /// default inbox: what tools, tests and the drill connect with.
    pub fn single(url: impl Into<String>, name: impl Into<String>) -> NatsConfig {
        NatsConfig {
            url: url.into(),
            name: name.into(),
            inbox_prefix: String::new(),
            replicas: 1,
            ledger_partitions: 1,
            send_partitions: 1,
            tls_ca_file: String::new(),
            limits: StreamLimits::default(),
        }
    }
}

/// Limits of the JetStream streams and buckets, applied when they are created and, by ingest, to existing ones
/// at its start (`bw_common::nats::apply_limits`): give every service the same values. Every stream and bucket
/// has a byte limit, so a flood cannot fill the disk. What happens at a limit is chosen per stream (its
/// discard policy, in [`crate::nats::stream_configs`]): where losing a message would break a promise (BW_SEND,
/// the ledger, the DLQ, BW_UNKNOWN, BW_WEBHOOKS, BW_QUARANTINE, every KV bucket, the large-body store) a full
/// stream refuses the publish (DiscardNew) and the writer reports it; streams that are a time-bounded record for
/// readers (BW_REJECTED, BW_INBOUND, BW_EVENTS, BW_FEED) drop their oldest messages (DiscardOld), as their
/// `max_age` already does. The alerting service warns well before a refusing stream is full, and ingest refuses
/// new requests near the limit of BW_SEND or the ledger (`intake.storage_full_ratio`).
///
/// The server reserves each stream's `max_bytes` on disk when it creates the stream, and refuses one that would
/// take the sum past its `max_file_store` ("insufficient storage resources"): the sum of these limits (the
/// per-partition ones once per partition) must fit the NATS store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamLimits {
    /// Max messages waiting in BW_SEND.
    pub send_max_msgs: i64,
    /// Max messages in BW_DLQ.
    pub dlq_max_msgs: i64,
    /// Max messages in BW_QUARANTINE.
    pub quarantine_max_msgs: i64,
    /// Producer dedup window of BW_SEND (Nats-Msg-Id = operation id), seconds. The ledger dedups beyond it.
    pub dedup_window_s: u64,
    /// How long ledger entries are kept, days.
    pub ledger_max_age_days: u64,
    /// How long webhook dedup keys are kept, hours (Meta retries for up to 7 days).
    pub webhook_dedup_hours: u64,
    /// Bytes of each BW_SEND partition (DiscardNew).
    pub send_max_bytes: i64,
    /// Bytes of each BW_DLQ partition (DiscardNew).
    pub dlq_max_bytes: i64,
    /// Bytes of BW_UNKNOWN (DiscardNew).
    pub unknown_max_bytes: i64,
    /// Bytes of BW_WEBHOOKS, stored deliveries waiting to be processed (DiscardNew: Meta is answered 503 and
    /// retries for up to 7 days).
    pub webhook_max_bytes: i64,
    /// Bytes of BW_QUARANTINE (DiscardNew).
    pub quarantine_max_bytes: i64,
    /// Bytes of BW_REJECTED, the inspection copies of rejected requests (DiscardOld).
    pub rejected_max_bytes: i64,
    /// Bytes of BW_INBOUND, customers' messages for the business's readers (DiscardOld).
    pub inbound_max_bytes: i64,
    /// Bytes of BW_EVENTS, breaker, signal and alert events (DiscardOld).
    pub events_max_bytes: i64,
    /// Bytes of the outcome feed BW_FEED (DiscardOld; the ledger stays the record).
    pub feed_max_bytes: i64,
    /// Bytes of each ledger partition's bucket (DiscardNew, like every bucket).
    pub ledger_max_bytes: i64,
    /// Bytes of each wamid link partition's bucket.
    pub wamid_max_bytes: i64,
    /// Bytes of BW_SCOPES (scope snapshots).
    pub scopes_max_bytes: i64,
    /// Bytes of BW_WEBHOOK_DEDUP.
    pub webhook_dedup_max_bytes: i64,
    /// Bytes of the object store BW_INGEST_BODIES (webhook bodies over the server's max_payload).
    pub bodies_max_bytes: i64,
    /// Bytes of each small bucket a service keeps for itself: BW_CALLBACK_RETRIES, BW_REPLAY_LEASES,
    /// BW_INCIDENTS, BW_COORDINATOR_LEADER, BW_ALERTS.
    pub service_bucket_max_bytes: i64,
}

const MIB: i64 = 1024 * 1024;
const GIB: i64 = 1024 * MIB;

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            send_max_msgs: 10_000_000,
            dlq_max_msgs: 5_000_000,
            quarantine_max_msgs: 1_000_000,
            dedup_window_s: 600,
            ledger_max_age_days: 35,
            webhook_dedup_hours: 7 * 24,
            send_max_bytes: GIB,
            dlq_max_bytes: GIB,
            unknown_max_bytes: 256 * MIB,
            webhook_max_bytes: GIB,
            quarantine_max_bytes: 256 * MIB,
            rejected_max_bytes: 256 * MIB,
            inbound_max_bytes: 512 * MIB,
            events_max_bytes: 256 * MIB,
            feed_max_bytes: GIB,
            ledger_max_bytes: 2 * GIB,
            wamid_max_bytes: 512 * MIB,
            scopes_max_bytes: 64 * MIB,
            webhook_dedup_max_bytes: 256 * MIB,
            bodies_max_bytes: GIB,
            service_bucket_max_bytes: 64 * MIB,
        }
    }
}

impl StreamLimits {
    /// Every byte limit by key, for validation and documentation.
    pub fn byte_limits(&self) -> [(&'static str, i64); 15] {
        [
            ("send_max_bytes", self.send_max_bytes),
            ("dlq_max_bytes", self.dlq_max_bytes),
            ("unknown_max_bytes", self.unknown_max_bytes),
            ("webhook_max_bytes", self.webhook_max_bytes),
            ("quarantine_max_bytes", self.quarantine_max_bytes),
            ("rejected_max_bytes", self.rejected_max_bytes),
            ("inbound_max_bytes", self.inbound_max_bytes),
            ("events_max_bytes", self.events_max_bytes),
            ("feed_max_bytes", self.feed_max_bytes),
            ("ledger_max_bytes", self.ledger_max_bytes),
            ("wamid_max_bytes", self.wamid_max_bytes),
            ("scopes_max_bytes", self.scopes_max_bytes),
            ("webhook_dedup_max_bytes", self.webhook_dedup_max_bytes),
            ("bodies_max_bytes", self.bodies_max_bytes),
            ("service_bucket_max_bytes", self.service_bucket_max_bytes),
        ]
    }

    /// Refuses a byte limit that is not positive: JetStream reads 0 and -1 as "no limit", and every stream
    /// must have one.
    pub fn validate(&self) -> Result<(), String> {
        match self.byte_limits().into_iter().find(|(_, v)| *v <= 0) {
            Some((key, _)) => Err(format!("nats.limits.{key} must be > 0 (bytes; every stream has a byte limit)")),
            None => Ok(()),
        }
    }
}

fn one() -> usize {
    1
}

/// Redis connection settings, of every Redis user (each service, the drill) through
/// [`crate::redis_conn::connect_config`].
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://host:port/db` of a single node; unused when `cluster_nodes` is set.
    pub url: String,
    /// Seed nodes of a Redis Cluster (`redis://host:port` each; any reachable one is enough). Non-empty:
    /// connect to the cluster instead of `url`. Env: `BW_<SERVICE>__REDIS__CLUSTER_NODES` as a TOML array.
    #[serde(default)]
    pub cluster_nodes: Vec<String>,
    /// ACL user (Redis 6+) sent with `AUTH`; empty: Redis's `default` user.
    #[serde(default, deserialize_with = "text")]
    pub username: String,
    /// Password sent with `AUTH` on every connection (the single node, or every node of the cluster); empty:
    /// no `AUTH`. A secret: set it from the environment (`BW_<SERVICE>__REDIS__PASSWORD`), never in a file;
    /// it never appears in `Debug`, logs or errors.
    #[serde(default, deserialize_with = "text")]
    pub password: String,
    /// Per-command timeout in milliseconds; past it a call counts as Redis unreachable.
    #[serde(default = "default_redis_timeout")]
    pub timeout_ms: u64,
}

impl RedisConfig {
    /// One node at `url`, no credentials, the default timeout: what tools and tests connect with.
    pub fn single(url: impl Into<String>) -> RedisConfig {
        RedisConfig {
            url: url.into(),
            cluster_nodes: Vec::new(),
            username: String::new(),
            password: String::new(),
            timeout_ms: default_redis_timeout(),
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.cluster_nodes.iter().map(|n| redact_url(n)).collect();
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(&self.url))
            .field("cluster_nodes", &nodes)
            .field("username", &self.username)
            .field("password", &if self.password.is_empty() { "<none>" } else { "<redacted>" })
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

fn default_redis_timeout() -> u64 {
    250
}

/// Admin HTTP server (`/livez`, `/readyz`, `/metrics`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Listen address, e.g. `127.0.0.1:9101`; port 0 picks a free one.
    pub listen: String,
}

/// Logging and tracing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Default log filter when RUST_LOG is unset.
    #[serde(default = "default_level")]
    pub log_level: String,
    /// `text` or `json`.
    #[serde(default = "default_format")]
    pub log_format: String,
    /// OTLP/HTTP traces endpoint (`http://127.0.0.1:4318/v1/traces`); empty disables export.
    #[serde(default)]
    pub otlp_endpoint: String,
}

fn default_level() -> String {
    "info".into()
}

fn default_format() -> String {
    "text".into()
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig { log_level: default_level(), log_format: default_format(), otlp_endpoint: String::new() }
    }
}

/// Reads the process environment into a map (only `main` calls this).
pub fn process_env() -> HashMap<String, String> {
    std::env::vars().collect()
}

/// `urls` with any `user:password@` replaced by `***@`, for logs and errors.
pub fn redact_url(urls: &str) -> String {
    urls.split(',')
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => format!("{}***{}", &u[..scheme + 3], &u[at..]),
            (None, Some(at)) => format!("***{}", &u[at..]),
            _ => u.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        nats: NatsConfig,
        workers: u32,
        #[serde(default)]
        name: String,
    }

    const DEFAULTS: &str = "workers = 4\n[nats]\nurl = \"nats://127.0.0.1:4222\"\n";

    #[test]
    fn layers_apply_in_order() {
        let dir = std::env::temp_dir().join(format!("bw-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("c.toml");
        std::fs::write(&file, "workers = 8\nname = \"from-file\"\n").expect("write");
        let env = HashMap::from([
            ("BW_DISPATCHER__NATS__URL".to_string(), "nats://10.0.0.5:4222".to_string()),
            ("BW_DISPATCHER__WORKERS".to_string(), "16".to_string()),
            ("BW_OTHER__WORKERS".to_string(), "99".to_string()),
        ]);
        let cfg: Sample = load("dispatcher", DEFAULTS, Some(&file), &env).expect("loads");
        assert_eq!(cfg.workers, 16);
        assert_eq!(cfg.name, "from-file");
        assert_eq!(cfg.nats.url, "nats://10.0.0.5:4222");
        assert_eq!(cfg.nats.replicas, 1);
    }

    #[derive(Debug, Deserialize)]
    struct Secret {
        #[serde(deserialize_with = "text")]
        token: String,
        plain: Option<String>,
    }

    #[test]
    fn text_fields_take_numeric_env_values_as_written_and_errors_never_show_values() {
        let env = HashMap::from([("BW_X__TOKEN".to_string(), "8675309123".to_string())]);
        let cfg: Secret = load("x", "", None, &env).expect("a numeric token is text");
        assert_eq!((cfg.token.as_str(), cfg.plain), ("8675309123", None));
        let env = HashMap::from([
            ("BW_X__TOKEN".to_string(), "abc".to_string()),
            ("BW_X__PLAIN".to_string(), "5491155550099".to_string()),
        ]);
        let err = load::<Secret>("x", "", None, &env).expect_err("a plain String field refuses an integer");
        let msg = err.to_string();
        assert!(!msg.contains("5491155550099"), "the value leaked: {msg}");
        assert!(msg.contains("invalid type: integer"), "{msg}");
    }

    #[test]
    fn the_redis_password_comes_from_the_environment_and_never_shows_in_debug() {
        #[derive(Debug, Deserialize)]
        struct WithRedis {
            redis: RedisConfig,
        }
        let defaults = "[redis]\nurl = \"redis://u:url-secret@10.0.0.7:6379/\"\n";
        let env = HashMap::from([
            ("BW_DISPATCHER__REDIS__PASSWORD".to_string(), "86753091234".to_string()),
            ("BW_DISPATCHER__REDIS__USERNAME".to_string(), "bw-dispatcher".to_string()),
        ]);
        let cfg: WithRedis = load("dispatcher", defaults, None, &env).expect("loads");
        assert_eq!((cfg.redis.username.as_str(), cfg.redis.password.as_str()), ("bw-dispatcher", "86753091234"));
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("86753091234") && !shown.contains("url-secret"), "{shown}");
        assert!(shown.contains("<redacted>") && shown.contains("10.0.0.7:6379") && shown.contains("bw-dispatcher"));
        let unset: WithRedis = load("dispatcher", defaults, None, &HashMap::new()).expect("loads");
        assert!(unset.redis.password.is_empty() && format!("{unset:?}").contains("<none>"));
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Service {
        nats: NatsConfig,
        redis: RedisConfig,
        admin: AdminConfig,
        telemetry: TelemetryConfig,
        workers: u32,
    }

    const SERVICE: &str = "base = [\"nats\", \"redis\", \"admin\", \"telemetry\"]\nworkers = 4\n\
                           [admin]\nlisten = \"127.0.0.1:9102\"\n";

    #[test]
    fn the_base_comes_first_its_values_are_the_compiled_ones_and_env_still_overrides() {
        let cfg: Service = load("dispatcher", SERVICE, None, &HashMap::new()).expect("loads");
        // The service's own value wins over the base's; the rest is the base's.
        assert_eq!((cfg.admin.listen.as_str(), cfg.workers), ("127.0.0.1:9102", 4));
        assert_eq!(
            (cfg.nats.url.as_str(), cfg.redis.url.as_str()),
            ("nats://127.0.0.1:4222", "redis://127.0.0.1:6379/")
        );
        // The base states the compiled defaults of the shared structs: a drift fails here.
        assert_eq!(format!("{:?}", cfg.nats.limits), format!("{:?}", StreamLimits::default()));
        assert_eq!((cfg.nats.replicas, cfg.nats.ledger_partitions, cfg.nats.send_partitions), (1, 1, 1));
        assert_eq!(
            (cfg.nats.name.as_str(), cfg.nats.inbox_prefix.as_str(), cfg.nats.tls_ca_file.as_str()),
            ("", "", "")
        );
        assert_eq!(format!("{:?}", cfg.redis), format!("{:?}", RedisConfig::single("redis://127.0.0.1:6379/")));
        let t = TelemetryConfig::default();
        assert_eq!(
            (&cfg.telemetry.log_level, &cfg.telemetry.log_format, &cfg.telemetry.otlp_endpoint),
            (&t.log_level, &t.log_format, &t.otlp_endpoint)
        );
        // BW_<SERVICE>__SECTION__KEY overrides a base key, a nested one and a service's own value.
        let env = HashMap::from([
            ("BW_DISPATCHER__NATS__URL".to_string(), "nats://10.0.0.5:4222".to_string()),
            ("BW_DISPATCHER__NATS__LIMITS__SEND_MAX_BYTES".to_string(), "4096".to_string()),
            ("BW_DISPATCHER__REDIS__TIMEOUT_MS".to_string(), "900".to_string()),
            ("BW_DISPATCHER__ADMIN__LISTEN".to_string(), "0.0.0.0:9102".to_string()),
            ("BW_DISPATCHER__TELEMETRY__LOG_FORMAT".to_string(), "json".to_string()),
        ]);
        let cfg: Service = load("dispatcher", SERVICE, None, &env).expect("loads");
        assert_eq!((cfg.nats.url.as_str(), cfg.nats.limits.send_max_bytes), ("nats://10.0.0.5:4222", 4096));
        assert_eq!((cfg.redis.timeout_ms, cfg.admin.listen.as_str()), (900, "0.0.0.0:9102"));
        assert_eq!(cfg.telemetry.log_format, "json");
        // A service that takes only some sections gets only those (deny_unknown_fields still holds).
        let only_nats: Sample = load("x", "base = [\"nats\"]\nworkers = 1\n", None, &HashMap::new()).expect("loads");
        assert_eq!(only_nats.nats.url, "nats://127.0.0.1:4222");
        let err = load::<Sample>("x", "base = [\"nats\", \"kafka\"]\nworkers = 1\n", None, &HashMap::new())
            .expect_err("no such section");
        assert!(err.to_string().contains("names \"kafka\", not one of"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_files_are_clear_errors() {
        let env = HashMap::from([("BW_DISPATCHER__WORKRS".to_string(), "3".to_string())]);
        let err = load::<Sample>("dispatcher", DEFAULTS, None, &env).expect_err("typo rejected");
        assert!(err.to_string().contains("workrs"), "{err}");
        let err = load::<Sample>("dispatcher", DEFAULTS, Some(Path::new("/nonexistent/x.toml")), &HashMap::new())
            .expect_err("missing file");
        assert!(err.to_string().contains("/nonexistent/x.toml"), "{err}");
    }
}

#[cfg(test)]
mod redact_tests {
    #[test]
    fn credentials_never_show_in_urls() {
        assert_eq!(super::redact_url("nats://svc:s3cret@10.0.0.5:4222"), "nats://***@10.0.0.5:4222");
        assert_eq!(super::redact_url("nats://a:4222, nats://u:p@b:4222"), "nats://a:4222, nats://***@b:4222");
        assert_eq!(super::redact_url("u:p@h:1"), "***@h:1");
    }
}
