//! Multi-node fixtures: a 3-node JetStream cluster and a 3-master Redis Cluster.

use crate::nats::NatsServer;
use crate::ports::free_port;
use crate::redis::RedisServer;
use std::process::Command;

/// Three `nats-server` nodes forming one JetStream cluster on loopback.
pub struct NatsCluster {
    /// The nodes; kill or restart one to inject faults.
    pub nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts three clustered nodes.
    pub fn start() -> NatsCluster {
        let cluster_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let routes = cluster_ports.iter().map(|p| format!("nats-route://127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
        let nodes = cluster_ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                NatsServer::start_with_args(vec![
                    "--name".into(),
                    format!("bw-n{i}"),
                    "--cluster_name".into(),
                    "bw-test".into(),
                    "--cluster".into(),
                    format!("nats://127.0.0.1:{port}"),
                    "--routes".into(),
                    routes.clone(),
                ])
            })
            .collect();
        NatsCluster { nodes }
    }

    /// Comma-separated client URLs of all nodes.
    pub fn urls(&self) -> String {
        self.nodes.iter().map(|n| n.url()).collect::<Vec<_>>().join(",")
    }
}

/// Three `redis-server` masters joined into a Redis Cluster with all 16384 slots assigned.
pub struct RedisCluster {
    /// The masters.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled masters and creates the cluster with `redis-cli --cluster create`.
    pub fn start() -> RedisCluster {
        Self::start_with(None)
    }

    /// The same, every node requiring `password` from clients (`requirepass`) and sending it to the others
    /// (`masterauth`, which a replica uses to sync from its master after a failover).
    pub fn start_with_password(password: &str) -> RedisCluster {
        Self::start_with(Some(password))
    }

    fn start_with(password: Option<&str>) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                let mut args = vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    format!("nodes-{}.conf", free_port()),
                    "--cluster-node-timeout".into(),
                    "2000".into(),
                ];
                if let Some(password) = password {
                    args.extend(["--requirepass".into(), password.into(), "--masterauth".into(), password.into()]);
                }
                RedisServer::start_with_args(args)
            })
            .collect();
        // redis-cli reads the password from the environment (`-a` would put it on the command line).
        let cli = || {
            let mut cmd = Command::new("redis-cli");
            if let Some(password) = password {
                cmd.env("REDISCLI_AUTH", password);
            }
            cmd
        };
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        let status = cli()
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .arg("--cluster-replicas")
            .arg("0")
            .arg("--cluster-yes")
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        // Wait until every node reports the cluster as ok.
        for n in &nodes {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
            loop {
                let out = cli()
                    .args(["-p", &n.port().to_string(), "cluster", "info"])
                    .output()
                    .expect("redis-cli cluster info");
                if String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "redis cluster did not become ok");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        RedisCluster { nodes }
    }

    /// Node URLs for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}
