//! Real packets through the iptables mode, inside throwaway network namespaces (root only;
//! skipped otherwise). Each test builds its own lab, named after the test and the process:
//!
//! ```text
//!   p1 10.244.1.5 ──┐                      ┌── client 192.168.77.2 (off-cluster)
//!   p2 10.244.2.5 ──┤ node (IptablesBackend) │
//!      10.244.2.6 ──┘  10.244.1.1 10.244.2.1 └ 192.168.77.1
//! ```
//!
//! The pods run an echo server on port 8080 that greets with "<its address> <the peer it
//! sees>" and then echoes lines; the test thread enters a namespace (weir_kernel::NetNs)
//! to sync the backend (the iptables tools it runs inherit the namespace) or to connect.

use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use weir_kernel::NetNs;
use weir_model::{plan, Plan, ProxyConfig, Snapshot};
use weir_proxy::iptables::{jumps, IptablesBackend, IptablesOptions};
use weir_proxy::{Backend, SyncKind, SyncReport};
use weir_source::ManifestDir;

const ROLES: [&str; 4] = ["node", "p1", "p2", "client"];
const WEB: &str = "10.96.0.10:80";
const SOLO: &str = "10.96.0.20:80";
const EMPTY: &str = "10.96.0.40:80";

fn sh(cmd: &str) -> Result<String, String> {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn can_run() -> bool {
    let root = sh("id -u").is_ok_and(|o| o.trim() == "0");
    let tools = [
        "ip",
        "iptables-restore",
        "iptables-save",
        "ip6tables-restore",
    ]
    .iter()
    .all(|t| sh(&format!("command -v {t}")).is_ok());
    if !(root && tools) {
        eprintln!("skipping: needs root, ip, iptables-restore, iptables-save, ip6tables-restore");
    }
    root && tools
}

/// The namespaces, echo servers and their teardown (also when a test panics).
struct Lab {
    prefix: String,
    created: Vec<String>,
    stop: Arc<AtomicBool>,
    servers: Vec<JoinHandle<()>>,
}

impl Lab {
    /// `None` when the test cannot run here.
    fn new(tag: &str) -> Option<Lab> {
        if !can_run() {
            return None;
        }
        let mut lab = Lab {
            prefix: format!("wipt-{tag}-{}", std::process::id()),
            created: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            servers: Vec::new(),
        };
        for role in ROLES {
            let n = lab.ns(role);
            sh(&format!("ip netns add {n}")).unwrap();
            lab.created.push(n);
        }
        let [node, p1, p2, client] = ROLES.map(|r| lab.ns(r));
        let setup = format!(
            "set -e
             ip link add vp1 netns {node} type veth peer name eth0 netns {p1}
             ip link add vp2 netns {node} type veth peer name eth0 netns {p2}
             ip link add vc netns {node} type veth peer name eth0 netns {client}
             ip -n {node} addr add 10.244.1.1/24 dev vp1
             ip -n {node} addr add 10.244.2.1/24 dev vp2
             ip -n {node} addr add 192.168.77.1/24 dev vc
             for l in lo vp1 vp2 vc; do ip -n {node} link set $l up; done
             ip netns exec {node} sysctl -qw net.ipv4.ip_forward=1
             # Like a real node, a default route (here: towards the client): a VIP
             # without DNAT must be routable for the FORWARD/OUTPUT reject to see it.
             ip -n {node} route add default via 192.168.77.2
             # That route sends the client's packets back out the interface they came
             # in on, which makes the kernel send an ICMP redirect first; the redirect uses
             # up the per-peer ICMP token, suppressing the REJECT's port-unreachable.
             ip netns exec {node} sysctl -qw net.ipv4.conf.all.send_redirects=0
             ip netns exec {node} sysctl -qw net.ipv4.conf.vc.send_redirects=0
             ip -n {p1} addr add 10.244.1.5/24 dev eth0
             ip -n {p2} addr add 10.244.2.5/24 dev eth0
             ip -n {p2} addr add 10.244.2.6/24 dev eth0
             ip -n {client} addr add 192.168.77.2/24 dev eth0
             for n in {p1} {p2} {client}; do ip -n $n link set lo up; ip -n $n link set eth0 up; done
             ip -n {p1} route add default via 10.244.1.1
             ip -n {p2} route add default via 10.244.2.1
             ip -n {client} route add default via 192.168.77.1"
        );
        sh(&setup).unwrap();
        lab.serve("p1");
        lab.serve("p2");
        Some(lab)
    }

    fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    fn netns(&self, role: &str) -> NetNs {
        NetNs::named(&self.ns(role)).unwrap()
    }

    /// Runs `cmd` inside `role`'s namespace.
    fn exec(&self, role: &str, cmd: &str) -> String {
        sh(&format!("ip netns exec {} {cmd}", self.ns(role))).unwrap()
    }

    /// Echo server on 0.0.0.0:8080 in `role`'s namespace, listening when this returns.
    fn serve(&mut self, role: &str) {
        let ns = self.netns(role);
        let stop = self.stop.clone();
        let (ready, listening) = mpsc::channel();
        self.servers.push(thread::spawn(move || {
            let _inside = ns.enter().unwrap();
            let l = TcpListener::bind("0.0.0.0:8080").unwrap();
            l.set_nonblocking(true).unwrap();
            ready.send(()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        let stop = stop.clone();
                        thread::spawn(move || echo(s, &stop));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5))
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        }));
        listening.recv().unwrap();
    }

    fn sync(&self, b: &mut IptablesBackend, p: &Plan) -> SyncReport {
        let _inside = self.netns("node").enter().unwrap();
        b.sync(p).unwrap()
    }

    /// Connects from `role`; returns the stream and the greeting ("<endpoint> <peer>").
    fn connect(&self, role: &str, addr: &str) -> io::Result<(BufReader<TcpStream>, String)> {
        let _inside = self.netns(role).enter()?;
        let a: SocketAddr = addr.parse().unwrap();
        let s = TcpStream::connect_timeout(&a, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut r = BufReader::new(s);
        let mut greeting = String::new();
        r.read_line(&mut greeting)?;
        Ok((r, greeting.trim().to_string()))
    }

    /// `n` connections from `role`: the (endpoint, peer) pairs seen.
    fn get(&self, role: &str, addr: &str, n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|_| {
                let (_, g) = self
                    .connect(role, addr)
                    .unwrap_or_else(|e| panic!("{role} → {addr}: {e}"));
                let (ep, peer) = g.split_once(' ').unwrap();
                (ep.to_string(), peer.to_string())
            })
            .collect()
    }

    fn save(&self, tool: &str) -> String {
        self.exec("node", tool)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for s in self.servers.drain(..) {
            let _ = s.join();
        }
        for n in &self.created {
            let _ = sh(&format!("ip netns del {n}"));
        }
    }
}

fn echo(s: TcpStream, stop: &AtomicBool) {
    let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) else {
        return;
    };
    let Ok(mut w) = s.try_clone() else { return };
    if writeln!(w, "{} {}", local.ip(), peer.ip()).is_err() {
        return;
    }
    let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match r.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                if w.write_all(line.as_bytes()).is_err() {
                    return;
                }
                line.clear();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

fn load() -> Plan {
    let mut d = ManifestDir::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/iptables-datapath"),
    );
    let r = d.scan();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let cfg = ProxyConfig {
        node_name: "node".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        // Every local address: exercises `-m addrtype --dst-type LOCAL`.
        nodeport_addresses: vec!["0.0.0.0/0".parse().unwrap()],
        ..Default::default()
    };
    plan(&Snapshot::from_objects(&d.objects()), &cfg)
}

/// `p` with web's endpoint `from` replaced by `to`.
fn replace_web_endpoint(p: &Plan, from: &str, to: &str) -> Plan {
    let mut p = p.clone();
    let web = p.services.keys().find(|k| k.name == "web").unwrap().clone();
    let eps = &mut std::sync::Arc::make_mut(p.services.get_mut(&web).unwrap()).cluster_endpoints;
    let ep = eps.iter_mut().find(|e| e.ip.to_string() == from).unwrap();
    ep.ip = to.parse().unwrap();
    eps.sort();
    p
}

fn endpoints(seen: &[(String, String)]) -> Vec<&str> {
    let mut v: Vec<&str> = seen.iter().map(|(e, _)| e.as_str()).collect();
    v.sort();
    v.dedup();
    v
}

/// The number of rules in `table`/`chain` jumping to `target`, in iptables-save output.
fn count_jumps(save: &str, table: &str, chain: &str, target: &str) -> usize {
    let mut in_table = false;
    save.lines()
        .filter(|l| {
            if let Some(t) = l.strip_prefix('*') {
                in_table = t == table;
            }
            in_table
                && l.starts_with(&format!("-A {chain} "))
                && l.ends_with(&format!("-j {target}"))
        })
        .count()
}

fn assert_jumps_once(lab: &Lab) {
    for tool in ["iptables-save", "ip6tables-save"] {
        let save = lab.save(tool);
        for j in jumps() {
            let n = count_jumps(&save, j.table.name(), j.chain, j.target());
            assert_eq!(n, 1, "{tool}: {j:?} appears {n} times:\n{save}");
        }
    }
}

#[test]
fn cluster_ip_spreads_over_endpoints() {
    let Some(lab) = Lab::new("spread") else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    let r = lab.sync(&mut b, &load());
    assert_eq!(r.kind, SyncKind::Full);
    assert_eq!(r.service_ports_touched, 3);

    // Off-cluster client: both endpoints, always masqueraded (the pod sees the node).
    let seen = lab.get("client", WEB, 60);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.5"], "{seen:?}");
    for (ep, peer) in &seen {
        let node_side = if ep == "10.244.1.5" {
            "10.244.1.1"
        } else {
            "10.244.2.1"
        };
        assert_eq!(
            peer, node_side,
            "off-cluster source not masqueraded: {seen:?}"
        );
    }
    // From pod p2 (in the cluster CIDR): p1 sees p2's own address.
    let seen = lab.get("p2", WEB, 30);
    assert!(
        seen.iter()
            .filter(|(ep, _)| ep == "10.244.1.5")
            .all(|(_, peer)| peer == "10.244.2.5"),
        "{seen:?}"
    );
}

#[test]
fn node_port_forwards() {
    let Some(lab) = Lab::new("nodeport") else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &load());
    let seen = lab.get("client", "192.168.77.1:30080", 30);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.5"], "{seen:?}");
    // External traffic (policy Cluster) is masqueraded.
    assert!(
        seen.iter()
            .all(|(_, peer)| peer.starts_with("10.244.") && peer.ends_with(".1")),
        "{seen:?}"
    );
    // The node itself reaches its node port on another of its addresses (nat OUTPUT).
    let seen = lab.get("node", "10.244.1.1:30080", 5);
    assert!(!seen.is_empty());
}

#[test]
fn service_without_endpoints_is_refused_fast() {
    let Some(lab) = Lab::new("reject") else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &load());
    // Forwarded (client → ClusterIP), local (node → ClusterIP), node port (INPUT).
    for (role, addr) in [
        ("client", EMPTY),
        ("node", EMPTY),
        ("client", "192.168.77.1:30040"),
    ] {
        let start = Instant::now();
        let err = lab.connect(role, addr).err();
        let took = start.elapsed();
        assert_eq!(
            err.as_ref().map(|e| e.kind()),
            Some(ErrorKind::ConnectionRefused),
            "{role} → {addr}: {err:?}"
        );
        assert!(
            took < Duration::from_secs(1),
            "{role} → {addr}: refused after {took:?}"
        );
    }
}

#[test]
fn hairpin_is_masqueraded() {
    let Some(lab) = Lab::new("hairpin") else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &load());
    // p1 reaches itself through `solo`: the reply must come back through the node, so
    // the node masquerades (p1 sees the node's address, not its own).
    let seen = lab.get("p1", SOLO, 3);
    for (ep, peer) in &seen {
        assert_eq!((ep.as_str(), peer.as_str()), ("10.244.1.5", "10.244.1.1"));
    }
}

#[test]
fn incremental_update_replaces_one_endpoint() {
    let Some(lab) = Lab::new("update") else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    let v1 = load();
    assert_eq!(lab.sync(&mut b, &v1).kind, SyncKind::Full);
    assert_eq!(lab.sync(&mut b, &v1).kind, SyncKind::Noop);
    let before = lab.save("iptables-save");

    let v2 = replace_web_endpoint(&v1, "10.244.2.5", "10.244.2.6");
    let r = lab.sync(&mut b, &v2);
    assert_eq!((r.kind, r.service_ports_touched), (SyncKind::Partial, 1));
    let seen = lab.get("client", WEB, 40);
    assert_eq!(endpoints(&seen), ["10.244.1.5", "10.244.2.6"], "{seen:?}");

    // The old endpoint's chain is gone; the other services' chains are untouched.
    let after = lab.save("iptables-save");
    let seps = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with(":KUBE-SEP-"))
            .map(|l| l[1..].split(' ').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(seps(&before).len(), seps(&after).len(), "{after}");
    assert_ne!(seps(&before), seps(&after));
    assert!(
        after.contains("--to-destination 10.244.2.6:8080"),
        "{after}"
    );
    assert!(
        !after.contains("--to-destination 10.244.2.5:8080"),
        "{after}"
    );
    assert_jumps_once(&lab);
}

#[test]
fn restart_is_full_and_keeps_one_set_of_jumps() {
    let Some(lab) = Lab::new("restart") else {
        return;
    };
    let v1 = load();
    let mut first = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut first, &v1);
    assert_jumps_once(&lab);
    // A connection established before the restart (`solo` has one endpoint: p1).
    let (mut conn, greeting) = lab.connect("client", SOLO).unwrap();
    assert!(greeting.starts_with("10.244.1.5 "), "{greeting}");

    // The restarted process brings a changed plan: 10.244.2.5's chain is stale.
    drop(first);
    let v2 = replace_web_endpoint(&v1, "10.244.2.5", "10.244.2.6");
    let mut second = IptablesBackend::new(IptablesOptions::default());
    let r = lab.sync(&mut second, &v2);
    assert_eq!((r.kind, r.service_ports_touched), (SyncKind::Full, 3));
    assert_jumps_once(&lab);
    let save = lab.save("iptables-save");
    assert!(
        !save.contains("10.244.2.5:8080"),
        "stale endpoint chain left:\n{save}"
    );
    assert_eq!(
        endpoints(&lab.get("client", WEB, 40)),
        ["10.244.1.5", "10.244.2.6"]
    );

    // The established connection kept working through the restart.
    conn.get_mut().write_all(b"ping\n").unwrap();
    let mut line = String::new();
    conn.read_line(&mut line).unwrap();
    assert_eq!(line, "ping\n");

    // Once more, same plan.
    let mut third = IptablesBackend::new(IptablesOptions::default());
    assert_eq!(lab.sync(&mut third, &v2).kind, SyncKind::Full);
    assert_eq!(lab.sync(&mut third, &v2).kind, SyncKind::Noop);
    assert_jumps_once(&lab);
}

#[test]
fn a_failed_sync_is_followed_by_a_full_one() {
    let Some(lab) = Lab::new("failed") else {
        return;
    };
    let v1 = load();
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &v1);
    // Behind the backend's back, remove `solo`'s chains: the next partial update (of `web`)
    // rewrites KUBE-SERVICES, which jumps to them, and fails.
    let save = lab.save("iptables-save");
    let solo: Vec<&str> = save
        .lines()
        .filter(|l| l.contains("default/solo") && l.starts_with("-A KUBE-SVC-"))
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    let solo_svc = solo[0].to_string();
    lab.exec("node", "iptables -t nat -F KUBE-SERVICES");
    lab.exec("node", &format!("iptables -t nat -F {solo_svc}"));
    lab.exec("node", &format!("iptables -t nat -X {solo_svc}"));
    let v2 = replace_web_endpoint(&v1, "10.244.2.5", "10.244.2.6");
    let err = {
        let _inside = lab.netns("node").enter().unwrap();
        b.sync(&v2).unwrap_err()
    };
    assert!(err.to_string().contains("iptables-restore"), "{err}");
    // Next sync: full, and everything works again.
    assert_eq!(lab.sync(&mut b, &v2).kind, SyncKind::Full);
    assert_eq!(endpoints(&lab.get("client", SOLO, 3)), ["10.244.1.5"]);
    assert_eq!(
        endpoints(&lab.get("client", WEB, 40)),
        ["10.244.1.5", "10.244.2.6"]
    );
}

#[test]
fn flushed_tables_are_detected_and_restored() {
    let Some(lab) = Lab::new("flush") else {
        return;
    };
    let v1 = load();
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &v1);
    // Someone flushes the nat table (all rules, all user chains, our jumps included).
    lab.exec("node", "iptables -t nat -F");
    lab.exec("node", "iptables -t nat -X");
    assert!(lab.connect("client", SOLO).is_err());
    // The same plan again: the missing canary turns the no-op into a full sync.
    assert_eq!(lab.sync(&mut b, &v1).kind, SyncKind::Full);
    assert_jumps_once(&lab);
    assert_eq!(endpoints(&lab.get("client", SOLO, 3)), ["10.244.1.5"]);
}

#[test]
fn cleanup_leaves_no_kube_chain() {
    let Some(lab) = Lab::new("cleanup") else {
        return;
    };
    let mut b = IptablesBackend::new(IptablesOptions::default());
    lab.sync(&mut b, &load());
    let cleanup = |b: &mut IptablesBackend| {
        let _inside = lab.netns("node").enter().unwrap();
        b.cleanup().unwrap();
    };
    cleanup(&mut b);
    for tool in ["iptables-save", "ip6tables-save"] {
        let save = lab.save(tool);
        assert!(!save.contains("KUBE-"), "{tool}:\n{save}");
        assert!(
            !save.lines().any(|l| l.starts_with("-A ")),
            "{tool}:\n{save}"
        );
    }
    assert!(lab.connect("client", WEB).is_err());
    // Absence is fine; and a new sync starts from scratch.
    cleanup(&mut b);
    assert_eq!(lab.sync(&mut b, &load()).kind, SyncKind::Full);
    assert_jumps_once(&lab);
    cleanup(&mut IptablesBackend::new(IptablesOptions::default()));
    assert!(!lab.save("iptables-save").contains("KUBE-"));
}
