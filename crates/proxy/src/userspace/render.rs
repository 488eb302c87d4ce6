//! Pure: plan + listener ports → the `nft -f` script of weir's userspace table.
//!
//! `redirect` (nat, prerouting and output) rather than `tproxy`: redirect works for traffic
//! the node itself originates (output hook) as well as forwarded traffic, needs no policy
//! routing or `IP_TRANSPARENT` sockets, and conntrack rewrites the replies' source back to
//! the service address, so the proxy's listeners are plain sockets. What it costs: the
//! listener sees the client's source address (kept, which ClientIP affinity needs) but not
//! the original destination — hence one listener per service port and endpoint set.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use weir_model::{
    EndpointSet, FrontendKind, IpFamily, NodePortAddresses, Plan, Protocol, ServicePortKey, Verdict,
};

/// The nftables table (family inet) weir's userspace mode owns.
pub const TABLE: &str = "weir_userspace";

/// One listener: the service port and the endpoint set its frontends balance over.
pub type ListenerKey = (ServicePortKey, EndpointSet);

fn family_match(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "meta nfproto ipv4",
        IpFamily::V6 => "meta nfproto ipv6",
    }
}

fn addr_match(a: IpAddr) -> String {
    match a {
        IpAddr::V4(a) => format!("ip daddr {a}"),
        IpAddr::V6(a) => format!("ip6 daddr {a}"),
    }
}

/// The destination matches of each frontend of `key` (one per node-port address for a
/// NodePort), with its verdict and endpoint set.
fn frontend_matches(plan: &Plan, key: &ServicePortKey, fe: &weir_model::Frontend) -> Vec<String> {
    let p = key.protocol.as_str();
    match (fe.kind, fe.addr) {
        (FrontendKind::NodePort, _) => match plan.node_port_addresses(key.family) {
            NodePortAddresses::None => vec![],
            NodePortAddresses::AllLocal => vec![format!(
                "{} fib daddr type local {p} dport {}",
                family_match(key.family),
                fe.port
            )],
            NodePortAddresses::List(l) => l
                .iter()
                .filter(|a| IpFamily::of(a) == key.family)
                .map(|a| format!("{} {p} dport {}", addr_match(*a), fe.port))
                .collect(),
        },
        (_, Some(a)) => vec![format!("{} {p} dport {}", addr_match(a), fe.port)],
        _ => vec![],
    }
}

/// The whole table, replacing the previous one in the same transaction. `ports`: the local
/// port of each listener; a forwarding frontend without one (its listener could not be
/// opened) is rejected instead, so it never black-holes.
pub fn render(plan: &Plan, ports: &BTreeMap<ListenerKey, u16>) -> String {
    let (mut nat, mut filter) = (String::new(), String::new());
    for (key, sp) in &plan.services {
        if key.protocol == Protocol::Sctp {
            continue; // not proxied in user space
        }
        for fe in &sp.frontends {
            let port = ports.get(&(key.clone(), fe.endpoints)).copied();
            // kube-proxy's short circuit: pods (cluster CIDRs) and the node itself reach an
            // external VIP with policy Local through the cluster endpoints.
            let short_circuit = fe
                .short_circuit
                .then(|| ports.get(&(key.clone(), EndpointSet::Cluster)))
                .flatten();
            for m in frontend_matches(plan, key, fe) {
                if let Some(cp) = short_circuit {
                    let saddr = match key.family {
                        IpFamily::V4 => "ip saddr",
                        IpFamily::V6 => "ip6 saddr",
                    };
                    for net in plan
                        .cluster_cidrs
                        .iter()
                        .filter(|n| IpFamily::of_net(n) == key.family)
                    {
                        let _ = writeln!(nat, "\t\t{m} {saddr} {} redirect to :{cp}", net.trunc());
                    }
                    let _ = writeln!(nat, "\t\t{m} fib saddr type local redirect to :{cp}");
                }
                match (fe.verdict, port) {
                    (Verdict::Forward, Some(lp)) => {
                        let _ = writeln!(nat, "\t\t{m} redirect to :{lp}");
                    }
                    (Verdict::Drop, _) => {
                        let _ = writeln!(filter, "\t\t{m} drop");
                    }
                    _ => {
                        let how = if key.protocol == Protocol::Tcp {
                            "reject with tcp reset"
                        } else {
                            "reject"
                        };
                        let _ = writeln!(filter, "\t\t{m} {how}");
                    }
                }
            }
        }
    }
    let mut out =
        format!("table inet {TABLE} {{}}\ndelete table inet {TABLE}\ntable inet {TABLE} {{\n");
    for (chain, hook) in [
        ("prerouting", "type nat hook prerouting priority dstnat"),
        ("output", "type nat hook output priority -100"),
    ] {
        let _ = write!(
            out,
            "\tchain {chain} {{\n\t\t{hook}; policy accept;\n{nat}\t}}\n"
        );
    }
    // Frontends without endpoints are refused before routing could send them anywhere.
    for (chain, hook) in [
        ("refuse_input", "input"),
        ("refuse_forward", "forward"),
        ("refuse_output", "output"),
    ] {
        let _ = write!(
            out,
            "\tchain {chain} {{\n\t\ttype filter hook {hook} priority -10; policy accept;\n{filter}\t}}\n"
        );
    }
    out.push_str("}\n");
    out
}
