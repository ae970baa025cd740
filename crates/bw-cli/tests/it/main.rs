//! bwctl against a real nats-server: masked inspection, stats, replay twice without duplicates, breaker
//! refusal, purge, account exit codes, and the coordinator call.

mod deploy;
mod limits;
mod operator;
mod senders;

use bw_cli::{Cli, EXIT_LOST, run};
use bw_common::config::NatsConfig;
use bw_common::ledger::Ledger;
use bw_common::nats::publish_durable;
use bw_common::service::Deps;
use bw_common::time::now_ms;
use bw_ops::scan::scan_stream;
use bw_proto::v1::*;
use bw_testkit::NatsServer;
use bw_wire::names;
use clap::Parser;
use prost::Message;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PHONE: &str = "1001";
const RECIPIENT: &str = "+5491155551234";

async fn setup() -> (NatsServer, Deps) {
    let nats = NatsServer::start();
    let cfg = NatsConfig::single(nats.url(), "");
    let deps = Deps::connect("cli-test", &cfg, None, Duration::from_secs(10)).await.expect("connect");
    (nats, deps)
}

async fn bwctl(nats: &NatsServer, args: &[&str]) -> (i32, String) {
    let mut argv = vec!["bwctl", "--nats-url"];
    let url = nats.url();
    argv.push(&url);
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).expect("arguments parse");
    let mut out = Vec::new();
    let code = run(cli, &mut out).await.expect("command runs");
    (code, String::from_utf8(out).expect("utf8"))
}

async fn put_dlq(deps: &Deps, op: &str) {
    let req = SendRequest {
        operation_id: op.into(),
        waba_id: "9".into(),
        phone_number_id: PHONE.into(),
        recipient: RECIPIENT.into(),
        category: Category::Support as i32,
        payload: Some(send_request::Payload::Text(TextPayload { body: "secret body text".into(), preview_url: false })),
        ..Default::default()
    };
    let mut e = LedgerEntry { operation_id: op.into(), phone_number_id: PHONE.into(), ..Default::default() };
    e.set_state(OperationState::Dlq);
    Ledger::new(&deps.buckets).update(op, |_| Some(e.clone())).await.expect("ledger");
    let env = DlqEnvelope {
        request: Some(req),
        reason: DlqReason::BreakerOpen as i32,
        dead_lettered_at_unix_ms: now_ms() - 90_000,
        ..Default::default()
    };
    publish_durable(
        &deps.js,
        names::dlq_subject(bw_proto::v1::Category::Marketing, PHONE),
        Default::default(),
        env.encode_to_vec().into(),
    )
    .await
    .expect("dlq");
}

async fn set_scope(deps: &Deps, state: BreakerState) {
    let s = ScopeSnapshot {
        scope: Some(Scope { waba_id: "9".into(), phone_number_id: PHONE.into() }),
        state: state as i32,
        since_unix_ms: now_ms() - 60_000,
        ..Default::default()
    };
    deps.buckets.scopes.put(PHONE, s.encode_to_vec().into()).await.expect("scope");
}

/// Messages replayed so far: the requests are support messages, so they go back through the rh lane.
async fn rp_lane_len(deps: &Deps) -> usize {
    scan_stream(&deps.js, names::SEND_STREAM, &names::outbox_subject(names::Lane::PriorityReplay, PHONE))
        .await
        .expect("scan")
        .len()
}

#[tokio::test]
async fn inspect_masks_stats_count_and_replay_twice_sends_once() {
    let (nats, deps) = setup().await;
    for i in 0..3 {
        put_dlq(&deps, &format!("op-{i}")).await;
    }
    set_scope(&deps, BreakerState::Open).await;

    let (code, out) = bwctl(&nats, &["scopes"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("OPEN") && out.contains(PHONE), "{out}");

    let (code, out) = bwctl(&nats, &["dlq", "inspect"]).await;
    assert_eq!(code, 0);
    assert!(!out.contains(&RECIPIENT[1..]), "recipient in clear:\n{out}");
    assert!(!out.contains("secret"), "body shown:\n{out}");
    assert!(
        out.contains(&bw_common::mask::phone(RECIPIENT))
            && out.contains("text <16 chars>")
            && out.contains("breaker_open"),
        "{out}"
    );

    let (code, out) = bwctl(&nats, &["dlq", "stats"]).await;
    assert_eq!(code, 0);
    assert!(out.lines().any(|l| l.starts_with(PHONE) && l.contains(" 3 ") && l.contains("breaker_open=3")), "{out}");

    // Breaker OPEN: nothing moves without --force.
    let (_, out) = bwctl(&nats, &["dlq", "replay", "--scope", PHONE]).await;
    assert!(out.contains("breaker not CLOSED"), "{out}");
    assert_eq!(rp_lane_len(&deps).await, 0);

    set_scope(&deps, BreakerState::Closed).await;
    let (code, out) = bwctl(&nats, &["dlq", "replay", "--scope", PHONE, "--rate", "500"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("replayed") && out.contains("3"), "{out}");
    let (code, _) = bwctl(&nats, &["dlq", "replay", "--scope", PHONE, "--rate", "500"]).await;
    assert_eq!(code, 0);
    assert_eq!(rp_lane_len(&deps).await, 3, "second run must not publish again");

    let (code, out) = bwctl(&nats, &["account"]).await;
    assert_eq!(code, 0, "{out}");
}

#[tokio::test]
async fn purge_needs_confirmation_flag_and_account_fails_on_lost() {
    let (nats, deps) = setup().await;
    put_dlq(&deps, "purge-1").await;
    let (code, out) = bwctl(&nats, &["dlq", "purge", "--yes"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("purged"), "{out}");
    let e = Ledger::new(&deps.buckets).get("purge-1").await.expect("ledger").expect("entry").entry;
    assert_eq!(e.state(), OperationState::Expired);
    assert!(e.reason.contains("purged by operator"));

    // Plant a lost operation: the ledger says DLQ but no stream holds it.
    let mut lost = LedgerEntry { operation_id: "lost-1".into(), ..Default::default() };
    lost.set_state(OperationState::Dlq);
    Ledger::new(&deps.buckets).update("lost-1", |_| Some(lost.clone())).await.expect("ledger");
    let (code, out) = bwctl(&nats, &["account"]).await;
    assert_eq!(code, EXIT_LOST, "{out}");
    assert!(out.contains("lost-1"), "{out}");
}

#[tokio::test]
async fn breaker_commands_call_the_coordinator() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.expect("accept");
        let mut buf = vec![0u8; 4096];
        let n = sock.read(&mut buf).await.expect("read");
        let request = String::from_utf8_lossy(&buf[..n]).to_string();
        let body = "{\"state\":\"FORCED_OPEN\"}";
        let response = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
        sock.write_all(response.as_bytes()).await.expect("write");
        request
    });
    let cli = Cli::try_parse_from([
        "bwctl",
        "--coordinator-url",
        &base,
        "--operator-token",
        "drill-token-1",
        "breaker",
        "force-open",
        "--scope",
        PHONE,
        "--reason",
        "drill",
    ])
    .expect("parse");
    let mut out = Vec::new();
    let code = run(cli, &mut out).await.expect("runs");
    let request = server.await.expect("server");
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out));
    assert!(request.starts_with(&format!("POST /admin/breakers/{PHONE}/force-open ")), "{request}");
    assert!(request.contains("{\"reason\":\"drill\"}"), "{request}");
    assert!(request.to_ascii_lowercase().contains("authorization: bearer drill-token-1"), "{request}");
    assert!(!String::from_utf8_lossy(&out).contains("drill-token-1"), "the token is never printed");
    let bad = Cli::try_parse_from(["bwctl", "breaker", "clear", "--scope", "12ab"]).expect("parse");
    assert!(run(bad, &mut Vec::new()).await.is_err(), "non-digit scope refused");
}

#[tokio::test]
async fn signals_lists_the_newest_account_signals_of_a_waba_with_users_hashed() {
    use bw_proto::v1::account_signal::Kind;
    let (nats, deps) = setup().await;
    let (code, text) = bwctl(&nats, &["signals"]).await;
    assert_eq!((code, text.trim()), (0, "no account signals in BW_ACCOUNT"));
    let signals = [
        ("account_update", "w1", Kind::Ban(AccountBanState { ban_state: "DISABLE".into(), ban_date: String::new() })),
        (
            "user_preferences",
            "w1",
            Kind::UserPreference(UserPreference {
                recipient_key_hash: bw_common::mask::recipient_key(RECIPIENT),
                category: "marketing_messages".into(),
                value: "stop".into(),
                timestamp_unix_s: 1,
            }),
        ),
        (
            "account_update",
            "w2",
            Kind::Restriction(AccountRestriction {
                restriction_type: "RESTRICTED_BIZ_INITIATED_MESSAGING".into(),
                expiration_unix_s: 1_800_000_000,
                remediation: String::new(),
            }),
        ),
    ];
    for (i, (field, waba, kind)) in signals.into_iter().enumerate() {
        let s = AccountSignal {
            field: field.into(),
            waba_id: waba.into(),
            at_unix_ms: now_ms(),
            kind: Some(kind),
            ..Default::default()
        };
        publish_durable(
            &deps.js,
            names::account_subject(field, waba),
            names::msg_id_headers(&format!("s{i}")),
            s.encode_to_vec().into(),
        )
        .await
        .expect("published");
    }
    let (code, text) = bwctl(&nats, &["signals", "--waba", "w1"]).await;
    assert_eq!(code, 0);
    assert!(text.contains("ban DISABLE") && text.contains("stop marketing_messages"), "{text}");
    assert!(!text.contains("RESTRICTED_BIZ") && !text.contains("5491155551234"), "{text}");
    let (_, text) = bwctl(&nats, &["signals", "--last", "1"]).await;
    assert!(text.contains("restriction RESTRICTED_BIZ_INITIATED_MESSAGING until 2027-01-15"), "{text}");
    assert_eq!(text.lines().count(), 2, "header and the newest one: {text}");
}
