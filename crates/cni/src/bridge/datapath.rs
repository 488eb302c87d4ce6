//! bridge mode's datapath, one attachment at a time ([`Attachment`]): a Linux bridge on the node,
//! one veth pair per pod, the gateway on the bridge.
//!
//! ADD allocates first and builds second, undoing both on any failure. Everything ADD creates can be
//! found again from (network, container ID, ifname) alone — the host veth name is derived from them
//! and the IPAM files record them — so DEL and GC reclaim what a killed ADD left behind. Each host
//! veth also carries its network in its alias, so GC of one network can tell its own orphans from
//! another network's pods.

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth};
use netlink_packet_route::route::RouteMessage;
use netlink_packet_route::AddressFamily;
use rtnetlink::{LinkBridge, LinkBridgePort, LinkUnspec, RouteMessageBuilder};
use sha2::{Digest, Sha256};
use weir_kernel::rtnl::Route as KernelRoute;
use weir_kernel::{sysctl, Link, NetNs, NlError, Rtnl};

use crate::config::NetConf;
use crate::ipam::{Allocation, Store};
use crate::masq;
use crate::mode::{ipam_err, open_netns};
use crate::result::ResultBuilder;
use crate::spec::{CniError, CniResult, ErrorCode, Outcome, Route};

/// Beside the IPAM files: the masquerade destinations this network's table was set up with.
pub(crate) const MASQ_STAMP: &str = "weir-masq-direct";
/// Beside the IPAM files: "<ifindex> <mac>" of the bridge whose MAC this network last pinned.
const BRIDGE_MAC_STAMP: &str = "weir-bridge-mac";

/// The host end of a pod's veth: `weir` + 11 hex digits of SHA-256(network, container ID, ifname).
/// Deterministic, so DEL finds it without any saved state; 15 bytes, the kernel's limit. The
/// network is part of it because two networks may attach the same container.
pub fn host_veth_name(network: &str, container_id: &str, ifname: &str) -> String {
    // Neither a network name nor a container ID contains '/', so the input is unambiguous and
    // never equals a legacy input.
    hashed_veth_name(&format!("{network}/{container_id}/{ifname}"))
}

/// The name releases before the network was part of it used; pods they made must still DEL.
pub fn legacy_host_veth_name(container_id: &str, ifname: &str) -> String {
    hashed_veth_name(&format!("{container_id}/{ifname}"))
}

fn hashed_veth_name(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("weir{}", &hex[..11])
}

/// The alias every host veth of `network` carries (IFLA_IFALIAS, at most 255 bytes): the name
/// itself when it fits, which is what an operator reading `ip link` wants, else its hash.
pub fn owner_alias(network: &str) -> String {
    let alias = format!("weir-cni/{network}");
    if alias.len() <= 255 {
        return alias;
    }
    let digest = Sha256::digest(network.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("weir-cni/sha256:{hex}")
}

/// A random unicast, locally administered MAC for a new bridge.
fn random_bridge_mac() -> Vec<u8> {
    let mut mac = [0u8; 6];
    // SAFETY: getrandom writes at most mac.len() bytes into the buffer we own.
    let n = unsafe { libc::getrandom(mac.as_mut_ptr().cast(), mac.len(), 0) };
    if n != mac.len() as isize {
        // No entropy (very early boot): derive from time and pid; uniqueness on one node suffices.
        let seed = format!("{:?}/{}", std::time::SystemTime::now(), std::process::id());
        mac.copy_from_slice(&Sha256::digest(seed.as_bytes())[..6]);
    }
    mac[0] = (mac[0] & 0xfc) | 0x02;
    mac.to_vec()
}

fn netlink_err(e: NlError) -> CniError {
    CniError::new(ErrorCode::Netlink, e.to_string())
}

fn io_err(what: &str, e: std::io::Error) -> CniError {
    CniError::new(ErrorCode::Io, format!("{what}: {e}"))
}

pub struct Attachment<'a> {
    pub conf: &'a NetConf,
    pub container_id: &'a str,
    pub ifname: &'a str,
}

impl Attachment<'_> {
    fn host_veth(&self) -> String {
        host_veth_name(&self.conf.name, self.container_id, self.ifname)
    }

    /// This attachment's host veth, under today's name or (made by an older release) the legacy
    /// one. A legacy-named veth is taken only if nothing says it belongs to another network: no
    /// other network's alias, and a port of this network's bridge.
    fn find_host_veth(&self, host: &mut Rtnl) -> CniResult<Option<Link>> {
        if let Some(link) = host.link_by_name(&self.host_veth()).map_err(netlink_err)? {
            return Ok(Some(link));
        }
        let legacy = legacy_host_veth_name(self.container_id, self.ifname);
        let Some(link) = host.link_by_name(&legacy).map_err(netlink_err)? else {
            return Ok(None);
        };
        let alias_ok = link
            .alias
            .as_deref()
            .is_none_or(|a| a == owner_alias(&self.conf.name));
        let bridge = host.link_by_name(&self.conf.bridge).map_err(netlink_err)?;
        let on_our_bridge = bridge.is_some_and(|b| link.controller == Some(b.index));
        Ok((link.kind.as_deref() == Some("veth") && alias_ok && on_our_bridge).then_some(link))
    }

    fn masq(&self, store: &Store) -> masq::NetMasq {
        masq::NetMasq {
            scope: masq::Scope::for_network(&self.conf.name),
            direct: self.conf.masquerade_exempt(),
            stamp: store.dir().join(MASQ_STAMP),
        }
    }

    fn mtu(&self) -> u32 {
        self.conf.mtu.unwrap_or(1500)
    }

    pub fn add(&self, netns_path: &std::path::Path, store: &Store) -> CniResult<Outcome> {
        let netns = open_netns(netns_path)?;
        let mut host = Rtnl::new().map_err(|e| io_err("netlink socket", e))?;
        let mut pod =
            Rtnl::in_netns(&netns).map_err(|e| io_err("netlink socket in pod namespace", e))?;
        // Checked before allocating, because a failed ADD undoes what it allocated and built, and
        // here that would be someone else's working interface.
        self.refuse_existing_interface(&mut host, &mut pod, store)?;
        let allocations = store
            .allocate_requested(
                &self.conf.ipam,
                self.container_id,
                self.ifname,
                &self.conf.requested.ips,
            )
            .map_err(ipam_err)?;
        match self.build(&mut host, &mut pod, &netns, netns_path, &allocations, store) {
            Ok(outcome) => Ok(outcome),
            Err(e) => {
                // Undo in reverse order; the original error is what the runtime needs to see.
                let ips: Vec<IpAddr> = allocations.iter().map(|a| a.address.addr()).collect();
                let _ = self.teardown(&ips, store);
                let _ = store.release(self.container_id, self.ifname);
                Err(e)
            }
        }
    }

    /// The spec: ADD must fail if an interface of the requested name exists in the container, and
    /// a second ADD of the same (container ID, ifname) is an error, not a rebuild.
    /// An interface left by a finished DEL (its addresses released, its veth still being
    /// deleted by the DEL's background child) is not an attachment: it is deleted now, so a
    /// DEL followed at once by an ADD of the same (container ID, ifname) works.
    fn refuse_existing_interface(
        &self,
        host: &mut Rtnl,
        pod: &mut Rtnl,
        store: &Store,
    ) -> CniResult<()> {
        let Some(existing) = pod.link_by_name(self.ifname).map_err(netlink_err)? else {
            return Ok(());
        };
        let veth = self.find_host_veth(host)?;
        if let Some(v) = &veth {
            let released = store
                .lookup(self.container_id, self.ifname)
                .map_err(ipam_err)?
                .is_empty();
            if released {
                // The DEL's child may delete it first.
                match host.link_del(v.index, "pod veth left by DEL") {
                    Err(e) if e.is_not_found() => {}
                    other => other.map_err(netlink_err)?,
                }
                return Ok(());
            }
        }
        // No host veth: the DEL's child may have deleted the pair (both ends at once) since
        // the pod's interface was seen. Gone now, it was that leftover (a CI failure).
        if veth.is_none()
            && pod
                .link_by_name(self.ifname)
                .map_err(netlink_err)?
                .is_none()
        {
            return Ok(());
        }
        let msg = match veth {
            Some(veth) => format!(
                "container {} is already attached to network {} as {} (host interface {}); \
                 DEL it before adding it again",
                self.container_id, self.conf.name, self.ifname, veth.name
            ),
            None => format!(
                "interface {} already exists in the pod namespace ({})",
                self.ifname,
                existing.kind.unwrap_or_else(|| "device".into())
            ),
        };
        Err(CniError::new(ErrorCode::AlreadyExists, msg))
    }

    fn build(
        &self,
        host: &mut Rtnl,
        pod: &mut Rtnl,
        netns: &NetNs,
        netns_path: &std::path::Path,
        allocations: &[Allocation],
        store: &Store,
    ) -> CniResult<Outcome> {
        let bridge = self.ensure_bridge(host, allocations, store)?;
        let veth = self.create_veth(host, pod, netns, &bridge)?;
        let pod_if = pod.require_link(self.ifname).map_err(netlink_err)?;
        if allocations.iter().any(|a| a.address.addr().is_ipv6()) {
            // Without this the address stays "tentative" for a second or two and the pod cannot send
            // (`enabledad` keeps DAD on, as the reference plugin does).
            let dad = if self.conf.enable_dad { "1" } else { "0" };
            netns
                .run(|| sysctl::ensure(&format!("net.ipv6.conf.{}.accept_dad", self.ifname), dad))
                .and_then(|r| r)
                .map_err(|e| io_err("disable DAD in pod", e))?;
        }
        for a in allocations {
            pod.addr_ensure(pod_if.index, a.address)
                .map_err(netlink_err)?;
        }
        pod.link_up(pod_if.index, self.ifname)
            .map_err(netlink_err)?;
        let routes = self.routes(allocations);
        for r in &routes {
            pod.route_ensure(route_message(r, pod_if.index), &r.dst.to_string())
                .map_err(netlink_err)?;
        }

        self.host_sysctls(allocations)?;
        if self.conf.ip_masq {
            let ips: Vec<IpAddr> = allocations.iter().map(|a| a.address.addr()).collect();
            self.masq(store).ensure(&ips, || store_addresses(store))?;
        }

        Ok(ResultBuilder::after(self.conf.prev_result.as_ref())?
            .host_interface(&bridge)
            .host_interface(&veth)
            .pod_interface(self.ifname, &pod_if, netns_path)
            .ips(allocations.iter().map(|a| (a.address, a.gateway)))
            .routes(routes)
            .dns(self.conf.result_dns()?)
            .build())
    }

    /// Creates the bridge if needed, pins its MAC, puts each range set's gateway on it, brings it up.
    ///
    /// A bridge whose MAC was never set takes the lowest MAC among its ports, so deleting the pod
    /// that owned it changes the gateway's MAC under every other pod, whose neighbour entry then
    /// black-holes their traffic until it expires (30-40 s). A MAC set explicitly stays, so a new
    /// bridge is created with one, and an existing one gets its current MAC set once (recorded
    /// in a stamp beside the IPAM store, as setting it on every ADD would flush the node's ARP
    /// cache on the bridge every time).
    fn ensure_bridge(
        &self,
        host: &mut Rtnl,
        allocations: &[Allocation],
        store: &Store,
    ) -> CniResult<Link> {
        let name = &self.conf.bridge;
        let stamp = store.dir().join(BRIDGE_MAC_STAMP);
        let bridge = match host.link_by_name(name).map_err(netlink_err)? {
            Some(link) => link,
            None => {
                let msg = LinkBridge::new(name)
                    .mtu(self.mtu())
                    .address(random_bridge_mac())
                    .up()
                    .build();
                match host.link_add(msg, &format!("bridge {name}")) {
                    Ok(()) => {}
                    Err(e) if e.is_exists() => {} // a concurrent ADD made it first
                    Err(e) => return Err(netlink_err(e)),
                }
                host.require_link(name).map_err(netlink_err)?
            }
        };
        if bridge.kind.as_deref() != Some("bridge") {
            return Err(CniError::new(
                ErrorCode::InvalidConfig,
                format!(
                    "bridge: {name} exists but is a {} device, not a bridge",
                    bridge.kind.as_deref().unwrap_or("non-virtual")
                ),
            ));
        }
        if self.conf.promisc_mode {
            let msg = LinkUnspec::new_with_index(bridge.index)
                .promiscuous(true)
                .build();
            host.link_set(msg, &format!("{name} promiscuous"))
                .map_err(netlink_err)?;
        }
        if self.conf.is_gateway {
            for a in allocations {
                if let Some(gw) = a.gateway {
                    let net =
                        IpNet::new(gw, a.address.prefix_len()).expect("prefix from a valid net");
                    if self.conf.force_address {
                        self.drop_conflicting_addrs(host, &bridge, net)?;
                    }
                    host.addr_ensure(bridge.index, net).map_err(netlink_err)?;
                }
            }
        }
        let pinned = format!("{} {}", bridge.index, bridge.mac_string());
        if std::fs::read_to_string(&stamp).ok().as_deref() != Some(pinned.as_str()) {
            // Setting the MAC it already has changes nothing on the wire but marks it as set.
            let msg = LinkUnspec::new_with_index(bridge.index)
                .address(bridge.mac.clone())
                .build();
            host.link_set(msg, &format!("pin MAC of bridge {name}"))
                .map_err(netlink_err)?;
            // The stamp only saves the next ADD a netlink call: failing to write it is harmless.
            let tmp = stamp.with_extension("tmp");
            if std::fs::write(&tmp, &pinned).is_ok() {
                let _ = std::fs::rename(&tmp, &stamp);
            }
        }
        if !bridge.up {
            host.link_up(bridge.index, name).map_err(netlink_err)?;
        }
        Ok(bridge)
    }

    /// forceAddress: removes the bridge's other addresses in `gateway`'s subnet (either containing
    /// the other), so a changed gateway replaces the old one instead of sitting beside it.
    fn drop_conflicting_addrs(
        &self,
        host: &mut Rtnl,
        bridge: &Link,
        gateway: IpNet,
    ) -> CniResult<()> {
        for a in host.addrs(Some(bridge.index)).map_err(netlink_err)? {
            let overlaps = a.net.contains(&gateway.addr()) || gateway.contains(&a.net.addr());
            let link_local =
                matches!(a.net, IpNet::V6(n) if n.addr().segments()[0] & 0xffc0 == 0xfe80);
            if a.net != gateway && overlaps && !link_local {
                match host.addr_del(bridge.index, a.net) {
                    Err(e) if e.errno() != Some(libc::EADDRNOTAVAIL) => return Err(netlink_err(e)),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// One message creates the pair: host end already a bridge port and up, pod end named
    /// `ifname` directly inside the pod namespace, both with the MTU.
    fn create_veth(
        &self,
        host: &mut Rtnl,
        pod: &mut Rtnl,
        netns: &NetNs,
        bridge: &Link,
    ) -> CniResult<Link> {
        use std::os::fd::AsRawFd;
        let name = self.host_veth();
        // A leftover from an ADD that was killed half-way: start clean.
        host.link_del_by_name(&name).map_err(netlink_err)?;
        if let Some(stale) = pod.link_by_name(self.ifname).map_err(netlink_err)? {
            // (checked before allocating too; this catches a concurrent creator)
            return Err(CniError::new(
                ErrorCode::AlreadyExists,
                format!(
                    "interface {} already exists in the pod namespace ({})",
                    self.ifname,
                    stale.kind.unwrap_or_default()
                ),
            ));
        }
        let mut peer = LinkUnspec::new_with_name(self.ifname)
            .mtu(self.mtu())
            .setns_by_fd(netns.file().as_raw_fd());
        if let Some(mac) = self.conf.requested.mac {
            peer = peer.address(mac.to_vec());
        }
        let peer = peer.build();
        let msg = rtnetlink::LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
            .name(name.clone())
            .mtu(self.mtu())
            .controller(bridge.index)
            .up()
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build();
        host.link_add(msg, &format!("veth {name}"))
            .map_err(netlink_err)?;
        let veth = host.require_link(&name).map_err(netlink_err)?;
        // The kernel ignores an alias in RTM_NEWLINK: set it now. GC reads it to know the network.
        let alias = LinkUnspec::new_with_index(veth.index)
            .alias(owner_alias(&self.conf.name))
            .build();
        host.link_set(alias, &format!("{name} alias"))
            .map_err(netlink_err)?;
        if self.conf.hairpin_mode || self.conf.port_isolation {
            // Hairpin: a pod reaching itself through a Service comes back out of its own port.
            // Isolation (portIsolation): isolated ports forward only to non-isolated ones (the bridge).
            let mut port = LinkBridgePort::new(veth.index);
            if self.conf.hairpin_mode {
                port = port.hairpin(true);
            }
            if self.conf.port_isolation {
                port = port.isolated(true);
            }
            host.link_set_port(port.build(), &format!("{name} bridge port flags"))
                .map_err(netlink_err)?;
        }
        Ok(veth)
    }

    fn routes(&self, allocations: &[Allocation]) -> Vec<Route> {
        let gateway_for = |dst: &IpNet| {
            allocations
                .iter()
                .find(|a| a.address.addr().is_ipv4() == dst.addr().is_ipv4())
                .and_then(|a| a.gateway)
        };
        let mut routes: Vec<Route> = self
            .conf
            .ipam
            .routes
            .iter()
            .map(|r| Route {
                dst: r.dst,
                gw: r.gw.or_else(|| gateway_for(&r.dst)),
            })
            .collect();
        if self.conf.is_default_gateway {
            for a in allocations {
                let dst: IpNet = if a.address.addr().is_ipv4() {
                    "0.0.0.0/0"
                } else {
                    "::/0"
                }
                .parse()
                .expect("literal");
                if a.gateway.is_some() && !routes.iter().any(|r| r.dst == dst) {
                    routes.push(Route { dst, gw: a.gateway });
                }
            }
        }
        routes
    }

    fn host_sysctls(&self, allocations: &[Allocation]) -> CniResult<()> {
        let set = |k: &str| sysctl::ensure(k, "1").map_err(|e| io_err(&format!("set {k}"), e));
        if allocations.iter().any(|a| a.address.addr().is_ipv4()) {
            set("net.ipv4.ip_forward")?;
        }
        if allocations.iter().any(|a| a.address.addr().is_ipv6()) {
            set("net.ipv6.conf.all.forwarding")?;
        }
        // Needed so that Service traffic between two pods on this bridge is seen by netfilter.
        for key in [
            "net.bridge.bridge-nf-call-iptables",
            "net.bridge.bridge-nf-call-ip6tables",
        ] {
            if let Err(e) = sysctl::ensure(key, "1") {
                eprintln!("weir-cni: warning: cannot set {key} (is br_netfilter loaded?): {e}");
            }
        }
        Ok(())
    }

    /// Removes the host veth (its peer goes with it) and the masquerade elements. Idempotent.
    pub fn teardown(&self, ips: &[IpAddr], store: &Store) -> CniResult<()> {
        let mut host = Rtnl::new().map_err(|e| io_err("netlink socket", e))?;
        if let Some(veth) = self.find_host_veth(&mut host)? {
            match host.link_del(veth.index, &veth.name) {
                Err(e) if !e.is_not_found() => return Err(netlink_err(e)),
                _ => {}
            }
        }
        if self.conf.ip_masq {
            self.masq(store).forget(ips, || store_addresses(store))?;
        }
        Ok(())
    }

    /// DEL disconnects the pod at once and removes its interface a moment later.
    ///
    /// Deleting a veth costs the kernel ~20 ms (RCU grace periods under the rtnl lock), which the
    /// runtime would otherwise wait for on every pod teardown. Setting the host end down takes 2 ms
    /// and stops all traffic, so the address can be released immediately; a detached child then
    /// deletes the link by index (never a newer link that reuses the name). If that child never
    /// runs to the end, GC removes any `weir…` veth that no allocation accounts for.
    pub fn del(&self, store: &Store) -> CniResult<()> {
        let ips = store
            .lookup(self.container_id, self.ifname)
            .map_err(ipam_err)?;
        let mut host = Rtnl::new().map_err(|e| io_err("netlink socket", e))?;
        let veth = self.find_host_veth(&mut host)?;
        if let Some(veth) = &veth {
            let down = LinkUnspec::new_with_index(veth.index).down().build();
            match host.link_set(down, &veth.name) {
                Err(e) if !e.is_not_found() => return Err(netlink_err(e)),
                _ => {}
            }
        }
        if self.conf.ip_masq {
            self.masq(store).forget(&ips, || store_addresses(store))?;
        }
        store
            .release(self.container_id, self.ifname)
            .map_err(ipam_err)?;
        if let Some(veth) = veth {
            delete_link_in_background(host, veth.index);
        }
        Ok(())
    }

    /// Verifies that what ADD made (as described by `prev`) is still in place.
    pub fn check(
        &self,
        netns_path: &std::path::Path,
        store: &Store,
        prev: &Outcome,
    ) -> CniResult<()> {
        let fail = |m: String| Err(CniError::new(ErrorCode::CheckFailed, m));
        let netns = open_netns(netns_path)?;
        let mut host = Rtnl::new().map_err(|e| io_err("netlink socket", e))?;
        let mut pod =
            Rtnl::in_netns(&netns).map_err(|e| io_err("netlink socket in pod namespace", e))?;

        let Some(bridge) = host.link_by_name(&self.conf.bridge).map_err(netlink_err)? else {
            return fail(format!("bridge {} is missing", self.conf.bridge));
        };
        let Some(veth) = self.find_host_veth(&mut host)? else {
            return fail(format!("host interface {} is missing", self.host_veth()));
        };
        let veth_name = veth.name.clone();
        if veth.controller != Some(bridge.index) {
            return fail(format!(
                "{veth_name} is not a port of bridge {}",
                self.conf.bridge
            ));
        }
        if !veth.up {
            return fail(format!("{veth_name} is down"));
        }
        let Some(pod_if) = pod.link_by_name(self.ifname).map_err(netlink_err)? else {
            return fail(format!(
                "interface {} is missing in {}",
                self.ifname,
                netns_path.display()
            ));
        };
        if let Some(expected) = prev
            .interfaces
            .iter()
            .find(|i| i.name == self.ifname && !i.sandbox.is_empty())
        {
            if !expected.mac.is_empty() && !expected.mac.eq_ignore_ascii_case(&pod_if.mac_string())
            {
                return fail(format!(
                    "{} has MAC {}, prevResult says {}",
                    self.ifname,
                    pod_if.mac_string(),
                    expected.mac
                ));
            }
        }
        let present = pod.addrs(Some(pod_if.index)).map_err(netlink_err)?;
        let allocated = store
            .lookup(self.container_id, self.ifname)
            .map_err(ipam_err)?;
        let pod_if_index = prev
            .interfaces
            .iter()
            .position(|i| i.name == self.ifname && !i.sandbox.is_empty());
        for ip in prev
            .ips
            .iter()
            .filter(|ip| ip.interface.is_none() || ip.interface == pod_if_index)
        {
            if !present.iter().any(|a| a.net == ip.address) {
                return fail(format!("{} lacks address {}", self.ifname, ip.address));
            }
            if !allocated.contains(&ip.address.addr()) {
                return fail(format!(
                    "address {} is not allocated to this container",
                    ip.address.addr()
                ));
            }
            if self.conf.ip_masq && !self.masq(store).is_masqueraded(&ip.address.addr()) {
                return fail(format!(
                    "address {} is not in the masquerade set",
                    ip.address.addr()
                ));
            }
        }
        let mut kernel_routes = pod.routes(AddressFamily::Inet).map_err(netlink_err)?;
        kernel_routes.extend(pod.routes(AddressFamily::Inet6).map_err(netlink_err)?);
        for r in &prev.routes {
            if !route_present(&kernel_routes, r) {
                return fail(format!("route to {} is missing in the pod", r.dst));
            }
        }
        Ok(())
    }
}

/// Forks a child that deletes link `index` and exits; the caller returns without waiting.
fn delete_link_in_background(mut host: Rtnl, index: u32) {
    use nix::unistd::{fork, ForkResult};
    // SAFETY: the plugin is single-threaded, so the child may do anything the parent could.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            // Let go of the runtime's pipes so it does not wait for us.
            if let Ok(null) = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                use std::os::fd::AsRawFd;
                for fd in 0..3 {
                    unsafe { libc::dup2(null.as_raw_fd(), fd) };
                }
            }
            let _ = host.link_del(index, "pod veth");
            unsafe { libc::_exit(0) };
        }
        Ok(ForkResult::Parent { .. }) => {}
        // Cannot fork: do it ourselves.
        Err(_) => {
            let _ = host.link_del(index, "pod veth");
        }
    }
}

/// Every address the store holds (the masquerade rebuild's source of truth). A store that cannot
/// be read yields none: the rebuild then covers at least the pods of the running command.
fn store_addresses(store: &Store) -> Vec<IpAddr> {
    store
        .allocations()
        .map(|all| all.into_iter().map(|(ip, _, _)| ip).collect())
        .unwrap_or_default()
}

/// Host veths of `network` that no live allocation accounts for (a DEL's background delete that
/// never finished, or anything else that lost its owner). Only what is provably this network's:
/// its alias; or, made by a release before aliases, no alias at all, a port of this network's
/// bridge, and down (as DEL leaves a veth it could not finish deleting). Another network's veths,
/// and anything not named like ours, are never touched.
pub fn orphan_veths(
    host: &mut Rtnl,
    network: &str,
    bridge: &str,
    live: &[(String, String)],
) -> CniResult<Vec<Link>> {
    let owned: Vec<String> = live
        .iter()
        .flat_map(|(id, ifname)| {
            [
                host_veth_name(network, id, ifname),
                legacy_host_veth_name(id, ifname),
            ]
        })
        .collect();
    let links = host.links().map_err(netlink_err)?;
    let bridge_index = links.iter().find(|l| l.name == bridge).map(|l| l.index);
    let alias = owner_alias(network);
    Ok(links
        .into_iter()
        .filter(|l| {
            let ours = match l.alias.as_deref() {
                Some(a) => a == alias,
                None => bridge_index.is_some() && l.controller == bridge_index && !l.up,
            };
            l.kind.as_deref() == Some("veth")
                && is_weir_veth_name(&l.name)
                && ours
                && !owned.contains(&l.name)
        })
        .collect())
}

fn is_weir_veth_name(name: &str) -> bool {
    name.len() == 15 && name.starts_with("weir") && name[4..].chars().all(|c| c.is_ascii_hexdigit())
}

fn route_present(kernel: &[KernelRoute], r: &Route) -> bool {
    let is_default = r.dst.prefix_len() == 0;
    kernel.iter().any(|k| {
        let dst_ok = match k.destination {
            None => {
                is_default
                    && k.gateway
                        .is_some_and(|g| g.is_ipv4() == r.dst.addr().is_ipv4())
            }
            Some(d) => d == r.dst,
        };
        dst_ok && (r.gw.is_none() || k.gateway == r.gw)
    })
}

fn route_message(r: &Route, oif: u32) -> RouteMessage {
    match (r.dst, r.gw) {
        (IpNet::V4(dst), gw) => {
            let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(dst.addr(), dst.prefix_len())
                .output_interface(oif);
            if let Some(IpAddr::V4(g)) = gw {
                b = b.gateway(g);
            }
            b.build()
        }
        (IpNet::V6(dst), gw) => {
            let mut b = RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(dst.addr(), dst.prefix_len())
                .output_interface(oif);
            if let Some(IpAddr::V6(g)) = gw {
                b = b.gateway(g);
            }
            b.build()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_veth_names_are_stable_short_and_distinct() {
        let a = host_veth_name("net", "abc", "eth0");
        assert_eq!(a, host_veth_name("net", "abc", "eth0"));
        assert_eq!(a.len(), 15);
        assert!(is_weir_veth_name(&a));
        assert_ne!(a, host_veth_name("net", "abc", "eth1"));
        assert_ne!(a, host_veth_name("net", "abd", "eth0"));
        assert_ne!(a, host_veth_name("other", "abc", "eth0"));
        assert_ne!(a, legacy_host_veth_name("abc", "eth0"));
        assert!(is_weir_veth_name(&legacy_host_veth_name("abc", "eth0")));
    }

    /// Literals, computed once (`printf '%s' abc/eth0 | sha256sum`): veths made by a released
    /// weir-cni carry these names, and DEL must still find them after an upgrade, so the names
    /// must not change with the code that makes them.
    #[test]
    fn host_veth_names_are_the_released_ones() {
        assert_eq!(legacy_host_veth_name("abc", "eth0"), "weir538f587a236");
        assert_eq!(host_veth_name("net", "abc", "eth0"), "weir04d0239dcdc");
    }

    #[test]
    fn owner_alias_fits_the_kernel_limit() {
        assert_eq!(owner_alias("kt"), "weir-cni/kt");
        let long = owner_alias(&"n".repeat(255));
        assert!(long.len() <= 255 && long.starts_with("weir-cni/sha256:"));
        // a literal (`printf 'n%.0s' $(seq 255) | sha256sum`): the alias on released veths
        assert_eq!(
            long,
            "weir-cni/sha256:3bb555e4ed3e8c6e1818a52c8917ddaa25e9333eeb43a22a9890047c3ded92cc"
        );
        assert_ne!(owner_alias(&"n".repeat(255)), owner_alias(&"m".repeat(255)));
    }

    #[test]
    fn bridge_macs_are_unicast_and_locally_administered() {
        for _ in 0..32 {
            let mac = random_bridge_mac();
            assert_eq!(mac.len(), 6);
            assert_eq!(mac[0] & 0x03, 0x02, "{mac:02x?}");
        }
    }
}
