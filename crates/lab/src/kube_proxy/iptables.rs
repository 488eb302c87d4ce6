//! kube-proxy's iptables mode (`pkg/proxy/iptables/proxier.go`) as `iptables-restore` input.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::echo::ECHO_PORT;

use sha2::{Digest, Sha256};

use super::ports::{nat_base_jumps, ports, postrouting_and_mark, Input, Port};

/// `iptables-restore --noflush` input following `pkg/proxy/iptables/proxier.go`: nat
/// KUBE-SERVICES → KUBE-SVC (ClusterIP: masquerade what does not come from a pod) / KUBE-EXT
/// (NodePort, LB IP: masquerade, or with policy Local keep the source and use KUBE-SVL) →
/// KUBE-SEP (hairpin: masquerade; DNAT); KUBE-MARK-MASQ sets 0x4000 and KUBE-POSTROUTING turns
/// it into MASQUERADE; filter KUBE-SERVICES / KUBE-EXTERNAL-SERVICES reject what has no
/// endpoints.
pub fn render(input: &Input) -> anyhow::Result<String> {
    let ports = ports(input)?;
    let mut t = Tables::default();
    let _ = writeln!(
        t.filter,
        "*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\n\
         -A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
         -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
    );
    for p in &ports {
        t.port(p, input.cluster_cidr);
    }
    let Tables {
        mut filter,
        chains,
        rules,
        nodeports,
    } = t;
    filter += "COMMIT\n";
    let mut nat = String::from(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
    );
    nat += &chains;
    nat += &nat_base_jumps();
    nat += &postrouting_and_mark("");
    nat += &rules;
    nat += &nodeports;
    nat += "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS\nCOMMIT\n";
    Ok(filter + &nat)
}

/// The filter table, and the nat table's chain declarations, rules and KUBE-NODEPORTS rules
/// (written after the others), filled port by port.
#[derive(Default)]
struct Tables {
    filter: String,
    chains: String,
    rules: String,
    nodeports: String,
}

impl Tables {
    fn port(&mut self, p: &Port, cc: Ipv4Net) {
        if p.endpoints.is_empty() {
            self.filter_no_endpoints(p);
            return;
        }
        if p.has_external() && p.external_endpoints().is_empty() {
            self.filter_no_local_endpoints(p);
        }
        let svc_chain = format!("KUBE-SVC-{}", p.hash());
        self.service_chain(p, &svc_chain, cc);
        if p.has_external() {
            self.external_chain(p, &svc_chain, cc);
        }
    }

    /// No endpoints: the ClusterIP, the NodePort and the external addresses are rejected.
    fn filter_no_endpoints(&mut self, p: &Port) {
        let (svc, m) = (p.svc, match_proto(p));
        let c = format!("-m comment --comment \"{} has no endpoints\"", p.name);
        let _ = writeln!(
            self.filter,
            "-A KUBE-SERVICES {c} {m} -d {}/32 --dport {} -j REJECT",
            svc.cluster_ip, svc.port
        );
        if let Some(np) = svc.node_port {
            let _ = writeln!(
                self.filter,
                "-A KUBE-EXTERNAL-SERVICES {c} -m addrtype --dst-type LOCAL {m} --dport {np} -j REJECT"
            );
        }
        for ip in p.external_ips() {
            let _ = writeln!(
                self.filter,
                "-A KUBE-EXTERNAL-SERVICES {c} {m} -d {ip}/32 --dport {} -j REJECT",
                svc.port
            );
        }
    }

    /// upstream: "has no local endpoints" → DROP (not REJECT) for external traffic.
    fn filter_no_local_endpoints(&mut self, p: &Port) {
        let (svc, m) = (p.svc, match_proto(p));
        let c = format!("-m comment --comment \"{} has no local endpoints\"", p.name);
        if let Some(np) = svc.node_port {
            let _ = writeln!(
                self.filter,
                "-A KUBE-EXTERNAL-SERVICES {c} -m addrtype --dst-type LOCAL {m} --dport {np} -j DROP"
            );
        }
        for ip in p.external_ips() {
            let _ = writeln!(
                self.filter,
                "-A KUBE-EXTERNAL-SERVICES {c} {m} -d {ip}/32 --dport {} -j DROP",
                svc.port
            );
        }
    }

    /// KUBE-SVC (masquerading what does not come from a pod, then a random endpoint) and one
    /// KUBE-SEP per endpoint (hairpin: masquerade; DNAT).
    fn service_chain(&mut self, p: &Port, svc_chain: &str, cc: Ipv4Net) {
        let (svc, m) = (p.svc, match_proto(p));
        let _ = writeln!(self.chains, ":{svc_chain} - [0:0]");
        let _ = writeln!(
            self.rules,
            "-A KUBE-SERVICES -m comment --comment \"{} cluster IP\" {m} -d {}/32 --dport {} -j {svc_chain}",
            p.name, svc.cluster_ip, svc.port
        );
        let _ = writeln!(
            self.rules,
            "-A {svc_chain} -m comment --comment \"{} cluster IP\" {m} -d {}/32 --dport {} ! -s {cc} -j KUBE-MARK-MASQ",
            p.name, svc.cluster_ip, svc.port
        );
        self.spread(p, svc_chain, &p.endpoints);
        for ip in &p.endpoints {
            let s = endpoint_chain(p, ip);
            let _ = writeln!(self.chains, ":{s} - [0:0]");
            let _ = writeln!(
                self.rules,
                "-A {s} -m comment --comment {} -s {ip}/32 -j KUBE-MARK-MASQ\n\
                 -A {s} -m comment --comment {} {m} -j DNAT --to-destination {ip}:{ECHO_PORT}",
                p.name, p.name
            );
        }
    }

    /// KUBE-EXT of the NodePort and the external addresses: policy Local sends pod and local
    /// traffic to KUBE-SVC and the rest to KUBE-SVL (local endpoints only); policy Cluster
    /// masquerades all of it.
    fn external_chain(&mut self, p: &Port, svc_chain: &str, cc: Ipv4Net) {
        let (svc, m, h) = (p.svc, match_proto(p), p.hash());
        let ext = format!("KUBE-EXT-{h}");
        let _ = writeln!(self.chains, ":{ext} - [0:0]");
        if let Some(np) = svc.node_port {
            let _ = writeln!(
                self.nodeports,
                "-A KUBE-NODEPORTS -m comment --comment {} {m} --dport {np} -j {ext}",
                p.name
            );
        }
        for ip in p.external_ips() {
            let _ = writeln!(
                self.rules,
                "-A KUBE-SERVICES -m comment --comment \"{} loadbalancer IP\" {m} -d {ip}/32 --dport {} -j {ext}",
                p.name, svc.port
            );
        }
        if svc.local_policy() {
            let svl = format!("KUBE-SVL-{h}");
            let _ = writeln!(self.chains, ":{svl} - [0:0]");
            let _ = writeln!(
                self.rules,
                "-A {ext} -m comment --comment \"pod traffic for {n} external destinations\" -s {cc} -j {svc_chain}\n\
                 -A {ext} -m comment --comment \"masquerade LOCAL traffic for {n} external destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ\n\
                 -A {ext} -m comment --comment \"route LOCAL traffic for {n} external destinations\" -m addrtype --src-type LOCAL -j {svc_chain}\n\
                 -A {ext} -j {svl}",
                n = p.name
            );
            self.spread(p, &svl, &p.local);
        } else {
            let _ = writeln!(
                self.rules,
                "-A {ext} -m comment --comment \"masquerade traffic for {} external destinations\" -j KUBE-MARK-MASQ\n\
                 -A {ext} -j {svc_chain}",
                p.name
            );
        }
    }

    /// `chain` jumps to one of `eps`' KUBE-SEP chains with equal probability, as upstream:
    /// 1/n, then 1/(n-1) of the rest, …, the last unconditionally.
    fn spread(&mut self, p: &Port, chain: &str, eps: &[Ipv4Addr]) {
        for (i, ip) in eps.iter().enumerate() {
            let left = eps.len() - i;
            let stat = if left > 1 {
                format!(
                    " -m statistic --mode random --probability {:.10}",
                    1.0 / left as f64
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                self.rules,
                "-A {chain} -m comment --comment \"{} -> {ip}:{ECHO_PORT}\"{stat} -j {}",
                p.name,
                endpoint_chain(p, ip)
            );
        }
    }
}

/// `-m tcp -p tcp` (or udp).
fn match_proto(p: &Port) -> String {
    format!("-m {0} -p {0}", p.proto)
}

/// An endpoint's KUBE-SEP chain, named as upstream names it.
fn endpoint_chain(p: &Port, ip: &Ipv4Addr) -> String {
    let digest = Sha256::digest(format!("{}{}{ip}:{ECHO_PORT}", p.name, p.proto));
    format!("KUBE-SEP-{}", &data_encoding::BASE32.encode(&digest)[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_proxy::ports::eni_input;

    #[test]
    fn iptables_shape_marks_and_masquerades_like_upstream() {
        let text = eni_input(|i| render(i).unwrap());
        for line in [
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
            "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        // edge: LoadBalancer, policy Cluster → KUBE-EXT masquerades, then KUBE-SVC
        assert!(text.contains("\"default/edge:echo loadbalancer IP\" -m tcp -p tcp -d 10.12.115.102/32 --dport 8443 -j KUBE-EXT-"), "{text}");
        assert!(text.contains(
            "\"masquerade traffic for default/edge:echo external destinations\" -j KUBE-MARK-MASQ"
        ));
        // shop (NodePort, Local) on node a: its local endpoint a1 (10.12.192.18) in KUBE-SVL
        assert!(text.contains("-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ"));
        assert!(text.contains("\"default/shop:echo -> 10.12.192.18:8080\" -j KUBE-SEP-"));
        // gone: no endpoints → REJECT in filter, for the ClusterIP and the NodePort
        assert!(text.contains("\"default/gone:echo has no endpoints\" -m tcp -p tcp -d"));
        assert!(text.contains("-m addrtype --dst-type LOCAL -m tcp -p tcp --dport"));
        assert!(text.ends_with("-j KUBE-NODEPORTS\nCOMMIT\n"), "{text}");
    }
}
