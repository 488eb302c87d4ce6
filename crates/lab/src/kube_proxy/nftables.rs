//! kube-proxy's nftables mode (`pkg/proxy/nftables/proxier.go`) as `nft -f` input.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::echo::ECHO_PORT;

use crate::manifests::{NAMESPACE, PORT_NAME};

use super::ports::{ports, Input, Port, MASQ_MARK};

/// `nft -f` input following `pkg/proxy/nftables/proxier.go`: table `ip kube-proxy`, the
/// `services` chain dispatching through the `service-ips` and `service-nodeports` verdict maps
/// (NodePorts on `nodeport-ips`, the node's primary address: upstream's default
/// `--nodeport-addresses primary`), per-service `service-…` / `external-…` / `endpoint-…`
/// chains, `mark-for-masquerade` (0x4000) and `masquerading` in nat postrouting, and the
/// `no-endpoint-*` maps checked in filter chains at priority -110.
pub fn render(input: &Input) -> anyhow::Result<String> {
    let ports = ports(input)?;
    let mut maps = Maps::default();
    for p in &ports {
        maps.port(p, input.cluster_cidr);
    }
    let cluster_ips: Vec<String> = ports.iter().map(|p| p.svc.cluster_ip.to_string()).collect();
    let mut t = table_head(&maps, &cluster_ips, input.node.underlay_ip);
    hook_chains(&mut t);
    helper_chains(&mut t, input.service_cidr);
    t += &maps.chains;
    t += "}\n";
    Ok(t)
}

/// The verdict maps' elements and the per-service chains, filled port by port.
#[derive(Default)]
struct Maps {
    svc_ips: Vec<String>,
    svc_nps: Vec<String>,
    noep_ips: Vec<String>,
    noep_nps: Vec<String>,
    chains: String,
}

impl Maps {
    fn port(&mut self, p: &Port, cc: Ipv4Net) {
        let id = format!(
            "{}-{NAMESPACE}/{}/{}/{PORT_NAME}",
            &p.hash()[..8],
            p.svc.name,
            p.proto
        );
        if p.endpoints.is_empty() {
            self.no_endpoints(p, "goto reject-chain");
            return;
        }
        if p.has_external() && p.external_endpoints().is_empty() {
            self.no_endpoints_external(p, "drop");
        }
        let svc_chain = format!("service-{id}");
        self.service_chain(p, &id, &svc_chain, cc);
        if p.has_external() {
            self.external_chain(p, &id, &svc_chain, cc);
        }
    }

    /// No endpoints at all: every address and the NodePort get `verdict`.
    fn no_endpoints(&mut self, p: &Port, verdict: &str) {
        self.noep_ips
            .push(format!("{} : {verdict}", ip_key(p, p.svc.cluster_ip)));
        self.no_endpoints_external(p, verdict);
    }

    /// The external addresses (external IPs, LB IP) and the NodePort get `verdict`.
    fn no_endpoints_external(&mut self, p: &Port, verdict: &str) {
        for ip in p.external_ips() {
            self.noep_ips.push(format!("{} : {verdict}", ip_key(p, ip)));
        }
        if let Some(np) = p.svc.node_port {
            self.noep_nps
                .push(format!("{} . {np} : {verdict}", p.proto));
        }
    }

    /// The ClusterIP's `service-…` chain (masquerading off-cluster sources, then a random
    /// endpoint) and one `endpoint-…` chain per endpoint.
    fn service_chain(&mut self, p: &Port, id: &str, svc_chain: &str, cc: Ipv4Net) {
        let (svc, proto) = (p.svc, p.proto);
        self.svc_ips
            .push(format!("{} : goto {svc_chain}", ip_key(p, svc.cluster_ip)));
        let _ = writeln!(
            self.chains,
            "  chain {svc_chain} {{\n    ip daddr {} {proto} dport {} ip saddr != {cc} jump mark-for-masquerade\n    {}\n  }}",
            svc.cluster_ip,
            svc.port,
            vmap(id, &p.endpoints)
        );
        for ip in &p.endpoints {
            let _ = writeln!(
                self.chains,
                "  chain {} {{\n    ip saddr {ip} jump mark-for-masquerade\n    meta l4proto {proto} dnat to {ip}:{ECHO_PORT}\n  }}",
                endpoint_chain(id, ip)
            );
        }
    }

    /// The `external-…` chain of the external addresses and the NodePort: policy Local
    /// short-circuits pod and local traffic to the service chain and serves the rest from
    /// local endpoints (none: drop); policy Cluster masquerades all of it.
    fn external_chain(&mut self, p: &Port, id: &str, svc_chain: &str, cc: Ipv4Net) {
        let ext_chain = format!("external-{id}");
        for ip in p.external_ips() {
            self.svc_ips
                .push(format!("{} : goto {ext_chain}", ip_key(p, ip)));
        }
        if let Some(np) = p.svc.node_port {
            self.svc_nps
                .push(format!("{} . {np} : goto {ext_chain}", p.proto));
        }
        let body = if p.svc.local_policy() {
            let last = if p.local.is_empty() {
                "drop".to_string()
            } else {
                vmap(id, &p.local)
            };
            format!(
                "    ip saddr {cc} goto {svc_chain} comment \"short-circuit pod traffic\"\n    \
                 fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"\n    \
                 fib saddr type local goto {svc_chain} comment \"short-circuit local traffic\"\n    {last}"
            )
        } else {
            format!("    jump mark-for-masquerade\n    goto {svc_chain}")
        };
        let _ = writeln!(self.chains, "  chain {ext_chain} {{\n{body}\n  }}");
    }
}

/// A `service-ips` key: address . protocol . service port.
fn ip_key(p: &Port, ip: Ipv4Addr) -> String {
    format!("{ip} . {} . {}", p.proto, p.svc.port)
}

fn endpoint_chain(id: &str, ip: &Ipv4Addr) -> String {
    format!("endpoint-{id}__{ip}/{ECHO_PORT}")
}

/// A random choice among `eps`' endpoint chains.
fn vmap(id: &str, eps: &[Ipv4Addr]) -> String {
    let arms: Vec<String> = eps
        .iter()
        .enumerate()
        .map(|(i, ip)| format!("{i} : goto {}", endpoint_chain(id, ip)))
        .collect();
    format!(
        "numgen random mod {} vmap {{ {} }}",
        eps.len(),
        arms.join(", ")
    )
}

/// The table's first lines: its sets and verdict maps with their elements.
fn table_head(maps: &Maps, cluster_ips: &[String], node_ip: Ipv4Addr) -> String {
    let elements = |v: &[String]| {
        if v.is_empty() {
            String::new()
        } else {
            format!(" elements = {{ {} }};", v.join(", "))
        }
    };
    let mut t = String::new();
    let _ = writeln!(
        t,
        "table ip kube-proxy {{\n  comment \"rules for kube-proxy\"\n\
         \x20 set cluster-ips {{ type ipv4_addr; comment \"Active ClusterIPs\";{} }}\n\
         \x20 set nodeport-ips {{ type ipv4_addr; comment \"IPs that accept NodePort traffic\"; elements = {{ {node_ip} }}; }}\n\
         \x20 map service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\";{} }}\n\
         \x20 map service-nodeports {{ type inet_proto . inet_service : verdict; comment \"NodePort traffic\";{} }}\n\
         \x20 map no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict; comment \"vmap to drop or reject packets to services with no endpoints\";{} }}\n\
         \x20 map no-endpoint-nodeports {{ type inet_proto . inet_service : verdict; comment \"vmap to drop or reject packets to service nodeports with no endpoints\";{} }}",
        elements(cluster_ips),
        elements(&maps.svc_ips),
        elements(&maps.svc_nps),
        elements(&maps.noep_ips),
        elements(&maps.noep_nps),
    );
    t
}

/// The base chains on the netfilter hooks.
fn hook_chains(t: &mut String) {
    let hooks = [
        ("filter-input", "filter", "input", "-110", "ct state new jump nodeport-endpoints-check\n    ct state new jump service-endpoints-check"),
        ("filter-forward", "filter", "forward", "-110", "ct state new jump service-endpoints-check\n    ct state new jump cluster-ips-check"),
        ("filter-output", "filter", "output", "-110", "ct state new jump service-endpoints-check"),
        ("filter-output-post-dnat", "filter", "output", "-90", "ct state new jump cluster-ips-check"),
        ("nat-prerouting", "nat", "prerouting", "-100", "jump services"),
        ("nat-output", "nat", "output", "-100", "jump services"),
        ("nat-postrouting", "nat", "postrouting", "100", "jump masquerading"),
    ];
    for (name, kind, hook, prio, body) in hooks {
        let _ = writeln!(
            t,
            "  chain {name} {{\n    type {kind} hook {hook} priority {prio}; policy accept;\n    {body}\n  }}"
        );
    }
}

/// The fixed chains the hooks and maps jump to.
fn helper_chains(t: &mut String, service_cidr: Ipv4Net) {
    let _ = writeln!(
        t,
        "  chain mark-for-masquerade {{\n    meta mark set meta mark | {MASQ_MARK}\n  }}\n\
         \x20 chain masquerading {{\n    meta mark & {MASQ_MARK} == 0 return\n    meta mark set meta mark ^ {MASQ_MARK}\n    masquerade fully-random\n  }}\n\
         \x20 chain services {{\n    ip daddr . meta l4proto . th dport vmap @service-ips\n    ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports\n  }}\n\
         \x20 chain service-endpoints-check {{\n    ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n  }}\n\
         \x20 chain nodeport-endpoints-check {{\n    ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports\n  }}\n\
         \x20 chain cluster-ips-check {{\n    ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"\n    ip daddr {service_cidr} drop comment \"Drop traffic to unallocated ClusterIPs\"\n  }}\n\
         \x20 chain reject-chain {{\n    comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"\n    reject\n  }}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube_proxy::ports::eni_input;
    use crate::state::LabState;
    use crate::topology::Topology;

    #[test]
    fn nftables_shape_dispatches_through_verdict_maps() {
        let text = eni_input(|i| render(i).unwrap());
        assert!(text.starts_with("table ip kube-proxy {"));
        assert!(
            text.contains("10.12.115.102 . tcp . 8443 : goto external-"),
            "{text}"
        );
        assert!(text.contains("chain masquerading {\n    meta mark & 0x4000 == 0 return\n    meta mark set meta mark ^ 0x4000\n    masquerade fully-random"));
        assert!(
            text.contains("ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports")
        );
        assert!(text.contains("set nodeport-ips { type ipv4_addr; comment \"IPs that accept NodePort traffic\"; elements = { 10.12.97.11 }; }"), "{text}");
        // gone has no endpoints: rejected; shop's NodePort has a local endpoint on node a
        assert!(text.contains(": goto reject-chain"));
        assert!(!text.contains(": drop"), "{text}");
    }

    #[test]
    fn nftables_drops_external_traffic_without_local_endpoints() {
        let topo = Topology::eni_demo();
        let state = LabState::simulated(&topo);
        let input = Input {
            state: &state,
            node: &state.nodes[1],
            cluster_cidr: topo.cluster_cidr,
            service_cidr: topo.service_cidr,
        };
        let text = render(&input).unwrap();
        assert!(text.contains("tcp . 30080 : drop"), "{text}");
        assert!(crate::kube_proxy::iptables::render(&input)
            .unwrap()
            .contains("\"default/shop:echo has no local endpoints\" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j DROP"));
    }
}
