//! `mode: "eni-shared"`: pods on an addressless secondary cloud ENI, each with a /32 of the ENI's
//! addresses, a veth pair, a host route and two policy rules, with every Service path symmetric
//! under strict `rp_filter=1` (docs/eni.md explains the failure this prevents and why the fix is
//! built this way).
//!
//! `config` is the mode's configuration, `addresses` where the ENI's addresses come from, `plan`
//! the kernel state as data and `datapath` its application. This module is the mode as the plugin
//! sees it ([`EniSharedMode`], a [`Mode`]): ADD, DEL, CHECK, GC and STATUS with bridge mode's error
//! codes and crash safety. Addresses live in the
//! same store layout as bridge mode's IPAM (file per address under a lock, reboot-reconciled), and
//! everything a pod gets is derivable from (network, container ID, ifname) and its address, so DEL
//! and GC clean up after a killed ADD without any other saved state. (DEL leaves the veth's
//! deletion to a detached child and a tombstone file beside the store until it is done.)

pub mod addresses;
pub mod config;
pub mod datapath;
pub mod nft_probe;
pub mod plan;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use weir_kernel::{Link, Rtnl};

use crate::ipam::Store;
use crate::mode::{ipam_err, open_netns, AttachmentId, CommonConf, Mode};
use crate::result::ResultBuilder;
use crate::spec::{CniError, CniResult, ErrorCode, Outcome, Route};
use addresses::{plan_addresses, source_for, AddressPlan};
use config::EniConf;
use datapath as dp;
use plan::{RuleSpec, Selector, MAIN_TABLE, POD_GATEWAY};

/// Beside the address files: what this network's node-wide state was last set up from.
const NODE_STAMP: &str = "weir-eni-node";
/// Beside the address files: `<prefix><veth>` names a veth a DEL set down and left to a
/// detached child to delete (the child removes the file; GC finishes what it did not).
const TOMBSTONE_PREFIX: &str = "weir-eni-deleting.";

/// An eni-shared network, as its configuration describes it.
pub struct EniSharedMode {
    conf: EniConf,
}

impl EniSharedMode {
    pub fn parse(stdin: &[u8]) -> CniResult<Self> {
        Ok(Self {
            conf: EniConf::parse(stdin)?,
        })
    }

    fn pod<'a>(&'a self, id: AttachmentId<'a>) -> Pod<'a> {
        Pod {
            conf: &self.conf,
            container_id: id.container_id,
            ifname: id.ifname,
        }
    }
}

impl Mode for EniSharedMode {
    /// eni-shared knows no `disableCheck`/`disableGC` (they are unsupported keys, code 2).
    fn common(&self) -> CommonConf<'_> {
        CommonConf {
            cni_version: &self.conf.cni_version,
            prev_result: self.conf.prev_result.as_ref(),
            valid_attachments: self.conf.valid_attachments.as_deref(),
            disable_check: false,
            disable_gc: false,
        }
    }

    fn add(&self, id: AttachmentId<'_>, netns: &Path) -> CniResult<Outcome> {
        self.pod(id).add(netns)
    }

    fn del(&self, id: AttachmentId<'_>) -> CniResult<()> {
        self.pod(id).del()
    }

    fn check(&self, id: AttachmentId<'_>, netns: &Path, prev: &Outcome) -> CniResult<()> {
        self.pod(id).check(netns, prev)
    }

    fn gc(&self, valid: &[(String, String)]) -> CniResult<()> {
        gc(&self.conf, valid)
    }

    fn status(&self) -> CniResult<()> {
        status(&self.conf)
    }
}

fn store(conf: &EniConf) -> CniResult<Store> {
    Store::open_in(&conf.data_dir, &conf.name).map_err(ipam_err)
}

fn invalid(m: String) -> CniError {
    CniError::new(ErrorCode::InvalidConfig, m)
}

/// Reads the ENI's addresses (an unreadable source is an I/O error: nothing is allocated).
fn address_plan(conf: &EniConf) -> CniResult<AddressPlan> {
    let listed = source_for(&conf.addresses)
        .addresses()
        .map_err(|m| CniError::new(ErrorCode::Io, m))?;
    plan_addresses(&listed, conf.eni_address).map_err(invalid)
}

/// The per-node part, idempotent and safe to run concurrently: the ENI up with its own address,
/// the ENI table's default route, the fwmark rule, sysctls and the connmark table. Netlink state is
/// ensured on every ADD (cheap); the nft transaction runs when the stamp beside the store says the
/// node was set up differently (or before this boot), or the network's chain is gone.
fn setup_node(conf: &EniConf, host: &mut Rtnl, store_dir: &Path) -> CniResult<(Link, AddressPlan)> {
    let addrs = address_plan(conf)?;
    let eni = dp::resolve_eni(host, &conf.eni)?;
    if eni.name.starts_with(&conf.veth_prefix) {
        return Err(invalid(format!(
            "vethPrefix {:?}: the ENI {} starts with it, so it would be taken for a pod interface",
            conf.veth_prefix, eni.name
        )));
    }
    if !eni.up {
        host.link_up(eni.index, &eni.name)
            .map_err(dp::netlink_err)?;
    }
    dp::ensure_eni_address(host, &eni, addrs.eni_address)?;
    dp::ensure_table_route(host, conf, &eni)?;
    dp::ensure_rule(host, &plan::fwmark_rule(conf))?;
    dp::node_sysctls()?;
    let stamp = plan::node_stamp(conf, &eni.name, addrs.eni_address, &dp::boot_id());
    let stamp_path = store_dir.join(NODE_STAMP);
    let current = std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp)
        && dp::nft_chain_present(&conf.name);
    if !current {
        crate::masq::nft_transaction(
            &plan::node_nft_script(conf, &eni.name),
            "the eni-shared connmark table",
        )?;
        dp::write_stamp(&stamp_path, &stamp);
    }
    Ok((eni, addrs))
}

/// One attachment: (network, container ID, ifname).
struct Pod<'a> {
    conf: &'a EniConf,
    container_id: &'a str,
    ifname: &'a str,
}

impl Pod<'_> {
    fn host_veth(&self) -> String {
        plan::host_veth_name(
            &self.conf.veth_prefix,
            &self.conf.name,
            self.container_id,
            self.ifname,
        )
    }

    fn add(&self, netns_path: &Path) -> CniResult<Outcome> {
        let netns = open_netns(netns_path)?;
        let store = store(self.conf)?;
        std::fs::create_dir_all(store.dir())
            .map_err(|e| dp::io_err(&format!("create {}", store.dir().display()), e))?;
        let mut host = Rtnl::new().map_err(|e| dp::io_err("netlink socket", e))?;
        let (_eni, addrs) = setup_node(self.conf, &mut host, store.dir())?;
        let existed = !store
            .lookup(self.container_id, self.ifname)
            .map_err(ipam_err)?
            .is_empty();
        let pool: Vec<IpAddr> = addrs.pod_pool.iter().map(|ip| IpAddr::V4(*ip)).collect();
        let ip = store
            .allocate_from_list(&pool, self.container_id, self.ifname)
            .map_err(ipam_err)?;
        let result = match ip {
            IpAddr::V4(ip) => self.build(&mut host, &netns, netns_path, ip),
            IpAddr::V6(ip) => Err(invalid(format!(
                "the store holds IPv6 address {ip} for this attachment; eni-shared is IPv4 only"
            ))),
        };
        result.inspect_err(|_| {
            // Undo what this ADD made; an attachment that existed before is left to its DEL.
            if !existed {
                if let IpAddr::V4(ip) = ip {
                    let _ = self.teardown(&mut host, &[ip]);
                }
                let _ = store.release(self.container_id, self.ifname);
            }
        })
    }

    fn build(
        &self,
        host: &mut Rtnl,
        netns: &weir_kernel::NetNs,
        netns_path: &Path,
        ip: Ipv4Addr,
    ) -> CniResult<Outcome> {
        let mut pod =
            Rtnl::in_netns(netns).map_err(|e| dp::io_err("netlink socket in pod namespace", e))?;
        let name = self.host_veth();
        let mtu = self.conf.mtu.unwrap_or(1500);
        let veth = dp::create_veth(host, &mut pod, netns, &name, self.ifname, mtu)?;
        dp::host_veth_sysctls(&name)?;
        let pod_if = dp::configure_pod(&mut pod, self.ifname, ip)?;
        host.route_ensure(
            dp::host_route(&veth, ip),
            &format!("{ip} dev {name} scope link"),
        )
        .map_err(dp::netlink_err)?;
        for r in plan::pod_rules(self.conf, ip) {
            dp::ensure_rule(host, &r)?;
        }

        let address = ipnet::IpNet::V4(ipnet::Ipv4Net::new(ip, 32).expect("/32"));
        let gateway = IpAddr::V4(POD_GATEWAY);
        Ok(ResultBuilder::after(self.conf.prev_result.as_ref())?
            .host_interface(&veth)
            .pod_interface(self.ifname, &pod_if, netns_path)
            .ips([(address, Some(gateway))])
            .routes([Route {
                dst: "0.0.0.0/0".parse().expect("literal"),
                gw: Some(gateway),
            }])
            .dns(self.conf.dns.clone())
            .build())
    }

    /// Removes the host veth (its peer, the host route and the pod end go with it) and the pod's
    /// rules. Idempotent; tries every step and reports the first failure.
    fn teardown(&self, host: &mut Rtnl, ips: &[Ipv4Addr]) -> CniResult<()> {
        let mut first_err = host
            .link_del_by_name(&self.host_veth())
            .map(|_| ())
            .map_err(dp::netlink_err)
            .err();
        for ip in ips {
            for r in plan::pod_rules(self.conf, *ip) {
                if let Err(e) = dp::remove_rule(host, &r) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// DEL needs nothing but the configuration: not the pod's namespace, not the ENI, not the
    /// address source. The address comes from the store, or from prevResult when the store has
    /// already forgotten it (then only if no other attachment holds it now).
    fn del(&self) -> CniResult<()> {
        let store = store(self.conf)?;
        let mut ips: Vec<Ipv4Addr> = v4s(&store
            .lookup(self.container_id, self.ifname)
            .map_err(ipam_err)?);
        if ips.is_empty() {
            if let Some(prev) = &self.conf.prev_result {
                let held: Vec<IpAddr> = store
                    .allocations()
                    .map_err(ipam_err)?
                    .into_iter()
                    .map(|(ip, _, _)| ip)
                    .collect();
                ips = Outcome::from_value(prev)?
                    .ips
                    .iter()
                    .filter(|c| c.address.prefix_len() == 32)
                    .filter_map(|c| match c.address.addr() {
                        IpAddr::V4(ip) if !held.contains(&IpAddr::V4(ip)) => Some(ip),
                        _ => None,
                    })
                    .collect();
            }
        }
        let mut host = Rtnl::new().map_err(|e| dp::io_err("netlink socket", e))?;
        // Cut the pod off before releasing: a crash in between leaves the address owned, so a
        // retried DEL or a GC finishes the job instead of handing a half-cleaned address to a
        // new pod. Setting the host veth down takes ~2 ms and removes its host route with it;
        // deleting it costs the kernel ~20 ms, which the runtime need not wait for: a detached
        // child deletes it by index afterwards. A tombstone beside the store names the veth
        // until then, so GC can finish the job should that child never run to the end.
        let name = self.host_veth();
        let veth = dp::set_down(&mut host, &name)?;
        let tombstone = veth.map(|_| store.dir().join(format!("{TOMBSTONE_PREFIX}{name}")));
        if let Some(t) = &tombstone {
            std::fs::write(t, b"").map_err(|e| dp::io_err(&format!("write {}", t.display()), e))?;
        }
        let mut first_err = None;
        for ip in &ips {
            for r in plan::pod_rules(self.conf, *ip) {
                if let Err(e) = dp::remove_rule(&mut host, &r) {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        store
            .release(self.container_id, self.ifname)
            .map_err(ipam_err)?;
        if let (Some(index), Some(tombstone)) = (veth, tombstone) {
            dp::delete_link_in_background(host, index, &tombstone);
        }
        Ok(())
    }

    fn check(&self, netns_path: &Path, prev: &Outcome) -> CniResult<()> {
        let fail = |m: String| Err(CniError::new(ErrorCode::CheckFailed, m));
        let conf = self.conf;
        let netns = open_netns(netns_path)?;
        let store = store(conf)?;
        let held = v4s(&store
            .lookup(self.container_id, self.ifname)
            .map_err(ipam_err)?);
        let Some(&ip) = held.first() else {
            return fail(format!(
                "no address is allocated to {}/{} in network {}",
                self.container_id, self.ifname, conf.name
            ));
        };
        if !prev.ips.iter().any(|c| c.address.addr() == IpAddr::V4(ip)) {
            return fail(format!(
                "prevResult does not list the allocated address {ip}"
            ));
        }
        let mut host = Rtnl::new().map_err(|e| dp::io_err("netlink socket", e))?;
        let addrs = address_plan(conf)?;
        let eni = match dp::resolve_eni(&mut host, &conf.eni) {
            Ok(l) => l,
            Err(e) => return fail(e.msg),
        };
        if !eni.up {
            return fail(format!("ENI {} is down", eni.name));
        }
        if !dp::has_address(&mut host, eni.index, addrs.eni_address)? {
            return fail(format!(
                "ENI {} lacks its address {}/32 (masquerade out of the ENI would pick another interface's address)",
                eni.name, addrs.eni_address
            ));
        }
        if !dp::table_route_present(&mut host, conf, &eni)? {
            return fail(format!(
                "table {} has no default via {} dev {}",
                conf.route_table, conf.gateway, eni.name
            ));
        }
        let rules = dp::current_rules(&mut host)?;
        let mut wanted: Vec<RuleSpec> = plan::pod_rules(conf, ip).to_vec();
        wanted.push(plan::fwmark_rule(conf));
        for r in &wanted {
            if !rules.contains(r) {
                return fail(format!("policy rule missing: {r}"));
            }
        }
        if !dp::nft_chain_present(&conf.name) {
            return fail(format!(
                "nftables chain inet {} {} is missing",
                plan::NFT_TABLE,
                plan::chain_name(&conf.name)
            ));
        }
        let name = self.host_veth();
        let Some(veth) = host.link_by_name(&name).map_err(dp::netlink_err)? else {
            return fail(format!("host interface {name} is missing"));
        };
        if !veth.up {
            return fail(format!("{name} is down"));
        }
        if !dp::host_route_present(&mut host, &veth, ip)? {
            return fail(format!("host route {ip} dev {name} is missing"));
        }
        let mut pod =
            Rtnl::in_netns(&netns).map_err(|e| dp::io_err("netlink socket in pod namespace", e))?;
        let Some(pod_if) = pod.link_by_name(self.ifname).map_err(dp::netlink_err)? else {
            return fail(format!(
                "interface {} is missing in {}",
                self.ifname,
                netns_path.display()
            ));
        };
        if !dp::has_address(&mut pod, pod_if.index, ip)? {
            return fail(format!("{} in the pod lacks {ip}/32", self.ifname));
        }
        if !dp::pod_default_route_present(&mut pod, pod_if.index)? {
            return fail(format!("the pod has no default via {POD_GATEWAY}"));
        }
        Ok(())
    }
}

fn v4s(ips: &[IpAddr]) -> Vec<Ipv4Addr> {
    ips.iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(v4) => Some(*v4),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// Tears down every attachment of this network that is not in `cni.dev/valid-attachments`, then
/// removes this network's leftovers no allocation accounts for: pod rules in its table (or to an
/// address of its list), and veths whose host route points at one of its addresses. Other
/// networks' state is never touched: everything is matched by this network's table, addresses
/// and veth names.
fn gc(conf: &EniConf, valid: &[(String, String)]) -> CniResult<()> {
    let store = store(conf)?;
    let mut host = Rtnl::new().map_err(|e| dp::io_err("netlink socket", e))?;
    let mut first_err: Option<CniError> = None;
    let keep = |id: &str, ifname: &str| {
        valid
            .iter()
            .any(|(v, i)| v.trim() == id && (i == ifname || ifname.is_empty()))
    };
    for (ip, id, ifname) in store.allocations().map_err(ipam_err)? {
        if keep(&id, &ifname) {
            continue;
        }
        let IpAddr::V4(ip) = ip else { continue };
        // IDs recorded by older runtimes may not pass today's validation: then only the rules.
        let names_ok = crate::spec::validate_container_id(&id).is_ok()
            && crate::spec::validate_ifname(&ifname).is_ok();
        let pod = Pod {
            conf,
            container_id: &id,
            ifname: &ifname,
        };
        let res = if names_ok {
            pod.teardown(&mut host, &[ip])
        } else {
            plan::pod_rules(conf, ip)
                .iter()
                .try_for_each(|r| dp::remove_rule(&mut host, r))
        };
        if let Err(e) = res {
            first_err.get_or_insert(e);
        }
    }
    if let Some(e) = first_err {
        // Keep the addresses of attachments we could not tear down: the next GC retries.
        return Err(e);
    }
    store.gc(valid).map_err(ipam_err)?;

    let held: Vec<Ipv4Addr> = v4s(&store
        .allocations()
        .map_err(ipam_err)?
        .into_iter()
        .map(|(ip, _, _)| ip)
        .collect::<Vec<_>>());
    // The list is needed only to recognise `to <pod>` rules and veths; without it, skip those.
    let listed: Vec<Ipv4Addr> = source_for(&conf.addresses).addresses().unwrap_or_default();
    for r in dp::current_rules(&mut host)? {
        let orphan = match r.selector {
            Selector::From(ip) => {
                r.priority == conf.priorities.from_pod
                    && r.table == conf.route_table
                    && !held.contains(&ip)
            }
            Selector::To(ip) => {
                r.priority == conf.priorities.to_pod
                    && r.table == MAIN_TABLE
                    && listed.contains(&ip)
                    && !held.contains(&ip)
            }
            Selector::FwMark { .. } => false,
        };
        if orphan {
            dp::remove_rule(&mut host, &r)?;
        }
    }
    gc_tombstones(conf, &store, &mut host)?;
    let routes = host
        .routes(netlink_packet_route::AddressFamily::Inet)
        .map_err(dp::netlink_err)?;
    for link in host.links().map_err(dp::netlink_err)? {
        if link.kind.as_deref() != Some("veth")
            || link.name.len() != 15
            || !link.name.starts_with(&conf.veth_prefix)
        {
            continue;
        }
        let serves_orphan = routes.iter().any(|r| {
            r.table == MAIN_TABLE
                && r.oif == Some(link.index)
                && r.destination.is_some_and(|d| match d.addr() {
                    IpAddr::V4(ip) => {
                        d.prefix_len() == 32 && listed.contains(&ip) && !held.contains(&ip)
                    }
                    IpAddr::V6(_) => false,
                })
        });
        if serves_orphan {
            match host.link_del(link.index, &link.name) {
                Err(e) if !e.is_not_found() => return Err(dp::netlink_err(e)),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Deletes the veths DELs of this network set down and left to a child that did not finish
/// (named by tombstones beside the store), unless an attachment owns that name again.
fn gc_tombstones(conf: &EniConf, store: &Store, host: &mut Rtnl) -> CniResult<()> {
    let Ok(dir) = std::fs::read_dir(store.dir()) else {
        return Ok(());
    };
    let owned: Vec<String> = store
        .allocations()
        .map_err(ipam_err)?
        .iter()
        .map(|(_, id, ifname)| plan::host_veth_name(&conf.veth_prefix, &conf.name, id, ifname))
        .collect();
    for entry in dir.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let Some(name) = file.strip_prefix(TOMBSTONE_PREFIX) else {
            continue;
        };
        if !owned.iter().any(|o| o == name) {
            if let Some(link) = host.link_by_name(name).map_err(dp::netlink_err)? {
                if !link.up {
                    match host.link_del(link.index, name) {
                        Err(e) if !e.is_not_found() => return Err(dp::netlink_err(e)),
                        _ => {}
                    }
                }
            }
        }
        let _ = std::fs::remove_file(entry.path());
    }
    Ok(())
}

/// Can the plugin serve ADDs? The store must be writable, the address source readable with at
/// least one address for pods, the ENI present and nft runnable.
fn status(conf: &EniConf) -> CniResult<()> {
    let unavailable = |m: String| CniError::new(ErrorCode::NotAvailable, m);
    let store = store(conf).map_err(|e| unavailable(format!("IPAM store: {}", e.msg)))?;
    store
        .check_writable()
        .map_err(|e| unavailable(format!("IPAM store is not writable: {e}")))?;
    let addrs = address_plan(conf).map_err(|e| unavailable(e.msg))?;
    if addrs.pod_pool.is_empty() {
        return Err(unavailable(
            "the ENI has no addresses for pods besides its own".into(),
        ));
    }
    let mut host = Rtnl::new().map_err(|e| unavailable(format!("netlink socket: {e}")))?;
    dp::resolve_eni(&mut host, &conf.eni).map_err(|e| unavailable(e.msg))?;
    let nft = std::process::Command::new("nft").arg("--version").output();
    if !nft.is_ok_and(|o| o.status.success()) {
        return Err(unavailable(
            "the nft command is not available (the connmark table needs it)".into(),
        ));
    }
    Ok(())
}
