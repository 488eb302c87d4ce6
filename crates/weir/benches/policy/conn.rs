//! New TCP connections per second from the client pod to the server pod: each counted once
//! the server's byte has arrived, then closed with a reset (no TIME_WAIT on either side, so
//! ports are reused freely). The server keeps an answered socket until the client's reset has
//! arrived: closing first would put it in TIME_WAIT, and a reused port's SYN would be lost.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::world::in_ns;

const LINGER: Duration = Duration::from_millis(200);

/// The accept-and-answer server in the server pod; stopped on drop.
pub struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(server_ns: &str, port: u16) -> Result<Server, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready, up) = std::sync::mpsc::channel();
        let (ns, stopping) = (server_ns.to_string(), stop.clone());
        let thread = thread::spawn(move || {
            in_ns(&ns, || {
                let l = match TcpListener::bind(("0.0.0.0", port)) {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = ready.send(Err(format!("bind port {port}: {e}")));
                        return;
                    }
                };
                // SAFETY: listen(2) again on a listening socket we own raises its backlog.
                unsafe { libc::listen(l.as_raw_fd(), 4096) };
                let _ = ready.send(Ok(()));
                serve(&l, &stopping);
            })
        });
        up.recv().map_err(|_| "server thread died".to_string())??;
        Ok(Server {
            stop,
            thread: Some(thread),
        })
    }
}

fn serve(l: &TcpListener, stop: &AtomicBool) {
    let mut answered: VecDeque<(Instant, TcpStream)> = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        while answered.front().is_some_and(|(t, _)| t.elapsed() > LINGER) {
            answered.pop_front();
        }
        // Waits for a connection at most 100 ms, so the flag is seen.
        let mut pfd = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one pollfd we own.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(b"!");
            answered.push_back((Instant::now(), s));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection the server answered: its byte read, then a reset close.
fn answered(target: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut byte = [0u8; 1];
    s.read_exact(&mut byte)?;
    weir_proxy::userspace::serve::reset_on_close(&s);
    Ok(())
}

/// Answered connections per second from `clients` threads in namespace `ns` for `time`, and
/// the attempts that failed.
pub fn rate(ns: &str, target: SocketAddr, clients: usize, time: Duration) -> (f64, u64) {
    let start = Instant::now();
    let until = start + time;
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let ns = ns.to_string();
            thread::spawn(move || {
                in_ns(&ns, || {
                    let (mut ok, mut failed) = (0u64, 0u64);
                    while Instant::now() < until {
                        match answered(target) {
                            Ok(()) => ok += 1,
                            Err(_) => failed += 1,
                        }
                    }
                    (ok, failed)
                })
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for h in handles {
        let (o, f) = h.join().expect("client thread");
        ok += o;
        failed += f;
    }
    (ok as f64 / start.elapsed().as_secs_f64(), failed)
}
