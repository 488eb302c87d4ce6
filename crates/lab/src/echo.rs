//! The echo server every pod (and node, and the outside world) runs: it answers each TCP
//! connection and each UDP datagram with one line, `<name> <peer ip>\n`. The peer IP shows whether
//! the client's source address was rewritten (masqueraded) on the way. A TCP connection stays
//! open after the greeting and echoes each line it receives (`<name> <peer ip> <line>`).

use std::fs::File;
use std::io::{self, BufRead, BufReader, IoSlice, IoSliceMut, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    SockaddrIn, SockaddrIn6,
};
use weir_kernel::NetNs;

/// The port every echo server listens on.
pub const ECHO_PORT: u16 = 8080;

/// The line logged once both sockets are bound; [`spawn`] waits for it.
const READY: &str = "echo-server ready";

/// Runs the echo server in the calling process: enters `netns` (if given), binds, serves forever.
/// Call it before any other thread exists so that every thread lives in the namespace.
pub fn serve(netns: Option<&Path>, name: &str, port: u16) -> anyhow::Result<()> {
    if let Some(path) = netns {
        let ns = NetNs::open(path).with_context(|| format!("open netns {}", path.display()))?;
        nix::sched::setns(ns.file(), nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("enter netns {}", path.display()))?;
    }
    let addr = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
    let tcp = TcpListener::bind(addr).with_context(|| format!("bind tcp {addr}"))?;
    let udp = UdpSocket::bind(addr).with_context(|| format!("bind udp {addr}"))?;
    setsockopt(&udp, sockopt::Ipv4PacketInfo, &true).context("IP_PKTINFO")?;
    // IPv6 beside it ([::]:port, IPv6 only, so IPv4 peers keep their plain addresses), where
    // the namespace has IPv6 at all.
    let v6 = match bind_v6(port) {
        Ok((tcp6, udp6)) => Some((tcp6, udp6)),
        Err(e) => {
            eprintln!("no IPv6 sockets: {e:#}");
            None
        }
    };
    println!(
        "{READY}: {name} tcp+udp {addr}{}",
        if v6.is_some() {
            format!(" [::]:{port}")
        } else {
            String::new()
        }
    );
    io::stdout().flush().ok();

    let mut udps = vec![(udp, false)];
    let mut tcps = vec![tcp];
    if let Some((tcp6, udp6)) = v6 {
        udps.push((udp6, true));
        tcps.push(tcp6);
    }
    for (udp, v6) in udps {
        let udp_name = name.to_string();
        std::thread::spawn(move || loop {
            let served = if v6 {
                serve_udp6_once(&udp, &udp_name)
            } else {
                serve_udp_once(&udp, &udp_name)
            };
            if let Err(e) = served {
                eprintln!("udp: {e}");
            }
        });
    }
    let accept = |tcp: TcpListener| {
        for conn in tcp.incoming() {
            match conn {
                Ok(stream) => {
                    let name = name.to_string();
                    std::thread::spawn(move || serve_tcp(stream, &name));
                }
                Err(e) => eprintln!("tcp accept: {e}"),
            }
        }
    };
    let first = tcps.remove(0);
    std::thread::scope(|s| {
        for tcp in tcps {
            s.spawn(|| accept(tcp));
        }
        accept(first);
    });
    Ok(())
}

/// `[::]:port` for TCP and UDP, IPv6 only (IPV6_V6ONLY), the UDP socket with IPV6_RECVPKTINFO.
fn bind_v6(port: u16) -> anyhow::Result<(TcpListener, UdpSocket)> {
    use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType};
    let addr = SockaddrIn6::from(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0));
    let tcp = socket(
        AddressFamily::Inet6,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&tcp, sockopt::Ipv6V6Only, &true).context("IPV6_V6ONLY")?;
    setsockopt(&tcp, sockopt::ReuseAddr, &true).context("SO_REUSEADDR")?;
    bind(tcp.as_raw_fd(), &addr).with_context(|| format!("bind tcp [::]:{port}"))?;
    listen(&tcp, Backlog::new(128)?).context("listen")?;
    let udp = socket(
        AddressFamily::Inet6,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&udp, sockopt::Ipv6V6Only, &true).context("IPV6_V6ONLY")?;
    setsockopt(&udp, sockopt::Ipv6RecvPacketInfo, &true).context("IPV6_RECVPKTINFO")?;
    bind(udp.as_raw_fd(), &addr).with_context(|| format!("bind udp [::]:{port}"))?;
    Ok((TcpListener::from(tcp), UdpSocket::from(udp)))
}

/// One TCP connection: the greeting `<name> <peer>`, then every line the client sends comes
/// back as `<name> <peer> <line>` until the client closes (a long-lived connection shows that
/// it still reaches the same backend, e.g. across a proxy restart).
fn serve_tcp(mut stream: TcpStream, name: &str) {
    let peer = stream
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(format!("{name} {peer}\n").as_bytes())
        .is_err()
    {
        return;
    }
    let Ok(reader) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(reader).lines() {
        let Ok(line) = line else { return };
        if stream
            .write_all(format!("{name} {peer} {line}\n").as_bytes())
            .is_err()
        {
            return;
        }
    }
}

/// Answers one datagram, from the address it was sent to (IP_PKTINFO), so that replies to
/// an address on `lo` or on another interface match the client's (and conntrack's) view.
fn serve_udp_once(udp: &UdpSocket, name: &str) -> anyhow::Result<()> {
    let mut buf = [0u8; 2048];
    let mut cmsg = nix::cmsg_space!(libc::in_pktinfo);
    let (peer, local) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<SockaddrIn>(
            udp.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::empty(),
        )?;
        let mut local = None;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::Ipv4PacketInfo(info) = c {
                local = Some(info.ipi_addr);
            }
        }
        (msg.address, local)
    };
    let Some(peer) = peer else { return Ok(()) };
    let line = format!("{name} {}\n", peer.ip());
    let iov = [IoSlice::new(line.as_bytes())];
    match local {
        Some(dst) => {
            let info = libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: dst,
                ipi_addr: libc::in_addr { s_addr: 0 },
            };
            sendmsg(
                udp.as_raw_fd(),
                &iov,
                &[ControlMessage::Ipv4PacketInfo(&info)],
                MsgFlags::empty(),
                Some(&peer),
            )?;
        }
        None => {
            sendmsg(udp.as_raw_fd(), &iov, &[], MsgFlags::empty(), Some(&peer))?;
        }
    }
    Ok(())
}

/// [`serve_udp_once`] for the IPv6 socket: answered from the address it was sent to
/// (IPV6_PKTINFO).
fn serve_udp6_once(udp: &UdpSocket, name: &str) -> anyhow::Result<()> {
    let mut buf = [0u8; 2048];
    let mut cmsg = nix::cmsg_space!(libc::in6_pktinfo);
    let (peer, local) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<SockaddrIn6>(
            udp.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::empty(),
        )?;
        let mut local = None;
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::Ipv6PacketInfo(info) = c {
                local = Some(info.ipi6_addr);
            }
        }
        (msg.address, local)
    };
    let Some(peer) = peer else { return Ok(()) };
    let line = format!("{name} {}\n", peer.ip());
    let iov = [IoSlice::new(line.as_bytes())];
    match local {
        Some(dst) => {
            let info = libc::in6_pktinfo {
                ipi6_addr: dst,
                ipi6_ifindex: 0,
            };
            sendmsg(
                udp.as_raw_fd(),
                &iov,
                &[ControlMessage::Ipv6PacketInfo(&info)],
                MsgFlags::empty(),
                Some(&peer),
            )?;
        }
        None => {
            sendmsg(udp.as_raw_fd(), &iov, &[], MsgFlags::empty(), Some(&peer))?;
        }
    }
    Ok(())
}

/// Starts `weir lab echo-server` detached (own session, stdio to `log`) and waits until it has
/// bound its sockets. Returns its pid.
pub fn spawn(weir: &Path, netns: &Path, name: &str, log: &Path) -> anyhow::Result<u32> {
    let out = File::create(log).with_context(|| format!("create {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(weir);
    cmd.args(["lab", "echo-server", "--netns"])
        .arg(netns)
        .args(["--name", name, "--port", &ECHO_PORT.to_string()])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    crate::ns::detach(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawn {}", weir.display()))?;
    let pid = child.id();
    let wait = crate::timeout::startup_timeout(Duration::from_secs(5));
    let deadline = Instant::now() + wait;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(READY) {
            // The child stays ours until we exit; a reaper thread avoids zombies meanwhile.
            std::thread::spawn(move || {
                let _ = child.wait();
            });
            return Ok(pid);
        }
        if let Some(status) = child.try_wait()? {
            bail!("echo server {name} exited ({status}): {}", text.trim());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "echo server {name} did not start within {} s: {}",
                wait.as_secs(),
                text.trim()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
