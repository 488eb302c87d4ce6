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
    let v4 = sock.local_addr()?.is_ipv4();
    sock.async_io(tokio::io::Interest::READABLE, || {
        if v4 {
            pktinfo::recv(fd, buf)
        } else {
            pktinfo::recv6(fd, buf)
        }
    })
    .await
}

/// Sends `data` to `client` from `local` (when known) through the listener.
async fn reply(sock: &UdpSocket, data: &[u8], client: SocketAddr, local: Option<IpAddr>) {
    use std::os::fd::AsRawFd;
    let fd = sock.as_raw_fd();
    match (client, local) {
        (SocketAddr::V4(to), Some(IpAddr::V4(from))) => {
            let _ = sock
                .async_io(tokio::io::Interest::WRITABLE, || {
                    pktinfo::send(fd, data, to, from)
                })
                .await;
        }
        (SocketAddr::V6(to), Some(IpAddr::V6(from))) => {
            let _ = sock
                .async_io(tokio::io::Interest::WRITABLE, || {
                    pktinfo::send6(fd, data, to, from)
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
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
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

    /// recvmsg(2): (length, sender, the datagram's destination address).
    pub fn recv(
        fd: RawFd,
        buf: &mut [u8],
    ) -> io::Result<(usize, SocketAddr, Option<std::net::IpAddr>)> {
        // SAFETY: every pointer in `msg` refers to a local that outlives the call, with its
        // true length; the control messages are read only within `msg_controllen`.
        unsafe {
            let mut from: libc::sockaddr_in = zeroed();
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let mut control = [0u64; 16];
            let mut msg: libc::msghdr = zeroed();
            msg.msg_name = (&mut from as *mut libc::sockaddr_in).cast();
            msg.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = size_of::<[u64; 16]>();
            let n = libc::recvmsg(fd, &mut msg, 0);
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut local = None;
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_PKTINFO {
                    let info: libc::in_pktinfo =
                        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    local = Some(Ipv4Addr::from(u32::from_be(info.ipi_addr.s_addr)).into());
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            let client = SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(from.sin_addr.s_addr)),
                u16::from_be(from.sin_port),
            );
            Ok((n as usize, client.into(), local))
        }
    }

    /// sendmsg(2) of `data` to `to` with source address `from`.
    pub fn send(fd: RawFd, data: &[u8], to: SocketAddrV4, from: Ipv4Addr) -> io::Result<usize> {
        // SAFETY: as in `recv`; the one control message is written inside `control`, whose
        // size is what CMSG_SPACE asks for (checked below).
        unsafe {
            let mut dst: libc::sockaddr_in = zeroed();
            dst.sin_family = libc::AF_INET as libc::sa_family_t;
            dst.sin_port = to.port().to_be();
            dst.sin_addr.s_addr = u32::from(*to.ip()).to_be();
            let mut iov = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            let mut control = [0u64; 16];
            let space = libc::CMSG_SPACE(size_of::<libc::in_pktinfo>() as u32) as usize;
            assert!(space <= size_of::<[u64; 16]>());
            let mut msg: libc::msghdr = zeroed();
            msg.msg_name = (&mut dst as *mut libc::sockaddr_in).cast();
            msg.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::IPPROTO_IP;
            (*c).cmsg_type = libc::IP_PKTINFO;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::in_pktinfo>() as u32) as usize;
            let mut info: libc::in_pktinfo = zeroed();
            info.ipi_spec_dst.s_addr = u32::from(from).to_be();
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast(), info);
            let n = libc::sendmsg(fd, &msg, 0);
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        }
    }

    /// [`recv`] on an IPv6 socket (`IPV6_PKTINFO`).
    pub fn recv6(
        fd: RawFd,
        buf: &mut [u8],
    ) -> io::Result<(usize, SocketAddr, Option<std::net::IpAddr>)> {
        // SAFETY: as in `recv`.
        unsafe {
            let mut from: libc::sockaddr_in6 = zeroed();
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let mut control = [0u64; 16];
            let mut msg: libc::msghdr = zeroed();
            msg.msg_name = (&mut from as *mut libc::sockaddr_in6).cast();
            msg.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = size_of::<[u64; 16]>();
            let n = libc::recvmsg(fd, &mut msg, 0);
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut local = None;
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::IPPROTO_IPV6 && (*c).cmsg_type == libc::IPV6_PKTINFO {
                    let info: libc::in6_pktinfo =
                        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    local = Some(Ipv6Addr::from(info.ipi6_addr.s6_addr).into());
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            let client = SocketAddrV6::new(
                Ipv6Addr::from(from.sin6_addr.s6_addr),
                u16::from_be(from.sin6_port),
                from.sin6_flowinfo,
                from.sin6_scope_id,
            );
            Ok((n as usize, client.into(), local))
        }
    }

    /// [`send`] on an IPv6 socket: `data` to `to` with source address `from`.
    pub fn send6(fd: RawFd, data: &[u8], to: SocketAddrV6, from: Ipv6Addr) -> io::Result<usize> {
        // SAFETY: as in `send`.
        unsafe {
            let mut dst: libc::sockaddr_in6 = zeroed();
            dst.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            dst.sin6_port = to.port().to_be();
            dst.sin6_addr.s6_addr = to.ip().octets();
            dst.sin6_scope_id = to.scope_id();
            let mut iov = libc::iovec {
                iov_base: data.as_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            let mut control = [0u64; 16];
            let space = libc::CMSG_SPACE(size_of::<libc::in6_pktinfo>() as u32) as usize;
            assert!(space <= size_of::<[u64; 16]>());
            let mut msg: libc::msghdr = zeroed();
            msg.msg_name = (&mut dst as *mut libc::sockaddr_in6).cast();
            msg.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::IPPROTO_IPV6;
            (*c).cmsg_type = libc::IPV6_PKTINFO;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::in6_pktinfo>() as u32) as usize;
            let mut info: libc::in6_pktinfo = zeroed();
            info.ipi6_addr.s6_addr = from.octets();
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast(), info);
            let n = libc::sendmsg(fd, &msg, 0);
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        }
    }
}
