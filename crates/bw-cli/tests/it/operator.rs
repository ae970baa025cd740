//! bwctl against a real breaker-coordinator (real nats-server and redis-server) whose state-changing routes
//! need an operator token: without it, or with a wrong one, the command fails with the coordinator's reason and
//! a hint; with it the override applies. The token is never printed.

use bw_breaker_coordinator::{Config, Coordinator, DEFAULT_CONFIG};
use bw_cli::{Cli, operator_token_hash, run};
use clap::Parser;
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "ops-token-7f3a9c";

struct Running {
    _nats: bw_testkit::NatsServer,
    _redis: bw_testkit::RedisServer,
    _dir: tempfile::TempDir,
    base: String,
    deps: bw_common::service::Deps,
    token: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

async fn coordinator() -> Running {
    bw_common::crypto::install_crypto();
    let nats = bw_testkit::NatsServer::start();
    let redis = bw_testkit::RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        format!(
            "[nats]\nurl = \"{}\"\n[redis]\nurl = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [operator]\ntoken_sha256 = \"{}\"\n\
             [limits.scopes.\"1001\"]\nwaba_id = \"9\"\n",
            nats.url(),
            redis.url(),
            operator_token_hash(TOKEN)
        ),
    )
    .expect("write config");
    let cfg: Config =
        bw_common::config::load("breaker-coordinator", DEFAULT_CONFIG, Some(&file), &HashMap::new()).expect("config");
    let deps = bw_common::service::Deps::connect("breaker-coordinator", &cfg.nats, Some(&cfg.redis), WAIT)
        .await
        .expect("deps");
    let c = Coordinator::new(cfg, &deps).expect("coordinator");
    let token = CancellationToken::new();
    let addr = bw_common::admin::serve(
        "127.0.0.1:0",
        deps.health.clone(),
        deps.metrics.clone(),
        Some(bw_breaker_coordinator::admin::router(c.clone())),
        token.clone(),
    )
    .await
    .expect("admin");
    tokio::spawn(c.run(token.clone()));
    Running { _nats: nats, _redis: redis, _dir: dir, base: format!("http://{addr}"), deps, token }
}

const WAIT: Duration = Duration::from_secs(15);

async fn bwctl(base: &str, extra: &[&str], action: &str) -> (i32, String) {
    let mut argv = vec!["bwctl", "--coordinator-url", base];
    argv.extend_from_slice(extra);
    argv.extend_from_slice(&["breaker", action, "--scope", "1001", "--reason", "drill"]);
    let cli = Cli::try_parse_from(argv).expect("parse");
    let mut out = Vec::new();
    let code = run(cli, &mut out).await.expect("runs");
    (code, String::from_utf8(out).expect("utf8"))
}

async fn state(r: &Running) -> bw_proto::v1::BreakerState {
    let breaker = bw_breaker::Breaker::with_conn(r.deps.redis.clone(), None, Default::default());
    breaker.status(&bw_breaker::Scope::new("9", "1001")).await.expect("status").snapshot.state()
}

#[tokio::test]
async fn bwctl_sends_the_operator_token_and_is_refused_without_it() {
    let r = coordinator().await;
    let (code, out) = bwctl(&r.base, &[], "force-open").await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("HTTP 401") && out.contains("operator token required"), "{out}");
    assert!(out.contains("hint: set BW_OPERATOR_TOKEN"), "{out}");
    let (code, out) = bwctl(&r.base, &["--operator-token", "not-the-token"], "force-open").await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("HTTP 403") && out.contains("operator token rejected"), "{out}");
    assert!(!out.contains("not-the-token"), "the token is never printed: {out}");
    assert_eq!(state(&r).await, bw_proto::v1::BreakerState::Closed, "refused: nothing changed");

    let (code, out) = bwctl(&r.base, &["--operator-token", TOKEN], "force-open").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("FORCED_OPEN") && !out.contains(TOKEN), "{out}");
    assert_eq!(state(&r).await, bw_proto::v1::BreakerState::ForcedOpen);
    let (code, out) = bwctl(&r.base, &["--operator-token", TOKEN], "reset").await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(state(&r).await, bw_proto::v1::BreakerState::Closed);
    let cli = Cli::try_parse_from(["bwctl", "--coordinator-url", &r.base, "breaker", "leader"]).expect("parse");
    let mut out = Vec::new();
    assert_eq!(run(cli, &mut out).await.expect("runs"), 0, "{}", String::from_utf8_lossy(&out));
    let out = String::from_utf8(out).expect("utf8");
    assert!(out.contains("answered by:") && out.contains("(leader)"), "the only instance leads: {out}");
    let cli = Cli::try_parse_from(["bwctl", "--operator-token", TOKEN, "scopes"]).expect("parse");
    assert!(!format!("{cli:?}").contains(TOKEN), "Debug of the command line redacts the token");
}

#[test]
fn the_token_hash_matches_sha256sum() {
    // printf %s test | sha256sum
    assert_eq!(operator_token_hash("test"), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
}

async fn bwctl_args(args: &[&str]) -> (i32, String) {
    let mut argv = vec!["bwctl"];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).expect("parse");
    let mut out = Vec::new();
    match run(cli, &mut out).await {
        Ok(code) => (code, String::from_utf8(out).expect("utf8")),
        Err(e) => (-1, format!("{e:#}")),
    }
}

#[tokio::test]
async fn bwctl_pauses_a_number_scopes_shows_the_pause_and_bwctl_lifts_it() {
    let r = coordinator().await;
    let nats = r._nats.url();
    let set = ["pause", "set", "--level", "number", "--id", "1001", "--for-ms", "600000", "--reason", "display name"];
    let (code, out) = bwctl_args(&[&["--coordinator-url", &r.base][..], &set[..]].concat()).await;
    assert_eq!(code, 1, "refused without the operator token: {out}");
    let with_token = [&["--coordinator-url", &r.base, "--operator-token", TOKEN][..], &set[..]].concat();
    let (code, out) = bwctl_args(&with_token).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"source\":\"operator\"") && !out.contains(TOKEN), "{out}");
    let shown = bw_testkit::wait_until(WAIT, || async {
        let (code, out) = bwctl_args(&["--nats-url", &nats, "scopes"]).await;
        code == 0 && out.lines().any(|l| l.starts_with("1001") && l.contains("number") && l.contains("operator"))
    })
    .await;
    assert!(shown, "{}", bwctl_args(&["--nats-url", &nats, "scopes"]).await.1);
    let (code, out) = bwctl_args(&[
        "--coordinator-url",
        &r.base,
        "--operator-token",
        TOKEN,
        "pause",
        "lift",
        "--level",
        "number",
        "--id",
        "1001",
    ])
    .await;
    assert_eq!(code, 0, "{out}");
    let lifted = bw_testkit::wait_until(WAIT, || async {
        let (_, out) = bwctl_args(&["--nats-url", &nats, "scopes"]).await;
        out.contains("1001") && !out.contains("LEVEL")
    })
    .await;
    assert!(lifted, "{}", bwctl_args(&["--nats-url", &nats, "scopes"]).await.1);
    let (code, out) =
        bwctl_args(&["--coordinator-url", &r.base, "pause", "lift", "--level", "galaxy", "--id", "1"]).await;
    assert!(code == -1 && out.contains("--level must be number, waba, app or token"), "{out}");
}
