//! The lab's wires: veth pairs between namespaces, a namespace's `eth0`, and ports on the
//! underlay switch.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;

use anyhow::Context;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rtnetlink::packet_route::link::{InfoData, InfoVeth};
use rtnetlink::{LinkUnspec, LinkVeth, RouteMessageBuilder};
use weir_kernel::{NetNs, Rtnl};

use crate::names;

/// The bridge in the underlay switch's namespace.
pub const UNDERLAY_BRIDGE: &str = "br0";

/// Creates a veth pair: `local_name` in the namespace of `local`, `peer_name` in `peer_ns`.
pub fn veth_between(
    local: &mut Rtnl,
    local_name: &str,
    peer_ns: &NetNs,
    peer_name: &str,
) -> anyhow::Result<()> {
    let peer = LinkUnspec::new_with_name(peer_name)
        .setns_by_fd(peer_ns.file().as_raw_fd())
        .build();
    let msg = LinkVeth::new(local_name, peer_name)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    local.link_add(msg, &format!("veth {local_name}/{peer_name}"))?;
    Ok(())
}

/// Brings `lo` up and configures `eth0` (already moved in) with `addr`, up.
pub fn setup_eth0(ns: &NetNs, addr: Ipv4Net, default_via: Option<Ipv4Addr>) -> anyhow::Result<()> {
    let mut rt = Rtnl::in_netns(ns)?;
    let lo = rt.require_link("lo")?;
    rt.link_up(lo.index, "lo")?;
    let eth0 = rt.require_link("eth0")?;
    rt.addr_ensure(eth0.index, IpNet::V4(addr))?;
    rt.link_up(eth0.index, "eth0")?;
    if let Some(gw) = default_via {
        let route = RouteMessageBuilder::<Ipv4Addr>::new().gateway(gw).build();
        rt.route_ensure(route, &format!("default via {gw}"))?;
    }
    Ok(())
}

/// Dual-stack: `eth0`'s IPv6 address (and default route), beside what [`setup_eth0`] set.
pub fn setup_eth0_v6(
    ns: &NetNs,
    addr: Ipv6Net,
    default_via: Option<Ipv6Addr>,
) -> anyhow::Result<()> {
    let mut rt = Rtnl::in_netns(ns)?;
    let eth0 = rt.require_link("eth0")?;
    rt.addr_ensure(eth0.index, IpNet::V6(addr))?;
    if let Some(gw) = default_via {
        let route = RouteMessageBuilder::<Ipv6Addr>::new().gateway(gw).build();
        rt.route_ensure(route, &format!("default via {gw}"))?;
    }
    Ok(())
}

/// IPv6 addresses usable at once in `ns` (no duplicate address detection on its links, made
/// after this), as weir-cni does in pods: a lab's addresses are unique by construction, and a
/// tentative address would fail the first probes.
pub fn no_dad(ns: &NetNs) -> anyhow::Result<()> {
    ns.run(|| {
        for conf in ["all", "default"] {
            weir_kernel::sysctl::ensure(&format!("net.ipv6.conf.{conf}.accept_dad"), "0")?;
        }
        Ok::<_, anyhow::Error>(())
    })?
}

/// Opens the named network namespace.
pub fn open(name: &str) -> anyhow::Result<NetNs> {
    NetNs::named(name).with_context(|| format!("open netns {name}"))
}

/// Plugs `peer`'s `eth0` into the lab's underlay switch as port `port`.
pub fn plug_into_switch(lab: &str, port: &str, peer: &NetNs) -> anyhow::Result<()> {
    let mut sw_rt = Rtnl::in_netns(&open(&names::switch(lab))?)?;
    let br = sw_rt.require_link(UNDERLAY_BRIDGE)?;
    veth_between(&mut sw_rt, port, peer, "eth0")?;
    let link = sw_rt.require_link(port)?;
    sw_rt.link_set(
        LinkUnspec::new_with_index(link.index)
            .controller(br.index)
            .up()
            .build(),
        port,
    )?;
    Ok(())
}
