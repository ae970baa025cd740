//! Helpers of the drill tests: the workspace binaries, and headless Chromium.
// Each test crate uses a part of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// The `bw-drill` binary next to the other workspace binaries (`cargo build --bins` first).
pub(crate) fn drill_bin() -> PathBuf {
    let bin = bw_drill::stack::bin_dir().join("bw-drill");
    assert!(
        bin.is_file(),
        "{} not found: build the workspace binaries first (`cargo build --bins`, as scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// The Chromium binary, installed with `BW_WITH_CHROMIUM=1 scripts/setup.sh` (idempotent) when missing.
pub(crate) fn chromium() -> PathBuf {
    fn find() -> Option<PathBuf> {
        ["chromium", "chromium-browser"].into_iter().find_map(|name| {
            let out = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output().ok()?;
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (out.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
        })
    }
    if let Some(path) = find() {
        return path;
    }
    let status = Command::new("bash")
        .arg(repo_root().join("scripts/setup.sh"))
        .env("BW_WITH_CHROMIUM", "1")
        .status()
        .expect("run scripts/setup.sh");
    assert!(status.success(), "BW_WITH_CHROMIUM=1 scripts/setup.sh failed");
    find().expect("chromium on PATH after BW_WITH_CHROMIUM=1 scripts/setup.sh")
}

fn chromium_cmd(profile: &Path, width: u32) -> Command {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(format!("--window-size={width},1200"));
    cmd
}

/// Renders `page` at `width` CSS pixels: writes a screenshot to `shot` and returns the DOM after the page's
/// scripts ran.
pub(crate) fn render(page: &Path, width: u32, shot: &Path) -> String {
    let profile = tempfile::tempdir().expect("chromium profile dir");
    let url = format!("file://{}", page.display());
    let out = chromium_cmd(profile.path(), width)
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .expect("run chromium --screenshot");
    assert!(out.status.success(), "chromium screenshot failed: {}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(shot).expect("screenshot written");
    assert!(png.len() > 10_000 && png.starts_with(b"\x89PNG"), "screenshot is a real PNG ({} bytes)", png.len());
    let out = chromium_cmd(profile.path(), width)
        .args(["--virtual-time-budget=5000", "--dump-dom"])
        .arg(&url)
        .output()
        .expect("run chromium --dump-dom");
    assert!(out.status.success(), "chromium dump-dom failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts the rendered DOM has every report section and that the page's own check found no horizontal
/// overflow.
pub(crate) fn assert_readable(dom: &str, width: u32) {
    for id in ["header", "summary", "timeline", "errors", "senders", "alerts", "validation"] {
        assert!(dom.contains(&format!("<section id=\"{id}\"")), "section #{id} missing at {width}px");
    }
    let check = dom.split("id=\"layout-check\"").nth(1).expect("layout check element");
    let check: String = check.chars().take(300).collect();
    assert!(
        check.contains("data-overflow=\"none\"") && check.contains("layout-ok"),
        "page overflows horizontally at {width}px: {check}"
    );
}
