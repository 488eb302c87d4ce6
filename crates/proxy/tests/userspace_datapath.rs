//! Real connections through the userspace mode, in the lab's throwaway namespaces (root
//! only; skipped otherwise): nftables redirects to the proxy's listeners in the node, which
//! dial the pods' echo servers (see `common/lab.rs`).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use weir_model::{IpFamily, Plan, Protocol};
use weir_proxy::userspace::{DataPath, UserspaceBackend};
use weir_proxy::{Backend, SyncKind};

mod common;
use common::lab::{endpoints, load, Lab, EMPTY, SOLO, WEB};

const TOOLS: &[&str] = &["nft"];
const NODE_PORT: &str = "192.168.77.1:30080";

/// The backend, cleaned up (table deleted, listeners closed) even when a test panics.
struct Proxy<'a> {
    lab: &'a Lab,
    b: UserspaceBackend,
}

impl<'a> Proxy<'a> {
    fn sync(lab: &'a Lab, plan: &Plan) -> Proxy<'a> {
        Self::sync_with(lab, plan, UserspaceBackend::new())
    }

    fn sync_with(lab: &'a Lab, plan: &Plan, mut b: UserspaceBackend) -> Proxy<'a> {
        assert_eq!(lab.sync(&mut b, plan).kind, SyncKind::Full);
        Proxy { lab, b }
    }
}

impl Drop for Proxy<'_> {
    fn drop(&mut self) {
        let b = &mut self.b;
        let _ = self.lab.on_node(|| b.cleanup());
    }
}

#[test]
fn cluster_ip_and_node_port_reach_every_endpoint_through_the_proxy() {
    let Some(lab) = Lab::new("us-basic", TOOLS) else {
        return;
    };
    let plan = load();
    let mut p = Proxy::sync(&lab, &plan);
    assert_eq!(
        endpoints(&lab.get("client", WEB, 20)),
        ["10.244.1.5", "10.244.2.5"]
    );
    assert_eq!(endpoints(&lab.get("client", SOLO, 3)), ["10.244.1.5"]);
    assert_eq!(
        endpoints(&lab.get("client", NODE_PORT, 20)),
        ["10.244.1.5", "10.244.2.5"]
    );
    // From the node itself (output hook): the ClusterIP works too.
    assert_eq!(
        endpoints(&lab.get("node", WEB, 10)),
        ["10.244.1.5", "10.244.2.5"]
    );
    // The same plan again: nothing to do; the table intact.
    assert_eq!(lab.sync(&mut p.b, &plan).kind, SyncKind::Noop);
    // Flushed behind its back: noticed, and the next sync restores it.
    lab.exec("node", "nft flush table inet weir_userspace");
    assert!(!lab.on_node(|| p.b.intact()).unwrap());
    assert_eq!(lab.sync(&mut p.b, &plan).kind, SyncKind::Full);
    assert_eq!(endpoints(&lab.get("client", SOLO, 2)), ["10.244.1.5"]);
}

#[test]
fn a_service_without_endpoints_is_refused_at_once() {
    let Some(lab) = Lab::new("us-empty", TOOLS) else {
        return;
    };
    let _p = Proxy::sync(&lab, &load());
    for target in [EMPTY, "192.168.77.1:30040"] {
        let start = Instant::now();
        let err = lab.connect("client", target).unwrap_err();
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{target}: {err}"
        );
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "{target}: {:?}",
            start.elapsed()
        );
    }
}

/// p2's address disappears while clients keep connecting: every connection still succeeds
/// (the proxy's dial to p2 times out after 250 ms and it moves on to p1).
#[test]
fn a_dead_backend_is_skipped_and_no_client_sees_it() {
    let Some(lab) = Lab::new("us-dead", TOOLS) else {
        return;
    };
    let _p = Proxy::sync(&lab, &load());
    let before = lab.get("client", WEB, 10);
    assert_eq!(endpoints(&before), ["10.244.1.5", "10.244.2.5"]);
    // The pod dies without a word: no RST, no ICMP, the dial can only time out.
    lab.exec("p2", "ip addr del 10.244.2.5/24 dev eth0");
    let start = Instant::now();
    let after = lab.get("client", WEB, 20);
    assert_eq!(endpoints(&after), ["10.244.1.5"]);
    // Half of them paid one 250 ms dial timeout, none more.
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
}

/// UDP: a datagram to the ClusterIP reaches an endpoint, and the reply comes back from the
/// ClusterIP (conntrack undoes the redirect).
#[test]
fn udp_is_proxied_and_answers_come_from_the_service_address() {
    let Some(lab) = Lab::new("us-udp", TOOLS) else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let servers: Vec<_> = ["p1", "p2"]
        .into_iter()
        .map(|role| {
            let ns = lab.netns(role);
            let stop = stop.clone();
            let (ready, up) = std::sync::mpsc::channel();
            let t = thread::spawn(move || {
                let _inside = ns.enter().unwrap();
                let s = UdpSocket::bind("0.0.0.0:8080").unwrap();
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                ready.send(()).unwrap();
                let mut buf = [0u8; 512];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, peer)) = s.recv_from(&mut buf) {
                        let mut reply = format!("{role}:").into_bytes();
                        reply.extend_from_slice(&buf[..n]);
                        let _ = s.send_to(&reply, peer);
                    }
                }
            });
            up.recv().unwrap();
            t
        })
        .collect();
    let mut plan = load();
    let web = plan
        .services
        .keys()
        .find(|k| &*k.name == "web" && k.family == IpFamily::V4)
        .unwrap()
        .clone();
    let sp = plan.services[&web].clone();
    let mut udp = web.clone();
    udp.protocol = Protocol::Udp;
    plan.services.insert(udp, sp);
    let _p = Proxy::sync(&lab, &plan);
    let vip: SocketAddr = WEB.parse().unwrap();
    let seen: Vec<String> = (0..6)
        .map(|i| {
            let _inside = lab.netns("client").enter().unwrap();
            // A new source port each time: a new UDP "connection" for the proxy.
            let c = UdpSocket::bind("0.0.0.0:0").unwrap();
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            c.send_to(format!("ping{i}").as_bytes(), vip).unwrap();
            let mut buf = [0u8; 512];
            let (n, from) = c.recv_from(&mut buf).expect("UDP answer");
            assert_eq!(from, vip);
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(text.ends_with(&format!("ping{i}")), "{text}");
            text.split(':').next().unwrap().to_string()
        })
        .collect();
    // From the node itself (output hook: redirected to 127.0.0.1): the answer must still come
    // from the ClusterIP. (It did not when the listener replied with the route's source.)
    {
        let _inside = lab.netns("node").enter().unwrap();
        let c = UdpSocket::bind("0.0.0.0:0").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        c.connect(vip).unwrap();
        c.send(b"from-node").unwrap();
        let mut buf = [0u8; 512];
        let n = c
            .recv(&mut buf)
            .expect("UDP answer to the node's own datagram");
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with("from-node"));
    }
    stop.store(true, Ordering::Relaxed);
    for t in servers {
        t.join().unwrap();
    }
    assert!(
        seen.iter().any(|s| s == "p1") && seen.iter().any(|s| s == "p2"),
        "{seen:?}"
    );
}

/// `len` bytes of test stream `seed`: splitmix64 of each 8-byte word's index, so every
/// position has its own value and a lost, repeated or reordered chunk shows at its offset.
fn stream(seed: u64, len: u64) -> Arc<Vec<u8>> {
    let mut out = Vec::with_capacity(len as usize + 8);
    for word in 0..len.div_ceil(8) {
        let mut z = seed.wrapping_add(word.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len as usize);
    Arc::new(out)
}

/// Reads to EOF, comparing every byte with `expected`: (bytes read, first wrong offset).
fn check_stream(r: &mut impl Read, expected: &[u8]) -> std::io::Result<(u64, Option<u64>)> {
    let mut buf = vec![0u8; 64 * 1024];
    let (mut off, mut wrong) = (0usize, None);
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok((off as u64, wrong));
        }
        let want = expected.get(off..).unwrap_or_default();
        // The slice compare is a memcmp, fast even in a debug build; the scan only on a miss.
        if wrong.is_none() && want.get(..n) != Some(&buf[..n]) {
            wrong = (0..n)
                .find(|&i| want.get(i) != Some(&buf[i]))
                .map(|i| (off + i) as u64);
        }
        off += n;
    }
}

const UPLOAD: u64 = 0x5eed_0001;
const DOWNLOAD: u64 = 0x5eed_0002;
const BULK_PORT: u16 = 9090;

/// A server in `p1` on :9090: reads a client's stream to its EOF (the client's half-close,
/// which must travel through the proxy) comparing it with `upload`, answers with what it saw
/// — 8 bytes length, 8 bytes first wrong offset (u64::MAX: none) — then `download`, and
/// closes.
fn serve_bulk(lab: &Lab, upload: Arc<Vec<u8>>, download: Arc<Vec<u8>>) -> thread::JoinHandle<()> {
    let ns = lab.netns("p1");
    let (ready, up) = std::sync::mpsc::channel();
    let t = thread::spawn(move || {
        let _inside = ns.enter().unwrap();
        let l = TcpListener::bind(("0.0.0.0", BULK_PORT)).unwrap();
        ready.send(()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (n, wrong) = check_stream(&mut s, &upload).unwrap();
        s.write_all(&n.to_le_bytes()).unwrap();
        s.write_all(&wrong.unwrap_or(u64::MAX).to_le_bytes())
            .unwrap();
        s.write_all(&download).unwrap();
    });
    up.recv().unwrap();
    t
}

/// `solo` (10.96.0.20:80, one endpoint: p1) pointed at p1's bulk server instead.
fn bulk_plan() -> Plan {
    let mut plan = load();
    for (k, sp) in plan.services.iter_mut() {
        if &*k.name == "solo" {
            let sp = std::sync::Arc::make_mut(sp);
            for e in sp
                .cluster_endpoints
                .iter_mut()
                .chain(sp.local_endpoints.iter_mut())
            {
                e.port = BULK_PORT;
            }
        }
    }
    plan
}

/// 32 MiB each way through the ClusterIP, every byte checked at its offset; the upload ends
/// with the client's half-close and the download flows after it. Returns the backend's
/// (spliced, copied) byte counts.
fn bulk_transfer(tag: &str, path: DataPath) -> Option<(u64, u64)> {
    const LEN: u64 = 32 << 20;
    let lab = Lab::new(tag, TOOLS)?;
    let p = Proxy::sync_with(&lab, &bulk_plan(), UserspaceBackend::with_data_path(path));
    let (upload, download) = (stream(UPLOAD, LEN), stream(DOWNLOAD, LEN));
    let server = serve_bulk(&lab, upload.clone(), download.clone());
    let start = Instant::now();
    let (sent, answer, download) = {
        let _inside = lab.netns("client").enter().unwrap();
        let mut s = TcpStream::connect_timeout(&SOLO.parse().unwrap(), Duration::from_secs(2))
            .expect("connect to the ClusterIP");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut w = s.try_clone().unwrap();
        // Upload on its own thread: the server reads while we would otherwise block.
        let up = thread::spawn(move || {
            w.write_all(&upload)?;
            w.shutdown(Shutdown::Write)
        });
        let mut head = [0u8; 16];
        s.read_exact(&mut head)
            .expect("the server's answer after our half-close");
        let sent = up.join().unwrap();
        let download = check_stream(&mut s, &download).unwrap();
        (sent, head, download)
    };
    server.join().unwrap();
    sent.expect("upload");
    let elapsed = start.elapsed();
    let got = u64::from_le_bytes(answer[..8].try_into().unwrap());
    let wrong = u64::from_le_bytes(answer[8..].try_into().unwrap());
    assert_eq!(got, LEN, "{path:?}: bytes the endpoint received");
    assert_eq!(
        wrong,
        u64::MAX,
        "{path:?}: upload corrupted at offset {wrong}"
    );
    assert_eq!(
        download,
        (LEN, None),
        "{path:?}: download (length, first wrong offset)"
    );
    let t = p.b.traffic();
    eprintln!(
        "{path:?}: 2 × {} MiB in {elapsed:?}; spliced {} copied {}",
        LEN >> 20,
        t.spliced(),
        t.copied()
    );
    Some((t.spliced(), t.copied()))
}

#[test]
fn large_transfers_are_spliced_intact_both_ways_with_half_close() {
    let Some((spliced, copied)) = bulk_transfer("us-splice", DataPath::Splice) else {
        return;
    };
    // Every byte through splice(2): a silent fallback to copying would fail here.
    assert_eq!((spliced, copied), ((32 << 20) * 2 + 16, 0));
}

#[test]
fn large_transfers_are_copied_intact_both_ways_with_half_close() {
    let Some((spliced, copied)) = bulk_transfer("us-copy", DataPath::Copy) else {
        return;
    };
    assert_eq!((spliced, copied), (0, (32 << 20) * 2 + 16));
}

/// The endpoint half-closes first: its EOF reaches the client, and the client's bytes sent
/// after it still reach the endpoint (splice path).
#[test]
fn an_endpoint_half_close_reaches_the_client_and_the_other_direction_stays_open() {
    let Some(lab) = Lab::new("us-half", TOOLS) else {
        return;
    };
    let _p = Proxy::sync(&lab, &bulk_plan());
    let ns = lab.netns("p1");
    let (ready, up) = std::sync::mpsc::channel();
    let server = thread::spawn(move || {
        let _inside = ns.enter().unwrap();
        let l = TcpListener::bind(("0.0.0.0", BULK_PORT)).unwrap();
        ready.send(()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"bye").unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        rest
    });
    up.recv().unwrap();
    let _inside = lab.netns("client").enter().unwrap();
    let mut s = TcpStream::connect_timeout(&SOLO.parse().unwrap(), Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            panic!("no EOF after the endpoint's half-close")
        }
        Err(e) => panic!("{e}"),
    }
    assert_eq!(got, b"bye");
    s.write_all(b"still here").unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(server.join().unwrap(), b"still here");
}
