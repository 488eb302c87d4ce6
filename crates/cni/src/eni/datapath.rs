//! eni-shared mode's side effects: the per-node setup (ENI up with its own address, the ENI
//! table's default route, the fwmark rule, the connmark table, sysctls) and one pod's veth, host
//! route and rules. Shapes come from [`super::plan`].

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use ipnet::{IpNet, Ipv4Net};
use netlink_packet_route::address::{AddressAttribute, AddressFlags};
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth};
use netlink_packet_route::route::RouteScope;
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST};
use rtnetlink::{LinkUnspec, RouteMessageBuilder};
use weir_kernel::{sysctl, Link, NetNs, NlError, Rtnl};

use super::config::{EniConf, EniSelector};
use super::plan::{self, RuleSpec, Selector, MAIN_TABLE, POD_GATEWAY};
use crate::spec::{CniError, CniResult, ErrorCode};

pub fn netlink_err(e: NlError) -> CniError {
    CniError::new(ErrorCode::Netlink, e.to_string())
}

pub fn io_err(what: &str, e: std::io::Error) -> CniError {
    CniError::new(ErrorCode::Io, format!("{what}: {e}"))
}

/// Finds the ENI by name or MAC. A missing ENI is "try again later" (code 11): a node agent may
/// still be attaching it.
pub fn resolve_eni(host: &mut Rtnl, sel: &EniSelector) -> CniResult<Link> {
    let links = host.links().map_err(netlink_err)?;
    let found = match sel {
        EniSelector::Name(n) => links.into_iter().find(|l| &l.name == n),
        // VLANs, macvlans and bonds can share the NIC's MAC: prefer the device without a kind
        // (the NIC itself), never a bridge.
        EniSelector::Mac(mac) => links
            .into_iter()
            .filter(|l| l.mac == mac && l.kind.as_deref() != Some("bridge"))
            .min_by_key(|l| (l.kind.is_some(), l.index)),
    };
    found.ok_or_else(|| {
        let what = match sel {
            EniSelector::Name(n) => format!("eniName {n}"),
            EniSelector::Mac(m) => format!(
                "eniMAC {}",
                m.iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":")
            ),
        };
        CniError::new(
            ErrorCode::TryAgainLater,
            format!("{what}: no such interface on this node (not attached yet?)"),
        )
    })
}

/// The ENI's own address: /32 (no subnet route, so nothing in main changes) and noprefixroute.
/// Masquerade of a packet routed out of the ENI then picks this address, so the reply comes back
/// to the ENI and passes the reverse-path check and the cloud's source check.
pub fn ensure_eni_address(host: &mut Rtnl, eni: &Link, ip: Ipv4Addr) -> CniResult<()> {
    let mut msg = rtnetlink::AddressMessageBuilder::<Ipv4Addr>::new()
        .index(eni.index)
        .address(ip, 32)
        .build();
    msg.attributes
        .push(AddressAttribute::Flags(AddressFlags::Noprefixroute));
    let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    match host.request(
        RouteNetlinkMessage::NewAddress(msg),
        flags,
        &format!("add address {ip}/32 to ENI {}", eni.name),
    ) {
        Err(e) if !e.is_exists() => Err(netlink_err(e)),
        _ => Ok(()),
    }
}

pub fn has_address(host: &mut Rtnl, index: u32, ip: Ipv4Addr) -> CniResult<bool> {
    Ok(host
        .addrs(Some(index))
        .map_err(netlink_err)?
        .iter()
        .any(|a| a.net.addr() == IpAddr::V4(ip)))
}

/// `default via <gateway> dev <eni> onlink table <routeTable>`.
pub fn ensure_table_route(host: &mut Rtnl, conf: &EniConf, eni: &Link) -> CniResult<()> {
    let msg = RouteMessageBuilder::<Ipv4Addr>::new()
        .table_id(conf.route_table)
        .gateway(conf.gateway)
        .output_interface(eni.index)
        .onlink()
        .build();
    host.route_ensure(
        msg,
        &format!(
            "default via {} dev {} onlink table {}",
            conf.gateway, eni.name, conf.route_table
        ),
    )
    .map_err(netlink_err)
}

pub fn table_route_present(host: &mut Rtnl, conf: &EniConf, eni: &Link) -> CniResult<bool> {
    Ok(host
        .routes(AddressFamily::Inet)
        .map_err(netlink_err)?
        .iter()
        .any(|r| {
            r.table == conf.route_table
                && r.destination.is_none()
                && r.gateway == Some(IpAddr::V4(conf.gateway))
                && r.oif == Some(eni.index)
        }))
}

pub fn rule_message(r: &RuleSpec) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = AddressFamily::Inet;
    m.header.action = RuleAction::ToTable;
    // Tables above 255 only fit the attribute; the header then says RT_TABLE_UNSPEC (0).
    m.header.table = u8::try_from(r.table).unwrap_or(0);
    m.attributes.push(RuleAttribute::Table(r.table));
    m.attributes.push(RuleAttribute::Priority(r.priority));
    match r.selector {
        Selector::To(ip) => {
            m.header.dst_len = 32;
            m.attributes
                .push(RuleAttribute::Destination(IpAddr::V4(ip)));
        }
        Selector::From(ip) => {
            m.header.src_len = 32;
            m.attributes.push(RuleAttribute::Source(IpAddr::V4(ip)));
        }
        Selector::FwMark { mark, mask } => {
            m.attributes.push(RuleAttribute::FwMark(mark));
            m.attributes.push(RuleAttribute::FwMask(mask));
        }
    }
    m
}

/// Reads back a kernel rule in the shapes weir writes (others are None).
pub fn rule_spec(m: &RuleMessage) -> Option<RuleSpec> {
    if m.header.action != RuleAction::ToTable {
        return None;
    }
    let (mut priority, mut table) = (0, u32::from(m.header.table));
    let (mut src, mut dst, mut mark, mut mask) = (None, None, None, None);
    for a in &m.attributes {
        match a {
            RuleAttribute::Priority(p) => priority = *p,
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::Source(IpAddr::V4(ip)) if m.header.src_len == 32 => src = Some(*ip),
            RuleAttribute::Destination(IpAddr::V4(ip)) if m.header.dst_len == 32 => dst = Some(*ip),
            RuleAttribute::FwMark(v) => mark = Some(*v),
            RuleAttribute::FwMask(v) => mask = Some(*v),
            // iif/oif/uid/port selectors: not a rule weir wrote
            RuleAttribute::Iifname(_)
            | RuleAttribute::Oifname(_)
            | RuleAttribute::UidRange(_)
            | RuleAttribute::IpProtocol(_)
            | RuleAttribute::SourcePortRange(_)
            | RuleAttribute::DestinationPortRange(_) => return None,
            _ => {}
        }
    }
    let selector = match (src, dst, mark) {
        (Some(ip), None, None) => Selector::From(ip),
        (None, Some(ip), None) => Selector::To(ip),
        (None, None, Some(mark)) => Selector::FwMark {
            mark,
            mask: mask.unwrap_or(u32::MAX),
        },
        _ => return None,
    };
    Some(RuleSpec {
        priority,
        selector,
        table,
    })
}

pub fn current_rules(host: &mut Rtnl) -> CniResult<Vec<RuleSpec>> {
    Ok(host
        .rules(AddressFamily::Inet)
        .map_err(netlink_err)?
        .iter()
        .filter_map(rule_spec)
        .collect())
}

/// Adds `r` unless the kernel has it (it answers EEXIST for an identical rule).
pub fn ensure_rule(host: &mut Rtnl, r: &RuleSpec) -> CniResult<()> {
    match host.rule_add(rule_message(r), &r.to_string()) {
        Err(e) if !e.is_exists() => Err(netlink_err(e)),
        _ => Ok(()),
    }
}

/// Deletes `r`; a missing rule is success.
pub fn remove_rule(host: &mut Rtnl, r: &RuleSpec) -> CniResult<()> {
    match host.rule_del(rule_message(r), &r.to_string()) {
        Err(e) if !e.is_not_found() => Err(netlink_err(e)),
        _ => Ok(()),
    }
}

/// Node-wide sysctls. `src_valid_mark` is set on `all` (the kernel ORs `all` with the interface):
/// the marked requests may enter by any non-ENI interface, including ones created later. It does
/// not loosen the reverse-path check; it makes the check use the same mark the reply will carry.
///
/// `all.send_redirects` is cleared so that the per-veth 0 of [`host_veth_sysctls`] takes effect
/// (that one is ORed too); interfaces keep their own value, so eth0 still sends redirects.
pub fn node_sysctls() -> CniResult<()> {
    for (key, value) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv4.conf.all.src_valid_mark", "1"),
        ("net.ipv4.conf.all.send_redirects", "0"),
    ] {
        sysctl::ensure(key, value).map_err(|e| io_err(&format!("set {key}"), e))?;
    }
    Ok(())
}

/// Whether this network's chain exists in the node-wide table (every ADD and CHECK ask).
/// Asked over netlink; if netlink cannot answer, `nft` does.
pub fn nft_chain_present(network: &str) -> bool {
    let chain = plan::chain_name(network);
    if let Ok(present) = super::nft_probe::chain_exists(plan::NFT_TABLE, &chain) {
        return present;
    }
    std::process::Command::new("nft")
        .args(["list", "chain", "inet", plan::NFT_TABLE, &chain])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Sets link `name` down, returning its index (None when it does not exist). IPv4 removes the
/// routes through a link that goes down, so the pod's host route goes with it.
pub fn set_down(host: &mut Rtnl, name: &str) -> CniResult<Option<u32>> {
    let Some(link) = host.link_by_name(name).map_err(netlink_err)? else {
        return Ok(None);
    };
    let down = LinkUnspec::new_with_index(link.index).down().build();
    match host.link_set(down, name) {
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(netlink_err(e)),
        Ok(()) => Ok(Some(link.index)),
    }
}

/// Forks a child that deletes link `index`, then the tombstone naming it, and exits; the
/// caller returns without waiting (bridge mode's DEL does the same, without a tombstone).
pub fn delete_link_in_background(mut host: Rtnl, index: u32, tombstone: &Path) {
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
            if host.link_del(index, "pod veth").is_ok_or_gone() {
                let _ = std::fs::remove_file(tombstone);
            }
            unsafe { libc::_exit(0) };
        }
        Ok(ForkResult::Parent { .. }) => {}
        // Cannot fork: do it ourselves.
        Err(_) => {
            if host.link_del(index, "pod veth").is_ok_or_gone() {
                let _ = std::fs::remove_file(tombstone);
            }
        }
    }
}

trait OkOrGone {
    fn is_ok_or_gone(&self) -> bool;
}

impl OkOrGone for Result<(), NlError> {
    fn is_ok_or_gone(&self) -> bool {
        match self {
            Ok(()) => true,
            Err(e) => e.is_not_found(),
        }
    }
}

/// Creates the veth pair: host end `host_name` up, pod end `ifname` inside the pod namespace.
pub fn create_veth(
    host: &mut Rtnl,
    pod: &mut Rtnl,
    netns: &NetNs,
    host_name: &str,
    ifname: &str,
    mtu: u32,
) -> CniResult<Link> {
    use std::os::fd::AsRawFd;
    // A leftover from an ADD that was killed half-way: start clean.
    host.link_del_by_name(host_name).map_err(netlink_err)?;
    if let Some(stale) = pod.link_by_name(ifname).map_err(netlink_err)? {
        return Err(CniError::new(
            ErrorCode::InvalidConfig,
            format!(
                "interface {ifname} already exists in the pod namespace ({})",
                stale.kind.unwrap_or_default()
            ),
        ));
    }
    let peer = LinkUnspec::new_with_name(ifname)
        .mtu(mtu)
        .setns_by_fd(netns.file().as_raw_fd())
        .build();
    let msg = rtnetlink::LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
        .name(host_name.to_string())
        .mtu(mtu)
        .up()
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    host.link_add(msg, &format!("veth {host_name}"))
        .map_err(netlink_err)?;
    host.require_link(host_name).map_err(netlink_err)
}

/// The host veth answers the pod's ARP for [`POD_GATEWAY`] at once (proxy ARP without the
/// default 0.8 s random delay), and sends the pod no ICMP redirects: a pod reaching itself through
/// a Service (hairpin) is routed back out of the veth it came in on, and each redirect the kernel
/// sends for that spends the per-destination ICMP rate limit that kube-proxy's REJECT of a
/// Service without endpoints needs, turning "connection refused" into a timeout.
pub fn host_veth_sysctls(veth: &str) -> CniResult<()> {
    for (key, value) in [
        (format!("net.ipv4.conf.{veth}.proxy_arp"), "1"),
        (format!("net.ipv4.neigh.{veth}.proxy_delay"), "0"),
        (format!("net.ipv4.conf.{veth}.send_redirects"), "0"),
    ] {
        sysctl::ensure(&key, value).map_err(|e| io_err(&format!("set {key}"), e))?;
    }
    Ok(())
}

/// `<pod> dev <veth> scope link` in main.
pub fn host_route(veth: &Link, pod: Ipv4Addr) -> rtnetlink::packet_route::route::RouteMessage {
    RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(pod, 32)
        .output_interface(veth.index)
        .scope(RouteScope::Link)
        .build()
}

pub fn host_route_present(host: &mut Rtnl, veth: &Link, pod: Ipv4Addr) -> CniResult<bool> {
    let want = IpNet::V4(Ipv4Net::new(pod, 32).expect("/32"));
    Ok(host
        .routes(AddressFamily::Inet)
        .map_err(netlink_err)?
        .iter()
        .any(|r| r.table == MAIN_TABLE && r.destination == Some(want) && r.oif == Some(veth.index)))
}

/// Inside the pod: the /32, the link up, `169.254.1.1 dev <if> scope link`, `default via
/// 169.254.1.1`.
pub fn configure_pod(pod: &mut Rtnl, ifname: &str, ip: Ipv4Addr) -> CniResult<Link> {
    let link = pod.require_link(ifname).map_err(netlink_err)?;
    pod.addr_ensure(link.index, IpNet::V4(Ipv4Net::new(ip, 32).expect("/32")))
        .map_err(netlink_err)?;
    pod.link_up(link.index, ifname).map_err(netlink_err)?;
    let gw = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(POD_GATEWAY, 32)
        .output_interface(link.index)
        .scope(RouteScope::Link)
        .build();
    pod.route_ensure(gw, &format!("{POD_GATEWAY} dev {ifname} scope link"))
        .map_err(netlink_err)?;
    let default = RouteMessageBuilder::<Ipv4Addr>::new()
        .gateway(POD_GATEWAY)
        .output_interface(link.index)
        .build();
    pod.route_ensure(default, &format!("default via {POD_GATEWAY}"))
        .map_err(netlink_err)?;
    Ok(link)
}

pub fn pod_default_route_present(pod: &mut Rtnl, index: u32) -> CniResult<bool> {
    Ok(pod
        .routes(AddressFamily::Inet)
        .map_err(netlink_err)?
        .iter()
        .any(|r| {
            r.table == MAIN_TABLE
                && r.destination.is_none()
                && r.gateway == Some(IpAddr::V4(POD_GATEWAY))
                && r.oif == Some(index)
        }))
}

/// The boot id node stamps are tied to (a reboot re-runs node setup).
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Writes `content` to `path` atomically; failing only costs a redundant node setup next time.
pub fn write_stamp(path: &Path, content: &str) {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    if std::fs::write(&tmp, content).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_messages_read_back_as_the_same_spec() {
        let ip = Ipv4Addr::new(10, 12, 192, 44);
        for spec in [
            RuleSpec {
                priority: 512,
                selector: Selector::To(ip),
                table: MAIN_TABLE,
            },
            RuleSpec {
                priority: 1536,
                selector: Selector::From(ip),
                table: 1003,
            },
            RuleSpec {
                priority: 1024,
                selector: Selector::FwMark {
                    mark: 0x80,
                    mask: 0x80,
                },
                table: MAIN_TABLE,
            },
        ] {
            assert_eq!(rule_spec(&rule_message(&spec)), Some(spec));
        }
        // tables above 255 travel in the attribute only
        let big = RuleSpec {
            priority: 1536,
            selector: Selector::From(ip),
            table: 100_000,
        };
        let msg = rule_message(&big);
        assert_eq!(msg.header.table, 0);
        assert_eq!(rule_spec(&msg), Some(big));
        // a rule with an iif selector is not one of ours
        let mut foreign = rule_message(&big);
        foreign
            .attributes
            .push(RuleAttribute::Iifname("eth0".into()));
        assert_eq!(rule_spec(&foreign), None);
    }
}
