//! When rules reach the kernel: every committed nf_tables transaction ends with an
//! `NFT_MSG_NEWGEN` message to the `NFNLGRP_NFTABLES` multicast group of its network
//! namespace. A thread in the node's namespace listens and timestamps each one, so "rules
//! applied" is the kernel's own word, not a log line or a polled metric. Only the agent (and
//! the bench, between phases) writes nf_tables in that namespace.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// `NFNLGRP_NFTABLES` (linux/netfilter/nfnetlink.h).
const NFNLGRP_NFTABLES: u32 = 7;
/// `(NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN` (linux/netfilter/nf_tables.h: 15).
const NEWGEN: u16 = (10 << 8) | 15;

/// What the listener saw.
pub enum Seen {
    /// A transaction committed at this instant.
    Commit(Instant),
    /// The socket overflowed: commits may be missing (the figure in flight is void).
    Lost,
}

/// Listens until dropped.
pub struct Generations {
    rx: mpsc::Receiver<Seen>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Generations {
    /// Starts listening in network namespace `netns` (a name under /run/netns); returns once
    /// the socket is subscribed, so every later commit is seen.
    pub fn watch(netns: &str) -> Result<Generations, String> {
        let path = format!("/run/netns/{netns}");
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = thread::spawn(move || {
            let fd = File::open(&path)
                .map_err(|e| format!("{path}: {e}"))
                .and_then(|f| {
                    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| format!("setns {path}: {e}"))
                })
                .and_then(|()| subscribe());
            match fd {
                Ok(fd) => {
                    let _ = ready_tx.send(Ok(()));
                    listen(&fd, &tx, &stopping);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        });
        ready_rx
            .recv()
            .map_err(|_| "the listener thread died".to_string())??;
        Ok(Generations {
            rx,
            stop,
            thread: Some(thread),
        })
    }

    /// The next commit within `timeout`.
    pub fn next(&self, timeout: Duration) -> Result<Instant, String> {
        match self.rx.recv_timeout(timeout) {
            Ok(Seen::Commit(at)) => Ok(at),
            Ok(Seen::Lost) => Err("the netlink listener overflowed".into()),
            Err(_) => Err(format!("no nf_tables commit within {timeout:?}")),
        }
    }

    /// Forgets what was seen so far; returns how many commits that was.
    pub fn drain(&self) -> usize {
        self.rx.try_iter().count()
    }
}

impl Drop for Generations {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A netlink socket of the calling thread's namespace, in the nf_tables group, with a
/// receive buffer large enough for a whole table's notifications and a 200 ms timeout (so
/// the thread notices it should stop).
fn subscribe() -> Result<OwnedFd, String> {
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain socket(2) and setsockopt(2)/bind(2) calls with correctly sized values on
    // the descriptor created here, which OwnedFd then owns.
    unsafe {
        let raw = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        );
        if raw < 0 {
            return Err(os("netlink socket"));
        }
        let fd = OwnedFd::from_raw_fd(raw);
        let set = |level, name, value: *const libc::c_void, len: usize, what: &str| {
            if libc::setsockopt(fd.as_raw_fd(), level, name, value, len as libc::socklen_t) < 0 {
                Err(os(what))
            } else {
                Ok(())
            }
        };
        let buf: libc::c_int = 64 << 20;
        set(
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&buf as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>(),
            "SO_RCVBUFFORCE",
        )?;
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        set(
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>(),
            "SO_RCVTIMEO",
        )?;
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        if libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_nl).cast(),
            len,
        ) < 0
        {
            return Err(os("bind netlink"));
        }
        set(
            libc::SOL_NETLINK,
            libc::NETLINK_ADD_MEMBERSHIP,
            (&NFNLGRP_NFTABLES as *const u32).cast(),
            std::mem::size_of::<u32>(),
            "NETLINK_ADD_MEMBERSHIP nftables",
        )?;
        Ok(fd)
    }
}

fn listen(fd: &OwnedFd, tx: &mpsc::Sender<Seen>, stop: &AtomicBool) {
    let mut buf = vec![0u8; 1 << 20];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: recv(2) into a buffer we own, at most its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let at = Instant::now();
        if n < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ENOBUFS) => {
                    let _ = tx.send(Seen::Lost);
                }
                Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                _ => return,
            }
            continue;
        }
        for _ in 0..count_newgen(&buf[..n as usize]) {
            if tx.send(Seen::Commit(at)).is_err() {
                return;
            }
        }
    }
}

/// The `NEWGEN` messages in one datagram of netlink messages.
fn count_newgen(mut bytes: &[u8]) -> usize {
    let mut count = 0;
    while bytes.len() >= 16 {
        let len = u32::from_ne_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(bytes[4..6].try_into().expect("2 bytes"));
        if kind == NEWGEN {
            count += 1;
        }
        let step = (len + 3) & !3;
        if len < 16 || step > bytes.len() {
            break;
        }
        bytes = &bytes[step..];
    }
    count
}
