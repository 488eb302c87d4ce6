//! Masquerade of pod traffic that leaves the cluster, in an nftables table weir owns.
//!
//! Each network has its own sets and its own NAT base chain, so one network's `clusterCIDR` can
//! never change another's masquerade decision, and each network rewrites only its own objects.
//! An ADD or DEL changes only set elements, so the ruleset never grows with the number of pods:
//!
//! ```text
//! table inet weir-cni {
//!   set pods4_<net> { type ipv4_addr }                    # this network's pods
//!   set direct4_<net> { type ipv4_addr; flags interval }  # reached without NAT (its clusterCIDR)
//!   chain post_<net> { type nat hook postrouting priority srcnat
//!     ip saddr @pods4_<net> ip daddr != @direct4_<net> masquerade }
//!   (and the same for IPv6)
//! }
//! ```
//! `<net>` is the network name reduced to nft's identifier characters plus a hash of the full
//! name (see [`Scope`]). Every change is one `nft -f -` transaction, so it is atomic. The slow path
//! (first use, changed destinations, or a table someone deleted) re-declares this network's objects
//! and re-adds every pod the IPAM store holds, so existing pods are masqueraded again.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::spec::{CniError, CniResult, ErrorCode};

pub const TABLE: &str = "weir-cni";

/// Always reached directly: multicast.
const ALWAYS_DIRECT: [&str; 2] = ["224.0.0.0/4", "ff00::/8"];

/// The sets of the layout before networks were separated; a network's pods are moved out of them.
const LEGACY_POD_SETS: [&str; 2] = ["pods4", "pods6"];

/// The nft object names of one network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub pods4: String,
    pub pods6: String,
    pub direct4: String,
    pub direct6: String,
    pub chain: String,
}

impl Scope {
    /// Names for `network`: readable (its name's identifier characters, at most 24) and unique (a
    /// hash of the whole name, since reducing the name can map two networks to one string).
    pub fn for_network(network: &str) -> Self {
        let readable: String = network
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(24)
            .collect();
        let digest = Sha256::digest(network.as_bytes());
        let hash: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        let id = format!("{readable}_{hash}");
        Self {
            pods4: format!("pods4_{id}"),
            pods6: format!("pods6_{id}"),
            direct4: format!("direct4_{id}"),
            direct6: format!("direct6_{id}"),
            chain: format!("post_{id}"),
        }
    }

    fn pod_set(&self, ip: &IpAddr) -> &str {
        if ip.is_ipv4() {
            &self.pods4
        } else {
            &self.pods6
        }
    }

    /// Declares this network's objects (idempotent) and rewrites its chain and destination sets.
    fn declarations(&self, direct: &[IpNet]) -> String {
        let Scope {
            pods4,
            pods6,
            direct4,
            direct6,
            chain,
        } = self;
        let mut s = format!(
            "add table inet {TABLE}\n\
             add set inet {TABLE} {pods4} {{ type ipv4_addr; }}\n\
             add set inet {TABLE} {pods6} {{ type ipv6_addr; }}\n\
             add set inet {TABLE} {direct4} {{ type ipv4_addr; flags interval; auto-merge; }}\n\
             add set inet {TABLE} {direct6} {{ type ipv6_addr; flags interval; auto-merge; }}\n\
             add chain inet {TABLE} {chain} {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
             flush chain inet {TABLE} {chain}\n\
             add rule inet {TABLE} {chain} ip saddr @{pods4} ip daddr != @{direct4} masquerade\n\
             add rule inet {TABLE} {chain} ip6 saddr @{pods6} ip6 daddr != @{direct6} masquerade\n\
             flush set inet {TABLE} {direct4}\n\
             flush set inet {TABLE} {direct6}\n"
        );
        for net in direct_nets(direct) {
            let set = if net.contains(':') { direct6 } else { direct4 };
            s += &format!("add element inet {TABLE} {set} {{ {net} }}\n");
        }
        s
    }

    fn elements(&self, verb: &str, pods: &[IpAddr]) -> String {
        pods.iter()
            .map(|ip| {
                format!(
                    "{verb} element inet {TABLE} {} {{ {ip} }}\n",
                    self.pod_set(ip)
                )
            })
            .collect()
    }

    /// The script that (re)builds this network's objects with `pods` masqueraded.
    pub fn rebuild_script(&self, direct: &[IpNet], pods: &[IpAddr]) -> String {
        self.declarations(direct) + &self.elements("add", pods)
    }

    /// The rebuild, then `gone` removed. Adding before deleting makes the delete succeed whether or
    /// not the element existed, in one transaction: DEL must be idempotent, and Debian 12's nft has
    /// no `destroy`.
    pub fn rebuild_without_script(
        &self,
        direct: &[IpNet],
        live: &[IpAddr],
        gone: &[IpAddr],
    ) -> String {
        self.rebuild_script(direct, live)
            + &self.elements("add", gone)
            + &self.elements("delete", gone)
    }
}

fn direct_nets(direct: &[IpNet]) -> Vec<String> {
    let mut nets: Vec<String> = direct.iter().map(|n| n.trunc().to_string()).collect();
    nets.extend(ALWAYS_DIRECT.iter().map(|s| s.to_string()));
    nets
}

/// One network's masquerade: its nft names, the destinations exempt from NAT, and the stamp file
/// (beside the IPAM store) recording which destinations its objects were last built with.
pub struct NetMasq {
    pub scope: Scope,
    pub direct: Vec<IpNet>,
    pub stamp: PathBuf,
}

impl NetMasq {
    fn wanted_stamp(&self) -> String {
        format!(
            "{}\n{}",
            self.scope.chain,
            direct_nets(&self.direct).join(",")
        )
    }

    fn stamp_is_current(&self) -> bool {
        std::fs::read_to_string(&self.stamp).is_ok_and(|s| s == self.wanted_stamp())
    }

    fn write_stamp(&self) {
        let tmp = self.stamp.with_extension("tmp");
        // The stamp only saves time: failing to write it is not an error.
        if std::fs::write(&tmp, self.wanted_stamp()).is_ok() {
            let _ = std::fs::rename(&tmp, &self.stamp);
        }
    }

    /// Makes `pods` masqueraded, cheaply in the common case.
    ///
    /// Declaring the objects costs nft about 15 ms (cache fill, chain update, interval-set merge)
    /// while adding one element costs 2 ms, so the full rebuild runs only when the stamp says this
    /// network was not built with these destinations, or when the element add fails because the
    /// set is gone (table deleted, ruleset flushed, reboot). The rebuild re-adds every pod in
    /// `all_pods()` (the IPAM store), so pods attached before the table vanished are covered again.
    pub fn ensure(&self, pods: &[IpAddr], all_pods: impl FnOnce() -> Vec<IpAddr>) -> CniResult<()> {
        if self.stamp_is_current() && apply(&self.scope.elements("add", pods)).is_ok() {
            return Ok(());
        }
        let mut every = all_pods();
        every.extend_from_slice(pods);
        every.sort();
        every.dedup();
        self.rebuild(&self.scope.rebuild_script(&self.direct, &every), &every)
    }

    /// Forgets `pods`. The fast path deletes elements; if this network's sets are gone it rebuilds
    /// them from `live_pods()` (the store without `pods`) first.
    pub fn forget(
        &self,
        pods: &[IpAddr],
        live_pods: impl FnOnce() -> Vec<IpAddr>,
    ) -> CniResult<()> {
        if pods.is_empty() {
            return Ok(());
        }
        let fast = self.scope.elements("add", pods) + &self.scope.elements("delete", pods);
        if self.stamp_is_current() && apply(&fast).is_ok() {
            return Ok(());
        }
        let live: Vec<IpAddr> = live_pods()
            .into_iter()
            .filter(|ip| !pods.contains(ip))
            .collect();
        self.rebuild(
            &self.scope.rebuild_without_script(&self.direct, &live, pods),
            &live,
        )
    }

    /// Rebuilds this network's objects from `live` (GC: a full resync).
    pub fn resync(&self, live: &[IpAddr]) -> CniResult<()> {
        self.rebuild(&self.scope.rebuild_script(&self.direct, live), live)
    }

    fn rebuild(&self, script: &str, live: &[IpAddr]) -> CniResult<()> {
        apply(script)?;
        self.write_stamp();
        leave_legacy_sets(live);
        Ok(())
    }

    /// Whether `ip` is in this network's masquerade set (for CHECK).
    pub fn is_masqueraded(&self, ip: &IpAddr) -> bool {
        Command::new("nft")
            .args([
                "get",
                "element",
                "inet",
                TABLE,
                self.scope.pod_set(ip),
                &format!("{{ {ip} }}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// Takes `pods` out of the shared sets of the old layout (whose rule used every network's
/// destinations), so an address that leaves this network is not masqueraded by that rule when it is
/// reused. Best effort, and only on the slow path: with no legacy sets the transaction just fails.
fn leave_legacy_sets(pods: &[IpAddr]) {
    let mut script = String::new();
    for ip in pods {
        let set = LEGACY_POD_SETS[usize::from(ip.is_ipv6())];
        script += &format!("add element inet {TABLE} {set} {{ {ip} }}\ndelete element inet {TABLE} {set} {{ {ip} }}\n");
    }
    if !script.is_empty() {
        let _ = apply(&script);
    }
}

/// Runs one nft transaction of the masquerade table.
pub fn apply(script: &str) -> CniResult<()> {
    nft_transaction(script, "the masquerade update")
}

/// Runs `script` as one `nft -f -` transaction (weir-kernel's runner); `what` names it in
/// the error.
pub(crate) fn nft_transaction(script: &str, what: &str) -> CniResult<()> {
    use weir_kernel::nft::NftError;
    let fail = |m: String| CniError::new(ErrorCode::Nftables, m);
    weir_kernel::nft::apply(script).map_err(|e| match e {
        NftError::Spawn(e) => fail(format!("cannot run nft (install package nftables): {e}")),
        NftError::Io(e) => fail(format!("writing to nft: {e}")),
        NftError::Rejected(stderr) => fail(format!("nft rejected {what}")).with_details(stderr),
    })
}

/// Removes the whole table (used by cleanup tooling; a missing table is success).
pub fn remove_table() -> CniResult<()> {
    apply(&format!(
        "add table inet {TABLE}\ndelete table inet {TABLE}\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebuild_declares_this_network_only() {
        let scope = Scope::for_network("kt");
        let s = scope.rebuild_script(
            &["10.244.0.0/16".parse().unwrap()],
            &["10.244.1.5".parse().unwrap()],
        );
        assert!(s.contains(&format!(
            "add element inet weir-cni {} {{ 10.244.1.5 }}",
            scope.pods4
        )));
        assert!(s.contains(&format!(
            "add element inet weir-cni {} {{ 10.244.0.0/16 }}",
            scope.direct4
        )));
        assert!(s.contains(&format!(
            "add element inet weir-cni {} {{ 224.0.0.0/4 }}",
            scope.direct4
        )));
        // destinations are replaced, not accumulated, when clusterCIDR changes
        assert!(s.contains(&format!("flush set inet weir-cni {}", scope.direct4)));
        assert_eq!(
            s.matches("masquerade").count(),
            2,
            "the two static rules, once each"
        );
        assert!(
            !s.contains(" pods4 ") && !s.contains("weir-cni postrouting"),
            "{s}"
        );
    }

    #[test]
    fn networks_get_distinct_valid_nft_names() {
        let a = Scope::for_network("k8s-pod-network");
        let b = Scope::for_network("k8s_pod_network");
        assert_ne!(a, b, "reduced names collide, hashes must not");
        // Literals (sha256 of each name begins 6c6f91f4 / 275081ec): the sets and chain a
        // released weir-cni made keep these names, so they must not follow a code change.
        assert_eq!(a.chain, "post_k8s_pod_network_6c6f91f4");
        assert_eq!(a.pods4, "pods4_k8s_pod_network_6c6f91f4");
        assert_eq!(b.direct6, "direct6_k8s_pod_network_275081ec");
        for name in [&a.pods4, &a.direct6, &a.chain] {
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{name}"
            );
            assert!(name.chars().next().unwrap().is_ascii_alphabetic());
        }
        let long = Scope::for_network(&"n".repeat(255));
        assert!(long.direct4.len() < 64);
    }

    #[test]
    fn rebuild_without_is_idempotent_by_construction() {
        let scope = Scope::for_network("kt");
        let s = scope.rebuild_without_script(&[], &[], &["fd00::5".parse().unwrap()]);
        let add = s
            .find(&format!(
                "add element inet weir-cni {} {{ fd00::5 }}",
                scope.pods6
            ))
            .unwrap();
        let del = s
            .find(&format!(
                "delete element inet weir-cni {} {{ fd00::5 }}",
                scope.pods6
            ))
            .unwrap();
        assert!(add < del);
    }
}
