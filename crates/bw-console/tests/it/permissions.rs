//! The console under deploy/nats/accounts.conf as committed: it connects as its own `console` NATS user (bwctl's
//! reads and moves, its audit stream), reads every page's state, resends a failed operation and writes the audit
//! stream, with no permissions violation in the server's log; the sender registry and the live lanes stay closed
//! to it.

use crate::support::{OPERATOR_KEY, sha256_hex};

const WAIT: Duration = Duration::from_secs(15);
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const USERS: [(&str, &str); 7] = [
    ("ingest", "BW_NATS_INGEST_PASSWORD"),
    ("dispatcher", "BW_NATS_DISPATCHER_PASSWORD"),
    ("replay", "BW_NATS_REPLAY_PASSWORD"),
    ("breaker-coordinator", "BW_NATS_BREAKER_COORDINATOR_PASSWORD"),
    ("alerting", "BW_NATS_ALERTING_PASSWORD"),
    ("console", "BW_NATS_CONSOLE_PASSWORD"),
    ("operator", "BW_NATS_OPERATOR_PASSWORD"),
];

fn password(user: &str) -> String {
    format!("test-{user}-password")
}

fn url(server: &bw_testkit::NatsServer, user: &str) -> String {
    format!("nats://{user}:{}@127.0.0.1:{}", password(user), server.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_runs_as_its_own_nats_user_without_a_violation() {
    bw_common::crypto::install_crypto();
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats/accounts.conf");
    let envs: Vec<(&str, String)> = USERS.iter().map(|(user, var)| (*var, password(user))).collect();
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let nats = bw_testkit::NatsServer::start_with_config(&conf, &envs);
    // The services create the shared topology (ingest here), as in a deployment.
    let mut ingest = bw_common::config::NatsConfig::single(url(&nats, "ingest"), "ingest");
    ingest.inbox_prefix = "_INBOX_ingest".into();
    let ingest_deps = bw_common::service::Deps::connect("ingest", &ingest, None, Duration::from_secs(10))
        .await
        .expect("ingest creates the topology");

    let port = bw_testkit::free_port();
    let pairs: Vec<(&str, String)> = vec![
        ("nats.url", url(&nats, "console")),
        ("nats.inbox_prefix", "_INBOX_console".into()),
        ("redis.url", String::new()),
        ("admin.listen", "127.0.0.1:0".into()),
        ("console.listen", format!("127.0.0.1:{port}")),
        ("console.coordinator_url", format!("http://127.0.0.1:{}", bw_testkit::free_port())),
        ("console.operator_token", "local-token".into()),
        ("auth.keys", format!(r#"[{{ name = "alice", sha256 = "{}", role = "operator" }}]"#, sha256_hex(OPERATOR_KEY))),
    ];
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (format!("BW_CONSOLE__{}", k.to_ascii_uppercase().replace('.', "__")), v.clone()))
        .collect();
    let cfg: bw_console::Config =
        bw_common::service::load_config("console", bw_console::DEFAULT_CONFIG, None, &env).expect("console config");
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    tokio::spawn(bw_common::service::run_service("console", cfg, bw_console::run, stop.clone()));
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let read = bw_testkit::wait_until(WAIT, || async {
        match client.get(format!("{base}/")).bearer_auth(OPERATOR_KEY).send().await {
            Ok(r) if r.status().is_success() => {
                let body = r.text().await.unwrap_or_default();
                body.contains("As read at 20") && !body.contains("The last read failed")
            }
            _ => false,
        }
    })
    .await;
    let violations = || {
        let log = std::fs::read_to_string(nats.dir().join("nats.log")).unwrap_or_default();
        log.lines().filter(|l| l.contains("Violation")).map(String::from).collect::<Vec<_>>()
    };
    assert!(read, "the console reads its view as the console user: {:#?}", violations());
    for path in ["/dlq", "/incidents", "/quarantine", "/op?id=nothing-here"] {
        let r = client.get(format!("{base}{path}")).bearer_auth(OPERATOR_KEY).send().await.expect("answer");
        assert!(r.status().as_u16() < 500, "{path}: {}", r.status());
    }
    // An action is audited even when refused (the coordinator is not running here).
    let confirm = client
        .get(format!("{base}/confirm?action=breaker_reset&scope=1001"))
        .bearer_auth(OPERATOR_KEY)
        .send()
        .await
        .expect("confirm")
        .text()
        .await
        .expect("body");
    let csrf = confirm.split("name=\"csrf\" value=\"").nth(1).and_then(|r| r.split('"').next()).expect("csrf");
    let r = client
        .post(format!("{base}/actions/breaker_reset"))
        .bearer_auth(OPERATOR_KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}&confirm=yes&scope=1001"))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 503, "refused: the coordinator is not reachable");

    // An action that moves something: a FAILED operation (its request kept in its wamid link, written here as
    // ingest and the dispatcher would) is resent: ledger reopened, the request on a replay lane.
    let ledger = bw_common::ledger::Ledger::new(&ingest_deps.buckets);
    let request = bw_proto::v1::SendRequest {
        operation_id: "op-resend".into(),
        waba_id: "9".into(),
        phone_number_id: "1001".into(),
        recipient: "+5491155550000".into(),
        category: bw_proto::v1::Category::Transactional as i32,
        ..Default::default()
    };
    let mut failed = bw_common::ledger::entry_for(&request, bw_proto::v1::OperationState::Failed);
    failed.wamid = "wamid.resend-test".into();
    ledger.update("op-resend", |_| Some(failed.clone())).await.expect("ledger");
    let link = bw_common::ledger::WamidLink {
        operation_id: "op-resend".into(),
        attempt: 1,
        request: prost::Message::encode_to_vec(&request),
    };
    ledger.link_attempt("wamid.resend-test", &link).await.expect("link");
    let r = client
        .post(format!("{base}/actions/resend"))
        .bearer_auth(OPERATOR_KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}&confirm=yes&op=op-resend&reason=customer%20asked"))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap_or_default());
    let resent = ledger.get("op-resend").await.expect("ledger").expect("entry").entry;
    assert_eq!((resent.state(), resent.resends), (bw_proto::v1::OperationState::Queued, 1));
    let operator_cfg = bw_common::config::NatsConfig::single(url(&nats, "operator"), "test-operator");
    let operator =
        bw_common::nats::connect(&operator_cfg, "test", Duration::from_secs(10)).await.expect("operator connects");
    let audit = bw_console::audit::read_all(&async_nats::jetstream::new(operator)).await.expect("audit");
    let outcomes: Vec<&str> = audit.iter().map(|e| e.outcome.as_str()).collect();
    assert_eq!(outcomes, ["requested", "refused", "requested", "done"], "{audit:?}");
    assert_eq!(violations(), Vec::<String>::new(), "no permissions violation");

    // Least privilege: what only bwctl may do (the sender registry), and what only ingest may (the live lanes),
    // the console user may not.
    let mut console_cfg = bw_common::config::NatsConfig::single(url(&nats, "console"), "test-console");
    console_cfg.inbox_prefix = "_INBOX_console".into();
    let console = bw_common::nats::connect(&console_cfg, "test", Duration::from_secs(10)).await.expect("connects");
    for subject in ["$KV.BW_SENDERS.1001", "bw.outbox.v1.hi.1001"] {
        console.publish(subject, "x".into()).await.expect("sent");
        console.flush().await.expect("flushed");
        let refused = bw_testkit::wait_until(WAIT, || async {
            violations().iter().any(|l| l.contains("Publish Violation") && l.contains(subject))
        })
        .await;
        assert!(refused, "{subject}: refused to the console user: {:#?}", violations());
    }
}
