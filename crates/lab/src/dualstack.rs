//! The lab's IPv6 side (a topology's optional `ipv6:` block): the IPv6 networks of a dual-stack
//! lab, and every IPv6 address derived from them (pure).
//!
//! Every IPv6 address mirrors an IPv4 one, so a dual-stack lab reads the same in both families:
//! a node's IPv6 underlay address has the host number of its IPv4 one (`172.30.0.11` →
//! `fd00:172:30::b`), a node's IPv6 podCIDR is the block of the same index in the IPv6
//! clusterCIDR (`10.244.1.0/24`, block 1 of `10.244.0.0/16` → `fd00:10:244:1::/64`), and a
//! Service's IPv6 ClusterIP has the host number of its IPv4 one (`10.96.0.3` → `fd00:10:96::3`).
//! LoadBalancer IPs stay IPv4.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

fn default_underlay() -> Ipv6Net {
    "fd00:172:30::/64".parse().expect("valid")
}
fn default_cluster_cidr() -> Ipv6Net {
    "fd00:10:244::/48".parse().expect("valid")
}
fn default_service_cidr() -> Ipv6Net {
    "fd00:10:96::/112".parse().expect("valid")
}
fn default_outside() -> Ipv6Addr {
    "fd00:198:51:100::1".parse().expect("valid")
}
fn default_pod_prefix() -> u8 {
    64
}

/// `ipv6:` of a topology: present, the lab is dual-stack. Every field has a ULA default, so
/// `ipv6: {}` is enough.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ipv6 {
    #[serde(default = "default_underlay")]
    pub underlay: Ipv6Net,
    #[serde(rename = "clusterCIDR", default = "default_cluster_cidr")]
    pub cluster_cidr: Ipv6Net,
    /// Each node's IPv6 podCIDR is a block of this size (kube-controller-manager's
    /// `--node-cidr-mask-size-ipv6`, default 64).
    #[serde(rename = "podCIDRSize", default = "default_pod_prefix")]
    pub pod_prefix: u8,
    #[serde(rename = "serviceCIDR", default = "default_service_cidr")]
    pub service_cidr: Ipv6Net,
    /// The outside's "internet" address (on its `lo`, beside the IPv4 one).
    #[serde(default = "default_outside")]
    pub outside: Ipv6Addr,
}

impl Default for Ipv6 {
    fn default() -> Self {
        Self {
            underlay: default_underlay(),
            cluster_cidr: default_cluster_cidr(),
            pod_prefix: default_pod_prefix(),
            service_cidr: default_service_cidr(),
            outside: default_outside(),
        }
    }
}

/// Address `net`'s network + `n` (None past the end of `net`).
pub fn nth6(net: Ipv6Net, n: u128) -> Option<Ipv6Addr> {
    let addr = Ipv6Addr::from(u128::from(net.network()).checked_add(n)?);
    net.contains(&addr).then_some(addr)
}

/// The host number of `ip` in `net`.
fn host_number(net: Ipv4Net, ip: Ipv4Addr) -> u128 {
    u128::from(u32::from(ip).wrapping_sub(u32::from(net.network())))
}

impl Ipv6 {
    /// The IPv6 address with the host number `v4` has in `v4_underlay`.
    pub fn underlay_ip(&self, v4_underlay: Ipv4Net, v4: Ipv4Addr) -> Option<Ipv6Addr> {
        nth6(self.underlay, host_number(v4_underlay, v4)).filter(|a| *a != self.underlay.network())
    }

    /// The IPv6 podCIDR of the node whose IPv4 podCIDR is `v4_pod`: the block of the same index
    /// (`v4_pod`'s index among the blocks of its size in `v4_cluster`) among the
    /// `pod_prefix`-sized blocks of the IPv6 clusterCIDR.
    pub fn pod_cidr(&self, v4_cluster: Ipv4Net, v4_pod: Ipv4Net) -> Option<Ipv6Net> {
        let shift = 32 - u32::from(v4_pod.prefix_len());
        let index = host_number(v4_cluster, v4_pod.network()) >> shift;
        let bits = self
            .pod_prefix
            .checked_sub(self.cluster_cidr.prefix_len())?;
        if bits < 128 && index >> bits != 0 {
            return None;
        }
        let start = index.checked_shl(128 - u32::from(self.pod_prefix))?;
        Ipv6Net::new(nth6(self.cluster_cidr, start)?, self.pod_prefix).ok()
    }

    /// The IPv6 ClusterIP beside IPv4 ClusterIP `v4` of `v4_service_cidr`.
    pub fn cluster_ip(&self, v4_service_cidr: Ipv4Net, v4: Ipv4Addr) -> Option<Ipv6Addr> {
        nth6(self.service_cidr, host_number(v4_service_cidr, v4))
    }

    /// The outside's address on the underlay (its `::1`), every node's IPv6 default router.
    pub fn router_ip(&self) -> Ipv6Addr {
        nth6(self.underlay, 1).expect("a validated underlay has ::1")
    }

    /// What is wrong with these networks beside the IPv4 ones, as (field under `ipv6.`,
    /// message).
    pub fn check(
        &self,
        v4_underlay: Ipv4Net,
        v4_service_cidr: Ipv4Net,
    ) -> Result<(), (&'static str, String)> {
        let nets = [
            ("underlay", self.underlay),
            ("clusterCIDR", self.cluster_cidr),
            ("serviceCIDR", self.service_cidr),
        ];
        for (i, (field, net)) in nets.iter().enumerate() {
            if net.addr() != net.network() {
                return Err((field, format!("{net} has host bits set")));
            }
            for (other_field, other) in &nets[..i] {
                if net.contains(&other.network()) || other.contains(&net.network()) {
                    return Err((field, format!("{net} overlaps ipv6.{other_field} {other}")));
                }
            }
            if net.contains(&self.outside) {
                return Err((
                    "outside",
                    format!("{} is inside ipv6.{field}", self.outside),
                ));
            }
        }
        // Room for the IPv4 host numbers mirrored.
        let room = |net: Ipv6Net, v4: Ipv4Net| 128 - net.prefix_len() >= 32 - v4.prefix_len();
        if !room(self.underlay, v4_underlay) {
            return Err((
                "underlay",
                format!(
                    "{} has fewer addresses than underlay {v4_underlay}",
                    self.underlay
                ),
            ));
        }
        if !room(self.service_cidr, v4_service_cidr) {
            return Err((
                "serviceCIDR",
                format!(
                    "{} has fewer addresses than serviceCIDR {v4_service_cidr}",
                    self.service_cidr
                ),
            ));
        }
        if self.pod_prefix <= self.cluster_cidr.prefix_len() || self.pod_prefix > 120 {
            return Err((
                "podCIDRSize",
                format!(
                    "{} must be longer than clusterCIDR's /{} and at most 120",
                    self.pod_prefix,
                    self.cluster_cidr.prefix_len()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_mirror_the_ipv4_ones() {
        let v6 = Ipv6::default();
        let net = |s: &str| s.parse::<Ipv4Net>().unwrap();
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            v6.underlay_ip(net("172.30.0.0/24"), ip("172.30.0.11"))
                .unwrap()
                .to_string(),
            "fd00:172:30::b"
        );
        assert_eq!(v6.router_ip().to_string(), "fd00:172:30::1");
        assert_eq!(
            v6.pod_cidr(net("10.244.0.0/16"), net("10.244.1.0/24"))
                .unwrap()
                .to_string(),
            "fd00:10:244:1::/64"
        );
        assert_eq!(
            v6.pod_cidr(net("10.244.0.0/16"), net("10.244.255.0/24"))
                .unwrap()
                .to_string(),
            "fd00:10:244:ff::/64"
        );
        // Index 1 of /28s in a /20, as /64s of a /48.
        assert_eq!(
            v6.pod_cidr(net("10.12.192.0/20"), net("10.12.192.16/28"))
                .unwrap()
                .to_string(),
            "fd00:10:244:1::/64"
        );
        assert_eq!(
            v6.cluster_ip(net("10.96.0.0/16"), ip("10.96.1.7"))
                .unwrap()
                .to_string(),
            "fd00:10:96::107"
        );
        // An index with no block left.
        let small = Ipv6 {
            cluster_cidr: "fd00:10:244::/62".parse().unwrap(),
            ..Ipv6::default()
        };
        assert!(small
            .pod_cidr(net("10.244.0.0/16"), net("10.244.4.0/24"))
            .is_none());
        assert!(small
            .pod_cidr(net("10.244.0.0/16"), net("10.244.3.0/24"))
            .is_some());
    }

    #[test]
    fn checks_name_the_field() {
        let u = "172.30.0.0/24".parse().unwrap();
        let s = "10.96.0.0/16".parse().unwrap();
        assert_eq!(Ipv6::default().check(u, s), Ok(()));
        let bad = |v6: Ipv6| v6.check(u, s).unwrap_err();
        assert_eq!(
            bad(Ipv6 {
                service_cidr: "fd00:10:96::/120".parse().unwrap(),
                ..Ipv6::default()
            })
            .0,
            "serviceCIDR"
        );
        assert_eq!(
            bad(Ipv6 {
                service_cidr: "fd00:10:244:5::/112".parse().unwrap(),
                ..Ipv6::default()
            }),
            (
                "serviceCIDR",
                "fd00:10:244:5::/112 overlaps ipv6.clusterCIDR fd00:10:244::/48".into()
            )
        );
        assert_eq!(
            bad(Ipv6 {
                outside: "fd00:172:30::99".parse().unwrap(),
                ..Ipv6::default()
            })
            .0,
            "outside"
        );
        assert_eq!(
            bad(Ipv6 {
                pod_prefix: 40,
                ..Ipv6::default()
            })
            .0,
            "podCIDRSize"
        );
        assert_eq!(
            bad(Ipv6 {
                underlay: "fd00:172:30::1/64".parse().unwrap(),
                ..Ipv6::default()
            }),
            ("underlay", "fd00:172:30::1/64 has host bits set".into())
        );
    }
}
