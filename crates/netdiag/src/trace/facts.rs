//! Facts a verdict can depend on that a dump may not hold (a sysctl, a route table): the walk
//! asks for them through [`Walker::fact`], which answers from the dump when it can and
//! otherwise records the question. [`super::trace`] then walks again for every other value the
//! question could have had, and when the answers differ the verdict is conditional: one
//! [`Branch`](super::Branch) per outcome, each with the values that lead to it, and the file that settles it.

use std::collections::{BTreeMap, BTreeSet};

use super::packet::{Condition, Fact, Trace};
use super::walker::Walker;

impl Walker<'_> {
    /// The value of `f`: from the dump when it pins it, else the value this walk was told to
    /// take (or the first possible one), recorded as asked.
    pub(super) fn fact(&mut self, f: Fact) -> i64 {
        let options = self.fact_options(&f);
        if options.len() == 1 {
            return options[0];
        }
        let v = self.forced.get(&f).copied().unwrap_or(options[0]);
        if !self.asked.iter().any(|(g, _)| *g == f) {
            self.asked.push((f, v));
        }
        v
    }

    /// Every value `f` can have given what the dump says.
    pub(super) fn fact_options(&self, f: &Fact) -> Vec<i64> {
        let s = self.st.sysctls.as_ref();
        let conf = |iface: &str, name: &str| s.and_then(|s| s.conf("ipv4", iface, name));
        let set = |v: BTreeSet<i64>| v.into_iter().collect::<Vec<_>>();
        match f {
            Fact::RpFilter(i) => {
                let all = conf("all", "rp_filter")
                    .map(|v| vec![v])
                    .unwrap_or(vec![0, 1, 2]);
                let one = conf(i, "rp_filter")
                    .map(|v| vec![v])
                    .unwrap_or(vec![0, 1, 2]);
                set(all
                    .iter()
                    .flat_map(|a| one.iter().map(move |b| *a.max(b)))
                    .collect())
            }
            Fact::SrcValidMark(i) => {
                let all = conf("all", "src_valid_mark").map(|v| vec![(v != 0) as i64]);
                let one = conf(i, "src_valid_mark").map(|v| vec![(v != 0) as i64]);
                let all = all.unwrap_or(vec![0, 1]);
                let one = one.unwrap_or(vec![0, 1]);
                set(all
                    .iter()
                    .flat_map(|a| one.iter().map(move |b| *a.max(b)))
                    .collect())
            }
            Fact::IpForward | Fact::Ip6Forward => {
                let key = if *f == Fact::IpForward {
                    "net.ipv4.ip_forward"
                } else {
                    "net.ipv6.conf.all.forwarding"
                };
                match s.and_then(|s| s.int(key)) {
                    Some(v) => vec![(v != 0) as i64],
                    None => vec![1, 0],
                }
            }
            Fact::BrNetfilter | Fact::BrNetfilter6 => match s {
                Some(s) => match s.int(if *f == Fact::BrNetfilter {
                    "net.bridge.bridge-nf-call-iptables"
                } else {
                    "net.bridge.bridge-nf-call-ip6tables"
                }) {
                    Some(v) => vec![(v != 0) as i64],
                    // A whole `sysctl -a` (or weir's cut of it, which keeps every
                    // net.bridge.* key) without the key: the module is not loaded.
                    None if self.st.sysctls_whole()
                        && !s.0.keys().any(|k| k.starts_with("net.bridge.")) =>
                    {
                        vec![0]
                    }
                    None => vec![1, 0],
                },
                None => vec![1, 0],
            },
            Fact::Table(_) => {
                if self.st.routes.is_none() || self.st.has_all_tables() {
                    vec![0]
                } else {
                    vec![0, 1]
                }
            }
            // Asked only for a chain the dump lacks, or rules a cut paste lacks.
            Fact::Chain(_) | Fact::Unseen(_) => vec![0, 1],
            // Asked only without routes, for an address not known to be local: with the whole
            // `ip addr` or table local it is known not to be.
            Fact::Route(_) if self.st.addresses_complete() || self.st.has_table_local() => {
                vec![1]
            }
            Fact::Route(_) => vec![1, 0],
        }
    }

    /// Why `f` is unknown.
    pub(super) fn unknown_why(&self, f: &Fact) -> String {
        let Some(s) = &self.st.sysctls else {
            return match f {
                Fact::Table(t) => format!(
                    "the routes are main only (`ip route list`): table {t} is not in the dump"
                ),
                Fact::Unseen(c) => {
                    format!("the paste was cut (grep, no table header, or cut short): {c} is not in it whole")
                }
                Fact::Chain(c) => {
                    format!("a shown rule jumps to {c}, whose rules are not in the paste")
                }
                Fact::Route(d) => format!("no routes were pasted: where {d} goes is not shown"),
                _ => "no sysctl output in the dump".into(),
            };
        };
        match f {
            Fact::RpFilter(i) => format!(
                "sysctl output without {}",
                [("all", "rp_filter"), (i.as_str(), "rp_filter")]
                    .iter()
                    .map(|(i, n)| crate::sysctl::Sysctls::conf_key("ipv4", i, n))
                    .filter(|k| s.get(k).is_none())
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            Fact::SrcValidMark(i) => {
                format!("sysctl output without net.ipv4.conf.{{all,{i}}}.src_valid_mark")
            }
            Fact::IpForward => "sysctl output without net.ipv4.ip_forward".into(),
            Fact::Ip6Forward => "sysctl output without net.ipv6.conf.all.forwarding".into(),
            Fact::BrNetfilter => {
                "a short sysctl paste without net.bridge.bridge-nf-call-iptables".into()
            }
            Fact::BrNetfilter6 => {
                "a short sysctl paste without net.bridge.bridge-nf-call-ip6tables".into()
            }
            Fact::Table(t) => {
                format!("the routes are main only (`ip route list`): table {t} is not in the dump")
            }
            Fact::Unseen(c) => {
                format!("the paste was cut (grep, no table header, or cut short): {c} is not in it whole")
            }
            Fact::Chain(c) => {
                format!("a shown rule jumps to {c}, whose rules are not in the paste")
            }
            Fact::Route(d) => format!("no routes were pasted: where {d} goes is not shown"),
        }
    }
}

/// One walk's outcome and the facts it asked for, with the values it took.
pub(super) struct Leaf {
    pub(super) trace: Trace,
    pub(super) asked: Vec<(Fact, i64)>,
}

/// A conjunction of conditions: each fact constrained to a set of values (a fact absent is
/// any value).
type Cube = BTreeMap<Fact, BTreeSet<i64>>;

fn intersects(a: &Cube, b: &Cube) -> bool {
    a.iter().all(|(f, va)| {
        b.get(f)
            .is_none_or(|vb| va.intersection(vb).next().is_some())
    })
}

/// Groups leaves by outcome and describes each group as few conditions as it can: every leaf is
/// a cube of the values it took (a fact it did not ask about is any value); each cube is widened
/// fact by fact while it meets no other outcome's leaf, cubes that differ in one fact are merged,
/// and a fact left with every value it was seen with is dropped. The result, a disjunction of
/// conjunctions, covers the group's leaves and no other group's.
pub(super) fn branches(leaves: &[Leaf]) -> Vec<(Vec<usize>, Vec<Vec<Condition>>, String)> {
    // (verdict, cause) → the leaves with that outcome.
    type Outcome = (String, Option<String>);
    let key = |t: &Trace| (format!("{:?}", t.verdict), t.cause.clone());
    let mut groups: Vec<(Outcome, Vec<usize>)> = Vec::new();
    for (i, l) in leaves.iter().enumerate() {
        let k = key(&l.trace);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(i),
            None => groups.push((k, vec![i])),
        }
    }
    let cube_of = |l: &Leaf| -> Cube {
        l.asked
            .iter()
            .map(|(f, v)| (f.clone(), BTreeSet::from([*v])))
            .collect()
    };
    let mut seen: Cube = BTreeMap::new();
    for l in leaves {
        for (f, v) in &l.asked {
            seen.entry(f.clone()).or_default().insert(*v);
        }
    }
    let mut out = Vec::new();
    for (_, members) in &groups {
        let others: Vec<Cube> = leaves
            .iter()
            .enumerate()
            .filter(|(j, _)| !members.contains(j))
            .map(|(_, l)| cube_of(l))
            .collect();
        let clear = |c: &Cube| !others.iter().any(|o| intersects(c, o));
        // Widen each leaf's cube.
        let mut cubes: Vec<Cube> = Vec::new();
        for &i in members {
            let mut c = cube_of(&leaves[i]);
            let facts: Vec<Fact> = c.keys().cloned().collect();
            for f in facts {
                let mut wider = c.clone();
                wider.remove(&f);
                if clear(&wider) {
                    c = wider;
                }
            }
            if !cubes.contains(&c) {
                cubes.push(c);
            }
        }
        // Merge cubes that differ in one fact's values only, until none do.
        loop {
            let mut merged = None;
            'find: for a in 0..cubes.len() {
                for b in a + 1..cubes.len() {
                    let (ca, cb) = (&cubes[a], &cubes[b]);
                    if ca.len() != cb.len() || ca.keys().ne(cb.keys()) {
                        continue;
                    }
                    let differ: Vec<&Fact> = ca
                        .iter()
                        .filter(|(f, v)| cb.get(*f) != Some(v))
                        .map(|(f, _)| f)
                        .collect();
                    if differ.len() <= 1 {
                        let mut m = ca.clone();
                        if let Some(f) = differ.first() {
                            let u: BTreeSet<i64> = ca[*f].union(&cb[*f]).copied().collect();
                            m.insert((*f).clone(), u);
                        }
                        merged = Some((a, b, m));
                        break 'find;
                    }
                }
            }
            let Some((a, b, m)) = merged else { break };
            cubes.remove(b);
            cubes[a] = m;
        }
        // Drop subsumed cubes, and facts left with every value seen.
        let snapshot = cubes.clone();
        cubes.retain(|c| {
            !snapshot.iter().any(|d| {
                d != c
                    && d.iter()
                        .all(|(f, vd)| c.get(f).is_some_and(|vc| vc.is_subset(vd)))
            })
        });
        for c in &mut cubes {
            c.retain(|f, v| seen.get(f) != Some(v));
        }
        let describe = |c: &Cube| {
            c.iter()
                .map(|(f, v)| f.describe(v))
                .collect::<Vec<_>>()
                .join(" and ")
        };
        let conds: Vec<Vec<Condition>> = cubes
            .iter()
            .map(|c| {
                c.iter()
                    .map(|(f, v)| Condition {
                        fact: f.clone(),
                        values: v.iter().copied().collect(),
                    })
                    .collect()
            })
            .collect();
        let text = cubes.iter().map(describe).collect::<Vec<_>>().join("; or ");
        out.push((members.clone(), conds, text));
    }
    out
}
