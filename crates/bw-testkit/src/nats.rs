//! A real `nats-server -js` on a free loopback port, with its store in a temp dir kept across restarts.

use crate::process::{ServerKind, ServerProcess};
use std::ffi::OsString;
use std::path::Path;

/// A real `nats-server -js` on a free loopback port, with its store in a temp dir kept across restarts.
pub struct NatsServer(ServerProcess);

fn kind() -> ServerKind {
    ServerKind {
        name: "nats-server",
        bin_env: "NATS_SERVER_BIN",
        dir_prefix: "bw-nats-",
        log_file: "nats.log",
        base_args: |port, dir, log| {
            let mut args: Vec<OsString> = ["-js", "-a", "127.0.0.1", "-p"].map(OsString::from).to_vec();
            args.push(port.to_string().into());
            args.push("-sd".into());
            args.push(dir.join("store").into());
            args.push("-l".into());
            args.push(log.into());
            args
        },
    }
}

/// JetStream reserves every stream's `max_bytes` against `max_file_store` when it creates the stream, and the
/// server's own default is a share of the disk that is free when it starts: the same topology would start or not
/// depending on what else the machine holds. Test servers get a fixed 1 TB budget (an accounting figure; nothing
/// is allocated), wrapped around the caller's `-c` file where there is one (included first, so this wins).
fn with_store_reservation(dir: &Path, mut args: Vec<String>) -> Vec<String> {
    let mut text = String::new();
    if let Some(at) = args.iter().position(|a| a == "-c")
        && let Some(file) = args.get(at + 1).cloned()
    {
        let file = std::fs::canonicalize(&file).unwrap_or_else(|_| Path::new(&file).to_path_buf());
        // nats-server resolves includes relative to the including file only.
        let up = "../".repeat(dir.components().count().saturating_sub(1));
        let relative = file.strip_prefix("/").unwrap_or(&file).display().to_string();
        text.push_str(&format!("include \"{up}{relative}\"\n"));
        args.drain(at..at + 2);
    }
    text.push_str("jetstream { max_file_store: 1TB }\n");
    let wrapper = dir.join("bw-testkit.conf");
    std::fs::write(&wrapper, text).expect("write the test server's config");
    let mut out = vec!["-c".to_string(), wrapper.display().to_string()];
    out.extend(args);
    out
}

impl NatsServer {
    /// Starts a server with a config file (`-c`, e.g. `deploy/nats/accounts.conf`) and environment variables
    /// the file refers to (passwords). Port, store and log stay the testkit's.
    pub fn start_with_config(config: &Path, envs: &[(&str, &str)]) -> NatsServer {
        Self::start_prepared(vec!["-c".into(), config.display().to_string()], envs)
    }

    /// Starts a server with extra command-line arguments (after the testkit's; a `-c` file's settings yield to
    /// the command line) and environment variables the config file refers to.
    pub fn start_with_args_and_env(extra_args: Vec<String>, envs: &[(&str, &str)]) -> NatsServer {
        Self::start_prepared(extra_args, envs)
    }

    /// Starts a JetStream-enabled server.
    pub fn start() -> NatsServer {
        Self::start_with_args(Vec::new())
    }

    /// Starts a server with extra command-line arguments (used by [`crate::NatsCluster`]).
    pub fn start_with_args(extra_args: Vec<String>) -> NatsServer {
        Self::start_prepared(extra_args, &[])
    }

    fn start_prepared(extra_args: Vec<String>, envs: &[(&str, &str)]) -> NatsServer {
        NatsServer(ServerProcess::new(kind(), |dir| with_store_reservation(dir, extra_args), envs).start())
    }

    /// OS process id while running (benchmarks read its CPU time from `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.0.pid()
    }

    /// Client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.0.port())
    }

    /// TCP port.
    pub fn port(&self) -> u16 {
        self.0.port()
    }

    /// Directory holding the store and log.
    pub fn dir(&self) -> &Path {
        self.0.dir()
    }

    /// kill -9 the server (the store survives).
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Graceful stop (SIGTERM).
    pub fn stop(&mut self) {
        self.0.stop();
    }

    /// Starts the server again on the same port and store.
    pub fn restart(&mut self) {
        self.0.restart();
    }

    /// Starts a stopped or killed server again on the same port and store.
    pub fn start_again(&mut self) {
        assert!(!self.0.running(), "server still running");
        self.0.restart();
    }
}
