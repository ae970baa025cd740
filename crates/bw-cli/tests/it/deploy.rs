//! CI checks of `deploy/`: the Kubernetes manifests and the compose file are parsed (serde_norway) and their
//! structure checked: probes on `/livez` and `/readyz` (compose: a healthcheck on `/readyz`, run against a
//! real admin server), replicas, resource requests, PodDisruptionBudgets,
//! secrets only through `secretKeyRef` (and only keys the example Secret documents), NATS `max_payload` big
//! enough for a 3 MB webhook in one message (and the NATS configs accepted by a real `nats-server -t`), the
//! NATS users of both (every service connects as its own user to a real nats-server started with the
//! config), the coordinator's operator token wiring, and every service config (the ConfigMap files, the compose
//! environments) loads and validates the way its binary loads it. Each checker is also run on a broken copy,
//! so it cannot pass by accident.

use serde_norway::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Smallest acceptable NATS `max_payload`: a 3 MB webhook plus envelope and headers.
const MIN_MAX_PAYLOAD: u64 = 4 * 1024 * 1024;
/// NATS refuses more than 64 MB.
const MAX_MAX_PAYLOAD: u64 = 64 * 1024 * 1024;

/// Breakwater service → admin port (see deploy/Dockerfile).
const SERVICES: [(&str, u64); 5] = [
    ("bw-ingest", 9101),
    ("bw-dispatcher", 9102),
    ("bw-breaker-coordinator", 9103),
    ("bw-replay", 9104),
    ("bw-alerting", 9105),
];

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every YAML document of a file.
fn documents(text: &str, origin: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{origin}: invalid YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// All documents of the files kustomization.yaml lists, each with its file name. A listed directory is a
/// kustomization of its own (`../nats`): its `configMapGenerator`s become the ConfigMaps kustomize generates
/// (`files:` entries as data keys, fixed names).
fn k8s_documents() -> Vec<(String, Value)> {
    let dir = deploy_dir().join("k8s");
    let kustomization = documents(&read(&dir.join("kustomization.yaml")), "kustomization.yaml");
    let mut out = Vec::new();
    for resource in seq(&kustomization[0]["resources"]) {
        let name = resource.as_str().expect("resource is a path").to_string();
        let path = dir.join(&name);
        if !path.is_dir() {
            for doc in documents(&read(&path), &name) {
                out.push((name.clone(), doc));
            }
            continue;
        }
        let origin = format!("{name}/kustomization.yaml");
        let sub = documents(&read(&path.join("kustomization.yaml")), &origin).remove(0);
        assert_eq!(
            sub["generatorOptions"]["disableNameSuffixHash"].as_bool(),
            Some(true),
            "{origin}: generated names are fixed (the manifests refer to them by name)"
        );
        for generator in seq(&sub["configMapGenerator"]) {
            let mut data = serde_norway::Mapping::new();
            for file in seq(&generator["files"]) {
                let file = file.as_str().expect("a file name");
                data.insert(Value::from(file), Value::from(read(&path.join(file))));
            }
            let mut doc = serde_norway::Mapping::new();
            doc.insert("kind".into(), "ConfigMap".into());
            let mut metadata = serde_norway::Mapping::new();
            metadata.insert("name".into(), Value::from(s(&generator, "name")));
            doc.insert("metadata".into(), Value::Mapping(metadata));
            doc.insert("data".into(), Value::Mapping(data));
            out.push((origin.clone(), Value::Mapping(doc)));
        }
    }
    out
}

fn seq(v: &Value) -> Vec<Value> {
    v.as_sequence().cloned().unwrap_or_default()
}

fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

fn kind_name(doc: &Value) -> (String, String) {
    (s(doc, "kind").to_string(), s(&doc["metadata"], "name").to_string())
}

/// Env names that carry a secret: their value must come from a Secret.
fn secret_like(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    ["TOKEN", "SECRET", "PASSWORD", "ROUTING_KEY", "PRIVATE_KEY", "CREDENTIAL"].iter().any(|w| n.contains(w))
        || (n.contains("__SINKS__") && n.ends_with("__URL"))
}

/// Keys the example Secret documents.
fn documented_secret_keys() -> BTreeSet<String> {
    let docs = documents(&read(&deploy_dir().join("k8s/secrets.example.yaml")), "secrets.example.yaml");
    docs[0]["stringData"]
        .as_mapping()
        .map(|m| m.keys().filter_map(|k| k.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// Parses a NATS size (`8MB`, `8388608`, `4MiB`).
fn parse_size(raw: &str) -> Option<u64> {
    let raw = raw.trim().trim_matches('"');
    let digits: String = raw.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: u64 = digits.parse().ok()?;
    let unit = raw[digits.len()..].trim().to_ascii_uppercase();
    let mult = match unit.as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1024,
        "M" | "MB" | "MIB" => 1024 * 1024,
        "G" | "GB" | "GIB" => 1024 * 1024 * 1024,
        _ => return None,
    };
    Some(n * mult)
}

/// The lines of a NATS config text without their comments, trimmed.
fn conf_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().map(|l| l.split('#').next().unwrap_or_default().trim())
}

/// Problems with a NATS server config text's `max_payload`.
fn check_nats_conf(text: &str, origin: &str) -> Vec<String> {
    let value = conf_lines(text)
        .find_map(|l| l.strip_prefix("max_payload").map(|rest| rest.trim_start_matches([':', '=', ' ']).to_string()));
    match value.as_deref().map(parse_size) {
        None => vec![format!("{origin}: no max_payload (the 1 MB default cannot hold a 3 MB webhook)")],
        Some(None) => vec![format!("{origin}: max_payload is not a size")],
        Some(Some(n)) if !(MIN_MAX_PAYLOAD..=MAX_MAX_PAYLOAD).contains(&n) => {
            vec![format!("{origin}: max_payload {n} bytes is outside {MIN_MAX_PAYLOAD}..={MAX_MAX_PAYLOAD}")]
        }
        Some(Some(_)) => Vec::new(),
    }
}

fn probe_path(container: &Value, probe: &str) -> String {
    s(&container[probe]["httpGet"], "path").to_string()
}

/// Problems of the Kubernetes manifests.
fn check_k8s(docs: &[(String, Value)], secret_keys: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let by_kind = |kind: &'static str| {
        docs.iter().filter(move |(_, d)| s(d, "kind") == kind).map(|(f, d)| (f.clone(), d.clone()))
    };
    let pdbs: Vec<Value> = by_kind("PodDisruptionBudget").map(|(_, d)| d).collect();
    let services: Vec<Value> = by_kind("Service").map(|(_, d)| d).collect();
    if docs.iter().any(|(_, d)| s(d, "kind") == "Secret") {
        problems
            .push("a Secret is applied from the repository (create it out of band; see secrets.example.yaml)".into());
    }
    let workloads: Vec<(String, Value)> = by_kind("Deployment").chain(by_kind("StatefulSet")).collect();
    let mut seen = BTreeSet::new();
    for (file, w) in &workloads {
        let (kind, name) = kind_name(w);
        let what = format!("{file}: {kind} {name}");
        let spec = &w["spec"];
        let replicas = spec["replicas"].as_u64().unwrap_or(1);
        let labels = spec["selector"]["matchLabels"].clone();
        if labels.is_null() {
            problems.push(format!("{what}: no selector.matchLabels"));
        }
        let service = SERVICES.iter().find(|(n, _)| *n == name);
        if let Some((_, port)) = service {
            seen.insert(name.clone());
            if kind != "Deployment" {
                problems.push(format!("{what}: a Breakwater service should be a Deployment"));
            }
            if replicas < 2 {
                problems.push(format!("{what}: {replicas} replica(s); every service runs at least 2"));
            }
            let annotations = &spec["template"]["metadata"]["annotations"];
            if s(annotations, "prometheus.io/port") != port.to_string() {
                problems.push(format!("{what}: prometheus.io/port is not the admin port {port}"));
            }
            if !services.iter().any(|svc| svc["spec"]["selector"] == labels) {
                problems.push(format!("{what}: no Service selects it"));
            }
        }
        let pdb = pdbs.iter().find(|p| p["spec"]["selector"]["matchLabels"] == labels);
        let is_single = replicas < 2;
        match pdb {
            None if !is_single => problems.push(format!("{what}: no PodDisruptionBudget selects it")),
            None => {}
            Some(p) => {
                let min = p["spec"]["minAvailable"].as_u64();
                let max = p["spec"]["maxUnavailable"].as_u64();
                match (min, max) {
                    (Some(m), None) if m < replicas => {}
                    (None, Some(m)) if m >= 1 && m < replicas => {}
                    _ => problems.push(format!(
                        "{what}: its PodDisruptionBudget needs minAvailable < replicas or 1 <= maxUnavailable < replicas"
                    )),
                }
            }
        }
        for c in seq(&spec["template"]["spec"]["containers"]) {
            let cname = format!("{what} container {}", s(&c, "name"));
            let requests = &c["resources"]["requests"];
            if requests["cpu"].is_null() || requests["memory"].is_null() {
                problems.push(format!("{cname}: resources.requests needs cpu and memory"));
            }
            if c["resources"]["limits"]["memory"].is_null() {
                problems.push(format!("{cname}: resources.limits.memory missing"));
            }
            if c["livenessProbe"].is_null() || c["readinessProbe"].is_null() {
                problems.push(format!("{cname}: liveness and readiness probes are required"));
            }
            if service.is_some() {
                if probe_path(&c, "livenessProbe") != "/livez" {
                    problems.push(format!("{cname}: livenessProbe must GET /livez"));
                }
                if probe_path(&c, "readinessProbe") != "/readyz" {
                    problems.push(format!("{cname}: readinessProbe must GET /readyz"));
                }
                let admin =
                    seq(&c["ports"]).iter().find(|p| s(p, "name") == "admin").map(|p| p["containerPort"].as_u64());
                if admin != Some(service.map(|(_, p)| *p)) {
                    problems.push(format!("{cname}: port `admin` must be {}", service.map(|(_, p)| *p).unwrap_or(0)));
                }
            }
            for e in seq(&c["env"]) {
                let ename = s(&e, "name");
                if !secret_like(ename) {
                    continue;
                }
                let reference = &e["valueFrom"]["secretKeyRef"];
                if !e["value"].is_null() || reference.is_null() {
                    problems.push(format!("{cname}: {ename} must come from a secretKeyRef, not an inline value"));
                } else if !secret_keys.contains(s(reference, "key")) {
                    problems.push(format!(
                        "{cname}: {ename} uses secret key `{}`, which secrets.example.yaml does not document",
                        s(reference, "key")
                    ));
                }
            }
        }
    }
    for (name, _) in SERVICES {
        if !seen.contains(name) {
            problems.push(format!("no Deployment {name}"));
        }
    }
    let nats_conf = docs
        .iter()
        .find(|(_, d)| s(d, "kind") == "ConfigMap" && s(&d["metadata"], "name") == "nats-config")
        .map(|(_, d)| s(&d["data"], "nats.conf").to_string());
    match nats_conf {
        Some(text) => {
            problems.extend(check_nats_conf(&text, "nats.yaml nats.conf"));
            problems.extend(check_k8s_nats_users(docs, &workloads, &text));
        }
        None => problems.push("no ConfigMap nats-config with nats.conf".into()),
    }
    // The coordinator's operator token hash comes from the Secret, never from the ConfigMap.
    for (_, d) in docs.iter().filter(|(_, d)| s(d, "kind") == "ConfigMap") {
        if let Some(data) = d["data"].as_mapping() {
            for (file, text) in data {
                let text = text.as_str().unwrap_or_default();
                for key in ["token_sha256", "access_token", "app_secret", "verify_token", "routing_key"] {
                    let inline = text.lines().any(|l| {
                        l.trim_start()
                            .strip_prefix(key)
                            .and_then(|rest| rest.trim_start().strip_prefix('='))
                            .is_some_and(|value| {
                                let v = value.split('#').next().unwrap_or_default().trim();
                                !v.is_empty() && v != "\"\""
                            })
                    });
                    if inline {
                        problems.push(format!("ConfigMap {}: {file:?} sets `{key}` inline", s(&d["metadata"], "name")));
                    }
                }
            }
        }
    }
    let coordinator_env: Vec<Value> = workloads
        .iter()
        .filter(|(_, w)| s(&w["metadata"], "name") == "bw-breaker-coordinator")
        .flat_map(|(_, w)| seq(&w["spec"]["template"]["spec"]["containers"]))
        .flat_map(|c| seq(&c["env"]))
        .collect();
    if !coordinator_env.iter().any(|e| s(e, "name") == "BW_BREAKER_COORDINATOR__OPERATOR__TOKEN_SHA256") {
        problems
            .push("bw-breaker-coordinator: no BW_BREAKER_COORDINATOR__OPERATOR__TOKEN_SHA256 from the Secret".into());
    }
    problems
}

/// Problems of the compose file.
fn check_compose(doc: &Value, nats_conf: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(services) = doc["services"].as_mapping() else {
        return vec!["compose: no services".into()];
    };
    let env_of = |svc: &Value| -> BTreeMap<String, String> {
        svc["environment"]
            .as_mapping()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| {
                        let value = match v {
                            Value::String(s) => s.clone(),
                            Value::Number(n) => n.to_string(),
                            Value::Bool(b) => b.to_string(),
                            _ => String::new(),
                        };
                        Some((k.as_str()?.to_string(), value))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut nats_nodes = 0;
    for (name, svc) in services {
        let name = name.as_str().unwrap_or_default();
        let command: Vec<String> = seq(&svc["command"]).iter().filter_map(|c| c.as_str().map(String::from)).collect();
        if s(svc, "image").starts_with("nats:") {
            nats_nodes += 1;
            let mounted = seq(&svc["volumes"]).iter().any(|v| s_of(v).starts_with("./compose.nats.conf:"));
            let uses = command.windows(2).any(|w| w[0] == "-c" && w[1] == "/etc/nats/nats.conf");
            if !mounted || !uses {
                problems.push(format!(
                    "compose {name}: must run with -c /etc/nats/nats.conf mounted from compose.nats.conf"
                ));
            }
        }
        for (key, value) in env_of(svc) {
            let is_hash = key.ends_with("TOKEN_SHA256") && value.len() == 64 && hex::decode(&value).is_ok();
            if secret_like(&key)
                && !is_hash
                && !(value.is_empty() || value.starts_with("${") || value.starts_with("local-"))
            {
                problems.push(format!("compose {name}: {key} is neither a local-only placeholder nor ${{...}}"));
            }
            if key.ends_with("__OPERATOR__TOKEN_SHA256") && !is_hash {
                problems.push(format!("compose {name}: {key} is not a sha256"));
            }
        }
        if let Some(port) = command.first().and_then(|bin| SERVICES.iter().find(|(n, _)| n == bin).map(|(_, p)| *p)) {
            let test: Vec<String> =
                seq(&svc["healthcheck"]["test"]).iter().filter_map(|c| c.as_str().map(String::from)).collect();
            let probes_readyz = test.len() == 6
                && test[..3] == ["CMD", "bash", "-c"]
                && test[3].contains("GET /readyz")
                && test[5] == port.to_string();
            if !probes_readyz {
                problems.push(format!("compose {name}: healthcheck must GET /readyz on its admin port {port}"));
            }
            let env = env_of(svc);
            let listen = env.iter().find(|(k, _)| k.ends_with("__ADMIN__LISTEN")).map(|(_, v)| v.clone());
            if listen != Some(format!("0.0.0.0:{port}")) {
                problems.push(format!("compose {name}: ADMIN__LISTEN must be 0.0.0.0:{port} (probes, Prometheus)"));
            }
        }
    }
    if nats_nodes < 3 {
        problems.push(format!("compose: {nats_nodes} NATS node(s); the local stack runs a 3-node cluster"));
    }
    problems.extend(check_nats_conf(nats_conf, "compose.nats.conf"));
    problems.extend(check_compose_nats_users(services, nats_conf));
    // bwctl in the dispatcher container can make operator calls: its token matches the coordinator's hash.
    let hash = services
        .get("breaker-coordinator")
        .map(env_of)
        .and_then(|e| e.get("BW_BREAKER_COORDINATOR__OPERATOR__TOKEN_SHA256").cloned());
    let token = services.get("dispatcher").map(env_of).and_then(|e| e.get("BW_OPERATOR_TOKEN").cloned());
    match (hash, token) {
        (Some(h), Some(t)) if bw_cli::operator_token_hash(&t) == h => {}
        _ => problems
            .push("compose: the dispatcher's BW_OPERATOR_TOKEN must hash to the coordinator's TOKEN_SHA256".into()),
    }
    let coordinators = services.get("breaker-coordinator").and_then(|c| c["deploy"]["replicas"].as_u64()).unwrap_or(1);
    if coordinators < 2 {
        problems.push("compose: run 2 breaker-coordinators (leader + standby)".into());
    }
    problems
}

/// The environment prefix of a service binary's settings: `bw-breaker-coordinator` → `BW_BREAKER_COORDINATOR`.
fn env_prefix(bin: &str) -> String {
    format!("BW_{}", bin.trim_start_matches("bw-").to_ascii_uppercase().replace('-', "_"))
}

/// `user:password` of the first URL of a NATS URL list, if it has credentials.
fn url_credentials(urls: &str) -> Option<&str> {
    urls.split(',').next()?.strip_prefix("nats://")?.split_once('@').map(|(creds, _)| creds)
}

/// The NATS users of every NATS user's password variable, as accounts.conf names them.
const NATS_USERS: [&str; 7] =
    ["ingest", "dispatcher", "replay", "breaker-coordinator", "alerting", "operator", "producer"];

/// `BW_NATS_<USER>_PASSWORD`, the variable accounts.conf reads a user's password from.
fn nats_password_var(user: &str) -> String {
    format!("BW_NATS_{}_PASSWORD", user.to_ascii_uppercase().replace('-', "_"))
}

/// A container's env entries by name.
fn env_entries(container: &Value) -> Vec<(String, Value)> {
    seq(&container["env"]).into_iter().map(|e| (s(&e, "name").to_string(), e)).collect()
}

/// NATS users on Kubernetes: nats.conf includes accounts.conf, which the NATS pods get from the ConfigMap
/// `nats-accounts` (the very file deploy/nats/accounts.conf) projected beside nats.conf, with every user's
/// password from the Secret; each service's config names its inbox prefix `_INBOX_<user>` and its Deployment
/// connects as its own user, the password from its own Secret key expanded into the URL (defined before it).
fn check_k8s_nats_users(docs: &[(String, Value)], workloads: &[(String, Value)], nats_conf: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !conf_lines(nats_conf).any(|l| l == "include accounts.conf") {
        problems.push("nats.yaml nats.conf: must `include accounts.conf` (the NATS users)".into());
    }
    let config_map = |name: &str| {
        docs.iter().find(|(_, d)| s(d, "kind") == "ConfigMap" && s(&d["metadata"], "name") == name).map(|(_, d)| d)
    };
    match config_map("nats-accounts").map(|d| s(&d["data"], "accounts.conf")) {
        Some(text) if text == read(&deploy_dir().join("nats/accounts.conf")) => {}
        _ => problems.push("no ConfigMap nats-accounts holding deploy/nats/accounts.conf as accounts.conf".into()),
    }
    let Some((_, nats)) =
        workloads.iter().find(|(_, w)| s(w, "kind") == "StatefulSet" && s(&w["metadata"], "name") == "nats")
    else {
        problems.push("no StatefulSet nats".into());
        return problems;
    };
    let pod = &nats["spec"]["template"]["spec"];
    let sources: Vec<String> = seq(&pod["volumes"])
        .iter()
        .flat_map(|v| seq(&v["projected"]["sources"]))
        .map(|src| s(&src["configMap"], "name").to_string())
        .collect();
    if !(sources.iter().any(|n| n == "nats-config") && sources.iter().any(|n| n == "nats-accounts")) {
        problems.push("StatefulSet nats: nats-config and nats-accounts must be projected into one volume".into());
    }
    let nats_env: Vec<(String, Value)> = seq(&pod["containers"]).iter().flat_map(env_entries).collect();
    for user in NATS_USERS {
        let var = nats_password_var(user);
        let key = nats_env
            .iter()
            .find(|(n, _)| *n == var)
            .map(|(_, e)| s(&e["valueFrom"]["secretKeyRef"], "key").to_string());
        if key.as_deref() != Some(format!("nats-{user}-password").as_str()) {
            problems.push(format!("StatefulSet nats: {var} must come from the secret key nats-{user}-password"));
        }
    }
    let bw_config = config_map("bw-config");
    for (deployment, _) in SERVICES {
        let user = deployment.trim_start_matches("bw-");
        let prefix = env_prefix(deployment);
        let toml = bw_config.map(|d| s(&d["data"], &format!("{user}.toml")).to_string()).unwrap_or_default();
        let inbox = toml.lines().any(|l| l.trim() == format!("inbox_prefix = \"_INBOX_{user}\""));
        if !inbox {
            problems.push(format!("bw-config {user}.toml: [nats] inbox_prefix must be \"_INBOX_{user}\""));
        }
        let Some((_, w)) = workloads.iter().find(|(_, w)| s(&w["metadata"], "name") == deployment) else { continue };
        let env: Vec<(String, Value)> =
            seq(&w["spec"]["template"]["spec"]["containers"]).iter().flat_map(env_entries).collect();
        let url_at = env.iter().position(|(n, _)| *n == format!("{prefix}__NATS__URL"));
        let url = url_at.map(|i| s(&env[i].1, "value").to_string()).unwrap_or_default();
        let expected = format!("{user}:$(NATS_PASSWORD)");
        if url_credentials(&url) != Some(expected.as_str()) {
            problems.push(format!(
                "{deployment}: {prefix}__NATS__URL must connect as NATS user {user} with $(NATS_PASSWORD)"
            ));
        }
        let password_at = env.iter().position(|(n, e)| {
            n == "NATS_PASSWORD" && s(&e["valueFrom"]["secretKeyRef"], "key") == format!("nats-{user}-password")
        });
        if !matches!((password_at, url_at), (Some(p), Some(u)) if p < u) {
            problems.push(format!(
                "{deployment}: NATS_PASSWORD must come from the secret key nats-{user}-password, before the URL"
            ));
        }
    }
    problems
}

/// NATS users in compose: the server includes accounts.conf (mounted beside its config, passwords in every
/// node's environment), each Breakwater service connects as its own user (the service's name) with its own inbox
/// prefix, and bwctl in the dispatcher container as `operator`; every password is a local-only placeholder.
fn check_compose_nats_users(services: &serde_norway::Mapping, nats_conf: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !conf_lines(nats_conf).any(|l| l == "include nats/accounts.conf") {
        problems.push("compose.nats.conf: must `include nats/accounts.conf` (the NATS users)".into());
    }
    let env = |svc: &Value, key: &str| s(&svc["environment"], key).to_string();
    let user_of = |url: &str| -> Option<(String, String)> {
        let (user, password) = url_credentials(url)?.split_once(':')?;
        Some((user.to_string(), password.to_string()))
    };
    for (name, svc) in services {
        let name = name.as_str().unwrap_or_default();
        if s(svc, "image").starts_with("nats:") {
            let mounted =
                seq(&svc["volumes"]).iter().any(|v| s_of(v) == "./nats/accounts.conf:/etc/nats/nats/accounts.conf:ro");
            if !mounted {
                problems
                    .push(format!("compose {name}: must mount ./nats/accounts.conf at /etc/nats/nats/accounts.conf"));
            }
            for var in NATS_USERS.map(nats_password_var) {
                if !env(svc, &var).starts_with("local-") {
                    problems.push(format!("compose {name}: {var} must be a local-only placeholder"));
                }
            }
            continue;
        }
        let Some(bin) = seq(&svc["command"]).first().map(|c| s_of(c).to_string()) else { continue };
        if !SERVICES.iter().any(|(n, _)| *n == bin) {
            continue;
        }
        let user = bin.trim_start_matches("bw-").to_string();
        let prefix = env_prefix(&bin);
        match user_of(&env(svc, &format!("{prefix}__NATS__URL"))) {
            Some((u, p)) if u == user && p.starts_with("local-") => {}
            _ => problems.push(format!("compose {name}: {prefix}__NATS__URL must connect as NATS user {user}")),
        }
        if env(svc, &format!("{prefix}__NATS__INBOX_PREFIX")) != format!("_INBOX_{user}") {
            problems.push(format!("compose {name}: {prefix}__NATS__INBOX_PREFIX must be _INBOX_{user}"));
        }
    }
    let bwctl = services.get("dispatcher").map(|d| env(d, "BW_NATS_URL")).unwrap_or_default();
    if !matches!(user_of(&bwctl), Some((u, _)) if u == "operator") {
        problems.push("compose dispatcher: BW_NATS_URL (bwctl) must connect as NATS user operator".into());
    }
    problems
}

/// The NATS passwords of the compose file (the environment of its first NATS node), as nats-server needs them
/// to parse compose.nats.conf.
fn compose_nats_passwords() -> Vec<(String, String)> {
    let (doc, _) = compose();
    let services = doc["services"].as_mapping().expect("services");
    let node = services.values().find(|svc| s(svc, "image").starts_with("nats:")).expect("a NATS node");
    node["environment"]
        .as_mapping()
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

fn s_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn compose() -> (Value, String) {
    let dir = deploy_dir();
    let mut doc = documents(&read(&dir.join("compose.yaml")), "compose.yaml").remove(0);
    doc.apply_merge().expect("compose.yaml: YAML merge keys (<<) resolve");
    (doc, read(&dir.join("compose.nats.conf")))
}

#[test]
fn kubernetes_manifests_pass_the_checks() {
    let problems = check_k8s(&k8s_documents(), &documented_secret_keys());
    assert!(problems.is_empty(), "deploy/k8s:\n  {}", problems.join("\n  "));
}

#[test]
fn every_manifest_file_is_applied_except_the_example_secret() {
    let dir = deploy_dir().join("k8s");
    let listed: BTreeSet<String> =
        seq(&documents(&read(&dir.join("kustomization.yaml")), "kustomization")[0]["resources"])
            .iter()
            .filter_map(|r| r.as_str().map(String::from))
            .filter(|r| r.ends_with(".yaml"))
            .collect();
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .expect("read deploy/k8s")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml" && n != "secrets.example.yaml")
        .collect();
    assert_eq!(listed, present, "kustomization.yaml lists exactly the manifests");
}

#[test]
fn compose_passes_the_checks() {
    let (doc, conf) = compose();
    let problems = check_compose(&doc, &conf);
    assert!(problems.is_empty(), "deploy/compose.yaml:\n  {}", problems.join("\n  "));
}

/// A real nats-server accepts both NATS configs (`-t`: parse and exit).
#[test]
fn nats_server_accepts_the_nats_configs() {
    let bin = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".into());
    let dir = tempfile::tempdir().expect("tempdir");
    let k8s = k8s_documents()
        .into_iter()
        .find(|(_, d)| s(&d["metadata"], "name") == "nats-config")
        .map(|(_, d)| s(&d["data"], "nats.conf").to_string())
        .expect("nats-config");
    let k8s_path = dir.path().join("k8s-nats.conf");
    std::fs::write(&k8s_path, k8s).expect("write");
    // As the projected volume puts them: accounts.conf beside nats.conf.
    std::fs::copy(deploy_dir().join("nats/accounts.conf"), dir.path().join("accounts.conf")).expect("copy");
    for path in [k8s_path, deploy_dir().join("compose.nats.conf")] {
        let out = std::process::Command::new(&bin)
            .arg("-t")
            .arg("-c")
            .arg(&path)
            .env("POD_NAME", "nats-0")
            .envs(compose_nats_passwords())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
        assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
    }
}

/// The compose NATS users work on a real nats-server started with compose.nats.conf (which includes
/// accounts.conf) and the compose passwords: every service's URL and inbox prefix of compose.yaml, and bwctl's,
/// connect and reach JetStream as their user; a wrong password is refused.
#[tokio::test]
async fn the_compose_nats_users_connect_to_a_server_with_the_compose_config() {
    let passwords = compose_nats_passwords();
    let envs: Vec<(&str, &str)> = passwords.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // The files as compose mounts them, with one change: the container's store directory (/data) goes, so the
    // testkit's own store (`-sd`) applies; the monitoring port of the file (8222) may be taken on this machine,
    // so the command line's wins.
    let dir = tempfile::tempdir().expect("tempdir");
    let text = read(&deploy_dir().join("compose.nats.conf"));
    assert!(text.contains("store_dir: /data"), "compose.nats.conf keeps its store in /data");
    std::fs::write(dir.path().join("compose.nats.conf"), text.replace("store_dir: /data", "")).expect("write");
    std::fs::create_dir(dir.path().join("nats")).expect("mkdir");
    std::fs::copy(deploy_dir().join("nats/accounts.conf"), dir.path().join("nats/accounts.conf")).expect("copy");
    let config = dir.path().join("compose.nats.conf");
    let args = vec!["-c".into(), config.display().to_string(), "-m".into(), bw_testkit::free_port().to_string()];
    let server = bw_testkit::NatsServer::start_with_args_and_env(args, &envs);
    let local = |url: &str| format!("nats://{}@127.0.0.1:{}", url_credentials(url).unwrap_or(""), server.port());
    let (doc, _) = compose();
    let services = doc["services"].as_mapping().expect("services");
    let mut users = Vec::new();
    for svc in services.values() {
        let Some(bin) = seq(&svc["command"]).first().map(|c| s_of(c).to_string()) else { continue };
        if !SERVICES.iter().any(|(n, _)| *n == bin) {
            continue;
        }
        let prefix = env_prefix(&bin);
        let url = s(&svc["environment"], &format!("{prefix}__NATS__URL")).to_string();
        let inbox = s(&svc["environment"], &format!("{prefix}__NATS__INBOX_PREFIX")).to_string();
        users.push((bin, local(&url), inbox));
    }
    let bwctl = s(&services["dispatcher"]["environment"], "BW_NATS_URL").to_string();
    users.push(("bwctl".into(), local(&bwctl), String::new()));
    assert_eq!(users.len(), SERVICES.len() + 1, "{users:?}");
    connect_as_each(&users, server.port()).await;
}

/// Each `(who, url, inbox prefix)` connects with its credentials and reaches JetStream; a wrong password is
/// refused.
async fn connect_as_each(users: &[(String, String, String)], port: u16) {
    for (who, url, inbox) in users {
        let cfg = bw_common::config::NatsConfig {
            inbox_prefix: inbox.clone(),
            ..bw_common::config::NatsConfig::single(url.as_str(), format!("deploy-{who}"))
        };
        let client = bw_common::nats::connect(&cfg, who, std::time::Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{who} cannot connect with its credentials: {e}"));
        let js = async_nats::jetstream::new(client);
        js.query_account().await.unwrap_or_else(|e| panic!("{who}: JetStream refused: {e}"));
    }
    let wrong = format!("nats://replay:not-the-password@127.0.0.1:{port}");
    let refused = bw_common::nats::connect(
        &bw_common::config::NatsConfig::single(wrong, "deploy-wrong"),
        "wrong",
        std::time::Duration::from_millis(500),
    )
    .await;
    assert!(refused.is_err(), "a wrong password is refused");
}

/// Kubernetes expands `$(NAME)` in an env value from the entries before it.
fn expand_k8s_env(value: &str, env: &BTreeMap<String, String>) -> String {
    env.iter().fold(value.to_string(), |v, (name, val)| v.replace(&format!("$({name})"), val))
}

/// The k8s NATS users work on a real nats-server started with the k8s nats.conf and the accounts.conf of the
/// `nats-accounts` ConfigMap beside it, the passwords in its environment as the Secret puts them: every
/// Deployment's URL (its `$(NATS_PASSWORD)` expanded from its own secret key) and inbox prefix of bw-config
/// connects and reaches JetStream as its user.
#[tokio::test]
async fn the_kubernetes_nats_users_connect_to_a_server_with_the_kubernetes_config() {
    let docs = k8s_documents();
    let config_map =
        |name: &str| docs.iter().find(|(_, d)| s(&d["metadata"], "name") == name).map(|(_, d)| d.clone()).expect(name);
    // The pod's config with four changes for one local node: no cluster block (its peers do not exist here,
    // and JetStream would wait for a quorum), no /data store and size (the testkit's `-sd` applies), no pid
    // file in the pod's /var/run/nats, and the command line's monitoring port.
    let conf = s(&config_map("nats-config")["data"], "nats.conf").to_string();
    let mut local = String::new();
    let mut depth = 0usize;
    for (line, code) in conf.lines().zip(conf_lines(&conf)) {
        if depth == 0 && code.starts_with("cluster") && code.ends_with('{') {
            depth = 1;
            continue;
        }
        if depth > 0 {
            depth = depth + code.matches('{').count() - code.matches('}').count();
            continue;
        }
        if ["store_dir", "max_file_store", "pid_file"].iter().any(|key| code.starts_with(key)) {
            continue;
        }
        local.push_str(line);
        local.push('\n');
    }
    assert!(conf.contains("cluster {") && !local.contains("routes"), "the cluster block is removed");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("nats.conf"), local).expect("write");
    let accounts = s(&config_map("nats-accounts")["data"], "accounts.conf").to_string();
    std::fs::write(dir.path().join("accounts.conf"), accounts).expect("write");
    // One password per secret key, as a Secret would hold them.
    let secret = |key: &str| format!("k8s-{}", hex::encode(key.as_bytes()));
    let mut envs: Vec<(String, String)> = vec![("POD_NAME".into(), "nats-0".into())];
    envs.extend(NATS_USERS.iter().map(|u| (nats_password_var(u), secret(&format!("nats-{u}-password")))));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let args = vec![
        "-c".into(),
        dir.path().join("nats.conf").display().to_string(),
        "-m".into(),
        bw_testkit::free_port().to_string(),
    ];
    let server = bw_testkit::NatsServer::start_with_args_and_env(args, &envs);
    let bw_config = config_map("bw-config");
    let mut users = Vec::new();
    for (deployment, _) in SERVICES {
        let service = deployment.trim_start_matches("bw-");
        let workload = config_map(deployment);
        let mut env = BTreeMap::new();
        for c in seq(&workload["spec"]["template"]["spec"]["containers"]) {
            for e in seq(&c["env"]) {
                let value = match e["value"].as_str() {
                    Some(v) => expand_k8s_env(v, &env),
                    None => secret(s(&e["valueFrom"]["secretKeyRef"], "key")),
                };
                env.insert(s(&e, "name").to_string(), value);
            }
        }
        let url = env.get(&format!("{}__NATS__URL", env_prefix(deployment))).cloned().unwrap_or_default();
        let inbox = s(&bw_config["data"], &format!("{service}.toml"))
            .lines()
            .find_map(|l| l.trim().strip_prefix("inbox_prefix = "))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_default();
        let local = format!("nats://{}@127.0.0.1:{}", url_credentials(&url).unwrap_or(""), server.port());
        users.push((deployment.to_string(), local, inbox));
    }
    connect_as_each(&users, server.port()).await;
}

fn container_mut<'a>(docs: &'a mut [(String, Value)], deployment: &str) -> &'a mut Value {
    let (_, d) = docs
        .iter_mut()
        .find(|(_, d)| s(d, "kind") == "Deployment" && s(&d["metadata"], "name") == deployment)
        .expect("deployment");
    &mut d["spec"]["template"]["spec"]["containers"][0]
}

/// The checkers find each kind of breakage (so a green run means something).
#[test]
fn the_checks_catch_broken_manifests() {
    let keys = documented_secret_keys();
    let mut docs = k8s_documents();
    container_mut(&mut docs, "bw-dispatcher")["readinessProbe"]["httpGet"]["path"] = Value::from("/metrics");
    let env = container_mut(&mut docs, "bw-ingest")["env"].as_sequence_mut().expect("env");
    env[0] = serde_norway::from_str("{ name: BW_INGEST__WEBHOOK__VERIFY_TOKEN, value: hunter2 }").expect("yaml");
    container_mut(&mut docs, "bw-replay")["resources"] = Value::Null;
    let (_, replay) = docs.iter_mut().find(|(_, d)| s(&d["metadata"], "name") == "bw-alerting").expect("alerting");
    replay["spec"]["replicas"] = Value::from(1);
    docs.retain(|(_, d)| !(s(d, "kind") == "PodDisruptionBudget" && s(&d["metadata"], "name") == "nats"));
    for (_, d) in docs.iter_mut().filter(|(_, d)| s(&d["metadata"], "name") == "nats-config") {
        d["data"]["nats.conf"] = Value::from("port: 4222\nmax_payload: 1MB\n");
    }
    let url = Value::from("nats://replay:$(NATS_PASSWORD)@nats-0.nats.breakwater.svc:4222");
    for e in container_mut(&mut docs, "bw-dispatcher")["env"].as_sequence_mut().expect("env") {
        if s(e, "name") == "BW_DISPATCHER__NATS__URL" {
            e["value"] = url.clone();
        }
    }
    container_mut(&mut docs, "bw-breaker-coordinator")["env"]
        .as_sequence_mut()
        .expect("env")
        .retain(|e| s(e, "name") != "NATS_PASSWORD");
    for (_, d) in docs.iter_mut().filter(|(_, d)| s(d, "kind") == "StatefulSet" && s(&d["metadata"], "name") == "nats")
    {
        if let Some(env) = d["spec"]["template"]["spec"]["containers"][0]["env"].as_sequence_mut() {
            env.retain(|e| s(e, "name") != "BW_NATS_OPERATOR_PASSWORD");
        }
    }
    let problems = check_k8s(&docs, &keys).join("\n");
    for expected in [
        "nats.yaml nats.conf: must `include accounts.conf`",
        "bw-dispatcher: BW_DISPATCHER__NATS__URL must connect as NATS user dispatcher",
        "bw-breaker-coordinator: NATS_PASSWORD must come from the secret key nats-breaker-coordinator-password",
        "StatefulSet nats: BW_NATS_OPERATOR_PASSWORD must come from the secret key nats-operator-password",
        "bw-dispatcher container dispatcher: readinessProbe must GET /readyz",
        "BW_INGEST__WEBHOOK__VERIFY_TOKEN must come from a secretKeyRef",
        "bw-replay container replay: resources.requests needs cpu and memory",
        "Deployment bw-alerting: 1 replica(s)",
        "StatefulSet nats: no PodDisruptionBudget",
        "max_payload 1048576 bytes is outside",
    ] {
        assert!(problems.contains(expected), "`{expected}` not reported:\n{problems}");
    }

    let (mut doc, _) = compose();
    doc["services"]["dispatcher"]["environment"]["BW_OPERATOR_TOKEN"] = Value::from("local-other-token");
    doc["services"]["ingest"]["environment"]["BW_INGEST__WEBHOOK__APP_SECRET"] = Value::from("real-looking-secret");
    doc["services"]["replay"]["healthcheck"] = Value::Null;
    doc["services"]["alerting"]["environment"]["BW_ALERTING__NATS__URL"] = Value::from("nats://nats-1:4222");
    doc["services"]["replay"]["environment"]["BW_REPLAY__NATS__URL"] =
        Value::from("nats://dispatcher:local-nats-dispatcher@nats-1:4222");
    doc["services"]["ingest"]["environment"]["BW_INGEST__NATS__INBOX_PREFIX"] = Value::from("_INBOX");
    let problems = check_compose(&doc, "port: 4222\n").join("\n");
    for expected in [
        "compose replay: healthcheck must GET /readyz on its admin port 9104",
        "BW_OPERATOR_TOKEN must hash",
        "BW_INGEST__WEBHOOK__APP_SECRET is neither a local-only placeholder",
        "compose.nats.conf: no max_payload",
        "compose.nats.conf: must `include nats/accounts.conf`",
        "compose alerting: BW_ALERTING__NATS__URL must connect as NATS user alerting",
        "compose replay: BW_REPLAY__NATS__URL must connect as NATS user replay",
        "compose ingest: BW_INGEST__NATS__INBOX_PREFIX must be _INBOX_ingest",
    ] {
        assert!(problems.contains(expected), "`{expected}` not reported:\n{problems}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "[coordinator]\ntick_msec = 5\n").expect("write");
    let err = load_service("breaker-coordinator", Some(&typo), &BTreeMap::new()).expect_err("a typo is refused");
    assert!(err.contains("tick_msec"), "{err}");
    let env = BTreeMap::from([("BW_ALERTING__SINKS__SLACK__ENABLED".to_string(), "true".to_string())]);
    assert!(load_service("alerting", None, &env).is_err(), "an enabled sink without its secret is refused");
    assert_eq!(parse_size("8MB"), Some(8 * 1024 * 1024));
    assert_eq!(parse_size("4194304"), Some(MIN_MAX_PAYLOAD));
    assert_eq!(parse_size("lots"), None);
}

/// Loads a service config the way its binary does (compiled defaults → file → env, then validation).
fn load_service(service: &str, file: Option<&Path>, env: &BTreeMap<String, String>) -> Result<(), String> {
    use bw_common::service::load_config;
    let env: std::collections::HashMap<String, String> = env.clone().into_iter().collect();
    let r = match service {
        "ingest" => load_config::<bw_ingest::Config>(service, bw_ingest::DEFAULT_CONFIG, file, &env).map(|_| ()),
        "dispatcher" => {
            load_config::<bw_dispatcher::Config>(service, bw_dispatcher::DEFAULT_CONFIG, file, &env).map(|_| ())
        }
        "breaker-coordinator" => {
            load_config::<bw_breaker_coordinator::Config>(service, bw_breaker_coordinator::DEFAULT_CONFIG, file, &env)
                .map(|_| ())
        }
        "replay" => load_config::<bw_replay::Config>(service, bw_replay::DEFAULT_CONFIG, file, &env).map(|_| ()),
        "alerting" => load_config::<bw_alerting::Config>(service, bw_alerting::DEFAULT_CONFIG, file, &env).map(|_| ()),
        other => return Err(format!("unknown service {other}")),
    };
    r.map_err(|e| e.to_string())
}

/// Every service config of the `bw-config` ConfigMap loads and validates with the Deployment's plain env
/// values, its required secrets present and its optional ones absent (a pod must start without those).
#[test]
fn every_kubernetes_service_config_loads_at_its_binary() {
    let docs = k8s_documents();
    let config = docs
        .iter()
        .find(|(_, d)| s(d, "kind") == "ConfigMap" && s(&d["metadata"], "name") == "bw-config")
        .map(|(_, d)| d.clone())
        .expect("ConfigMap bw-config");
    let dir = tempfile::tempdir().expect("tempdir");
    for (deployment, _) in SERVICES {
        let service = deployment.trim_start_matches("bw-");
        let text = s(&config["data"], &format!("{service}.toml")).to_string();
        assert!(!text.is_empty(), "bw-config has no {service}.toml");
        let path = dir.path().join(format!("{service}.toml"));
        std::fs::write(&path, text).expect("write");
        let workload = docs
            .iter()
            .find(|(_, d)| s(d, "kind") == "Deployment" && s(&d["metadata"], "name") == deployment)
            .map(|(_, d)| d.clone())
            .expect("deployment");
        let mut env = BTreeMap::new();
        for c in seq(&workload["spec"]["template"]["spec"]["containers"]) {
            let command: Vec<String> = seq(&c["command"]).iter().filter_map(|v| v.as_str().map(String::from)).collect();
            assert_eq!(
                command,
                [deployment.to_string(), "--config".into(), format!("/etc/breakwater/{service}.toml")],
                "{deployment}: runs its binary on its ConfigMap file"
            );
            for e in seq(&c["env"]) {
                if let Some(v) = e["value"].as_str() {
                    env.insert(s(&e, "name").to_string(), expand_k8s_env(v, &env));
                }
                // A required secret is there (else Kubernetes does not start the container); an optional
                // one is absent.
                let reference = &e["valueFrom"]["secretKeyRef"];
                if !reference.is_null() && reference["optional"].as_bool() != Some(true) {
                    let value = if s(reference, "key").ends_with("-url") {
                        "https://hooks.example.invalid/placeholder"
                    } else {
                        "0123456789abcdef0123456789abcdef"
                    };
                    env.insert(s(&e, "name").to_string(), value.to_string());
                }
            }
        }
        if let Err(e) = load_service(service, Some(&path), &env) {
            panic!("{deployment}: its ConfigMap config does not load: {e}");
        }
    }
}

/// Every service of the compose file starts with a valid config from its environment.
#[test]
fn every_compose_service_config_loads_at_its_binary() {
    let (doc, _) = compose();
    let services = doc["services"].as_mapping().expect("services");
    let mut checked = 0;
    for (name, svc) in services {
        let command: Vec<String> = seq(&svc["command"]).iter().filter_map(|c| c.as_str().map(String::from)).collect();
        let Some(bin) = command.first().filter(|b| SERVICES.iter().any(|(n, _)| *n == b.as_str())) else {
            continue;
        };
        let env: BTreeMap<String, String> = svc["environment"]
            .as_mapping()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| {
                        let value = match v {
                            Value::String(s) => s.clone(),
                            Value::Number(n) => n.to_string(),
                            Value::Bool(b) => b.to_string(),
                            _ => return None,
                        };
                        // `${VAR:-default}` is what compose substitutes when VAR is unset.
                        let value = match value.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
                            Some(inner) => inner.split_once(":-").map(|(_, d)| d.to_string()).unwrap_or_default(),
                            None => value,
                        };
                        Some((k.as_str()?.to_string(), value))
                    })
                    .collect()
            })
            .unwrap_or_default();
        if let Err(e) = load_service(bin.trim_start_matches("bw-"), None, &env) {
            panic!("compose {}: its config does not load: {e}", name.as_str().unwrap_or_default());
        }
        checked += 1;
    }
    assert_eq!(checked, SERVICES.len(), "every service is in compose");
}

/// The compose healthcheck (bash, no curl in the image) against a real admin server: unhealthy while `/readyz`
/// answers 503, healthy once it answers 200.
#[tokio::test]
async fn the_compose_healthcheck_follows_readyz() {
    let (doc, _) = compose();
    let test: Vec<String> = seq(&doc["services"]["breaker-coordinator"]["healthcheck"]["test"])
        .iter()
        .filter_map(|c| c.as_str().map(String::from))
        .collect();
    assert!(test.len() == 6, "{test:?}");
    // Compose turns `$$` into `$` when it reads the file.
    let script = test[3].replace("$$", "$");
    let health = bw_common::admin::Health::new(None, None);
    let token = tokio_util::sync::CancellationToken::new();
    let addr =
        bw_common::admin::serve("127.0.0.1:0", health.clone(), bw_common::admin::new_registry(), None, token.clone())
            .await
            .expect("admin server");
    let probe = || {
        let script = script.clone();
        let port = addr.port().to_string();
        async move {
            tokio::process::Command::new("bash")
                .arg("-c")
                .arg(&script)
                .arg("readyz")
                .arg(&port)
                .status()
                .await
                .expect("bash runs")
                .success()
        }
    };
    assert!(!probe().await, "503 while starting: unhealthy");
    health.set_started();
    assert!(probe().await, "200 once ready: healthy");
    token.cancel();
}
