//! `bwctl breaker` and `bwctl pause`: operator actions through the breaker-coordinator's admin API, behind the
//! operator token (never printed), and `bwctl operator-token-hash`.

use anyhow::Context as _;
use clap::{Args, Subcommand};
use std::io::Write;

#[derive(Debug, Subcommand)]
pub enum BreakerCommand {
    /// Force the breaker OPEN (nothing is sent for the scope until cleared).
    ForceOpen(BreakerArgs),
    /// Force the breaker CLOSED (failures no longer trip it until cleared).
    ForceClosed(BreakerArgs),
    /// Remove an override; the breaker decides again.
    Clear(BreakerArgs),
    /// Wipe window, counters, pause, incident and override: the scope is CLOSED at full rate.
    Reset(BreakerArgs),
    /// Which coordinator instance holds the leader lease (read-only; no token needed).
    Leader,
}

/// An operator token: its `Debug` is redacted so it never reaches output or logs.
#[derive(Clone)]
pub struct OperatorToken(String);

impl OperatorToken {
    /// The token, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OperatorToken(<redacted>)")
    }
}

impl std::str::FromStr for OperatorToken {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.is_empty() || t.len() > 1024 || t.chars().any(|c| c.is_control() || c == ' ') {
            return Err("the operator token must be 1 to 1024 printable characters without spaces".into());
        }
        Ok(OperatorToken(t.to_string()))
    }
}

/// Lower-case hex sha256 of an operator token, as `operator.token_sha256` wants it.
pub fn operator_token_hash(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.trim().as_bytes()))
}

#[derive(Debug, Subcommand)]
pub enum PauseCommand {
    /// Pause one scope (every message it covers waits; replay too) for `--for-ms`, or until lifted.
    Set(PauseArgs),
    /// Lift the pause of one scope, whoever set it (Meta's answer, a webhook, an operator).
    Lift(PauseArgs),
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    /// number, waba, app or token.
    #[arg(long)]
    pub level: String,
    /// The phone_number_id, WABA id, app id, or the token's fingerprint (as `bwctl scopes` shows it).
    #[arg(long)]
    pub id: String,
    /// `set`: pause this many milliseconds (default: until lifted).
    #[arg(long)]
    pub for_ms: Option<u64>,
    /// Why (logged by the coordinator).
    #[arg(long, default_value = "operator")]
    pub reason: String,
}

#[derive(Debug, Args)]
pub struct BreakerArgs {
    /// phone_number_id of the scope.
    #[arg(long)]
    pub scope: String,
    /// Why (kept in the transition event).
    #[arg(long, default_value = "operator")]
    pub reason: String,
}

/// Calls the coordinator admin API: `POST {base}/admin/breakers/{scope}/{force-open|force-closed|clear|reset}`
/// with a JSON body `{"reason": "..."}` and the operator token as `Authorization: Bearer`.
pub(crate) async fn breaker(
    base: &str,
    token: Option<&OperatorToken>,
    cmd: &BreakerCommand,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let (action, args) = match cmd {
        BreakerCommand::ForceOpen(a) => ("force-open", a),
        BreakerCommand::ForceClosed(a) => ("force-closed", a),
        BreakerCommand::Clear(a) => ("clear", a),
        BreakerCommand::Reset(a) => ("reset", a),
        BreakerCommand::Leader => return leader(base, out).await,
    };
    anyhow::ensure!(
        !args.scope.is_empty() && args.scope.bytes().all(|b| b.is_ascii_digit()),
        "--scope must be a phone_number_id (digits)"
    );
    let path = format!("/admin/breakers/{}/{action}", args.scope);
    let body = format!("{{\"reason\":{}}}", json_string(&args.reason));
    operator_post(base, token, &path, body, &format!("scope {}: {action}", args.scope), out).await
}

/// Calls the coordinator admin API: `POST {base}/admin/pauses/{level}/{id}/{pause|lift}` with
/// `{"for_ms": N, "reason": "..."}` and the operator token as `Authorization: Bearer`.
pub(crate) async fn pause(
    base: &str,
    token: Option<&OperatorToken>,
    cmd: &PauseCommand,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let (action, args) = match cmd {
        PauseCommand::Set(a) => ("pause", a),
        PauseCommand::Lift(a) => ("lift", a),
    };
    anyhow::ensure!(
        matches!(args.level.as_str(), "number" | "waba" | "app" | "token"),
        "--level must be number, waba, app or token"
    );
    anyhow::ensure!(
        !args.id.is_empty()
            && args.id.len() <= 64
            && args.id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
        "--id must be 1 to 64 letters, digits, '-', '_' or '.'"
    );
    let for_ms = match (action, args.for_ms) {
        ("pause", Some(0)) => anyhow::bail!("--for-ms must be positive (leave it out to pause until lifted)"),
        ("pause", Some(ms)) => format!("\"for_ms\":{ms},"),
        _ => String::new(),
    };
    let path = format!("/admin/pauses/{}/{}/{action}", args.level, args.id);
    let body = format!("{{{for_ms}\"reason\":{}}}", json_string(&args.reason));
    operator_post(base, token, &path, body, &format!("{} {}: {action}", args.level, args.id), out).await
}

/// POSTs an operator action to the coordinator and reports its answer under `what`.
async fn operator_post(
    base: &str,
    token: Option<&OperatorToken>,
    path: &str,
    body: String,
    what: &str,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    bw_common::crypto::install_crypto();
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let mut request = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json")
        .body(body)
        .timeout(std::time::Duration::from_secs(10));
    if let Some(token) = token {
        request = request.bearer_auth(token.expose());
    }
    let response = request.send().await.with_context(|| format!("coordinator not reachable at {base}"))?;
    let status = response.status();
    let mut text = response.text().await.unwrap_or_default();
    if let Some(token) = token {
        // Nothing the coordinator says should echo it, but never print it whatever comes back.
        text = text.replace(token.expose(), "<redacted>");
    }
    if status.is_success() {
        writeln!(out, "{what} ok {}", text.trim())?;
        Ok(0)
    } else {
        writeln!(out, "{what} failed: HTTP {status} {}", text.trim())?;
        if status.as_u16() == 401 || status.as_u16() == 403 {
            let hint = if token.is_none() {
                "set BW_OPERATOR_TOKEN (or --operator-token) to the operator token"
            } else {
                "check BW_OPERATOR_TOKEN against the coordinator's operator.token_sha256 (bwctl operator-token-hash)"
            };
            writeln!(out, "hint: {hint}")?;
        }
        Ok(1)
    }
}

/// `GET {base}/admin/leader`: the lease holder, and whether the instance that answered leads.
async fn leader(base: &str, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    bw_common::crypto::install_crypto();
    let url = format!("{}/admin/leader", base.trim_end_matches('/'));
    let response = reqwest::Client::new()
        .get(&url)
        .timeout(std::time::Duration::from_secs(10))
        .send()
        .await
        .with_context(|| format!("coordinator not reachable at {base}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let body: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if !status.is_success() {
        writeln!(out, "leader: HTTP {status} {}", text.trim())?;
        return Ok(1);
    }
    match body["holder"].as_str() {
        Some(holder) => writeln!(out, "leader: {holder}")?,
        None => writeln!(out, "leader: none (no instance holds the lease; ticks and snapshots are paused)")?,
    }
    writeln!(
        out,
        "answered by: {} ({})",
        body["instance"].as_str().unwrap_or("?"),
        if body["leader"].as_bool() == Some(true) { "leader" } else { "follower" }
    )?;
    Ok(if body["holder"].is_string() { 0 } else { 1 })
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
