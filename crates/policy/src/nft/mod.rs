//! nftables rendering of a [`PolicyPlan`]: one `table inet weir-policy`, the only table this
//! code owns, and a keyed diff between two plans. Layout and reasons: `docs/policy.md`.
//!
//! ```text
//! forward (filter): ct established,related accept
//!                   ip saddr vmap @egress4 / ip6 saddr vmap @egress6   → egress_<ns>/<pod>
//!                   ip daddr vmap @ingress4 / ip6 daddr vmap @ingress6 → ingress_<ns>/<pod>
//! input   (filter): ct established,related accept; the egress maps (pod → its own node)
//! ```
//!
//! Node → pod traffic (kubelet probes) leaves through output and never reaches forward, so
//! it is allowed without a rule. Pods not isolated in a direction have no map entry.

mod diff;
mod names;
mod ruleset;

use std::fmt::Write;

pub use diff::RulesetDiff;
pub use names::{chain_name, drop_comment, RuleComment};
pub use ruleset::{Ruleset, VerdictMap};

use crate::plan::PolicyPlan;

pub const TABLE: &str = "weir-policy";

/// The whole table, replacing whatever table of that name exists, in one transaction.
pub fn render(plan: &PolicyPlan) -> String {
    render_ruleset(&Ruleset::from_plan(plan), &plan.node)
}

/// Changes only the chains and map elements that differ between `old` (what the kernel
/// holds) and `new`, as one `nft -f` transaction: the kernel switches to the new ruleset at
/// commit, so no packet sees a half-changed chain. Empty when nothing differs.
pub fn render_diff(old: &PolicyPlan, new: &PolicyPlan) -> String {
    render_ruleset_diff(&Ruleset::from_plan(old).diff(&Ruleset::from_plan(new)))
}

pub fn render_ruleset(ruleset: &Ruleset, node: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# NetworkPolicy for the pods on node {node}.");
    // Creating then deleting makes the delete succeed on a fresh node; the whole file is one
    // transaction, so the old table serves until the new one is complete.
    let _ = writeln!(s, "table inet {TABLE}\ndelete table inet {TABLE}");
    let _ = writeln!(s, "table inet {TABLE} {{");
    for map in VerdictMap::ALL {
        let _ = write!(
            s,
            "\tmap {} {{\n\t\ttype {} : verdict\n",
            map.name(),
            map.key_type()
        );
        let elements = ruleset.maps.get(&map).filter(|m| !m.is_empty());
        if let Some(elements) = elements {
            s.push_str("\t\telements = {\n");
            for (ip, chain) in elements {
                let _ = writeln!(s, "\t\t\t{ip} : jump {chain},");
            }
            s.push_str("\t\t}\n");
        }
        s.push_str("\t}\n");
    }
    s.push_str(BASE_CHAINS);
    for (name, rules) in &ruleset.chains {
        let _ = writeln!(s, "\tchain {name} {{");
        for rule in rules.iter() {
            let _ = writeln!(s, "\t\t{rule}");
        }
        s.push_str("\t}\n");
    }
    s.push_str("}\n");
    s
}

/// Service traffic is matched after DNAT (prerouting/output dstnat runs first), so forward
/// sees the pod's address, never a ClusterIP. `ct state invalid` is not dropped: such a
/// packet falls through to the pod chains and passes only if the rules allow it as a first
/// packet, and other nodes' and pods' traffic is not this table's business.
///
/// IPv6 neighbor and router discovery pass before any pod chain: they are IPv6's ARP (which
/// an `inet` table never sees), conntrack does not track them, and a pod that cannot resolve
/// its gateway or its neighbors reaches nothing, allowed or not. Hop limit 255 is what RFC
/// 4861 requires of them and what no routed packet has: only on-link discovery passes.
const BASE_CHAINS: &str = "\
\t# Pod to pod and pod to outside, routed or bridged (br_netfilter) through this node.
\t# Service traffic arrives here after DNAT: addresses are pods', not ClusterIPs.
\tchain forward {
\t\ttype filter hook forward priority filter; policy accept;
\t\tct state established,related accept
\t\ticmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept
\t\tip saddr vmap @egress4
\t\tip6 saddr vmap @egress6
\t\tip daddr vmap @ingress4
\t\tip6 daddr vmap @ingress6
\t}
\t# Pod to its own node: the pod's egress policy applies. Node to pod goes through
\t# output, which this table leaves alone: traffic from the pod's node is always allowed.
\tchain input {
\t\ttype filter hook input priority filter; policy accept;
\t\tct state established,related accept
\t\ticmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept
\t\tip saddr vmap @egress4
\t\tip6 saddr vmap @egress6
\t}
";

/// The base chains and how many rules each holds (what a check of the kernel's table
/// expects besides the per-pod chains).
pub fn base_chains() -> Vec<(&'static str, usize)> {
    let mut out: Vec<(&'static str, usize)> = Vec::new();
    for line in BASE_CHAINS.lines().map(str::trim) {
        if let Some(name) = line
            .strip_prefix("chain ")
            .and_then(|l| l.strip_suffix(" {"))
        {
            out.push((name, 0));
        } else if !(line.is_empty()
            || line.starts_with('#')
            || line.starts_with("type ")
            || line == "}")
        {
            if let Some(last) = out.last_mut() {
                last.1 += 1;
            }
        }
    }
    out
}

/// Deletes the table (and nothing else) whether or not it exists: declaring it first makes
/// the delete valid on a node that never had it. One transaction.
pub fn render_cleanup() -> String {
    format!("table inet {TABLE}\ndelete table inet {TABLE}\n")
}

/// Order inside the transaction: new chains exist before elements jump to them; elements
/// that jump to a removed chain are deleted before it.
pub fn render_ruleset_diff(diff: &RulesetDiff) -> String {
    let mut s = String::new();
    let t = format!("inet {TABLE}");
    for (name, rules) in &diff.added_chains {
        let _ = writeln!(s, "add chain {t} {name}");
        for rule in rules.iter() {
            let _ = writeln!(s, "add rule {t} {name} {rule}");
        }
    }
    for (name, rules) in &diff.changed_chains {
        let _ = writeln!(s, "flush chain {t} {name}");
        for rule in rules.iter() {
            let _ = writeln!(s, "add rule {t} {name} {rule}");
        }
    }
    for (map, ips) in &diff.removed_elements {
        let list: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
        let _ = writeln!(
            s,
            "delete element {t} {} {{ {} }}",
            map.name(),
            list.join(", ")
        );
    }
    for (map, added) in &diff.added_elements {
        let list: Vec<String> = added
            .iter()
            .map(|(ip, chain)| format!("{ip} : jump {chain}"))
            .collect();
        let _ = writeln!(
            s,
            "add element {t} {} {{ {} }}",
            map.name(),
            list.join(", ")
        );
    }
    for name in &diff.removed_chains {
        let _ = writeln!(s, "delete chain {t} {name}");
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn base_chains_and_their_rules() {
        assert_eq!(super::base_chains(), vec![("forward", 6), ("input", 4)]);
    }
}
