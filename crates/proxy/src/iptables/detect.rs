//! Which iptables implementation to drive: `--iptables-backend auto|nft|legacy`.
//!
//! The two implementations keep separate rule sets: rules written with iptables-legacy live
//! in the kernel's x_tables, rules written with iptables-nft in nf_tables tables of the same
//! names, and packets go through both. A node's other components (kubelet, a CNI plugin's
//! portmap, the container runtime) already picked one; a proxy that writes into the other
//! works, but splits the node's rules across two places no single `iptables-save` shows, and
//! kubelet's `KUBE-FIREWALL` protection sits in the other. `auto` therefore does what
//! kube-proxy's image does (the kubernetes-sigs iptables-wrapper): the implementation holding
//! kubelet's hint chains (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`), else the one holding
//! more `KUBE-`/`WEIR-` chains, else nft.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};

use weir_model::IpFamily;

use super::tools::{chains_in_nft_listing, chains_in_save, Flavor, Tool};

/// `--iptables-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The implementation the node already uses (see the module documentation).
    #[default]
    Auto,
    Nft,
    Legacy,
}

impl BackendChoice {
    pub fn parse(s: &str) -> Option<BackendChoice> {
        match s {
            "auto" => Some(BackendChoice::Auto),
            "nft" => Some(BackendChoice::Nft),
            "legacy" => Some(BackendChoice::Legacy),
            _ => None,
        }
    }
}

/// Chains kubelet creates in the implementation it uses, for exactly this question.
const HINTS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

fn ours(chain: &str) -> bool {
    chain.starts_with("KUBE-") || chain.starts_with("WEIR-")
}

/// The pure decision: given the chain names each implementation holds (all tables).
pub fn choose(nft: &BTreeSet<String>, legacy: &BTreeSet<String>) -> Flavor {
    let hinted = |set: &BTreeSet<String>| HINTS.iter().any(|h| set.contains(*h));
    if hinted(nft) {
        return Flavor::Nft;
    }
    if hinted(legacy) {
        return Flavor::Legacy;
    }
    let count = |set: &BTreeSet<String>| set.iter().filter(|c| ours(c)).count();
    if count(legacy) > count(nft) {
        Flavor::Legacy
    } else {
        Flavor::Nft
    }
}

/// Whether `program --version` runs.
fn exists(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Every chain of the x_tables tables (`iptables-legacy-save`: one blob per table, cheap).
fn legacy_chains(family: IpFamily) -> BTreeSet<String> {
    let tool = Tool {
        family,
        flavor: Flavor::Legacy,
    };
    tool.save(None)
        .map(|text| chains_in_save(&text).into_values().flatten().collect())
        .unwrap_or_default()
}

/// Every chain of iptables-nft's tables, from `nft list chains` (names only: an
/// `iptables-nft-save` of a big nat table decodes every rule and takes seconds).
fn nft_chains(family: IpFamily) -> BTreeSet<String> {
    let fam = match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    };
    let listing = Command::new("nft")
        .args(["list", "chains", fam])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let text = match listing {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => {
            let tool = Tool {
                family,
                flavor: Flavor::Nft,
            };
            return tool
                .save(None)
                .map(|text| chains_in_save(&text).into_values().flatten().collect())
                .unwrap_or_default();
        }
    };
    ["raw", "mangle", "filter", "nat"]
        .into_iter()
        .flat_map(|t| chains_in_nft_listing(&text, t))
        .collect()
}

/// Resolves `choice` on this host, in the calling thread's network namespace. Without the
/// `-nft` / `-legacy` programs (an image that ships only `iptables`), `auto` is the system's
/// `iptables`.
pub fn resolve(choice: BackendChoice, family: IpFamily) -> Flavor {
    match choice {
        BackendChoice::Nft => Flavor::Nft,
        BackendChoice::Legacy => Flavor::Legacy,
        BackendChoice::Auto => {
            let programs = |f: Flavor| Tool { family, flavor: f }.program("iptables-save");
            if !(exists(&programs(Flavor::Nft)) && exists(&programs(Flavor::Legacy))) {
                return Flavor::System;
            }
            // Nothing of Kubernetes' in legacy: nft, whatever it holds — and no listing of a
            // big nft table (seconds at 1,000 services) on every restart of an nft node.
            let legacy = legacy_chains(family);
            if !legacy.iter().any(|c| ours(c)) {
                return Flavor::Nft;
            }
            choose(&nft_chains(family), &legacy)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hints_decide_first_then_the_count_then_nft() {
        let (none, hint) = (set(&["INPUT"]), set(&["KUBE-KUBELET-CANARY"]));
        let many = set(&["KUBE-SERVICES", "KUBE-SVC-A", "WEIR-X"]);
        assert_eq!(choose(&none, &none), Flavor::Nft);
        assert_eq!(choose(&none, &hint), Flavor::Legacy);
        // kubelet's hint outweighs any number of chains elsewhere
        assert_eq!(choose(&hint, &many), Flavor::Nft);
        assert_eq!(choose(&many, &hint), Flavor::Legacy);
        assert_eq!(choose(&none, &many), Flavor::Legacy);
        assert_eq!(choose(&many, &none), Flavor::Nft);
        // a tie (both hold the same number) stays with nft, as kube-proxy's wrapper does
        assert_eq!(choose(&set(&["KUBE-A"]), &set(&["KUBE-B"])), Flavor::Nft);
    }

    #[test]
    fn choices_parse_and_unknown_ones_do_not() {
        assert_eq!(BackendChoice::parse("auto"), Some(BackendChoice::Auto));
        assert_eq!(BackendChoice::parse("legacy"), Some(BackendChoice::Legacy));
        assert_eq!(BackendChoice::parse("nft"), Some(BackendChoice::Nft));
        assert_eq!(BackendChoice::parse("nftables"), None);
    }

    #[test]
    fn programs_are_named_per_flavor_and_family() {
        let t = |family, flavor| Tool { family, flavor };
        assert_eq!(
            t(IpFamily::V6, Flavor::Nft).program("iptables-restore"),
            "ip6tables-nft-restore"
        );
        assert_eq!(
            t(IpFamily::V4, Flavor::Legacy).program("iptables-save"),
            "iptables-legacy-save"
        );
        assert_eq!(
            t(IpFamily::V4, Flavor::System).program("iptables"),
            "iptables"
        );
    }
}
