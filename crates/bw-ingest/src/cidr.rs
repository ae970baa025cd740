//! Address ranges written as CIDR (`10.0.0.0/8`, `fd00::/8`; a bare address is that one address), as the
//! configuration lists them (`egress.allow_cidrs`, `webhook.trusted_proxies`).

use std::net::IpAddr;

/// One range of addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `addr/prefix` or a bare `addr`. Bits set past the prefix are refused (`10.0.0.1/8` is most likely
    /// a typo for a single address or for `10.0.0.0/8`, and either reading could be wrong).
    pub(crate) fn parse(text: &str) -> Result<Cidr, String> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let net: IpAddr =
            addr.parse().map_err(|_| format!("`{text}` is not an IP address or a CIDR range such as 10.0.0.0/8"))?;
        let width = bits(net);
        let prefix = match prefix {
            None => width,
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= width => p,
                _ => return Err(format!("`{text}`: the prefix length must be a number from 0 to {width}")),
            },
        };
        let cidr = Cidr { net, prefix };
        if value(net) & !mask(width, prefix) != 0 {
            return Err(format!("`{text}` has address bits set past its /{prefix} prefix"));
        }
        Ok(cidr)
    }

    /// Whether `ip` lies in the range (an IPv4 range never holds an IPv6 address, nor the reverse: callers
    /// compare canonical addresses, with IPv4-mapped IPv6 unwrapped).
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        if self.net.is_ipv4() != ip.is_ipv4() {
            return false;
        }
        let m = mask(bits(ip), self.prefix);
        value(ip) & m == value(self.net) & m
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// Parses every entry, naming the config key and the entry in an error.
pub(crate) fn parse_all(key: &str, entries: &[String]) -> Result<Vec<Cidr>, String> {
    entries.iter().map(|e| Cidr::parse(e).map_err(|why| format!("{key}: {why}"))).collect()
}

fn bits(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

fn value(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The mask of the first `prefix` of `width` bits.
fn mask(width: u8, prefix: u8) -> u128 {
    let all: u128 = if width == 128 { u128::MAX } else { (1u128 << width) - 1 };
    if prefix == 0 { 0 } else { all & !((1u128 << (width - prefix)) - 1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn ranges_parse_and_hold_what_they_should() {
        let c = Cidr::parse("10.0.0.0/8").expect("parses");
        assert!(c.contains(ip("10.255.1.2")) && !c.contains(ip("11.0.0.1")) && !c.contains(ip("::a00:1")));
        let one = Cidr::parse("127.0.0.1").expect("bare address");
        assert_eq!(one.to_string(), "127.0.0.1/32");
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let v6 = Cidr::parse("fd00::/8").expect("v6");
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        assert!(Cidr::parse("::1").expect("v6 single").contains(ip("::1")));
        assert!(Cidr::parse("0.0.0.0/0").expect("all v4").contains(ip("8.8.8.8")));
        assert!(Cidr::parse("::/0").expect("all v6").contains(ip("2001:db8::1")));
    }

    #[test]
    fn bad_ranges_are_refused_precisely() {
        assert!(Cidr::parse("10.0.0.1/8").expect_err("host bits").contains("past its /8"));
        assert!(Cidr::parse("10.0.0.0/33").expect_err("prefix").contains("from 0 to 32"));
        assert!(Cidr::parse("example.com").expect_err("name").contains("not an IP address"));
        let err = parse_all("egress.allow_cidrs", &["10.0.0.0/8".into(), "x".into()]).expect_err("one bad");
        assert!(err.starts_with("egress.allow_cidrs: `x`"), "{err}");
    }
}
