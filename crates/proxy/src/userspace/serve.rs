//! The proxy's sockets: one TCP or UDP listener per service port (and endpoint set), on a
//! tokio runtime whose thread lives in the namespace the backend was first synced in, so the
//! connections it dials to endpoints leave from that namespace too.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use weir_model::{IpFamily, Protocol};

use super::balance::{Pool, DIAL_TIMEOUTS};
use super::relay::{relay, DataPath, SharedTraffic};

/// A UDP "connection" (client address → one endpoint) ends after this long without a reply.
const UDP_IDLE: Duration = Duration::from_secs(10);

/// The runtime that drives every listener: a thread of its own (blocked until stopped) and
/// two workers.
pub struct Runtime {
    pub handle: Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Runtime {
    /// Starts the runtime thread. Call it from the namespace the proxy serves: the thread
    /// inherits the caller's network namespace.
    pub fn start() -> io::Result<Runtime> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("weir-userspace".into())
            .spawn(move || {
                // Workers are started here, so they too live in the caller's namespace.
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("weir-userspace-io")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(rt.handle().clone()));
                let _ = rt.block_on(stopped);
            })?;
        let handle = rx
            .recv()
            .map_err(|_| io::Error::other("userspace runtime thread died"))??;
        Ok(Runtime {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One listening socket and its endpoints.
pub struct Listener {
    pub port: u16,
    pub pool: Arc<Mutex<Pool>>,
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Closes the listening socket; connections already proxied run to their end.
        self.task.abort();
    }
}

fn any(family: IpFamily) -> SocketAddr {
    match family {
        IpFamily::V4 => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpFamily::V6 => (Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}

impl Listener {
    /// Binds a listener on an ephemeral port of the calling thread's namespace and starts
    /// serving it on `rt`.
    pub fn open(
        rt: &Runtime,
        family: IpFamily,
        protocol: Protocol,
        pool: Pool,
        path: DataPath,
        traffic: SharedTraffic,
    ) -> io::Result<Listener> {
        let pool = Arc::new(Mutex::new(pool));
        let (port, task) = match protocol {
            Protocol::Tcp => {
                let l = std::net::TcpListener::bind(any(family))?;
                l.set_nonblocking(true)?;
                // std listens with a backlog of 128: a burst of connects would lose SYNs
                // and pay the 1 s retransmit.
                {
                    use std::os::fd::AsRawFd;
                    // SAFETY: listen(2) again on a listening socket we own raises its backlog.
                    unsafe { libc::listen(l.as_raw_fd(), 4096) };
                }
                let port = l.local_addr()?.port();
                let _guard = rt.handle.enter();
                let l = TcpListener::from_std(l)?;
                (
                    port,
                    rt.handle.spawn(serve_tcp(l, pool.clone(), path, traffic)),
                )
            }
            Protocol::Udp => {
                let s = std::net::UdpSocket::bind(any(family))?;
                s.set_nonblocking(true)?;
                pktinfo::enable(&s, family)?;
                let port = s.local_addr()?.port();
                let _guard = rt.handle.enter();
                let s = UdpSocket::from_std(s)?;
                (port, rt.handle.spawn(serve_udp(Arc::new(s), pool.clone())))
            }
            Protocol::Sctp => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "SCTP is not proxied in user space",
                ))
            }
        };
        Ok(Listener { port, pool, task })
    }
}

async fn serve_tcp(l: TcpListener, pool: Arc<Mutex<Pool>>, path: DataPath, traffic: SharedTraffic) {
    loop {
        match l.accept().await {
            Ok((client, peer)) => {
                tokio::spawn(proxy_tcp(client, peer, pool.clone(), path, traffic.clone()));
            }
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!(error = %e, "userspace proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Connects to an endpoint for a client, as kube-proxy's userspace mode did: each failed
/// attempt moves to the next endpoint (dropping the client's affinity) with the next,
/// longer, timeout. `None`: no endpoint, or none answered.
pub async fn dial(pool: &Mutex<Pool>, client: SocketAddr) -> Option<TcpStream> {
    for (i, timeout) in DIAL_TIMEOUTS.iter().enumerate() {
        let ep = pool
            .lock()
            .expect("pool lock")
            .pick(client.ip(), Instant::now(), i > 0)?;
        match tokio::time::timeout(*timeout, TcpStream::connect(ep)).await {
            Ok(Ok(s)) => return Some(s),
            Ok(Err(e)) => {
                tracing::debug!(%ep, error = %e, "userspace proxy: dial failed, next endpoint")
            }
            Err(_) => {
                tracing::debug!(%ep, ?timeout, "userspace proxy: dial timed out, next endpoint")
            }
        }
    }
    None
}

async fn proxy_tcp(
    client: TcpStream,
    peer: SocketAddr,
    pool: Arc<Mutex<Pool>>,
    path: DataPath,
    traffic: SharedTraffic,
) {
    let Some(upstream) = dial(&pool, peer).await else {
        reset_on_close(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    relay(&client, &upstream, path, &traffic).await;
}

/// Makes the close of `s` a reset, not a clean FIN: the client learns at once that nobody
/// answered, and no TIME_WAIT is left behind (the benches use it for that). SO_LINGER 0: the
/// close does not block.
pub fn reset_on_close(s: &impl std::os::fd::AsRawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt(2) with a correctly sized struct on a socket the caller owns.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

type Sessions = Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>>;

/// One datagram from the listener: its length, the client, and the address it was sent to
/// after the redirect — the source the replies must carry for conntrack to map them back to
/// the service address (127.0.0.1 or ::1 for the node's own traffic, not the address the
/// route to the client would pick).
async fn recv(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<IpAddr>)> {
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    sock.async_io(tokio::io::Interest::READABLE, || pktinfo::recv(fd, buf))
        .await
}

/// Sends `data` to `client` from `local` (when known) through the listener.
async fn reply(sock: &UdpSocket, data: &[u8], client: SocketAddr, local: Option<IpAddr>) {
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    match local {
        Some(from) if from.is_ipv4() == client.is_ipv4() => {
            let _ = sock
                .async_io(tokio::io::Interest::WRITABLE, || {
                    pktinfo::send(fd, data, client, from)
                })
                .await;
        }
        _ => {
            let _ = sock.send_to(data, client).await;
        }
    }
}

async fn serve_udp(sock: Arc<UdpSocket>, pool: Arc<Mutex<Pool>>) {
    let sessions: Sessions = Arc::default();
    let mut buf = vec![0u8; 65536];
    loop {
        let Ok((n, client, local)) = recv(&sock, &mut buf).await else {
            continue;
        };
        let existing = sessions
            .lock()
            .expect("sessions lock")
            .get(&client)
            .cloned();
        let up = match existing {
            Some(up) => up,
            None => match open_session(&sock, &pool, &sessions, client, local).await {
                Some(up) => up,
                None => continue,
            },
        };
        let _ = up.send(&buf[..n]).await;
    }
}

/// A socket connected to the endpoint chosen for `client`, and the task that relays its
/// replies back (through the listener, so conntrack gives them the service's address).
async fn open_session(
    sock: &Arc<UdpSocket>,
    pool: &Mutex<Pool>,
    sessions: &Sessions,
    client: SocketAddr,
    local: Option<IpAddr>,
) -> Option<Arc<UdpSocket>> {
    let ep = pool
        .lock()
        .expect("pool lock")
        .pick(client.ip(), Instant::now(), false)?;
    let family = if ep.is_ipv4() {
        IpFamily::V4
    } else {
        IpFamily::V6
    };
    let up = Arc::new(UdpSocket::bind(any(family)).await.ok()?);
    up.connect(ep).await.ok()?;
    sessions
        .lock()
        .expect("sessions lock")
        .insert(client, up.clone());
    let (sock, upstream, sessions) = (sock.clone(), up.clone(), sessions.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok(Ok(n)) = tokio::time::timeout(UDP_IDLE, upstream.recv(&mut buf)).await {
            reply(&sock, &buf[..n], client, local).await;
        }
        sessions.lock().expect("sessions lock").remove(&client);
    });
    Some(up)
}

/// `IP_PKTINFO` and `IPV6_PKTINFO`: learning a datagram's destination address and choosing a
/// reply's source.
mod pktinfo {
    use std::io;
    use std::mem::{size_of, zeroed};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    use std::os::fd::{AsRawFd, RawFd};

    use weir_model::IpFamily;

    pub fn enable(s: &std::net::UdpSocket, family: IpFamily) -> io::Result<()> {
        let on: libc::c_int = 1;
        let (level, name) = match family {
            IpFamily::V4 => (libc::IPPROTO_IP, libc::IP_PKTINFO),
            IpFamily::V6 => (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO),
        };
        // SAFETY: setsockopt(2) with a correctly sized int on a socket we own.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                level,
                name,
                (&on as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// recvmsg(2) on an IPv4 or IPv6 socket: (length, sender, the datagram's destination
    /// address from `IP_PKTINFO` / `IPV6_PKTINFO`).
    pub fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<IpAddr>)> {
        // SAFETY: every pointer in `msg` refers to a local that outlives the call, with its
        // true length; the control messages are read only within `msg_controllen`, and the
        // sender only as the family the kernel wrote.
        unsafe {
            let mut from: libc::sockaddr_storage = zeroed();
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let mut control = [0u64; 16];
            let mut msg: libc::msghdr = zeroed();
            msg.msg_name = (&mut from as *mut libc::sockaddr_storage).cast();
            msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = size_of::<[u64; 16]>();
            let n = libc::recvmsg(fd, &mut msg, 0);
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let client = sender(&from).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "recvmsg: not an IP sender")
            })?;
            Ok((n as usize, client, destination(&msg)))
        }
    }

    /// The sender recvmsg(2) wrote, by its family.
    fn sender(from: &libc::sockaddr_storage) -> Option<SocketAddr> {
        let p: *const libc::sockaddr_storage = from;
        // SAFETY: sockaddr_storage is large and aligned enough for either, and the family
        // field says which one the kernel wrote.
        unsafe {
            match libc::c_int::from(from.ss_family) {
                libc::AF_INET => {
                    let a = &*p.cast::<libc::sockaddr_in>();
                    let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                    Some(SocketAddrV4::new(ip, u16::from_be(a.sin_port)).into())
                }
                libc::AF_INET6 => {
                    let a = &*p.cast::<libc::sockaddr_in6>();
                    let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                    let port = u16::from_be(a.sin6_port);
                    Some(SocketAddrV6::new(ip, port, a.sin6_flowinfo, a.sin6_scope_id).into())
                }
                _ => None,
            }
        }
    }

    /// The destination address of an `IP_PKTINFO` or `IPV6_PKTINFO` control message.
    ///
    /// # Safety
    /// `msg` is a header recvmsg(2) filled, its control buffer still alive.
    unsafe fn destination(msg: &libc::msghdr) -> Option<IpAddr> {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                    let info: libc::in_pktinfo = std::ptr::read_unaligned(data.cast());
                    return Some(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr)).into());
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                    let info: libc::in6_pktinfo = std::ptr::read_unaligned(data.cast());
                    return Some(Ipv6Addr::from(info.ipi6_addr.s6_addr).into());
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
        None
    }

    /// sendmsg(2) of `data` to `to` with source address `from` (the same family).
    pub fn send(fd: RawFd, data: &[u8], to: SocketAddr, from: IpAddr) -> io::Result<usize> {
        let mut dst = socket_addr(to);
        let dst_len = match to {
            SocketAddr::V4(_) => size_of::<libc::sockaddr_in>(),
            SocketAddr::V6(_) => size_of::<libc::sockaddr_in6>(),
        };
        let mut control = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: as in `recv`; the one control message is written inside `control`, whose
        // size is what CMSG_SPACE asks for (checked in `source`).
        unsafe {
            let mut msg: libc::msghdr = zeroed();
            msg.msg_name = (&mut dst as *mut libc::sockaddr_storage).cast();
            msg.msg_namelen = dst_len as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            match (to, from) {
                (SocketAddr::V4(_), IpAddr::V4(from)) => {
                    let mut info: libc::in_pktinfo = zeroed();
                    info.ipi_spec_dst.s_addr = u32::from(from).to_be();
                    source(&mut msg, libc::IPPROTO_IP, libc::IP_PKTINFO, info);
                }
                (SocketAddr::V6(_), IpAddr::V6(from)) => {
                    let mut info: libc::in6_pktinfo = zeroed();
                    info.ipi6_addr.s6_addr = from.octets();
                    source(&mut msg, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, info);
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("reply to {to} from {from}: not one family"),
                    ))
                }
            }
            let n = libc::sendmsg(fd, &msg, 0);
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        }
    }

    /// `to` as the kernel reads it (sockaddr_in or sockaddr_in6 in a sockaddr_storage).
    fn socket_addr(to: SocketAddr) -> libc::sockaddr_storage {
        // SAFETY: all-zero is a valid sockaddr_storage, and either address fits in one.
        unsafe {
            let mut dst: libc::sockaddr_storage = zeroed();
            let p: *mut libc::sockaddr_storage = &mut dst;
            match to {
                SocketAddr::V4(to) => {
                    let a = &mut *p.cast::<libc::sockaddr_in>();
                    a.sin_family = libc::AF_INET as libc::sa_family_t;
                    a.sin_port = to.port().to_be();
                    a.sin_addr.s_addr = u32::from(*to.ip()).to_be();
                }
                SocketAddr::V6(to) => {
                    let a = &mut *p.cast::<libc::sockaddr_in6>();
                    a.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                    a.sin6_port = to.port().to_be();
                    a.sin6_addr.s6_addr = to.ip().octets();
                    a.sin6_scope_id = to.scope_id();
                }
            }
            dst
        }
    }

    /// Writes `info` as the one control message of `msg` and sets `msg_controllen`.
    ///
    /// # Safety
    /// `msg.msg_control` points to at least 128 bytes, aligned for a `cmsghdr`.
    unsafe fn source<T>(msg: &mut libc::msghdr, level: libc::c_int, kind: libc::c_int, info: T) {
        let space = libc::CMSG_SPACE(size_of::<T>() as u32) as usize;
        assert!(space <= size_of::<[u64; 16]>());
        msg.msg_controllen = space;
        let c = libc::CMSG_FIRSTHDR(msg);
        (*c).cmsg_level = level;
        (*c).cmsg_type = kind;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<T>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast(), info);
    }
}
