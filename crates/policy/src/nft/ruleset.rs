//! A [`PolicyPlan`] as nftables objects: four verdict maps and one chain per isolated pod
//! and direction, each chain's rules as text. Comparing two of these gives the diff.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::names::{chain_name, comment, drop_comment};
use crate::key::ObjectKey;
use crate::model::{IpBlock, Protocol};
use crate::plan::{AllowRule, L4Match, PeerMatch, PolicyPlan, PortMatch, Program};

/// The verdict maps the base chains dispatch through, by pod address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VerdictMap {
    Ingress4,
    Ingress6,
    Egress4,
    Egress6,
}

impl VerdictMap {
    pub const ALL: [VerdictMap; 4] = [
        VerdictMap::Ingress4,
        VerdictMap::Ingress6,
        VerdictMap::Egress4,
        VerdictMap::Egress6,
    ];

    pub fn name(self) -> &'static str {
        match self {
            VerdictMap::Ingress4 => "ingress4",
            VerdictMap::Ingress6 => "ingress6",
            VerdictMap::Egress4 => "egress4",
            VerdictMap::Egress6 => "egress6",
        }
    }

    pub fn key_type(self) -> &'static str {
        match self {
            VerdictMap::Ingress4 | VerdictMap::Egress4 => "ipv4_addr",
            VerdictMap::Ingress6 | VerdictMap::Egress6 => "ipv6_addr",
        }
    }

    fn of(direction: Dir, ip: IpAddr) -> VerdictMap {
        match (direction, ip) {
            (Dir::Ingress, IpAddr::V4(_)) => VerdictMap::Ingress4,
            (Dir::Ingress, IpAddr::V6(_)) => VerdictMap::Ingress6,
            (Dir::Egress, IpAddr::V4(_)) => VerdictMap::Egress4,
            (Dir::Egress, IpAddr::V6(_)) => VerdictMap::Egress6,
        }
    }
}

/// What the table holds besides its fixed base chains.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ruleset {
    /// Pod address → the chain its packets jump to, per map.
    pub maps: BTreeMap<VerdictMap, BTreeMap<IpAddr, String>>,
    /// Per-pod chains by name: their rules, in order, as nft text (shared: a ruleset made
    /// after one change holds most chains of the one before).
    pub chains: BTreeMap<String, Arc<[String]>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Ingress,
    Egress,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Ingress => "ingress",
            Dir::Egress => "egress",
        }
    }

    /// The peer's address is the source for ingress, the destination for egress.
    fn peer_field(self) -> &'static str {
        match self {
            Dir::Ingress => "saddr",
            Dir::Egress => "daddr",
        }
    }

    /// Ingress is the last check, so it can accept. An egress chain runs first in the
    /// forward hook and must `return` so the destination's ingress chain still runs.
    fn allow(self) -> &'static str {
        match self {
            Dir::Ingress => "accept",
            Dir::Egress => "return",
        }
    }
}

impl Ruleset {
    pub fn from_plan(plan: &PolicyPlan) -> Ruleset {
        Ruleset::from_plan_after(plan, None)
    }

    /// [`Ruleset::from_plan`], taking the chains of every pod whose program is the same as
    /// in `previous` (a plan and the ruleset made from it) instead of writing them again:
    /// after one change most of a node's pods have the programs they had.
    pub fn from_plan_after(
        plan: &PolicyPlan,
        previous: Option<(&PolicyPlan, &Ruleset)>,
    ) -> Ruleset {
        let mut out = Ruleset {
            maps: VerdictMap::ALL
                .iter()
                .map(|m| (*m, BTreeMap::new()))
                .collect(),
            chains: BTreeMap::new(),
        };
        for (key, pod) in &plan.pods {
            for (dir, program) in [(Dir::Ingress, &pod.ingress), (Dir::Egress, &pod.egress)] {
                let Some(program) = program else { continue };
                let chain = chain_name(dir.name(), key);
                for ip in &pod.ips {
                    // Two pods claiming one address (stale state): the first by name keeps
                    // it. Only isolated pods get here, so an address never loses isolation.
                    let map = out.maps.entry(VerdictMap::of(dir, *ip)).or_default();
                    map.entry(*ip).or_insert_with(|| chain.clone());
                }
                let kept = previous
                    .filter(|(old_plan, _)| old_plan.pods.get(key) == Some(pod))
                    .and_then(|(_, old)| old.chains.get(&chain));
                let rules = match kept {
                    Some(rules) => rules.clone(),
                    None => chain_rules(key, &pod.ips, dir, program).into(),
                };
                out.chains.insert(chain, rules);
            }
        }
        out
    }
}

fn chain_rules(pod: &ObjectKey, ips: &[IpAddr], dir: Dir, program: &Program) -> Vec<String> {
    let mut rules = Vec::new();
    // "A pod cannot block access to itself" (hairpin through a Service reaches forward).
    for family in [Family::V4, Family::V6] {
        let own: Vec<IpNet> = ips
            .iter()
            .filter(|ip| family.holds(**ip))
            .map(|ip| IpNet::from(*ip))
            .collect();
        if !own.is_empty() {
            rules.push(format!(
                "{} {} {} {} {}",
                family.keyword(),
                dir.peer_field(),
                set(&own),
                dir.allow(),
                comment(&format!("{pod} itself"))
            ));
        }
    }
    for rule in &program.rules {
        rules.extend(rule_lines(rule, dir));
    }
    rules.push(format!(
        "drop {}",
        drop_comment(pod, dir.name(), &program.isolated_by)
    ));
    rules
}

/// One allow rule as nft rules: each address group × each protocol group.
fn rule_lines(rule: &AllowRule, dir: Dir) -> Vec<String> {
    let addresses = match &rule.peers {
        PeerMatch::Any => vec![String::new()],
        PeerMatch::Only(set) => address_matches(&set.ips, &set.blocks, dir),
    };
    let ports = match &rule.ports {
        PortMatch::Any => vec![String::new()],
        PortMatch::Only(l4) => port_matches(l4),
    };
    let tail = format!("{} {}", dir.allow(), comment(&rule.policy.to_string()));
    let mut out = Vec::new();
    for a in &addresses {
        for p in &ports {
            let mut line = String::new();
            for part in [a.as_str(), p.as_str(), tail.as_str()] {
                if !part.is_empty() {
                    if !line.is_empty() {
                        line.push(' ');
                    }
                    line.push_str(part);
                }
            }
            out.push(line);
        }
    }
    out
}

#[derive(Clone, Copy)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn holds(self, ip: IpAddr) -> bool {
        matches!(
            (self, ip),
            (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_))
        )
    }

    fn keyword(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }
}

/// Per family: one set of the exact IPs and the blocks without exceptions, then one rule per
/// block with exceptions (`!=` its own set, so an exception narrows only its own block).
fn address_matches(ips: &[IpAddr], blocks: &[IpBlock], dir: Dir) -> Vec<String> {
    let mut out = Vec::new();
    for family in [Family::V4, Family::V6] {
        let field = format!("{} {}", family.keyword(), dir.peer_field());
        let mut plain: Vec<IpNet> = ips
            .iter()
            .filter(|ip| family.holds(**ip))
            .map(|ip| IpNet::from(*ip))
            .collect();
        let mut narrowed = Vec::new();
        for block in blocks.iter().filter(|b| family.holds(b.cidr.addr())) {
            let except: Vec<IpNet> = block
                .except
                .iter()
                .filter(|e| family.holds(e.addr()))
                .copied()
                .collect();
            if except.is_empty() {
                plain.push(block.cidr);
            } else {
                narrowed.push(format!(
                    "{field} {} {field} != {}",
                    block.cidr,
                    set(&except)
                ));
            }
        }
        if !plain.is_empty() {
            out.push(format!("{field} {}", set(&plain)));
        }
        out.extend(narrowed);
    }
    out
}

/// Per protocol: `meta l4proto P` when every port is allowed, else `P dport { ... }`.
fn port_matches(l4: &[L4Match]) -> Vec<String> {
    let mut out = Vec::new();
    for protocol in Protocol::ALL {
        let name = match protocol {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        };
        let of_protocol: Vec<&L4Match> = l4.iter().filter(|m| m.protocol == protocol).collect();
        if of_protocol.is_empty() {
            continue;
        }
        if of_protocol.iter().any(|m| m.ports.is_none()) {
            out.push(format!("meta l4proto {name}"));
            continue;
        }
        let mut text = format!("{name} dport {{ ");
        for (i, (first, last)) in of_protocol.iter().filter_map(|m| m.ports).enumerate() {
            if i > 0 {
                text.push_str(", ");
            }
            if first == last {
                let _ = write!(text, "{first}");
            } else {
                let _ = write!(text, "{first}-{last}");
            }
        }
        text.push_str(" }");
        out.push(text);
    }
    out
}

/// An anonymous set; single addresses without their /32 or /128.
fn set(nets: &[IpNet]) -> String {
    let items: Vec<String> = nets
        .iter()
        .map(|n| {
            if n.prefix_len() == n.max_prefix_len() {
                n.addr().to_string()
            } else {
                n.to_string()
            }
        })
        .collect();
    format!("{{ {} }}", items.join(", "))
}
