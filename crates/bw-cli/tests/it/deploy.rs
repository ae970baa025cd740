//! CI checks of `deploy/`: the Kubernetes manifests and the compose file are parsed (serde_norway) and their
//! structure checked: probes on `/livez` and `/readyz` (compose: a healthcheck on `/readyz`, run against a
//! real admin server), replicas, resource requests, PodDisruptionBudgets,
//! secrets only through `secretKeyRef` (and only keys the example Secret documents), NATS `max_payload` big
//! enough for a 3 MB webhook in one message (and the NATS configs accepted by a real `nats-server -t`), the
//! NATS users of both (every service connects as its own user to a real nats-server started with the
//! config), the coordinator's operator token wiring, and every service config (the ConfigMap files, the compose
//! environments) loads and validates the way its binary loads it. Hardening: the NetworkPolicies (every pod
//! covered, each port reachable only from where network-policies.yaml says), Redis AUTH (the Redis manifest
//! requires the Secret's password, started here with a real redis-server, and every Redis user gets it), NATS TLS
//! for clients and routes with route authorization (real nats-server nodes started with the pod's config and
//! throwaway certificates: the services connect over TLS, the routes form, a node without the route password is
//! refused). Each checker is also run on a broken copy, so it cannot pass by accident.

use serde_norway::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Smallest acceptable NATS `max_payload`: a 3 MB webhook plus envelope and headers.
const MIN_MAX_PAYLOAD: u64 = 4 * 1024 * 1024;
/// NATS refuses more than 64 MB.
const MAX_MAX_PAYLOAD: u64 = 64 * 1024 * 1024;

/// Breakwater service → admin port (see deploy/Dockerfile).
const SERVICES: [(&str, u64); 6] = [
    ("bw-ingest", 9101),
    ("bw-dispatcher", 9102),
    ("bw-breaker-coordinator", 9103),
    ("bw-replay", 9104),
    ("bw-alerting", 9105),
    ("bw-console", 9106),
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
                for key in ["token_sha256", "access_token", "app_secret", "verify_token", "routing_key", "password"] {
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
    problems.extend(check_network_policies(docs, &workloads));
    problems.extend(check_k8s_redis_auth(&workloads));
    problems.extend(check_k8s_nats_tls(docs, &workloads));
    problems
}

/// Deployments of the services that use Redis (each loads a `[redis]` section: `every_kubernetes_service_config_
/// loads_at_its_binary` checks this list against their configs).
const REDIS_USERS: [&str; 4] = ["bw-ingest", "bw-dispatcher", "bw-breaker-coordinator", "bw-console"];

/// The pod template labels of a workload.
fn pod_labels(workload: &Value) -> serde_norway::Mapping {
    workload["spec"]["template"]["metadata"]["labels"].as_mapping().cloned().unwrap_or_default()
}

/// Whether a label selector (`matchLabels`, `matchExpressions` with In / NotIn / Exists / DoesNotExist) selects
/// pods with `labels`; an empty selector selects every pod.
fn selects(selector: &Value, labels: &serde_norway::Mapping) -> bool {
    let label = |key: &str| labels.get(key).and_then(Value::as_str);
    let by_labels = selector["matchLabels"]
        .as_mapping()
        .map(|m| m.iter().all(|(k, v)| label(k.as_str().unwrap_or_default()) == v.as_str()))
        .unwrap_or(true);
    let by_expressions = seq(&selector["matchExpressions"]).iter().all(|e| {
        let value = label(s(e, "key"));
        let values: Vec<&str> =
            e["values"].as_sequence().map(|v| v.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        match s(e, "operator") {
            "In" => value.is_some_and(|v| values.contains(&v)),
            "NotIn" => value.is_none_or(|v| !values.contains(&v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

/// Who may connect to `port` (its name, its number) of pods with `labels`: None when no Ingress policy selects
/// those pods (then anyone may, on every port), else the `from` peers of every rule of every selecting policy
/// that covers the port (a rule without `from` is the peer Null: anyone).
fn allowed_peers(docs: &[(String, Value)], labels: &serde_norway::Mapping, port: (&str, u64)) -> Option<Vec<Value>> {
    let policies: Vec<&Value> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| s(d, "kind") == "NetworkPolicy" && selects(&d["spec"]["podSelector"], labels))
        .filter(|d| seq(&d["spec"]["policyTypes"]).iter().any(|t| t.as_str() == Some("Ingress")))
        .collect();
    if policies.is_empty() {
        return None;
    }
    let covers = |rule: &Value| {
        let ports = seq(&rule["ports"]);
        ports.is_empty()
            || ports.iter().any(|p| p["port"].as_str() == Some(port.0) || p["port"].as_u64() == Some(port.1))
    };
    let mut peers = Vec::new();
    for rule in policies.iter().flat_map(|p| seq(&p["spec"]["ingress"])).filter(covers) {
        match rule["from"].as_sequence() {
            Some(from) if !from.is_empty() => peers.extend(from.iter().cloned()),
            _ => peers.push(Value::Null),
        }
    }
    Some(peers)
}

/// A peer that is exactly the namespace with this name (its automatic `kubernetes.io/metadata.name` label).
fn is_namespace(peer: &Value, name: &str) -> bool {
    peer["podSelector"].is_null()
        && peer["ipBlock"].is_null()
        && peer["namespaceSelector"]["matchLabels"]
            .as_mapping()
            .is_some_and(|m| m.len() == 1 && m.get("kubernetes.io/metadata.name").and_then(Value::as_str) == Some(name))
}

/// A peer that is the namespaces labelled as Breakwater producers.
fn is_producer_namespace(peer: &Value) -> bool {
    peer["podSelector"].is_null()
        && peer["ipBlock"].is_null()
        && peer["namespaceSelector"]["matchLabels"]
            .as_mapping()
            .is_some_and(|m| m.len() == 1 && m.get("breakwater.io/producer").and_then(Value::as_str) == Some("true"))
}

/// The workloads of this namespace a peer admits (None: the peer admits something outside them: another
/// namespace, an address block, anyone).
fn peer_workloads(peer: &Value, workloads: &[(String, Value)]) -> Option<BTreeSet<String>> {
    if peer.is_null() || !peer["namespaceSelector"].is_null() || !peer["ipBlock"].is_null() {
        return None;
    }
    Some(
        workloads
            .iter()
            .filter(|(_, w)| selects(&peer["podSelector"], &pod_labels(w)))
            .map(|(_, w)| s(&w["metadata"], "name").to_string())
            .collect(),
    )
}

/// NetworkPolicies (deploy/k8s/network-policies.yaml): every pod is covered by an Ingress policy; admin ports
/// (and NATS monitoring) only from the namespace `monitoring` (the coordinator's also from the console's pods);
/// NATS clients only from Breakwater's service pods (every one of them) and producer namespaces, routes only
/// between NATS pods; Redis only from its users; ingest's HTTP port from namespaces only (the ingress
/// controller's, producers'), the console's from the ingress controller's only, never from anyone.
fn check_network_policies(docs: &[(String, Value)], workloads: &[(String, Value)]) -> Vec<String> {
    let mut problems = Vec::new();
    let describe = |peers: &[Value]| serde_json::to_string(&peers).unwrap_or_default();
    let services: BTreeSet<String> = SERVICES.iter().map(|(n, _)| n.to_string()).collect();
    let workload = |name: &str| workloads.iter().find(|(_, w)| s(&w["metadata"], "name") == name).map(|(_, w)| w);
    for (_, w) in workloads {
        let name = s(&w["metadata"], "name");
        if allowed_peers(docs, &pod_labels(w), ("", 0)).is_none() {
            problems.push(format!("NetworkPolicy: no Ingress policy selects the pods of {name}: anyone may connect"));
        }
    }
    // Only from the namespace `monitoring`, and from there at least (Prometheus scrapes).
    let monitoring_only = |what: &str, labels: &serde_norway::Mapping, port: (&str, u64)| -> Option<String> {
        let peers = allowed_peers(docs, labels, port)?;
        (peers.is_empty() || !peers.iter().all(|p| is_namespace(p, "monitoring"))).then(|| {
            format!("NetworkPolicy: {what} must be reachable from the namespace monitoring only: {}", describe(&peers))
        })
    };
    for (name, port) in SERVICES.iter().filter(|(n, _)| *n != "bw-breaker-coordinator") {
        if let Some(w) = workload(name) {
            problems.extend(monitoring_only(&format!("{name} port admin"), &pod_labels(w), ("admin", *port)));
        }
    }
    // The coordinator's admin API: from the namespace monitoring, and from the console's pods (breaker actions,
    // with the operator token), nothing else.
    if let Some(w) = workload("bw-breaker-coordinator") {
        let peers = allowed_peers(docs, &pod_labels(w), ("admin", 9103)).unwrap_or_default();
        let console = BTreeSet::from(["bw-console".to_string()]);
        let from_console = |p: &Value| peer_workloads(p, workloads).is_some_and(|n| n == console);
        let ok = peers.iter().all(|p| is_namespace(p, "monitoring") || from_console(p))
            && peers.iter().any(|p| is_namespace(p, "monitoring"))
            && peers.iter().any(from_console);
        if !ok {
            problems.push(format!(
                "NetworkPolicy: bw-breaker-coordinator port admin must be reachable from the namespace monitoring \
                 and the console's pods only: {}",
                describe(&peers)
            ));
        }
    }
    if let Some(nats) = workload("nats") {
        let labels = pod_labels(nats);
        problems.extend(monitoring_only("nats port monitor", &labels, ("monitor", 8222)));
        let peers = allowed_peers(docs, &labels, ("client", 4222)).unwrap_or_default();
        let mut reached = BTreeSet::new();
        for peer in &peers {
            match peer_workloads(peer, workloads) {
                Some(names) if names.is_subset(&services) => reached.extend(names),
                _ if is_producer_namespace(peer) => {}
                _ => problems
                    .push(format!("NetworkPolicy: nats port client admits {}", describe(std::slice::from_ref(peer)))),
            }
        }
        if reached != services {
            problems.push(format!("NetworkPolicy: nats port client must admit every service pod, admits {reached:?}"));
        }
        let routes = allowed_peers(docs, &labels, ("cluster", 6222)).unwrap_or_default();
        let only_nats = routes
            .iter()
            .all(|p| peer_workloads(p, workloads).is_some_and(|n| n == BTreeSet::from(["nats".to_string()])));
        if routes.is_empty() || !only_nats {
            problems
                .push(format!("NetworkPolicy: nats port cluster must admit the NATS pods only: {}", describe(&routes)));
        }
    }
    if let Some(redis) = workload("redis") {
        let peers = allowed_peers(docs, &pod_labels(redis), ("redis", 6379)).unwrap_or_default();
        let mut reached = BTreeSet::new();
        for peer in &peers {
            match peer_workloads(peer, workloads) {
                Some(names) => reached.extend(names),
                None => problems.push(format!("NetworkPolicy: redis admits {}", describe(std::slice::from_ref(peer)))),
            }
        }
        let users: BTreeSet<String> = REDIS_USERS.iter().map(|n| n.to_string()).collect();
        if reached != users {
            problems.push(format!("NetworkPolicy: redis must admit exactly {users:?}, admits {reached:?}"));
        }
    }
    // The console's pages: from the ingress controller's namespace (an authenticating proxy), never from anyone.
    if let Some(console) = workload("bw-console") {
        let peers = allowed_peers(docs, &pod_labels(console), ("http", 9180)).unwrap_or_default();
        if peers.is_empty() || !peers.iter().all(|p| is_namespace(p, "ingress-nginx")) {
            problems.push(format!(
                "NetworkPolicy: bw-console port http must admit the ingress controller's namespace only: {}",
                describe(&peers)
            ));
        }
    }
    if let Some(ingest) = workload("bw-ingest") {
        let peers = allowed_peers(docs, &pod_labels(ingest), ("http", 8080)).unwrap_or_default();
        let namespaces_only = peers.iter().all(|p| !p["namespaceSelector"].is_null() && p["podSelector"].is_null());
        if peers.is_empty() || !namespaces_only {
            problems.push(format!(
                "NetworkPolicy: bw-ingest port http must admit chosen namespaces (ingress controller, producers): {}",
                describe(&peers)
            ));
        }
    }
    problems
}

/// The value and secret key of a container's env entry `name`, and its position.
fn env_at(container: &Value, name: &str) -> Option<(usize, Value)> {
    seq(&container["env"]).into_iter().enumerate().find(|(_, e)| s(e, "name") == name)
}

/// Whether env entry `name` comes from the required (not optional) key `key` of bw-secrets.
fn from_secret(container: &Value, name: &str, key: &str) -> bool {
    env_at(container, name).is_some_and(|(_, e)| {
        let reference = &e["valueFrom"]["secretKeyRef"];
        s(reference, "name") == "bw-secrets"
            && s(reference, "key") == key
            && reference["optional"].as_bool() != Some(true)
    })
}

/// Redis AUTH: the Redis StatefulSet requires the password of the bw-secrets key redis-password (and its probes
/// send it); every Redis user gets that key as BW_<SERVICE>__REDIS__PASSWORD.
fn check_k8s_redis_auth(workloads: &[(String, Value)]) -> Vec<String> {
    let mut problems = Vec::new();
    let container = |name: &str| {
        workloads
            .iter()
            .find(|(_, w)| s(&w["metadata"], "name") == name)
            .map(|(_, w)| w["spec"]["template"]["spec"]["containers"][0].clone())
    };
    match container("redis") {
        Some(redis) => {
            let script = seq(&redis["args"]).iter().map(|a| s_of(a).to_string()).collect::<Vec<_>>().join(" ");
            if !(script.contains("requirepass") && script.contains("$REDIS_PASSWORD")) {
                problems.push("StatefulSet redis: must require the password of $REDIS_PASSWORD (requirepass)".into());
            }
            for var in ["REDIS_PASSWORD", "REDISCLI_AUTH"] {
                if !from_secret(&redis, var, "redis-password") {
                    problems.push(format!("StatefulSet redis: {var} must come from the secret key redis-password"));
                }
            }
        }
        None => problems.push("no StatefulSet redis".into()),
    }
    for name in REDIS_USERS {
        let var = format!("{}__REDIS__PASSWORD", env_prefix(name));
        if !container(name).is_some_and(|c| from_secret(&c, &var, "redis-password")) {
            problems.push(format!("{name}: {var} must come from the secret key redis-password"));
        }
    }
    problems
}

/// The text of the first `name { ... }` block of a NATS config at nesting depth `depth` (0: top level).
fn conf_block(text: &str, name: &str, depth: usize) -> Option<String> {
    let mut level = 0isize;
    let mut inside: Option<(isize, String)> = None;
    for code in conf_lines(text) {
        let opens = code.matches('{').count() as isize;
        let closes = code.matches('}').count() as isize;
        if let Some((start, block)) = inside.as_mut() {
            level += opens - closes;
            if level <= *start {
                return Some(std::mem::take(block));
            }
            block.push_str(code);
            block.push('\n');
            continue;
        }
        let opens_block = code.strip_suffix('{').map(|head| head.trim().trim_end_matches(':').trim() == name);
        if level == depth as isize && opens_block == Some(true) {
            inside = Some((level, String::new()));
        }
        level += opens - closes;
    }
    None
}

/// NATS TLS and route authorization on Kubernetes: nats.conf requires TLS of clients and routes with the
/// certificate of the Secret bw-nats-tls (mounted at /etc/nats-tls), accepts routes only from the user `route`
/// with the password of the secret key nats-route-password, whose route URLs Kubernetes builds in the pod's
/// environment; every service trusts ca.crt (mounted alone at /etc/bw-nats-tls, named by nats.tls_ca_file).
fn check_k8s_nats_tls(docs: &[(String, Value)], workloads: &[(String, Value)]) -> Vec<String> {
    let mut problems = Vec::new();
    let conf = docs
        .iter()
        .find(|(_, d)| s(d, "kind") == "ConfigMap" && s(&d["metadata"], "name") == "nats-config")
        .map(|(_, d)| s(&d["data"], "nats.conf").to_string())
        .unwrap_or_default();
    let tls_files = |block: &str| {
        ["cert_file: /etc/nats-tls/tls.crt", "key_file: /etc/nats-tls/tls.key", "ca_file: /etc/nats-tls/ca.crt"]
            .iter()
            .all(|l| block.lines().any(|b| b == *l))
    };
    if !conf_block(&conf, "tls", 0).is_some_and(|b| tls_files(&b)) {
        problems
            .push("nats.yaml nats.conf: clients need TLS (a top-level tls block with the bw-nats-tls files)".into());
    }
    let cluster = conf_block(&conf, "cluster", 0).unwrap_or_default();
    if !conf_block(&cluster, "tls", 0).is_some_and(|b| tls_files(&b)) {
        problems.push("nats.yaml nats.conf: routes need TLS (cluster.tls with the bw-nats-tls files)".into());
    }
    let authorization = conf_block(&cluster, "authorization", 0).unwrap_or_default();
    if !(authorization.lines().any(|l| l == "user: route")
        && authorization.lines().any(|l| l == "password: $BW_NATS_ROUTE_PASSWORD"))
    {
        problems.push(
            "nats.yaml nats.conf: routes need cluster.authorization (user route, $BW_NATS_ROUTE_PASSWORD)".into(),
        );
    }
    let Some((_, nats)) =
        workloads.iter().find(|(_, w)| s(w, "kind") == "StatefulSet" && s(&w["metadata"], "name") == "nats")
    else {
        return problems;
    };
    let pod = &nats["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let mounted = |pod: &Value, container: &Value, path: &str, item: Option<&str>| {
        seq(&container["volumeMounts"]).iter().any(|m| {
            s(m, "mountPath") == path
                && seq(&pod["volumes"]).iter().any(|v| {
                    s(v, "name") == s(m, "name")
                        && s(&v["secret"], "secretName") == "bw-nats-tls"
                        && item.is_none_or(|key| {
                            let items = seq(&v["secret"]["items"]);
                            items.len() == 1 && s(&items[0], "key") == key
                        })
                })
        })
    };
    if !mounted(pod, container, "/etc/nats-tls", None) {
        problems.push("StatefulSet nats: the Secret bw-nats-tls must be mounted at /etc/nats-tls".into());
    }
    let password_at = env_at(container, "BW_NATS_ROUTE_PASSWORD").map(|(i, _)| i);
    if !from_secret(container, "BW_NATS_ROUTE_PASSWORD", "nats-route-password") {
        problems
            .push("StatefulSet nats: BW_NATS_ROUTE_PASSWORD must come from the secret key nats-route-password".into());
    }
    for n in 0..3 {
        let var = format!("BW_NATS_ROUTE_{n}");
        let expected = format!("nats://route:$(BW_NATS_ROUTE_PASSWORD)@nats-{n}.nats.breakwater.svc:6222");
        let ok = env_at(container, &var)
            .is_some_and(|(i, e)| s(&e, "value") == expected && password_at.is_some_and(|p| p < i));
        let listed = cluster.lines().any(|l| l == format!("${var}"));
        if !ok || !listed {
            problems.push(format!("StatefulSet nats: route {n} must be ${var} = {expected}, after the password"));
        }
    }
    let bw_config = docs
        .iter()
        .find(|(_, d)| s(d, "kind") == "ConfigMap" && s(&d["metadata"], "name") == "bw-config")
        .map(|(_, d)| d.clone())
        .unwrap_or_default();
    for (deployment, _) in SERVICES {
        let service = deployment.trim_start_matches("bw-");
        let toml = s(&bw_config["data"], &format!("{service}.toml"));
        if !toml.lines().any(|l| l.trim() == "tls_ca_file = \"/etc/bw-nats-tls/ca.crt\"") {
            problems.push(format!("bw-config {service}.toml: [nats] tls_ca_file must be \"/etc/bw-nats-tls/ca.crt\""));
        }
        let Some((_, w)) = workloads.iter().find(|(_, w)| s(&w["metadata"], "name") == deployment) else { continue };
        let pod = &w["spec"]["template"]["spec"];
        if !mounted(pod, &pod["containers"][0], "/etc/bw-nats-tls", Some("ca.crt")) {
            problems.push(format!("{deployment}: only ca.crt of the Secret bw-nats-tls, mounted at /etc/bw-nats-tls"));
        }
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
    problems.extend(check_compose_auth(services, nats_conf));
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

/// Redis AUTH and NATS route authorization in compose: redis-server requires a local-only password that every
/// Redis user sends; the NATS nodes accept routes only from the user `route` with the password of their
/// environment, and their route URLs carry it.
fn check_compose_auth(services: &serde_norway::Mapping, nats_conf: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let env = |svc: &Value, key: &str| s(&svc["environment"], key).to_string();
    let redis_password = services
        .values()
        .find(|svc| s(svc, "image").starts_with("redis:"))
        .and_then(|svc| {
            let command: Vec<String> = seq(&svc["command"]).iter().map(|c| s_of(c).to_string()).collect();
            command.windows(2).find(|w| w[0] == "--requirepass").map(|w| w[1].clone())
        })
        .filter(|p| p.starts_with("local-"));
    match &redis_password {
        None => problems.push("compose redis: must run with --requirepass <a local-only password>".into()),
        Some(password) => {
            for name in REDIS_USERS {
                let svc = services.values().find(|svc| seq(&svc["command"]).first().map(s_of) == Some(name));
                let var = format!("{}__REDIS__PASSWORD", env_prefix(name));
                if svc.map(|svc| env(svc, &var)).as_deref() != Some(password.as_str()) {
                    problems.push(format!("compose {name}: {var} must be redis-server's password"));
                }
            }
        }
    }
    let cluster = conf_block(nats_conf, "cluster", 0).unwrap_or_default();
    let authorization = conf_block(&cluster, "authorization", 0).unwrap_or_default();
    let routes_listed = (1..=3).all(|n| cluster.lines().any(|l| l == format!("$BW_NATS_ROUTE_{n}")));
    if !(authorization.lines().any(|l| l == "user: route")
        && authorization.lines().any(|l| l == "password: $BW_NATS_ROUTE_PASSWORD")
        && routes_listed)
    {
        problems.push(
            "compose.nats.conf: the cluster needs authorization (user route, $BW_NATS_ROUTE_PASSWORD) and the routes \
             $BW_NATS_ROUTE_1..3"
                .into(),
        );
    }
    for (name, svc) in services.iter().filter(|(_, svc)| s(svc, "image").starts_with("nats:")) {
        let name = name.as_str().unwrap_or_default();
        let password = env(svc, "BW_NATS_ROUTE_PASSWORD");
        let routes_carry_it = (1..=3).all(|n| {
            let url = env(svc, &format!("BW_NATS_ROUTE_{n}"));
            url.ends_with(&format!("@nats-{n}:6222")) && url_credentials(&url) == Some(&format!("route:{password}"))
        });
        if !password.starts_with("local-") || !routes_carry_it {
            problems.push(format!(
                "compose {name}: BW_NATS_ROUTE_PASSWORD must be a local-only placeholder that BW_NATS_ROUTE_1..3 carry"
            ));
        }
        let command: Vec<String> = seq(&svc["command"]).iter().map(|c| s_of(c).to_string()).collect();
        if command.iter().any(|c| c.starts_with("--cluster") || c == "--routes") {
            problems.push(format!("compose {name}: cluster flags on the command line drop the route authorization"));
        }
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
/// Producers' users are generated per tenant (`bwctl senders nats-accounts`); the committed file has none.
const NATS_USERS: [&str; 7] =
    ["ingest", "dispatcher", "replay", "breaker-coordinator", "alerting", "console", "operator"];

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

/// The environment of the compose file's first NATS node (the users' and the route's passwords, the route URLs),
/// as nats-server needs it to parse compose.nats.conf.
fn compose_nats_env() -> Vec<(String, String)> {
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

/// A secret value per key, as a Secret would hold them (distinct, URL-safe).
fn k8s_secret(key: &str) -> String {
    format!("k8s-{}", hex::encode(key.as_bytes()))
}

/// The ConfigMap or workload named `name` of the Kubernetes manifests (not the Service or the
/// PodDisruptionBudget of that name).
fn k8s_doc(docs: &[(String, Value)], name: &str) -> Value {
    docs.iter()
        .find(|(_, d)| {
            s(&d["metadata"], "name") == name && ["ConfigMap", "Deployment", "StatefulSet"].contains(&s(d, "kind"))
        })
        .map(|(_, d)| d.clone())
        .expect(name)
}

/// The environment of a workload's first container as Kubernetes builds it: each secret key's value from
/// `secret`, `$(NAME)` expanded from the entries before.
fn k8s_env(workload: &Value, secret: impl Fn(&str) -> String) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in seq(&workload["spec"]["template"]["spec"]["containers"][0]["env"]) {
        let value = match e["value"].as_str() {
            Some(v) => expand_k8s_env(v, &env),
            None if !e["valueFrom"]["secretKeyRef"].is_null() => secret(s(&e["valueFrom"]["secretKeyRef"], "key")),
            None => continue,
        };
        env.insert(s(&e, "name").to_string(), value);
    }
    env
}

/// A NATS config text made runnable on this machine: no store directory, size or pid file of the pod (the
/// testkit's `-sd` applies), the TLS files at `tls` instead of /etc/nats-tls, and the cluster block dropped
/// (`cluster_port` None: one node, whose peers do not exist here and whose JetStream would wait for a quorum)
/// or listening on `cluster_port`.
fn local_nats_conf(conf: &str, tls: Option<&Path>, cluster_port: Option<u16>) -> String {
    let mut local = String::new();
    let mut depth = 0isize;
    let mut in_cluster = false;
    for (line, code) in conf.lines().zip(conf_lines(conf)) {
        let before = depth;
        depth += code.matches('{').count() as isize - code.matches('}').count() as isize;
        if before == 0 && code.starts_with("cluster") && code.ends_with('{') {
            in_cluster = true;
        }
        if in_cluster {
            in_cluster = depth > 0;
            let Some(port) = cluster_port else { continue };
            if before == 1 && code.starts_with("port:") {
                local.push_str(&format!("  port: {port}\n"));
                continue;
            }
        }
        if ["store_dir", "max_file_store", "pid_file"].iter().any(|key| code.starts_with(key)) {
            continue;
        }
        match tls {
            Some(dir) => local.push_str(&line.replace("/etc/nats-tls/", &format!("{}/", dir.display()))),
            None => local.push_str(line),
        }
        local.push('\n');
    }
    local
}

/// Throwaway TLS material as the Secret bw-nats-tls holds it (tls.crt, tls.key, ca.crt), written into `dir`: a
/// CA and one certificate for the cluster's names, `localhost` and 127.0.0.1, for server and client use (routes
/// present it both ways). Made per test; no key is ever committed.
fn throwaway_tls(dir: &Path) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        SanType,
    };
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "breakwater test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("key");
    let names = ["*.nats.breakwater.svc", "*.nats.breakwater.svc.cluster.local", "localhost"];
    let mut params = CertificateParams::new(names.map(String::from).to_vec()).expect("params");
    params.subject_alt_names.push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    params.distinguished_name.push(DnType::CommonName, "nats");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).expect("certificate");
    std::fs::write(dir.join("tls.crt"), cert.pem()).expect("write");
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).expect("write");
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).expect("write");
}

/// A real nats-server accepts both NATS configs (`-t`: parse, load the TLS files, exit): the pod's (TLS files
/// from throwaway certificates where the Secret would be, its environment as Kubernetes builds it) and
/// compose's.
#[test]
fn nats_server_accepts_the_nats_configs() {
    let bin = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".into());
    let dir = tempfile::tempdir().expect("tempdir");
    throwaway_tls(dir.path());
    let docs = k8s_documents();
    let conf = s(&k8s_doc(&docs, "nats-config")["data"], "nats.conf").to_string();
    assert!(conf.contains("/etc/nats-tls/"), "the pod's config uses the Secret's TLS files");
    let k8s_path = dir.path().join("k8s-nats.conf");
    std::fs::write(&k8s_path, conf.replace("/etc/nats-tls/", &format!("{}/", dir.path().display()))).expect("write");
    // As the projected volume puts them: accounts.conf beside nats.conf.
    std::fs::copy(deploy_dir().join("nats/accounts.conf"), dir.path().join("accounts.conf")).expect("copy");
    let mut k8s_env = k8s_env(&k8s_doc(&docs, "nats"), k8s_secret);
    k8s_env.insert("POD_NAME".into(), "nats-0".into());
    for (path, env) in
        [(k8s_path, k8s_env.into_iter().collect()), (deploy_dir().join("compose.nats.conf"), compose_nats_env())]
    {
        let out = std::process::Command::new(&bin)
            .arg("-t")
            .arg("-c")
            .arg(&path)
            .envs(env)
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
    let passwords = compose_nats_env();
    let envs: Vec<(&str, &str)> = passwords.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // The files as compose mounts them, for one local node: no cluster block and no /data store (the testkit's
    // `-sd` applies); the monitoring port of the file (8222) may be taken on this machine, so the command line's
    // wins.
    let dir = tempfile::tempdir().expect("tempdir");
    let text = read(&deploy_dir().join("compose.nats.conf"));
    assert!(text.contains("store_dir: /data"), "compose.nats.conf keeps its store in /data");
    std::fs::write(dir.path().join("compose.nats.conf"), local_nats_conf(&text, None, None)).expect("write");
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
        users.push((bin.clone(), nats_config(&local(&url), &bin, &inbox, "")));
    }
    let bwctl = s(&services["dispatcher"]["environment"], "BW_NATS_URL").to_string();
    users.push(("bwctl".into(), nats_config(&local(&bwctl), "bwctl", "", "")));
    assert_eq!(users.len(), SERVICES.len() + 1, "{users:?}");
    let wrong = format!("nats://replay:not-the-password@127.0.0.1:{}", server.port());
    connect_as_each(&users, &[("a wrong password", nats_config(&wrong, "wrong", "", ""))]).await;
}

/// A client's NATS config: `url`, the inbox prefix and the CA file it names.
fn nats_config(url: &str, who: &str, inbox: &str, tls_ca_file: &str) -> bw_common::config::NatsConfig {
    bw_common::config::NatsConfig {
        inbox_prefix: inbox.to_string(),
        tls_ca_file: tls_ca_file.to_string(),
        ..bw_common::config::NatsConfig::single(url, format!("deploy-{who}"))
    }
}

/// Each `(who, config)` of `users` connects and reaches JetStream; each of `refused` is refused.
async fn connect_as_each(
    users: &[(String, bw_common::config::NatsConfig)],
    refused: &[(&str, bw_common::config::NatsConfig)],
) {
    for (who, cfg) in users {
        let client = bw_common::nats::connect(cfg, who, std::time::Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("{who} cannot connect with its credentials: {e}"));
        let js = async_nats::jetstream::new(client);
        js.query_account().await.unwrap_or_else(|e| panic!("{who}: JetStream refused: {e}"));
    }
    for (what, cfg) in refused {
        let attempt = bw_common::nats::connect(cfg, "refused", std::time::Duration::from_millis(500)).await;
        assert!(attempt.is_err(), "{what} is refused");
    }
}

/// Kubernetes expands `$(NAME)` in an env value from the entries before it.
fn expand_k8s_env(value: &str, env: &BTreeMap<String, String>) -> String {
    env.iter().fold(value.to_string(), |v, (name, val)| v.replace(&format!("$({name})"), val))
}

/// The k8s NATS users work on a real nats-server started with the k8s nats.conf (TLS required, with throwaway
/// certificates where the Secret bw-nats-tls would be) and the accounts.conf of the `nats-accounts` ConfigMap
/// beside it, the passwords in its environment as the Secret puts them: every Deployment's URL (its
/// `$(NATS_PASSWORD)` expanded from its own secret key), inbox prefix and CA file of bw-config connect over TLS
/// and reach JetStream as their user. Without the CA (the system's roots) and with a wrong password a client is
/// refused.
#[tokio::test]
async fn the_kubernetes_nats_users_connect_to_a_server_with_the_kubernetes_config() {
    let docs = k8s_documents();
    let conf = s(&k8s_doc(&docs, "nats-config")["data"], "nats.conf").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    throwaway_tls(dir.path());
    let local = local_nats_conf(&conf, Some(dir.path()), None);
    assert!(conf.contains("cluster {") && !local.contains("routes"), "the cluster block is removed");
    assert!(local.contains(&format!("{}/tls.crt", dir.path().display())), "the client TLS block stays");
    std::fs::write(dir.path().join("nats.conf"), local).expect("write");
    let accounts = s(&k8s_doc(&docs, "nats-accounts")["data"], "accounts.conf").to_string();
    std::fs::write(dir.path().join("accounts.conf"), accounts).expect("write");
    let mut envs: Vec<(String, String)> = vec![("POD_NAME".into(), "nats-0".into())];
    envs.extend(NATS_USERS.iter().map(|u| (nats_password_var(u), k8s_secret(&format!("nats-{u}-password")))));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let args = vec![
        "-c".into(),
        dir.path().join("nats.conf").display().to_string(),
        "-m".into(),
        bw_testkit::free_port().to_string(),
    ];
    let server = bw_testkit::NatsServer::start_with_args_and_env(args, &envs);
    let bw_config = k8s_doc(&docs, "bw-config");
    let ca = dir.path().join("ca.crt").display().to_string();
    let mut users = Vec::new();
    for (deployment, _) in SERVICES {
        let service = deployment.trim_start_matches("bw-");
        let env = k8s_env(&k8s_doc(&docs, deployment), k8s_secret);
        let url = env.get(&format!("{}__NATS__URL", env_prefix(deployment))).cloned().unwrap_or_default();
        let setting = |key: &str| {
            s(&bw_config["data"], &format!("{service}.toml"))
                .lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{key} = ")).map(|v| v.trim_matches('"').to_string()))
                .unwrap_or_default()
        };
        // The pod's CA file, where this test wrote the CA.
        assert_eq!(setting("tls_ca_file"), "/etc/bw-nats-tls/ca.crt", "{service}");
        let local = format!("nats://{}@127.0.0.1:{}", url_credentials(&url).unwrap_or(""), server.port());
        users.push((deployment.to_string(), nats_config(&local, deployment, &setting("inbox_prefix"), &ca)));
    }
    let (_, ingest) = &users[0];
    let refused = [
        ("a client that does not trust the CA", nats_config(&ingest.url, "no-ca", &ingest.inbox_prefix, "")),
        (
            "a wrong password",
            nats_config(&format!("nats://replay:not-the-password@127.0.0.1:{}", server.port()), "wrong", "", &ca),
        ),
    ];
    connect_as_each(&users, &refused).await;
}

/// The server names a node has routes to (GET /routez on its monitoring port).
async fn route_names(monitor: u16) -> BTreeSet<String> {
    bw_common::crypto::install_crypto();
    let Ok(response) = reqwest::get(format!("http://127.0.0.1:{monitor}/routez")).await else { return BTreeSet::new() };
    let json: serde_json::Value = response.json().await.unwrap_or_default();
    json["routes"]
        .as_array()
        .map(|r| r.iter().filter_map(|r| r["remote_name"].as_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// Starts NATS cluster nodes of one config on this machine and checks the route authorization: `nodes` nodes with
/// the right route password form routes, and one more with `wrong` in its environment is refused by them.
/// `node_env(i, route_password, cluster_ports)` is node i's environment; `node_args(i, cluster_port)` writes its
/// config and returns its command line (`-c` and the file, what else the deployment passes).
async fn routes_need_the_route_password(
    nodes: usize,
    node_env: impl Fn(usize, Option<&str>, &[u16]) -> Vec<(String, String)>,
    node_args: impl Fn(usize, u16) -> Vec<String>,
) {
    let cluster_ports: Vec<u16> = (0..=nodes).map(|_| bw_testkit::free_port()).collect();
    let monitors: Vec<u16> = (0..=nodes).map(|_| bw_testkit::free_port()).collect();
    let start = |i: usize, password: Option<&str>| {
        let env = node_env(i, password, &cluster_ports);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut args = node_args(i, cluster_ports[i]);
        args.extend(["-m".into(), monitors[i].to_string()]);
        bw_testkit::NatsServer::start_with_args_and_env(args, &env)
    };
    let members: Vec<_> = (0..nodes).map(|i| start(i, None)).collect();
    let formed = bw_testkit::wait_until(std::time::Duration::from_secs(20), || async {
        route_names(monitors[0]).await.len() == nodes - 1
    });
    assert!(formed.await, "the nodes did not route to each other: {:?}", route_names(monitors[0]).await);
    let intruder = start(nodes, Some("not-the-route-password"));
    let log =
        |server: &bw_testkit::NatsServer| std::fs::read_to_string(server.dir().join("nats.log")).unwrap_or_default();
    let refused = bw_testkit::wait_until(std::time::Duration::from_secs(20), || {
        let text = log(&members[0]);
        async move { text.contains("Authentication Failure") }
    });
    assert!(refused.await, "node 0 never refused the intruder's route: {}", log(&members[0]));
    let names = route_names(monitors[0]).await;
    assert_eq!(names.len(), nodes - 1, "only the members route to node 0: {names:?}");
    drop(intruder);
}

/// The Kubernetes NATS cluster's routes on real nodes started with the pod's config (routes over mutual TLS
/// with throwaway certificates, the route URLs of the pod's environment pointed at this machine): they form
/// with the Secret's route password, and a node with another one is refused.
#[tokio::test]
async fn the_kubernetes_nats_routes_need_the_route_password() {
    let docs = k8s_documents();
    let conf = s(&k8s_doc(&docs, "nats-config")["data"], "nats.conf").to_string();
    let statefulset = k8s_doc(&docs, "nats");
    let dir = tempfile::tempdir().expect("tempdir");
    throwaway_tls(dir.path());
    std::fs::write(dir.path().join("accounts.conf"), s(&k8s_doc(&docs, "nats-accounts")["data"], "accounts.conf"))
        .expect("write");
    let node_env = |i: usize, password: Option<&str>, ports: &[u16]| {
        let secret = |key: &str| match (key, password) {
            ("nats-route-password", Some(p)) => p.to_string(),
            _ => k8s_secret(key),
        };
        let mut env = k8s_env(&statefulset, secret);
        for (n, port) in ports.iter().enumerate().take(3) {
            let route = env.get(&format!("BW_NATS_ROUTE_{n}")).cloned().unwrap_or_default();
            let local = route.replace(&format!("nats-{n}.nats.breakwater.svc:6222"), &format!("127.0.0.1:{port}"));
            assert_ne!(route, local, "route {n} names nats-{n}");
            env.insert(format!("BW_NATS_ROUTE_{n}"), local);
        }
        env.insert("POD_NAME".into(), format!("nats-{i}"));
        env.into_iter().collect()
    };
    // As the pod runs it: `-c` its config (the node's name comes from $POD_NAME).
    let node_args = |i: usize, port: u16| {
        let path = dir.path().join(format!("nats-{i}.conf"));
        std::fs::write(&path, local_nats_conf(&conf, Some(dir.path()), Some(port))).expect("write");
        let args: Vec<String> = seq(&statefulset["spec"]["template"]["spec"]["containers"][0]["args"])
            .iter()
            .map(|a| s_of(a).to_string())
            .collect();
        assert_eq!(args, ["-c", "/etc/nats/nats.conf"], "the pod runs its config alone");
        vec!["-c".into(), path.display().to_string()]
    };
    routes_need_the_route_password(2, node_env, node_args).await;
}

/// The compose NATS cluster's routes on real nodes started with compose.nats.conf and the nodes' environment
/// (route URLs pointed at this machine): they form with the route password, and a node with another one is
/// refused.
#[tokio::test]
async fn the_compose_nats_routes_need_the_route_password() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("nats")).expect("mkdir");
    std::fs::copy(deploy_dir().join("nats/accounts.conf"), dir.path().join("nats/accounts.conf")).expect("copy");
    let text = read(&deploy_dir().join("compose.nats.conf"));
    let node_env = |_: usize, password: Option<&str>, ports: &[u16]| {
        let mut env: BTreeMap<String, String> = compose_nats_env().into_iter().collect();
        let right = env.get("BW_NATS_ROUTE_PASSWORD").cloned().unwrap_or_default();
        let password = password.unwrap_or(&right).to_string();
        for (n, port) in ports.iter().enumerate().take(3) {
            let var = format!("BW_NATS_ROUTE_{}", n + 1);
            let route = env.get(&var).cloned().unwrap_or_default();
            let local = route
                .replace(&format!("nats-{}:6222", n + 1), &format!("127.0.0.1:{port}"))
                .replace(&format!(":{right}@"), &format!(":{password}@"));
            assert_ne!(route, local, "{var} names nats-{}", n + 1);
            env.insert(var, local);
        }
        env.insert("BW_NATS_ROUTE_PASSWORD".into(), password);
        env.into_iter().collect()
    };
    // As compose runs node i + 1: its command line with this file.
    let (doc, _) = compose();
    let node_args = |i: usize, port: u16| {
        let path = dir.path().join(format!("nats-{i}.conf"));
        std::fs::write(&path, local_nats_conf(&text, None, Some(port))).expect("write");
        let command: Vec<String> = seq(&doc["services"][format!("nats-{}", i + 1).as_str()]["command"])
            .iter()
            .map(|a| s_of(a).to_string())
            .collect();
        assert_eq!(command[..2], ["-c", "/etc/nats/nats.conf"], "{command:?}");
        [vec!["-c".to_string(), path.display().to_string()], command[2..].to_vec()].concat()
    };
    routes_need_the_route_password(2, node_env, node_args).await;
}

/// The Redis StatefulSet's own start command, run with a real redis-server (its memory volume and data in a
/// temp dir, on a free loopback port): it requires the password of the Secret, which a Redis user sends, and
/// refuses a connection without it.
#[tokio::test]
async fn the_kubernetes_redis_requires_the_secret_password() {
    let docs = k8s_documents();
    let container = k8s_doc(&docs, "redis")["spec"]["template"]["spec"]["containers"][0].clone();
    let command: Vec<String> = seq(&container["command"]).iter().map(|c| s_of(c).to_string()).collect();
    assert_eq!(command, ["sh", "-c"], "the start command is a shell script");
    let script = s_of(&container["args"][0]).to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let port = bw_testkit::free_port();
    let tail = "--maxmemory-policy noeviction";
    assert!(script.contains("/run/redis/") && script.trim_end().ends_with(tail), "{script}");
    let local = script.replace("/run/redis/", &format!("{}/", dir.path().display())).trim_end().to_string()
        + &format!(" --port {port} --bind 127.0.0.1 --dir {} --appendonly no", dir.path().display());
    let env = k8s_env(&k8s_doc(&docs, "redis"), k8s_secret);
    let password = k8s_secret("redis-password");
    assert_eq!(env.get("REDIS_PASSWORD"), Some(&password));
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(&local)
        .envs(&env)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("sh runs");
    let url = format!("redis://127.0.0.1:{port}/");
    let with =
        bw_common::config::RedisConfig { password: password.clone(), ..bw_common::config::RedisConfig::single(&url) };
    let connected = bw_common::redis_conn::connect_config(&with, std::time::Duration::from_secs(20)).await;
    let without = bw_common::redis_conn::connect_config(
        &bw_common::config::RedisConfig::single(&url),
        std::time::Duration::from_secs(5),
    )
    .await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(connected.is_ok(), "the Secret's password: {:?}", connected.err());
    let error = without.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("requires a password"), "no password: {error}");
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
    let operator = Value::from("nats://operator:$(NATS_PASSWORD)@nats-0.nats.breakwater.svc:4222");
    for e in container_mut(&mut docs, "bw-console")["env"].as_sequence_mut().expect("env") {
        if s(e, "name") == "BW_CONSOLE__NATS__URL" {
            e["value"] = operator.clone();
        }
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
    // Hardening broken: no default deny and no NATS policy (the NATS pods then accept anyone), the admin ports
    // open to every namespace, Redis open to every pod, a Redis user without its password, the NATS route
    // password inline, the client TLS block gone.
    docs.retain(|(_, d)| !["bw-default-deny", "bw-nats"].contains(&s(&d["metadata"], "name")));
    for (_, d) in docs.iter_mut().filter(|(_, d)| s(d, "kind") == "NetworkPolicy") {
        match s(&d["metadata"], "name") {
            "bw-admin-from-monitoring" => {
                d["spec"]["ingress"][0]["from"][0] = serde_norway::from_str("namespaceSelector: {}").expect("yaml")
            }
            "bw-redis" => d["spec"]["ingress"][0]["from"][0] = serde_norway::from_str("podSelector: {}").expect("yaml"),
            "bw-console-http" => d["spec"]["ingress"][0]["from"] = Value::Null,
            "bw-coordinator-admin-from-console" => {
                d["spec"]["ingress"][0]["from"][0] = serde_norway::from_str("podSelector: {}").expect("yaml")
            }
            _ => {}
        }
    }
    container_mut(&mut docs, "bw-dispatcher")["env"]
        .as_sequence_mut()
        .expect("env")
        .retain(|e| s(e, "name") != "BW_DISPATCHER__REDIS__PASSWORD");
    for (_, d) in docs.iter_mut().filter(|(_, d)| s(d, "kind") == "StatefulSet" && s(&d["metadata"], "name") == "nats")
    {
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"].as_sequence_mut().expect("env") {
            if s(e, "name") == "BW_NATS_ROUTE_PASSWORD" {
                *e = serde_norway::from_str("{ name: BW_NATS_ROUTE_PASSWORD, value: hunter2 }").expect("yaml");
            }
        }
    }
    // The pod's own config with its client TLS block renamed: only that is reported.
    let mut broken = k8s_documents();
    for (_, d) in broken.iter_mut().filter(|(_, d)| s(&d["metadata"], "name") == "nats-config") {
        let conf = s(&d["data"], "nats.conf").replacen("\ntls {", "\ntls_off {", 1);
        assert!(conf.contains("tls_off {"), "the client TLS block is found");
        d["data"]["nats.conf"] = Value::from(conf);
    }
    let without_tls = check_k8s(&broken, &keys);
    assert_eq!(without_tls.len(), 1, "{without_tls:?}");
    assert!(without_tls[0].contains("nats.yaml nats.conf: clients need TLS"), "{without_tls:?}");
    let problems = check_k8s(&docs, &keys).join("\n");
    for expected in [
        "NetworkPolicy: no Ingress policy selects the pods of nats",
        "NetworkPolicy: bw-ingest port admin must be reachable from the namespace monitoring only",
        "NetworkPolicy: redis must admit exactly",
        "NetworkPolicy: bw-console port http must admit the ingress controller's namespace only",
        "NetworkPolicy: bw-breaker-coordinator port admin must be reachable from the namespace monitoring and",
        "bw-console: BW_CONSOLE__NATS__URL must connect as NATS user console",
        "bw-dispatcher: BW_DISPATCHER__REDIS__PASSWORD must come from the secret key redis-password",
        "StatefulSet nats: BW_NATS_ROUTE_PASSWORD must come from the secret key nats-route-password",
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
    doc["services"]["console"]["environment"]["BW_CONSOLE__NATS__URL"] =
        Value::from("nats://operator:local-nats-operator@nats-1:4222");
    doc["services"]["dispatcher"]["environment"]["BW_DISPATCHER__REDIS__PASSWORD"] = Value::from("local-other");
    doc["services"]["nats-2"]["environment"]["BW_NATS_ROUTE_2"] = Value::from("nats://nats-2:6222");
    let problems = check_compose(&doc, "port: 4222\n").join("\n");
    for expected in [
        "compose bw-dispatcher: BW_DISPATCHER__REDIS__PASSWORD must be redis-server's password",
        "compose nats-2: BW_NATS_ROUTE_PASSWORD must be a local-only placeholder that BW_NATS_ROUTE_1..3 carry",
        "compose.nats.conf: the cluster needs authorization",
        "compose replay: healthcheck must GET /readyz on its admin port 9104",
        "BW_OPERATOR_TOKEN must hash",
        "BW_INGEST__WEBHOOK__APP_SECRET is neither a local-only placeholder",
        "compose.nats.conf: no max_payload",
        "compose.nats.conf: must `include nats/accounts.conf`",
        "compose alerting: BW_ALERTING__NATS__URL must connect as NATS user alerting",
        "compose replay: BW_REPLAY__NATS__URL must connect as NATS user replay",
        "compose ingest: BW_INGEST__NATS__INBOX_PREFIX must be _INBOX_ingest",
        "compose console: BW_CONSOLE__NATS__URL must connect as NATS user console",
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

/// Loads a service config the way its binary does (compiled defaults → file → env, then validation); Ok with
/// its Redis settings when the service uses Redis.
fn load_service(
    service: &str,
    file: Option<&Path>,
    env: &BTreeMap<String, String>,
) -> Result<Option<bw_common::config::RedisConfig>, String> {
    use bw_common::service::{ServiceConfig, load_config};
    fn redis<C: ServiceConfig>(cfg: C) -> Option<bw_common::config::RedisConfig> {
        cfg.redis().cloned()
    }
    let env: std::collections::HashMap<String, String> = env.clone().into_iter().collect();
    let r = match service {
        "ingest" => load_config::<bw_ingest::Config>(service, bw_ingest::DEFAULT_CONFIG, file, &env).map(redis),
        "dispatcher" => {
            load_config::<bw_dispatcher::Config>(service, bw_dispatcher::DEFAULT_CONFIG, file, &env).map(redis)
        }
        "breaker-coordinator" => {
            load_config::<bw_breaker_coordinator::Config>(service, bw_breaker_coordinator::DEFAULT_CONFIG, file, &env)
                .map(redis)
        }
        "replay" => load_config::<bw_replay::Config>(service, bw_replay::DEFAULT_CONFIG, file, &env).map(redis),
        "alerting" => load_config::<bw_alerting::Config>(service, bw_alerting::DEFAULT_CONFIG, file, &env).map(redis),
        "console" => load_config::<bw_console::Config>(service, bw_console::DEFAULT_CONFIG, file, &env).map(redis),
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
        let redis = load_service(service, Some(&path), &env)
            .unwrap_or_else(|e| panic!("{deployment}: its ConfigMap config does not load: {e}"));
        // The services the Redis checks hold to (REDIS_USERS) are those whose config uses Redis, and each of
        // them gets its password from the Secret.
        assert_eq!(redis.is_some(), REDIS_USERS.contains(&deployment), "{deployment}: uses Redis");
        if let Some(redis) = redis {
            assert_eq!(redis.password, "0123456789abcdef0123456789abcdef", "{deployment}: redis.password");
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
