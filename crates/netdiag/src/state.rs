//! A node's state as the outputs add up to: read from a directory (what `weir trace collect`
//! writes, or files an operator saved by hand) or from live outputs, with what was missing,
//! skipped or assumed written down.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use serde::Serialize;

use crate::iproute::{self, Address, Link, Neighbour, PolicyRule, Route};
use crate::iptables::{self, Dump};
use crate::nft::{self, Ruleset};
use crate::sysctl::{self, Sysctls};
use crate::Skipped;

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
    IpLink,
    IpAddr,
    IpNeigh,
    IpvsadmLn,
    Sysctl,
    ConntrackStats,
}

impl Output {
    pub const ALL: [Output; 12] = [
        Output::IptablesSave,
        Output::Ip6tablesSave,
        Output::NftRuleset,
        Output::IpsetList,
        Output::IpRule,
        Output::IpRoute,
        Output::IpLink,
        Output::IpAddr,
        Output::IpNeigh,
        Output::IpvsadmLn,
        Output::Sysctl,
        Output::ConntrackStats,
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
            Output::IpLink => "ip-link.json",
            Output::IpAddr => "ip-addr.json",
            Output::IpNeigh => "ip-neigh.json",
            Output::IpvsadmLn => "ipvsadm-Ln.txt",
            Output::Sysctl => "sysctl.txt",
            Output::ConntrackStats => "conntrack-stats.txt",
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

#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeState {
    pub iptables: Option<Dump>,
    pub ip6tables: Option<Dump>,
    pub nft: Option<Ruleset>,
    pub ipset: Option<String>,
    pub rules: Option<Vec<PolicyRule>>,
    pub routes: Option<Vec<Route>>,
    pub links: Option<Vec<Link>>,
    pub addrs: Option<Vec<Address>>,
    pub neighbours: Option<Vec<Neighbour>>,
    pub ipvs: Option<String>,
    pub sysctls: Option<Sysctls>,
    pub conntrack_stats: Option<String>,
    /// What each parser left out, by output.
    pub skipped: Vec<(Output, Skipped)>,
    /// Guesses made for missing or partial input.
    pub assumptions: Vec<String>,
    /// The outputs that were there.
    pub present: Vec<Output>,
}

impl NodeState {
    /// Builds the state from outputs (each at most once; a later one replaces an earlier one).
    pub fn from_outputs(outputs: impl IntoIterator<Item = (Output, String)>) -> NodeState {
        let mut st = NodeState::default();
        let mut by_kind: BTreeMap<Output, String> = BTreeMap::new();
        for (o, text) in outputs {
            by_kind.insert(o, text);
        }
        for (o, text) in by_kind {
            st.present.push(o);
            for note in crate::paste::lines(&text).notes() {
                st.assumptions.push(format!("{}: {note}", o.file_name()));
            }
            let skipped = match o {
                Output::IptablesSave | Output::Ip6tablesSave => {
                    let p = iptables::parse(&text);
                    let mut d = p.value;
                    for a in d.assumptions.drain(..) {
                        st.assumptions.push(format!("{}: {a}", o.file_name()));
                    }
                    if o == Output::IptablesSave {
                        st.iptables = Some(d);
                    } else {
                        st.ip6tables = Some(d);
                    }
                    p.skipped
                }
                Output::NftRuleset => {
                    let p = nft::parse(&text);
                    st.nft = Some(p.value);
                    p.skipped
                }
                Output::IpRule => {
                    let p = iproute::parse_rules(&text);
                    st.rules = Some(p.value);
                    p.skipped
                }
                Output::IpRoute => {
                    let p = iproute::parse_routes(&text);
                    st.routes = Some(p.value);
                    p.skipped
                }
                Output::IpLink => {
                    let p = iproute::parse_links(&text);
                    st.links = Some(p.value);
                    p.skipped
                }
                Output::IpAddr => {
                    let p = iproute::parse_addrs(&text);
                    st.addrs = Some(p.value);
                    p.skipped
                }
                Output::IpNeigh => {
                    let p = iproute::parse_neighbours(&text);
                    st.neighbours = Some(p.value);
                    p.skipped
                }
                Output::Sysctl => {
                    let p = sysctl::parse(&text);
                    st.sysctls = Some(p.value);
                    p.skipped
                }
                Output::IpsetList => {
                    st.ipset = Some(text);
                    Vec::new()
                }
                Output::IpvsadmLn => {
                    st.ipvs = Some(text);
                    Vec::new()
                }
                Output::ConntrackStats => {
                    st.conntrack_stats = Some(text);
                    Vec::new()
                }
            };
            st.skipped.extend(skipped.into_iter().map(|s| (o, s)));
        }
        st
    }

    /// Reads every file of `dir` whose name stands for an output ([`Output::for_file_name`]);
    /// other files are listed in `ignored`. Unreadable files are an error: losing one silently
    /// would make the checks lie.
    pub fn from_dir(dir: &Path) -> std::io::Result<(NodeState, Vec<String>)> {
        let mut outputs = Vec::new();
        let mut ignored = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            if !e.file_type()?.is_file() || name == crate::live::MANIFEST_FILE {
                continue;
            }
            match Output::for_file_name(&name) {
                Some(o) => {
                    let text = std::fs::read_to_string(e.path()).map_err(|err| {
                        std::io::Error::new(err.kind(), format!("{}: {err}", e.path().display()))
                    })?;
                    outputs.push((o, text));
                }
                None => ignored.push(name),
            }
        }
        Ok((NodeState::from_outputs(outputs), ignored))
    }

    /// Every address assigned on this node, with its interface.
    pub fn local_addresses(&self) -> impl Iterator<Item = &Address> {
        self.addrs.iter().flatten()
    }

    pub fn is_local_address(&self, ip: IpAddr) -> bool {
        self.local_addresses().any(|a| a.addr == ip)
            || self
                .routes
                .iter()
                .flatten()
                .any(|r| r.kind == "local" && r.table == "local" && r.dst.contains(&ip))
    }

    pub fn link(&self, name: &str) -> Option<&Link> {
        self.links.iter().flatten().find(|l| l.name == name)
    }

    /// The IPv4 addresses on `iface`.
    pub fn ipv4_on(&self, iface: &str) -> Vec<&Address> {
        self.local_addresses()
            .filter(|a| a.ifname == iface && a.addr.is_ipv4())
            .collect()
    }

    /// The longest-prefix route for `dst` in `table` (ties: lowest metric), unicast or not.
    pub fn lookup(&self, table: &str, dst: IpAddr) -> Option<&Route> {
        self.routes
            .iter()
            .flatten()
            .filter(|r| r.table == table && r.dst.contains(&dst))
            .max_by(|a, b| {
                a.dst
                    .prefix_len()
                    .cmp(&b.dst.prefix_len())
                    .then(b.metric.cmp(&a.metric))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_round_trip_and_aliases() {
        for o in Output::ALL {
            assert_eq!(Output::for_file_name(o.file_name()), Some(o));
        }
        assert_eq!(
            Output::for_file_name("ip route show table all.txt"),
            Some(Output::IpRoute)
        );
        assert_eq!(
            Output::for_file_name("iptables.txt"),
            Some(Output::IptablesSave)
        );
        assert_eq!(Output::for_file_name("notes.md"), None);
    }
}
