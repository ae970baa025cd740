//! The console's compose entry: its environment loads as the console's config, it serves on all interfaces of
//! the container behind a loopback-only published port, its healthcheck follows /readyz on its admin port, and its
//! operator token is the one whose sha256 the coordinator holds.

use std::collections::HashMap;

fn interpolated(value: &str) -> String {
    // `${NAME:-default}` as compose reads it when NAME is unset.
    match value.strip_prefix("${").and_then(|v| v.strip_suffix('}')).and_then(|v| v.split_once(":-")) {
        Some((_, default)) => default.to_string(),
        None => value.to_string(),
    }
}

#[test]
fn the_compose_console_loads_and_reaches_the_coordinator_with_its_token() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/compose.yaml");
    let doc: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(path).expect("compose.yaml")).expect("yaml");
    let console = &doc["services"]["console"];
    let env: HashMap<String, String> = console["environment"]
        .as_mapping()
        .expect("environment")
        .iter()
        .map(|(k, v)| (k.as_str().expect("key").to_string(), interpolated(v.as_str().expect("string value"))))
        .collect();
    let cfg: bw_console::Config =
        bw_common::service::load_config("console", bw_console::DEFAULT_CONFIG, None, &env).expect("loads");
    assert_eq!(cfg.console.listen, "0.0.0.0:9180");
    assert_eq!(cfg.admin.listen, "0.0.0.0:9106");
    assert!(cfg.nats.url.starts_with("nats://console:"), "as its own NATS user (deploy/nats/accounts.conf CONSOLE)");
    assert_eq!(cfg.nats.inbox_prefix, "_INBOX_console", "the only inbox prefix the console user may subscribe to");
    let ports: Vec<&str> = console["ports"].as_sequence().expect("ports").iter().filter_map(|p| p.as_str()).collect();
    assert_eq!(ports, ["127.0.0.1:9180:9180"], "published on the host's loopback only");
    let test: Vec<&str> =
        console["healthcheck"]["test"].as_sequence().expect("test").iter().filter_map(|p| p.as_str()).collect();
    assert_eq!(test.last().copied(), Some("9106"), "the healthcheck probes the admin port");
    let hash = doc["services"]["breaker-coordinator"]["environment"]["BW_BREAKER_COORDINATOR__OPERATOR__TOKEN_SHA256"]
        .as_str()
        .expect("coordinator hash");
    assert_eq!(crate::support::sha256_hex(&cfg.console.operator_token), hash);
}
