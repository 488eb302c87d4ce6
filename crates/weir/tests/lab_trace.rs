//! The differential matrix (issue 14 item 4): for a matrix of packets on real lab nodes, what
//! `weir trace` says (run on directories `weir trace collect` wrote) must be what the kernel
//! does with the real packet. Needs root.
//!
//! Each topology is brought up once per test and every packet of the matrix is run over it:
//! - trace's side: `weir trace --json` on the node where the packet enters, and when the packet
//!   leaves that node for another lab node, again on that node with the packet as it left
//!   (after DNAT and masquerade), arriving on the interface of the same name. Where the rules
//!   choose among endpoints, trace walks each (`endpoint_outcomes`), and each endpoint's walk is
//!   continued on its own: the row's trace side is one outcome per endpoint (the first drop or
//!   reject, else "delivered" to that endpoint's echo server).
//! - the kernel's side: TCP connections (or UDP datagrams) from the client's namespace, each
//!   attributed to an endpoint: the echo server that answers names itself; a connection that
//!   times out is looked up in the entry node's conntrack table (the entry it left, by its
//!   source port, gives the endpoint DNAT chose) and located by the counters that rose while it
//!   was tried (iptables' FORWARD policy counter, the kernel's TcpExtIPReversePathFilter, the
//!   VPC's source-check counter); a refused connection is "rejected". Connections are repeated
//!   until every endpoint trace names has been reached (at most 24).
//!
//! A row agrees when every connection's outcome is the one trace gives for its endpoint (a
//! connection whose endpoint is unknown: one trace gives for some endpoint), and every
//! endpoint trace walked was reached by some connection with that outcome. The table is
//! printed; any disagreeing row fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use weir_kernel::NetNs;
use weir_lab::state::LabState;

mod common;
use common::*;

/// What happened to a packet, on either side.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Answered by (or, for trace, delivered to one of) these echo servers.
    Delivered(BTreeSet<String>),
    /// Handed to a user-space proxy's listener on this node (trace's view of userspace mode;
    /// the kernel's side checks the listener exists and the connection is answered).
    Proxied(String),
    /// Dropped; where (`FORWARD policy on a`, `rp_filter on b`, `source check`).
    Dropped(String),
    Rejected,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Delivered(s) => {
                let v: Vec<&str> = s.iter().map(String::as_str).collect();
                write!(f, "delivered {{{}}}", v.join(","))
            }
            Outcome::Proxied(n) => write!(f, "proxied on {n}"),
            Outcome::Dropped(w) => write!(f, "dropped: {w}"),
            Outcome::Rejected => write!(f, "rejected"),
        }
    }
}

/// An endpoint (its echo server's name, when known) and what happened on the way to it.
type Path = (Option<String>, Outcome);

/// Outcomes per endpoint: trace's each once ("b1: dropped: rp_filter on a"), the kernel's
/// counted ("b1: dropped: rp_filter on a ×3"); a lone outcome without endpoint as it is.
fn show_paths(paths: &[Path], counted: bool) -> String {
    let mut seen: Vec<(String, usize)> = Vec::new();
    for (ep, o) in paths {
        let text = match (ep, o) {
            (_, Outcome::Delivered(_)) | (None, _) => o.to_string(),
            (Some(e), o) => format!("{e}: {o}"),
        };
        match seen.iter_mut().find(|(t, _)| *t == text) {
            Some((_, n)) => *n += 1,
            None => seen.push((text, 1)),
        }
    }
    seen.iter()
        .map(|(t, n)| {
            if counted {
                format!("{t} ×{n}")
            } else {
                t.clone()
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[derive(Debug, Clone, Copy)]
enum Client {
    Pod(&'static str),
    Outside,
}

#[derive(Debug, Clone, Copy)]
enum Dest {
    ClusterIp(&'static str),
    /// The service's NodePort on this node's address.
    NodePort(&'static str, &'static str),
    LoadBalancer(&'static str),
}

#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    client: Client,
    to: Dest,
    udp: bool,
    /// Over IPv6 (a dual-stack lab): the pod's, node's, outside's and ClusterIP's IPv6
    /// addresses.
    v6: bool,
}

fn case(name: &'static str, client: Client, to: Dest) -> Case {
    Case {
        name,
        client,
        to,
        udp: false,
        v6: false,
    }
}

/// The same packet over IPv6.
fn v6(c: Case) -> Case {
    Case { v6: true, ..c }
}

impl Case {
    fn label(&self) -> String {
        if self.v6 {
            format!("{} [IPv6]", self.name)
        } else {
            self.name.to_string()
        }
    }
}

/// A lab up for one test, its state, and where each node's state was collected.
struct Matrix<'a> {
    lab: &'a Lab,
    state: LabState,
    collected: tempfile::TempDir,
    phase: usize,
}

impl Matrix<'_> {
    fn node_ns(&self, node: &str) -> String {
        format!("wl-{}-{node}", self.lab.name)
    }

    fn exec(&self, ns: &str, cmd: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "sh", "-c", cmd])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{ns}: {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `weir trace collect` on every node, into a fresh directory per phase.
    fn collect(&mut self) {
        self.phase += 1;
        for n in &self.state.nodes {
            let dir = self.dir(&n.name);
            let out = self.lab.weir(&[
                "trace",
                "collect",
                dir.to_str().unwrap(),
                "--netns",
                &n.netns,
            ]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    fn dir(&self, node: &str) -> PathBuf {
        self.collected.path().join(format!("{}-{node}", self.phase))
    }

    fn node_ip(&self, node: &str) -> Ipv4Addr {
        self.state
            .nodes
            .iter()
            .find(|n| n.name == node)
            .unwrap()
            .underlay_ip
    }

    /// A node's underlay address of the family asked for.
    fn node_ip_of(&self, node: &str, v6: bool) -> IpAddr {
        let n = self.state.nodes.iter().find(|n| n.name == node).unwrap();
        match v6 {
            false => n.underlay_ip.into(),
            true => n.underlay_ip6.expect("a dual-stack lab").into(),
        }
    }

    /// Who answers at `ip`: (its echo server's name, its node), for a pod or a node.
    fn owner(&self, ip: IpAddr) -> Option<(String, String)> {
        let is = |v4: Ipv4Addr, v6: Option<Ipv6Addr>| {
            IpAddr::from(v4) == ip || v6.map(IpAddr::from) == Some(ip)
        };
        let pod = self.state.pods.iter().find(|p| is(p.ip, p.ip6));
        pod.map(|p| (p.name.clone(), p.node.clone())).or_else(|| {
            let node = self
                .state
                .nodes
                .iter()
                .find(|n| is(n.underlay_ip, n.underlay_ip6))?;
            Some((node.name.clone(), node.name.clone()))
        })
    }

    /// The echo server at `ip` (a pod's or a node's name).
    fn echo_name(&self, ip: IpAddr) -> Option<String> {
        self.owner(ip).map(|(name, _)| name)
    }

    /// The node whose pod or whose address `ip` is.
    fn node_of(&self, ip: IpAddr) -> Option<String> {
        self.owner(ip).map(|(_, node)| node)
    }

    fn service(&self, name: &str) -> &weir_lab::state::ServiceState {
        self.state
            .services
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no service {name}"))
    }

    /// (client namespace, source address to bind, first node, input interface there,
    /// destination).
    fn endpoints(&self, c: &Case) -> (String, IpAddr, String, String, SocketAddr) {
        let dst = match c.to {
            Dest::ClusterIp(s) => {
                let s = self.service(s);
                let ip = match c.v6 {
                    false => s.cluster_ip.into(),
                    true => s.cluster_ip6.expect("a dual-stack service").into(),
                };
                SocketAddr::new(ip, s.port)
            }
            Dest::NodePort(s, node) => SocketAddr::new(
                self.node_ip_of(node, c.v6),
                self.service(s).node_port.unwrap(),
            ),
            Dest::LoadBalancer(s) => {
                assert!(!c.v6, "LoadBalancer IPs are IPv4 only");
                let s = self.service(s);
                SocketAddr::new(s.load_balancer_ip.unwrap().into(), s.port)
            }
        };
        match c.client {
            Client::Pod(pod) => {
                let p = self.state.pods.iter().find(|p| p.name == pod).unwrap();
                let node = p.node.clone();
                let iif = self.host_veth(&node, &p.netns);
                let ip = match c.v6 {
                    false => p.ip.into(),
                    true => p.ip6.expect("a dual-stack pod").into(),
                };
                (p.netns.clone(), ip, node, iif, dst)
            }
            Client::Outside => {
                let node = match c.to {
                    Dest::NodePort(_, n) => n.to_string(),
                    Dest::LoadBalancer(s) => self.service(s).load_balancer_node.clone().unwrap(),
                    Dest::ClusterIp(_) => panic!("the outside does not route ClusterIPs"),
                };
                let outside = match c.v6 {
                    false => self.state.outside.into(),
                    true => self.state.outside6.expect("a dual-stack lab").into(),
                };
                (
                    format!("wl-{}-out", self.lab.name),
                    outside,
                    node,
                    "eth0".into(),
                    dst,
                )
            }
        }
    }

    /// The node-side veth of a pod: the node's interface whose index the pod's eth0 names as
    /// its peer.
    fn host_veth(&self, node: &str, pod_ns: &str) -> String {
        let link: Value = serde_json::from_str(&self.exec(pod_ns, "ip -j link show eth0")).unwrap();
        let peer = link[0]["link_index"].as_u64().unwrap();
        let links: Value =
            serde_json::from_str(&self.exec(&self.node_ns(node), "ip -j link show")).unwrap();
        links
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["ifindex"].as_u64() == Some(peer))
            .and_then(|l| l["ifname"].as_str())
            .unwrap()
            .to_string()
    }

    /// Drop counters of every node and the VPC, to locate a drop.
    fn counters(&self) -> Vec<(String, u64)> {
        let mut v = Vec::new();
        for n in &self.state.nodes {
            // IPv4's and IPv6's FORWARD policies, one counter (trace names either alike).
            let mut dropped = 0;
            for tool in ["iptables", "ip6tables"] {
                let policy = self.exec(
                    &n.netns,
                    &format!("{tool} -t filter -L FORWARD -v -x -n 2>/dev/null | head -1"),
                );
                // "Chain FORWARD (policy DROP 3 packets, 180 bytes)"
                dropped += policy
                    .split("policy DROP ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|x| x.parse::<u64>().ok())
                    .unwrap_or(0);
            }
            v.push((format!("FORWARD policy on {}", n.name), dropped));
            let rp = weir_lab::eni::rp_filter_drops(&n.netns).unwrap_or(0);
            v.push((format!("rp_filter on {}", n.name), rp));
        }
        v.push((
            "source check".into(),
            weir_lab::eni::counters(&self.state).source_check,
        ));
        v
    }

    /// The entry node's conntrack entries of connections from `src` to `dst`: each one's
    /// source port and the address its reply comes from (the endpoint DNAT chose).
    fn ct_entries(&self, node: &str, src: IpAddr, dst: SocketAddr) -> BTreeMap<u16, IpAddr> {
        let family = if src.is_ipv6() { "ipv6" } else { "ipv4" };
        let out = self.exec(
            &self.node_ns(node),
            &format!(
                "conntrack -L -f {family} -p tcp -s {src} -d {} --dport {} 2>/dev/null || true",
                dst.ip(),
                dst.port()
            ),
        );
        out.lines()
            .filter_map(|l| {
                let field = |k: &str, nth: usize| {
                    l.split_whitespace()
                        .filter_map(|w| w.strip_prefix(k))
                        .nth(nth)
                        .map(str::to_string)
                };
                Some((
                    field("sport=", 0)?.parse().ok()?,
                    field("src=", 1)?.parse().ok()?,
                ))
            })
            .collect()
    }

    /// The kernel's side: connections (or datagrams) from the client, each with the endpoint
    /// it reached (when known) and its outcome; repeated until every endpoint of `paths` (trace's
    /// outcomes) has been reached with an outcome trace gives for it, or one disagrees.
    fn kernel(&self, c: &Case, paths: &[Path]) -> Vec<Path> {
        let (ns, src, node, _, dst) = self.endpoints(c);
        let bind = matches!(c.client, Client::Outside).then_some(src);
        let netns = NetNs::named(&ns).unwrap();
        let all_delivered = paths
            .iter()
            .all(|p| matches!(p.1, Outcome::Delivered(_) | Outcome::Proxied(_)));
        let (min, max) = match (c.udp, paths.len() > 1) {
            (true, _) => (2, 2),
            (false, false) => (if all_delivered { 6 } else { 1 }, 6),
            (false, true) => (if all_delivered { 6 } else { 1 }, 24),
        };
        let mut tries: Vec<Path> = Vec::new();
        for i in 0..max {
            let before = self.counters();
            let ct_before = (!c.udp).then(|| self.ct_entries(&node, src, dst));
            let r = netns.run(|| ask(c.udp, dst, bind)).unwrap();
            let got = match r {
                Ok(name) => (Some(name.clone()), Outcome::Delivered([name].into())),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    (None, Outcome::Rejected)
                }
                Err(_) => {
                    let after = self.counters();
                    let rose: Vec<String> = before
                        .iter()
                        .zip(&after)
                        .filter(|(b, a)| a.1 > b.1)
                        .map(|(_, a)| a.0.clone())
                        .collect();
                    // The endpoint: the conntrack entry this connection left (a drop before
                    // conntrack confirms the connection leaves none).
                    let endpoint = ct_before.and_then(|before| {
                        let now = self.ct_entries(&node, src, dst);
                        let new: Vec<IpAddr> = now
                            .iter()
                            .filter(|(sport, _)| !before.contains_key(sport))
                            .map(|(_, reply)| *reply)
                            .collect();
                        match new.as_slice() {
                            [reply] if *reply != dst.ip() => self.echo_name(*reply),
                            _ => None,
                        }
                    });
                    let place = if rose.is_empty() {
                        // No counter: the same packet again under `nft monitor trace`.
                        self.nft_traced_drop(&netns, c, dst, bind)
                            .unwrap_or_else(|| "unlocated".into())
                    } else {
                        rose.join(" + ")
                    };
                    (endpoint, Outcome::Dropped(place))
                }
            };
            let listens = |at: &str| self.listener_exists(at);
            let ok = try_agrees(paths, &got, &listens);
            tries.push(got);
            if !ok || (i + 1 >= min && covered(paths, &tries, &listens)) {
                break;
            }
        }
        tries
    }

    /// Tries the packet once more with `meta nftrace set 1` on every node and `nft monitor
    /// trace` listening: the chain whose verdict dropped it ("nft drop in inet weir X on a").
    fn nft_traced_drop(
        &self,
        client: &NetNs,
        c: &Case,
        dst: SocketAddr,
        bind: Option<IpAddr>,
    ) -> Option<String> {
        let table = format!("wdtrace{}", std::process::id());
        let mut monitors = Vec::new();
        for n in &self.state.nodes {
            self.exec(
                &n.netns,
                &format!(
                    "nft add table inet {table} && nft add chain inet {table} p '{{ type filter hook prerouting priority -400; }}' \
                     && nft add rule inet {table} p meta nftrace set 1"
                ),
            );
            let child = Command::new("ip")
                .args(["netns", "exec", &n.netns, "nft", "monitor", "trace"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            monitors.push((n.name.clone(), n.netns.clone(), KillOnDrop(child)));
        }
        std::thread::sleep(Duration::from_millis(300));
        let _ = client.run(|| ask(c.udp, dst, bind)).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let mut found = None;
        for (node, ns, mut child) in monitors {
            let _ = self.exec(&ns, &format!("nft delete table inet {table}"));
            let _ = child.0.kill();
            let out = child.0.stdout.take().unwrap();
            let text = std::io::read_to_string(out).unwrap_or_default();
            for l in text.lines() {
                if !(l.contains("(verdict drop)") || l.contains("policy drop")) {
                    continue;
                }
                // "trace id c367a0ce inet weir reject-chain rule … (verdict drop)"
                let w: Vec<&str> = l.split_whitespace().collect();
                if w.len() > 5 && found.is_none() {
                    found = Some(format!("nft drop in {} {} {} on {node}", w[3], w[4], w[5]));
                }
            }
        }
        found
    }

    /// One `weir trace --json` walk on `node`'s collected state.
    fn walk(&self, node: &str, src: IpAddr, dst: SocketAddr, udp: bool, iif: &str) -> Value {
        let dir = self.dir(node);
        let src = src.to_string();
        let to = dst.ip().to_string();
        let dport = dst.port().to_string();
        let out = self.lab.weir(&[
            "trace",
            "--json",
            "--from",
            &src,
            "--iif",
            iif,
            "--to",
            &to,
            "--dport",
            &dport,
            "--proto",
            if udp { "udp" } else { "tcp" },
            dir.to_str().unwrap(),
        ]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "weir trace --json: {e}\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let text = self.lab.weir(&[
            "trace",
            "--from",
            &src,
            "--iif",
            iif,
            "--to",
            &to,
            "--dport",
            &dport,
            "--proto",
            if udp { "udp" } else { "tcp" },
            dir.to_str().unwrap(),
        ]);
        eprintln!(
            "--- trace on {node}\n{}",
            String::from_utf8_lossy(&text.stdout)
        );
        v
    }

    /// Trace's outcomes, one per endpoint, leg by leg across the lab's nodes.
    fn trace(&self, c: &Case) -> Vec<Path> {
        let (_, src, node, iif, dst) = self.endpoints(c);
        self.trace_from(&node, src, dst, c.udp, &iif, 0)
    }

    /// The walk on `node`, each endpoint of its choice (or its one path) followed to the end.
    fn trace_from(
        &self,
        node: &str,
        src: IpAddr,
        dst: SocketAddr,
        udp: bool,
        iif: &str,
        depth: usize,
    ) -> Vec<Path> {
        assert!(depth < 3, "more than 3 legs");
        let v = self.walk(node, src, dst, udp, iif);
        let t = &v["trace"];
        let name_of = |ep: &Value| {
            ep.as_str()?
                .parse::<SocketAddr>()
                .ok()
                .and_then(|a| self.echo_name(a.ip()))
        };
        let per = t["endpoint_outcomes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let legs: Vec<(Option<String>, &Value)> = if per.is_empty() {
            let eps = t["endpoints"].as_array().cloned().unwrap_or_default();
            let ep = match eps.as_slice() {
                [one] => name_of(one),
                _ => None,
            };
            vec![(ep, t)]
        } else {
            per.iter().map(|e| (name_of(&e["endpoint"]), e)).collect()
        };
        let mut out = Vec::new();
        for (ep, leg) in legs {
            for (later, o) in self.follow(node, leg, udp, depth) {
                let ep = match &o {
                    // A user-space proxy's listener picks its own endpoint.
                    Outcome::Proxied(_) => None,
                    Outcome::Delivered(s) if s.len() == 1 => s.first().cloned(),
                    _ => ep.clone().or(later),
                };
                out.push((ep, o));
            }
        }
        out
    }

    /// One walk's (or one endpoint's) verdict on `node`, continued on the node it leaves for.
    fn follow(&self, node: &str, t: &Value, udp: bool, depth: usize) -> Vec<Path> {
        match t["verdict"].as_str().unwrap() {
            "dropped" => return vec![(None, Outcome::Dropped(self.trace_place(node, t)))],
            "rejected" => return vec![(None, Outcome::Rejected)],
            "delivered" => {}
            other => panic!("verdict {other}: {t}"),
        }
        let e = &t["egress"];
        let out_dst: IpAddr = e["dst"].as_str().unwrap().parse().unwrap();
        let out_port = e["dport"].as_u64().unwrap() as u16;
        if e["local"].as_bool() == Some(true) {
            if self.echo_name(out_dst).as_deref() == Some(node)
                && out_port == weir_lab::echo::ECHO_PORT
            {
                return vec![(None, Outcome::Delivered([node.to_string()].into()))];
            }
            return vec![(None, Outcome::Proxied(format!("{node} port {out_port}")))];
        }
        // Leaves this node: delivered to a pod here, or on to the node it belongs to.
        let Some(next) = self.node_of(out_dst) else {
            return vec![(
                None,
                Outcome::Dropped(format!("sent to {out_dst}, no lab node's")),
            )];
        };
        if next == node {
            let name = self.echo_name(out_dst).unwrap();
            return vec![(None, Outcome::Delivered([name].into()))];
        }
        let iif = self.arrival_iif(&next, out_dst);
        let src: IpAddr = e["src"].as_str().unwrap().parse().unwrap();
        self.trace_from(
            &next,
            src,
            SocketAddr::new(out_dst, out_port),
            udp,
            &iif,
            depth + 1,
        )
    }

    /// The interface a packet for `dst` arrives on at `node`: a node's own address on the
    /// underlay (eth0); a pod's address on eth0 (bridge: routed over the underlay) or on the
    /// ENI (eni: the VPC delivers each ENI's addresses to it).
    fn arrival_iif(&self, node: &str, dst: IpAddr) -> String {
        if dst == IpAddr::from(self.node_ip(node)) || self.state.network != weir_lab::Network::Eni {
            "eth0".into()
        } else {
            "eth1".into()
        }
    }

    /// Where trace says it was dropped, in the kernel counters' words.
    fn trace_place(&self, node: &str, t: &Value) -> String {
        let cause = t["cause"].as_str().unwrap_or_default();
        let last = t["hops"]
            .as_array()
            .and_then(|h| h.last())
            .and_then(|h| h["place"].as_str())
            .unwrap_or_default();
        if cause.contains("reverse-path") {
            format!("rp_filter on {node}")
        } else if cause.contains("FORWARD") && cause.contains("policy") {
            format!("FORWARD policy on {node}")
        } else if cause.contains("source/destination check") {
            "source check".into()
        } else if let Some(chain) = last.strip_prefix("nft ") {
            // The chain holding the rule that dropped it, as `nft monitor trace` names it.
            format!("nft drop in {chain} on {node}")
        } else if let Some(chain) = last.strip_prefix("iptables ") {
            // iptables-nft: its tables are nft tables of family ip.
            format!("nft drop in ip {chain} on {node}")
        } else if let Some(chain) = last.strip_prefix("ip6tables ") {
            // ip6tables-nft: nft tables of family ip6.
            format!("nft drop in ip6 {chain} on {node}")
        } else {
            format!("{node}: {cause}")
        }
    }

    /// Runs every case; prints the table; returns the disagreeing rows.
    ///
    /// A row that disagrees is asked of the kernel once more: trace reads a fixed collected
    /// state, so a real disagreement repeats, while the kernel's side can be noise (a late
    /// retransmit raising a counter, a connection slow on a loaded machine). Both kernel
    /// observations are printed; the row fails only when the second disagrees too.
    fn run(&self, mode: &str, cases: &[Case]) -> Vec<String> {
        let mut rows = Vec::new();
        let mut bad = Vec::new();
        let listens = |at: &str| self.listener_exists(at);
        for c in cases {
            let trace = self.trace(c);
            let kernel = self.kernel(c, &trace);
            let t = show_paths(&trace, false);
            let mut k = show_paths(&kernel, true);
            let mut agree = row_agrees(&trace, &kernel, &listens);
            let mut verdict = if agree { "yes" } else { "NO" };
            if !agree {
                let again = self.kernel(c, &trace);
                agree = row_agrees(&trace, &again, &listens);
                k = format!("{k}; again: {}", show_paths(&again, true));
                verdict = if agree { "yes (2nd)" } else { "NO" };
            }
            if !agree {
                bad.push(format!("{mode} {}: trace {t}, kernel {k}", c.label()));
            }
            rows.push(vec![mode.to_string(), c.label(), t, k, verdict.to_string()]);
        }
        eprintln!(
            "{}",
            weir_lab::matrix::render_table(&["MODE", "PACKET", "TRACE", "KERNEL", "AGREE"], &rows)
        );
        bad
    }

    /// "a port 34567": whether a socket listens there in node a (the user-space proxy).
    fn listener_exists(&self, at: &str) -> bool {
        let mut w = at.split_whitespace();
        let (node, port) = (w.next().unwrap(), w.nth(1).unwrap());
        let out = self.exec(&self.node_ns(node), &format!("ss -Hltun 'sport = :{port}'"));
        !out.trim().is_empty()
    }
}

/// Whether one connection's outcome is the one trace gives for its endpoint (for one of its
/// endpoints when the connection's is unknown or trace does not name it). `listens` says
/// whether a user-space proxy's listener ("a port 34567") exists.
fn try_agrees(paths: &[Path], k: &Path, listens: &dyn Fn(&str) -> bool) -> bool {
    let named: Vec<&Path> = paths
        .iter()
        .filter(|p| p.0.is_some() && p.0 == k.0)
        .collect();
    let candidates: Vec<&Path> = if named.is_empty() {
        paths.iter().collect()
    } else {
        named
    };
    candidates.iter().any(|p| agrees(&p.1, &k.1, listens))
}

/// Whether every endpoint trace walked was reached by a connection with its outcome.
fn covered(paths: &[Path], tries: &[Path], listens: &dyn Fn(&str) -> bool) -> bool {
    paths.iter().all(|p| {
        tries
            .iter()
            .any(|k| (k.0.is_none() || p.0.is_none() || k.0 == p.0) && agrees(&p.1, &k.1, listens))
    })
}

/// The row: every connection agrees with trace's outcome for its endpoint, and every
/// endpoint trace walked was reached.
fn row_agrees(paths: &[Path], tries: &[Path], listens: &dyn Fn(&str) -> bool) -> bool {
    !tries.is_empty()
        && tries.iter().all(|k| try_agrees(paths, k, listens))
        && covered(paths, tries, listens)
}

/// Trace's outcome `t` and the kernel's `k` for the same endpoint.
fn agrees(t: &Outcome, k: &Outcome, listens: &dyn Fn(&str) -> bool) -> bool {
    match (t, k) {
        // The endpoint the kernel reached is one trace allows.
        (Outcome::Delivered(t), Outcome::Delivered(k)) => k.is_subset(t) && !k.is_empty(),
        (Outcome::Proxied(at), Outcome::Delivered(k)) => !k.is_empty() && listens(at),
        // The kernel's counters may also show an earlier row's late packets (a backend's
        // SYN-ACK retransmits, dropped again): trace's place must be one whose counter rose.
        (Outcome::Dropped(t), Outcome::Dropped(k)) => k.split(" + ").any(|x| x == t),
        (t, k) => t == k,
    }
}

/// One TCP connection (the greeting line) or one UDP question (two tries): the echo server's
/// name.
fn ask(udp: bool, to: SocketAddr, bind: Option<IpAddr>) -> std::io::Result<String> {
    let timeout = Duration::from_millis(1500);
    let line = if udp {
        let any = match to {
            SocketAddr::V4(_) => IpAddr::from(Ipv4Addr::UNSPECIFIED),
            SocketAddr::V6(_) => IpAddr::from(Ipv6Addr::UNSPECIFIED),
        };
        let s = UdpSocket::bind(SocketAddr::new(bind.unwrap_or(any), 0))?;
        s.connect(to)?;
        s.set_read_timeout(Some(timeout / 2))?;
        let mut last = std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer");
        let mut got = None;
        for _ in 0..2 {
            s.send(b"ping\n")?;
            let mut buf = [0u8; 256];
            match s.recv(&mut buf) {
                Ok(n) => {
                    got = Some(String::from_utf8_lossy(&buf[..n]).into_owned());
                    break;
                }
                Err(e) => last = e,
            }
        }
        match got {
            Some(l) => l,
            None if last.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "no answer",
                ))
            }
            None => return Err(last),
        }
    } else {
        let s = weir_lab::services::tcp_connect(to, bind, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        line
    };
    Ok(line
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// The lab's topology file with this lab's name, the matrix's services and `extra` lines.
fn topology(lab: &Lab, base: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let body = edit(base.replacen(
        base.lines().next().unwrap(),
        &format!("name: {}", lab.name),
        1,
    ));
    let path = lab.state.path().join("topology-input.yaml");
    std::fs::write(&path, body).unwrap();
    path
}

/// The IPv6 ClusterIP of the `hostnet` service in a dual-stack lab.
const HOSTNET_IP6: &str = "fd00:10:96::99";

/// Adds a NodePort service `hostnet` whose one endpoint is node b's own address (a
/// hostNetwork pod's), by writing its manifest next to the lab's; waits until node a's rules
/// name it. In a dual-stack lab it is PreferDualStack, [`HOSTNET_IP6`] and node b's IPv6
/// address beside the IPv4 ones.
fn add_hostnet_service(m: &Matrix, cluster_ip: &str, node_port: u16) {
    let b = m.node_ip("b");
    let b6 = m
        .state
        .nodes
        .iter()
        .find(|n| n.name == "b")
        .unwrap()
        .underlay_ip6;
    let (ips, families, slice6) = match b6 {
        None => (cluster_ip.to_string(), "IPv4", String::new()),
        Some(b6) => (
            format!("{cluster_ip}, {HOSTNET_IP6}"),
            "IPv4, IPv6",
            format!(
                "---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: hostnet-lab6
  namespace: default
  labels:
    kubernetes.io/service-name: hostnet
addressType: IPv6
endpoints:
- addresses: [\"{b6}\"]
  conditions: {{ready: true, serving: true, terminating: false}}
  nodeName: b
ports:
- name: echo
  port: 8080
  protocol: TCP
"
            ),
        ),
    };
    let policy = if b6.is_some() {
        "PreferDualStack"
    } else {
        "SingleStack"
    };
    let manifest = format!(
        "apiVersion: v1
kind: Service
metadata:
  name: hostnet
  namespace: default
spec:
  clusterIP: {cluster_ip}
  clusterIPs: [{ips}]
  ipFamilies: [{families}]
  ipFamilyPolicy: {policy}
  ports:
  - name: echo
    port: 80
    protocol: TCP
    targetPort: 8080
    nodePort: {node_port}
  type: NodePort
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: hostnet-lab
  namespace: default
  labels:
    kubernetes.io/service-name: hostnet
addressType: IPv4
endpoints:
- addresses: [{b}]
  conditions: {{ready: true, serving: true, terminating: false}}
  nodeName: b
ports:
- name: echo
  port: 8080
  protocol: TCP
{slice6}"
    );
    let dir = m.lab.lab_dir().join("manifests");
    let tmp = dir.join(".service-hostnet.yaml.tmp");
    std::fs::write(&tmp, manifest).unwrap();
    std::fs::rename(&tmp, dir.join("service-hostnet.yaml")).unwrap();
    let ns = m.node_ns("a");
    for _ in 0..100 {
        let rules = m.exec(
            &ns,
            "nft list ruleset; iptables-save 2>/dev/null; ip6tables-save 2>/dev/null",
        );
        if rules.contains(cluster_ip) && (b6.is_none() || rules.contains(HOSTNET_IP6)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("node a's proxy never programmed {cluster_ip}");
}

/// The services of the bridge matrix (replacing the default topology's).
const BRIDGE_SERVICES: &str = "services:
  - name: web           # both nodes
    port: 80
    backends: [a1, b1]
  - name: local         # a pod on the client's node
    port: 80
    backends: [a2]
  - name: remote        # a pod on the other node
    port: 80
    backends: [b1]
  - name: dns
    port: 53
    protocol: UDP
    backends: [b2]
  - name: np            # NodePort, policy Cluster, backend on node b
    type: NodePort
    port: 80
    nodePort: 30081
    backends: [b1]
  - name: shop          # NodePort, policy Local, backend on node a only
    type: NodePort
    port: 80
    nodePort: 30080
    externalTrafficPolicy: Local
    backends: [a1]
  - name: api           # LoadBalancer, backend on node b
    type: LoadBalancer
    port: 443
    backends: [b2]
  - name: gone          # no endpoints
    type: NodePort
    port: 80
    backends: []
";

fn bridge_cases() -> Vec<Case> {
    use Client::*;
    use Dest::*;
    vec![
        case("pod → ClusterIP, same node", Pod("a1"), ClusterIp("local")),
        case(
            "pod → ClusterIP, other node",
            Pod("a1"),
            ClusterIp("remote"),
        ),
        case("pod → ClusterIP, both nodes", Pod("a2"), ClusterIp("web")),
        Case {
            udp: true,
            ..case("pod → ClusterIP udp", Pod("a1"), ClusterIp("dns"))
        },
        case("pod → NodePort (own node)", Pod("a1"), NodePort("np", "a")),
        case(
            "outside → NodePort eTP Cluster",
            Outside,
            NodePort("np", "a"),
        ),
        case(
            "outside → NodePort eTP Local, local ep",
            Outside,
            NodePort("shop", "a"),
        ),
        case(
            "outside → NodePort eTP Local, no local ep",
            Outside,
            NodePort("shop", "b"),
        ),
        case("outside → LB IP", Outside, LoadBalancer("api")),
        case(
            "pod → service without endpoints",
            Pod("a1"),
            ClusterIp("gone"),
        ),
        case(
            "outside → NodePort without endpoints",
            Outside,
            NodePort("gone", "a"),
        ),
    ]
}

/// Rows run after `iptables -P FORWARD DROP` on node a (and a fresh collection).
fn forward_drop_cases() -> Vec<Case> {
    use Client::*;
    use Dest::*;
    vec![
        case(
            "pod → hostNetwork ep, FORWARD DROP",
            Pod("a1"),
            ClusterIp("hostnet"),
        ),
        case(
            "outside → NodePort → hostNetwork ep, FORWARD DROP",
            Outside,
            NodePort("hostnet", "a"),
        ),
        case(
            "pod → ClusterIP other node, FORWARD DROP",
            Pod("a1"),
            ClusterIp("remote"),
        ),
    ]
}

/// The bridge matrix's packets over IPv6, for a dual-stack lab (LoadBalancer IPs are IPv4
/// only), and after FORWARD DROP.
fn bridge_cases_v6() -> Vec<Case> {
    bridge_cases()
        .into_iter()
        .filter(|c| !matches!(c.to, Dest::LoadBalancer(_)))
        .map(v6)
        .collect()
}

fn forward_drop_cases_v6() -> Vec<Case> {
    forward_drop_cases().into_iter().map(v6).collect()
}

fn bridge_matrix(tag: &str, mode: &str) {
    bridge_matrix_of(tag, mode, false)
}

/// The bridge matrix on the default topology; `dual`: dual-stack (`ipv6: {}`), and every
/// packet also over IPv6.
fn bridge_matrix_of(tag: &str, mode: &str, dual: bool) {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new(tag);
    let topo = topology(&lab, weir_lab::DEFAULT_TOPOLOGY, |t| {
        let head = t.split("services:\n").next().unwrap().to_string();
        let head = head.replace("dns: true", "dns: false");
        let head = if dual {
            head.replacen("nodes:", "ipv6: {}\nnodes:", 1)
        } else {
            head
        };
        head + BRIDGE_SERVICES
    });
    lab.ok(&["lab", "up", topo.to_str().unwrap(), "--proxy-mode", mode]);
    let state = LabState::load(&lab.lab_dir().join("state.json")).unwrap();
    let mut m = Matrix {
        lab: &lab,
        state,
        collected: tempfile::tempdir().unwrap(),
        phase: 0,
    };
    add_hostnet_service(&m, "10.96.0.99", 30099);
    m.state
        .services
        .push(hostnet_state(&m, "10.96.0.99", 30099));
    m.collect();
    let mut cases = bridge_cases();
    let mut drop_cases = forward_drop_cases();
    if dual {
        cases.extend(bridge_cases_v6());
        drop_cases.extend(forward_drop_cases_v6());
    }
    let mut bad = m.run(mode, &cases);
    m.exec(&m.node_ns("a"), "iptables -t filter -P FORWARD DROP");
    if dual {
        m.exec(&m.node_ns("a"), "ip6tables -t filter -P FORWARD DROP");
    }
    m.collect();
    bad.extend(m.run(&format!("{mode}+FWD-DROP"), &drop_cases));
    assert!(bad.is_empty(), "disagreements:\n{}", bad.join("\n"));
}

fn hostnet_state(m: &Matrix, ip: &str, node_port: u16) -> weir_lab::state::ServiceState {
    let mut s = m.service("remote").clone();
    s.name = "hostnet".into();
    s.cluster_ip = ip.parse().unwrap();
    s.cluster_ip6 = s.cluster_ip6.map(|_| HOSTNET_IP6.parse().unwrap());
    s.node_port = Some(node_port);
    s.kind = weir_lab::topology::ServiceType::NodePort;
    s.backends = vec!["b".into()];
    s
}

#[test]
fn trace_agrees_with_the_kernel_bridge_nftables() {
    bridge_matrix("tdn", "nftables");
}

#[test]
fn trace_agrees_with_the_kernel_bridge_iptables() {
    bridge_matrix("tdi", "iptables");
}

#[test]
fn trace_agrees_with_the_kernel_bridge_userspace() {
    bridge_matrix("tdu", "userspace");
}

// Dual-stack (issue 22): the same matrix on a dual-stack lab, every packet over IPv4 and IPv6.

#[test]
fn trace_agrees_with_the_kernel_dual_stack_nftables() {
    bridge_matrix_of("t6n", "nftables", true);
}

#[test]
fn trace_agrees_with_the_kernel_dual_stack_iptables() {
    bridge_matrix_of("t6i", "iptables", true);
}

#[test]
fn trace_agrees_with_the_kernel_dual_stack_userspace() {
    bridge_matrix_of("t6u", "userspace", true);
}

fn eni_cases() -> Vec<Case> {
    use Client::*;
    use Dest::*;
    vec![
        case(
            "pod → ClusterIP, both nodes (hairpin)",
            Pod("a1"),
            ClusterIp("web"),
        ),
        case(
            "pod → NodePort of other node",
            Pod("a1"),
            NodePort("edge", "b"),
        ),
        case(
            "outside → NodePort eTP Local, local ep",
            Outside,
            NodePort("shop", "a"),
        ),
        case("outside → LB IP", Outside, LoadBalancer("edge")),
        // api's endpoints are a2 (node a) and b1 (node b): trace walks each, and the kernel's
        // connections are attributed to the one they reached.
        case(
            "outside → LB IP, endpoints on both nodes",
            Outside,
            LoadBalancer("api"),
        ),
        case(
            "pod → service without endpoints",
            Pod("a1"),
            ClusterIp("gone"),
        ),
        // Last: with the fix off its reply is dropped, and the backend keeps retransmitting
        // its SYN-ACK into node a's rp_filter counter for a minute.
        case(
            "pod → LB IP, backend on other node",
            Pod("a1"),
            LoadBalancer("edge"),
        ),
        // Issue 22 item 2: with the fix off a2 answers and b1's reply is dropped; trace used to
        // follow the first endpoint and say "delivered".
        case(
            "pod → LB IP, endpoints on both nodes",
            Pod("a1"),
            LoadBalancer("api"),
        ),
    ]
}

/// eni-shared, with weir's fix on or off. The VPC's source check is off: with it on the
/// fix-off SYN dies in the VPC (which no node's state shows) before the node's own
/// reverse-path check would drop the reply; trace reports that node-local drop.
fn eni_matrix(tag: &str, mode: &str, fix: bool) {
    if !runnable() {
        return;
    }
    weir_cni();
    let lab = Lab::new(tag);
    let topo = topology(&lab, weir_lab::ENI_TOPOLOGY, |t| {
        t.replacen("eniFix: true", &format!("eniFix: {fix}"), 1)
            .replacen("sourceCheck: true", "sourceCheck: false", 1)
    });
    lab.ok(&["lab", "up", topo.to_str().unwrap(), "--proxy-mode", mode]);
    let state = LabState::load(&lab.lab_dir().join("state.json")).unwrap();
    let mut m = Matrix {
        lab: &lab,
        state,
        collected: tempfile::tempdir().unwrap(),
        phase: 0,
    };
    m.collect();
    let label = format!("eni {mode} fix {}", if fix { "on" } else { "off" });
    let bad = m.run(&label, &eni_cases());
    assert!(bad.is_empty(), "disagreements:\n{}", bad.join("\n"));
}

#[test]
fn trace_agrees_with_the_kernel_eni_fix_on_nftables() {
    eni_matrix("ten", "nftables", true);
}

#[test]
fn trace_agrees_with_the_kernel_eni_fix_off_nftables() {
    eni_matrix("tef", "nftables", false);
}

#[test]
fn trace_agrees_with_the_kernel_eni_fix_on_iptables() {
    eni_matrix("tei1", "iptables", true);
}

#[test]
fn trace_agrees_with_the_kernel_eni_fix_off_iptables() {
    eni_matrix("tei", "iptables", false);
}

/// The comparison, without a lab: a trace that followed the first endpoint only (what `weir
/// trace` did before issue 22 item 2) disagrees with a kernel whose other endpoint times out,
/// and a per-endpoint trace agrees only once the kernel has reached every endpoint.
#[test]
fn per_endpoint_comparison_catches_a_trace_that_followed_the_first_endpoint() {
    let no_listener = |_: &str| false;
    let ep = |n: &str| Some(n.to_string());
    let delivered = |n: &str| Outcome::Delivered([n.to_string()].into());
    let rp = || Outcome::Dropped("rp_filter on a".into());
    // The kernel: a2 answered, b1's connection timed out (conntrack named b1).
    let kernel: Vec<Path> = vec![(ep("a2"), delivered("a2")), (ep("b1"), rp())];
    // Trace before: one path, to the first endpoint, delivered.
    let followed_first: Vec<Path> = vec![(ep("a2"), delivered("a2"))];
    assert!(!row_agrees(&followed_first, &kernel, &no_listener));
    // Trace now: each endpoint's outcome.
    let each: Vec<Path> = vec![(ep("a2"), delivered("a2")), (ep("b1"), rp())];
    assert!(row_agrees(&each, &kernel, &no_listener));
    // b1 said delivered while the kernel's b1 connection was dropped.
    let wrong: Vec<Path> = vec![(ep("a2"), delivered("a2")), (ep("b1"), delivered("b1"))];
    assert!(!row_agrees(&wrong, &kernel, &no_listener));
    // An endpoint the kernel never reached is not agreed on.
    assert!(!row_agrees(&each, &kernel[..1], &no_listener));
    // A drop before conntrack keeps no entry: an unattributed drop covers trace's dropped
    // endpoint if the place matches, and not otherwise.
    let unattributed: Vec<Path> = vec![(ep("a2"), delivered("a2")), (None, rp())];
    assert!(row_agrees(&each, &unattributed, &no_listener));
    let elsewhere: Vec<Path> = vec![
        (ep("a2"), delivered("a2")),
        (None, Outcome::Dropped("rp_filter on b".into())),
    ];
    assert!(!row_agrees(&each, &elsewhere, &no_listener));
}
