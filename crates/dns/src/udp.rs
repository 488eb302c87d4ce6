//! UDP sockets for the serving threads: one blocking socket per thread on the same address
//! (SO_REUSEPORT, so the kernel spreads clients over the threads without a shared queue), and
//! datagrams moved in batches with recvmmsg/sendmmsg (one system call for up to [`BATCH`]
//! queries and one for their replies under load; with MSG_WAITFORONE a lone query is not
//! held back waiting for a batch to fill).

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

/// Datagrams per system call.
pub const BATCH: usize = 32;

/// The largest request kept; longer datagrams are dropped (MSG_TRUNC). No legitimate query
/// comes near it: one question and an OPT record.
const SLOT: usize = 4096;

/// Kernel buffers per socket: a burst waiting for its thread must not overflow the default
/// (~200 KB) and be dropped silently (dnsperf counted lost queries at 37k QPS before).
const SOCKET_BUFFER: libc::c_int = 4 << 20;

/// `count` UDP sockets bound to `addr` with SO_REUSEPORT (for port 0, all on the port the
/// first one got).
pub fn bind(addr: SocketAddr, count: usize) -> io::Result<Vec<UdpSocket>> {
    let mut out: Vec<UdpSocket> = Vec::new();
    let mut addr = addr;
    for _ in 0..count.max(1) {
        let sock = bind_one(addr)?;
        addr = sock.local_addr()?;
        out.push(sock);
    }
    Ok(out)
}

fn bind_one(addr: SocketAddr) -> io::Result<UdpSocket> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2); the fd is owned by the UdpSocket from here on.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket nobody else owns.
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        // Beyond net.core.rmem_max when privileged; best effort otherwise (a smaller buffer
        // only means earlier drops under overload).
        if set_int(fd, libc::SOL_SOCKET, force, SOCKET_BUFFER).is_err() {
            let _ = set_int(fd, libc::SOL_SOCKET, plain, SOCKET_BUFFER);
        }
    }
    let (storage, len) = to_sockaddr(addr);
    // SAFETY: storage holds a sockaddr of `len` bytes.
    if unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

fn set_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt with a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A peer address as the kernel gave it (kept raw: replies go back without conversion).
#[derive(Clone, Copy)]
pub struct Peer {
    addr: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl Peer {
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        from_sockaddr(&self.addr)
    }
}

fn to_sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn from_sockaddr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: libc::sockaddr_in =
                unsafe { std::ptr::read((s as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::from((ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: libc::sockaddr_in6 =
                unsafe { std::ptr::read((s as *const libc::sockaddr_storage).cast()) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Received datagrams of one recvmmsg call.
pub struct Inbox {
    bufs: Vec<u8>,
    peers: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    count: usize,
}

impl Default for Inbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Inbox {
    pub fn new() -> Self {
        // SAFETY: all-zero is valid for these C structs (null pointers, zero lengths).
        unsafe {
            Inbox {
                bufs: vec![0; BATCH * SLOT],
                peers: vec![zeroed(); BATCH],
                iovs: vec![zeroed(); BATCH],
                hdrs: vec![zeroed(); BATCH],
                count: 0,
            }
        }
    }

    /// Blocks until at least one datagram arrives, then takes what else is queued (up to
    /// [`BATCH`]). Returns how many.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        for i in 0..BATCH {
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i * SLOT..].as_mut_ptr().cast(),
                iov_len: SLOT,
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.peers[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
        }
        // SAFETY: hdrs points at BATCH valid headers whose buffers outlive the call.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            self.count = 0;
            return Err(io::Error::last_os_error());
        }
        self.count = n as usize;
        Ok(self.count)
    }

    /// Datagram `i` of the last [`Inbox::recv`] and its sender; None for one cut short.
    pub fn get(&self, i: usize) -> Option<(&[u8], Peer)> {
        let h = &self.hdrs[i];
        if i >= self.count || h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
            return None;
        }
        let len = (h.msg_len as usize).min(SLOT);
        let peer = Peer {
            addr: self.peers[i],
            len: h.msg_hdr.msg_namelen,
        };
        Some((&self.bufs[i * SLOT..i * SLOT + len], peer))
    }
}

/// Replies collected for one sendmmsg call.
pub struct Outbox {
    bufs: Vec<Vec<u8>>,
    peers: Vec<Peer>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    count: usize,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Outbox {
    pub fn new() -> Self {
        // SAFETY: all-zero is valid for these C structs.
        unsafe {
            Outbox {
                bufs: (0..BATCH).map(|_| Vec::with_capacity(512)).collect(),
                peers: vec![
                    Peer {
                        addr: zeroed(),
                        len: 0
                    };
                    BATCH
                ],
                iovs: vec![zeroed(); BATCH],
                hdrs: vec![zeroed(); BATCH],
                count: 0,
            }
        }
    }

    /// The buffer for the next reply (cleared); keep it with [`Outbox::commit`].
    pub fn slot(&mut self) -> &mut Vec<u8> {
        let b = &mut self.bufs[self.count];
        b.clear();
        b
    }

    /// Keeps the reply written into [`Outbox::slot`] for `peer`.
    pub fn commit(&mut self, peer: Peer) {
        self.peers[self.count] = peer;
        self.count += 1;
    }

    /// Sends every kept reply (a datagram the kernel refuses is skipped) and empties the box.
    pub fn send(&mut self, fd: RawFd) {
        for i in 0..self.count {
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.bufs[i].len(),
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.peers[i].addr as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = self.peers[i].len;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
        }
        let mut done = 0;
        while done < self.count {
            // SAFETY: hdrs[done..count] are valid headers pointing at live buffers.
            let n = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdrs[done..].as_mut_ptr(),
                    (self.count - done) as libc::c_uint,
                    0,
                )
            };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // This datagram cannot go (no route, a firewall); the rest may.
                done += 1;
            } else {
                done += n as usize;
            }
        }
        self.count = 0;
    }
}

/// Sends one reply without blocking (a reply from a forwarding task; if the socket buffer
/// is full the reply is dropped, as the network might drop it).
pub fn send_one(sock: &UdpSocket, bytes: &[u8], peer: &Peer) {
    // SAFETY: bytes and peer.addr are live for the call.
    unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT,
            (&peer.addr as *const libc::sockaddr_storage).cast(),
            peer.len,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trip() {
        for a in ["192.0.2.1:53", "[2001:db8::1]:5353"] {
            let a: SocketAddr = a.parse().unwrap();
            let (s, _) = to_sockaddr(a);
            assert_eq!(from_sockaddr(&s), Some(a));
        }
    }

    /// Two sockets share a port, and a batch goes in and out in one call each.
    #[test]
    fn reuseport_sockets_batch_in_and_out() {
        let socks = bind("127.0.0.1:0".parse().unwrap(), 2).unwrap();
        let addr = socks[0].local_addr().unwrap();
        assert_eq!(socks[1].local_addr().unwrap(), addr);
        drop(socks);
        let server = bind("127.0.0.1:0".parse().unwrap(), 1).unwrap().remove(0);
        let addr = server.local_addr().unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..5u8 {
            client.send_to(&[i; 3], addr).unwrap();
        }
        let mut inbox = Inbox::new();
        let mut outbox = Outbox::new();
        let mut got = 0;
        while got < 5 {
            let n = inbox.recv(server.as_raw_fd()).unwrap();
            for i in 0..n {
                let (bytes, peer) = inbox.get(i).unwrap();
                assert_eq!(peer.socket_addr(), Some(client.local_addr().unwrap()));
                let out = outbox.slot();
                out.extend_from_slice(bytes);
                out.push(0xff);
                outbox.commit(peer);
            }
            outbox.send(server.as_raw_fd());
            got += n;
        }
        let mut buf = [0u8; 16];
        let mut seen = Vec::new();
        for _ in 0..5 {
            let n = client.recv(&mut buf).unwrap();
            assert_eq!(n, 4);
            assert_eq!(buf[3], 0xff);
            seen.push(buf[0]);
        }
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
    }
}
