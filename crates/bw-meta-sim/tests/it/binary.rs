//! The `bw-meta-sim` binary refuses a bad scenario file with one precise message and exit code 64.

use std::process::Command;

#[test]
fn a_scenario_file_with_an_unknown_key_is_refused_precisely() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("typo.toml");
    std::fs::write(
        &path,
        "[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"reset\", after_procesing = true }]\n",
    )
    .expect("write scenario");
    let out = Command::new(env!("CARGO_BIN_EXE_bw-meta-sim"))
        .args(["--listen", "127.0.0.1:0", "--scenario"])
        .arg(&path)
        .output()
        .expect("binary runs");
    assert_eq!(out.status.code(), Some(64), "invalid configuration exit code");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("unknown field `after_procesing`").count(), 1, "named once: {stderr}");
    assert!(stderr.contains("expected `after_processing`") && stderr.contains("line 4"), "{stderr}");
}
