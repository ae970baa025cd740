//! Redis AUTH across the services: with Redis requiring a password (`requirepass`), every Redis user given
//! `redis.password` works (ingest registers the message in its order set, the dispatcher admits it and records
//! the outcome, the coordinator writes config and ticks, all through Lua scripts), and each one given no
//! password or a wrong one refuses to start, its error naming the setting and never a password.

use bw_e2e::{APP_SECRET, Harness, WABA_ID};
use bw_proto::v1::{Category, OperationState};
use bw_testkit::RedisServer;
use std::collections::HashMap;
use std::time::Duration;

const PHONE: &str = "106540352242922";
const PASSWORD: &str = "e2e-redis-password";
const WRONG: &str = "e2e-wrong-redis-password";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redis_user_works_with_the_password_and_refuses_to_start_without_it() {
    let mut h = Harness::start(bw_meta_sim::SimConfig::default()).await;
    h.redis = RedisServer::start_with_password(PASSWORD);
    let auth = [("redis.password", PASSWORD.to_string())];
    h.start_coordinator(&auth).await;
    h.start_ingest(&auth).await;
    h.start_dispatcher(&auth).await;
    let request =
        bw_client::Request::template("e2e-auth-1", WABA_ID, PHONE, "+5491155551234", "order_confirmation", "es_AR")
            .param("1234")
            .category(Category::Transactional)
            .build();
    let reply = h.producer().send(&request).await.expect("ingest answers");
    assert!(reply.accepted, "rejected: {}", reply.error);
    let sent = [OperationState::Sent, OperationState::Delivered, OperationState::Read];
    assert!(
        h.wait_state("e2e-auth-1", &sent, Duration::from_secs(20)).await,
        "not sent: {:?}",
        h.ledger_entry("e2e-auth-1").await.map(|v| v.entry)
    );
    // The scripts ran in Redis, not in the breaker's local fallback: Redis counted them.
    let client = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{}/", h.redis.port())).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("redis with the password");
    let calls = bw_e2e::redis_command_calls(&mut conn).await;
    assert!(calls.get("evalsha").copied().unwrap_or(0.0) > 0.0, "no script ran in Redis: {calls:?}");

    for (password, fix) in [("", "requires a password and none was sent"), (WRONG, "refused the credentials")] {
        for service in ["ingest", "dispatcher", "breaker-coordinator"] {
            let error = start_error(&h, service, password).await;
            assert!(error.contains(fix) && error.contains("redis.password"), "{service}: {error}");
            assert!(!error.contains(PASSWORD) && !error.contains(WRONG), "{service}: a password leaked: {error}");
        }
    }
}

/// What the service's start-up (the skeleton every binary runs) returns with `password` as its
/// `redis.password`, the rest of its config at the compiled defaults but for where the servers are.
async fn start_error(h: &Harness, service: &'static str, password: &str) -> String {
    use bw_common::service::{load_config, run_service};
    let prefix = format!("BW_{}__", service.to_ascii_uppercase().replace('-', "_"));
    let mut env: HashMap<String, String> = [
        ("NATS__URL", h.nats.url()),
        ("REDIS__URL", h.redis.url()),
        ("REDIS__PASSWORD", password.to_string()),
        ("ADMIN__LISTEN", "127.0.0.1:0".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (format!("{prefix}{k}"), v))
    .collect();
    if service == "ingest" {
        env.insert(format!("{prefix}HTTP__LISTEN"), "127.0.0.1:0".into());
        env.insert(format!("{prefix}WEBHOOK__APP_SECRET"), APP_SECRET.into());
        env.insert(format!("{prefix}WEBHOOK__VERIFY_TOKEN"), "e2e-verify".into());
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop_guard = stop.clone().drop_guard();
    let result = match service {
        "ingest" => {
            let cfg = load_config::<bw_ingest::Config>(service, bw_ingest::DEFAULT_CONFIG, None, &env).expect("config");
            run_service(service, cfg, bw_ingest::run, stop).await
        }
        "dispatcher" => {
            let cfg = load_config::<bw_dispatcher::Config>(service, bw_dispatcher::DEFAULT_CONFIG, None, &env)
                .expect("config");
            run_service(service, cfg, bw_dispatcher::run, stop).await
        }
        _ => {
            let cfg = load_config::<bw_breaker_coordinator::Config>(
                service,
                bw_breaker_coordinator::DEFAULT_CONFIG,
                None,
                &env,
            )
            .expect("config");
            run_service(service, cfg, bw_breaker_coordinator::run, stop).await
        }
    };
    match result {
        Ok(()) => panic!("{service} started without the right Redis password"),
        Err(e) => format!("{e:#}"),
    }
}
