//! The serving loops: UDP and TCP on tokio, our own loop over hickory-proto's wire format.
//!
//! Why not hickory-server: its request path (authority catalog, async trait objects per
//! request) is built for file-backed zones; the cluster zone is one immutable map swapped on
//! change, answered synchronously on the receiving task with no allocation beyond the reply.
//! Only forwarded queries become tasks.
//!
//! Bounds (the request path must never be a way to exhaust the server — aardvark-dns's
//! CVE-2026-35406 was a TCP loop): at most [`ServerConfig::max_tcp_connections`]
//! connections (more are closed at once); per connection, a message must arrive whole within
//! [`ServerConfig::tcp_message_timeout`] (so a trickling stream is cut), an idle connection
//! closes after [`ServerConfig::tcp_idle_timeout`], at most
//! [`ServerConfig::tcp_queries_per_connection`] queries are served and at most
//! [`ServerConfig::tcp_in_flight_per_connection`] are worked on concurrently (answers may
//! come back out of order, as RFC 7766 allows).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::rdata::CNAME;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{mpsc, Semaphore};

use crate::forward::Forwarder;
use crate::respond::{encode, parse_request, response, udp_limit, Request};
use crate::search;
use crate::zone::{Answer, Zone};

/// The current zone, replaced whole when objects change; readers clone the `Arc` and never
/// see a half-built zone.
#[derive(Clone)]
pub struct ZoneHandle(Arc<RwLock<Arc<Zone>>>);

impl ZoneHandle {
    pub fn new(zone: Zone) -> Self {
        ZoneHandle(Arc::new(RwLock::new(Arc::new(zone))))
    }

    pub fn load(&self) -> Arc<Zone> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn store(&self, zone: Zone) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(zone);
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
    /// Tasks receiving on the one UDP socket.
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
    autopath: bool,
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
    pub fn new(zone: ZoneHandle, forwarder: Option<Arc<Forwarder>>) -> Self {
        Handler {
            zone,
            forwarder,
            autopath: false,
        }
    }

    /// Answers a pod's first search-path expansion with the first of the names its resolver
    /// would try next that has records (see [`crate::search`]): a CNAME to it, then its
    /// records. One query instead of up to five per address family.
    pub fn with_autopath(mut self, on: bool) -> Self {
        self.autopath = on;
        self
    }

    /// Decides without I/O: a zone answer, or which query to forward.
    fn step(&self, req: Message) -> Step {
        let q = &req.queries[0];
        let zone = self.zone.load();
        let answer = zone.lookup(q.name(), q.query_type());
        if let (Some(target), Some(_)) =
            (answer.cname_outside(&zone, q.query_type()), &self.forwarder)
        {
            return Step::Chase(req, answer, target);
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
            Answer::NotInZone if self.forwarder.is_some() => Step::Forward(req),
            Answer::NotInZone => {
                Step::Done(response(&req, ResponseCode::Refused, false, vec![], vec![]))
            }
        }
    }

    async fn forward(&self, step: Step) -> Message {
        let fwd = || {
            self.forwarder
                .as_ref()
                .expect("only forwarded with a forwarder")
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
            Step::Forward(req) => match fwd().resolve(&req.queries[0]).await {
                Ok(up) => response(&req, up.rcode, false, up.answers, up.authority),
                Err(_) => response(&req, ResponseCode::ServFail, false, vec![], vec![]),
            },
            Step::Chase(req, answer, target) => {
                let Answer::Authoritative { mut answers, .. } = answer else {
                    unreachable!("only authoritative answers carry a CNAME")
                };
                let mut q = req.queries[0].clone();
                q.set_name(target);
                match fwd().resolve(&q).await {
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
            Answer::NotInZone => {
                let q = Query::query(name.clone(), qtype);
                let up = self.forwarder.as_ref()?.resolve(&q).await.ok()?;
                (up.rcode, up.answers)
            }
        };
        if let (Some(target), Some(fwd)) = (target, &self.forwarder) {
            if let Ok(up) = fwd.resolve(&Query::query(target, qtype)).await {
                answers.extend(up.answers);
            }
        }
        let answered = answers
            .iter()
            .any(|r| qtype == RecordType::ANY || r.record_type() == qtype);
        (rcode == ResponseCode::NoError && answered).then_some(answers)
    }

    /// The reply to `bytes` (`udp`: sized to the client's EDNS0 limit), or none.
    pub async fn handle(&self, bytes: &[u8], udp: bool) -> Option<Vec<u8>> {
        let req = match parse_request(bytes) {
            Request::Query(m) => m,
            Request::Reply(r) => return Some(r),
            Request::Drop => return None,
        };
        let limit = if udp { udp_limit(&req) } else { 65535 };
        let msg = match self.step(req) {
            Step::Done(m) => m,
            other => self.forward(other).await,
        };
        Some(encode(&msg, limit))
    }
}

/// Kernel buffer for the UDP socket: a burst waiting for the receiving task must not overflow
/// the default (~200 KB) and be dropped silently (dnsperf counted lost queries at 37k QPS).
const UDP_SOCKET_BUFFER: libc::c_int = 4 << 20;

/// Sets SO_RCVBUF/SO_SNDBUF, beyond `net.core.rmem_max` when privileged (the *FORCE variants).
/// Best effort: a smaller buffer only means earlier drops under overload.
fn grow_socket_buffers(sock: &UdpSocket, bytes: libc::c_int) {
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        let set = |opt| {
            // SAFETY: setsockopt on a socket we own, with a pointer to a live c_int.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&bytes as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            }
        };
        if set(force) != 0 {
            set(plain);
        }
    }
}

/// Binds UDP and TCP on `addr` and serves until the runtime stops.
pub async fn serve(
    addr: SocketAddr,
    handler: Handler,
    config: ServerConfig,
) -> std::io::Result<()> {
    let udp = UdpSocket::bind(addr).await?;
    grow_socket_buffers(&udp, UDP_SOCKET_BUFFER);
    let udp = Arc::new(udp);
    let tcp = TcpListener::bind(addr).await?;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..config.udp_workers.max(1) {
        tasks.spawn(serve_udp(udp.clone(), handler.clone()));
    }
    tasks.spawn(serve_tcp(tcp, handler, config));
    match tasks.join_next().await {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(std::io::Error::other(e)),
        None => Ok(()),
    }
}

/// One UDP receive loop; several may share the socket.
pub async fn serve_udp(sock: Arc<UdpSocket>, handler: Handler) -> std::io::Result<()> {
    let mut buf = vec![0u8; 65535];
    loop {
        let (n, peer) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            // ICMP errors from earlier sends surface here on some systems; keep serving.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
            Err(e) => return Err(e),
        };
        let req = match parse_request(&buf[..n]) {
            Request::Query(m) => m,
            Request::Reply(r) => {
                let _ = sock.send_to(&r, peer).await;
                continue;
            }
            Request::Drop => continue,
        };
        let limit = udp_limit(&req);
        match handler.step(req) {
            Step::Done(m) => {
                let _ = sock.send_to(&encode(&m, limit), peer).await;
            }
            other => {
                let (sock, handler) = (sock.clone(), handler.clone());
                tokio::spawn(async move {
                    let m = handler.forward(other).await;
                    let _ = sock.send_to(&encode(&m, limit), peer).await;
                });
            }
        }
    }
}

/// The TCP accept loop.
pub async fn serve_tcp(
    listener: TcpListener,
    handler: Handler,
    config: ServerConfig,
) -> std::io::Result<()> {
    let connections = Arc::new(Semaphore::new(config.max_tcp_connections));
    let config = Arc::new(config);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(x) => x,
            // Out of file descriptors and the like: back off rather than spin.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let (handler, config) = (handler.clone(), config.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let _ = connection(stream, handler, &config).await;
        });
    }
}

async fn connection(
    stream: TcpStream,
    handler: Handler,
    config: &ServerConfig,
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
        // Waiting for the next query may be long (idle); the rest of a message may not.
        match tokio::time::timeout(config.tcp_idle_timeout, rd.read_exact(&mut len[..1])).await {
            Ok(Ok(_)) => {}
            _ => break,
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
            if let Some(reply) = handler.handle(&msg, false).await {
                let _ = tx.send(reply).await;
            }
        });
    }
    drop(tx);
    // Answers still being worked on are delivered before the connection closes.
    let _ = writer.await;
    Ok(())
}

/// Runs [`serve`] on a runtime of its own with `threads` workers; returns only on error.
pub fn serve_blocking(
    addr: SocketAddr,
    handler: Handler,
    config: ServerConfig,
    threads: usize,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("weir-dns")
        .enable_all()
        .build()?;
    rt.block_on(serve(addr, handler, config))
}
