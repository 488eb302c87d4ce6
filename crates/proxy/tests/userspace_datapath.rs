//! Real connections through the userspace mode, in the lab's throwaway namespaces (root
//! only; skipped otherwise): nftables redirects to the proxy's listeners in the node, which
//! dial the pods' echo servers (see `common/lab.rs`).

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use weir_model::{IpFamily, Plan, Protocol};
use weir_proxy::userspace::UserspaceBackend;
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
        let mut b = UserspaceBackend::new();
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
        .find(|k| k.name == "web" && k.family == IpFamily::V4)
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
