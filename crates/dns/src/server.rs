//! The serving loops, our own over hickory-proto's wire format: UDP on blocking threads
//! ([`serve_udp`], batched with recvmmsg/sendmmsg, one SO_REUSEPORT socket per thread), TCP
//! and forwarded queries on tokio.
//!
//! Why not hickory-server: its request path (authority catalog, async trait objects per
//! request) is built for file-backed zones; the cluster zone is one immutable map swapped on
//! change. Zone answers are precomputed as wire bytes ([`crate::wire`]) and served on the
//! receiving thread without decoding or allocating; requests the fast path does not take are
//! decoded and answered by the general path ([`Handler::handle`]). Only forwarded queries
//! become tasks.
//!
//! Bounds (the request path must never be a way to exhaust the server — aardvark-dns's
//! CVE-2026-35406 was a TCP loop): at most [`ServerConfig::max_tcp_connections`]
//! connections (when all are held, a new client takes the slot of the one idle longest, which
//! is closed after its pending answers; with none idle, the new client is closed at once);
//! per connection, a message must arrive whole within
//! [`ServerConfig::tcp_message_timeout`] (so a trickling stream is cut), an idle connection
//! closes after [`ServerConfig::tcp_idle_timeout`], at most
//! [`ServerConfig::tcp_queries_per_connection`] queries are served and at most
//! [`ServerConfig::tcp_in_flight_per_connection`] are worked on concurrently (answers may
//! come back out of order, as RFC 7766 allows).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::rdata::CNAME;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

use crate::cookie::{client_cookie, ClientCookie, CookieSecret};
use crate::forward::{ForwardError, Forwarder};
use crate::hosts::Hosts;
use crate::metrics::{DnsMetrics, Tally, Transport};
use crate::respond::{encode, formerr, parse_request, response, udp_limit, Request};
use crate::rewrite::{self, Rewrite};
use crate::search;
use crate::tcp_slots::{Slot, Slots};
use crate::udp;
use crate::wire::WireZone;
use crate::zone::{Answer, Zone};

/// The current zone and its precomputed wire answers ([`WireZone`]), replaced whole when
/// objects change; readers never see a half-built zone. UDP threads keep their own `Arc` of
/// the wire answers and reload it only when [`ZoneHandle::generation`] moves, so the hot path
/// touches no shared reference count.
#[derive(Clone)]
pub struct ZoneHandle(Arc<Current>);

struct Current {
    served: RwLock<(Arc<Zone>, Arc<WireZone>)>,
    generation: AtomicU64,
}

impl ZoneHandle {
    pub fn new(zone: Zone) -> Self {
        // What the zone build and the objects' parse freed goes back before the wire answers
        // are added on top.
        release_free_memory();
        let wire = Arc::new(WireZone::build(&zone));
        let handle = ZoneHandle(Arc::new(Current {
            served: RwLock::new((Arc::new(zone), wire)),
            generation: AtomicU64::new(0),
        }));
        release_free_memory();
        handle
    }

    pub fn load(&self) -> Arc<Zone> {
        self.0
            .served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    /// The wire answers of the current zone.
    pub fn load_wire(&self) -> Arc<WireZone> {
        self.0
            .served
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Counts [`ZoneHandle::store`]s.
    pub fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }

    /// Swaps in `zone`; its wire answers are encoded first, outside the lock.
    pub fn store(&self, zone: Zone) {
        release_free_memory();
        let wire = Arc::new(WireZone::build(&zone));
        let old = std::mem::replace(
            &mut *self.0.served.write().unwrap_or_else(|e| e.into_inner()),
            (Arc::new(zone), wire),
        );
        self.0.generation.fetch_add(1, Ordering::AcqRel);
        drop(old);
        release_free_memory();
    }
}

/// Hands freed heap pages back to the kernel. A rebuild frees the previous zone (and the first
/// build follows the manifest parse, which peaks far above what stays); glibc keeps such pages
/// in its arenas, so without this the resident size stays at the high-water mark.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Keeps the allocator's large blocks (a zone's maps and arena, a list being parsed) out of
/// the heap proper: glibc raises its mmap threshold each time such a block is freed (up to
/// 32 MB), after which the next zone's blocks are carved from the heap, grow by copying and
/// leave holes only [`release_free_memory`] can return. Fixed at the default 128 KiB, every
/// large block is its own mapping: returned when freed, resized in place by the kernel.
/// Call once, before the objects are read.
pub fn keep_large_blocks_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a tuning parameter of the allocator.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Limits of the serving loops.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub max_tcp_connections: usize,
    pub tcp_idle_timeout: Duration,
    pub tcp_message_timeout: Duration,
    pub tcp_queries_per_connection: usize,
    pub tcp_in_flight_per_connection: usize,
    /// UDP serving threads, each with its own socket on the address (SO_REUSEPORT: the
    /// kernel spreads clients over them).
    pub udp_workers: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_tcp_connections: 256,
            tcp_idle_timeout: Duration::from_secs(10),
            tcp_message_timeout: Duration::from_secs(2),
            tcp_queries_per_connection: 10_000,
            tcp_in_flight_per_connection: 16,
            udp_workers: 2,
        }
    }
}

/// Answers requests from the zone, and the forwarder for everything else.
#[derive(Clone)]
pub struct Handler {
    zone: ZoneHandle,
    forwarder: Option<Arc<Forwarder>>,
    /// Stub domains, most specific first: names at or under the zone go to its forwarder.
    stubs: Arc<[(Name, Arc<Forwarder>)]>,
    hosts: Arc<Hosts>,
    rewrites: Arc<[Rewrite]>,
    /// Whether the zone's precomputed answers may be served before anything else (not when
    /// a rewrite takes names in the zone).
    fast: bool,
    autopath: bool,
    metrics: Arc<DnsMetrics>,
    cookies: CookieSecret,
}

/// A request answered at once, or one that needs the upstreams.
enum Step {
    Done(Message),
    Forward(Message),
    /// ExternalName: the CNAME from the zone, then the upstream's answer for its target.
    Chase(Message, Answer, Name),
    /// A pod's first search-path expansion (autopath): try the names its resolver would
    /// try next; `Message` is the NXDOMAIN to send if none of them has an answer.
    Search(Message, Vec<Name>, Message),
}

impl Handler {
    /// Responses are counted in the forwarder's metrics (a fresh set without a forwarder;
    /// see [`Handler::with_metrics`]).
    pub fn new(zone: ZoneHandle, forwarder: Option<Arc<Forwarder>>) -> Self {
        let metrics = forwarder
            .as_ref()
            .map(|f| f.metrics().clone())
            .unwrap_or_default();
        Handler {
            zone,
            forwarder,
            stubs: Arc::new([]),
            hosts: Arc::default(),
            rewrites: Arc::new([]),
            fast: true,
            autopath: false,
            metrics,
            cookies: CookieSecret::random(),
        }
    }

    /// The query's COOKIE option, or the FORMERR a malformed one gets (RFC 7873 5.2.2).
    fn cookie_of(&self, req: &Message) -> Result<ClientCookie, Vec<u8>> {
        match client_cookie(req.edns.as_ref()) {
            ClientCookie::Malformed => Err(formerr(req)),
            c => Ok(c),
        }
    }

    /// Puts the client cookie and a fresh server cookie in the reply's OPT record.
    fn add_cookie(&self, msg: &mut Message, cookie: &ClientCookie, peer: Option<IpAddr>) {
        if let (ClientCookie::Present(client), Some(ip), Some(edns)) =
            (cookie, peer, msg.edns.as_mut())
        {
            let ip = match ip {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
                v4 => v4,
            };
            edns.options_mut()
                .insert(self.cookies.reply_option(client, ip));
        }
    }

    /// Counts responses in `metrics` (give the forwarder's too, in its config).
    pub fn with_metrics(mut self, metrics: Arc<DnsMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &Arc<DnsMetrics> {
        &self.metrics
    }

    /// Answers a pod's first search-path expansion with the first of the names its resolver
    /// would try next that has records (see [`crate::search`]): a CNAME to it, then its
    /// records. One query instead of up to five per address family.
    pub fn with_autopath(mut self, on: bool) -> Self {
        self.autopath = on;
        self
    }

    /// Stub domains (CoreDNS: a server block per zone with its own `forward`): names at or
    /// under a stub zone go to that zone's upstreams (the most specific zone wins), every
    /// other name outside the cluster zone to the default ones.
    pub fn with_stub_domains(mut self, mut stubs: Vec<(Name, Arc<Forwarder>)>) -> Self {
        stubs.sort_by_key(|(zone, _)| std::cmp::Reverse(zone.num_labels()));
        self.stubs = stubs.into();
        self
    }

    /// Static host entries, answered before forwarding (names outside the cluster zone).
    pub fn with_hosts(mut self, hosts: Hosts) -> Self {
        self.hosts = Arc::new(hosts);
        self
    }

    /// Name rewrites applied to every question before it is answered. A rule that can take
    /// names in the cluster zone turns the precomputed answers off (they would answer the
    /// name before it is rewritten).
    pub fn with_rewrites(mut self, rules: Vec<Rewrite>) -> Self {
        let origin = self.zone.load().origin().clone();
        self.fast = !rules.iter().any(|r| r.touches(&origin));
        self.rewrites = rules.into();
        self
    }

    /// The forwarder for `name`: its stub domain's, else the default one.
    fn forwarder_for(&self, name: &Name) -> Option<&Arc<Forwarder>> {
        self.stubs
            .iter()
            .find(|(zone, _)| zone.zone_of(name))
            .map(|(_, f)| f)
            .or(self.forwarder.as_ref())
    }

    /// Rewrites the question of `req` when a rule applies; returns the (original, new) names
    /// to [`Handler::restore`] the reply with.
    fn rewrite(&self, req: &mut Message) -> Option<(Name, Name)> {
        let q = req.queries.first_mut()?;
        let to = rewrite::rewrite(&self.rewrites, q.name())?;
        let original = q.name().clone();
        q.set_name(to.clone());
        Some((original, to))
    }

    fn restore(msg: &mut Message, names: &Option<(Name, Name)>) {
        if let Some((original, to)) = names {
            rewrite::restore(msg, original, to);
        }
    }

    /// Decides without I/O: a zone answer, or which query to forward.
    fn step(&self, req: Message) -> Step {
        let q = &req.queries[0];
        let zone = self.zone.load();
        let answer = zone.lookup(q.name(), q.query_type());
        if let Some(target) = answer.cname_outside(&zone, q.query_type()) {
            if self.forwarder_for(&target).is_some() {
                return Step::Chase(req, answer, target);
            }
        }
        match answer {
            Answer::Authoritative {
                rcode,
                answers,
                authority,
            } => {
                let negative = response(&req, rcode, true, answers, authority);
                if self.autopath && rcode == ResponseCode::NXDomain {
                    let has_ns = |ns: &str| zone.has_namespace(ns);
                    if let Some(e) = search::expansion(q.name(), zone.origin(), has_ns) {
                        let candidates = e.candidates(zone.origin(), &[]);
                        return Step::Search(req, candidates, negative);
                    }
                }
                Step::Done(negative)
            }
            Answer::NotInZone if !self.hosts.is_empty() => {
                match self.hosts.lookup(q.name(), q.query_type()) {
                    Some(answers) => {
                        Step::Done(response(&req, ResponseCode::NoError, true, answers, vec![]))
                    }
                    None => self.outside(req),
                }
            }
            Answer::NotInZone => self.outside(req),
        }
    }

    /// A name outside the zone and the host entries: the cache's answer, or forward it.
    fn outside(&self, req: Message) -> Step {
        let q = &req.queries[0];
        // A cached answer is sent from the receiving thread; only misses become tasks.
        match self.forwarder_for(q.name()).map(|f| f.cached(q)) {
            Some(Some(up)) => Step::Done(response(&req, up.rcode, false, up.answers, up.authority)),
            Some(None) => Step::Forward(req),
            None => Step::Done(response(&req, ResponseCode::Refused, false, vec![], vec![])),
        }
    }

    async fn forward(&self, step: Step) -> Message {
        let fwd = |name: &Name| {
            self.forwarder_for(name)
                .expect("only forwarded with a forwarder")
                .clone()
        };
        match step {
            Step::Done(m) => m,
            Step::Search(req, candidates, negative) => {
                let q = &req.queries[0];
                for name in candidates {
                    let Some(mut answers) = self.positive(&name, q.query_type()).await else {
                        continue;
                    };
                    let zone = self.zone.load();
                    let cname =
                        Record::from_rdata(q.name().clone(), zone.ttl(), RData::CNAME(CNAME(name)));
                    answers.insert(0, cname);
                    return response(&req, ResponseCode::NoError, false, answers, vec![]);
                }
                negative
            }
            // `step` found no cached answer: straight to the upstreams.
            Step::Forward(req) => match fwd(req.queries[0].name())
                .resolve_missed(&req.queries[0])
                .await
            {
                Ok(up) => response(&req, up.rcode, false, up.answers, up.authority),
                // Beyond the in-flight cap: REFUSED at once, so the client tries another
                // server instead of waiting (as CoreDNS's forward plugin's max_concurrent).
                Err(ForwardError::Overloaded) => {
                    self.metrics.overload_refused();
                    response(&req, ResponseCode::Refused, false, vec![], vec![])
                }
                Err(ForwardError::AllFailed) => {
                    response(&req, ResponseCode::ServFail, false, vec![], vec![])
                }
            },
            Step::Chase(req, answer, target) => {
                let Answer::Authoritative { mut answers, .. } = answer else {
                    unreachable!("only authoritative answers carry a CNAME")
                };
                let mut q = req.queries[0].clone();
                let forwarder = fwd(&target);
                q.set_name(target);
                match forwarder.resolve(&q).await {
                    Ok(up) => {
                        answers.extend(up.answers);
                        response(&req, up.rcode, false, answers, up.authority)
                    }
                    // The CNAME itself is still true; the client may resolve the target.
                    Err(_) => response(&req, ResponseCode::NoError, true, answers, vec![]),
                }
            }
        }
    }

    /// The records of `name`/`qtype` if it has some, from the zone (an ExternalName chased)
    /// or the upstreams; `None` for NXDOMAIN, NODATA and failures (the resolver moves on).
    async fn positive(&self, name: &Name, qtype: RecordType) -> Option<Vec<Record>> {
        let zone = self.zone.load();
        let answer = zone.lookup(name, qtype);
        let target = answer.cname_outside(&zone, qtype);
        let (rcode, mut answers) = match answer {
            Answer::Authoritative { rcode, answers, .. } => (rcode, answers),
            Answer::NotInZone => match self.hosts.lookup(name, qtype) {
                Some(answers) => (ResponseCode::NoError, answers),
                None => {
                    let q = Query::query(name.clone(), qtype);
                    let up = self.forwarder_for(name)?.resolve(&q).await.ok()?;
                    (up.rcode, up.answers)
                }
            },
        };
        if let Some((target, fwd)) = target.and_then(|t| Some((t.clone(), self.forwarder_for(&t)?)))
        {
            if let Ok(up) = fwd.resolve(&Query::query(target, qtype)).await {
                answers.extend(up.answers);
            }
        }
        let answered = answers
            .iter()
            .any(|r| qtype == RecordType::ANY || r.record_type() == qtype);
        (rcode == ResponseCode::NoError && answered).then_some(answers)
    }

    /// The reply to `bytes` from `peer` (`udp`: sized to the client's EDNS0 limit), or none.
    /// Without the peer's address, a query with a cookie gets no server cookie back.
    pub async fn handle(&self, bytes: &[u8], udp: bool, peer: Option<IpAddr>) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        if self.fast
            && self
                .zone
                .load_wire()
                .answer(bytes, udp, !self.autopath, &mut out)
        {
            return Some(out);
        }
        self.handle_general(bytes, udp, peer).await
    }

    /// [`Handler::handle`] without the precomputed answers: decode, look up, encode.
    pub(crate) async fn handle_general(
        &self,
        bytes: &[u8],
        udp: bool,
        peer: Option<IpAddr>,
    ) -> Option<Vec<u8>> {
        let mut req = match parse_request(bytes) {
            Request::Query(m) => m,
            Request::Reply(r) => return Some(r),
            Request::Drop => return None,
        };
        let rewritten = self.rewrite(&mut req);
        let cookie = match self.cookie_of(&req) {
            Ok(c) => c,
            Err(formerr) => return Some(formerr),
        };
        let limit = if udp { udp_limit(&req) } else { 65535 };
        let mut msg = match self.step(req) {
            Step::Done(m) => m,
            other => self.forward(other).await,
        };
        Self::restore(&mut msg, &rewritten);
        self.add_cookie(&mut msg, &cookie, peer);
        Some(encode(&msg, limit))
    }
}

/// Binds UDP ([`ServerConfig::udp_workers`] sockets and threads) and TCP on `addr`, and
/// serves until the runtime stops or a loop fails. Forwarded queries run on this runtime.
pub async fn serve(
    addr: SocketAddr,
    handler: Handler,
    config: ServerConfig,
) -> std::io::Result<()> {
    serve_then(addr, handler, config, || {}).await
}

/// [`serve`], calling `bound` once every socket is bound (the server answers from then on).
async fn serve_then(
    addr: SocketAddr,
    handler: Handler,
    config: ServerConfig,
    bound: impl FnOnce(),
) -> std::io::Result<()> {
    let sockets = udp::bind(addr, config.udp_workers)?;
    // Port 0: TCP on the port UDP got.
    let tcp = TcpListener::bind(sockets[0].local_addr()?).await?;
    let (failed, mut failure) = mpsc::channel(1);
    let rt = tokio::runtime::Handle::current();
    for (i, sock) in sockets.into_iter().enumerate() {
        let (handler, rt, failed) = (handler.clone(), rt.clone(), failed.clone());
        std::thread::Builder::new()
            .name(format!("weir-dns-udp{i}"))
            .spawn(move || {
                let e = serve_udp(sock, handler, rt);
                let _ = failed.blocking_send(e);
            })?;
    }
    bound();
    tokio::select! {
        r = serve_tcp(tcp, handler, config) => r,
        Some(e) = failure.recv() => Err(e),
    }
}

/// One UDP serving thread (blocking; returns only on a socket error): batches in, each
/// request answered from the precomputed wire answers when it can be, else by the general
/// path; replies batched out. Queries that need the upstreams become tasks on `rt` and reply
/// on their own.
pub fn serve_udp(
    sock: std::net::UdpSocket,
    handler: Handler,
    rt: tokio::runtime::Handle,
) -> std::io::Error {
    // Prefetches start from this thread (a cache hit found due for one).
    let _runtime = rt.enter();
    let sock = Arc::new(sock);
    let fd = sock.as_raw_fd();
    let mut inbox = udp::Inbox::new();
    let mut outbox = udp::Outbox::new();
    let mut generation = handler.zone.generation();
    let mut wire = handler.zone.load_wire();
    let nxdomain = !handler.autopath;
    let mut tally = Tally::default();
    loop {
        let n = match inbox.recv(fd) {
            Ok(n) => n,
            Err(e) => match e.kind() {
                // Signals, ICMP errors from earlier sends, momentary memory pressure.
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionRefused => continue,
                _ if e.raw_os_error() == Some(libc::ENOBUFS)
                    || e.raw_os_error() == Some(libc::ENOMEM) =>
                {
                    continue
                }
                _ => return e,
            },
        };
        // A request's duration is counted from its batch's arrival.
        let arrived = std::time::Instant::now();
        let now = handler.zone.generation();
        if now != generation {
            generation = now;
            wire = handler.zone.load_wire();
        }
        for i in 0..n {
            let Some((bytes, peer)) = inbox.get(i) else {
                continue;
            };
            let out = outbox.slot();
            if handler.fast && wire.answer(bytes, true, nxdomain, out) {
                tally.response(out);
                tally.request(bytes, arrived.elapsed());
                outbox.commit(peer);
                continue;
            }
            let slot = crate::metrics::query_type_slot(bytes);
            let mut req = match parse_request(bytes) {
                Request::Query(m) => m,
                Request::Reply(r) => {
                    *out = r;
                    tally.response(out);
                    tally.request(bytes, arrived.elapsed());
                    outbox.commit(peer);
                    continue;
                }
                Request::Drop => {
                    tally.dropped();
                    continue;
                }
            };
            let cookie = match handler.cookie_of(&req) {
                Ok(c) => c,
                Err(formerr) => {
                    *out = formerr;
                    tally.response(out);
                    tally.request(bytes, arrived.elapsed());
                    outbox.commit(peer);
                    continue;
                }
            };
            // The peer's address only matters for a server cookie.
            let from = matches!(cookie, ClientCookie::Present(_))
                .then(|| peer.socket_addr().map(|a| a.ip()))
                .flatten();
            let limit = udp_limit(&req);
            let rewritten = handler.rewrite(&mut req);
            match handler.step(req) {
                Step::Done(mut m) => {
                    Handler::restore(&mut m, &rewritten);
                    handler.add_cookie(&mut m, &cookie, from);
                    *out = encode(&m, limit);
                    tally.response(out);
                    tally.request(bytes, arrived.elapsed());
                    outbox.commit(peer);
                }
                other => {
                    let (sock, handler) = (sock.clone(), handler.clone());
                    rt.spawn(async move {
                        let mut m = handler.forward(other).await;
                        Handler::restore(&mut m, &rewritten);
                        handler.add_cookie(&mut m, &cookie, from);
                        let reply = encode(&m, limit);
                        handler.metrics.response(Transport::Udp, &reply);
                        handler
                            .metrics
                            .request_in(Transport::Udp, slot, arrived.elapsed());
                        udp::send_one(&sock, &reply, &peer);
                    });
                }
            }
        }
        outbox.send(fd);
        // Counted once per batch, not per query: the shared counters stay off the hot path.
        handler.metrics.add_udp(&std::mem::take(&mut tally));
    }
}

/// The TCP accept loop.
pub async fn serve_tcp(
    listener: TcpListener,
    handler: Handler,
    config: ServerConfig,
) -> std::io::Result<()> {
    let connections = Arc::new(Semaphore::new(config.max_tcp_connections));
    let slots = Arc::new(Slots::default());
    let config = Arc::new(config);
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(x) => x,
            // Out of file descriptors and the like: back off rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match connections.clone().try_acquire_owned() {
            Ok(p) => p,
            // Every slot held: the connection idle longest gives its slot up (it closes once
            // its pending answers are written); with none idle, this client is closed.
            Err(_) if slots.close_oldest_idle() => {
                let freed = connections.clone().acquire_owned();
                match tokio::time::timeout(config.tcp_message_timeout, freed).await {
                    Ok(Ok(p)) => p,
                    _ => continue,
                }
            }
            Err(_) => continue,
        };
        let (handler, config, slot) = (handler.clone(), config.clone(), slots.enter());
        tokio::spawn(async move {
            let _permit = permit;
            let _ = connection(stream, from.ip(), handler, &config, &slot).await;
        });
    }
}

async fn connection(
    stream: TcpStream,
    from: IpAddr,
    handler: Handler,
    config: &ServerConfig,
    slot: &Slot,
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(config.tcp_in_flight_per_connection.max(1));
    let write_timeout = config.tcp_message_timeout;
    // Answers go out as they are ready; a client that stops reading is cut off.
    let writer = tokio::spawn(async move {
        while let Some(reply) = rx.recv().await {
            let Ok(len) = u16::try_from(reply.len()) else {
                continue;
            };
            let mut framed = Vec::with_capacity(reply.len() + 2);
            framed.extend_from_slice(&len.to_be_bytes());
            framed.extend_from_slice(&reply);
            match tokio::time::timeout(write_timeout, wr.write_all(&framed)).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
    });
    let in_flight = Arc::new(Semaphore::new(config.tcp_in_flight_per_connection.max(1)));
    for _ in 0..config.tcp_queries_per_connection {
        let mut len = [0u8; 2];
        // Waiting for the next query may be long (idle, and the slot may be taken by a new
        // client meanwhile); the rest of a message may not.
        slot.set_idle(true);
        let next = tokio::time::timeout(config.tcp_idle_timeout, rd.read_exact(&mut len[..1]));
        tokio::select! {
            read = next => match read {
                Ok(Ok(_)) => slot.set_idle(false),
                _ => break,
            },
            _ = slot.close.notified() => break,
        }
        let read_rest = async {
            rd.read_exact(&mut len[1..]).await?;
            let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
            rd.read_exact(&mut buf).await?;
            Ok::<_, std::io::Error>(buf)
        };
        let msg = match tokio::time::timeout(config.tcp_message_timeout, read_rest).await {
            Ok(Ok(m)) if !m.is_empty() => m,
            _ => break,
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let (handler, tx) = (handler.clone(), tx.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let arrived = std::time::Instant::now();
            match handler.handle(&msg, false, Some(from)).await {
                Some(reply) => {
                    handler.metrics.response(Transport::Tcp, &reply);
                    let took = arrived.elapsed();
                    handler.metrics.request(Transport::Tcp, &msg, took);
                    let _ = tx.send(reply).await;
                }
                None => handler.metrics.dropped(Transport::Tcp),
            }
        });
    }
    drop(tx);
    // Answers still being worked on are delivered before the connection closes.
    let _ = writer.await;
    Ok(())
}

/// Runs [`serve`] on a runtime of its own with `threads` workers (TCP and forwarding; UDP has
/// its own [`ServerConfig::udp_workers`] threads); returns only on error. `bound` is called
/// once the UDP and TCP sockets are bound (e.g. to report ready).
pub fn serve_blocking(
    addr: SocketAddr,
    handler: Handler,
    config: ServerConfig,
    threads: usize,
    bound: impl FnOnce(),
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("weir-dns")
        .enable_all()
        .build()?;
    rt.block_on(serve_then(addr, handler, config, bound))
}
