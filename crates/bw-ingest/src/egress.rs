//! Where ingest's outgoing HTTP requests (the producers' callbacks) may connect.
//!
//! A callback URL is input from outside: left unchecked it could aim ingest at this machine, the cloud's
//! metadata service (169.254.169.254) or a private network (server-side request forgery). A destination is
//! refused when its address is loopback, link-local, private, unique-local, shared (CGNAT 100.64/10),
//! unspecified, broadcast, multicast or otherwise not global (documentation, benchmarking, reserved), the IPv6
//! forms that carry an IPv4 address (mapped, compatible, NAT64, 6to4) judged by that IPv4 address, unless
//! `egress.allow_cidrs` lists a range holding it ([`Policy`]; the compiled default allows nothing).
//!
//! Checked twice. When a callback is set up (ingest's start) its host is resolved and every address it
//! resolves to must be allowed ([`Policy::check_destination`]; a refusal is a configuration error). And on
//! every connection the HTTP client's resolver ([`Resolver`]) drops refused addresses from each lookup, so a
//! name that resolves elsewhere later (DNS rebinding) gets no connection: the attempt fails like a connection
//! error and is retried and counted. Literal IP hosts never reach a resolver; they cannot change and are
//! checked when the configuration is validated ([`Policy::check_literal`]). The callback client uses no
//! proxy: a proxy would resolve the name itself, past this check.

use crate::cidr::Cidr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// The kinds of address a callback may not reach unless allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    Loopback,
    LinkLocal,
    Private,
    UniqueLocal,
    /// 100.64.0.0/10, carrier-grade NAT.
    Shared,
    Unspecified,
    Broadcast,
    Multicast,
    /// Documentation, benchmarking, protocol assignments, future use, and IPv6 outside global unicast.
    Reserved,
}

impl Range {
    /// The words used in errors and logs.
    pub fn label(self) -> &'static str {
        match self {
            Range::Loopback => "loopback",
            Range::LinkLocal => "link-local",
            Range::Private => "private",
            Range::UniqueLocal => "unique-local",
            Range::Shared => "shared (CGNAT)",
            Range::Unspecified => "unspecified",
            Range::Broadcast => "broadcast",
            Range::Multicast => "multicast",
            Range::Reserved => "reserved",
        }
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// The range an address falls in, None for a global (public) address.
pub fn classify(ip: IpAddr) -> Option<Range> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Range> {
    use Range::*;
    match ip.octets() {
        // "This network": Linux connects 0.0.0.0 to the local host.
        [0, ..] => Some(Unspecified),
        [10, ..] => Some(Private),
        [100, b, ..] if (64..128).contains(&b) => Some(Shared),
        [127, ..] => Some(Loopback),
        [169, 254, ..] => Some(LinkLocal),
        [172, b, ..] if (16..32).contains(&b) => Some(Private),
        [192, 168, ..] => Some(Private),
        // Protocol assignments, documentation (TEST-NET-1..3), the old 6to4 relay anycast, benchmarking.
        [192, 0, 0, _] | [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] | [192, 88, 99, _] => Some(Reserved),
        [198, 18 | 19, ..] => Some(Reserved),
        [255, 255, 255, 255] => Some(Broadcast),
        [224..=239, ..] => Some(Multicast),
        [240..=255, ..] => Some(Reserved),
        _ => None,
    }
}

fn classify_v6(ip: Ipv6Addr) -> Option<Range> {
    use Range::*;
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    let s = ip.segments();
    let low_v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    // Forms that carry an IPv4 address reach that address: ::ffff:a.b.c.d (mapped), ::a.b.c.d (compatible),
    // 64:ff9b::a.b.c.d (NAT64), 2002:aabb:ccdd:: (6to4).
    if ip.to_ipv4_mapped().is_some() || s[..6] == [0; 6] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return classify_v4(low_v4);
    }
    if s[0] == 0x2002 {
        return classify_v4(Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8));
    }
    match s[0] {
        x if x & 0xfe00 == 0xfc00 => return Some(UniqueLocal),
        x if x & 0xffc0 == 0xfe80 => return Some(LinkLocal),
        // Site-local (deprecated, still routed inside some networks).
        x if x & 0xffc0 == 0xfec0 => return Some(Private),
        x if x & 0xff00 == 0xff00 => return Some(Multicast),
        _ => {}
    }
    // Local-use NAT64 (64:ff9b:1::/48), documentation (2001:db8::/32), protocol assignments such as Teredo
    // (2001::/23), and everything outside global unicast (2000::/3).
    let local_nat64 = s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1;
    let documentation = s[0] == 0x2001 && s[1] == 0x0db8;
    let assignments = s[0] == 0x2001 && s[1] < 0x0200;
    if local_nat64 || documentation || assignments || s[0] & 0xe000 != 0x2000 {
        return Some(Reserved);
    }
    None
}

/// A destination the policy refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the destination address is {range}, a range callbacks may not reach unless egress.allow_cidrs lists it")]
pub struct Refused {
    pub range: Range,
}

/// What resolving a destination at set-up found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Destination {
    /// Every address is allowed (or the host is a literal, allowed address).
    Allowed,
    /// The name did not resolve now (its DNS may be down): each connection checks it.
    Unresolved(String),
}

/// The destinations outgoing requests may reach.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    allow: Vec<Cidr>,
}

impl Policy {
    /// A policy allowing the listed ranges besides global addresses (`egress.allow_cidrs`).
    pub(crate) fn new(allow: Vec<Cidr>) -> Policy {
        Policy { allow }
    }

    /// Parses `egress.allow_cidrs`.
    pub fn from_config(allow_cidrs: &[String]) -> Result<Policy, String> {
        Ok(Policy::new(crate::cidr::parse_all("egress.allow_cidrs", allow_cidrs)?))
    }

    /// Why `ip` may not be reached; None when it may. An IPv4-mapped IPv6 address is judged, and matched
    /// against the allowed ranges, as its IPv4 address.
    pub fn refusal(&self, ip: IpAddr) -> Option<Refused> {
        let ip = ip.to_canonical();
        if self.allow.iter().any(|c| c.contains(ip)) {
            return None;
        }
        classify(ip).map(|range| Refused { range })
    }

    /// Checks a URL whose host is a literal IP address (a name is checked by [`Policy::check_destination`]).
    pub fn check_literal(&self, url: &reqwest::Url) -> Result<(), Refused> {
        match literal_ip(url) {
            Some(ip) => self.refusal(ip).map_or(Ok(()), Err),
            None => Ok(()),
        }
    }

    /// Checks a destination when it is set up: a literal address at once, a name by resolving it now (every
    /// address it resolves to must be allowed).
    pub(crate) async fn check_destination(&self, url: &reqwest::Url) -> Result<Destination, Refused> {
        self.check_literal(url)?;
        let name = match url.host_str() {
            Some(name) if literal_ip(url).is_none() => name,
            _ => return Ok(Destination::Allowed),
        };
        let port = url.port_or_known_default().unwrap_or(443);
        match tokio::net::lookup_host((name, port)).await {
            Ok(addrs) => {
                for addr in addrs {
                    if let Some(refused) = self.refusal(addr.ip()) {
                        return Err(refused);
                    }
                }
                Ok(Destination::Allowed)
            }
            Err(e) => Ok(Destination::Unresolved(e.to_string())),
        }
    }
}

/// The host of `url` when it is an IP address. The URL parser has already turned every spelling of an IPv4
/// host (decimal `2130706433`, hexadecimal `0x7f.1`) into dotted form, and keeps IPv6 in brackets.
fn literal_ip(url: &reqwest::Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host).parse().ok()
}

/// The callback client's DNS resolver: the system's lookup, with every address the policy refuses dropped. A
/// name left with no address fails with [`Refused`] (the connection is never made).
pub(crate) struct Resolver {
    policy: Arc<Policy>,
}

impl Resolver {
    pub(crate) fn new(policy: Arc<Policy>) -> Resolver {
        Resolver { policy }
    }
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let kept: Vec<SocketAddr> = found
                .into_iter()
                .filter(|a| match policy.refusal(a.ip()) {
                    None => true,
                    Some(r) => {
                        refused.get_or_insert(r);
                        false
                    }
                })
                .collect();
            match (kept.is_empty(), refused) {
                (true, Some(r)) => Err(Box::new(r) as Box<dyn std::error::Error + Send + Sync>),
                _ => Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

/// An HTTP client builder whose connections obey `policy`: its resolver filters every lookup, and it uses no
/// proxy (a proxy would resolve the name itself).
pub(crate) fn client_builder(policy: Arc<Policy>) -> reqwest::ClientBuilder {
    bw_common::crypto::install_crypto();
    reqwest::Client::builder().no_proxy().dns_resolver(Arc::new(Resolver::new(policy)))
}

/// Whether an error (or one of its causes) is a refusal of the policy.
pub(crate) fn is_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.downcast_ref::<Refused>().is_some() {
            return true;
        }
        next = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    /// Every range the policy refuses, one row each, and the public addresses it lets through.
    #[test]
    fn each_address_falls_in_its_range() {
        use Range::*;
        let table: &[(&str, Option<Range>)] = &[
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("::1", Some(Loopback)),
            ("169.254.169.254", Some(LinkLocal)),
            ("fe80::1", Some(LinkLocal)),
            ("febf::1", Some(LinkLocal)),
            ("10.0.0.1", Some(Private)),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("192.168.1.1", Some(Private)),
            ("fec0::1", Some(Private)),
            ("fc00::1", Some(UniqueLocal)),
            ("fd12:3456::1", Some(UniqueLocal)),
            ("100.64.0.1", Some(Shared)),
            ("100.127.255.255", Some(Shared)),
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Unspecified)),
            ("::", Some(Unspecified)),
            ("255.255.255.255", Some(Broadcast)),
            ("224.0.0.1", Some(Multicast)),
            ("239.255.255.250", Some(Multicast)),
            ("ff02::1", Some(Multicast)),
            ("240.0.0.1", Some(Reserved)),
            ("192.0.2.1", Some(Reserved)),
            ("198.18.0.1", Some(Reserved)),
            ("2001:db8::1", Some(Reserved)),
            ("2001::1", Some(Reserved)),
            ("64:ff9b:1::a", Some(Reserved)),
            ("100::1", Some(Reserved)),
            // IPv6 forms carrying an IPv4 address are judged by it.
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("::ffff:169.254.169.254", Some(LinkLocal)),
            ("::ffff:10.0.0.1", Some(Private)),
            ("::10.0.0.1", Some(Private)),
            ("::a9fe:a9fe", Some(LinkLocal)),
            ("64:ff9b::a9fe:a9fe", Some(LinkLocal)),
            ("64:ff9b::7f00:1", Some(Loopback)),
            ("2002:a9fe:a9fe::1", Some(LinkLocal)),
            ("2002:c0a8:0101::1", Some(Private)),
            // Public.
            ("8.8.8.8", None),
            ("100.63.255.255", None),
            ("100.128.0.1", None),
            ("172.15.255.255", None),
            ("172.32.0.1", None),
            ("169.253.1.1", None),
            ("2a03:2880:f10c:83:face:b00c:0:25de", None),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::808:808", None),
            ("2002:808:808::1", None),
        ];
        for (addr, want) in table {
            assert_eq!(classify(ip(addr)), *want, "{addr}");
        }
    }

    #[test]
    fn allowed_ranges_open_exactly_what_they_list() {
        let none = Policy::default();
        assert_eq!(none.refusal(ip("127.0.0.1")), Some(Refused { range: Range::Loopback }));
        assert_eq!(none.refusal(ip("93.184.216.34")), None);
        let local = Policy::from_config(&["127.0.0.1".into()]).expect("policy");
        assert_eq!(local.refusal(ip("127.0.0.1")), None);
        assert_eq!(local.refusal(ip("::ffff:127.0.0.1")), None, "the mapped form of an allowed address");
        assert!(local.refusal(ip("127.0.0.2")).is_some());
        assert!(local.refusal(ip("::1")).is_some(), "IPv6 loopback is another range");
        assert!(local.refusal(ip("169.254.169.254")).is_some());
        let private = Policy::from_config(&["10.0.0.0/8".into(), "fd00::/8".into()]).expect("policy");
        assert_eq!(private.refusal(ip("10.1.2.3")), None);
        assert_eq!(private.refusal(ip("fd00::5")), None);
        assert!(private.refusal(ip("192.168.0.1")).is_some());
    }

    #[test]
    fn literal_hosts_are_judged_in_every_spelling() {
        let policy = Policy::default();
        let refused = |u: &str| policy.check_literal(&reqwest::Url::parse(u).expect("url")).err().map(|r| r.range);
        assert_eq!(refused("http://169.254.169.254/latest/meta-data"), Some(Range::LinkLocal));
        assert_eq!(refused("http://10.0.0.1:8080/cb"), Some(Range::Private));
        assert_eq!(refused("http://[::1]:9000/cb"), Some(Range::Loopback));
        assert_eq!(refused("http://[::ffff:a9fe:a9fe]/"), Some(Range::LinkLocal));
        // The URL parser reads decimal and hexadecimal IPv4 hosts as the address they name.
        assert_eq!(refused("http://2130706433/"), Some(Range::Loopback));
        assert_eq!(refused("http://0x7f.1/"), Some(Range::Loopback));
        assert_eq!(refused("https://crm.example.com/cb"), None, "names are resolved, not judged here");
        assert_eq!(refused("https://93.184.216.34/cb"), None);
    }

    #[tokio::test]
    async fn names_are_resolved_at_set_up_and_at_each_connection() {
        use futures::FutureExt as _;
        let policy = Arc::new(Policy::default());
        let url = reqwest::Url::parse("http://localhost:9/cb").expect("url");
        let refused = policy.check_destination(&url).await.expect_err("localhost is loopback");
        assert_eq!(refused.range, Range::Loopback);
        // The connection-time resolver drops the same addresses: the request fails without connecting.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = format!("http://localhost:{}/", listener.local_addr().expect("addr").port());
        let client = client_builder(policy).build().expect("client");
        let err = client.get(&target).send().await.expect_err("refused");
        assert!(is_refused(&err), "{err:?}");
        assert!(listener.accept().now_or_never().is_none(), "no connection reached the listener");
        // Allowed, the same name connects (nobody answers: the request is dropped once the connection is seen).
        let allowed = Arc::new(Policy::from_config(&["127.0.0.0/8".into(), "::1".into()]).expect("policy"));
        assert_eq!(allowed.check_destination(&url).await, Ok(Destination::Allowed));
        let client = client_builder(allowed).build().expect("client");
        let request = tokio::spawn(async move { client.get(&target).send().await.map(|_| ()) });
        let accepted = tokio::time::timeout(std::time::Duration::from_secs(10), listener.accept()).await;
        assert!(accepted.is_ok_and(|a| a.is_ok()), "the allowed name connected");
        request.abort();
    }
}
