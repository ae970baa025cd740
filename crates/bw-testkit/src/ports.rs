//! Free loopback ports for the servers a test or the drill spawns.

use std::net::TcpListener;

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
pub(crate) const PORTS: std::ops::Range<u16> = 12_000..22_000;

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

#[cfg(test)]
mod tests {
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
