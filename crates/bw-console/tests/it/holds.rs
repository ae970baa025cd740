//! The sender page's pair and recipient holds and Meta's stated throughput, read from a real redis-server where
//! the real scripts wrote them (a 131056 pair back-off recorded by the breaker, the tenant's 131049 cool-off and
//! 131050 suppression of recipients this sender wrote to, a THROUGHPUT_UPGRADE limit), shown with the recipients
//! masked: the last 4 characters of their key, never the number or the whole key.

use crate::support::{OPERATOR_KEY, WAIT, sha256_hex};
use bw_breaker::recipient::RecipientMarketing;
use bw_breaker::throughput::Throughput;
use bw_breaker::{
    AdmitItem, Breaker, BreakerConfig, OutcomeItem, OutcomeKind, RedisConn, Scope, ScopeLimits, TrafficClass,
};
use bw_common::classify::RateScope;
use bw_wire::tenancy::DEFAULT_TENANT;
use prost::Message as _;
use std::collections::HashMap;
use std::time::Duration;

const SENDER: &str = "106540352249077";
const WABA: &str = "9";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sender_page_shows_its_pair_and_recipient_holds_masked() {
    bw_common::crypto::install_crypto();
    let nats = bw_testkit::NatsServer::start();
    let redis = bw_testkit::RedisServer::start();
    let cfg = bw_common::config::NatsConfig::single(nats.url(), "topology");
    let deps =
        bw_common::service::Deps::connect("ingest", &cfg, None, Duration::from_secs(10)).await.expect("topology");
    let snapshot = bw_proto::v1::ScopeSnapshot {
        scope: Some(bw_proto::v1::Scope { waba_id: WABA.into(), phone_number_id: SENDER.into() }),
        ..Default::default()
    };
    deps.buckets.scopes.put(SENDER, snapshot.encode_to_vec().into()).await.expect("snapshot");

    let manager = bw_common::redis_conn::connect(&redis.url(), Duration::from_millis(500), Duration::from_secs(5))
        .await
        .expect("redis");
    let breaker = Breaker::new(Some(manager.clone()), None, BreakerConfig::default());
    let scope = Scope::new(WABA, SENDER);
    let numbers = ["+5491155550101", "+5491155550102", "+5491155550103", "+5491155550104"];
    let keys: Vec<String> = numbers.iter().map(|n| bw_common::mask::recipient_key(n)).collect();
    // The sender writes to each recipient (their pair hashes), then Meta answers 131056 for the first.
    let items: Vec<AdmitItem> =
        keys.iter().map(|k| AdmitItem { recipient_key: k.clone(), class: TrafficClass::Priority }).collect();
    let admitted = breaker.admit(&scope, &items).await;
    assert!(!admitted.degraded);
    let pair = OutcomeKind::RateLimited { scope: RateScope::Pair, pause_ms: RateScope::Pair.default_pause_ms() };
    breaker.record(&scope, &[OutcomeItem { recipient_key: keys[0].clone(), kind: pair, canary: false }]).await;
    let marketing = RecipientMarketing::new(RedisConn::Single(manager.clone()));
    marketing.defer(DEFAULT_TENANT, &keys[1], 131_049, 24 * 3_600_000).await.expect("cool-off");
    marketing.suppress(DEFAULT_TENANT, &keys[2], 131_050).await.expect("suppressed");
    let tput = Throughput::new(RedisConn::Single(manager.clone()), Duration::from_millis(500), &ScopeLimits::default());
    tput.set_limit(&scope, 1000, "THROUGHPUT_UPGRADE").await.expect("stated");

    let port = bw_testkit::free_port();
    let pairs: Vec<(&str, String)> = vec![
        ("nats.url", nats.url()),
        ("redis.url", redis.url()),
        ("admin.listen", "127.0.0.1:0".into()),
        ("console.listen", format!("127.0.0.1:{port}")),
        ("console.coordinator_url", format!("http://127.0.0.1:{}", bw_testkit::free_port())),
        ("auth.keys", format!(r#"[{{ name = "alice", sha256 = "{}", role = "viewer" }}]"#, sha256_hex(OPERATOR_KEY))),
    ];
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (format!("BW_CONSOLE__{}", k.to_ascii_uppercase().replace('.', "__")), v.clone()))
        .collect();
    let cfg: bw_console::Config =
        bw_common::service::load_config("console", bw_console::DEFAULT_CONFIG, None, &env).expect("console config");
    let stop = tokio_util::sync::CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    tokio::spawn(bw_common::service::run_service("console", cfg, bw_console::run, stop.clone()));
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/senders/{SENDER}");
    let page = || async {
        match client.get(&url).bearer_auth(OPERATOR_KEY).send().await {
            Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
            _ => String::new(),
        }
    };
    let shown = bw_testkit::wait_until(WAIT, || async { page().await.contains("Pair and recipient holds") }).await;
    let body = page().await;
    assert!(shown, "the sender page shows its holds: {body}");
    let tail = |k: &str| format!("…{}", &k[k.len() - 4..]);
    let row_of = |k: &str| body.split("<tr>").find(|r| r.contains(&tail(k))).map(String::from).unwrap_or_default();
    assert!(row_of(&keys[0]).contains("131056 pair rate back-off"), "{body}");
    assert!(row_of(&keys[1]).contains("131049 marketing cool-off"), "{body}");
    assert!(row_of(&keys[2]).contains("131050 the user stopped marketing"), "{body}");
    assert!(!body.contains(&tail(&keys[3])), "a recipient with no hold is not listed");
    assert!(body.contains("Meta's stated throughput: 1000 messages/s (THROUGHPUT_UPGRADE at 20"), "{body}");
    for (number, key) in numbers.iter().zip(&keys) {
        assert!(!body.contains(key.as_str()), "a whole recipient key leaked");
        assert!(!body.contains(&number[1..]), "a recipient number leaked");
    }
}
