//! What eni-shared mode puts in the kernel, as data: the policy rules, the host veth's name and the
//! node-wide nftables table. Pure, so the shapes are tested without root; [`super::datapath`]
//! applies them.

use std::net::Ipv4Addr;

use sha2::{Digest, Sha256};

use super::config::EniConf;

/// The node-wide nftables table every eni-shared network shares (see [`node_nft_script`]).
pub const NFT_TABLE: &str = "weir-eni";

/// The pod's next hop: a link-local address the host veth answers for by proxy ARP, so the pod
/// needs no knowledge of the ENI's subnet (the same shape as Calico's and AWS VPC CNI's pods).
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// One policy rule weir owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleSpec {
    pub priority: u32,
    pub selector: Selector,
    pub table: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selector {
    To(Ipv4Addr),
    From(Ipv4Addr),
    FwMark { mark: u32, mask: u32 },
}

pub const MAIN_TABLE: u32 = 254;

impl std::fmt::Display for RuleSpec {
    /// `ip rule` spelling, for messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let table = if self.table == MAIN_TABLE {
            "main".to_string()
        } else {
            self.table.to_string()
        };
        match self.selector {
            Selector::To(ip) => write!(f, "pref {} to {ip} lookup {table}", self.priority),
            Selector::From(ip) => write!(f, "pref {} from {ip} lookup {table}", self.priority),
            Selector::FwMark { mark, mask } => write!(
                f,
                "pref {} fwmark {mark:#x}/{mask:#x} lookup {table}",
                self.priority
            ),
        }
    }
}

/// The two rules of one pod: traffic to it uses main (its host route), traffic from it the
/// ENI's table (default via the ENI gateway).
pub fn pod_rules(conf: &EniConf, pod: Ipv4Addr) -> [RuleSpec; 2] {
    [
        RuleSpec {
            priority: conf.priorities.to_pod,
            selector: Selector::To(pod),
            table: MAIN_TABLE,
        },
        RuleSpec {
            priority: conf.priorities.from_pod,
            selector: Selector::From(pod),
            table: conf.route_table,
        },
    ]
}

/// The node's rule: connections marked on entry answer through main.
pub fn fwmark_rule(conf: &EniConf) -> RuleSpec {
    RuleSpec {
        priority: conf.priorities.fwmark,
        selector: Selector::FwMark {
            mark: conf.mark,
            mask: conf.mark_mask,
        },
        table: MAIN_TABLE,
    }
}

/// The host end of a pod's veth: `vethPrefix` + hex of SHA-256(network, container ID, ifname),
/// 15 bytes in all. Deterministic, so DEL finds it from the runtime's arguments alone; the network
/// is part of the hash so two eni-shared networks with the same prefix never collide.
pub fn host_veth_name(prefix: &str, network: &str, container_id: &str, ifname: &str) -> String {
    let digest = Sha256::digest(format!("{network}/{container_id}/{ifname}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{}", &hex[..15 - prefix.len()])
}

/// The base chain of network `name` in [`NFT_TABLE`]: `net-` and the name with anything but
/// letters, digits and `_` spelled `_` (nft identifiers), plus a hash when that changed the name.
pub fn chain_name(network: &str) -> String {
    let clean: String = network
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean == network {
        format!("net-{clean}")
    } else {
        let digest = Sha256::digest(network.as_bytes());
        format!("net-{clean}-{:02x}{:02x}", digest[0], digest[1])
    }
}

/// The node-wide connmark table, and this network's chain in it:
///
/// ```text
/// table inet weir-eni {
///   set pod_ifaces { type ifname; flags interval }   # "<vethPrefix>*" of every eni-shared network
///   set enis { type ifname }                         # every eni-shared network's ENI
///   chain net-<network> { type filter hook prerouting priority mangle
///     iifname @pod_ifaces ct mark & MASK == MARK  meta mark set meta mark & ~MASK | MARK
///     iifname @pod_ifaces return
///     iifname @enis return
///     ct state new  ct mark set ct mark & ~MASK | MARK
///     ct mark & MASK == MARK  meta mark set meta mark & ~MASK | MARK
///   }
/// }
/// ```
///
/// A connection that enters by an interface that is neither a pod veth nor an ENI (eth0: a
/// NodePort or LoadBalancer client, another node's pod) is marked; the pod's replies get the mark
/// back as they arrive on its veth, so rule `fwmark MARK/MASK lookup main` sends them out the way
/// the request came in. The request's own packets carry the mark too, so with `src_valid_mark` the
/// reverse-path check of a request DNATed to a local pod consults main as well (without it that
/// check follows `from <pod> lookup <table>` to the ENI and strict rp_filter drops the request).
///
/// The sets are shared because each network must skip the veths and ENIs of the others (a packet
/// from another network's pod is not "outside"). Every statement only ORs/ANDs its own bits, so
/// kube-proxy's 0x4000/0x8000 and other agents' marks survive. Idempotent: re-running it re-adds
/// existing elements and rewrites this network's chain, so a flushed table heals.
pub fn node_nft_script(conf: &EniConf, eni_name: &str) -> String {
    let t = NFT_TABLE;
    let chain = chain_name(&conf.name);
    let keep = !conf.mark_mask;
    let set_meta = format!("meta mark set meta mark & {keep:#x} | {:#x}", conf.mark);
    let marked = format!("ct mark & {:#x} == {:#x}", conf.mark_mask, conf.mark);
    format!(
        "add table inet {t}\n\
         add set inet {t} pod_ifaces {{ type ifname; flags interval; }}\n\
         add set inet {t} enis {{ type ifname; }}\n\
         add element inet {t} pod_ifaces {{ \"{prefix}*\" }}\n\
         add element inet {t} enis {{ \"{eni_name}\" }}\n\
         add chain inet {t} {chain} {{ type filter hook prerouting priority mangle; policy accept; }}\n\
         flush chain inet {t} {chain}\n\
         add rule inet {t} {chain} iifname @pod_ifaces {marked} {set_meta}\n\
         add rule inet {t} {chain} iifname @pod_ifaces return\n\
         add rule inet {t} {chain} iifname @enis return\n\
         add rule inet {t} {chain} ct state new ct mark set ct mark & {keep:#x} | {mark:#x}\n\
         add rule inet {t} {chain} {marked} {set_meta}\n",
        prefix = conf.veth_prefix,
        mark = conf.mark,
    )
}

/// What the node-wide state was set up from; a change (or a reboot) re-runs the node setup.
pub fn node_stamp(conf: &EniConf, eni_name: &str, eni_address: Ipv4Addr, boot_id: &str) -> String {
    format!(
        "boot={boot_id} eni={eni_name} addr={eni_address} gw={} table={} rules={}/{}/{} mark={:#x}/{:#x} prefix={}",
        conf.gateway,
        conf.route_table,
        conf.priorities.to_pod,
        conf.priorities.fwmark,
        conf.priorities.from_pod,
        conf.mark,
        conf.mark_mask,
        conf.veth_prefix
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf() -> EniConf {
        EniConf::parse(
            br#"{"cniVersion":"1.1.0","name":"eni.a","type":"weir-cni","mode":"eni-shared",
                "eniName":"eth1","eniGateway":"10.12.192.1","routeTable":1003,
                "eniAddresses":["10.12.192.10","10.12.192.44"]}"#,
        )
        .unwrap()
    }

    #[test]
    fn rules_read_like_the_documented_shape() {
        let c = conf();
        let pod = Ipv4Addr::new(10, 12, 192, 44);
        let [to, from] = pod_rules(&c, pod);
        assert_eq!(to.to_string(), "pref 512 to 10.12.192.44 lookup main");
        assert_eq!(from.to_string(), "pref 1536 from 10.12.192.44 lookup 1003");
        assert_eq!(
            fwmark_rule(&c).to_string(),
            "pref 1024 fwmark 0x80/0x80 lookup main"
        );
    }

    #[test]
    fn veth_names_are_15_bytes_and_per_network() {
        let a = host_veth_name("eni", "net1", "c1", "eth0");
        // a literal (`printf '%s' net1/c1/eth0 | sha256sum`): DEL after an upgrade finds the
        // veths a released weir-cni made only if the name does not change
        assert_eq!(a, "eni06d71de18509");
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("eni"));
        assert_eq!(a, host_veth_name("eni", "net1", "c1", "eth0"));
        assert_ne!(a, host_veth_name("eni", "net2", "c1", "eth0"));
        assert_eq!(host_veth_name("abcdefgh", "n", "c", "eth0").len(), 15);
    }

    #[test]
    fn chain_names_are_nft_identifiers_and_distinct() {
        assert_eq!(chain_name("eni_a1"), "net-eni_a1");
        let dotted = chain_name("eni.a");
        assert!(dotted.starts_with("net-eni_a-"), "{dotted}");
        // a literal (sha256 of "eni.a" begins b7ae): a released weir-cni's chain keeps its name
        assert_eq!(dotted, "net-eni_a-b7ae");
        assert_ne!(dotted, chain_name("eni_a"));
    }

    #[test]
    fn nft_script_marks_only_its_bits_and_skips_pods_and_enis() {
        let s = node_nft_script(&conf(), "eth1");
        assert!(s.contains("add element inet weir-eni pod_ifaces { \"eni*\" }"));
        assert!(s.contains("add element inet weir-eni enis { \"eth1\" }"));
        assert!(s.contains("ct state new ct mark set ct mark & 0xffffff7f | 0x80"));
        assert!(s.contains("iifname @pod_ifaces ct mark & 0x80 == 0x80 meta mark set meta mark & 0xffffff7f | 0x80"));
        // the skip rules come before the marking rule
        let skip = s.find("iifname @enis return").unwrap();
        let mark = s.find("ct state new").unwrap();
        assert!(skip < mark);
    }
}
