//! The outputs operators paste and `weir trace collect` saves, and the file names they are
//! saved under: what every reader of this crate is keyed by.

use serde::Serialize;

/// One output an operator pastes, and the file it is saved as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Output {
    IptablesSave,
    Ip6tablesSave,
    NftRuleset,
    IpsetList,
    IpRule,
    IpRoute,
    /// `ip -6 rule`: IPv6 policy rules (a family of their own: `ip rule` shows IPv4's only).
    Ip6Rule,
    /// `ip -6 route show table all`: IPv6 routes (`ip route` shows IPv4's only).
    Ip6Route,
    IpLink,
    IpAddr,
    IpNeigh,
    IpvsadmLn,
    Sysctl,
    ConntrackStats,
    /// `conntrack -L`: the connections (read for stale NAT bindings). Not collected by `weir
    /// trace collect` (it can be large); read when pasted.
    ConntrackList,
    /// `ip route get` answers under their commands: single lookups the kernel made. Pasted only.
    IpRouteGet,
    /// `ipvsadm -Lnc`: IPVS's connection entries. Pasted only.
    IpvsadmConns,
    /// Bridge ports' sysfs `hairpin_mode`. Pasted only.
    HairpinMode,
    /// The kernel log (`dmesg`): its martian-source lines. Pasted only.
    KernelLog,
    /// `tcpdump -n` lines: packets seen, as evidence of which way one went. Pasted only.
    Tcpdump,
    /// The pod's own `ip addr` (its address, and its eth0's peer index: the host veth).
    PodIpAddr,
    /// The pod's `/etc/resolv.conf`.
    PodResolvConf,
}

impl Output {
    pub const ALL: [Output; 22] = [
        Output::IptablesSave,
        Output::Ip6tablesSave,
        Output::NftRuleset,
        Output::IpsetList,
        Output::IpRule,
        Output::IpRoute,
        Output::Ip6Rule,
        Output::Ip6Route,
        Output::IpLink,
        Output::IpAddr,
        Output::IpNeigh,
        Output::IpvsadmLn,
        Output::Sysctl,
        Output::ConntrackStats,
        Output::ConntrackList,
        Output::IpRouteGet,
        Output::IpvsadmConns,
        Output::HairpinMode,
        Output::KernelLog,
        Output::Tcpdump,
        Output::PodIpAddr,
        Output::PodResolvConf,
    ];

    /// The file name `weir trace collect` writes.
    pub fn file_name(self) -> &'static str {
        match self {
            Output::IptablesSave => "iptables-save.txt",
            Output::Ip6tablesSave => "ip6tables-save.txt",
            Output::NftRuleset => "nft-ruleset.json",
            Output::IpsetList => "ipset-list.txt",
            Output::IpRule => "ip-rule.json",
            Output::IpRoute => "ip-route.json",
            Output::Ip6Rule => "ip6-rule.json",
            Output::Ip6Route => "ip6-route.json",
            Output::IpLink => "ip-link.json",
            Output::IpAddr => "ip-addr.json",
            Output::IpNeigh => "ip-neigh.json",
            Output::IpvsadmLn => "ipvsadm-Ln.txt",
            Output::Sysctl => "sysctl.txt",
            Output::ConntrackStats => "conntrack-stats.txt",
            Output::ConntrackList => "conntrack-L.txt",
            Output::IpRouteGet => "ip-route-get.txt",
            Output::IpvsadmConns => "ipvsadm-Lnc.txt",
            Output::HairpinMode => "hairpin_mode.txt",
            Output::KernelLog => "dmesg.txt",
            Output::Tcpdump => "tcpdump.txt",
            Output::PodIpAddr => "pod-ip-addr.txt",
            Output::PodResolvConf => "pod-resolv.conf",
        }
    }

    /// Names a hand-made directory may use instead (compared without the extension): the
    /// command line with spaces or dashes, as people name their pastes.
    fn stems(self) -> &'static [&'static str] {
        match self {
            Output::IptablesSave => &[
                "iptables-save",
                "iptables",
                "iptables-nft-save",
                "iptables-legacy-save",
                "iptables-S",
            ],
            Output::Ip6tablesSave => &[
                "ip6tables-save",
                "ip6tables",
                "ip6tables-nft-save",
                "ip6tables-legacy-save",
            ],
            Output::NftRuleset => &[
                "nft-ruleset",
                "nft",
                "nft-list-ruleset",
                "nft-j-list-ruleset",
            ],
            Output::IpsetList => &["ipset-list", "ipset", "ipset-save"],
            Output::IpRule => &["ip-rule", "ip-rule-show", "ip-j-rule"],
            Output::IpRoute => &[
                "ip-route",
                "ip-route-show-table-all",
                "ip-j-route",
                "ip-route-show",
            ],
            Output::Ip6Rule => &["ip6-rule", "ip-6-rule", "ip-6-rule-show", "ip-6-j-rule"],
            Output::Ip6Route => &[
                "ip6-route",
                "ip-6-route",
                "ip-6-route-show-table-all",
                "ip-6-j-route",
                "ip-6-route-show",
            ],
            Output::IpLink => &["ip-link", "ip-d-link", "ip-j-d-link", "ip-link-show"],
            Output::IpAddr => &["ip-addr", "ip-a", "ip-j-addr", "ip-addr-show"],
            Output::IpNeigh => &["ip-neigh", "ip-n", "ip-j-neigh"],
            Output::IpvsadmLn => &[
                "ipvsadm-Ln",
                "ipvsadm",
                "ipvsadm-ln",
                "ipvsadm-Sn",
                "ipvsadm-save",
            ],
            Output::Sysctl => &["sysctl", "sysctl-a", "sysctls"],
            Output::ConntrackStats => &["conntrack-stats", "conntrack-S", "conntrack"],
            Output::ConntrackList => &["conntrack-L", "conntrack-list", "conntrack-L-n"],
            Output::IpRouteGet => &["ip-route-get", "ip-r-g", "ip-route-get-all"],
            Output::IpvsadmConns => &["ipvsadm-Lnc", "ipvsadm-Lcn", "ipvsadm-L-n-c"],
            Output::HairpinMode => &["hairpin-mode", "hairpin"],
            Output::KernelLog => &["dmesg", "dmesg-T", "journalctl-k"],
            Output::Tcpdump => &["tcpdump", "tcpdump-n", "tcpdump-nn", "capture", "pcap"],
            Output::PodIpAddr => &[
                "pod-ip-addr",
                "pod-ip-a",
                "pod-addr",
                "ip-addr-pod",
                "ip-a-pod",
                "pod-ip-addr-show",
            ],
            Output::PodResolvConf => &[
                "pod-resolv.conf",
                "resolv.conf",
                "pod-resolv-conf",
                "pod-resolv",
                "resolv-conf",
            ],
        }
    }

    /// The output a file name stands for, if any.
    pub fn for_file_name(name: &str) -> Option<Output> {
        let stem = name
            .strip_suffix(".txt")
            .or_else(|| name.strip_suffix(".json"))
            .or_else(|| name.strip_suffix(".out"))
            .or_else(|| name.strip_suffix(".log"))
            .unwrap_or(name);
        let stem = stem.replace(['_', ' '], "-");
        Output::ALL
            .into_iter()
            .find(|o| o.stems().iter().any(|s| s.eq_ignore_ascii_case(&stem)))
    }
}
