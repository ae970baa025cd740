//! Service processes of the local stack: each service runs as its own OS process (the real binaries), with
//! its config passed through `BW_<SERVICE>__*` environment variables, its log in the drill directory, and its
//! admin port probed for readiness. Used by the drill and by the resilience tests (kill -9, restart).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The directory holding the workspace binaries: `BW_BIN_DIR`, else the directory of the running executable
/// (with `deps/` stripped, for test binaries).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("BW_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// A free loopback port (the test kit's, which the drill uses for its servers too).
pub use bw_testkit::free_port;

/// What a service logs when its admin port is taken (`bw_common::service`), with "Address already in use".
const ADMIN_BIND_FAILED: &str = "cannot bind admin server";

/// One running service process.
pub struct ServiceProcess {
    /// Service name as in the binary `bw-<service>` and env prefix.
    pub service: String,
    /// Instance number (several dispatchers...).
    pub instance: usize,
    /// Admin address (`/livez`, `/readyz`, `/metrics`).
    pub admin: String,
    /// Log file.
    pub log: PathBuf,
    env: BTreeMap<String, String>,
    child: Option<Child>,
}

impl ServiceProcess {
    /// OS process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

/// The set of service processes of one stack.
pub struct Services {
    bin_dir: PathBuf,
    log_dir: PathBuf,
    /// Running (or stopped) processes, in spawn order.
    pub procs: Vec<ServiceProcess>,
    /// `RUST_LOG` of the processes: `BW_DRILL_LOG`, else `warn`.
    pub log_level: String,
    /// `telemetry.otlp_endpoint` of every process spawned from now on (None: no export).
    pub otlp_endpoint: Option<String>,
}

fn env_prefix(service: &str) -> String {
    format!("BW_{}__", service.to_ascii_uppercase().replace('-', "_"))
}

/// The variable that sets a service's admin address.
fn admin_key(service: &str) -> String {
    format!("{}ADMIN__LISTEN", env_prefix(service))
}

impl Services {
    /// Processes from `bin_dir`, logs under `log_dir`.
    pub fn new(bin_dir: PathBuf, log_dir: PathBuf) -> Services {
        let _ = std::fs::create_dir_all(&log_dir);
        let log_level = std::env::var("BW_DRILL_LOG").unwrap_or_else(|_| "warn".into());
        Services { bin_dir, log_dir, procs: Vec::new(), log_level, otlp_endpoint: None }
    }

    /// Starts `bw-<service>` with config overrides `settings` (keys like `nats.url`), returning its index.
    pub fn spawn(&mut self, service: &str, settings: &[(&str, String)]) -> anyhow::Result<usize> {
        self.spawn_with_env(service, settings, &[])
    }

    /// [`Services::spawn`] with extra environment variables set as given (e.g. a test's crash point).
    pub fn spawn_with_env(
        &mut self,
        service: &str,
        settings: &[(&str, String)],
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<usize> {
        let instance = self.procs.iter().filter(|p| p.service == service).count();
        let admin = format!("127.0.0.1:{}", free_port());
        let prefix = env_prefix(service);
        let mut env = BTreeMap::new();
        env.insert(admin_key(service), admin.clone());
        env.insert(format!("{prefix}NATS__NAME"), format!("bw-{service}-{instance}"));
        if let Some(endpoint) = &self.otlp_endpoint {
            env.insert(format!("{prefix}TELEMETRY__OTLP_ENDPOINT"), endpoint.clone());
        }
        for (key, value) in settings {
            env.insert(format!("{prefix}{}", key.to_ascii_uppercase().replace('.', "__")), value.clone());
        }
        for (key, value) in extra_env {
            env.insert(key.to_string(), value.to_string());
        }
        let log = self.log_dir.join(format!("{service}-{instance}.log"));
        let mut proc = ServiceProcess { service: service.to_string(), instance, admin, log, env, child: None };
        self.start(&mut proc)?;
        self.procs.push(proc);
        Ok(self.procs.len() - 1)
    }

    fn start(&self, proc: &mut ServiceProcess) -> anyhow::Result<()> {
        let bin = self.bin_dir.join(format!("bw-{}", proc.service));
        anyhow::ensure!(bin.is_file(), "binary {} not found (build the workspace first)", bin.display());
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&proc.log)?;
        let child = Command::new(&bin)
            .envs(&proc.env)
            .env("RUST_LOG", &self.log_level)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        proc.child = Some(child);
        Ok(())
    }

    /// Gives process `index` a new admin port and starts it again (its admin port was taken meanwhile).
    fn rebind_admin(&mut self, index: usize) -> anyhow::Result<()> {
        self.set_admin(index, format!("127.0.0.1:{}", free_port()));
        self.restart(index)
    }

    /// The admin address process `index` listens on from its next start.
    fn set_admin(&mut self, index: usize, admin: String) {
        let proc = &mut self.procs[index];
        proc.env.insert(admin_key(&proc.service), admin.clone());
        proc.admin = admin;
    }

    /// kill -9 a process (no chance to finish anything).
    pub fn kill9(&mut self, index: usize) {
        if let Some(c) = self.procs[index].child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.procs[index].child = None;
    }

    /// Sends signal `sig` (a name `kill` takes: STOP, CONT, TERM...) to process `index`; false when it is not
    /// running or the signal could not be sent.
    pub fn signal(&mut self, index: usize, sig: &str) -> bool {
        match self.procs[index].pid() {
            Some(pid) => {
                Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().is_ok_and(|s| s.success())
            }
            None => false,
        }
    }

    /// Starts a killed or stopped process again with the same config.
    pub fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        self.kill9(index);
        let mut proc = std::mem::replace(
            &mut self.procs[index],
            ServiceProcess {
                service: String::new(),
                instance: 0,
                admin: String::new(),
                log: PathBuf::new(),
                env: BTreeMap::new(),
                child: None,
            },
        );
        let result = self.start(&mut proc);
        self.procs[index] = proc;
        result
    }

    /// SIGTERM every process, wait up to `grace`, then kill what is left.
    pub fn stop_all(&mut self, grace: Duration) {
        for p in &mut self.procs {
            if let Some(c) = &p.child {
                let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            }
        }
        let deadline = Instant::now() + grace;
        for p in &mut self.procs {
            if let Some(c) = p.child.as_mut() {
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = c.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
            p.child = None;
        }
    }

    /// Waits until every running process answers 200 on `/readyz`.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        for i in 0..self.procs.len() {
            let mut rebinds = 0;
            loop {
                if !self.procs[i].is_running() && self.procs[i].child.is_some() {
                    let tail = std::fs::read_to_string(&self.procs[i].log).unwrap_or_default();
                    // The admin port was free when `spawn` chose it, but another process on the machine took it
                    // before this one bound it: choose another and start again (a few times at most).
                    if rebinds < 3 && tail.matches(ADMIN_BIND_FAILED).count() > rebinds {
                        rebinds += 1;
                        self.rebind_admin(i)?;
                        continue;
                    }
                    let tail: String = tail
                        .lines()
                        .rev()
                        .take(20)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n");
                    anyhow::bail!(
                        "{}-{} exited during start-up; log tail:\n{tail}",
                        self.procs[i].service,
                        self.procs[i].instance
                    );
                }
                if http_ok(&format!("http://{}/readyz", self.procs[i].admin)).await {
                    break;
                }
                if Instant::now() > deadline {
                    anyhow::bail!(
                        "{}-{} not ready after {timeout:?}; see {}",
                        self.procs[i].service,
                        self.procs[i].instance,
                        self.procs[i].log.display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        self.stop_all(Duration::from_secs(5));
    }
}

/// Minimal HTTP/1.1 GET returning whether the status was 200 (no client library needed for a probe).
pub async fn http_ok(url: &str) -> bool {
    http_get(url).await.map(|(status, _)| status == 200).unwrap_or(false)
}

/// Minimal HTTP/1.1 GET on loopback: (status, body).
pub async fn http_get(url: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').map(|(h, p)| (h, format!("/{p}"))).unwrap_or((rest, "/".into()));
    let fut = async {
        let mut stream = tokio::net::TcpStream::connect(host).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status: u16 = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(2), fut).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A free port can be taken by another process between `spawn` choosing it and the service binding it (a
    /// benchmark once failed so). `wait_ready` then gives the service another port and starts it again.
    #[tokio::test]
    async fn a_service_whose_admin_port_was_taken_starts_on_another() {
        let nats = bw_testkit::NatsServer::start();
        let dir = std::env::temp_dir().join(format!("bw-stack-rebind-{}", std::process::id()));
        let mut services = Services::new(bin_dir(), dir.clone());
        let i = services.spawn("alerting", &[("nats.url", nats.url())]).expect("spawn bw-alerting");
        // The port taken: the same process started again on an address another listener holds.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let taken_addr = taken.local_addr().expect("addr").to_string();
        services.kill9(i);
        services.set_admin(i, taken_addr.clone());
        services.restart(i).expect("restart");
        services.wait_ready(Duration::from_secs(60)).await.expect("ready on another admin port");
        assert_ne!(services.procs[i].admin, taken_addr);
        let log = std::fs::read_to_string(&services.procs[i].log).unwrap_or_default();
        assert!(log.contains(ADMIN_BIND_FAILED), "the first start failed on the taken port: {log}");
        services.stop_all(Duration::from_secs(10));
        drop(taken);
        let _ = std::fs::remove_dir_all(dir);
    }
}
