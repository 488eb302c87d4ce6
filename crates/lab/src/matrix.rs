//! The connectivity matrix: which probes to run (pure), running them from inside pod namespaces,
//! and rendering the results (pure).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weir_kernel::NetNs;

use crate::echo::ECHO_PORT;
use crate::state::LabState;
use crate::topology::{CniKind, Network};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    SameNode,
    OtherNode,
    OwnNode,
    Outside,
    /// A pod → a Service's ClusterIP (a lab with policies: matched after DNAT).
    ClusterIp,
    /// The outside → a node's NodePort (a lab with policies).
    NodePort,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::SameNode => "same-node",
            Kind::OtherNode => "other-node",
            Kind::OwnNode => "own-node",
            Kind::Outside => "outside",
            Kind::ClusterIp => "cluster-ip",
            Kind::NodePort => "node-port",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// What NetworkPolicy makes of a connection: weir-policy's oracle's verdict (a row's
/// expectation), or what the probe saw (answered, or dropped: no answer, no refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allowed,
    Denied,
}

impl Verdict {
    pub fn of(allowed: bool) -> Verdict {
        if allowed {
            Verdict::Allowed
        } else {
            Verdict::Denied
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
        }
    }
}

fn echo_port() -> u16 {
    ECHO_PORT
}

/// One cell of the matrix: what to send, from where, and what must come back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// The source pod.
    pub from: String,
    /// The source pod's namespace name.
    pub from_ns: String,
    pub from_ip: IpAddr,
    /// What is probed: a pod name, a node name, or "outside".
    pub to: String,
    pub to_ip: IpAddr,
    pub kind: Kind,
    pub proto: Proto,
    /// The name that must answer.
    pub expect_answer: String,
    /// The source address the answerer must see (None: not checked).
    pub expect_source: Option<IpAddr>,
    /// The port dialled: the echo servers' (pod, node and outside rows) or a Service's.
    #[serde(default = "echo_port")]
    pub port: u16,
    /// The client binds `from_ip` first (the outside probing from one of its addresses).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bind: bool,
    /// A lab with policies: the oracle's verdict ([`crate::netpol::expect`]). A denied row
    /// must go unanswered: dropped, neither answered nor refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Verdict>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeResult {
    #[serde(flatten)]
    pub probe: Probe,
    pub ok: bool,
    pub answered_by: Option<String>,
    pub seen_source: Option<IpAddr>,
    /// Why the probe failed (timeout, refused, wrong answerer, wrong source).
    pub error: Option<String>,
    pub ms: u64,
    /// A row with a policy verdict: what the probe saw (answered: allowed; no answer:
    /// denied; None: neither, e.g. refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Verdict>,
}

/// Every probe for a lab: each pod to every other pod (TCP and UDP), to its own node, and to the
/// outside address (whose answer must show the node's underlay address: masqueraded; in an eni
/// network the pod's own address). A dual-stack lab has each row twice, once per family.
pub fn plan(state: &LabState) -> Vec<Probe> {
    let mut probes = plan_family(state, &v4_addrs(state));
    if let Some(v6) = v6_addrs(state) {
        probes.extend(plan_family(state, &v6));
    }
    probes
}

/// The addresses of one family a matrix is planned over: every pod's, every node's, the
/// outside's.
pub struct Addrs {
    pub pods: Vec<(String, IpAddr)>,
    pub nodes: Vec<(String, IpAddr)>,
    pub outside: IpAddr,
}

impl Addrs {
    fn pod(&self, name: &str) -> Option<IpAddr> {
        self.pods.iter().find(|(n, _)| n == name).map(|(_, ip)| *ip)
    }
    fn node(&self, name: &str) -> Option<IpAddr> {
        self.nodes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, ip)| *ip)
    }
}

fn v4_addrs(state: &LabState) -> Addrs {
    Addrs {
        pods: state
            .pods
            .iter()
            .map(|p| (p.name.clone(), p.ip.into()))
            .collect(),
        nodes: state
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.underlay_ip.into()))
            .collect(),
        outside: state.outside.into(),
    }
}

/// A dual-stack lab's IPv6 addresses (None in an IPv4-only lab).
pub fn v6_addrs(state: &LabState) -> Option<Addrs> {
    Some(Addrs {
        pods: state
            .pods
            .iter()
            .filter_map(|p| Some((p.name.clone(), p.ip6?.into())))
            .collect(),
        nodes: state
            .nodes
            .iter()
            .filter_map(|n| Some((n.name.clone(), n.underlay_ip6?.into())))
            .collect(),
        outside: state.outside6?.into(),
    })
}

fn plan_family(state: &LabState, addrs: &Addrs) -> Vec<Probe> {
    let mut probes = Vec::new();
    for src in &state.pods {
        let (Some(src_ip), Some(src_node_ip)) = (addrs.pod(&src.name), addrs.node(&src.node))
        else {
            continue;
        };
        let mut push = |to: &str, to_ip, kind, expect_source| {
            for proto in [Proto::Tcp, Proto::Udp] {
                probes.push(Probe {
                    from: src.name.clone(),
                    from_ns: src.netns.clone(),
                    from_ip: src_ip,
                    to: to.to_string(),
                    to_ip,
                    kind,
                    proto,
                    expect_answer: to.to_string(),
                    expect_source,
                    port: ECHO_PORT,
                    bind: false,
                    policy: None,
                });
            }
        };
        for dst in state.pods.iter().filter(|p| p.name != src.name) {
            let Some(dst_ip) = addrs.pod(&dst.name) else {
                continue;
            };
            let (kind, expect) = if dst.node == src.node {
                (Kind::SameNode, Some(src_ip))
            } else {
                // The reference bridge plugin masquerades everything that leaves the pod subnet;
                // weir exempts the cluster CIDR, so the other pod sees the real source.
                (
                    Kind::OtherNode,
                    (state.cni == CniKind::Weir).then_some(src_ip),
                )
            };
            push(&dst.name, dst_ip, kind, expect);
        }
        push(&src.node, src_node_ip, Kind::OwnNode, Some(src_ip));
        // Bridge pods are masqueraded to their node; eni pods hold VPC addresses the VPC routes.
        let outside_sees = match state.network {
            Network::Bridge => src_node_ip,
            Network::Eni => src_ip,
        };
        push("outside", addrs.outside, Kind::Outside, Some(outside_sees));
    }
    probes
}

pub const TCP_TIMEOUT: Duration = Duration::from_secs(2);
pub const UDP_TIMEOUT: Duration = Duration::from_secs(2);
pub const UDP_TRIES: u32 = 3;

/// Runs every probe, each on its own thread inside the source pod's namespace.
pub fn run(probes: &[Probe]) -> Vec<ProbeResult> {
    std::thread::scope(|s| {
        let handles: Vec<_> = probes.iter().map(|p| s.spawn(move || run_one(p))).collect();
        handles
            .into_iter()
            .zip(probes)
            .map(|(h, p)| {
                h.join()
                    .unwrap_or_else(|_| failed(p, "probe thread panicked".into(), Duration::ZERO))
            })
            .collect()
    })
}

fn failed(p: &Probe, error: String, elapsed: Duration) -> ProbeResult {
    judge(p, Outcome::Failed(error), elapsed)
}

/// How one probe went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The answer line (`<name> <source seen>`).
    Answered(String),
    /// Nothing came back in time: dropped (what a policy does).
    TimedOut(String),
    /// Anything else: refused, unreachable, no namespace, …
    Failed(String),
}

/// Runs one probe on the calling thread (which enters the source namespace for the duration).
pub fn run_one(p: &Probe) -> ProbeResult {
    let started = Instant::now();
    let outcome = match NetNs::named(&p.from_ns) {
        Err(e) => Outcome::Failed(format!("open netns {}: {e}", p.from_ns)),
        Ok(ns) => match ns.enter() {
            Err(e) => Outcome::Failed(format!("enter netns {}: {e}", p.from_ns)),
            Ok(_guard) => {
                let target = SocketAddr::new(p.to_ip, p.port);
                let bind = p.bind.then_some(p.from_ip);
                match p.proto {
                    Proto::Tcp => tcp_ask(target, bind),
                    Proto::Udp => udp_ask(target, bind),
                }
            }
        },
    };
    judge(p, outcome, started.elapsed())
}

/// Compares what a probe saw with what its row expects (pure): the answerer and the source
/// it saw, or, for a row the oracle denies, no answer at all.
pub fn judge(p: &Probe, outcome: Outcome, elapsed: Duration) -> ProbeResult {
    let mut r = ProbeResult {
        probe: p.clone(),
        ok: false,
        answered_by: None,
        seen_source: None,
        error: None,
        ms: elapsed.as_millis() as u64,
        observed: None,
    };
    let line = match outcome {
        Outcome::Answered(line) => line,
        Outcome::TimedOut(e) => {
            if p.policy.is_some() {
                r.observed = Some(Verdict::Denied);
            }
            r.ok = p.policy == Some(Verdict::Denied);
            r.error = (!r.ok).then_some(e);
            return r;
        }
        Outcome::Failed(e) => {
            r.error = Some(match p.policy {
                Some(Verdict::Denied) => format!("{e} (a denied row must be dropped)"),
                _ => e,
            });
            return r;
        }
    };
    let mut words = line.split_whitespace();
    r.answered_by = words.next().map(str::to_string);
    r.seen_source = words.next().and_then(|w| w.parse::<IpAddr>().ok());
    if p.policy.is_some() {
        r.observed = Some(Verdict::Allowed);
    }
    r.error = if p.policy == Some(Verdict::Denied) {
        Some(format!(
            "answered by {}, but the oracle denies it",
            r.answered_by.as_deref().unwrap_or("?")
        ))
    } else if r.answered_by.as_deref() != Some(p.expect_answer.as_str()) {
        Some(format!(
            "answered by {:?}, expected {}",
            r.answered_by, p.expect_answer
        ))
    } else {
        p.expect_source
            .filter(|want| r.seen_source != Some(*want))
            .map(|want| {
                format!(
                    "source seen as {}, expected {want}",
                    r.seen_source
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "?".into())
                )
            })
    };
    r.ok = r.error.is_none();
    r
}

fn tcp_ask(target: SocketAddr, bind: Option<IpAddr>) -> Outcome {
    let stream = match crate::services::tcp_connect(target, bind, TCP_TIMEOUT) {
        Ok(s) => s,
        Err(e) if crate::services::is_timeout(&e) => {
            return Outcome::TimedOut(format!("tcp connect {target}: {e}"))
        }
        Err(e) => return Outcome::Failed(format!("tcp connect {target}: {e}")),
    };
    if let Err(e) = stream.set_read_timeout(Some(TCP_TIMEOUT)) {
        return Outcome::Failed(e.to_string());
    }
    let mut line = String::new();
    match BufReader::new(stream).read_line(&mut line) {
        Err(e) => Outcome::Failed(format!("tcp read {target}: {e}")),
        Ok(_) if line.is_empty() => {
            Outcome::Failed(format!("tcp {target}: closed without an answer"))
        }
        Ok(_) => Outcome::Answered(line.trim().to_string()),
    }
}

fn udp_ask(target: SocketAddr, bind: Option<IpAddr>) -> Outcome {
    let any: IpAddr = match target {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = match UdpSocket::bind(SocketAddr::new(bind.unwrap_or(any), 0)) {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(format!("udp bind: {e}")),
    };
    if let Err(e) = socket.set_read_timeout(Some(UDP_TIMEOUT)) {
        return Outcome::Failed(e.to_string());
    }
    let mut last = Outcome::TimedOut(format!("udp {target}: no answer"));
    for _ in 0..UDP_TRIES {
        if let Err(e) = socket.send_to(b"ping\n", target) {
            last = Outcome::Failed(format!("udp send {target}: {e}"));
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let deadline = Instant::now() + UDP_TIMEOUT;
        let mut buf = [0u8; 512];
        while Instant::now() < deadline {
            match socket.recv_from(&mut buf) {
                Ok((n, from)) if from == target => {
                    return Outcome::Answered(
                        String::from_utf8_lossy(&buf[..n]).trim().to_string(),
                    );
                }
                Ok((_, from)) => {
                    last = Outcome::Failed(format!("udp answer from unexpected {from}"))
                }
                Err(e) if crate::services::is_timeout(&e) => {
                    last = Outcome::TimedOut(format!("udp {target}: no answer ({e})"));
                    break;
                }
                Err(e) => {
                    last = Outcome::Failed(format!("udp {target}: {e}"));
                    break;
                }
            }
        }
    }
    last
}

// ---- rendering (pure) ----

pub use crate::table::render_table;

pub const MATRIX_HEADERS: [&str; 7] = [
    "FROM",
    "TO",
    "KIND",
    "PROTO",
    "RESULT",
    "ANSWERED-BY",
    "SEEN-SOURCE",
];

/// The headers of a lab with policies: each row's expectation (the oracle's) and what the
/// probe saw.
pub const POLICY_HEADERS: [&str; 9] = [
    "FROM",
    "TO",
    "KIND",
    "PROTO",
    "EXPECTED",
    "OBSERVED",
    "RESULT",
    "ANSWERED-BY",
    "SEEN-SOURCE",
];

/// The matrix as a table, one row per probe; with the EXPECTED and OBSERVED columns when
/// rows carry a policy verdict.
pub fn render_matrix(results: &[ProbeResult]) -> String {
    let policy = results.iter().any(|r| r.probe.policy.is_some());
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let p = &r.probe;
            let source = match r.seen_source {
                None => "-".to_string(),
                Some(s) if s == p.from_ip && p.bind => format!("{s} (kept)"),
                Some(s) if s == p.from_ip => format!("{s} (pod)"),
                Some(s) => format!("{s} (masqueraded)"),
            };
            let from = if p.bind {
                format!("{} {}", p.from, p.from_ip)
            } else {
                p.from.clone()
            };
            let to = if p.port == ECHO_PORT {
                format!("{} {}", p.to, p.to_ip)
            } else {
                format!("{} {}", p.to, SocketAddr::new(p.to_ip, p.port))
            };
            let mut row = vec![from, to, p.kind.as_str().into(), p.proto.as_str().into()];
            if policy {
                let verdict = |v: Option<Verdict>| v.map_or("-", Verdict::as_str).to_string();
                row.push(verdict(p.policy));
                row.push(verdict(r.observed));
            }
            row.push(if r.ok {
                "ok".into()
            } else {
                format!("FAIL: {}", r.error.as_deref().unwrap_or("?"))
            });
            row.push(r.answered_by.clone().unwrap_or_else(|| "-".into()));
            row.push(source);
            row
        })
        .collect();
    if policy {
        render_table(&POLICY_HEADERS, &rows)
    } else {
        render_table(&MATRIX_HEADERS, &rows)
    }
}

pub fn summary(results: &[ProbeResult]) -> String {
    let failed = results.iter().filter(|r| !r.ok).count();
    let mut line = format!(
        "{} probes: {} ok, {} failed",
        results.len(),
        results.len() - failed,
        failed
    );
    let expected = |v| results.iter().filter(|r| r.probe.policy == Some(v)).count();
    if results.iter().any(|r| r.probe.policy.is_some()) {
        line += &format!(
            " (weir-policy's oracle expects {} allowed, {} denied)",
            expected(Verdict::Allowed),
            expected(Verdict::Denied)
        );
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{NodeState, PodState};

    fn state(cni: CniKind) -> LabState {
        let pod = |node: &str, name: &str, ip: [u8; 4]| PodState {
            node: node.into(),
            name: name.into(),
            netns: format!("wl-t-{node}-{name}"),
            ip: ip.into(),
            prefix_len: 24,
            ip6: None,
        };
        let node = |name: &str, ip: [u8; 4]| NodeState {
            name: name.into(),
            netns: format!("wl-t-{name}"),
            underlay_ip: ip.into(),
            pod_gateway: Ipv4Addr::UNSPECIFIED,
            annotations: Default::default(),
            vtep_ip: None,
            underlay_ip6: None,
            pod_gateway6: None,
            vtep_ip6: None,
        };
        LabState {
            lab: "t".into(),
            cni,
            network: Network::Bridge,
            outside: Ipv4Addr::new(198, 51, 100, 1),
            outside6: None,
            nodes: vec![node("a", [172, 30, 0, 11]), node("b", [172, 30, 0, 12])],
            pods: vec![
                pod("a", "a1", [10, 244, 1, 2]),
                pod("a", "a2", [10, 244, 1, 3]),
                pod("b", "b1", [10, 244, 2, 2]),
            ],
            echo: vec![],
            proxy: Default::default(),
            services: vec![],
            proxies: vec![],
            routes: vec![],
            policy_agents: vec![],
            outside_addresses: vec![],
        }
    }

    #[test]
    fn plans_every_cell() {
        let probes = plan(&state(CniKind::Weir));
        // 3 pods × (2 other pods + own node + outside) × 2 protocols.
        assert_eq!(probes.len(), 24);
        let find = |from: &str, to: &str, proto| {
            probes
                .iter()
                .find(|p| p.from == from && p.to == to && p.proto == proto)
                .unwrap()
        };
        let p = find("a1", "a2", Proto::Udp);
        assert_eq!(
            (p.kind, p.expect_source),
            (Kind::SameNode, Some(IpAddr::from([10, 244, 1, 2u8])))
        );
        let p = find("a1", "b1", Proto::Tcp);
        assert_eq!(
            (p.kind, p.expect_source),
            (Kind::OtherNode, Some(IpAddr::from([10, 244, 1, 2u8])))
        );
        let p = find("b1", "b", Proto::Tcp);
        assert_eq!(
            (p.kind, p.to_ip),
            (Kind::OwnNode, IpAddr::from([172, 30, 0, 12u8]))
        );
        let p = find("b1", "outside", Proto::Udp);
        assert_eq!(p.expect_source, Some(IpAddr::from([172, 30, 0, 12u8])));
        assert_eq!(p.from_ns, "wl-t-b-b1");

        let probes = plan(&state(CniKind::Reference));
        let p = probes.iter().find(|p| p.kind == Kind::OtherNode).unwrap();
        assert_eq!(
            p.expect_source, None,
            "the reference bridge masquerades off-subnet traffic"
        );
    }

    #[test]
    fn a_dual_stack_lab_has_every_row_in_both_families() {
        let topo = crate::topology::Topology::dual_stack_demo();
        let state = LabState::simulated(&topo);
        let probes = plan(&state);
        // 4 pods × (3 other pods + own node + outside) × 2 protocols × 2 families.
        assert_eq!(probes.len(), 80);
        let v6: Vec<&Probe> = probes.iter().filter(|p| p.to_ip.is_ipv6()).collect();
        assert_eq!(v6.len(), 40);
        assert!(v6.iter().all(|p| p.from_ip.is_ipv6()));
        let find = |to: &str, kind| {
            v6.iter()
                .find(|p| p.from == "a1" && p.to == to && p.kind == kind)
                .unwrap()
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p = find("b1", Kind::OtherNode);
        assert_eq!(p.to_ip, ip("fd00:10:244:2::2"));
        assert_eq!(p.expect_source, Some(ip("fd00:10:244:1::2")));
        let p = find("a2", Kind::SameNode);
        assert_eq!(p.to_ip, ip("fd00:10:244:1::3"));
        let p = find("a", Kind::OwnNode);
        assert_eq!(p.to_ip, ip("fd00:172:30::b"));
        let p = find("outside", Kind::Outside);
        assert_eq!(p.to_ip, ip("fd00:198:51:100::1"));
        assert_eq!(p.expect_source, Some(ip("fd00:172:30::b")), "masqueraded");
        // An IPv4-only lab plans no IPv6 row.
        let state = LabState::simulated(&crate::topology::Topology::default_demo());
        assert!(plan(&state).iter().all(|p| p.to_ip.is_ipv4()));
    }

    #[test]
    fn renders_table_and_summary() {
        let probes = plan(&state(CniKind::Weir));
        let ok = ProbeResult {
            probe: probes[0].clone(),
            ok: true,
            answered_by: Some("a2".into()),
            seen_source: Some(IpAddr::from([10, 244, 1, 2u8])),
            error: None,
            ms: 1,
            observed: None,
        };
        let out = probes.iter().find(|p| p.kind == Kind::Outside).unwrap();
        let masq = ProbeResult {
            probe: out.clone(),
            ok: true,
            answered_by: Some("outside".into()),
            seen_source: Some(IpAddr::from([172, 30, 0, 11u8])),
            error: None,
            ms: 3,
            observed: None,
        };
        let bad = failed(
            &probes[2],
            "tcp connect 10.244.2.2:8080: timed out".into(),
            Duration::ZERO,
        );
        let text = render_matrix(&[ok, masq, bad.clone()]);
        let expected = "\
FROM  TO                    KIND        PROTO  RESULT                                        ANSWERED-BY  SEEN-SOURCE
a1    a2 10.244.1.3         same-node   tcp    ok                                            a2           10.244.1.2 (pod)
a1    outside 198.51.100.1  outside     tcp    ok                                            outside      172.30.0.11 (masqueraded)
a1    b1 10.244.2.2         other-node  tcp    FAIL: tcp connect 10.244.2.2:8080: timed out  -            -
";
        assert_eq!(text, expected, "\n{text}");
        assert_eq!(summary(&[bad]), "1 probes: 0 ok, 1 failed");
    }

    fn policy_row(verdict: Verdict) -> Probe {
        let mut p = plan(&state(CniKind::Weir))
            .into_iter()
            .find(|p| p.from == "a1" && p.to == "b1" && p.proto == Proto::Tcp)
            .unwrap();
        p.policy = Some(verdict);
        p
    }

    #[test]
    fn a_denied_row_passes_only_when_dropped() {
        let denied = policy_row(Verdict::Denied);
        let r = judge(
            &denied,
            Outcome::TimedOut("timed out".into()),
            Duration::ZERO,
        );
        assert!(r.ok, "{r:?}");
        assert_eq!((r.observed, r.error), (Some(Verdict::Denied), None));
        // A wrong expectation: the oracle denies what the kernel lets through.
        let answered = Outcome::Answered("b1 10.244.1.2".into());
        let r = judge(&denied, answered.clone(), Duration::ZERO);
        assert!(!r.ok);
        assert_eq!(r.observed, Some(Verdict::Allowed));
        assert_eq!(
            r.error.as_deref(),
            Some("answered by b1, but the oracle denies it")
        );
        // Refused is not dropped: not what a policy does.
        let r = judge(&denied, Outcome::Failed("refused".into()), Duration::ZERO);
        assert!(!r.ok);
        assert_eq!(r.observed, None);
        // The same answer passes an allowed row, and a drop fails it.
        let allowed = policy_row(Verdict::Allowed);
        assert!(judge(&allowed, answered, Duration::ZERO).ok);
        let r = judge(
            &allowed,
            Outcome::TimedOut("timed out".into()),
            Duration::ZERO,
        );
        assert!(!r.ok);
        assert_eq!(r.observed, Some(Verdict::Denied));
        // An allowed row still checks the answerer and the source it saw.
        let r = judge(
            &allowed,
            Outcome::Answered("b1 172.30.0.11".into()),
            Duration::ZERO,
        );
        assert_eq!(
            r.error.as_deref(),
            Some("source seen as 172.30.0.11, expected 10.244.1.2")
        );
        // Rows without a verdict never expect a drop.
        let mut open = allowed.clone();
        open.policy = None;
        let r = judge(&open, Outcome::TimedOut("timed out".into()), Duration::ZERO);
        assert!(!r.ok);
        assert_eq!(r.observed, None);
    }

    #[test]
    fn renders_the_policy_columns() {
        let denied = policy_row(Verdict::Denied);
        let mut np = policy_row(Verdict::Allowed);
        np.from = "outside".into();
        np.from_ip = IpAddr::from([198, 51, 100, 200]);
        np.bind = true;
        np.to = "web via a".into();
        np.to_ip = IpAddr::from([172, 30, 0, 11]);
        np.port = 30080;
        np.kind = Kind::NodePort;
        np.expect_source = Some(np.from_ip);
        let rows = [
            judge(&denied, Outcome::TimedOut("t".into()), Duration::ZERO),
            judge(
                &np,
                Outcome::Answered("b1 198.51.100.200".into()),
                Duration::ZERO,
            ),
        ];
        let text = render_matrix(&rows);
        let expected = "\
FROM                    TO                           KIND        PROTO  EXPECTED  OBSERVED  RESULT  ANSWERED-BY  SEEN-SOURCE
a1                      b1 10.244.2.2                other-node  tcp    denied    denied    ok      -            -
outside 198.51.100.200  web via a 172.30.0.11:30080  node-port   tcp    allowed   allowed   ok      b1           198.51.100.200 (kept)
";
        assert_eq!(text, expected, "\n{text}");
        assert_eq!(
            summary(&rows),
            "2 probes: 2 ok, 0 failed (weir-policy's oracle expects 1 allowed, 1 denied)"
        );
    }
}
