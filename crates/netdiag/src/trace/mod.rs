//! `weir trace`: one IPv4 or IPv6 packet (the first of a new connection) walked through a node's
//! state the way the kernel would, then its reply on the way back.
//!
//! The path (net/ipv4/ip_input.c, ip_forward.c, ip_output.c): PREROUTING (raw −300, mangle −150,
//! dstnat −100, nft chains by priority), the routing decision with policy rules and marks and
//! the reverse-path check (`fib_validate_source`: a lookup of the route back to the source, with
//! the packet's mark only under `src_valid_mark`), then INPUT (local delivery) or FORWARD
//! (filter), and POSTROUTING (srcnat +100: MASQUERADE takes the outgoing interface's primary
//! address, `inet_select_addr`). The reply comes back with conntrack's reverse NAT: its
//! destination is restored (de-SNAT) before routing, so its reverse-path check looks up the
//! route to the backend *from the original client*.
//!
//! IPVS virtual servers are taken at LOCAL_IN and LOCAL_OUT ([`ipvs_walk`]); ipset matches
//! are looked up in `ipset list`/`save` output ([`sets`]). A packet the node sends itself
//! (`iif` [`LOCAL`]) takes the OUTPUT path ([`output`]).
//!
//! An IPv6 packet takes the same path through ip6tables and nft's `ip6`/`inet` chains, routed
//! by `ip -6 rule`/`route`; it has no rp_filter, only reverse-path rules ([`rpfilter`], which
//! also serves IPv4's `-m rpfilter` and `fib saddr … oif`), and neighbour discovery is assumed
//! to work (said in the assumptions).
//!
//! What it models and what it assumes is said in [`Trace::assumptions`]; rules it cannot
//! evaluate (match modules it does not know, sets missing from the input) count as not
//! matching, and are named there.

mod capture;
mod connection;
mod facts;
mod hooks;
mod iptables_walk;
mod ipvs_walk;
mod nat;
mod nft_choices;
mod nft_nat;
mod nft_walk;
mod output;
mod packet;
mod path;
mod policy;
mod render;
mod reply;
mod routing;
mod rpfilter;
mod sets;
mod walker;

use std::collections::{BTreeMap, BTreeSet};

use crate::state::NodeState;

pub use connection::{along_entry, pasted_entry};
use packet::Pkt;
pub use packet::{
    Branch, Condition, Egress, EndpointOutcome, Fact, Hop, Packet, PolicyDecision, PolicyVerdict,
    Proto, Trace, Unknown, Verdict, LOCAL,
};
pub use render::{render, svg};
use walker::{ChoicePoints, Walker};

/// Walks at most this many combinations of unknown facts.
const MAX_WALKS: usize = 64;

/// Walks at most this many endpoints of the rules' choices (per combination of facts).
const MAX_ENDPOINTS: usize = 32;

/// One walk to one endpoint: its label (the endpoints chosen, ` then ` between choices in a
/// row; empty without a choice), the trace and the facts it asked.
struct EndpointWalk {
    label: String,
    trace: Trace,
    asked: Vec<(Fact, i64)>,
}

/// Runs the walk. Where the rules choose among endpoints (a statistic cascade, a numgen map,
/// IPVS real servers), every endpoint is walked: the verdict is delivered only when every
/// endpoint's is, and [`Trace::endpoint_outcomes`] has each one's. Where the verdict depends
/// on a fact the dump lacks (a sysctl, a route table), the packet is walked once per value the
/// fact could have, and when the outcomes differ the verdict is [`Verdict::Conditional`]:
/// [`Trace::branches`] gives each outcome with the values that lead to it, [`Trace::unknowns`]
/// the facts and the files that settle them, and the hops, cause and fixes are those of the
/// first branch that fails. The two combine: each combination of facts walks every endpoint,
/// and each endpoint's outcome may itself be conditional.
pub fn trace(st: &NodeState, packet: &Packet) -> Trace {
    let mut leaves: Vec<facts::Leaf> = Vec::new();
    let mut per_leaf: Vec<Vec<EndpointWalk>> = Vec::new();
    let mut queue: Vec<BTreeMap<Fact, i64>> = vec![BTreeMap::new()];
    let mut truncated = false;
    let mut endpoints_cut = false;
    while let Some(forced) = queue.pop() {
        if leaves.len() >= MAX_WALKS {
            truncated = true;
            break;
        }
        let (walks, cut) = walk_endpoints(st, packet, &forced);
        endpoints_cut |= cut;
        // The facts any endpoint's walk asked, in the order first asked.
        let mut asked: Vec<(Fact, i64)> = Vec::new();
        for w in &walks {
            for (f, v) in &w.asked {
                if !asked.iter().any(|(g, _)| g == f) {
                    asked.push((f.clone(), *v));
                }
            }
        }
        let t = combine(&walks);
        // Every other value of each fact asked here (the ones before it kept as taken).
        let mut next = Vec::new();
        for (i, (f, v)) in asked.iter().enumerate() {
            if forced.contains_key(f) {
                continue;
            }
            let options = fact_options(st, f);
            for alt in options.into_iter().filter(|o| o != v) {
                let mut nf = forced.clone();
                for (pf, pv) in &asked[..i] {
                    nf.insert(pf.clone(), *pv);
                }
                nf.insert(f.clone(), alt);
                next.push(nf);
            }
        }
        // Depth first, in the order the facts were asked.
        queue.extend(next.into_iter().rev());
        leaves.push(facts::Leaf { trace: t, asked });
        per_leaf.push(walks);
    }
    let mut t = conclude(st, &leaves);
    // Each endpoint's own outcome over the same combinations of facts.
    let mut labels: Vec<String> = Vec::new();
    for walks in &per_leaf {
        for w in walks {
            if !labels.contains(&w.label) {
                labels.push(w.label.clone());
            }
        }
    }
    if per_leaf.iter().any(|w| w.len() > 1) {
        for label in labels {
            let mine: Vec<facts::Leaf> = per_leaf
                .iter()
                .flatten()
                .filter(|w| w.label == label)
                .map(|w| facts::Leaf {
                    trace: w.trace.clone(),
                    asked: w.asked.clone(),
                })
                .collect();
            let e = conclude(st, &mine);
            t.endpoint_outcomes.push(EndpointOutcome {
                endpoint: label,
                verdict: e.verdict,
                cause: e.cause,
                fixes: e.fixes,
                branches: e.branches,
                egress: e.egress,
                hops: e.hops,
                policy: e.policy,
            });
        }
    }
    if endpoints_cut {
        t.assumptions.push(format!(
            "more than {MAX_ENDPOINTS} endpoints to choose from: only the first {MAX_ENDPOINTS} walked"
        ));
    }
    if truncated {
        t.assumptions.push(format!(
            "more than {MAX_WALKS} combinations of unknown facts: only the first {MAX_WALKS} walked"
        ));
    }
    // A pasted capture, where it shows an interface the walk passes: evidence, last.
    let seen = capture::hops(st, &t);
    t.hops.extend(seen);
    t
}

/// The verdict of a set of walks (one per combination of the facts they asked): one outcome,
/// or a conditional one with its branches; the unknown facts that mattered, and those that
/// did not as an assumption.
fn conclude(st: &NodeState, leaves: &[facts::Leaf]) -> Trace {
    let groups = facts::branches(leaves);
    let first = leaves.first().map(|l| l.trace.clone()).expect("one walk");
    let mut unknowns: Vec<Unknown> = Vec::new();
    let probe = Walker::new(st, BTreeMap::new());
    let mut mattered: BTreeSet<Fact> = BTreeSet::new();
    if groups.len() > 1 {
        for (_, conds, _) in &groups {
            for c in conds.iter().flatten() {
                mattered.insert(c.fact.clone());
            }
        }
        if mattered.is_empty() {
            // Outcomes differ, so some fact matters; should none be named, name them all.
            for l in leaves {
                for (f, _) in &l.asked {
                    mattered.insert(f.clone());
                }
            }
        }
    }
    let asked_all: BTreeSet<Fact> = leaves
        .iter()
        .flat_map(|l| l.asked.iter().map(|(f, _)| f.clone()))
        .collect();
    for f in &mattered {
        unknowns.push(Unknown {
            fact: f.clone(),
            why: probe.unknown_why(f),
            settle: f.settle(),
        });
    }
    let idle: Vec<String> = asked_all
        .iter()
        .filter(|f| !mattered.contains(*f))
        .map(|f| f.describe(&fact_options(st, f).into_iter().collect()))
        .collect();
    let mut t = if groups.len() <= 1 {
        first
    } else {
        // The path shown is a failing branch: the one needing the least unusual values
        // (ip_forward 0 is rare on a node that runs pods at all), then the one going furthest.
        let cost = |l: &facts::Leaf| -> usize {
            l.asked
                .iter()
                .map(|(f, v)| {
                    let rank = fact_options(st, f).iter().position(|o| o == v).unwrap_or(0);
                    if matches!(f, Fact::IpForward | Fact::Ip6Forward) {
                        rank * 2
                    } else {
                        rank
                    }
                })
                .sum()
        };
        let shown = leaves
            .iter()
            .enumerate()
            .filter(|(_, l)| l.trace.verdict != Verdict::Delivered)
            .min_by_key(|(i, l)| (cost(l), std::cmp::Reverse(l.trace.hops.len()), *i))
            .map(|(i, _)| i)
            .unwrap_or(0);
        let mut t = leaves[shown].trace.clone();
        t.branches = groups
            .iter()
            .map(|(m, conds, text)| {
                let lt = &leaves[m[0]].trace;
                Branch {
                    when: conds.clone(),
                    when_text: text.clone(),
                    verdict: lt.verdict.clone(),
                    cause: lt.cause.clone(),
                    fixes: lt.fixes.clone(),
                }
            })
            .collect();
        // Unknown every way the dump leaves open: unknown, with each way's cause as a branch.
        t.verdict = if leaves.iter().all(|l| l.trace.verdict == Verdict::Unknown) {
            Verdict::Unknown
        } else {
            Verdict::Conditional
        };
        // Assumptions of every branch (a branch's own notes name its path).
        let mut all: BTreeSet<String> = BTreeSet::new();
        for l in leaves {
            all.extend(l.trace.assumptions.iter().cloned());
        }
        t.assumptions = all.into_iter().collect();
        t
    };
    t.unknowns = unknowns;
    if !idle.is_empty() {
        t.assumptions.push(format!(
            "not in the dump but without effect on this verdict (walked every way): {}",
            idle.join("; ")
        ));
    }
    t
}

/// Every endpoint the rules may choose, walked with the given values for unknown facts: the
/// first walk takes the first option of each choice it meets, and each other option of each
/// choice is walked again (the choices before it kept), depth first. True when there were
/// more than [`MAX_ENDPOINTS`].
fn walk_endpoints(
    st: &NodeState,
    packet: &Packet,
    forced: &BTreeMap<Fact, i64>,
) -> (Vec<EndpointWalk>, bool) {
    let mut out = Vec::new();
    let mut queue: Vec<Vec<usize>> = vec![Vec::new()];
    while let Some(picks) = queue.pop() {
        if out.len() >= MAX_ENDPOINTS {
            return (out, true);
        }
        let (trace, asked, points) = walk_once(st, packet, forced.clone(), &picks);
        // Popped in the rules' order: a deeper choice's options before a shallower one's
        // next option, each choice's options in order.
        for (k, (options, _)) in points.iter().enumerate().skip(picks.len()) {
            for alt in (1..*options).rev() {
                let mut np = picks.clone();
                np.resize(k, 0);
                np.push(alt);
                queue.push(np);
            }
        }
        let label = points
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join(" then ");
        out.push(EndpointWalk {
            label,
            trace,
            asked,
        });
    }
    (out, false)
}

/// The walks to every endpoint as one: delivered when every one is; otherwise the failing
/// ones counted and named in the cause, their fixes, and the first failing one's path.
fn combine(walks: &[EndpointWalk]) -> Trace {
    if walks.len() == 1 {
        return walks[0].trace.clone();
    }
    let mut choices: Vec<String> = Vec::new();
    let mut assumptions: BTreeSet<String> = BTreeSet::new();
    let mut fixes: Vec<String> = Vec::new();
    for w in walks {
        for c in &w.trace.choices {
            if !choices.contains(c) {
                choices.push(c.clone());
            }
        }
        assumptions.extend(w.trace.assumptions.iter().cloned());
    }
    let failing: Vec<&EndpointWalk> = walks
        .iter()
        .filter(|w| w.trace.verdict != Verdict::Delivered)
        .collect();
    let verdict = [Verdict::Dropped, Verdict::Unknown, Verdict::Rejected]
        .into_iter()
        .find(|v| failing.iter().any(|w| w.trace.verdict == *v));
    let mut t = match &verdict {
        None => walks[0].trace.clone(),
        Some(v) => {
            let shown = failing
                .iter()
                .find(|w| w.trace.verdict == *v)
                .expect("a failing walk");
            let mut t = shown.trace.clone();
            for w in &failing {
                for f in &w.trace.fixes {
                    if !fixes.contains(f) {
                        fixes.push(f.clone());
                    }
                }
            }
            t.cause = Some(format!(
                "{} of {} endpoints delivered; {}",
                walks.len() - failing.len(),
                walks.len(),
                failing
                    .iter()
                    .map(|w| format!(
                        "{}: {}: {}",
                        w.label,
                        render::verdict_word(&w.trace.verdict),
                        w.trace.cause.as_deref().unwrap_or("")
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
            t.fixes = fixes;
            t
        }
    };
    t.choices = choices;
    t.assumptions = assumptions.into_iter().collect();
    t
}

fn fact_options(st: &NodeState, f: &Fact) -> Vec<i64> {
    Walker::new(st, BTreeMap::new()).fact_options(f)
}

/// One walk with the given values for unknown facts and options of the rules' choices (by
/// the order the walk meets them; the first option where none is given): the trace, the facts
/// it asked, and each choice it met.
fn walk_once(
    st: &NodeState,
    packet: &Packet,
    forced: BTreeMap<Fact, i64>,
    picks: &[usize],
) -> (Trace, Vec<(Fact, i64)>, ChoicePoints) {
    let mut w = Walker::new(st, forced);
    w.picks = picks.to_vec();
    w.note_missing(packet.is_v6());
    w.parse_sets_and_ipvs();
    let mut p = Pkt {
        src: packet.src,
        dst: packet.dst,
        sport: packet.sport,
        dport: packet.dport,
        proto: packet.proto,
        iif: w.ip_iif(&packet.iif),
        oif: None,
        mark: 0,
        ct_mark: 0,
        ct_state: "new",
        dnat: false,
        nat_bound: false,
        skip_nat: false,
    };
    let walked = if packet.originates_here() {
        w.output_and_reply(&mut p)
    } else {
        w.request_and_reply(&mut p)
    };
    // Without any firewall output the filter chains are not shown passing it: not delivered.
    let no_rules = st.nft.is_none()
        && if packet.is_v6() {
            st.ip6tables.is_none()
        } else {
            st.iptables.is_none()
        };
    let (verdict, cause, fixes) = match walked {
        Ok(()) if no_rules => (
            Verdict::Unknown,
            Some(format!(
                "no firewall rules were pasted: whether the filter chains pass it is not shown; settle it with `{}` or `nft list ruleset`",
                if packet.is_v6() { "ip6tables-save" } else { "iptables-save" }
            )),
            Vec::new(),
        ),
        Ok(()) => (Verdict::Delivered, None, Vec::new()),
        Err((cause, fixes)) if w.unknown_outcome => (Verdict::Unknown, Some(cause), fixes),
        Err((cause, fixes)) if w.rejected => (Verdict::Rejected, Some(cause), fixes),
        Err((cause, fixes)) => (Verdict::Dropped, Some(cause), fixes),
    };
    let asked = std::mem::take(&mut w.asked);
    (
        Trace {
            packet: packet.clone(),
            hops: w.hops,
            verdict,
            cause,
            fixes,
            choices: w.choices,
            endpoints: w.endpoints,
            egress: w.egress,
            assumptions: w.assumptions.into_iter().collect(),
            branches: Vec::new(),
            unknowns: Vec::new(),
            endpoint_outcomes: Vec::new(),
            policy: w.policy,
        },
        asked,
        w.points,
    )
}
