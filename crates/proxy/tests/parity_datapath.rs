//! Real packets for the cells of docs/proxy.md's mode-parity table that no other test covered:
//! externalIPs, internalTrafficPolicy Local, terminating endpoints, topology hints and IPv6,
//! each in the nftables, iptables and userspace modes (root only; skipped otherwise). The lab
//! is the datapath tests' (tests/common/lab.rs); the services are tests/fixtures/parity.
//! SCTP has no test: this machine's kernel has no SCTP sockets.

use std::io::{ErrorKind, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use weir_model::{plan, Plan, ProxyConfig, Snapshot, TopologyMode};
use weir_proxy::iptables::{IptablesBackend, IptablesOptions};
use weir_proxy::nft::{NftBackend, NftOptions};
use weir_proxy::userspace::UserspaceBackend;
use weir_proxy::Backend;
use weir_source::ManifestDir;

mod common;
use common::lab::{endpoints, Lab, IPTABLES_TOOLS};

const P1: &str = "10.244.1.5";
const P2: &str = "10.244.2.5";

/// The parity fixture's plan for node "node" in zone-a.
fn parity_plan() -> Plan {
    let mut d =
        ManifestDir::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity"));
    let r = d.scan();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let cfg = ProxyConfig {
        node_name: "node".into(),
        zone: Some("zone-a".into()),
        cluster_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:244::/48".parse().unwrap(),
        ],
        nodeport_addresses: vec!["0.0.0.0/0".parse().unwrap()],
        ..Default::default()
    };
    let p = plan(&Snapshot::from_objects(&d.objects()), &cfg);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    p
}

/// A lab with `mode`'s backend synced to the parity plan; cleaned up even on a panic.
struct Synced {
    b: Box<dyn Backend>,
    // Dropped after the backend's cleanup (fields drop in order).
    lab: Lab,
}

impl Synced {
    fn new(tag: &str, mode: &str) -> Option<Synced> {
        let (b, tools): (Box<dyn Backend>, Vec<&str>) = match mode {
            "nftables" => (
                Box::new(NftBackend::new(NftOptions::default())),
                vec!["nft"],
            ),
            "iptables" => (
                Box::new(IptablesBackend::new(IptablesOptions::default())),
                IPTABLES_TOOLS.to_vec(),
            ),
            "userspace" => (Box::new(UserspaceBackend::new()), vec!["nft"]),
            other => panic!("mode {other}"),
        };
        let lab = Lab::new(&format!("par-{tag}"), &tools)?;
        let mut s = Synced { b, lab };
        s.lab.sync(s.b.as_mut(), &parity_plan());
        Some(s)
    }

    /// The endpoints that answered `n` connections from the off-cluster client.
    fn seen(&self, addr: &str, n: usize) -> Vec<String> {
        let got = self.lab.get("client", addr, n);
        endpoints(&got).into_iter().map(str::to_string).collect()
    }
}

impl Drop for Synced {
    fn drop(&mut self) {
        let b = &mut self.b;
        let _ = self.lab.on_node(|| b.cleanup());
    }
}

fn external_ips(mode: &str) {
    let Some(s) = Synced::new(&format!("eip-{mode}"), mode) else {
        return;
    };
    // The client routes 203.0.113.10 to the node (its default route); only the rules for
    // the externalIP make anything answer there.
    assert_eq!(s.seen("203.0.113.10:80", 20), [P1, P2]);
}

fn internal_traffic_policy_local(mode: &str) {
    let Some(s) = Synced::new(&format!("itp-{mode}"), mode) else {
        return;
    };
    // p2 is ready but on node "other": never chosen for the ClusterIP.
    assert_eq!(s.seen("10.96.1.20:80", 20), [P1]);
}

fn terminating_endpoints(mode: &str) {
    let Some(s) = Synced::new(&format!("term-{mode}"), mode) else {
        return;
    };
    // No ready endpoint: the serving terminating p1 answers (without the fallback the
    // service would have no endpoint and be rejected); p2, not serving, never does.
    assert_eq!(s.seen("10.96.1.30:80", 20), [P1]);
}

fn topology_hints(mode: &str) {
    let plan = parity_plan();
    let hints = plan
        .services
        .iter()
        .find(|(k, _)| &*k.name == "hints")
        .unwrap();
    assert_eq!(hints.1.topology, TopologyMode::PreferSameZone);
    let Some(s) = Synced::new(&format!("hint-{mode}"), mode) else {
        return;
    };
    // Both ready; only p1 is hinted for this node's zone.
    assert_eq!(s.seen("10.96.1.40:80", 20), [P1]);
}

/// IPv6 addresses and routes on the lab (no DAD: usable at once), and a server on p1's
/// [::]:8081 greeting like the lab's echo server ("<its address> <the peer it sees>").
fn add_ipv6(lab: &Lab, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    let (node, p1, client) = (lab.ns("node"), lab.ns("p1"), lab.ns("client"));
    common::lab::sh(&format!(
        "set -e
         ip netns exec {node} sysctl -qw net.ipv6.conf.all.forwarding=1
         ip -n {node} addr add fd00:244:1::1/64 dev vp1 nodad
         ip -n {node} addr add fd00:77::1/64 dev vc nodad
         ip -n {p1} addr add fd00:244:1::5/64 dev eth0 nodad
         ip -n {p1} route add default via fd00:244:1::1
         ip -n {client} addr add fd00:77::2/64 dev eth0 nodad
         ip -n {client} route add default via fd00:77::1"
    ))
    .unwrap();
    let ns = lab.netns("p1");
    let (ready, up) = std::sync::mpsc::channel();
    let t = thread::spawn(move || {
        let _inside = ns.enter().unwrap();
        let l = TcpListener::bind("[::]:8081").unwrap();
        l.set_nonblocking(true).unwrap();
        ready.send(()).unwrap();
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((mut c, peer)) => {
                    let local = c.local_addr().unwrap();
                    let _ = writeln!(c, "{} {}", local.ip(), peer.ip());
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    });
    up.recv().unwrap();
    t
}

fn ipv6(mode: &str) {
    let Some(s) = Synced::new(&format!("six-{mode}"), mode) else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let server = add_ipv6(&s.lab, stop.clone());
    let seen = s.seen("[fd00:96::10]:80", 5);
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    assert_eq!(seen, ["fd00:244:1::5"]);
}

#[test]
fn external_ips_nftables() {
    external_ips("nftables");
}
#[test]
fn external_ips_iptables() {
    external_ips("iptables");
}
#[test]
fn external_ips_userspace() {
    external_ips("userspace");
}

#[test]
fn internal_traffic_policy_local_nftables() {
    internal_traffic_policy_local("nftables");
}
#[test]
fn internal_traffic_policy_local_iptables() {
    internal_traffic_policy_local("iptables");
}
#[test]
fn internal_traffic_policy_local_userspace() {
    internal_traffic_policy_local("userspace");
}

#[test]
fn terminating_endpoints_nftables() {
    terminating_endpoints("nftables");
}
#[test]
fn terminating_endpoints_iptables() {
    terminating_endpoints("iptables");
}
#[test]
fn terminating_endpoints_userspace() {
    terminating_endpoints("userspace");
}

#[test]
fn topology_hints_nftables() {
    topology_hints("nftables");
}
#[test]
fn topology_hints_iptables() {
    topology_hints("iptables");
}
#[test]
fn topology_hints_userspace() {
    topology_hints("userspace");
}

#[test]
fn ipv6_nftables() {
    ipv6("nftables");
}
#[test]
fn ipv6_iptables() {
    ipv6("iptables");
}
#[test]
fn ipv6_userspace() {
    ipv6("userspace");
}
