//! Node objects + this node → the complete desired routing state (pure).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use sha2::{Digest, Sha256};
use weir_model::Snapshot;

use crate::annotations::{Annotations, VtepData, DEFAULT_PREFIX};
use crate::node::NodeFacts;
use crate::Mac;

/// flannel's defaults (VNI 1, the Linux kernel's historical VXLAN port 8472).
pub const DEFAULT_VNI: u32 = 1;
pub const DEFAULT_PORT: u16 = 8472;

/// The VXLAN header overhead: outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14 = 50 bytes;
/// the outer IPv6 header is 20 bytes longer.
pub const VXLAN_OVERHEAD_V4: u32 = 50;
pub const VXLAN_OVERHEAD_V6: u32 = 70;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanConfig {
    pub vni: u32,
    pub port: u16,
    /// The VTEP's name: `weir.<vni>` by default (flannel's is `flannel.<vni>`: a distinct name
    /// lets both run side by side during a migration).
    pub device: String,
}

impl VxlanConfig {
    pub fn new(vni: u32, port: u16) -> Self {
        VxlanConfig {
            vni,
            port,
            device: format!("weir.{vni}"),
        }
    }
}

impl Default for VxlanConfig {
    fn default() -> Self {
        Self::new(DEFAULT_VNI, DEFAULT_PORT)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    HostGw,
    Vxlan(VxlanConfig),
}

impl Backend {
    /// The `backend-type` annotation value (flannel's names).
    pub fn type_name(&self) -> &'static str {
        match self {
            Backend::HostGw => "host-gw",
            Backend::Vxlan(_) => "vxlan",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub node_name: String,
    pub backend: Backend,
    pub annotation_prefix: String,
}

impl Config {
    pub fn new(node_name: &str, backend: Backend) -> Self {
        Config {
            node_name: node_name.to_string(),
            backend,
            annotation_prefix: DEFAULT_PREFIX.to_string(),
        }
    }
}

/// This node's interface to the underlay, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Underlay {
    pub ip: IpAddr,
    pub index: u32,
    pub mtu: u32,
}

/// What the planner needs to know about this machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Local {
    /// Every address with its prefix (`10.0.1.5/24`): the directly connected subnets.
    pub addresses: Vec<IpNet>,
    /// The underlay the VTEP rides on (vxlan); None when it cannot be found.
    pub underlay: Option<Underlay>,
}

impl Local {
    /// True when `ip` is on a subnet one of this node's addresses is directly connected to
    /// (host routes, /32 and /128, connect nothing).
    pub fn connected(&self, ip: IpAddr) -> bool {
        self.addresses.iter().any(|a| {
            let host = a.max_prefix_len() == a.prefix_len();
            !host && a.contains(&ip) && a.addr() != ip
        })
    }
}

/// The VTEP device weir wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VtepSpec {
    pub name: String,
    pub vni: u32,
    pub port: u16,
    pub local: IpAddr,
    pub underlay_index: u32,
    pub mtu: u32,
    pub mac: Mac,
    /// This node's own gateway addresses (first address of each pod CIDR, /32 or /128), as
    /// flannel puts on `flannel.1`: traffic the node itself sends to remote pods leaves with a
    /// source address the remote side routes back through the overlay.
    pub addresses: Vec<IpNet>,
}

/// A route weir owns, keyed by destination in [`Entries::routes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteEntry {
    pub gateway: IpAddr,
    /// `dev <vtep> onlink` (vxlan); host-gw routes let the kernel pick the device.
    pub via_vtep: bool,
}

/// The per-remote-node entries, each keyed so that one node's change touches only its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    pub routes: BTreeMap<IpNet, RouteEntry>,
    /// On the VTEP: gateway address → remote VTEP MAC.
    pub neighbours: BTreeMap<IpAddr, Mac>,
    /// On the VTEP: remote VTEP MAC → remote underlay address.
    pub fdb: BTreeMap<Mac, IpAddr>,
}

/// How a remote node is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeStatus {
    /// Its pod CIDRs are routed.
    Routed { pod_cidrs: Vec<IpNet> },
    /// Some or all of it cannot be routed; the reasons say why (logged, and in the status file).
    Refused {
        routed: Vec<IpNet>,
        reasons: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub vtep: Option<VtepSpec>,
    pub entries: Entries,
    /// Per remote node, by name.
    pub status: BTreeMap<String, NodeStatus>,
    /// Problems with this node itself (no Node object, no underlay): nothing is programmed
    /// while one stands, and what is in the kernel is left as it is.
    pub blocked: Option<String>,
}

/// The first address of a pod CIDR: the remote node's overlay gateway (flannel's `10.244.1.0`).
pub fn gateway_of(cidr: IpNet) -> IpAddr {
    cidr.network()
}

fn host_net(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

/// A stable, locally administered unicast MAC for this node's VTEP: the same after a restart
/// or a device re-creation, so the other nodes' FDB and neighbour entries stay valid.
pub fn vtep_mac(node_name: &str, vni: u32) -> Mac {
    let digest = Sha256::digest(format!("weir-vtep/{node_name}/{vni}").as_bytes());
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&digest[..6]);
    mac[0] = (mac[0] & 0xfe) | 0x02;
    mac
}

/// The complete desired state. Deterministic: nodes are visited in name order, so when two
/// nodes claim the same pod CIDR or VTEP MAC the first name wins and the other is refused.
pub fn desire(cfg: &Config, snapshot: &Snapshot, local: &Local) -> Desired {
    let facts: Vec<NodeFacts> = snapshot
        .nodes
        .values()
        .map(|n| NodeFacts::from_node(n, &cfg.annotation_prefix))
        .collect();
    desire_from_facts(cfg, &facts, local)
}

pub fn desire_from_facts(cfg: &Config, nodes: &[NodeFacts], local: &Local) -> Desired {
    let mut desired = Desired {
        vtep: None,
        entries: Entries::default(),
        status: BTreeMap::new(),
        blocked: None,
    };
    let Some(me) = nodes.iter().find(|n| n.name == cfg.node_name) else {
        desired.blocked = Some(format!("no Node object named {:?}", cfg.node_name));
        return desired;
    };
    if let Backend::Vxlan(vx) = &cfg.backend {
        match local_vtep(cfg, vx, me, local) {
            Ok(vtep) => desired.vtep = Some(vtep),
            Err(blocked) => {
                desired.blocked = Some(blocked);
                return desired;
            }
        }
    }
    let mut owners = Owners {
        macs: BTreeMap::new(),
        // Our own pod CIDRs are never routed elsewhere.
        cidrs: me
            .pod_cidrs
            .iter()
            .map(|c| (*c, me.name.as_str()))
            .collect(),
    };
    if let Some(v) = &desired.vtep {
        owners.macs.insert(v.mac, &cfg.node_name);
    }
    let annotations = Annotations::new(&cfg.annotation_prefix);
    for node in nodes.iter().filter(|n| n.name != cfg.node_name) {
        let mut reasons: Vec<String> = node.problems.clone();
        if node.pod_cidrs.is_empty() {
            reasons.push("no pod CIDR".into());
        }
        let entries = &mut desired.entries;
        let routed = match &cfg.backend {
            Backend::HostGw => route_host_gw(node, local, &mut owners, entries, &mut reasons),
            Backend::Vxlan(vx) => {
                let vtep = desired.vtep.as_ref().expect("set above for vxlan");
                match remote_vtep(node, vx, vtep.local, &annotations) {
                    Err(reason) => {
                        reasons.push(reason);
                        Vec::new()
                    }
                    Ok(remote) => route_vxlan(node, remote, &mut owners, entries, &mut reasons),
                }
            }
        };
        let status = if reasons.is_empty() {
            NodeStatus::Routed { pod_cidrs: routed }
        } else {
            NodeStatus::Refused { routed, reasons }
        };
        desired.status.insert(node.name.clone(), status);
    }
    desired
}

/// This node's VTEP, on the underlay; `Err` says why there can be none.
fn local_vtep(
    cfg: &Config,
    vx: &VxlanConfig,
    me: &NodeFacts,
    local: &Local,
) -> Result<VtepSpec, String> {
    let Some(underlay) = &local.underlay else {
        return Err("no underlay interface/address for the VTEP".into());
    };
    let overhead = if underlay.ip.is_ipv4() {
        VXLAN_OVERHEAD_V4
    } else {
        VXLAN_OVERHEAD_V6
    };
    Ok(VtepSpec {
        name: vx.device.clone(),
        vni: vx.vni,
        port: vx.port,
        local: underlay.ip,
        underlay_index: underlay.index,
        mtu: underlay.mtu.saturating_sub(overhead),
        mac: vtep_mac(&cfg.node_name, vx.vni),
        addresses: me
            .pod_cidrs
            .iter()
            .map(|c| host_net(gateway_of(*c)))
            .collect(),
    })
}

/// Which node holds each pod CIDR and VTEP MAC so far: nodes are visited in name order, so
/// the first name wins and a later claim is refused.
struct Owners<'a> {
    cidrs: BTreeMap<IpNet, &'a str>,
    macs: BTreeMap<Mac, &'a str>,
}

impl<'a> Owners<'a> {
    /// Whether `cidr` is free of other nodes' pod CIDRs; if not, says whose in `reasons`.
    fn free(&self, cidr: IpNet, reasons: &mut Vec<String>) -> bool {
        let owner = overlap(&self.cidrs, cidr);
        if let Some(owner) = owner {
            reasons.push(format!("pod CIDR {cidr} overlaps node {owner}'s"));
        }
        owner.is_none()
    }

    /// Routes `cidr` of `node` via `route`, and makes it `node`'s.
    fn route(&mut self, node: &'a str, cidr: IpNet, route: RouteEntry, entries: &mut Entries) {
        entries.routes.insert(cidr, route);
        self.cidrs.insert(cidr, node);
    }
}

/// host-gw: each pod CIDR of `node` via its address of that family, which must be on a
/// directly connected subnet. Returns the CIDRs routed; adds why others are not to `reasons`.
fn route_host_gw<'a>(
    node: &'a NodeFacts,
    local: &Local,
    owners: &mut Owners<'a>,
    entries: &mut Entries,
    reasons: &mut Vec<String>,
) -> Vec<IpNet> {
    let mut routed = Vec::new();
    for cidr in &node.pod_cidrs {
        if !owners.free(*cidr, reasons) {
            continue;
        }
        let family_ip = match cidr {
            IpNet::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpNet::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        let Some(ip) = node.internal_ip_like(family_ip) else {
            reasons.push(format!("pod CIDR {cidr}: no InternalIP of its family"));
            continue;
        };
        if !local.connected(ip) {
            reasons.push(format!(
                "pod CIDR {cidr}: node address {ip} is not on a directly connected subnet (host-gw needs one L2 segment; use vxlan)"
            ));
            continue;
        }
        let route = RouteEntry {
            gateway: ip,
            via_vtep: false,
        };
        owners.route(&node.name, *cidr, route, entries);
        routed.push(*cidr);
    }
    routed
}

/// vxlan: each pod CIDR of `node` via its gateway address on the VTEP, with the neighbour
/// and FDB entries that reach its VTEP (`remote`: its VTEP data and underlay address).
/// Returns the CIDRs routed; adds why others are not to `reasons`.
fn route_vxlan<'a>(
    node: &'a NodeFacts,
    (data, underlay_ip): (VtepData, IpAddr),
    owners: &mut Owners<'a>,
    entries: &mut Entries,
    reasons: &mut Vec<String>,
) -> Vec<IpNet> {
    if let Some(owner) = owners.macs.get(&data.mac) {
        reasons.push(format!(
            "VTEP MAC {} is node {owner}'s already",
            crate::format_mac(&data.mac)
        ));
        return Vec::new();
    }
    let mut routed = Vec::new();
    for cidr in &node.pod_cidrs {
        if !owners.free(*cidr, reasons) {
            continue;
        }
        let gw = gateway_of(*cidr);
        entries.neighbours.insert(gw, data.mac);
        let route = RouteEntry {
            gateway: gw,
            via_vtep: true,
        };
        owners.route(&node.name, *cidr, route, entries);
        routed.push(*cidr);
    }
    if !routed.is_empty() {
        entries.fdb.insert(data.mac, underlay_ip);
        owners.macs.insert(data.mac, &node.name);
    }
    routed
}

/// The owner of a CIDR that overlaps `cidr`, if any.
fn overlap<'a>(owners: &BTreeMap<IpNet, &'a str>, cidr: IpNet) -> Option<&'a str> {
    owners
        .iter()
        .find(|(c, _)| c.contains(&cidr.network()) || cidr.contains(&c.network()))
        .map(|(_, o)| *o)
}

/// A remote node's VTEP data and underlay address, or why it cannot be used.
fn remote_vtep(
    node: &NodeFacts,
    vx: &VxlanConfig,
    local: IpAddr,
    keys: &Annotations,
) -> Result<(VtepData, IpAddr), String> {
    if let Some(t) = &node.backend_type {
        if t != "vxlan" {
            return Err(format!("announces backend {t:?}, this node runs vxlan"));
        }
    }
    let data = node
        .vtep
        .ok_or_else(|| format!("no VTEP published yet ({})", keys.backend_data()))?;
    let vni = data.vni.unwrap_or(DEFAULT_VNI);
    if vni != vx.vni {
        return Err(format!("VNI {vni} differs from this node's {}", vx.vni));
    }
    let ip = node.underlay_ip_like(local).ok_or_else(|| {
        let family = if local.is_ipv4() { "IPv4" } else { "IPv6" };
        format!("no {family} underlay address (public-ip annotation or InternalIP)")
    })?;
    Ok((data, ip))
}
