//! The producer examples run as their READMEs tell a user, as a registered tenant, against a real stack:
//! nats-server with the accounts config `bwctl senders nats-accounts` generates (every service and the tenant as
//! its own NATS user), redis-server, ingest at the compiled default tenancy (the sender registry, the example's
//! number registered to its tenant by the operator with `bwctl senders add`), a dispatcher at its compiled
//! defaults and the Meta simulator sending status webhooks.
//!
//! `examples/producer-ts` runs with `npm run --silent send -- ...` (nats.js + protobufjs under tsx), `examples/producer-py`
//! with `.venv/bin/python producer.py ...` (nats-py, protobuf encoded by hand), the Rust one with `cargo run -q -p
//! bw-client --example producer -- ...` (crates/bw-client/examples/producer.rs); each with only `NATS_URL`,
//! `BW_TENANT`, `NATS_PASSWORD` (and the README's `FOLLOW_SECONDS`) set: the tenant's user `producer-<tenant>`,
//! its inbox prefix and its feed consumer `feed-<tenant>` come from the tenant. Each must exit 0 after Meta
//! accepted the message exactly once, print the feed events of its operation in order up to a final one (sent,
//! then delivered or read) that match the status query's journey it prints last, never print the full
//! recipient number, and do nothing its tenant's NATS user is refused (the server logs no violation). Their dependencies come from
//! `BW_WITH_EXAMPLES=1 scripts/setup.sh` (scripts/test.sh passes it); when they are missing these tests fail
//! and say so, they never skip.

use crate::tenant_stack::{TenantStack, password};
use bw_e2e::WABA_ID;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

const RECIPIENT: &str = "+5491155550142";
const SETUP: &str = "run `BW_WITH_EXAMPLES=1 scripts/setup.sh` from the repository root (scripts/test.sh does)";

fn example_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("examples").join(name)
}

/// Whether `program args` runs and exits 0.
async fn runs(program: &Path, args: &[&str]) -> bool {
    tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// A stack the example can send through as `tenant`, owner of `phone`: ingest answers the tenant's status query
/// on the number before the example starts.
async fn stack(tenant: &'static str, phone: &'static str) -> TenantStack {
    let mut s = TenantStack::start(&[(tenant, phone, WABA_ID)], bw_meta_sim::SimConfig::default()).await;
    s.start_ingest(&[]).await;
    s.start_dispatcher().await;
    let producer = bw_client::Client::new(s.tenant(tenant).await);
    assert!(
        bw_testkit::wait_until(Duration::from_secs(20), || async {
            producer.status(phone, "readiness-probe").await.is_ok()
        })
        .await,
        "ingest never answered the status query"
    );
    s
}

/// The environment the READMEs set: where NATS is, and who the producer is.
fn tenant_env(cmd: &mut tokio::process::Command, s: &TenantStack, tenant: &str) {
    cmd.env("NATS_URL", s.nats.url())
        .env("BW_TENANT", tenant)
        .env("NATS_PASSWORD", password(&bw_wire::tenancy::nats_user(tenant)));
}

/// What an example printed, in one shape for both.
#[derive(Debug)]
struct Printed {
    accepted: bool,
    duplicate: bool,
    /// (kind, wamid) of each feed event, in the order printed; kinds as `sent`, `delivered`...
    events: Vec<(String, String)>,
    status_found: bool,
    current: String,
    journey: Vec<String>,
}

/// `OUTCOME_KIND_DELIVERED` (protobufjs' enum name) and `delivered` (the Python example's) both as `delivered`.
fn kind(name: &str) -> String {
    name.trim_start_matches("OUTCOME_KIND_").to_ascii_lowercase()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_else(|| panic!("no string {key} in {v}"))
}

/// Runs an example to its end (the guard only stops a hung child) and returns (status, stdout, stderr).
async fn run(mut cmd: tokio::process::Command) -> (std::process::ExitStatus, String, String) {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("the example hung for 3 minutes")
        .expect("the example starts");
    (out.status, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The checks both examples must pass, on what they printed and on what Meta (the simulator) saw.
async fn check(s: &TenantStack, tenant: &str, phone: &str, op: &str, printed: &Printed, output: &str) {
    assert!(printed.accepted && !printed.duplicate, "ingest accepted it once: {printed:?}\n{output}");
    // Inside Breakwater the operation is the tenant's: its key carries the tenant.
    let key = bw_wire::tenancy::operation_key(tenant, op);

    // Meta accepted exactly this message, exactly once, from the example's sender to its recipient.
    let oracle = s.sim.oracle();
    assert_eq!(oracle.total_accepted(), 1, "one acceptance at Meta in all: {:?}", oracle.messages);
    let seen = oracle.get(&key).expect("Meta accepted the example's operation");
    assert_eq!(seen.count, 1, "accepted exactly once");
    assert_eq!(seen.phone_number_id, phone);
    assert_eq!(seen.recipient_key, bw_common::mask::recipient_key(RECIPIENT), "sent to the example's recipient");

    // The feed events of the operation up to a final one: accepted first, sent (with Meta's wamid), then
    // delivered or read last (the example stopped on it, not on its FOLLOW_SECONDS).
    let kinds: Vec<&str> = printed.events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds.first().copied(), Some("accepted"), "events start at accepted: {kinds:?}\n{output}");
    let sent = kinds.iter().position(|k| *k == "sent").unwrap_or_else(|| panic!("no sent event: {kinds:?}\n{output}"));
    assert_eq!(printed.events[sent].1, seen.wamids[0], "the sent event carries Meta's wamid");
    let last = *kinds.last().expect("events");
    assert!(matches!(last, "delivered" | "read"), "the last event is final (delivered/read): {kinds:?}\n{output}");
    assert!(sent < kinds.len() - 1, "sent comes before the final event: {kinds:?}");
    assert_eq!(kinds.iter().filter(|k| matches!(**k, "delivered" | "read")).count(), 1, "one final event: {kinds:?}");

    // The status query it printed last: found, and its journey (every revision, oldest first) begins with
    // exactly the events the example followed.
    assert!(printed.status_found, "the status query found the operation\n{output}");
    assert!(
        printed.journey.len() >= kinds.len() && printed.journey[..kinds.len()] == kinds[..],
        "the journey {:?} begins with the events followed {kinds:?}",
        printed.journey
    );
    // The current state is read from the ledger, the journey from the feed, so either may be one revision ahead
    // of the other (a "read" webhook landing meanwhile); both are past the final event the example followed.
    assert!(matches!(printed.current.as_str(), "delivered" | "read"), "current state {:?}\n{output}", printed.current);

    // The ledger agrees, moved there by the simulator's status webhooks through ingest.
    let operator = s.operator().await;
    let ledger = bw_common::ledger::Ledger::new(&operator.buckets);
    let state = ledger.get(&key).await.expect("ledger read").expect("ledger entry").entry.state();
    assert!(
        matches!(state, bw_proto::v1::OperationState::Delivered | bw_proto::v1::OperationState::Read),
        "ledger at {state:?}"
    );

    // The recipient is personal data: no output of the example holds the full number, with or without '+'.
    assert!(!output.contains(RECIPIENT.trim_start_matches('+')), "the output holds the full recipient:\n{output}");

    // The example used only its tenant's rights: its own number, its inbox, its feed consumer, no stream info.
    assert_eq!(s.violations(), Vec::<String>::new(), "the example did what its tenant's user may not");
}

/// `examples/producer-ts`: `NATS_URL=... npm run --silent send -- <op> <waba> <phone> <+recipient> <text>` (without
/// `--silent` npm echoes the command line, recipient included, to stdout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_producer_example_sends_once_and_follows_its_message_to_a_final_event() {
    const TENANT: &str = "shop";
    const PHONE: &str = "106540352249101";
    const OP: &str = "example-ts-order-42";
    let dir = example_dir("producer-ts");
    for tool in ["node", "npm"] {
        assert!(runs(Path::new(tool), &["--version"]).await, "{tool} is not on PATH: {SETUP}");
    }
    assert!(
        dir.join("node_modules/.bin/tsx").exists() && dir.join("node_modules/nats").exists(),
        "examples/producer-ts has no node_modules: {SETUP}"
    );
    let s = stack(TENANT, PHONE).await;

    let mut cmd = tokio::process::Command::new("npm");
    cmd.args(["run", "--silent", "send", "--", OP, WABA_ID, PHONE, RECIPIENT, "Your order shipped"]).current_dir(&dir);
    tenant_env(&mut cmd, &s, TENANT);
    let (status, stdout, stderr) = run(cmd).await;
    let output = format!("{stdout}{stderr}");
    assert!(status.success(), "the example failed ({status}):\n{output}");

    // One JSON object per line: the IntakeReply, the events, the StatusReply.
    let lines: Vec<Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert!(lines.len() >= 3, "reply, events and status printed:\n{output}");
    let (reply, status_reply) = (&lines[0], &lines[lines.len() - 1]);
    let printed = Printed {
        accepted: reply["accepted"] == Value::Bool(true),
        duplicate: reply["duplicate"] == Value::Bool(true),
        events: lines[1..lines.len() - 1]
            .iter()
            .map(|e| (kind(str_of(e, "event")), str_of(e, "wamid").into()))
            .collect(),
        status_found: status_reply["found"] == Value::Bool(true),
        current: status_reply["current"].get("kind").and_then(Value::as_str).map(kind).unwrap_or_default(),
        journey: status_reply["journey"]
            .as_array()
            .unwrap_or_else(|| panic!("no journey in {status_reply}"))
            .iter()
            .map(|e| kind(str_of(e, "kind")))
            .collect(),
    };
    check(&s, TENANT, PHONE, OP, &printed, &output).await;
}

/// A line the Python example printed (`<tag> <dict repr>`) as JSON: its values are ints, bools, None and
/// strings without quotes or backslashes, so swapping the quotes and the three literals is exact.
fn python_line(output: &str, line: &str) -> Value {
    let (_, repr) = line.split_once(' ').unwrap_or_else(|| panic!("not `<tag> <dict>`: {line}"));
    assert!(!repr.contains('"') && !repr.contains('\\'), "unexpected characters in {line}");
    let json = repr.replace('\'', "\"").replace("True", "true").replace("False", "false").replace("None", "null");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e} in {line}\n{output}"))
}

/// `examples/producer-py`: `NATS_URL=... FOLLOW_SECONDS=60 .venv/bin/python producer.py <op> <waba> <phone>
/// <+recipient> <text>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_producer_example_sends_once_and_follows_its_message_to_a_final_event() {
    const TENANT: &str = "crm";
    const PHONE: &str = "106540352249102";
    const OP: &str = "example-py-order-42";
    let dir = example_dir("producer-py");
    let python = dir.join(".venv/bin/python");
    assert!(runs(&python, &["-c", "import nats"]).await, "examples/producer-py/.venv has no nats-py: {SETUP}");
    let s = stack(TENANT, PHONE).await;

    let mut cmd = tokio::process::Command::new(&python);
    cmd.args(["producer.py", OP, WABA_ID, PHONE, RECIPIENT, "Your order shipped"])
        .current_dir(&dir)
        .env("FOLLOW_SECONDS", "60");
    tenant_env(&mut cmd, &s, TENANT);
    let (status, stdout, stderr) = run(cmd).await;
    let output = format!("{stdout}{stderr}");
    assert!(status.success(), "the example failed ({status}):\n{output}");

    let tagged = |tag: &str| -> Vec<Value> {
        stdout.lines().filter(|l| l.starts_with(&format!("{tag} "))).map(|l| python_line(&output, l)).collect()
    };
    let (replies, events, statuses) = (tagged("reply"), tagged("event"), tagged("status"));
    assert!(replies.len() == 1 && statuses.len() == 1, "one reply and one status printed:\n{output}");
    let (reply, status_reply) = (&replies[0], &statuses[0]);
    let printed = Printed {
        accepted: reply["accepted"] == Value::Bool(true),
        duplicate: reply["duplicate"] == Value::Bool(true),
        events: events.iter().map(|e| (kind(str_of(e, "event")), str_of(e, "wamid").into())).collect(),
        status_found: status_reply["found"] == Value::Bool(true),
        current: status_reply["current"].get("event").and_then(Value::as_str).map(kind).unwrap_or_default(),
        journey: status_reply["journey"]
            .as_array()
            .unwrap_or_else(|| panic!("no journey in {status_reply}"))
            .iter()
            .map(|k| kind(k.as_str().unwrap_or_else(|| panic!("journey entry {k}"))))
            .collect(),
    };
    check(&s, TENANT, PHONE, OP, &printed, &output).await;
}

/// `key=value` pairs of a line the Rust example printed (`<tag> k=v k=v ...`), values without spaces.
fn rust_line(line: &str) -> std::collections::HashMap<String, String> {
    line.split_whitespace().skip(1).filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect()
}

/// `crates/bw-client/examples/producer.rs`: `NATS_URL=... BW_TENANT=... NATS_PASSWORD=... FOLLOW_SECONDS=60 cargo run -q
/// -p bw-client --example producer -- <op> <waba> <phone> <+recipient> <text>` from the repository root (the build
/// and the run as two steps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_producer_example_sends_once_and_follows_its_message_to_a_final_event() {
    const TENANT: &str = "billing";
    const PHONE: &str = "106540352249103";
    const OP: &str = "example-rs-order-42";
    // `cargo run` is `cargo build` then the executable: built first, outside the example's guard (a first build,
    // or cargo waiting for its package cache lock, is not the example hanging), then the executable cargo names
    // runs under the guard.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = tokio::process::Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "bw-client", "--example", "producer", "--message-format=json"])
        .current_dir(&root)
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("cargo runs");
    assert!(built.status.success(), "the Rust example does not build");
    let executable = String::from_utf8_lossy(&built.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["target"]["name"] == "producer" && m["target"]["kind"][0] == "example")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo names the example's executable");
    let s = stack(TENANT, PHONE).await;

    let mut cmd = tokio::process::Command::new(executable);
    cmd.args([OP, WABA_ID, PHONE, RECIPIENT, "Your order shipped"]).current_dir(&root).env("FOLLOW_SECONDS", "60");
    tenant_env(&mut cmd, &s, TENANT);
    let (status, stdout, stderr) = run(cmd).await;
    let output = format!("{stdout}{stderr}");
    assert!(status.success(), "the example failed ({status}):\n{output}");

    let tagged = |tag: &str| -> Vec<std::collections::HashMap<String, String>> {
        stdout.lines().filter(|l| l.starts_with(&format!("{tag} "))).map(rust_line).collect()
    };
    let (replies, events, statuses) = (tagged("reply"), tagged("event"), tagged("status"));
    assert!(replies.len() == 1 && statuses.len() == 1, "one reply and one status printed:\n{output}");
    let (reply, status_reply) = (&replies[0], &statuses[0]);
    let field = |m: &std::collections::HashMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
    assert_eq!(field(reply, "operation_id"), OP, "the producer's own id:\n{output}");
    let printed = Printed {
        accepted: field(reply, "accepted") == "true",
        duplicate: field(reply, "duplicate") == "true",
        events: events.iter().map(|e| (field(e, "kind"), field(e, "wamid"))).collect(),
        status_found: field(status_reply, "found") == "true",
        current: field(status_reply, "current"),
        journey: field(status_reply, "journey").split(',').filter(|k| !k.is_empty()).map(String::from).collect(),
    };
    check(&s, TENANT, PHONE, OP, &printed, &output).await;
}

/// `examples/producer-ts` type-checks as its README says (`npm run check`, `tsc --noEmit` under the strict
/// tsconfig): running under tsx alone would not catch a type error in the example.
#[tokio::test]
async fn the_typescript_producer_example_type_checks() {
    let dir = example_dir("producer-ts");
    assert!(dir.join("node_modules/.bin/tsc").exists(), "examples/producer-ts has no typescript installed: {SETUP}");
    let mut cmd = tokio::process::Command::new("npm");
    cmd.args(["run", "--silent", "check"]).current_dir(&dir);
    let (status, stdout, stderr) = run(cmd).await;
    assert!(status.success(), "tsc --noEmit failed ({status}):\n{stdout}{stderr}");
}
