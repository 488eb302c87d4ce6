//! `mode: "bridge"` (the default): pods on a Linux bridge with host-local-compatible IPAM.
//!
//! `datapath` builds, checks and removes one attachment; this module is the mode as the plugin
//! sees it ([`BridgeMode`], a [`Mode`]): its configuration, GC across the network's attachments,
//! and STATUS.

pub mod datapath;

use std::net::IpAddr;
use std::path::Path;

use crate::config::NetConf;
use crate::ipam::{IpamConf, Store};
use crate::mode::{ipam_err, AttachmentId, CommonConf, Mode};
use crate::spec::{CniError, CniResult, Command, Env, ErrorCode, Outcome};
use datapath::Attachment;
pub use datapath::{host_veth_name, legacy_host_veth_name, owner_alias};

/// A bridge network, as its configuration describes it.
pub struct BridgeMode {
    conf: NetConf,
}

impl BridgeMode {
    /// Parses the configuration. An ADD also reads what only ADD uses — the runtime's requested
    /// addresses and MAC, and the overlay's MTU file — so that a bad one never blocks a DEL.
    pub fn parse(stdin: &[u8], env: &Env) -> CniResult<Self> {
        let mut conf = NetConf::parse(stdin)?;
        if env.command == Command::Add {
            conf.read_requests(&env.args)?;
            conf.resolve_mtu()?;
        }
        Ok(Self { conf })
    }

    fn store(&self) -> CniResult<Store> {
        Store::open(&self.conf.ipam, &self.conf.name).map_err(ipam_err)
    }

    fn attachment<'a>(&'a self, id: AttachmentId<'a>) -> Attachment<'a> {
        Attachment {
            conf: &self.conf,
            container_id: id.container_id,
            ifname: id.ifname,
        }
    }
}

impl Mode for BridgeMode {
    fn common(&self) -> CommonConf<'_> {
        CommonConf {
            cni_version: &self.conf.cni_version,
            prev_result: self.conf.prev_result.as_ref(),
            valid_attachments: self.conf.valid_attachments.as_deref(),
            disable_check: self.conf.disable_check,
            disable_gc: self.conf.disable_gc,
        }
    }

    fn add(&self, id: AttachmentId<'_>, netns: &Path) -> CniResult<Outcome> {
        let store = self.store()?;
        self.attachment(id).add(netns, &store)
    }

    fn del(&self, id: AttachmentId<'_>) -> CniResult<()> {
        let store = self.store()?;
        self.attachment(id).del(&store)
    }

    fn check(&self, id: AttachmentId<'_>, netns: &Path, prev: &Outcome) -> CniResult<()> {
        let store = self.store()?;
        self.attachment(id).check(netns, &store, prev)
    }

    fn gc(&self, valid: &[(String, String)]) -> CniResult<()> {
        gc(&self.conf, valid)
    }

    fn status(&self) -> CniResult<()> {
        status(&self.conf)
    }
}

/// Tears down every attachment this network's store knows that is not in `valid`, releases its
/// addresses, removes this network's orphaned veths and resyncs its masquerade sets. Nothing of
/// another network is touched: its allocations live in another store, its veths carry its alias.
fn gc(conf: &NetConf, valid: &[(String, String)]) -> CniResult<()> {
    let store = Store::open(&conf.ipam, &conf.name)
        .map_err(ipam_err)?
        .keeping(valid);
    let mut stale: Vec<(String, String)> = store
        .allocations()
        .map_err(ipam_err)?
        .into_iter()
        .map(|(_, id, ifname)| (id, ifname))
        .filter(|a| !valid.contains(a))
        .collect();
    stale.sort();
    stale.dedup();
    for (id, ifname) in &stale {
        // IDs recorded by older runtimes may not pass today's validation: never build names from them.
        if crate::spec::validate_container_id(id).is_ok()
            && crate::spec::validate_ifname(ifname).is_ok()
        {
            let ips = store.lookup(id, ifname).map_err(ipam_err)?;
            Attachment {
                conf,
                container_id: id,
                ifname,
            }
            .teardown(&ips, &store)?;
        }
    }
    store.gc(valid).map_err(ipam_err)?;
    let live: Vec<(String, String)> = store
        .allocations()
        .map_err(ipam_err)?
        .into_iter()
        .map(|(_, id, ifname)| (id, ifname))
        .collect();
    let mut host = weir_kernel::Rtnl::new()
        .map_err(|e| CniError::new(ErrorCode::Io, format!("netlink socket: {e}")))?;
    for orphan in datapath::orphan_veths(&mut host, &conf.name, &conf.bridge, &live)? {
        match host.link_del(orphan.index, &orphan.name) {
            Err(e) if !e.is_not_found() => {
                return Err(CniError::new(ErrorCode::Netlink, e.to_string()))
            }
            _ => {}
        }
    }
    if conf.ip_masq {
        // GC doubles as the resync of this network's masquerade objects (rebuilt from the store).
        let live_ips: Vec<IpAddr> = store
            .allocations()
            .map_err(ipam_err)?
            .into_iter()
            .map(|(ip, _, _)| ip)
            .collect();
        crate::masq::NetMasq {
            scope: crate::masq::Scope::for_network(&conf.name),
            direct: conf.masquerade_exempt(),
            stamp: store.dir().join(datapath::MASQ_STAMP),
        }
        .resync(&live_ips)?;
    }
    Ok(())
}

/// Can the plugin serve ADDs? The store must be writable and, with ipMasq, nft must be present.
fn status(conf: &NetConf) -> CniResult<()> {
    let unavailable = |m: String| CniError::new(ErrorCode::NotAvailable, m);
    let store =
        Store::open(&conf.ipam, &conf.name).map_err(|e| unavailable(format!("IPAM store: {e}")))?;
    store
        .check_writable()
        .map_err(|e| unavailable(format!("IPAM store is not writable: {e}")))?;
    let allocated: Vec<IpAddr> = store
        .allocations()
        .map_err(|e| unavailable(format!("IPAM store cannot be read: {e}")))?
        .into_iter()
        .map(|(ip, _, _)| ip)
        .collect();
    if let Some((set, ranges)) = exhausted_range_set(&conf.ipam, &allocated) {
        return Err(unavailable(format!(
            "no free address: range set {set} ({ranges}) is fully allocated"
        )));
    }
    if conf.ip_masq {
        let nft = std::process::Command::new("nft").arg("--version").output();
        if !nft.is_ok_and(|o| o.status.success()) {
            return Err(unavailable(
                "ipMasq is on but the nft command is not available".into(),
            ));
        }
    }
    Ok(())
}

/// The first range set with no free address (ADD needs one from every set), with its ranges.
/// Free means inside a range, not its gateway, not `reserved`, not allocated.
fn exhausted_range_set(ipam: &IpamConf, allocated: &[IpAddr]) -> Option<(usize, String)> {
    use std::collections::HashSet;
    fn num(ip: IpAddr) -> u128 {
        match ip {
            IpAddr::V4(a) => u32::from(a).into(),
            IpAddr::V6(a) => a.into(),
        }
    }
    let taken: HashSet<IpAddr> = allocated.iter().copied().collect();
    for (i, set) in ipam.range_sets().iter().enumerate() {
        let mut free = false;
        for r in set {
            let (start, end) = (r.effective_start(), r.effective_end());
            let same_family = |ip: &IpAddr| ip.is_ipv4() == start.is_ipv4();
            let inside =
                |ip: &IpAddr| same_family(ip) && (num(start)..=num(end)).contains(&num(*ip));
            let mut unusable: HashSet<IpAddr> = taken.iter().copied().filter(inside).collect();
            unusable.extend(ipam.reserved.iter().copied().filter(inside));
            let gw = r.effective_gateway();
            if inside(&gw) {
                unusable.insert(gw);
            }
            let size = num(end).saturating_sub(num(start)).saturating_add(1);
            if size > unusable.len() as u128 {
                free = true;
                break;
            }
        }
        if !free {
            let ranges = set
                .iter()
                .map(|r| format!("{}-{}", r.effective_start(), r.effective_end()))
                .collect::<Vec<_>>()
                .join(", ");
            return Some((i, ranges));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipam(ranges: &str, reserved: &str) -> IpamConf {
        let conf = format!(
            r#"{{"cniVersion":"1.1.0","name":"n","type":"weir-cni",
                "ipam":{{"type":"weir-ipam","ranges":{ranges}{reserved}}}}}"#
        );
        NetConf::parse(conf.as_bytes()).unwrap().ipam
    }

    #[test]
    fn a_full_range_set_is_reported_and_a_free_one_is_not() {
        // a /30: .1 is the gateway, .2 the only usable address
        let small = ipam(r#"[[{"subnet":"10.9.0.0/30"}]]"#, "");
        assert_eq!(exhausted_range_set(&small, &[]), None);
        let (set, ranges) = exhausted_range_set(&small, &["10.9.0.2".parse().unwrap()]).unwrap();
        assert_eq!(set, 0);
        assert!(ranges.contains("10.9.0.2"), "{ranges}");
        // allocations outside the set do not count
        assert_eq!(
            exhausted_range_set(&small, &["10.9.1.2".parse().unwrap()]),
            None
        );
        // a second range in the set still has room
        let two = ipam(
            r#"[[{"subnet":"10.9.0.0/30"},{"subnet":"10.9.1.0/30"}]]"#,
            "",
        );
        assert_eq!(
            exhausted_range_set(&two, &["10.9.0.2".parse().unwrap()]),
            None
        );
        // reserved addresses are not free
        let v6 = ipam(
            r#"[[{"subnet":"10.9.0.0/24"}],[{"subnet":"fd00::/126"}]]"#,
            r#","reserved":["fd00::2"]"#,
        );
        let got = exhausted_range_set(&v6, &["fd00::3".parse().unwrap()]);
        assert_eq!(got.map(|g| g.0), Some(1));
    }
}
