//! The cloud of an eni network: each node's ENI wired to the VPC router (the outside namespace),
//! the router's knowledge of which ENI owns which address, its source/destination check, and the
//! counters that show what was dropped where.
//!
//! The VPC router delivers every ENI address to the ENI that owns it by a route and a permanent
//! neighbour entry (no ARP: a cloud SDN knows the MAC behind each address), and, with
//! `sourceCheck`, drops what a node sends with a source not assigned to the interface it left
//! from: on each ENI link in the router (`inet vpc`), and on each node's underlay port in the
//! switch (`bridge vpc`). Both count their drops in a counter named `sourcecheck`.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{bail, Context};
use ipnet::{IpNet, Ipv4Net};
use rtnetlink::RouteMessageBuilder;
use serde::{Deserialize, Serialize};
use weir_kernel::{sysctl, NetNs, Rtnl};

use crate::cni::{ENI_NAME, ENI_TABLE};
use crate::names;
use crate::state::LabState;
use crate::topology::{Node, Topology};

/// The router's end of `node`'s ENI link.
pub fn router_port(node: &str) -> String {
    format!("e-{node}")
}

fn run(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("cannot run {}", args[0]))?;
    if !out.status.success() {
        bail!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nft_in(netns: &str, script: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot run nft")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft in {netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `ip -n <netns> -b -` with `batch` (one command a line) on its stdin.
fn ip_batch(netns: &str, batch: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["-n", netns, "-b", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot run ip")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(batch.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "ip -b in {netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Strict reverse-path filtering on every interface of the node, before anything is created
/// (`default` covers the pod veths weir-cni adds later).
pub fn strict_rp_filter(node_ns: &NetNs) -> anyhow::Result<()> {
    node_ns.run(|| -> std::io::Result<()> {
        for key in [
            "net.ipv4.conf.all.rp_filter",
            "net.ipv4.conf.default.rp_filter",
            "net.ipv4.conf.eth0.rp_filter",
        ] {
            sysctl::ensure(key, "1")?;
        }
        Ok(())
    })??;
    Ok(())
}

/// Attaches `node`'s ENI: `eth1` in the node (left without an address and down: weir-cni brings
/// it up), `e-<node>` in the router with the ENI gateway, a route to the ENI's address block and a
/// permanent neighbour entry per address.
pub fn attach(
    topo: &Topology,
    node: &Node,
    node_ns: &NetNs,
    out_ns: &NetNs,
    out_name: &str,
) -> anyhow::Result<()> {
    let port = router_port(&node.name);
    let mut out = Rtnl::in_netns(out_ns)?;
    crate::links::veth_between(&mut out, &port, node_ns, ENI_NAME)?;
    node_ns.run(|| sysctl::ensure(&format!("net.ipv4.conf.{ENI_NAME}.rp_filter"), "1"))??;
    let link = out.require_link(&port)?;
    out.addr_ensure(link.index, IpNet::V4(Ipv4Net::new(topo.eni_gateway(), 32)?))?;
    out.link_up(link.index, &port)?;
    let block = node.pod_cidr;
    out.route_ensure(
        RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(block.network(), block.prefix_len())
            .output_interface(link.index)
            .build(),
        &format!("{block} dev {port}"),
    )?;
    let mac = Rtnl::in_netns(node_ns)?
        .require_link(ENI_NAME)?
        .mac_string();
    // One `ip -b` for all of them: a process per entry costs seconds in the test VM.
    let batch: String = Topology::eni_addresses(node)
        .iter()
        .map(|addr| format!("neigh replace {addr} lladdr {mac} dev {port} nud permanent\n"))
        .collect();
    ip_batch(out_name, &batch)?;
    Ok(())
}

/// The VPC's source/destination check (see the module doc).
pub fn source_check(topo: &Topology, state: &LabState) -> anyhow::Result<()> {
    let lab = &topo.name;
    let mut router = String::from("table inet vpc {\n  counter sourcecheck { }\n");
    let mut rules = String::new();
    for node in &topo.nodes {
        rules += &format!(
            "    iifname \"{}\" ip saddr != {} counter name sourcecheck drop\n",
            router_port(&node.name),
            node.pod_cidr
        );
    }
    for hook in ["forward", "input"] {
        router += &format!(
            "  chain {hook} {{ type filter hook {hook} priority filter; policy accept;\n{rules}  }}\n"
        );
    }
    router += "}\n";
    nft_in(&names::outside(lab), &router)?;
    let mut switch = String::from(
        "table bridge vpc {\n  counter sourcecheck { }\n  chain forward { type filter hook forward priority filter; policy accept;\n",
    );
    for node in &state.nodes {
        // A node's own address, and the LoadBalancer IPs the cloud routes to it (MetalLB-style:
        // the node answers for them, so the cloud must count them as the node's).
        let mut allowed = vec![node.underlay_ip.to_string()];
        allowed.extend(
            state
                .services
                .iter()
                .filter(|s| s.load_balancer_node.as_deref() == Some(&node.name))
                .filter_map(|s| s.load_balancer_ip.map(|ip| ip.to_string())),
        );
        switch += &format!(
            "    iifname \"n-{}\" ether type ip ip saddr != {{ {} }} counter name sourcecheck drop\n",
            node.name,
            allowed.join(", ")
        );
    }
    switch += "  }\n}\n";
    nft_in(&names::switch(lab), &switch)
}

/// Takes weir's fix away from a node whose pods weir-cni has set up (`eniFix: false`): the ENI's
/// address, the fwmark rule and the connmark table. Removing a device's last address makes the
/// kernel flush the routes through it, so the ENI table's default route is put back: the node is
/// then exactly the brief's (an addressless ENI, the two rules per pod).
pub fn remove_fix(topo: &Topology, node_netns: &str) -> anyhow::Result<()> {
    let gw = topo.eni_gateway().to_string();
    let table = ENI_TABLE.to_string();
    let ip = |args: &[&str]| {
        let mut all = vec!["ip", "-n", node_netns];
        all.extend_from_slice(args);
        run(&all)
    };
    ip(&["-4", "addr", "flush", "dev", ENI_NAME])?;
    ip(&[
        "route", "replace", "default", "via", &gw, "dev", ENI_NAME, "onlink", "table", &table,
    ])?;
    // Both may already be gone (a node without pods never got them).
    let _ = ip(&["rule", "del", "pref", "1024"]);
    let _ = run(&[
        "ip", "netns", "exec", node_netns, "nft", "delete", "table", "inet", "weir-eni",
    ]);
    Ok(())
}

/// What was dropped where, for `weir lab check` and tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Per node: the kernel's TcpExtIPReversePathFilter (strict rp_filter drops).
    pub rp_filter: Vec<(String, u64)>,
    /// Packets the VPC dropped for a source not assigned to the sending interface.
    pub source_check: u64,
}

/// `TcpExt: … IPReversePathFilter …` from /proc/net/netstat of `netns`.
pub fn rp_filter_drops(netns: &str) -> anyhow::Result<u64> {
    let text = run(&["ip", "netns", "exec", netns, "cat", "/proc/net/netstat"])?;
    parse_netstat(&text, "TcpExt", "IPReversePathFilter")
        .with_context(|| format!("no TcpExt IPReversePathFilter in {netns}'s /proc/net/netstat"))
}

/// The value of `field` in the `group` lines of /proc/net/netstat (a header line, then values).
pub fn parse_netstat(text: &str, group: &str, field: &str) -> Option<u64> {
    let prefix = format!("{group}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&prefix));
    let header = lines.next()?;
    let values = lines.next()?;
    let i = header.split_whitespace().position(|h| h == field)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

fn counter_packets(netns: &str, family: &str) -> u64 {
    run(&[
        "ip",
        "netns",
        "exec",
        netns,
        "nft",
        "list",
        "counter",
        family,
        "vpc",
        "sourcecheck",
    ])
    .ok()
    .and_then(|t| {
        let rest = t.split("packets ").nth(1)?;
        rest.split_whitespace().next()?.parse().ok()
    })
    .unwrap_or(0)
}

pub fn counters(state: &LabState) -> Counters {
    Counters {
        rp_filter: state
            .nodes
            .iter()
            .map(|n| (n.name.clone(), rp_filter_drops(&n.netns).unwrap_or(0)))
            .collect(),
        source_check: counter_packets(&names::outside(&state.lab), "inet")
            + counter_packets(&names::switch(&state.lab), "bridge"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netstat_field_is_found_by_header() {
        let text =
            "TcpExt: SyncookiesSent IPReversePathFilter Foo\nTcpExt: 0 7 1\nIpExt: A\nIpExt: 3\n";
        assert_eq!(
            parse_netstat(text, "TcpExt", "IPReversePathFilter"),
            Some(7)
        );
        assert_eq!(parse_netstat(text, "TcpExt", "Nope"), None);
    }

    #[test]
    fn the_eni_topology_is_valid_and_gives_the_eni_the_first_address() {
        let t = Topology::eni_demo();
        assert_eq!(t.eni_gateway(), Ipv4Addr::new(10, 12, 192, 1));
        let a = Topology::eni_addresses(&t.nodes[0]);
        assert_eq!(a[0], Ipv4Addr::new(10, 12, 192, 17));
        assert_eq!(a.len(), 14);
        assert!(t.eni_fix && t.source_check);
    }

    #[test]
    fn eni_topology_errors_name_the_field() {
        let bad = |from: &str, to: &str| {
            assert!(crate::topology::ENI_TOPOLOGY.contains(from), "{from}");
            Topology::parse(&crate::topology::ENI_TOPOLOGY.replacen(from, to, 1)).unwrap_err()
        };
        let e = bad("cni: weir", "cni: reference");
        assert_eq!(e.field, "cni", "{e}");
        let e = bad("podCIDR: 10.12.192.16/28", "podCIDR: 10.12.192.0/28");
        assert_eq!(e.field, "nodes[0].podCIDR", "{e}");
        assert!(e.message.contains("10.12.192.1"), "{e}");
        let t = Topology::parse(&crate::topology::ENI_TOPOLOGY.replacen(
            "eniFix: true",
            "eniFix: false",
            1,
        ))
        .unwrap();
        assert!(!t.eni_fix);
        // the default topology is a bridge network with the fix switch irrelevant but defaulted
        let d = Topology::default_demo();
        assert_eq!(d.network, crate::topology::Network::Bridge);
        assert!(d.eni_fix);
    }
}
