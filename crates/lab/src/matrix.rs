//! The connectivity matrix: which probes to run (pure), running them from inside pod namespaces,
//! and rendering the results (pure).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
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
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::SameNode => "same-node",
            Kind::OtherNode => "other-node",
            Kind::OwnNode => "own-node",
            Kind::Outside => "outside",
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
    ProbeResult {
        probe: p.clone(),
        ok: false,
        answered_by: None,
        seen_source: None,
        error: Some(error),
        ms: elapsed.as_millis() as u64,
    }
}

/// Runs one probe on the calling thread (which enters the source namespace for the duration).
pub fn run_one(p: &Probe) -> ProbeResult {
    let started = Instant::now();
    let answer = NetNs::named(&p.from_ns)
        .map_err(|e| format!("open netns {}: {e}", p.from_ns))
        .and_then(|ns| {
            let _guard = ns
                .enter()
                .map_err(|e| format!("enter netns {}: {e}", p.from_ns))?;
            let target = SocketAddr::new(p.to_ip, ECHO_PORT);
            match p.proto {
                Proto::Tcp => tcp_ask(target),
                Proto::Udp => udp_ask(target),
            }
        });
    let elapsed = started.elapsed();
    let line = match answer {
        Ok(line) => line,
        Err(e) => return failed(p, e, elapsed),
    };
    let mut words = line.split_whitespace();
    let answered_by = words.next().map(str::to_string);
    let seen_source = words.next().and_then(|w| w.parse::<IpAddr>().ok());
    let mut error = None;
    if answered_by.as_deref() != Some(p.expect_answer.as_str()) {
        error = Some(format!(
            "answered by {:?}, expected {}",
            answered_by, p.expect_answer
        ));
    } else if let Some(want) = p.expect_source {
        if seen_source != Some(want) {
            error = Some(format!(
                "source seen as {}, expected {want}",
                seen_source
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "?".into())
            ));
        }
    }
    ProbeResult {
        probe: p.clone(),
        ok: error.is_none(),
        answered_by,
        seen_source,
        error,
        ms: elapsed.as_millis() as u64,
    }
}

fn tcp_ask(target: SocketAddr) -> Result<String, String> {
    let stream = TcpStream::connect_timeout(&target, TCP_TIMEOUT)
        .map_err(|e| format!("tcp connect {target}: {e}"))?;
    stream
        .set_read_timeout(Some(TCP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| format!("tcp read {target}: {e}"))?;
    if line.is_empty() {
        return Err(format!("tcp {target}: closed without an answer"));
    }
    Ok(line.trim().to_string())
}

fn udp_ask(target: SocketAddr) -> Result<String, String> {
    let any: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(any).map_err(|e| format!("udp bind: {e}"))?;
    socket
        .set_read_timeout(Some(UDP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut last = String::from("no answer");
    for _ in 0..UDP_TRIES {
        if let Err(e) = socket.send_to(b"ping\n", target) {
            last = format!("udp send {target}: {e}");
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let deadline = Instant::now() + UDP_TIMEOUT;
        let mut buf = [0u8; 512];
        while Instant::now() < deadline {
            match socket.recv_from(&mut buf) {
                Ok((n, from)) if from == target => {
                    return Ok(String::from_utf8_lossy(&buf[..n]).trim().to_string());
                }
                Ok((_, from)) => last = format!("udp answer from unexpected {from}"),
                Err(e) => {
                    last = format!("udp {target}: no answer ({e})");
                    break;
                }
            }
        }
    }
    Err(last)
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

/// The matrix as a table, one row per probe.
pub fn render_matrix(results: &[ProbeResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let p = &r.probe;
            let source = match r.seen_source {
                None => "-".to_string(),
                Some(s) if s == p.from_ip => format!("{s} (pod)"),
                Some(s) => format!("{s} (masqueraded)"),
            };
            vec![
                p.from.clone(),
                format!("{} {}", p.to, p.to_ip),
                p.kind.as_str().to_string(),
                p.proto.as_str().to_string(),
                if r.ok {
                    "ok".into()
                } else {
                    format!("FAIL: {}", r.error.as_deref().unwrap_or("?"))
                },
                r.answered_by.clone().unwrap_or_else(|| "-".into()),
                source,
            ]
        })
        .collect();
    render_table(&MATRIX_HEADERS, &rows)
}

pub fn summary(results: &[ProbeResult]) -> String {
    let failed = results.iter().filter(|r| !r.ok).count();
    format!(
        "{} probes: {} ok, {} failed",
        results.len(),
        results.len() - failed,
        failed
    )
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
        };
        let out = probes.iter().find(|p| p.kind == Kind::Outside).unwrap();
        let masq = ProbeResult {
            probe: out.clone(),
            ok: true,
            answered_by: Some("outside".into()),
            seen_source: Some(IpAddr::from([172, 30, 0, 11u8])),
            error: None,
            ms: 3,
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
}
