//! A stack of tenants as a deployment runs it: nats-server with deploy/nats/accounts.conf whose producers' region
//! is what `bwctl senders nats-accounts` prints for the registered numbers, the operator registering them with
//! `bwctl senders add`, every service as its own NATS user at the compiled default tenancy (the registry),
//! redis-server and the Meta simulator. Each tenant connects as its own user with its own password and inbox
//! prefix, and has its own HTTP key.

use bw_common::service::Deps;
use bw_e2e::{ACCESS_TOKEN, APP_SECRET};
use bw_proto::v1::SenderRecord;
use bw_testkit::{NatsServer, RedisServer};
use bw_wire::tenancy;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// The service and operator users of accounts.conf, by the variable holding each password.
const SERVICE_USERS: [(&str, &str); 7] = [
    ("ingest", "BW_NATS_INGEST_PASSWORD"),
    ("dispatcher", "BW_NATS_DISPATCHER_PASSWORD"),
    ("replay", "BW_NATS_REPLAY_PASSWORD"),
    ("breaker-coordinator", "BW_NATS_BREAKER_COORDINATOR_PASSWORD"),
    ("alerting", "BW_NATS_ALERTING_PASSWORD"),
    ("console", "BW_NATS_CONSOLE_PASSWORD"),
    ("operator", "BW_NATS_OPERATOR_PASSWORD"),
];

/// A NATS user's password in these tests (each user its own).
pub(crate) fn password(user: &str) -> String {
    format!("{user}-secret-pw")
}

/// A tenant's HTTP intake key (each tenant its own).
pub(crate) fn http_key(tenant: &str) -> String {
    format!("{tenant}-http-key")
}

/// One registered number: (tenant, phone_number_id, waba_id).
pub(crate) type Sender = (&'static str, &'static str, &'static str);

fn env_for(service: &str, pairs: &[(&str, String)]) -> HashMap<String, String> {
    let prefix = format!("BW_{}__", service.to_ascii_uppercase().replace('-', "_"));
    pairs.iter().map(|(k, v)| (format!("{prefix}{}", k.to_ascii_uppercase().replace('.', "__")), v.clone())).collect()
}

/// Servers, simulator and services of a tenants' stack.
pub(crate) struct TenantStack {
    pub(crate) nats: NatsServer,
    pub(crate) redis: RedisServer,
    pub(crate) sim: bw_meta_sim::SimHandle,
    /// Where ingest serves HTTP (intake and Meta's webhooks).
    pub(crate) ingest_http: String,
    /// Where ingest's admin routes (metrics) are served.
    pub(crate) ingest_admin: String,
    /// The accounts config nats-server runs.
    pub(crate) accounts: String,
    pub(crate) senders: Vec<Sender>,
    tokens: Vec<CancellationToken>,
    handles: Vec<JoinHandle<anyhow::Result<()>>>,
    health: Vec<std::sync::Arc<bw_common::admin::Health>>,
}

impl Drop for TenantStack {
    fn drop(&mut self) {
        for t in &self.tokens {
            t.cancel();
        }
    }
}

impl TenantStack {
    /// Starts nats-server with the accounts generated for `senders`, has the operator register them (the
    /// registry's bucket created by bwctl), checks that `bwctl senders nats-accounts` now prints exactly the file
    /// the server runs, and starts the simulator (its status webhooks aimed at ingest's address).
    pub(crate) async fn start(senders: &[Sender], mut sim_cfg: bw_meta_sim::SimConfig) -> TenantStack {
        bw_common::crypto::install_crypto();
        let base_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nats/accounts.conf");
        let base = std::fs::read_to_string(&base_path).expect("accounts.conf");
        let records: Vec<SenderRecord> = senders
            .iter()
            .map(|(tenant, phone, waba)| SenderRecord {
                phone_number_id: phone.to_string(),
                waba_id: waba.to_string(),
                tenant: tenant.to_string(),
                ..Default::default()
            })
            .collect();
        let accounts = bw_ops::senders::render_accounts(&base, &records).expect("producers generated");
        let path = std::env::temp_dir().join(format!("bw-accounts-tenants-{}.conf", bw_testkit::free_port()));
        std::fs::write(&path, &accounts).expect("written");
        let mut envs: Vec<(String, String)> =
            SERVICE_USERS.iter().map(|(user, var)| (var.to_string(), password(user))).collect();
        let mut tenants: Vec<&str> = senders.iter().map(|s| s.0).collect();
        tenants.sort_unstable();
        tenants.dedup();
        for t in &tenants {
            envs.push((bw_ops::senders::password_var(t), password(&tenancy::nats_user(t))));
        }
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let nats = NatsServer::start_with_config(&path, &envs);
        let _ = std::fs::remove_file(&path);
        let redis = RedisServer::start();

        let ingest_http = format!("127.0.0.1:{}", bw_testkit::free_port());
        sim_cfg.app_secret = APP_SECRET.into();
        sim_cfg.access_tokens = vec![ACCESS_TOKEN.into()];
        sim_cfg.waba_id = senders.first().map(|s| s.2).unwrap_or_default().into();
        if sim_cfg.webhook.url.is_none() {
            sim_cfg.webhook.url = Some(format!("http://{ingest_http}/webhooks/meta"));
        }
        let sim = bw_meta_sim::MetaSim::start(sim_cfg).await.expect("simulator starts");
        let stack = TenantStack {
            nats,
            redis,
            sim,
            ingest_http,
            ingest_admin: format!("127.0.0.1:{}", bw_testkit::free_port()),
            accounts,
            senders: senders.to_vec(),
            tokens: Vec::new(),
            handles: Vec::new(),
            health: Vec::new(),
        };

        // The operator registers the numbers; what bwctl then generates is the file the server runs.
        let operator = stack.url("operator");
        for (tenant, phone, waba) in senders {
            let (code, out) =
                crate::bwctl(&operator, &["senders", "add", phone, "--waba", waba, "--tenant", tenant]).await;
            assert_eq!(code, 0, "bwctl senders add as the operator:\n{out}");
        }
        let base_arg = base_path.display().to_string();
        let (code, generated) = crate::bwctl(&operator, &["senders", "nats-accounts", "--base", &base_arg]).await;
        assert_eq!(code, 0, "{generated}");
        assert_eq!(generated, stack.accounts, "bwctl generates the accounts the server runs");
        stack
    }

    /// `nats://<user>:<password>@…` of this server.
    pub(crate) fn url(&self, user: &str) -> String {
        format!("nats://{user}:{}@127.0.0.1:{}", password(user), self.nats.port())
    }

    /// The `nats.*` settings of a service running as its own user.
    fn nats_env(&self, user: &str) -> Vec<(&'static str, String)> {
        vec![("nats.url", self.url(user)), ("nats.inbox_prefix", format!("_INBOX_{user}"))]
    }

    /// A connection of `tenant`'s producer: its user, its password, its inbox prefix.
    pub(crate) async fn tenant(&self, tenant: &str) -> async_nats::Client {
        bw_client::tenant_options(tenant, password(&tenancy::nats_user(tenant)))
            .name(format!("tenant-{tenant}"))
            .connect(format!("127.0.0.1:{}", self.nats.port()))
            .await
            .expect("the tenant connects")
    }

    /// The operator's bwctl connection (reads every stream and bucket).
    pub(crate) async fn operator(&self) -> bw_cli::Conn {
        bw_cli::connect(&self.url("operator")).await.expect("the operator connects")
    }

    /// Permission violations the server logged so far.
    pub(crate) fn violations(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.nats.dir().join("nats.log")).unwrap_or_default();
        log.lines().filter(|l| l.contains("Violation")).map(str::to_string).collect()
    }

    fn keep(&mut self, deps: &Deps, start: impl FnOnce(CancellationToken) -> JoinHandle<anyhow::Result<()>>) {
        self.health.push(deps.health.clone());
        let token = CancellationToken::new();
        self.handles.push(start(token.clone()));
        self.tokens.push(token);
    }

    /// Waits until every service started so far reports ready.
    pub(crate) async fn ready(&self) -> bool {
        bw_testkit::wait_until(WAIT, || async {
            for h in &self.health {
                if !h.check().await.is_empty() {
                    return false;
                }
            }
            true
        })
        .await
    }

    /// Ingest as its user at its compiled defaults (the registry) but for where things are: one HTTP key per
    /// tenant ([`http_key`]), and `extra` settings.
    pub(crate) async fn start_ingest(&mut self, extra: &[(&str, String)]) {
        let mut pairs = self.nats_env("ingest");
        pairs.extend([
            ("redis.url", self.redis.url()),
            ("admin.listen", "127.0.0.1:0".to_string()),
            ("http.listen", self.ingest_http.clone()),
            ("webhook.app_secret", APP_SECRET.to_string()),
            ("webhook.verify_token", "e2e-verify".to_string()),
        ]);
        let mut keys: Vec<(String, String)> = Vec::new();
        let mut tenants: Vec<&str> = self.senders.iter().map(|s| s.0).collect();
        tenants.sort_unstable();
        tenants.dedup();
        for t in tenants {
            keys.push((format!("intake.api_keys.{t}.sha256"), bw_ingest::key_sha256(&http_key(t))));
            keys.push((format!("intake.api_keys.{t}.tenant"), t.to_string()));
        }
        pairs.extend(keys.iter().map(|(k, v)| (k.as_str(), v.clone())));
        pairs.extend(extra.iter().cloned());
        let cfg = bw_ingest::Config::load(None, &env_for("ingest", &pairs)).expect("ingest config");
        let redis = bw_common::service::ServiceConfig::redis(&cfg).cloned();
        let deps = Deps::connect("ingest", &cfg.nats, redis.as_ref(), WAIT).await.expect("ingest connects");
        // Its metrics, as the binary serves them on its admin address.
        let admin = CancellationToken::new();
        bw_common::admin::serve(&self.ingest_admin, deps.health.clone(), deps.metrics.clone(), None, admin.clone())
            .await
            .expect("ingest's admin routes");
        self.tokens.push(admin);
        self.keep(&deps.clone(), |t| tokio::spawn(bw_ingest::run(cfg, deps, t)));
        assert!(self.ready().await, "ingest ready: {:?}", self.violations());
    }

    /// A dispatcher as its user at its compiled defaults but for where things are.
    pub(crate) async fn start_dispatcher(&mut self) {
        let mut pairs = self.nats_env("dispatcher");
        pairs.extend([
            ("redis.url", self.redis.url()),
            ("admin.listen", "127.0.0.1:0".to_string()),
            ("meta.base_url", self.sim.base_url()),
            ("meta.access_token", ACCESS_TOKEN.to_string()),
        ]);
        let cfg = bw_dispatcher::Config::load(None, &env_for("dispatcher", &pairs)).expect("dispatcher config");
        let deps = Deps::connect("dispatcher", &cfg.nats, Some(&cfg.redis), WAIT).await.expect("dispatcher connects");
        self.keep(&deps.clone(), |t| tokio::spawn(bw_dispatcher::run(cfg, deps, t)));
        assert!(self.ready().await, "dispatcher ready: {:?}", self.violations());
    }

    /// Replay as its user at its compiled defaults but for where things are.
    pub(crate) async fn start_replay(&mut self) {
        let mut pairs = self.nats_env("replay");
        pairs.push(("admin.listen", "127.0.0.1:0".to_string()));
        let cfg: bw_replay::Config =
            bw_common::config::load("replay", bw_replay::DEFAULT_CONFIG, None, &env_for("replay", &pairs))
                .expect("replay config");
        let deps = Deps::connect("replay", &cfg.nats, None, WAIT).await.expect("replay connects");
        self.keep(&deps.clone(), |t| tokio::spawn(bw_replay::run(cfg, deps, t)));
        assert!(self.ready().await, "replay ready: {:?}", self.violations());
    }

    /// Stops every service and waits for each to return cleanly.
    pub(crate) async fn stop(mut self) {
        for t in &self.tokens {
            t.cancel();
        }
        for h in std::mem::take(&mut self.handles) {
            h.await.expect("joins").expect("service stops cleanly");
        }
    }

    /// Ingest's metrics as exposed ("" when not reachable).
    pub(crate) async fn ingest_metrics(&self) -> String {
        match reqwest::get(format!("http://{}/metrics", self.ingest_admin)).await {
            Ok(res) => res.text().await.unwrap_or_default(),
            Err(e) => format!("unreachable: {e}"),
        }
    }

    /// The value of one of ingest's metrics (`name{labels}` as exposed), 0 when absent.
    pub(crate) async fn ingest_metric(&self, series: &str) -> f64 {
        self.ingest_metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or(0.0)
    }
}
