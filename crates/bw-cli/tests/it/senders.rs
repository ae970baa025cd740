//! `bwctl senders` and `bwctl ledger migrate-tenants` against a real nats-server: the registry's refusals are
//! precise; the generated accounts config (alone, and piped through scripts/nats-accounts.sh either way) is
//! accepted by nats-server; under it the operator registers numbers and migrates a ledger from before tenants,
//! after which ingest, at the compiled default (the registry), answers each tenant's status queries for its
//! moved operations and treats a retry of one as the duplicate it is.

use bw_cli::{Cli, run};
use bw_common::ledger::Ledger;
use bw_proto::v1::{LedgerEntry, OperationState};
use bw_testkit::NatsServer;
use clap::Parser;
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);
const PASSWORD: &str = "pw";
/// The service and operator users of accounts.conf, by the variable holding each password.
const SERVICE_VARS: [&str; 7] = [
    "BW_NATS_INGEST_PASSWORD",
    "BW_NATS_DISPATCHER_PASSWORD",
    "BW_NATS_REPLAY_PASSWORD",
    "BW_NATS_BREAKER_COORDINATOR_PASSWORD",
    "BW_NATS_ALERTING_PASSWORD",
    "BW_NATS_CONSOLE_PASSWORD",
    "BW_NATS_OPERATOR_PASSWORD",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn base_conf() -> PathBuf {
    repo().join("deploy/nats/accounts.conf")
}

/// bwctl in-process: (exit code, output), or the error it would print.
async fn bwctl(url: &str, args: &[&str]) -> Result<(i32, String), String> {
    let mut argv = vec!["bwctl", "--nats-url", url];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match run(cli, &mut out).await {
        Ok(code) => Ok((code, String::from_utf8(out).expect("utf8"))),
        Err(e) => Err(format!("{e:#}")),
    }
}

/// The password variables a generated config names (`$BW_NATS_PRODUCER_..._PASSWORD`).
fn producer_vars(conf: &str) -> Vec<String> {
    let mut vars: Vec<String> = conf
        .split('$')
        .skip(1)
        .filter_map(|rest| rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next())
        .filter(|v| v.starts_with("BW_NATS_PRODUCER_"))
        .map(str::to_string)
        .collect();
    vars.sort();
    vars.dedup();
    vars
}

/// `nats-server -c <conf> -t` with every password variable set: whether the server accepts the file.
fn server_accepts(conf: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("accounts.conf");
    std::fs::write(&path, conf).expect("written");
    let bin = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".into());
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("-c").arg(&path).arg("-t");
    for var in SERVICE_VARS.iter().map(|v| v.to_string()).chain(producer_vars(conf)) {
        cmd.env(var, PASSWORD);
    }
    let out = cmd.output().map_err(|e| format!("nats-server: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

/// A nats-server started with the accounts config at a path of its own, rewritten by [`Accounts::regenerate`].
struct Accounts {
    server: NatsServer,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Accounts {
    /// The server with `conf`, its environment holding a password for every service user and for the producer
    /// user of each of `tenants` (the server reads them again when it restarts with a regenerated file).
    fn start(conf: &str, tenants: &[&str]) -> Accounts {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("accounts.conf");
        std::fs::write(&path, conf).expect("written");
        let vars: Vec<String> = SERVICE_VARS
            .iter()
            .map(|v| v.to_string())
            .chain(tenants.iter().map(|t| bw_ops::senders::password_var(t)))
            .collect();
        let envs: Vec<(&str, &str)> = vars.iter().map(|v| (v.as_str(), PASSWORD)).collect();
        Accounts { server: NatsServer::start_with_config(&path, &envs), path, _dir: dir }
    }

    fn url(&self, user: &str) -> String {
        format!("nats://{user}:{PASSWORD}@127.0.0.1:{}", self.server.port())
    }

    /// The operator generates the producers' users from the registry and the server restarts with them (same
    /// port and store), as an operator reloads it.
    async fn regenerate(&mut self) {
        let base = base_conf().display().to_string();
        let (code, conf) =
            bwctl(&self.url("operator"), &["senders", "nats-accounts", "--base", &base]).await.expect("runs");
        assert_eq!(code, 0, "{conf}");
        server_accepts(&conf).expect("nats-server accepts the generated config");
        std::fs::write(&self.path, &conf).expect("rewritten");
        self.server.restart();
    }
}

#[tokio::test]
async fn senders_are_registered_listed_and_moved_only_through_rm_with_precise_errors() {
    let nats = NatsServer::start();
    let url = nats.url();
    let ok = |r: Result<(i32, String), String>| {
        let (code, out) = r.expect("succeeds");
        assert_eq!(code, 0, "{out}");
        out
    };
    let out = ok(bwctl(&url, &["senders", "ls"]).await);
    assert!(out.contains("0 number(s) of 0 tenant(s)"), "an empty registry before any add:\n{out}");
    let out = ok(bwctl(&url, &["senders", "add", "1001", "--waba", "2001", "--tenant", "crm"]).await);
    assert!(out.starts_with("registered: number 1001 of WABA 2001 belongs to tenant `crm`"), "{out}");
    assert!(out.contains("NATS user producer-crm") && out.contains("$BW_NATS_PRODUCER_CRM_PASSWORD"), "{out}");
    assert!(out.contains("inbox prefix _INBOX_crm") && out.contains("feed consumer feed-crm"), "{out}");
    ok(bwctl(&url, &["senders", "add", "1002", "--waba", "2001", "--tenant", "crm", "--portfolio", "3001"]).await);
    ok(bwctl(&url, &["senders", "add", "1003", "--waba", "2002", "--tenant", "shop-2"]).await);
    let out = ok(bwctl(&url, &["senders", "add", "1001", "--waba", "2001", "--tenant", "crm"]).await);
    assert!(out.starts_with("unchanged:"), "{out}");
    let out = ok(bwctl(&url, &["senders", "add", "1001", "--waba", "2009", "--tenant", "crm"]).await);
    assert!(out.starts_with("updated: number 1001 of WABA 2009"), "{out}");

    // Moving a number to another tenant is refused, naming the owner and the way out; nothing changes.
    let err =
        bwctl(&url, &["senders", "add", "1001", "--waba", "2009", "--tenant", "shop-2"]).await.expect_err("owned");
    assert!(err.contains("registered to tenant `crm`") && err.contains("bwctl senders rm 1001"), "{err}");
    for (args, why) in [
        (&["senders", "add", "+1001", "--waba", "1", "--tenant", "crm"][..], "phone_number_id must be"),
        (&["senders", "add", "1009", "--waba", "x", "--tenant", "crm"], "waba_id must be"),
        (&["senders", "add", "1009", "--waba", "1", "--tenant", "CRM"], "tenant must be"),
        (&["senders", "add", "1009", "--waba", "1", "--tenant", "crm", "--portfolio", "p"], "portfolio_id must be"),
        (&["senders", "rm", "1009"], "number 1009 is not registered"),
        (&["senders", "ls", "--tenant", "a.b"], "--tenant must be"),
    ] {
        let err = bwctl(&url, args).await.expect_err("refused");
        assert!(err.contains(why), "{args:?}: {err}");
    }

    let out = ok(bwctl(&url, &["senders", "ls"]).await);
    let rows: Vec<Vec<&str>> = out.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0][..4], ["crm", "1001", "2009", "-"], "{out}");
    assert_eq!(rows[1][..4], ["crm", "1002", "2001", "3001"], "{out}");
    assert_eq!(rows[2][..4], ["shop-2", "1003", "2002", "-"], "{out}");
    assert!(out.ends_with("3 number(s) of 2 tenant(s)\n"), "{out}");
    let out = ok(bwctl(&url, &["senders", "ls", "--tenant", "shop-2"]).await);
    assert!(out.contains("1003") && !out.contains("1001") && out.ends_with("1 number(s) of 1 tenant(s)\n"), "{out}");

    // rm, then the number may go to another tenant.
    let out = ok(bwctl(&url, &["senders", "rm", "1001"]).await);
    assert!(out.starts_with("removed: number 1001 no longer belongs to tenant `crm`"), "{out}");
    assert!(!out.contains("warning"), "nothing queued for it: {out}");
    ok(bwctl(&url, &["senders", "add", "1001", "--waba", "2009", "--tenant", "shop-2"]).await);
    // Removing a number with messages still queued says where they wait and what becomes of them.
    let cfg = bw_common::config::NatsConfig::single(url.clone(), "");
    let deps = bw_common::service::Deps::connect("cli-test", &cfg, None, WAIT).await.expect("topology");
    let subject = bw_wire::names::outbox_subject(bw_wire::names::Lane::High, "1002");
    deps.js.publish(subject, "x".into()).await.expect("publish").await.expect("stored");
    let out = ok(bwctl(&url, &["senders", "rm", "1002"]).await);
    assert!(out.contains("warning: BW_SEND (1) still hold(s) messages of this number"), "{out}");
}

#[tokio::test]
async fn the_generated_accounts_config_is_accepted_by_nats_server_alone_and_with_partitions() {
    let nats = NatsServer::start();
    let url = nats.url();
    let base = base_conf().display().to_string();
    // The committed file itself: no producer.
    let (code, empty) = bwctl(&url, &["senders", "nats-accounts", "--base", &base]).await.expect("runs");
    assert_eq!(code, 0);
    assert!(!empty.contains("user: producer-") && empty.contains("No sender is registered"), "{empty}");
    server_accepts(&empty).expect("accepted");
    for (phone, tenant) in [("1001", "crm"), ("1002", "crm"), ("1003", "shop-2"), ("1004", "default")] {
        bwctl(&url, &["senders", "add", phone, "--waba", "7", "--tenant", tenant]).await.expect("registered");
    }
    let (code, conf) = bwctl(&url, &["senders", "nats-accounts", "--base", &base]).await.expect("runs");
    assert_eq!(code, 0);
    server_accepts(&conf).expect("nats-server accepts the generated config");
    assert_eq!(
        producer_vars(&conf),
        ["BW_NATS_PRODUCER_CRM_PASSWORD", "BW_NATS_PRODUCER_DEFAULT_PASSWORD", "BW_NATS_PRODUCER_SHOP_2_PASSWORD"]
    );
    assert!(!conf.contains(PASSWORD), "no password is ever written");
    // Everything outside the region is the committed file, line for line.
    let committed = std::fs::read_to_string(base_conf()).expect("base");
    let outside = |text: &str| -> Vec<String> {
        let mut inside = false;
        text.lines()
            .filter(|l| {
                let t = l.trim_start();
                if t.starts_with(bw_ops::senders::BEGIN_MARKER) {
                    inside = true;
                } else if t.starts_with(bw_ops::senders::END_MARKER) {
                    inside = false;
                }
                !inside
            })
            .map(str::to_string)
            .collect()
    };
    assert_eq!(outside(&conf), outside(&committed));

    // Piped through scripts/nats-accounts.sh, in either order, with the real bwctl binary: the same producers,
    // the partitions' rights, and a file nats-server accepts.
    let script = repo().join("scripts/nats-accounts.sh");
    let bin = env!("CARGO_BIN_EXE_bwctl");
    for pipeline in [
        format!("{bin} senders nats-accounts --base {base} | bash {} 2 --send 2 -", script.display()),
        format!("bash {} 2 --send 2 | {bin} senders nats-accounts --base -", script.display()),
    ] {
        let out = std::process::Command::new("bash")
            .args(["-o", "pipefail", "-c", &pipeline])
            .env("BW_NATS_URL", &url)
            .output()
            .expect("pipeline runs");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{pipeline}: {stderr}");
        assert!(stderr.contains("producer producer-crm (2 number(s))"), "{stderr}");
        for s in ["KV_BW_LEDGER_1", "BW_SEND_1", "\"bw.send.v1.1001\", \"bw.status.v1.1001\"", "user: producer-shop-2,"]
        {
            assert!(stdout.contains(s), "{pipeline}: no {s}");
        }
        server_accepts(&stdout).unwrap_or_else(|e| panic!("{pipeline}: {e}"));
    }
}

fn entry(op: &str, phone: &str, state: OperationState) -> LedgerEntry {
    let mut e = LedgerEntry {
        operation_id: op.into(),
        waba_id: "7".into(),
        phone_number_id: phone.into(),
        ..Default::default()
    };
    e.set_state(state);
    e
}

/// The migration under the generated accounts, as its users: the operator registers the numbers and moves the
/// entries; ingest (compiled defaults: the registry) then finds each under its tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_from_before_tenants_migrates_and_each_tenant_finds_its_operations() {
    let mut accounts = Accounts::start(&std::fs::read_to_string(base_conf()).expect("base"), &["crm", "default"]);
    let operator = accounts.url("operator");
    // Ingest creates the topology as its user (any service may), the operator registers the numbers.
    let mut cfg = bw_ingest::Config::load(None, &Default::default()).expect("defaults");
    cfg.nats.url = accounts.url("ingest");
    cfg.nats.inbox_prefix = "_INBOX_ingest".into();
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("ingest connects");
    for (phone, tenant) in [("1001", "crm"), ("1002", "default")] {
        let (code, out) =
            bwctl(&operator, &["senders", "add", phone, "--waba", "7", "--tenant", tenant]).await.expect("registered");
        assert_eq!(code, 0, "{out}");
    }
    // The ledger as it was before tenants: bare keys for crm's number, default's and an unregistered one.
    let conn = bw_cli::connect(&operator).await.expect("operator connects");
    let ledger = Ledger::new(&conn.buckets);
    for (op, phone) in [("order-1", "1001"), ("order-2", "1001"), ("order-3", "1002"), ("order-4", "1009")] {
        ledger.create(&entry(op, phone, OperationState::Delivered)).await.expect("created");
    }
    ledger.link_wamid("wamid.one", "order-1").await.expect("linked");
    drop(deps);

    let (code, out) = bwctl(&operator, &["ledger", "migrate-tenants", "--yes"]).await.expect("migrates");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("moved 2 entries to their tenant's key (crm 2); re-pointed 1 wamid links"), "{out}");
    assert!(out.contains("1 of tenant `default`, 0 already under a tenant key, 1 of unregistered numbers"), "{out}");
    let (code, out) = bwctl(&operator, &["ledger", "migrate-tenants", "--yes"]).await.expect("again");
    assert!(code == 0 && out.starts_with("moved 0 entries"), "{out}");
    assert_eq!(ledger.operation_for_wamid("wamid.one").await.expect("link").as_deref(), Some("crm/order-1"));

    // The producers' users, then ingest at its compiled defaults as its own user.
    accounts.regenerate().await;
    let mut cfg = bw_ingest::Config::load(None, &Default::default()).expect("defaults");
    cfg.nats.url = accounts.url("ingest");
    cfg.nats.inbox_prefix = "_INBOX_ingest".into();
    cfg.admin.listen = "127.0.0.1:0".into();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.webhook.app_secret = "secret".into();
    cfg.webhook.verify_token = "verify".into();
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("ingest connects");
    let token = tokio_util::sync::CancellationToken::new();
    let ingest = tokio::spawn(bw_ingest::run(cfg, deps.clone(), token.clone()));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await, "ingest ready");

    let port = accounts.server.port();
    let as_tenant = |tenant: &'static str| async move {
        let nats = bw_client::tenant_options(tenant, PASSWORD)
            .connect(format!("127.0.0.1:{port}"))
            .await
            .expect("the tenant connects");
        bw_client::Client::new(nats)
    };
    let crm = as_tenant("crm").await;
    for op in ["order-1", "order-2"] {
        let reply = crm.status("1001", op).await.expect("answered");
        assert!(reply.found, "crm finds its moved {op}: {reply:?}");
        assert_eq!(reply.current.map(|c| c.operation_id), Some(op.to_string()), "its own id, not the key");
    }
    // A retry of a moved operation is the duplicate it is: never a second send.
    let retry = bw_client::Request::text("order-1", "7", "1001", "+5491155551234", "hi").build();
    let reply = crm.send(&retry).await.expect("answered");
    assert!(reply.accepted && reply.duplicate, "{reply:?}");
    let default = as_tenant("default").await;
    assert!(default.status("1002", "order-3").await.expect("answered").found, "default's stays where it was");

    token.cancel();
    ingest.await.expect("joins").expect("stops");
}
