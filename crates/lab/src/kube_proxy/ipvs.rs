//! kube-proxy's ipvs mode (`pkg/proxy/ipvs/proxier.go`): the dummy's addresses, ipsets, IPVS
//! virtual servers, nat rules and sysctls.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use crate::echo::ECHO_PORT;
use crate::topology::ServiceType;

use anyhow::bail;

use super::ports::{nat_base_jumps, ports, postrouting_and_mark, Input};

/// What kube-proxy's ipvs mode (`pkg/proxy/ipvs/proxier.go`) puts in a node, as the inputs of
/// the tools that load it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipvs {
    /// Bound (/32) to the `kube-ipvs0` dummy, which upstream leaves down: every ClusterIP and
    /// LoadBalancer IP, so IPVS sees them in LOCAL_IN.
    pub addresses: Vec<Ipv4Addr>,
    /// `ipset restore` input: KUBE-CLUSTER-IP, KUBE-LOAD-BALANCER, KUBE-LOOP-BACK,
    /// KUBE-NODE-PORT-TCP/UDP (+ -LOCAL- for policy Local).
    pub ipset: String,
    /// `ipvsadm -R` input: a virtual server per ClusterIP, LB IP and node IP:NodePort, real
    /// servers masqueraded (`-m`, NAT forwarding), scheduler rr.
    pub ipvsadm: String,
    /// `iptables-restore --noflush` input: the nat rules of ipvs mode.
    pub iptables: String,
    /// The sysctls upstream sets; `vs.conntrack=1` is what lets iptables MASQUERADE see IPVS's
    /// connections.
    pub sysctls: Vec<(&'static str, &'static str)>,
}

pub fn render(input: &Input) -> anyhow::Result<Ipvs> {
    let ports = ports(input)?;
    let node_ip = input.node.underlay_ip;
    let mut addresses = Vec::new();
    let (mut cluster, mut lb, mut loopback) = (Vec::new(), Vec::new(), Vec::new());
    let mut nodeport: [Vec<u16>; 2] = Default::default();
    let mut nodeport_local: [Vec<u16>; 2] = Default::default();
    let mut adm = String::new();
    let mut virtual_server = |flag: &str, vip: String, eps: &[Ipv4Addr]| {
        let _ = writeln!(adm, "-A {flag} {vip} -s rr");
        for ep in eps {
            let _ = writeln!(adm, "-a {flag} {vip} -r {ep}:{ECHO_PORT} -m -w 1");
        }
    };
    for p in &ports {
        let svc = p.svc;
        let (flag, pi) = match p.proto {
            "udp" => ("-u", 1),
            _ => ("-t", 0),
        };
        addresses.push(svc.cluster_ip);
        cluster.push(format!("{},{}:{}", svc.cluster_ip, p.proto, svc.port));
        virtual_server(
            flag,
            format!("{}:{}", svc.cluster_ip, svc.port),
            &p.endpoints,
        );
        // Upstream skips the endpoints of other nodes (`if !ep.IsLocal() { continue }`).
        for ep in &p.local {
            loopback.push(format!("{ep},{}:{ECHO_PORT},{ep}", p.proto));
        }
        for ip in p.external_ips() {
            addresses.push(ip);
            lb.push(format!("{ip},{}:{}", p.proto, svc.port));
            virtual_server(flag, format!("{ip}:{}", svc.port), p.external_endpoints());
        }
        if let Some(np) = svc.node_port {
            nodeport[pi].push(np);
            if svc.local_policy() {
                nodeport_local[pi].push(np);
            }
            virtual_server(flag, format!("{node_ip}:{np}"), p.external_endpoints());
        }
        if svc.kind == ServiceType::LoadBalancer && svc.local_policy() {
            bail!(
                "service {}: LoadBalancer with policy Local is outside the ipvs subset",
                svc.name
            );
        }
    }
    let mut ipset = String::new();
    let mut set = |name: &str, kind: &str, entries: &[String]| {
        let _ = writeln!(ipset, "create {name} {kind} -exist");
        for e in entries {
            let _ = writeln!(ipset, "add {name} {e} -exist");
        }
    };
    let hash = "family inet hashsize 1024 maxelem 65536";
    set("KUBE-CLUSTER-IP", &format!("hash:ip,port {hash}"), &cluster);
    set("KUBE-LOAD-BALANCER", &format!("hash:ip,port {hash}"), &lb);
    set(
        "KUBE-LOOP-BACK",
        &format!("hash:ip,port,ip {hash}"),
        &loopback,
    );
    let ports_of = |v: &[u16]| v.iter().map(u16::to_string).collect::<Vec<_>>();
    for (i, proto) in ["TCP", "UDP"].iter().enumerate() {
        let bitmap = "bitmap:port range 0-65535";
        set(
            &format!("KUBE-NODE-PORT-{proto}"),
            bitmap,
            &ports_of(&nodeport[i]),
        );
        set(
            &format!("KUBE-NODE-PORT-LOCAL-{proto}"),
            bitmap,
            &ports_of(&nodeport_local[i]),
        );
    }
    let cc = input.cluster_cidr;
    let mut nat = String::from(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-NODE-PORT - [0:0]\n:KUBE-LOAD-BALANCER - [0:0]\n",
    );
    nat += &nat_base_jumps();
    nat += &postrouting_and_mark(
        "-A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE\n",
    );
    let _ = write!(
        nat,
        "-A KUBE-SERVICES ! -s {cc} -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\n\
         -A KUBE-SERVICES -m comment --comment \"Kubernetes service lb portal\" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER\n\
         -A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n\
         -A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\n\
         -A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT\n\
         -A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ\n"
    );
    for proto in ["TCP", "UDP"] {
        let p = proto.to_lowercase();
        let _ = write!(
            nat,
            "-A KUBE-NODE-PORT -p {p} -m comment --comment \"Kubernetes nodeport {proto} port with externalTrafficPolicy=local\" -m set --match-set KUBE-NODE-PORT-LOCAL-{proto} dst -j RETURN\n\
             -A KUBE-NODE-PORT -p {p} -m comment --comment \"Kubernetes nodeport {proto} port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-{proto} dst -j KUBE-MARK-MASQ\n"
        );
    }
    nat += "COMMIT\n";
    Ok(Ipvs {
        addresses,
        ipset,
        ipvsadm: adm,
        iptables: nat,
        sysctls: vec![
            ("net.ipv4.vs.conntrack", "1"),
            ("net.ipv4.vs.conn_reuse_mode", "0"),
            ("net.ipv4.vs.expire_nodest_conn", "1"),
            ("net.ipv4.vs.expire_quiescent_template", "1"),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_proxy::ports::eni_input;

    #[test]
    fn ipvs_shape_binds_every_service_ip_and_masquerades_real_servers() {
        let r = eni_input(|i| render(i).unwrap());
        assert!(r.addresses.contains(&Ipv4Addr::new(10, 12, 115, 102)));
        assert!(
            r.ipset
                .contains("add KUBE-LOAD-BALANCER 10.12.115.102,tcp:8443 -exist"),
            "{}",
            r.ipset
        );
        assert!(
            r.ipset
                .contains("add KUBE-NODE-PORT-LOCAL-TCP 30080 -exist"),
            "{}",
            r.ipset
        );
        // edge's only backend b2 (10.12.192.35): NAT forwarding
        assert!(r.ipvsadm.contains("-A -t 10.12.115.102:8443 -s rr\n-a -t 10.12.115.102:8443 -r 10.12.192.35:8080 -m -w 1\n"), "{}", r.ipvsadm);
        assert!(r.ipvsadm.contains("-A -u "), "dns is UDP: {}", r.ipvsadm);
        assert!(r
            .iptables
            .contains("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ"));
        assert!(r
            .iptables
            .contains("-m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE"));
        assert!(r.sysctls.contains(&("net.ipv4.vs.conntrack", "1")));
        // KUBE-LOOP-BACK: the rendered node's (node a's) endpoints only, as upstream's
        let loop_back: Vec<&str> = r
            .ipset
            .lines()
            .filter(|l| l.starts_with("add KUBE-LOOP-BACK "))
            .collect();
        let node_a = eni_input(|i| {
            i.state
                .pods
                .iter()
                .filter(|p| p.node == i.node.name)
                .map(|p| p.ip.to_string())
                .collect::<Vec<_>>()
        });
        assert!(!loop_back.is_empty());
        for l in &loop_back {
            assert!(
                node_a
                    .iter()
                    .any(|ip| l.starts_with(&format!("add KUBE-LOOP-BACK {ip},"))),
                "{l} is not node a's: {node_a:?}"
            );
        }
        assert!(
            !r.ipset.contains("add KUBE-LOOP-BACK 10.12.192.35,"),
            "{}",
            r.ipset
        );
    }
}
