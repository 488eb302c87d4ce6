//! The proxy modes side by side on this kernel: new TCP connections per second and the
//! throughput of one TCP stream through a ClusterIP, for nftables, iptables and userspace
//! (spliced and copied), each against going straight to the endpoint, in one run. Root only,
//! in the throwaway namespaces of the datapath tests (`tests/common/lab.rs`): an off-node
//! client, the node (the backend), and the pod p1 behind a veth.
//!
//! ```sh
//! bash scripts/dev.sh modes-bench     # = cargo bench -p weir-proxy --bench modes
//! ```
//!
//! Environment: `WEIR_BENCH_ROUNDS` (default 5), `WEIR_BENCH_SECONDS` (per measurement,
//! default 2), `WEIR_BENCH_CLIENTS` (connecting threads, default 2), `WEIR_BENCH_MODES`
//! (default `nftables,iptables,userspace-splice,userspace-copy`).
//!
//! Per round and mode: the backend is synced, then the VIP and the endpoint are measured one
//! after the other (the order flips every round, conntrack flushed before each), then the
//! backend is cleaned up. Figures are medians over the rounds; each ratio is VIP / direct
//! of the same round, so load on a shared machine hits both sides alike.

#[allow(dead_code)]
#[path = "../tests/common/lab.rs"]
mod lab;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use lab::{load, Lab, IPTABLES_TOOLS};
use weir_model::Plan;
use weir_proxy::iptables::{IptablesBackend, IptablesOptions};
use weir_proxy::nft::{NftBackend, NftOptions};
use weir_proxy::userspace::{DataPath, UserspaceBackend};
use weir_proxy::Backend;

/// The pod's two servers: accept-and-close (connection rate) and a sink (throughput).
const CONN_PORT: u16 = 9091;
const SINK_PORT: u16 = 9092;
/// `solo` (one endpoint, p1) → CONN_PORT; `web` (p1 and p2) → SINK_PORT, served on p1 only:
/// p2's address is removed so every stream lands on p1.
const CONN_VIP: &str = "10.96.0.20:80";
const SINK_VIP: &str = "10.96.0.10:80";
const P1: &str = "10.244.1.5";
/// How long the connection-rate server keeps an answered socket.
const LINGER: Duration = Duration::from_millis(200);

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} must be a number"))
        })
        .unwrap_or(default)
}

fn plan() -> Plan {
    let mut plan = load();
    plan.services
        .retain(|k, _| &*k.name == "solo" || &*k.name == "web");
    for (k, sp) in plan.services.iter_mut() {
        let port = if &*k.name == "solo" {
            CONN_PORT
        } else {
            SINK_PORT
        };
        let sp = Arc::make_mut(sp);
        sp.cluster_endpoints.retain(|e| e.ip.to_string() == P1);
        sp.local_endpoints.retain(|e| e.ip.to_string() == P1);
        for e in sp
            .cluster_endpoints
            .iter_mut()
            .chain(sp.local_endpoints.iter_mut())
        {
            e.port = port;
        }
    }
    plan
}

fn backend(mode: &str) -> Box<dyn Backend> {
    match mode {
        "nftables" => Box::new(NftBackend::new(NftOptions::default())),
        "iptables" => Box::new(IptablesBackend::new(IptablesOptions::default())),
        "userspace-splice" => Box::new(UserspaceBackend::with_data_path(DataPath::Splice)),
        "userspace-copy" => Box::new(UserspaceBackend::with_data_path(DataPath::Copy)),
        other => panic!("unknown mode {other}"),
    }
}

/// The pod's servers, stopped on drop.
struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Servers {
    fn start(lab: &Lab) -> Servers {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = [CONN_PORT, SINK_PORT]
            .into_iter()
            .map(|port| {
                let ns = lab.netns("p1");
                let stop = stop.clone();
                let (ready, up) = std::sync::mpsc::channel();
                let t = thread::spawn(move || {
                    let _inside = ns.enter().unwrap();
                    let l = TcpListener::bind(("0.0.0.0", port)).unwrap();
                    raise_backlog(&l);
                    l.set_nonblocking(true).unwrap();
                    ready.send(()).unwrap();
                    // Connection rate: one byte written, so the client knows the
                    // endpoint answered; the socket is kept until the client's reset has
                    // arrived (200 ms). Closing first would leave this side in TIME_WAIT
                    // for 60 s under the source the kernel modes masquerade to (the node's
                    // address), and a later SYN from a reused port would be lost; resetting
                    // first would discard the byte before the client reads it.
                    let mut answered = std::collections::VecDeque::new();
                    while !stop.load(Ordering::Relaxed) {
                        while answered
                            .front()
                            .is_some_and(|(t, _): &(Instant, TcpStream)| t.elapsed() > LINGER)
                        {
                            answered.pop_front();
                        }
                        match l.accept() {
                            Ok((mut s, _)) if port == CONN_PORT => {
                                let _ = s.write_all(b"!");
                                answered.push_back((Instant::now(), s));
                            }
                            Ok((s, _)) => {
                                thread::spawn(move || sink(s));
                            }
                            Err(_) => thread::sleep(Duration::from_micros(200)),
                        }
                    }
                });
                up.recv().unwrap();
                t
            })
            .collect();
        Servers { stop, threads }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn raise_backlog(l: &TcpListener) {
    // SAFETY: listen(2) again on a listening socket we own raises its backlog.
    unsafe { libc::listen(l.as_raw_fd(), 4096) };
}

fn sink(mut s: TcpStream) {
    let _ = s.set_nonblocking(false);
    let mut buf = vec![0u8; 256 * 1024];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}

/// One connection that the endpoint answered: its byte read, then a reset close.
fn answered(target: SocketAddr) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut byte = [0u8; 1];
    s.read_exact(&mut byte)?;
    weir_proxy::userspace::serve::reset_on_close(&s);
    Ok(())
}

/// Connections per second from `clients` threads in the client namespace, each counted once
/// the endpoint's byte has arrived (through the userspace proxy a handshake alone ends at the
/// proxy, so it would not show the dial behind it); failed attempts are counted apart.
fn conn_rate(lab: &Lab, target: SocketAddr, clients: u64, time: Duration) -> (f64, u64) {
    let start = Instant::now();
    let until = start + time;
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let ns = lab.netns("client");
            thread::spawn(move || {
                let _inside = ns.enter().unwrap();
                let (mut ok, mut failed) = (0u64, 0u64);
                while Instant::now() < until {
                    match answered(target) {
                        Ok(()) => ok += 1,
                        Err(e) => {
                            if failed == 0 {
                                eprintln!("connect {target}: {e} (first failure of this thread)");
                            }
                            failed += 1
                        }
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for h in handles {
        let (o, f) = h.join().unwrap();
        ok += o;
        failed += f;
    }
    (ok as f64 / start.elapsed().as_secs_f64(), failed)
}

/// Gbit/s of one TCP stream from the client namespace to the sink: sent for `time`, timed
/// until the sink has read all of it.
fn throughput(lab: &Lab, target: SocketAddr, time: Duration) -> f64 {
    let _inside = lab.netns("client").enter().unwrap();
    let mut s = TcpStream::connect_timeout(&target, Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("connect {target}: {e}"));
    let buf = vec![0x5au8; 256 * 1024];
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < time {
        s.write_all(&buf).unwrap();
        sent += buf.len() as u64;
    }
    // Delivered, not just buffered: the sink closes once it has read our EOF, and the
    // buffers on the way (twice as many through the userspace proxy) have drained by then.
    s.shutdown(std::net::Shutdown::Write).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.read(&mut [0u8; 1]);
    let secs = start.elapsed().as_secs_f64();
    sent as f64 * 8.0 / secs / 1e9
}

/// The client namespace's TCP retransmissions so far (/proc/net/snmp `Tcp: RetransSegs`): a
/// connection round that retransmits SYNs lost some on the way, and each costs it a second.
fn retransmits(lab: &Lab) -> u64 {
    let snmp = lab.exec("client", "cat /proc/net/snmp");
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap_or(""), tcp.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RetransSegs")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

#[derive(Default)]
struct Samples {
    conn_vip: Vec<f64>,
    conn_direct: Vec<f64>,
    conn_ratio: Vec<f64>,
    tput_vip: Vec<f64>,
    tput_direct: Vec<f64>,
    tput_ratio: Vec<f64>,
    failed: u64,
    retransmits_vip: u64,
    retransmits_direct: u64,
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it,
    // and a minutes-long benchmark has no place in the test suite.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipping: the modes bench needs root");
        return;
    }
    let rounds = env_num("WEIR_BENCH_ROUNDS", 5);
    let time = Duration::from_secs(env_num("WEIR_BENCH_SECONDS", 2));
    let clients = env_num("WEIR_BENCH_CLIENTS", 2);
    let modes: Vec<String> = std::env::var("WEIR_BENCH_MODES")
        .unwrap_or_else(|_| "nftables,iptables,userspace-splice,userspace-copy".into())
        .split(',')
        .map(str::to_string)
        .collect();
    let tools: Vec<&str> = IPTABLES_TOOLS.iter().copied().chain(["nft"]).collect();
    let Some(lab) = Lab::new("bench-modes", &tools) else {
        return;
    };
    // Only p1 serves: web's second endpoint is gone from the plan, p2 idles.
    let _servers = Servers::start(&lab);
    let plan = plan();
    let load_before = loadavg();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let conn_direct: SocketAddr = format!("{P1}:{CONN_PORT}").parse().unwrap();
    let sink_direct: SocketAddr = format!("{P1}:{SINK_PORT}").parse().unwrap();
    let (conn_vip, sink_vip): (SocketAddr, SocketAddr) =
        (CONN_VIP.parse().unwrap(), SINK_VIP.parse().unwrap());
    let mut results: Vec<Samples> = modes.iter().map(|_| Samples::default()).collect();
    let started = Instant::now();
    for r in 0..rounds {
        for (mode, s) in modes.iter().zip(results.iter_mut()) {
            let mut b = backend(mode);
            lab.sync(b.as_mut(), &plan);
            // Proves both paths before timing them.
            for t in [conn_vip, sink_vip] {
                let _inside = lab.netns("client").enter().unwrap();
                TcpStream::connect_timeout(&t, Duration::from_secs(3))
                    .unwrap_or_else(|e| panic!("{mode}: connect {t}: {e}"));
            }
            for vip in [r % 2 == 0, r % 2 == 1] {
                // Throughput first: a connection round leaves the userspace proxy with a
                // backlog of accepted connections still to dial and close, which would
                // compete with the stream.
                let tput = throughput(&lab, if vip { sink_vip } else { sink_direct }, time);
                lab.exec("node", "conntrack -F 2>/dev/null || true");
                let before = retransmits(&lab);
                let (rate, failed) = if vip {
                    conn_rate(&lab, conn_vip, clients, time)
                } else {
                    conn_rate(&lab, conn_direct, clients, time)
                };
                s.failed += failed;
                let retrans = retransmits(&lab) - before;
                if vip {
                    s.retransmits_vip += retrans;
                } else {
                    s.retransmits_direct += retrans;
                }
                if vip {
                    s.conn_vip.push(rate);
                    s.tput_vip.push(tput);
                } else {
                    s.conn_direct.push(rate);
                    s.tput_direct.push(tput);
                }
            }
            s.conn_ratio
                .push(s.conn_vip.last().unwrap() / s.conn_direct.last().unwrap());
            s.tput_ratio
                .push(s.tput_vip.last().unwrap() / s.tput_direct.last().unwrap());
            lab.on_node(|| b.cleanup()).unwrap();
            eprintln!(
                "round {}/{rounds} {mode}: conn/s {:.0} vs {:.0}, Gbit/s {:.2} vs {:.2}",
                r + 1,
                s.conn_vip.last().unwrap(),
                s.conn_direct.last().unwrap(),
                s.tput_vip.last().unwrap(),
                s.tput_direct.last().unwrap()
            );
        }
    }
    println!(
        "kernel {}, {rounds} rounds of {time:?} per measurement, {clients} connecting threads, \
         {:.0} s in all; load average before: {load_before}, after: {}\n",
        kernel.trim(),
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    println!(
        "| mode | conn/s VIP | conn/s direct | VIP / direct | Gbit/s VIP | Gbit/s direct | VIP / direct | failed connects | retransmits VIP / direct |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (mode, s) in modes.iter().zip(results.iter_mut()) {
        println!(
            "| {mode} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} / {} |",
            median(&mut s.conn_vip),
            median(&mut s.conn_direct),
            median(&mut s.conn_ratio),
            median(&mut s.tput_vip),
            median(&mut s.tput_direct),
            median(&mut s.tput_ratio),
            s.failed,
            s.retransmits_vip,
            s.retransmits_direct
        );
    }
}
