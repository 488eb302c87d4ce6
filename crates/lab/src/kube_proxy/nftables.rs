//! kube-proxy's nftables mode (`pkg/proxy/nftables/proxier.go`) as `nft -f` input.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use crate::echo::ECHO_PORT;

use crate::manifests::{NAMESPACE, PORT_NAME};

use super::ports::{ports, Input, MASQ_MARK};

/// `nft -f` input following `pkg/proxy/nftables/proxier.go`: table `ip kube-proxy`, the
/// `services` chain dispatching through the `service-ips` and `service-nodeports` verdict maps
/// (NodePorts on `nodeport-ips`, the node's primary address: upstream's default
/// `--nodeport-addresses primary`), per-service `service-…` / `external-…` / `endpoint-…`
/// chains, `mark-for-masquerade` (0x4000) and `masquerading` in nat postrouting, and the
/// `no-endpoint-*` maps checked in filter chains at priority -110.
pub fn render(input: &Input) -> anyhow::Result<String> {
    let ports = ports(input)?;
    let cc = input.cluster_cidr;
    let node_ip = input.node.underlay_ip;
    let mut t = String::new();
    let (mut svc_ips, mut svc_nps, mut noep_ips, mut noep_nps) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut chains = String::new();
    let cluster_ips: Vec<String> = ports.iter().map(|p| p.svc.cluster_ip.to_string()).collect();
    for p in &ports {
        let (svc, proto) = (p.svc, p.proto);
        let id = format!(
            "{}-{NAMESPACE}/{}/{proto}/{PORT_NAME}",
            &p.hash()[..8],
            svc.name
        );
        let (svc_chain, ext_chain) = (format!("service-{id}"), format!("external-{id}"));
        let ip_key = |ip: Ipv4Addr| format!("{ip} . {proto} . {}", svc.port);
        if p.endpoints.is_empty() {
            noep_ips.push(format!("{} : goto reject-chain", ip_key(svc.cluster_ip)));
            for ip in p.external_ips() {
                noep_ips.push(format!("{} : goto reject-chain", ip_key(ip)));
            }
            if let Some(np) = svc.node_port {
                noep_nps.push(format!("{proto} . {np} : goto reject-chain"));
            }
            continue;
        }
        if p.has_external() && p.external_endpoints().is_empty() {
            for ip in p.external_ips() {
                noep_ips.push(format!("{} : drop", ip_key(ip)));
            }
            if let Some(np) = svc.node_port {
                noep_nps.push(format!("{proto} . {np} : drop"));
            }
        }
        let ep_chain = |ip: &Ipv4Addr| format!("endpoint-{id}__{ip}/{ECHO_PORT}");
        let vmap = |eps: &[Ipv4Addr]| {
            let arms: Vec<String> = eps
                .iter()
                .enumerate()
                .map(|(i, ip)| format!("{i} : goto {}", ep_chain(ip)))
                .collect();
            format!(
                "numgen random mod {} vmap {{ {} }}",
                eps.len(),
                arms.join(", ")
            )
        };
        svc_ips.push(format!("{} : goto {svc_chain}", ip_key(svc.cluster_ip)));
        let _ = writeln!(
            chains,
            "  chain {svc_chain} {{\n    ip daddr {} {proto} dport {} ip saddr != {cc} jump mark-for-masquerade\n    {}\n  }}",
            svc.cluster_ip,
            svc.port,
            vmap(&p.endpoints)
        );
        for ip in &p.endpoints {
            let _ = writeln!(
                chains,
                "  chain {} {{\n    ip saddr {ip} jump mark-for-masquerade\n    meta l4proto {proto} dnat to {ip}:{ECHO_PORT}\n  }}",
                ep_chain(ip)
            );
        }
        if !p.has_external() {
            continue;
        }
        for ip in p.external_ips() {
            svc_ips.push(format!("{} : goto {ext_chain}", ip_key(ip)));
        }
        if let Some(np) = svc.node_port {
            svc_nps.push(format!("{proto} . {np} : goto {ext_chain}"));
        }
        let body = if svc.local_policy() {
            let last = if p.local.is_empty() {
                "drop".to_string()
            } else {
                vmap(&p.local)
            };
            format!(
                "    ip saddr {cc} goto {svc_chain} comment \"short-circuit pod traffic\"\n    \
                 fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"\n    \
                 fib saddr type local goto {svc_chain} comment \"short-circuit local traffic\"\n    {last}"
            )
        } else {
            format!("    jump mark-for-masquerade\n    goto {svc_chain}")
        };
        let _ = writeln!(chains, "  chain {ext_chain} {{\n{body}\n  }}");
    }
    let elements = |v: &[String]| {
        if v.is_empty() {
            String::new()
        } else {
            format!(" elements = {{ {} }};", v.join(", "))
        }
    };
    let _ = writeln!(
        t,
        "table ip kube-proxy {{\n  comment \"rules for kube-proxy\"\n\
         \x20 set cluster-ips {{ type ipv4_addr; comment \"Active ClusterIPs\";{} }}\n\
         \x20 set nodeport-ips {{ type ipv4_addr; comment \"IPs that accept NodePort traffic\"; elements = {{ {node_ip} }}; }}\n\
         \x20 map service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\";{} }}\n\
         \x20 map service-nodeports {{ type inet_proto . inet_service : verdict; comment \"NodePort traffic\";{} }}\n\
         \x20 map no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict; comment \"vmap to drop or reject packets to services with no endpoints\";{} }}\n\
         \x20 map no-endpoint-nodeports {{ type inet_proto . inet_service : verdict; comment \"vmap to drop or reject packets to service nodeports with no endpoints\";{} }}",
        elements(&cluster_ips),
        elements(&svc_ips),
        elements(&svc_nps),
        elements(&noep_ips),
        elements(&noep_nps),
    );
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
    let _ = writeln!(
        t,
        "  chain mark-for-masquerade {{\n    meta mark set meta mark | {MASQ_MARK}\n  }}\n\
         \x20 chain masquerading {{\n    meta mark & {MASQ_MARK} == 0 return\n    meta mark set meta mark ^ {MASQ_MARK}\n    masquerade fully-random\n  }}\n\
         \x20 chain services {{\n    ip daddr . meta l4proto . th dport vmap @service-ips\n    ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports\n  }}\n\
         \x20 chain service-endpoints-check {{\n    ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n  }}\n\
         \x20 chain nodeport-endpoints-check {{\n    ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports\n  }}\n\
         \x20 chain cluster-ips-check {{\n    ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"\n    ip daddr {} drop comment \"Drop traffic to unallocated ClusterIPs\"\n  }}\n\
         \x20 chain reject-chain {{\n    comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"\n    reject\n  }}",
        input.service_cidr
    );
    t += &chains;
    t += "}\n";
    Ok(t)
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
