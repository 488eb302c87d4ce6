//! A lab for datapath tests (root only; `Lab::new` returns `None` otherwise, after
//! `weir_testkit::can_run`: a failure under CI=true, a recorded skip elsewhere), in throwaway
//! network namespaces named after the test and the process:
//!
//! ```text
//!   p1 10.244.1.5 ──┐                      ┌── client 192.168.77.2 (off-cluster)
//!   p2 10.244.2.5 ──┤ node (the backend)   │
//!      10.244.2.6 ──┘  10.244.1.1 10.244.2.1 └ 192.168.77.1
//! ```
//!
//! The pods run an echo server on port 8080 that greets with "<its address> <the peer it
//! sees>" and then echoes lines; the test thread enters a namespace (weir_kernel::NetNs)
//! to sync a backend (the tools it runs inherit the namespace) or to connect.

use std::io::{self, BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use weir_kernel::NetNs;
use weir_model::{plan, Plan, ProxyConfig, Snapshot};
use weir_proxy::{Backend, SyncReport};
use weir_source::ManifestDir;

const ROLES: [&str; 4] = ["node", "p1", "p2", "client"];
/// The services of `tests/fixtures/iptables-datapath` (see `load`).
pub const WEB: &str = "10.96.0.10:80";
pub const SOLO: &str = "10.96.0.20:80";
pub const EMPTY: &str = "10.96.0.40:80";

pub fn sh(cmd: &str) -> Result<String, String> {
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

/// Root and every tool in `tools` (besides `ip`); without them the test is skipped (a failure
/// under CI=true, naming what is missing).
fn can_run(tools: &[&str]) -> bool {
    let tools: Vec<&str> = tools.iter().copied().chain(["ip"]).collect();
    weir_testkit::can_run(weir_testkit::missing(true, &tools))
}

/// The tools the iptables mode runs.
pub const IPTABLES_TOOLS: &[&str] = &[
    "iptables",
    "iptables-restore",
    "iptables-save",
    "ip6tables-restore",
];

/// The namespaces, echo servers and their teardown (also when a test panics).
pub struct Lab {
    prefix: String,
    created: Vec<String>,
    stop: Arc<AtomicBool>,
    servers: Vec<JoinHandle<()>>,
}

impl Lab {
    /// `None` when the test cannot run here (not root, or one of `tools` missing): skipped and
    /// recorded, or a panic naming what is missing under CI=true.
    /// Namespaces are named `wipt-<tag>-<pid>-<role>`: `tag` must be unique per test.
    pub fn new(tag: &str, tools: &[&str]) -> Option<Lab> {
        if !can_run(tools) {
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

    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    pub fn netns(&self, role: &str) -> NetNs {
        NetNs::named(&self.ns(role)).unwrap()
    }

    /// Runs `cmd` inside `role`'s namespace.
    pub fn exec(&self, role: &str, cmd: &str) -> String {
        sh(&format!("ip netns exec {} {cmd}", self.ns(role))).unwrap()
    }

    /// Echo server on 0.0.0.0:8080 in `role`'s namespace, listening when this returns.
    pub fn serve(&mut self, role: &str) {
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

    /// Syncs `b` inside the node's namespace.
    pub fn sync(&self, b: &mut dyn Backend, p: &Plan) -> SyncReport {
        let _inside = self.netns("node").enter().unwrap();
        b.sync(p).unwrap()
    }

    /// Runs `f` inside the node's namespace.
    pub fn on_node<T>(&self, f: impl FnOnce() -> T) -> T {
        let _inside = self.netns("node").enter().unwrap();
        f()
    }

    /// Connects from `role`; returns the stream and the greeting ("<endpoint> <peer>").
    pub fn connect(&self, role: &str, addr: &str) -> io::Result<(BufReader<TcpStream>, String)> {
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
    pub fn get(&self, role: &str, addr: &str, n: usize) -> Vec<(String, String)> {
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

    pub fn save(&self, tool: &str) -> String {
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

/// The plan of `tests/fixtures/iptables-datapath` for the lab's node: `web` (two endpoints),
/// `solo` (p1), `empty` (no endpoints), NodePorts on every local address.
pub fn load() -> Plan {
    load_with(|_| {})
}

/// [`load`] with `adjust` applied to the planner's configuration.
pub fn load_with(adjust: impl FnOnce(&mut ProxyConfig)) -> Plan {
    let mut d = ManifestDir::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/iptables-datapath"),
    );
    let r = d.scan();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let mut cfg = ProxyConfig {
        node_name: "node".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        // Every local address: exercises `-m addrtype --dst-type LOCAL`.
        nodeport_addresses: vec!["0.0.0.0/0".parse().unwrap()],
        ..Default::default()
    };
    adjust(&mut cfg);
    plan(&Snapshot::from_objects(&d.objects()), &cfg)
}

/// The endpoints seen, sorted and deduplicated.
pub fn endpoints(seen: &[(String, String)]) -> Vec<&str> {
    let mut v: Vec<&str> = seen.iter().map(|(e, _)| e.as_str()).collect();
    v.sort();
    v.dedup();
    v
}

/// The number of rules in `table`/`chain` jumping to `target`, in iptables-save output.
pub fn count_jumps(save: &str, table: &str, chain: &str, target: &str) -> usize {
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

/// Every jump of weir's iptables mode exists exactly once (both families).
pub fn assert_jumps_once(lab: &Lab) {
    for tool in ["iptables-save", "ip6tables-save"] {
        let save = lab.save(tool);
        for j in weir_proxy::iptables::jumps() {
            let n = count_jumps(&save, j.table.name(), j.chain, j.target());
            assert_eq!(n, 1, "{tool}: {j:?} appears {n} times:\n{save}");
        }
    }
}
