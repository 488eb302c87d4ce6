//! Moving a proxied TCP connection's bytes between the client's socket and the endpoint's.
//!
//! [`DataPath::Splice`] (the default) moves them with splice(2) through a pipe per direction:
//! socket → pipe → socket, so the payload stays in kernel pages and never crosses into user
//! space. Where the kernel refuses (the first splice of a direction fails with EINVAL, ENOSYS
//! or EOPNOTSUPP: e.g. a socket type without splice support) that direction copies through a
//! buffer instead. [`DataPath::Copy`] always copies (for comparison in the benchmark).
//!
//! Each direction ends at its source's EOF by shutting down the destination's write side, so
//! a half-close travels through the proxy; an error in one direction shuts both sockets down
//! so the other direction ends too (as `copy_bidirectional` would by dropping them).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// How a proxied connection's payload is moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataPath {
    /// splice(2) through a pipe, copying only where the kernel refuses.
    #[default]
    Splice,
    /// read(2) into a buffer, write(2) out of it.
    Copy,
}

/// Bytes moved by each path since the backend started (all listeners together).
#[derive(Debug, Default)]
pub struct Traffic {
    spliced: AtomicU64,
    copied: AtomicU64,
}

impl Traffic {
    pub fn spliced(&self) -> u64 {
        self.spliced.load(Ordering::Relaxed)
    }
    pub fn copied(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }
}

/// The copy path's buffer.
const CHUNK: usize = 1 << 16;

/// The pipe capacity asked for. A pipe holds a number of buffers (16 by default), not bytes,
/// and each holds at most one segment's payload: with 1,448-byte segments a default pipe
/// moves ~23 KB per splice. 1 MiB (256 buffers, /proc/sys/fs/pipe-max-size's default) moves
/// sixteen times as much per system call.
const PIPE_SIZE: libc::c_int = 1 << 20;

/// Relays both directions until both have ended.
pub async fn relay(client: &TcpStream, upstream: &TcpStream, path: DataPath, traffic: &Traffic) {
    let up = one_way(client, upstream, path, traffic);
    let down = one_way(upstream, client, path, traffic);
    let _ = tokio::join!(up, down);
}

/// `from` → `to` until `from`'s EOF (then `to`'s write side is shut) or an error (then both
/// are shut).
async fn one_way(from: &TcpStream, to: &TcpStream, path: DataPath, traffic: &Traffic) {
    let moved = match path {
        DataPath::Splice => match Pipe::new() {
            Ok(pipe) => match splice_loop(from, to, &pipe, traffic).await {
                Err(SpliceError::Refused(e)) => {
                    tracing::debug!(error = %e, "userspace proxy: splice refused, copying");
                    copy_loop(from, to, traffic).await
                }
                Err(SpliceError::Io(e)) => Err(e),
                Ok(()) => Ok(()),
            },
            Err(e) => {
                tracing::debug!(error = %e, "userspace proxy: no pipe, copying");
                copy_loop(from, to, traffic).await
            }
        },
        DataPath::Copy => copy_loop(from, to, traffic).await,
    };
    match moved {
        Ok(()) => shutdown(to, libc::SHUT_WR),
        Err(_) => {
            shutdown(from, libc::SHUT_RDWR);
            shutdown(to, libc::SHUT_RDWR);
        }
    }
}

fn shutdown(s: &TcpStream, how: libc::c_int) {
    // SAFETY: shutdown(2) on a socket we hold; failure (already shut, not connected) is moot.
    unsafe { libc::shutdown(s.as_raw_fd(), how) };
}

/// A non-blocking pipe: read end, write end, and its capacity in bytes — the most one
/// splice asks for: with the pipe drained before each read, a read never finds it full, so
/// EAGAIN from the source socket means "no data".
struct Pipe(OwnedFd, OwnedFd, usize);

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2(2) writes two descriptors into the array we pass; we own them after.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nothing else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl(2) on a pipe we own. Refused (a lower limit): the default size stays.
        let size = unsafe {
            libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE);
            libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        if size <= 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Pipe(r, w, size as usize))
    }
}

enum SpliceError {
    /// The kernel does not splice these descriptors (before any byte moved): copy instead.
    Refused(io::Error),
    Io(io::Error),
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: splice(2) between descriptors we hold, no offsets (sockets and pipes).
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
    )
}

async fn splice_loop(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    traffic: &Traffic,
) -> Result<(), SpliceError> {
    let (pipe_r, pipe_w) = (pipe.0.as_raw_fd(), pipe.1.as_raw_fd());
    let mut first = true;
    loop {
        // Socket → pipe: tokio waits for readability and retries on EAGAIN.
        let read = from
            .async_io(Interest::READABLE, || {
                splice(from.as_raw_fd(), pipe_w, pipe.2)
            })
            .await;
        let mut pending = match read {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if first && refused(&e) => return Err(SpliceError::Refused(e)),
            Err(e) => return Err(SpliceError::Io(e)),
        };
        first = false;
        // Pipe → socket, until the pipe is empty again.
        while pending > 0 {
            let n = to
                .async_io(Interest::WRITABLE, || {
                    splice(pipe_r, to.as_raw_fd(), pending)
                })
                .await
                .map_err(SpliceError::Io)?;
            if n == 0 {
                return Err(SpliceError::Io(io::ErrorKind::WriteZero.into()));
            }
            pending -= n;
            traffic.spliced.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

async fn copy_loop(from: &TcpStream, to: &TcpStream, traffic: &Traffic) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        from.readable().await?;
        let n = match from.try_read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        let mut sent = 0;
        while sent < n {
            to.writable().await?;
            match to.try_write(&buf[sent..n]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(w) => sent += w,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        traffic.copied.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Shared by every listener of one backend.
pub type SharedTraffic = Arc<Traffic>;

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair of loopback TCP sockets: (the outer end, the end the relay holds).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let outer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (inner, _) = l.accept().await.unwrap();
        (outer, inner)
    }

    /// 1 MiB each way through `relay`, the client half-closing first and the server
    /// answering after it: intact, and counted on the path asked for.
    async fn round_trip(path: DataPath) -> (u64, u64) {
        let (mut client, client_side) = pair().await;
        let (upstream_side, mut server) = pair().await;
        let traffic = Arc::new(Traffic::default());
        let t = traffic.clone();
        let relayed = tokio::spawn(async move {
            relay(&client_side, &upstream_side, path, &t).await;
        });
        let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        let up = data.clone();
        let server_task = tokio::spawn(async move {
            let mut got = Vec::new();
            server.read_to_end(&mut got).await.unwrap();
            assert!(got == up, "upload differs");
            let back: Vec<u8> = got.iter().rev().copied().collect();
            server.write_all(&back).await.unwrap();
        });
        client.write_all(&data).await.unwrap();
        client.shutdown().await.unwrap();
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        server_task.await.unwrap();
        relayed.await.unwrap();
        assert!(back.iter().rev().eq(data.iter()), "download differs");
        (traffic.spliced(), traffic.copied())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spliced_bytes_arrive_intact_and_never_touch_a_buffer() {
        assert_eq!(round_trip(DataPath::Splice).await, (2 << 20, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn copied_bytes_arrive_intact() {
        assert_eq!(round_trip(DataPath::Copy).await, (0, 2 << 20));
    }

    #[test]
    fn only_unsupported_descriptors_fall_back_to_copying() {
        for errno in [libc::EINVAL, libc::ENOSYS, libc::EOPNOTSUPP] {
            assert!(refused(&io::Error::from_raw_os_error(errno)));
        }
        for errno in [libc::ECONNRESET, libc::EPIPE, libc::EAGAIN] {
            assert!(!refused(&io::Error::from_raw_os_error(errno)));
        }
    }
}
