//! Limits applied to HTTP requests before ingest does any work for them: the Meta webhook endpoint's checks
//! ([`WebhookGuard`]), the per-source budget of badly signed requests ([`SourceLimiter`]) and body reading with
//! a size cap ([`read_capped`]).
//!
//! The webhook endpoint refuses, in this order and before reading the body: a source over its budget of badly
//! signed requests (429 with Retry-After), a request without a well-formed `X-Hub-Signature-256` header (401),
//! a declared `Content-Length` over the cap (413), and a request beyond the bodies being read at once (503 with
//! Retry-After). A body without `Content-Length` is read with the cap enforced as it streams, and one that does
//! not arrive within the read timeout gets 408. Refusing Meta loses nothing: Meta retries a non-200 delivery
//! for up to 7 days (meta-cloud-api.md §4.3).

use crate::cidr::Cidr;
use axum::body::Body;
use axum::http::{HeaderMap, header};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Name of Meta's signature header.
pub(crate) const SIGNATURE_HEADER: &str = "x-hub-signature-256";

/// Why a webhook request was refused before its body was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The source sent too many badly signed requests; try again after this long.
    RateLimited(Duration),
    /// No `X-Hub-Signature-256` header.
    MissingSignature,
    /// A header that is not `sha256=` and 64 hex digits.
    MalformedSignature,
    /// The declared body is larger than the cap.
    TooLarge,
    /// As many bodies as allowed are being read.
    Busy,
}

/// A request past the checks: it holds one of the reading slots until it is answered.
pub(crate) struct Admitted {
    /// Where it came from (None when the server gave no peer address).
    pub source: Option<IpAddr>,
    _slot: OwnedSemaphorePermit,
}

/// The webhook endpoint's limits (config `[webhook]`).
pub(crate) struct WebhookGuard {
    reading: Arc<Semaphore>,
    max_body_bytes: usize,
    pub(crate) read_timeout: Duration,
    pub(crate) limiter: SourceLimiter,
    trusted_proxies: Vec<Cidr>,
}

impl WebhookGuard {
    pub(crate) fn new(cfg: &crate::config::WebhookConfig) -> Result<WebhookGuard, String> {
        Ok(WebhookGuard {
            reading: Arc::new(Semaphore::new(cfg.max_bodies_in_flight.max(1))),
            max_body_bytes: cfg.max_body_bytes,
            read_timeout: Duration::from_millis(cfg.body_read_timeout_ms),
            limiter: SourceLimiter::new(
                cfg.bad_signature_burst,
                cfg.bad_signature_per_minute,
                cfg.bad_signature_sources,
            ),
            trusted_proxies: crate::cidr::parse_all("webhook.trusted_proxies", &cfg.trusted_proxies)?,
        })
    }

    /// The checks made before the body is read (module docs), in that order.
    pub(crate) fn admit(&self, peer: Option<SocketAddr>, headers: &HeaderMap) -> Result<Admitted, Refusal> {
        let source = self.source(peer, headers);
        if let Some(wait) = source.and_then(|s| self.limiter.limited(s, Instant::now())) {
            return Err(Refusal::RateLimited(wait));
        }
        // An unsigned or malformed request counts against its source like a badly signed one.
        match headers.get(SIGNATURE_HEADER).map(|v| v.as_bytes()) {
            None => {
                self.charge(source);
                return Err(Refusal::MissingSignature);
            }
            Some(v) if !well_formed_signature(v) => {
                self.charge(source);
                return Err(Refusal::MalformedSignature);
            }
            Some(_) => {}
        }
        if declared_length(headers).is_some_and(|n| n > self.max_body_bytes as u64) {
            return Err(Refusal::TooLarge);
        }
        let slot = self.reading.clone().try_acquire_owned().map_err(|_| Refusal::Busy)?;
        Ok(Admitted { source, _slot: slot })
    }

    /// Counts a badly signed (or unsigned) request against its source's budget.
    pub(crate) fn charge(&self, source: Option<IpAddr>) {
        if let Some(s) = source {
            self.limiter.charge(s, Instant::now());
        }
    }

    /// The client's address: the peer's, or, when the peer is a trusted proxy, the right-most address of
    /// `X-Forwarded-For` that is not a trusted proxy (the left part of that header is whatever the client
    /// wrote, so only what the trusted proxies appended counts).
    pub(crate) fn source(&self, peer: Option<SocketAddr>, headers: &HeaderMap) -> Option<IpAddr> {
        let peer = peer?.ip().to_canonical();
        let trusted = |ip: IpAddr| self.trusted_proxies.iter().any(|c| c.contains(ip));
        if !trusted(peer) {
            return Some(peer);
        }
        let mut hops: Vec<&str> = Vec::new();
        for value in headers.get_all("x-forwarded-for") {
            let Ok(text) = value.to_str() else { return Some(peer) };
            hops.extend(text.split(',').map(str::trim));
        }
        for hop in hops.iter().rev() {
            let Ok(ip) = hop.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() else {
                // Not an address: the hop before it cannot be trusted to have written it.
                return Some(peer);
            };
            let ip = ip.to_canonical();
            if !trusted(ip) {
                return Some(ip);
            }
        }
        Some(peer)
    }
}

/// `sha256=` followed by 64 hex digits (anything else cannot be a valid signature).
fn well_formed_signature(v: &[u8]) -> bool {
    let v = v.trim_ascii();
    v.strip_prefix(b"sha256=").is_some_and(|hex| hex.len() == 64 && hex.iter().all(u8::is_ascii_hexdigit))
}

/// The `Content-Length` a request declares, if any.
pub(crate) fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// Per-source token buckets of badly signed requests: each source may send `burst` of them at once and one
/// more every `60 / per_minute` seconds; past that its requests are refused (429) until a token is back.
/// Sources are IPv4 addresses and IPv6 /64 networks (one host usually holds a whole /64). Memory is bounded:
/// at most `max_sources` buckets; when full, buckets that refilled are forgotten (at most once a second), and
/// a new source finding no room is not tracked (its requests still cost only a header check or one bounded
/// body read, within the endpoint's concurrency limit).
pub(crate) struct SourceLimiter {
    burst: f64,
    per_second: f64,
    max_sources: usize,
    state: Mutex<Sources>,
}

struct Sources {
    buckets: HashMap<IpAddr, Bucket>,
    last_sweep: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl SourceLimiter {
    pub(crate) fn new(burst: u32, per_minute: u32, max_sources: usize) -> SourceLimiter {
        SourceLimiter {
            burst: f64::from(burst.max(1)),
            per_second: f64::from(per_minute.max(1)) / 60.0,
            max_sources: max_sources.max(1),
            state: Mutex::new(Sources { buckets: HashMap::new(), last_sweep: None }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tokens(&self, b: &Bucket, now: Instant) -> f64 {
        (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.per_second).min(self.burst)
    }

    /// None while `source` is within its budget; else how long until it may send again.
    pub(crate) fn limited(&self, source: IpAddr, now: Instant) -> Option<Duration> {
        let sources = self.lock();
        let bucket = sources.buckets.get(&source_key(source))?;
        let tokens = self.tokens(bucket, now);
        (tokens < 1.0).then(|| Duration::from_secs_f64((1.0 - tokens) / self.per_second))
    }

    /// Takes one token from `source`'s bucket (a new source starts full).
    pub(crate) fn charge(&self, source: IpAddr, now: Instant) {
        let key = source_key(source);
        let mut sources = self.lock();
        if !sources.buckets.contains_key(&key) && sources.buckets.len() >= self.max_sources {
            let due = sources.last_sweep.is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1));
            if due {
                sources.last_sweep = Some(now);
                let full = self.burst;
                let per_second = self.per_second;
                sources
                    .buckets
                    .retain(|_, b| b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_second < full);
            }
            if sources.buckets.len() >= self.max_sources {
                return;
            }
        }
        let tokens = match sources.buckets.get(&key) {
            Some(b) => self.tokens(b, now),
            None => self.burst,
        };
        sources.buckets.insert(key, Bucket { tokens: (tokens - 1.0).max(0.0), at: now });
    }

    /// Sources tracked now.
    pub(crate) fn tracked(&self) -> usize {
        self.lock().buckets.len()
    }
}

/// The bucket key of an address: itself for IPv4, its /64 network for IPv6.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

/// A body that went past its cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TooLarge {
    /// Its first bytes (up to the prefix asked for).
    pub prefix: Bytes,
    /// Bytes received when reading stopped (a lower bound of its size).
    pub seen: usize,
}

/// Why a body could not be read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadError {
    TooLarge(TooLarge),
    /// The client stopped sending, or the connection failed.
    Failed,
}

/// Reads `body` whole if it is at most `cap` bytes, checking the cap as the chunks arrive (a body without
/// `Content-Length` cannot make ingest hold more than `cap` plus one chunk). Past the cap it stops and returns
/// the first `keep` bytes and the count so far.
pub(crate) async fn read_capped(body: Body, cap: usize, keep: usize) -> Result<Bytes, ReadError> {
    let mut stream = body.into_data_stream();
    let mut out = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| ReadError::Failed)?;
        if out.len() + chunk.len() > cap {
            let seen = out.len() + chunk.len();
            out.extend_from_slice(&chunk[..chunk.len().min(keep.saturating_sub(out.len()))]);
            out.truncate(keep);
            return Err(ReadError::TooLarge(TooLarge { prefix: out.freeze(), seen }));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn a_source_gets_its_burst_then_one_per_refill_and_others_are_untouched() {
        let limiter = SourceLimiter::new(3, 60, 100);
        let t0 = Instant::now();
        let flood = ip("203.0.113.9");
        for _ in 0..3 {
            assert_eq!(limiter.limited(flood, t0), None);
            limiter.charge(flood, t0);
        }
        let wait = limiter.limited(flood, t0).expect("over the burst");
        assert_eq!(wait, Duration::from_secs(1), "one token per second at 60 a minute");
        assert_eq!(limiter.limited(ip("198.51.100.7"), t0), None, "another source is not limited");
        assert_eq!(limiter.limited(flood, t0 + Duration::from_secs(1)), None, "a token is back");
        // One IPv6 host is one /64.
        limiter.charge(ip("2001:db8:1:2::1"), t0);
        limiter.charge(ip("2001:db8:1:2::ffff"), t0);
        limiter.charge(ip("2001:db8:1:2:aaaa::"), t0);
        assert!(limiter.limited(ip("2001:db8:1:2::42"), t0).is_some());
        assert!(limiter.limited(ip("2001:db8:1:3::42"), t0).is_none());
        // The IPv4-mapped form of an address is that address.
        assert!(limiter.limited(ip("::ffff:203.0.113.9"), t0).is_some());
    }

    #[test]
    fn the_table_never_grows_past_its_bound() {
        let limiter = SourceLimiter::new(2, 60, 4);
        let t0 = Instant::now();
        for i in 0..1000u32 {
            limiter.charge(IpAddr::from(i.to_be_bytes()), t0);
        }
        assert_eq!(limiter.tracked(), 4);
        // Once the tracked ones refilled, room is made for new ones (a sweep at most once a second).
        let later = t0 + Duration::from_secs(5);
        limiter.charge(ip("192.0.2.200"), later);
        limiter.charge(ip("192.0.2.200"), later);
        assert!(limiter.limited(ip("192.0.2.200"), later).is_some());
        assert!(limiter.tracked() <= 4);
    }

    fn guard(trusted: &[&str]) -> WebhookGuard {
        let mut cfg = crate::Config::load(None, &Default::default()).expect("defaults").webhook;
        cfg.trusted_proxies = trusted.iter().map(|s| s.to_string()).collect();
        WebhookGuard::new(&cfg).expect("guard")
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"), v.parse().expect("value"));
        }
        h
    }

    #[test]
    fn the_source_is_the_peer_unless_a_trusted_proxy_forwarded_the_request() {
        let peer: SocketAddr = "10.1.2.3:5555".parse().expect("addr");
        let forwarded = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.5"), ("x-forwarded-for", "10.1.9.9")]);
        assert_eq!(guard(&[]).source(Some(peer), &forwarded), Some(ip("10.1.2.3")), "no proxy trusted");
        let g = guard(&["10.1.0.0/16"]);
        assert_eq!(g.source(Some(peer), &forwarded), Some(ip("203.0.113.5")), "right-most untrusted hop");
        assert_eq!(g.source(Some(peer), &headers(&[])), Some(ip("10.1.2.3")), "no header: the proxy itself");
        let junk = headers(&[("x-forwarded-for", "203.0.113.5, not-an-ip")]);
        assert_eq!(g.source(Some(peer), &junk), Some(ip("10.1.2.3")));
        assert_eq!(g.source(None, &forwarded), None);
    }

    #[test]
    fn requests_are_refused_before_their_body_in_order() {
        let g = guard(&[]);
        let peer: Option<SocketAddr> = Some("192.0.2.1:1".parse().expect("addr"));
        let sig = format!("sha256={}", "ab".repeat(32));
        assert_eq!(g.admit(peer, &headers(&[])).err(), Some(Refusal::MissingSignature));
        let bad = headers(&[(SIGNATURE_HEADER, "sha256=00")]);
        assert_eq!(g.admit(peer, &bad).err(), Some(Refusal::MalformedSignature));
        let big = headers(&[(SIGNATURE_HEADER, &sig), ("content-length", "3145729")]);
        assert_eq!(g.admit(peer, &big).err(), Some(Refusal::TooLarge));
        let ok = headers(&[(SIGNATURE_HEADER, &sig), ("content-length", "3145728")]);
        let slots: Vec<Admitted> = (0..32).map(|_| g.admit(peer, &ok).expect("admitted")).collect();
        assert_eq!(g.admit(peer, &ok).err(), Some(Refusal::Busy), "every reading slot taken");
        drop(slots);
        assert!(g.admit(peer, &ok).is_ok());
        for _ in 0..20 {
            g.charge(peer.map(|p| p.ip()));
        }
        assert!(matches!(g.admit(peer, &ok).err(), Some(Refusal::RateLimited(_))));
    }

    #[tokio::test]
    async fn bodies_are_cut_at_their_cap_keeping_a_prefix() {
        let whole = read_capped(Body::from(vec![7u8; 100]), 100, 10).await.expect("at the cap");
        assert_eq!(whole.len(), 100);
        let chunks = futures::stream::iter((0..5).map(|i| Ok::<_, std::io::Error>(Bytes::from(vec![i as u8; 40]))));
        let err = read_capped(Body::from_stream(chunks), 100, 50).await.expect_err("over the cap");
        let ReadError::TooLarge(t) = err else { panic!("{err:?}") };
        assert_eq!(t.seen, 120);
        assert_eq!(t.prefix.len(), 50);
        assert_eq!(&t.prefix[..41], &[[0u8; 40].as_slice(), &[1u8]].concat()[..]);
    }
}
