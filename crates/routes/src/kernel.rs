//! The kernel side: observe what is there, apply the diff, clean up (netlink only).

use std::net::IpAddr;

use ipnet::IpNet;
use tracing::{info, warn};
use weir_kernel::rtnl::Family;
use weir_kernel::{route_message, vxlan_link_message, Neighbour, NlError, Rtnl};
use weir_model::Snapshot;

use crate::diff::{diff, ForeignDevice, Observed, ObservedVtep, Op};
use crate::node::NodeFacts;
use crate::plan::{desire, Backend, Config, Desired, Local, RouteEntry, Underlay};
use crate::{format_mac, Mac, ROUTE_PROTOCOL};

const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;
const AF_BRIDGE: u8 = libc::AF_BRIDGE as u8;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Netlink(#[from] NlError),
    #[error(transparent)]
    Foreign(#[from] ForeignDevice),
    #[error("underlay interface {0}: {1}")]
    Underlay(String, String),
}

/// The name of weir's VTEP for a backend (also observed under host-gw, so that switching from
/// vxlan removes the device).
fn vtep_name(cfg: &Config) -> String {
    match &cfg.backend {
        Backend::Vxlan(v) => v.device.clone(),
        Backend::HostGw => crate::plan::VxlanConfig::default().device,
    }
}

fn family(code: u8) -> Family {
    Family::from(code)
}

/// What the kernel holds of weir's (see [`Observed`]).
pub fn observe(rtnl: &mut Rtnl, cfg: &Config) -> Result<Observed, Error> {
    let name = vtep_name(cfg);
    let mut observed = Observed::default();
    let link = rtnl.link_by_name(&name)?;
    if let Some(link) = &link {
        let addresses = rtnl
            .addrs(Some(link.index))?
            .into_iter()
            .map(|a| a.net)
            .collect();
        observed.vtep = Some(ObservedVtep {
            index: link.index,
            kind: link.kind.clone(),
            vxlan: link.vxlan.clone().unwrap_or_default(),
            mac: link.mac.clone(),
            mtu: link.mtu,
            up: link.up,
            addresses,
        });
    }
    let vtep_index = link.as_ref().map(|l| l.index);
    for fam in [AF_INET, AF_INET6] {
        for r in rtnl.routes(family(fam))? {
            if r.protocol != ROUTE_PROTOCOL || r.table != u32::from(libc::RT_TABLE_MAIN) {
                continue;
            }
            let (Some(dst), Some(gateway)) = (r.destination, r.gateway) else {
                continue;
            };
            let via_vtep = vtep_index.is_some() && r.oif == vtep_index;
            observed
                .entries
                .routes
                .insert(dst, RouteEntry { gateway, via_vtep });
        }
    }
    if let Some(index) = vtep_index {
        if link.as_ref().and_then(|l| l.kind.as_deref()) == Some("vxlan") {
            for fam in [AF_INET, AF_INET6] {
                for n in rtnl.neighbours(family(fam), Some(index))? {
                    if let (true, Some(ip), Some(mac)) = (n.permanent, n.ip, mac6(&n.mac)) {
                        observed.entries.neighbours.insert(ip, mac);
                    }
                }
            }
            for n in rtnl.neighbours(family(AF_BRIDGE), Some(index))? {
                if let (true, Some(ip), Some(mac)) = (n.permanent, n.ip, mac6(&n.mac)) {
                    observed.entries.fdb.insert(mac, ip);
                }
            }
        }
    }
    Ok(observed)
}

fn mac6(bytes: &[u8]) -> Option<Mac> {
    bytes.try_into().ok()
}

/// This machine's addresses and underlay. The underlay is `iface` when given (its first
/// global address, IPv4 preferred), else the device holding this node's first InternalIP.
pub fn local_view(
    rtnl: &mut Rtnl,
    me: Option<&NodeFacts>,
    iface: Option<&str>,
) -> Result<Local, Error> {
    let addrs = rtnl.addrs(None)?;
    let mut local = Local {
        addresses: addrs.iter().map(|a| a.net).collect(),
        underlay: None,
    };
    let found = match iface {
        Some(name) => {
            let link = rtnl
                .link_by_name(name)?
                .ok_or_else(|| Error::Underlay(name.into(), "no such device".into()))?;
            let mut on_link: Vec<IpAddr> = addrs
                .iter()
                .filter(|a| a.index == link.index)
                .map(|a| a.net.addr())
                .filter(|ip| match ip {
                    IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 != 0xfe80,
                    IpAddr::V4(_) => true,
                })
                .collect();
            on_link.sort_by_key(|ip| ip.is_ipv6());
            let ip = on_link
                .first()
                .copied()
                .ok_or_else(|| Error::Underlay(name.into(), "has no usable address".into()))?;
            Some((ip, link.index))
        }
        None => me.and_then(|me| {
            me.internal_ips.iter().find_map(|ip| {
                addrs
                    .iter()
                    .find(|a| a.net.addr() == *ip)
                    .map(|a| (*ip, a.index))
            })
        }),
    };
    if let Some((ip, index)) = found {
        let mtu = rtnl
            .links()?
            .into_iter()
            .find(|l| l.index == index)
            .map(|l| l.mtu)
            .unwrap_or(1500);
        local.underlay = Some(Underlay { ip, index, mtu });
    }
    Ok(local)
}

/// The outcome of one reconciliation.
#[derive(Debug)]
pub struct Reconciled {
    pub desired: Desired,
    /// The operations carried out (empty when everything was already right).
    pub applied: Vec<Op>,
    /// Operations that failed, with the kernel's reason; the others were still carried out.
    pub failed: Vec<(Op, String)>,
}

/// observe → desire → diff → apply.
pub fn reconcile(
    rtnl: &mut Rtnl,
    cfg: &Config,
    snapshot: &Snapshot,
    iface: Option<&str>,
) -> Result<Reconciled, Error> {
    let me = snapshot
        .nodes
        .get(&cfg.node_name)
        .map(|n| NodeFacts::from_node(n, &cfg.annotation_prefix));
    let local = local_view(rtnl, me.as_ref(), iface)?;
    let desired = desire(cfg, snapshot, &local);
    let observed = observe(rtnl, cfg)?;
    let ops = diff(&desired, &observed)?;
    let (applied, failed) = apply(rtnl, &vtep_name(cfg), ops);
    Ok(Reconciled {
        desired,
        applied,
        failed,
    })
}

/// Carries out `ops` in order; a failed operation is reported and the rest still run.
pub fn apply(rtnl: &mut Rtnl, vtep: &str, ops: Vec<Op>) -> (Vec<Op>, Vec<(Op, String)>) {
    let mut applied = Vec::new();
    let mut failed = Vec::new();
    for op in ops {
        match apply_one(rtnl, vtep, &op) {
            Ok(()) => {
                info!("routes: {}", describe(&op, vtep));
                applied.push(op);
            }
            Err(e) => {
                warn!("routes: {} failed: {e}", describe(&op, vtep));
                failed.push((op, e.to_string()));
            }
        }
    }
    (applied, failed)
}

fn vtep_index(rtnl: &mut Rtnl, vtep: &str) -> Result<u32, NlError> {
    Ok(rtnl.require_link(vtep)?.index)
}

fn apply_one(rtnl: &mut Rtnl, vtep: &str, op: &Op) -> Result<(), NlError> {
    match op {
        Op::DeleteVtep => rtnl.link_del_by_name(vtep).map(|_| ()),
        Op::CreateVtep(spec) => {
            let msg = vxlan_link_message(
                &spec.name,
                spec.vni,
                spec.local,
                spec.port,
                spec.underlay_index,
                spec.mtu,
                &spec.mac,
            );
            rtnl.link_add(msg, &format!("vxlan {}", spec.name))?;
            let index = vtep_index(rtnl, vtep)?;
            rtnl.link_up(index, vtep)
        }
        Op::SetVtepMtu(mtu) => {
            let index = vtep_index(rtnl, vtep)?;
            rtnl.link_set_mtu(index, *mtu, vtep)
        }
        Op::SetVtepUp => {
            let index = vtep_index(rtnl, vtep)?;
            rtnl.link_up(index, vtep)
        }
        Op::AddVtepAddress(net) => {
            let index = vtep_index(rtnl, vtep)?;
            rtnl.addr_ensure(index, *net)
        }
        Op::DelVtepAddress(net) => {
            let index = vtep_index(rtnl, vtep)?;
            rtnl.addr_del(index, *net)
        }
        Op::AddRoute(dst, r) => {
            let oif = if r.via_vtep {
                Some(vtep_index(rtnl, vtep)?)
            } else {
                None
            };
            let msg = route_message(*dst, Some(r.gateway), oif, ROUTE_PROTOCOL, r.via_vtep);
            rtnl.route_add(msg, &format!("{dst} via {}", r.gateway))
        }
        Op::DelRoute(dst, r) => {
            let msg = route_message(*dst, Some(r.gateway), None, ROUTE_PROTOCOL, false);
            ignore_missing(rtnl.route_del(msg, &format!("{dst} via {}", r.gateway)))
        }
        Op::SetNeighbour(ip, mac) => {
            let index = vtep_index(rtnl, vtep)?;
            let msg = Neighbour::permanent_message(index, *ip, mac);
            rtnl.neigh_replace(msg, &format!("neighbour {ip}"))
        }
        Op::DelNeighbour(ip, mac) => {
            let index = vtep_index(rtnl, vtep)?;
            let msg = Neighbour::permanent_message(index, *ip, mac);
            ignore_missing(rtnl.neigh_del(msg, &format!("neighbour {ip}")))
        }
        Op::SetFdb(mac, ip) => {
            let index = vtep_index(rtnl, vtep)?;
            let msg = Neighbour::vxlan_fdb_message(index, mac, *ip);
            rtnl.neigh_replace(msg, &format!("fdb {}", format_mac(mac)))
        }
        Op::DelFdb(mac, ip) => {
            let index = vtep_index(rtnl, vtep)?;
            let msg = Neighbour::vxlan_fdb_message(index, mac, *ip);
            ignore_missing(rtnl.neigh_del(msg, &format!("fdb {}", format_mac(mac))))
        }
    }
}

/// Deleting what is already gone is success.
fn ignore_missing(r: Result<(), NlError>) -> Result<(), NlError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

/// One line per operation, as `ip` would write it.
pub fn describe(op: &Op, vtep: &str) -> String {
    match op {
        Op::DeleteVtep => format!("ip link del {vtep}"),
        Op::CreateVtep(s) => format!(
            "ip link add {} type vxlan id {} local {} dstport {} dev #{} nolearning mtu {} address {}",
            s.name,
            s.vni,
            s.local,
            s.port,
            s.underlay_index,
            s.mtu,
            format_mac(&s.mac)
        ),
        Op::SetVtepMtu(m) => format!("ip link set {vtep} mtu {m}"),
        Op::SetVtepUp => format!("ip link set {vtep} up"),
        Op::AddVtepAddress(a) => format!("ip addr add {a} dev {vtep}"),
        Op::DelVtepAddress(a) => format!("ip addr del {a} dev {vtep}"),
        Op::AddRoute(d, r) => route_text("add", d, r, vtep),
        Op::DelRoute(d, r) => route_text("del", d, r, vtep),
        Op::SetNeighbour(ip, mac) => format!(
            "ip neigh replace {ip} lladdr {} dev {vtep} nud permanent",
            format_mac(mac)
        ),
        Op::DelNeighbour(ip, _) => format!("ip neigh del {ip} dev {vtep}"),
        Op::SetFdb(mac, ip) => format!(
            "bridge fdb replace {} dev {vtep} dst {ip} self permanent",
            format_mac(mac)
        ),
        Op::DelFdb(mac, ip) => format!("bridge fdb del {} dev {vtep} dst {ip} self", format_mac(mac)),
    }
}

fn route_text(verb: &str, dst: &IpNet, r: &RouteEntry, vtep: &str) -> String {
    let dev = if r.via_vtep {
        format!(" dev {vtep} onlink")
    } else {
        String::new()
    };
    format!(
        "ip route {verb} {dst} via {}{dev} proto {ROUTE_PROTOCOL}",
        r.gateway
    )
}

/// What `cleanup` removed.
#[derive(Debug, Default)]
pub struct Cleaned {
    pub routes: usize,
    pub devices: Vec<String>,
    pub errors: Vec<String>,
}

/// Removes everything of weir's: routes with [`ROUTE_PROTOCOL`] (main table) and vxlan devices
/// named `weir.*` (their neighbour and FDB entries go with them). Errors are collected and the
/// rest still removed.
pub fn cleanup(rtnl: &mut Rtnl) -> Result<Cleaned, NlError> {
    let mut cleaned = Cleaned::default();
    for link in rtnl.links()? {
        if link.kind.as_deref() == Some("vxlan") && link.name.starts_with("weir.") {
            match rtnl.link_del(link.index, &link.name) {
                Ok(()) => cleaned.devices.push(link.name),
                Err(e) if e.is_not_found() => {}
                Err(e) => cleaned.errors.push(e.to_string()),
            }
        }
    }
    for fam in [AF_INET, AF_INET6] {
        for r in rtnl.routes(family(fam))? {
            if r.protocol != ROUTE_PROTOCOL || r.table != u32::from(libc::RT_TABLE_MAIN) {
                continue;
            }
            let Some(dst) = r.destination else { continue };
            let msg = route_message(dst, r.gateway, r.oif, ROUTE_PROTOCOL, false);
            match rtnl.route_del(msg, &dst.to_string()) {
                Ok(()) => cleaned.routes += 1,
                Err(e) if e.is_not_found() => {}
                Err(e) => cleaned.errors.push(e.to_string()),
            }
        }
    }
    Ok(cleaned)
}
