//! Names outside the cluster zone: upstream servers from a resolv.conf-style file, tried in
//! turn (a server that timed out is skipped for a while), over UDP with a TCP retry when the
//! answer is truncated, behind a bounded cache and a cap on queries in flight.
//!
//! Health: an upstream that times out or fails is marked down for
//! [`ForwarderConfig::down_for`] and skipped until then (unless every upstream is down).
//! With [`ForwarderConfig::probe_interval`], a down upstream is also probed (`. NS`, as
//! CoreDNS's forward plugin does) until it answers anything, and is back at once, without
//! waiting for the timer or a client query.
//!
//! Optional, off by default: prefetch ([`Prefetch`]: a popular entry is refreshed in the
//! background shortly before its TTL ends, so its clients never wait for the upstream) and
//! serve-stale ([`ForwarderConfig::serve_stale`], RFC 8767: when every upstream fails, an
//! expired entry is answered with a 30 s TTL, and for the next 30 s without asking again).
//!
//! Time comes from a [`Clock`], so the cache's behaviour over TTLs is tested without sleeping.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use crate::metrics::DnsMetrics;

/// Upstream addresses from resolv.conf text: every `nameserver` line (port 53). As an
/// extension, `nameserver 192.0.2.1:5353` / `nameserver [2001:db8::1]:5353` name a port.
pub fn parse_resolv_conf(text: &str) -> Result<Vec<SocketAddr>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split(['#', ';']).next().unwrap_or_default().trim();
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            continue;
        }
        let Some(value) = words.next() else {
            return Err(format!("line {}: nameserver without an address", n + 1));
        };
        let addr = if let Ok(sa) = value.parse::<SocketAddr>() {
            sa
        } else if let Ok(ip) = value.parse::<IpAddr>() {
            SocketAddr::new(ip, 53)
        } else {
            return Err(format!("line {}: {value:?} is not an address", n + 1));
        };
        out.push(addr);
    }
    if out.is_empty() {
        return Err("no nameserver lines".into());
    }
    Ok(out)
}

/// Forwarding and cache limits.
#[derive(Debug, Clone)]
pub struct ForwarderConfig {
    pub upstreams: Vec<SocketAddr>,
    /// How long one attempt at one upstream may take.
    pub attempt_timeout: Duration,
    /// How long an upstream that failed is tried only after the others.
    pub down_for: Duration,
    /// Upstream exchanges in flight at most; beyond, clients get REFUSED at once.
    pub max_in_flight: usize,
    /// Cache entries at most.
    pub cache_entries: usize,
    /// Positive answers are cached for their smallest TTL, at most this.
    pub max_ttl: Duration,
    /// Negative answers (NXDOMAIN, NODATA) for the SOA minimum, at most this.
    pub max_negative_ttl: Duration,
    /// Ask over TCP only (a node-local cache to the cluster DNS: no UDP conntrack entry per
    /// query through the ClusterIP's DNAT, and no lost datagram to wait 5 s for).
    pub tcp_only: bool,
    /// Refresh popular entries before they expire (None: off).
    pub prefetch: Option<Prefetch>,
    /// Keep expired entries this long to answer when every upstream fails (RFC 8767; None:
    /// off). The RFC suggests 1 to 3 days.
    pub serve_stale: Option<Duration>,
    /// Probe a down upstream this often until it answers (None: only the `down_for` timer).
    pub probe_interval: Option<Duration>,
    /// Where cache hits and misses, upstream failures and queries in flight are counted.
    pub metrics: Arc<DnsMetrics>,
}

/// When a cached entry is refreshed ahead of its expiry: once it has been answered from the
/// cache `min_hits` times and less than `percent` % of its TTL is left (Unbound and CoreDNS
/// use 10 %). The query that notices it is answered from the cache at once; the refresh runs
/// in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefetch {
    pub min_hits: u32,
    pub percent: u8,
}

impl Default for Prefetch {
    fn default() -> Self {
        Prefetch {
            min_hits: 2,
            percent: 10,
        }
    }
}

/// The TTL of a stale answer, and how long after serving one the upstreams are not asked
/// again for that name (RFC 8767's recommended stale answer TTL and failure recheck timer).
pub const STALE_TTL: u32 = 30;

impl ForwarderConfig {
    pub fn new(upstreams: Vec<SocketAddr>) -> Self {
        ForwarderConfig {
            upstreams,
            attempt_timeout: Duration::from_millis(1500),
            down_for: Duration::from_secs(10),
            max_in_flight: 1000,
            cache_entries: 10_000,
            max_ttl: Duration::from_secs(3600),
            max_negative_ttl: Duration::from_secs(30),
            tcp_only: false,
            prefetch: None,
            serve_stale: None,
            probe_interval: Some(Duration::from_secs(1)),
            metrics: Arc::new(DnsMetrics::new()),
        }
    }
}

/// Why a forwarded query got no answer.
#[derive(Debug, PartialEq, Eq)]
pub enum ForwardError {
    /// Too many upstream exchanges in flight.
    Overloaded,
    /// Every upstream failed or timed out.
    AllFailed,
}

/// An upstream's answer as the cache keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub rcode: ResponseCode,
    pub answers: Vec<Record>,
    pub authority: Vec<Record>,
}

type CacheKey = (Name, RecordType, DNSClass);

#[derive(Debug)]
struct Entry {
    answer: Upstream,
    stored: Instant,
    expires: Instant,
    /// Answers from the cache since stored.
    hits: u32,
    /// A prefetch of this entry has been started.
    refreshing: bool,
    /// Served stale: until then, answer stale without asking the upstreams.
    stale_until: Option<Instant>,
}

/// What the cache has for a question.
#[derive(Debug, PartialEq)]
pub enum Cached {
    /// A fresh answer, TTLs counted down.
    Fresh(Upstream),
    /// A fresh answer, and the entry is due for a prefetch (returned once per entry).
    Refresh(Upstream),
    /// An expired answer served stale recently: answer it again (TTL [`STALE_TTL`])
    /// without asking the upstreams.
    Stale(Upstream),
    Miss,
}

/// A bounded TTL cache. Pure (the caller passes the time), so it is tested without sleeping.
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<CacheKey, Entry>,
    capacity: usize,
    max_ttl: Duration,
    max_negative_ttl: Duration,
    prefetch: Option<Prefetch>,
    /// How long past expiry an entry is kept for serve-stale (zero: off).
    stale_for: Duration,
}

impl Cache {
    pub fn new(capacity: usize, max_ttl: Duration, max_negative_ttl: Duration) -> Self {
        Cache {
            entries: HashMap::new(),
            capacity,
            max_ttl,
            max_negative_ttl,
            prefetch: None,
            stale_for: Duration::ZERO,
        }
    }

    /// Enables prefetch decisions ([`Cached::Refresh`]).
    pub fn with_prefetch(mut self, prefetch: Option<Prefetch>) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Keeps expired entries `stale_for` longer for [`Cache::stale`].
    pub fn with_serve_stale(mut self, stale_for: Option<Duration>) -> Self {
        self.stale_for = stale_for.unwrap_or_default();
        self
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn key(q: &Query) -> CacheKey {
        (q.name().to_lowercase(), q.query_type(), q.query_class())
    }

    /// The cached answer with TTLs counted down to what is left, or `None`.
    pub fn get(&mut self, q: &Query, now: Instant) -> Option<Upstream> {
        match self.lookup(q, now) {
            Cached::Fresh(a) | Cached::Refresh(a) => Some(a),
            Cached::Stale(_) | Cached::Miss => None,
        }
    }

    /// What the cache has for `q` at `now` (see [`Cached`]).
    pub fn lookup(&mut self, q: &Query, now: Instant) -> Cached {
        let key = Self::key(q);
        let Some(e) = self.entries.get_mut(&key) else {
            return Cached::Miss;
        };
        if now >= e.expires {
            if now >= e.expires + self.stale_for {
                self.entries.remove(&key);
                return Cached::Miss;
            }
            if e.stale_until.is_some_and(|t| now < t) {
                return Cached::Stale(stale_copy(&e.answer));
            }
            return Cached::Miss;
        }
        e.hits = e.hits.saturating_add(1);
        let elapsed = u32::try_from(now.duration_since(e.stored).as_secs()).unwrap_or(u32::MAX);
        let left = e.expires.duration_since(now);
        let left_secs = u32::try_from(left.as_secs()).unwrap_or(u32::MAX);
        let mut answer = e.answer.clone();
        for r in answer.answers.iter_mut().chain(answer.authority.iter_mut()) {
            r.ttl = r.ttl.saturating_sub(elapsed).min(left_secs.max(1));
        }
        let lifetime = e.expires.duration_since(e.stored);
        let due = self.prefetch.is_some_and(|p| {
            e.hits >= p.min_hits
                && left.as_millis() * 100 <= lifetime.as_millis() * u128::from(p.percent)
        });
        if due && !e.refreshing {
            e.refreshing = true;
            return Cached::Refresh(answer);
        }
        Cached::Fresh(answer)
    }

    /// For serve-stale: the expired (within the stale window) answer to `q` with TTLs of
    /// [`STALE_TTL`], and `q` is answered stale without asking until `STALE_TTL` from now.
    /// None if there is no such entry (or serve-stale is off).
    pub fn stale(&mut self, q: &Query, now: Instant) -> Option<Upstream> {
        let e = self.entries.get_mut(&Self::key(q))?;
        if now < e.expires || now >= e.expires + self.stale_for {
            return None;
        }
        e.stale_until = Some(now + Duration::from_secs(STALE_TTL.into()));
        Some(stale_copy(&e.answer))
    }

    /// Caches NOERROR and NXDOMAIN answers (others are not cached) for their TTL within the
    /// caps. When full, expired entries go first, then arbitrary ones: memory stays bounded.
    pub fn put(&mut self, q: &Query, answer: Upstream, now: Instant) {
        let Some(ttl) = self.ttl_of(&answer) else {
            return;
        };
        if ttl.is_zero() || self.capacity == 0 {
            return;
        }
        if self.entries.len() >= self.capacity {
            self.entries.retain(|_, e| e.expires > now);
        }
        while self.entries.len() >= self.capacity {
            let Some(k) = self.entries.keys().next().cloned() else {
                break;
            };
            self.entries.remove(&k);
        }
        self.entries.insert(
            Self::key(q),
            Entry {
                answer,
                stored: now,
                expires: now + ttl,
                hits: 0,
                refreshing: false,
                stale_until: None,
            },
        );
    }

    /// A prefetch that failed: the entry may be prefetched again.
    fn refresh_failed(&mut self, q: &Query) {
        if let Some(e) = self.entries.get_mut(&Self::key(q)) {
            e.refreshing = false;
        }
    }

    fn ttl_of(&self, a: &Upstream) -> Option<Duration> {
        let negative = a.rcode == ResponseCode::NXDomain || a.answers.is_empty();
        match a.rcode {
            ResponseCode::NoError | ResponseCode::NXDomain => {}
            _ => return None,
        }
        if negative {
            // RFC 2308: the SOA's minimum, bounded by the SOA record's own TTL.
            let soa_ttl = a.authority.iter().find_map(|r| match &r.data {
                RData::SOA(soa) => Some(soa.minimum.min(r.ttl)),
                _ => None,
            });
            let secs = soa_ttl.unwrap_or(5);
            return Some(Duration::from_secs(secs.into()).min(self.max_negative_ttl));
        }
        let secs = a.answers.iter().map(|r| r.ttl).min().unwrap_or(0);
        Some(Duration::from_secs(secs.into()).min(self.max_ttl))
    }
}

/// `a` with every TTL set to [`STALE_TTL`].
fn stale_copy(a: &Upstream) -> Upstream {
    let mut a = a.clone();
    for r in a.answers.iter_mut().chain(a.authority.iter_mut()) {
        r.ttl = STALE_TTL;
    }
    a
}

struct UpstreamState {
    addr: SocketAddr,
    down_until: Mutex<Option<Instant>>,
    /// A probe task runs for this upstream.
    probing: AtomicBool,
}

/// Where the forwarder reads the time (tests pass a clock they move by hand).
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// The forwarder; share it behind an `Arc` (prefetches and probes run as tasks holding it).
pub struct Forwarder {
    config: ForwarderConfig,
    upstreams: Vec<UpstreamState>,
    cache: Mutex<Cache>,
    in_flight: Semaphore,
    clock: Clock,
    /// Itself, for the background tasks (which end when the forwarder is dropped).
    this: Weak<Forwarder>,
}

impl Forwarder {
    pub fn new(config: ForwarderConfig) -> Arc<Self> {
        Self::with_clock(config, Arc::new(Instant::now))
    }

    pub fn with_clock(config: ForwarderConfig, clock: Clock) -> Arc<Self> {
        Arc::new_cyclic(|this| Forwarder {
            upstreams: config
                .upstreams
                .iter()
                .map(|a| UpstreamState {
                    addr: *a,
                    down_until: Mutex::new(None),
                    probing: AtomicBool::new(false),
                })
                .collect(),
            cache: Mutex::new(
                Cache::new(
                    config.cache_entries,
                    config.max_ttl,
                    config.max_negative_ttl,
                )
                .with_prefetch(config.prefetch)
                .with_serve_stale(config.serve_stale),
            ),
            in_flight: Semaphore::new(config.max_in_flight),
            clock,
            this: this.clone(),
            config,
        })
    }

    fn now(&self) -> Instant {
        (self.clock)()
    }

    /// The answer to `q` if the cache has one to give now (fresh, or stale being served),
    /// starting a prefetch when one is due. Needs a tokio runtime context.
    pub fn cached(&self, q: &Query) -> Option<Upstream> {
        let cached = {
            let mut cache = self.lock_cache();
            let cached = cache.lookup(q, self.now());
            self.config.metrics.set_cache_entries(cache.len());
            cached
        };
        self.config
            .metrics
            .cache_lookup(!matches!(cached, Cached::Miss));
        match cached {
            Cached::Fresh(hit) | Cached::Stale(hit) => Some(hit),
            Cached::Refresh(hit) => {
                self.prefetch(q.clone());
                Some(hit)
            }
            Cached::Miss => None,
        }
    }

    /// Resolves `q` from the cache or the upstreams; with serve-stale, an expired entry when
    /// every upstream fails.
    pub async fn resolve(&self, q: &Query) -> Result<Upstream, ForwardError> {
        if let Some(hit) = self.cached(q) {
            return Ok(hit);
        }
        self.resolve_missed(q).await
    }

    /// [`Forwarder::resolve`] for a query [`Forwarder::cached`] has just missed: the upstreams
    /// (the miss is counted once).
    pub async fn resolve_missed(&self, q: &Query) -> Result<Upstream, ForwardError> {
        match self.ask_upstreams(q).await {
            Err(ForwardError::AllFailed) => self
                .lock_cache()
                .stale(q, self.now())
                .inspect(|_| tracing::debug!(name = %q.name(), "serving stale"))
                .ok_or(ForwardError::AllFailed),
            other => other,
        }
    }

    /// Refreshes `q`'s entry in the background.
    fn prefetch(&self, q: Query) {
        let Some(this) = self.this.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            if this.ask_upstreams(&q).await.is_err() {
                this.lock_cache().refresh_failed(&q);
            }
        });
    }

    /// Asks the upstreams in turn and caches the first NOERROR or NXDOMAIN answer.
    async fn ask_upstreams(&self, q: &Query) -> Result<Upstream, ForwardError> {
        let _permit = self
            .in_flight
            .try_acquire()
            .map_err(|_| ForwardError::Overloaded)?;
        let _counted = self.config.metrics.in_flight();
        for i in self.attempt_order(self.now()) {
            let up = &self.upstreams[i];
            match exchange(
                up.addr,
                &upstream_query(q, true),
                self.config.attempt_timeout,
                self.config.tcp_only,
            )
            .await
            {
                Ok(answer)
                    if matches!(answer.rcode, ResponseCode::NoError | ResponseCode::NXDomain) =>
                {
                    *lock(&up.down_until) = None;
                    tracing::debug!(upstream = %up.addr, rcode = %answer.rcode, "upstream answered");
                    let mut cache = self.lock_cache();
                    cache.put(q, answer.clone(), self.now());
                    self.config.metrics.set_cache_entries(cache.len());
                    return Ok(answer);
                }
                Ok(answer) => {
                    tracing::debug!(upstream = %up.addr, rcode = %answer.rcode, "upstream refused or failed");
                    self.config.metrics.upstream_failed(up.addr);
                }
                Err(e) => {
                    tracing::debug!(upstream = %up.addr, "upstream failed: {e}");
                    self.config.metrics.upstream_failed(up.addr);
                    *lock(&up.down_until) = Some(self.now() + self.config.down_for);
                    self.probe(i);
                }
            }
        }
        Err(ForwardError::AllFailed)
    }

    /// Starts probing upstream `i` (unless probes are off or one already runs): every
    /// `probe_interval`, `. NS` without recursion; any matching answer, even REFUSED, means
    /// the server is back.
    fn probe(&self, i: usize) {
        let Some(interval) = self.config.probe_interval else {
            return;
        };
        if self.upstreams[i].probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = self.this.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(this) = weak.upgrade() else {
                    return;
                };
                let up = &this.upstreams[i];
                let probe = upstream_query(&Query::query(Name::root(), RecordType::NS), false);
                let answered = exchange(
                    up.addr,
                    &probe,
                    this.config.attempt_timeout,
                    this.config.tcp_only,
                )
                .await
                .is_ok();
                if answered {
                    tracing::info!(upstream = %up.addr, "upstream answers probes again");
                    *lock(&up.down_until) = None;
                    up.probing.store(false, Ordering::Release);
                    return;
                }
            }
        });
    }

    /// Whether each upstream is considered up now (file order).
    pub fn upstreams_up(&self) -> Vec<(SocketAddr, bool)> {
        let now = self.now();
        self.upstreams
            .iter()
            .map(|u| (u.addr, lock(&u.down_until).is_none_or(|t| t <= now)))
            .collect()
    }

    /// Healthy upstreams in file order; only when every upstream is marked down, all of them,
    /// soonest back first (a query must not wait for a dead server while a live one has
    /// already answered, even REFUSED).
    fn attempt_order(&self, now: Instant) -> Vec<usize> {
        let mut order: Vec<(Option<Instant>, usize)> = self
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| (lock(&u.down_until).filter(|t| *t > now), i))
            .collect();
        if order.iter().any(|(down, _)| down.is_none()) {
            order.retain(|(down, _)| down.is_none());
        }
        order.sort();
        order.into_iter().map(|(_, i)| i).collect()
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        lock(&self.cache)
    }

    /// Where this forwarder counts (its config's).
    pub fn metrics(&self) -> &Arc<DnsMetrics> {
        &self.config.metrics
    }

    pub fn cache_len(&self) -> usize {
        self.lock_cache().len()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The query sent upstream: `rd` for client queries, not for health probes.
fn upstream_query(q: &Query, rd: bool) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = rd;
    m.add_query(q.clone());
    let mut e = Edns::new();
    e.set_max_payload(crate::respond::SERVER_UDP_PAYLOAD);
    m.set_edns(e);
    m
}

/// Whether `reply` answers `req` (same ID and question): anything else on the socket is
/// ignored, which defeats blind spoofing with a wrong ID.
fn matches(req: &Message, reply: &Message) -> bool {
    reply.metadata.message_type == MessageType::Response
        && reply.metadata.id == req.metadata.id
        && reply.queries == req.queries
}

/// One exchange with one upstream: UDP, then TCP if the UDP answer was truncated (or TCP
/// only).
async fn exchange(
    addr: SocketAddr,
    req: &Message,
    timeout: Duration,
    tcp_only: bool,
) -> std::io::Result<Upstream> {
    let bytes = req
        .to_vec()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let deadline = tokio::time::Instant::now() + timeout;
    let reply = if tcp_only {
        None
    } else {
        Some(
            tokio::time::timeout_at(deadline, udp_exchange(addr, req, &bytes))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??,
        )
    };
    let reply = match reply {
        Some(reply) if !reply.metadata.truncation => reply,
        _ => tokio::time::timeout_at(deadline, tcp_exchange(addr, req, &bytes))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??,
    };
    Ok(Upstream {
        rcode: reply.metadata.response_code,
        answers: reply.answers,
        authority: reply.authorities,
    })
}

async fn udp_exchange(addr: SocketAddr, req: &Message, bytes: &[u8]) -> std::io::Result<Message> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let sock = UdpSocket::bind(bind).await?;
    sock.connect(addr).await?;
    sock.send(bytes).await?;
    let mut buf = vec![0u8; 65535];
    loop {
        let n = sock.recv(&mut buf).await?;
        if let Ok(reply) = Message::from_vec(&buf[..n]) {
            if matches(req, &reply) {
                return Ok(reply);
            }
        }
    }
}

async fn tcp_exchange(addr: SocketAddr, req: &Message, bytes: &[u8]) -> std::io::Result<Message> {
    let mut stream = TcpStream::connect(addr).await?;
    let len = u16::try_from(bytes.len()).map_err(std::io::Error::other)?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    stream.write_all(&framed).await?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).await?;
    let reply = Message::from_vec(&buf).map_err(|e| std::io::Error::other(e.to_string()))?;
    if !matches(req, &reply) {
        return Err(std::io::Error::other("TCP reply does not match the query"));
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::SOA;

    #[test]
    fn resolv_conf() {
        let text = "# comment\nsearch x\nnameserver 10.0.0.2\nnameserver fd00::53 # tail\n\
                    nameserver 192.0.2.1:5353\noptions ndots:5\n";
        assert_eq!(
            parse_resolv_conf(text).unwrap(),
            vec![
                "10.0.0.2:53".parse().unwrap(),
                "[fd00::53]:53".parse().unwrap(),
                "192.0.2.1:5353".parse().unwrap()
            ]
        );
        assert!(parse_resolv_conf("search a\n").is_err());
        assert!(parse_resolv_conf("nameserver nope\n")
            .unwrap_err()
            .contains("line 1"));
    }

    fn q(name: &str) -> Query {
        Query::query(Name::from_ascii(name).unwrap(), RecordType::A)
    }

    fn a(ttl: u32) -> Upstream {
        Upstream {
            rcode: ResponseCode::NoError,
            answers: vec![Record::from_rdata(
                Name::from_ascii("x.example.").unwrap(),
                ttl,
                RData::A(std::net::Ipv4Addr::new(192, 0, 2, 1).into()),
            )],
            authority: vec![],
        }
    }

    fn nx(soa_min: u32) -> Upstream {
        let n = Name::from_ascii("example.").unwrap();
        Upstream {
            rcode: ResponseCode::NXDomain,
            answers: vec![],
            authority: vec![Record::from_rdata(
                n.clone(),
                3600,
                RData::SOA(SOA::new(n.clone(), n, 1, 1, 1, 1, soa_min)),
            )],
        }
    }

    #[test]
    fn cache_counts_ttls_down_and_caps_them() {
        let mut c = Cache::new(10, Duration::from_secs(60), Duration::from_secs(30));
        let t0 = Instant::now();
        c.put(&q("x.example."), a(300), t0);
        // Case-insensitive key; TTL capped at 60 s and counted down.
        let hit = c
            .get(&q("X.Example."), t0 + Duration::from_secs(10))
            .unwrap();
        assert_eq!(hit.answers[0].ttl, 50);
        assert!(c
            .get(&q("x.example."), t0 + Duration::from_secs(60))
            .is_none());
        // Negative: the SOA minimum, capped at 30 s.
        c.put(&q("nx.example."), nx(900), t0);
        assert!(c
            .get(&q("nx.example."), t0 + Duration::from_secs(29))
            .is_some());
        assert!(c
            .get(&q("nx.example."), t0 + Duration::from_secs(30))
            .is_none());
        c.put(&q("nx2.example."), nx(2), t0);
        assert!(c
            .get(&q("nx2.example."), t0 + Duration::from_secs(2))
            .is_none());
        // SERVFAIL and zero TTLs are not cached.
        let mut fail = a(300);
        fail.rcode = ResponseCode::ServFail;
        c.put(&q("f.example."), fail, t0);
        c.put(&q("z.example."), a(0), t0);
        assert!(c.is_empty());
    }

    #[test]
    fn cache_stays_within_its_entry_bound() {
        let mut c = Cache::new(3, Duration::from_secs(60), Duration::from_secs(30));
        let t0 = Instant::now();
        for i in 0..10 {
            c.put(&q(&format!("n{i}.example.")), a(60), t0);
            assert!(c.len() <= 3);
        }
        // The newest entry is always kept.
        assert!(c.get(&q("n9.example."), t0).is_some());
    }
}

#[cfg(test)]
mod exchange_tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A UDP upstream on 127.0.0.1 answering every A query with 192.0.2.1 (TTL 60), counting
    /// queries; `silent` ones count but never answer.
    async fn upstream(silent: bool) -> (SocketAddr, Arc<AtomicUsize>) {
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let (n, peer) = sock.recv_from(&mut buf).await.unwrap();
                seen.fetch_add(1, Ordering::SeqCst);
                if silent {
                    continue;
                }
                let req = Message::from_vec(&buf[..n]).unwrap();
                let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
                resp.add_queries(req.queries.iter().cloned());
                resp.add_answer(Record::from_rdata(
                    req.queries[0].name().clone(),
                    60,
                    RData::A(std::net::Ipv4Addr::new(192, 0, 2, 1).into()),
                ));
                sock.send_to(&resp.to_vec().unwrap(), peer).await.unwrap();
            }
        });
        (addr, count)
    }

    fn q(name: &str) -> Query {
        Query::query(Name::from_ascii(name).unwrap(), RecordType::A)
    }

    #[tokio::test]
    async fn fails_over_marks_down_and_caches() {
        let (dead, dead_count) = upstream(true).await;
        let (live, live_count) = upstream(false).await;
        let mut cfg = ForwarderConfig::new(vec![dead, live]);
        cfg.attempt_timeout = Duration::from_millis(300);
        cfg.probe_interval = None;
        let f = Forwarder::new(cfg);
        let started = Instant::now();
        let a = f.resolve(&q("a.example.")).await.unwrap();
        assert_eq!(a.answers.len(), 1);
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(dead_count.load(Ordering::SeqCst), 1);
        // The silent upstream is now skipped: the next name goes straight to the live one.
        let started = Instant::now();
        f.resolve(&q("b.example.")).await.unwrap();
        assert!(started.elapsed() < Duration::from_millis(300));
        assert_eq!(dead_count.load(Ordering::SeqCst), 1);
        assert_eq!(live_count.load(Ordering::SeqCst), 2);
        // Cached: no upstream query.
        f.resolve(&q("A.example.")).await.unwrap();
        assert_eq!(live_count.load(Ordering::SeqCst), 2);
        assert_eq!(f.cache_len(), 2);
    }

    #[tokio::test]
    async fn a_down_upstream_is_skipped_while_another_is_up_and_tried_when_all_are_down() {
        let (dead, dead_count) = upstream(true).await;
        let f = Forwarder::new(ForwarderConfig::new(vec![dead, dead]));
        let now = Instant::now();
        *lock(&f.upstreams[0].down_until) = Some(now + Duration::from_secs(5));
        assert_eq!(f.attempt_order(now), vec![1]);
        *lock(&f.upstreams[1].down_until) = Some(now + Duration::from_secs(3));
        assert_eq!(f.attempt_order(now), vec![1, 0]);
        assert_eq!(f.attempt_order(now + Duration::from_secs(4)), vec![1]);
        assert_eq!(dead_count.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn all_failed_and_overload() {
        let (dead, _) = upstream(true).await;
        let mut cfg = ForwarderConfig::new(vec![dead]);
        cfg.attempt_timeout = Duration::from_millis(100);
        cfg.max_in_flight = 1;
        cfg.probe_interval = None;
        let f = Forwarder::new(cfg);
        let f2 = f.clone();
        let first = tokio::spawn(async move { f2.resolve(&q("x.example.")).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // One exchange in flight fills the cap.
        assert_eq!(
            f.resolve(&q("y.example.")).await,
            Err(ForwardError::Overloaded)
        );
        assert_eq!(first.await.unwrap(), Err(ForwardError::AllFailed));
    }

    /// `tcp_only`: the query goes over TCP, nothing over UDP (a UDP socket on the same port
    /// counts what arrives there).
    #[tokio::test]
    async fn tcp_only_asks_over_tcp() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let udp = UdpSocket::bind(addr).await.unwrap();
        let udp_count = Arc::new(AtomicUsize::new(0));
        let seen = udp_count.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while udp.recv_from(&mut buf).await.is_ok() {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let len = conn.read_u16().await.unwrap() as usize;
            let mut buf = vec![0u8; len];
            conn.read_exact(&mut buf).await.unwrap();
            let req = Message::from_vec(&buf).unwrap();
            let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
            resp.add_queries(req.queries.iter().cloned());
            resp.add_answer(Record::from_rdata(
                req.queries[0].name().clone(),
                60,
                RData::A(std::net::Ipv4Addr::new(192, 0, 2, 7).into()),
            ));
            let out = resp.to_vec().unwrap();
            conn.write_u16(out.len() as u16).await.unwrap();
            conn.write_all(&out).await.unwrap();
        });
        let mut cfg = ForwarderConfig::new(vec![addr]);
        cfg.tcp_only = true;
        cfg.attempt_timeout = Duration::from_millis(500);
        let a = Forwarder::new(cfg).resolve(&q("t.example.")).await.unwrap();
        assert_eq!(a.answers.len(), 1);
        assert_eq!(udp_count.load(Ordering::SeqCst), 0);
    }
}

/// Prefetch, serve-stale and probes against real upstream servers on loopback that the test
/// controls (answering or silent; each answer a new address, so a refreshed entry shows). The
/// cache's time is a hand-moved clock: TTL behaviour is asserted without sleeping through it.
#[cfg(test)]
mod feature_tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::sync::atomic::AtomicUsize;

    /// A UDP upstream on 127.0.0.1: while `answering`, the n-th query gets A 192.0.2.n with
    /// `ttl`; otherwise it is counted and dropped.
    struct TestUpstream {
        addr: SocketAddr,
        queries: Arc<AtomicUsize>,
        answering: Arc<AtomicBool>,
    }

    impl TestUpstream {
        async fn start(ttl: u32, answering: bool) -> Self {
            let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            let addr = sock.local_addr().unwrap();
            let queries = Arc::new(AtomicUsize::new(0));
            let on = Arc::new(AtomicBool::new(answering));
            let (seen, on2) = (queries.clone(), on.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                loop {
                    let (n, peer) = sock.recv_from(&mut buf).await.unwrap();
                    let nth = seen.fetch_add(1, Ordering::SeqCst) + 1;
                    if !on2.load(Ordering::SeqCst) {
                        continue;
                    }
                    let req = Message::from_vec(&buf[..n]).unwrap();
                    let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
                    resp.add_queries(req.queries.iter().cloned());
                    resp.add_answer(Record::from_rdata(
                        req.queries[0].name().clone(),
                        ttl,
                        RData::A(Ipv4Addr::new(192, 0, 2, nth as u8).into()),
                    ));
                    sock.send_to(&resp.to_vec().unwrap(), peer).await.unwrap();
                }
            });
            TestUpstream {
                addr,
                queries,
                answering: on,
            }
        }

        fn count(&self) -> usize {
            self.queries.load(Ordering::SeqCst)
        }
    }

    /// A clock that moves only when the test says.
    fn manual_clock() -> (Clock, Arc<Mutex<Duration>>) {
        let base = Instant::now();
        let offset = Arc::new(Mutex::new(Duration::ZERO));
        let o = offset.clone();
        (Arc::new(move || base + *o.lock().unwrap()), offset)
    }

    fn advance(clock: &Mutex<Duration>, secs: u64) {
        *clock.lock().unwrap() += Duration::from_secs(secs);
    }

    fn q(name: &str) -> Query {
        Query::query(Name::from_ascii(name).unwrap(), RecordType::A)
    }

    fn addr_of(a: &Upstream) -> String {
        match &a.answers[0].data {
            RData::A(ip) => ip.to_string(),
            other => panic!("not an A record: {other:?}"),
        }
    }

    /// Polls `f` (bounded, so a broken feature fails instead of hanging).
    async fn eventually(mut f: impl AsyncFnMut() -> bool) -> bool {
        for _ in 0..500 {
            if f().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    fn config(up: &[&TestUpstream]) -> ForwarderConfig {
        let mut cfg = ForwarderConfig::new(up.iter().map(|u| u.addr).collect());
        cfg.attempt_timeout = Duration::from_millis(200);
        cfg.probe_interval = None;
        cfg
    }

    #[tokio::test]
    async fn prefetch_refreshes_a_popular_entry_before_it_expires() {
        let up = TestUpstream::start(100, true).await;
        let mut cfg = config(&[&up]);
        cfg.prefetch = Some(Prefetch {
            min_hits: 2,
            percent: 10,
        });
        let (clock, time) = manual_clock();
        let f = Forwarder::with_clock(cfg, clock);
        let name = q("popular.example.");
        assert_eq!(addr_of(&f.resolve(&name).await.unwrap()), "192.0.2.1");
        advance(&time, 50);
        // One hit, half the TTL left: nothing to do.
        assert_eq!(addr_of(&f.resolve(&name).await.unwrap()), "192.0.2.1");
        advance(&time, 42);
        // Second hit, 8 % left: answered from the cache at once, refreshed behind it.
        let hit = f.resolve(&name).await.unwrap();
        assert_eq!((addr_of(&hit), hit.answers[0].ttl), ("192.0.2.1".into(), 8));
        assert!(
            eventually(async || addr_of(&f.resolve(&name).await.unwrap()) == "192.0.2.2").await,
            "the entry was not refreshed"
        );
        assert_eq!(up.count(), 2);
        // Past the first answer's expiry: still no client query waits for the upstream.
        advance(&time, 20);
        assert_eq!(addr_of(&f.resolve(&name).await.unwrap()), "192.0.2.2");
        assert_eq!(up.count(), 2);
    }

    #[tokio::test]
    async fn without_prefetch_the_first_query_after_expiry_goes_upstream() {
        let up = TestUpstream::start(100, true).await;
        let (clock, time) = manual_clock();
        let f = Forwarder::with_clock(config(&[&up]), clock);
        let name = q("popular.example.");
        for step in [0, 50, 42] {
            advance(&time, step);
            assert_eq!(addr_of(&f.resolve(&name).await.unwrap()), "192.0.2.1");
        }
        assert_eq!(up.count(), 1);
        advance(&time, 20);
        assert_eq!(addr_of(&f.resolve(&name).await.unwrap()), "192.0.2.2");
        assert_eq!(up.count(), 2);
    }

    #[tokio::test]
    async fn serve_stale_answers_an_expired_entry_when_every_upstream_fails() {
        let up = TestUpstream::start(10, true).await;
        let mut cfg = config(&[&up]);
        cfg.serve_stale = Some(Duration::from_secs(3600));
        let (clock, time) = manual_clock();
        let f = Forwarder::with_clock(cfg, clock);
        let name = q("stale.example.");
        f.resolve(&name).await.unwrap();
        up.answering.store(false, Ordering::SeqCst);
        advance(&time, 20);
        // Expired, the upstream silent: the old answer with the stale TTL.
        let stale = f.resolve(&name).await.unwrap();
        assert_eq!(
            (addr_of(&stale), stale.answers[0].ttl),
            ("192.0.2.1".into(), STALE_TTL)
        );
        assert_eq!(up.count(), 2, "the upstream was asked first");
        // Within the recheck time: stale again, without asking.
        advance(&time, 10);
        assert_eq!(addr_of(&f.resolve(&name).await.unwrap()), "192.0.2.1");
        assert_eq!(up.count(), 2);
        // After it, the upstream is asked again; back up, its answer replaces the stale one.
        advance(&time, 25);
        up.answering.store(true, Ordering::SeqCst);
        assert_eq!(addr_of(&f.resolve(&name).await.unwrap()), "192.0.2.3");
        // Beyond the stale window nothing is served.
        up.answering.store(false, Ordering::SeqCst);
        advance(&time, 3600 + 20);
        assert_eq!(f.resolve(&name).await, Err(ForwardError::AllFailed));
        // A name never answered has nothing stale.
        assert_eq!(
            f.resolve(&q("never.example.")).await,
            Err(ForwardError::AllFailed)
        );
    }

    #[tokio::test]
    async fn without_serve_stale_an_expired_entry_is_not_served() {
        let up = TestUpstream::start(10, true).await;
        let (clock, time) = manual_clock();
        let f = Forwarder::with_clock(config(&[&up]), clock);
        let name = q("stale.example.");
        f.resolve(&name).await.unwrap();
        up.answering.store(false, Ordering::SeqCst);
        advance(&time, 20);
        assert_eq!(f.resolve(&name).await, Err(ForwardError::AllFailed));
    }

    /// The first upstream fails and is marked down for an hour; once it answers again, the
    /// probes bring it back without a client query, and the next query goes to it.
    async fn down_upstream_returns(probes: bool) -> (bool, usize) {
        let first = TestUpstream::start(60, false).await;
        let second = TestUpstream::start(60, true).await;
        let mut cfg = config(&[&first, &second]);
        cfg.down_for = Duration::from_secs(3600);
        cfg.probe_interval = probes.then_some(Duration::from_millis(50));
        let f = Forwarder::new(cfg);
        f.resolve(&q("a.example.")).await.unwrap();
        assert_eq!(f.upstreams_up()[0], (first.addr, false));
        first.answering.store(true, Ordering::SeqCst);
        let came_back = eventually(async || f.upstreams_up()[0].1).await;
        let before = first.count();
        f.resolve(&q("b.example.")).await.unwrap();
        (came_back, first.count() - before)
    }

    #[tokio::test]
    async fn a_down_upstream_is_probed_back_without_client_queries() {
        assert_eq!(down_upstream_returns(true).await, (true, 1));
    }

    #[tokio::test]
    async fn without_probes_a_down_upstream_waits_for_its_timer() {
        assert_eq!(down_upstream_returns(false).await, (false, 0));
    }
}
