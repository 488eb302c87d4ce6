//! The nftables walk: a chain's rules, expressions, maps and verdicts.

use std::net::IpAddr;

use serde_json::Value;

use crate::nft::{self, Ruleset};

use super::packet::{Fact, Flow, Pkt, Proto};
use super::walker::{cidr_contains, parse_num, Walker};

impl Walker<'_> {
    /// Runs an nft chain.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nft_chain(
        &mut self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        chain: &str,
        p: &mut Pkt,
        stage: &str,
        depth: usize,
    ) -> Flow {
        if depth > 16 {
            return Flow::Return;
        }
        let at = ChainAt {
            rs,
            family,
            table,
            chain,
            stage,
            depth,
            place: format!("nft {family} {table} {chain}"),
            policy_table: super::policy::is_policy_table(family, table),
        };
        let rules: Vec<nft::Rule> = rs
            .rules
            .iter()
            .filter(|r| r.family == family && r.table == table && r.chain == chain)
            .cloned()
            .collect();
        // The rule taken in a cascade of `numgen random mod N == k` rules (each of its options
        // is walked in turn).
        let mut cascade: Option<usize> = None;
        for (ri, r) in rules.iter().enumerate() {
            for e in &r.expr {
                let Some((k, v)) = e.as_object().and_then(|o| o.iter().next()) else {
                    continue;
                };
                let next = match k.as_str() {
                    "match" => self.nft_match_expr(&at, &rules, ri, &mut cascade, v, p),
                    _ => self.nft_statement(&at, (ri, r), k, v, p),
                };
                match next {
                    Next::Expr => {}
                    Next::Rule => break,
                    Next::Done(flow) => return flow,
                }
            }
        }
        self.nft_after_cut(&at)
    }

    /// The end of a chain's shown rules: where the paste ends inside the chain, its later rules
    /// may be for the packet (a fact: if one is, the outcome is unknown).
    fn nft_after_cut(&mut self, at: &ChainAt) -> Flow {
        let name = format!("{} {} {}", at.family, at.table, at.chain);
        if !at.rs.cut.contains(&name) {
            return Flow::Return;
        }
        if self.fact(Fact::Unseen(format!("nft {name}"))) == 0 {
            return Flow::Return;
        }
        self.hop(
            at.stage,
            at.place.clone(),
            None,
            "the paste ends inside this chain: taken to have a later rule for the packet",
        );
        Flow::Unknown(format!(
            "{}: the paste ends inside {}: what its later rules do to the packet is unknown; settle it with the whole `nft list ruleset`",
            at.stage, at.place
        ))
    }

    /// A `match` expression: on a miss the next rule; a hit on a `numgen` cascade walks one
    /// rule of the cascade (chosen once, at its first rule) and passes over the others.
    fn nft_match_expr(
        &mut self,
        at: &ChainAt,
        rules: &[nft::Rule],
        ri: usize,
        cascade: &mut Option<usize>,
        v: &Value,
        p: &mut Pkt,
    ) -> Next {
        match self.nft_match(at.rs, at.family, at.table, v, p) {
            Some(true) if is_numgen_match(v) => match *cascade {
                Some(taken) if taken != ri => Next::Rule,
                Some(_) => Next::Expr,
                None => {
                    let options = self.one_of_nft(&rules[ri..]);
                    let taken = ri + self.choose(options);
                    *cascade = Some(taken);
                    if taken != ri {
                        Next::Rule
                    } else {
                        Next::Expr
                    }
                }
            },
            Some(true) => Next::Expr,
            _ => Next::Rule,
        }
    }

    /// Any expression but `match`: verdicts, jumps, marks, NAT, verdict maps.
    fn nft_statement(
        &mut self,
        at: &ChainAt,
        (ri, r): (usize, &nft::Rule),
        k: &str,
        v: &Value,
        p: &mut Pkt,
    ) -> Next {
        let (rs, family, table, stage, place) = (at.rs, at.family, at.table, at.stage, &at.place);
        match k {
            "counter" | "log" | "limit" | "notrack" => Next::Expr,
            // `update @set { ip saddr }` (affinity): records, changes nothing now.
            "set" => Next::Expr,
            "accept" | "drop" => Next::Done(self.nft_accept_or_drop(at, (ri, r), k, p)),
            "reject" => {
                self.rejected = true;
                let note = format!("rejected{}", nft_counters(at.chain, ri, r));
                self.hop(stage, place.clone(), Some(r.text.clone()), note);
                Next::Done(Flow::Drop(r.text.clone()))
            }
            "return" => {
                if at.policy_table {
                    self.policy_verdict(rs, at.chain, r, "return", p, stage, place);
                }
                Next::Done(Flow::Return)
            }
            "jump" | "goto" => {
                let target = v["target"].as_str().unwrap_or_default().to_string();
                if !has_chain(rs, family, table, &target) {
                    let at = [family, table, stage, place.as_str()];
                    return match self.nft_missing_chain(at, &r.text, k, &target) {
                        Some(flow) => Next::Done(flow),
                        None => Next::Expr,
                    };
                }
                self.hop(
                    stage,
                    place.clone(),
                    Some(r.text.clone()),
                    format!("{k} {target}"),
                );
                match self.nft_chain(rs, family, table, &target, p, stage, at.depth + 1) {
                    Flow::Return if k == "goto" => Next::Done(Flow::Return),
                    Flow::Return => Next::Expr,
                    other => Next::Done(other),
                }
            }
            "mangle" => self.nft_mangle(at, r, v, p),
            "dnat" => {
                if !self.nft_dnat(rs, family, table, k, v, p, &r.text) {
                    return Next::Rule;
                }
                self.dnat_hop(p, "DNAT", stage, place, &r.text);
                Next::Done(Flow::Accept)
            }
            "redirect" => {
                self.redirect(v.get("port").and_then(Value::as_u64), p);
                self.dnat_hop(p, "redirect", stage, place, &r.text);
                Next::Done(Flow::Accept)
            }
            "snat" => {
                let to = v.get("addr").and_then(Value::as_str);
                self.snat(p, to.and_then(|a| a.parse().ok()), stage, place, &r.text);
                Next::Done(Flow::Accept)
            }
            "masquerade" => {
                self.masquerade(p, "masquerade", stage, place, &r.text);
                Next::Done(Flow::Accept)
            }
            "vmap" => self.nft_vmap_statement(at, r, v, p),
            other => {
                self.assume(format!(
                    "nft expression {other} not modelled: rule passed over (`{}`)",
                    r.text
                ));
                Next::Rule
            }
        }
    }

    /// `accept` / `drop`: a NetworkPolicy table's verdict is told as the policy's, any other
    /// as the rule's.
    fn nft_accept_or_drop(
        &mut self,
        at: &ChainAt,
        (ri, r): (usize, &nft::Rule),
        k: &str,
        p: &mut Pkt,
    ) -> Flow {
        let told =
            at.policy_table && self.policy_verdict(at.rs, at.chain, r, k, p, at.stage, &at.place);
        let (note, flow) = match k {
            "accept" => ("accepted", Flow::Accept),
            _ => ("dropped", Flow::Drop(r.text.clone())),
        };
        if !told {
            let note = format!("{note}{}", nft_counters(at.chain, ri, r));
            self.hop(at.stage, at.place.clone(), Some(r.text.clone()), note);
        }
        flow
    }

    /// A jump to a chain the paste does not hold (`nft list table` of one table, or a paste
    /// cut short; nft itself refuses a jump to a chain that does not exist): it returns or
    /// accepts, a fact the walk branches on. `None`: it returned from a jump (the rule goes on).
    fn nft_missing_chain(
        &mut self,
        [family, table, stage, place]: [&str; 4],
        text: &str,
        verb: &str,
        target: &str,
    ) -> Option<Flow> {
        let fact = Fact::Chain(format!("nft {family} {table} {target}"));
        let accepts = self.fact(fact) == 1;
        let (note, flow) = match (accepts, verb) {
            (true, _) => ("taken to accept", Some(Flow::Accept)),
            (false, "goto") => ("taken to return", Some(Flow::Return)),
            (false, _) => ("taken to return", None),
        };
        self.hop(
            stage,
            place,
            Some(text.to_string()),
            format!("{verb} {target} (not in the paste): {note}"),
        );
        flow
    }

    /// `meta mark set …` / `ct mark set …`.
    fn nft_mangle(&mut self, at: &ChainAt, r: &nft::Rule, v: &Value, p: &mut Pkt) -> Next {
        let key = nft::render_value(&v["key"]);
        let Some(val) = self.nft_eval(&v["value"], p).and_then(|x| x.as_u64()) else {
            self.assume(format!("nft statement not modelled: `{}`", r.text));
            return Next::Rule;
        };
        match key.as_str() {
            "meta mark" => p.mark = val as u32,
            "ct mark" => p.ct_mark = val as u32,
            _ => self.assume(format!("nft mangle of {key} not modelled (`{}`)", r.text)),
        }
        self.hop(
            at.stage,
            at.place.clone(),
            Some(r.text.clone()),
            format!("mark {:#x}, ct mark {:#x}", p.mark, p.ct_mark),
        );
        Next::Expr
    }

    /// A verdict map: `numgen random mod N vmap { … }` walks each of its options in turn;
    /// any other key is looked up (a miss in a NetworkPolicy table is told).
    fn nft_vmap_statement(&mut self, at: &ChainAt, r: &nft::Rule, v: &Value, p: &mut Pkt) -> Next {
        let (rs, family, table) = (at.rs, at.family, at.table);
        let key = &v["key"];
        let verdict = if key.get("numgen").is_some() {
            let eps = self.nft_vmap_endpoints(rs, family, table, &v["data"]);
            self.note_endpoints(eps);
            let opts = nft::render_value(&v["data"]);
            self.choices
                .push(format!("one of {{ {opts} }} (numgen random): each walked"));
            let elems = v["data"]["set"].as_array().cloned().unwrap_or_default();
            let labels = elems
                .iter()
                .map(|e| self.nft_vmap_label(rs, family, table, e))
                .collect();
            let c = self.choose(labels);
            let Some(verdict) = elems.get(c).and_then(|e| e.as_array()?.get(1).cloned()) else {
                return Next::Rule;
            };
            verdict
        } else {
            let Some(k) = self.nft_eval(key, p) else {
                self.assume(format!("nft vmap key not modelled: `{}`", r.text));
                return Next::Rule;
            };
            let Some(verdict) = self.nft_lookup(rs, family, table, &v["data"], &k) else {
                // (An `ip6` map's key on an IPv4 packet is no lookup at all.)
                if at.policy_table && !matches!(k, NVal::Absent) {
                    self.policy_miss(&v["data"], p, at.stage, &at.place, &r.text);
                }
                return Next::Rule;
            };
            verdict
        };
        match self.nft_verdict(
            rs, family, table, &verdict, p, at.stage, &at.place, &r.text, at.depth,
        ) {
            Some(f) => Next::Done(f),
            None => Next::Rule,
        }
    }

    /// Applies a verdict value from a vmap (`{"goto": {"target": …}}`, `{"accept": null}`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nft_verdict(
        &mut self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        verdict: &Value,
        p: &mut Pkt,
        stage: &str,
        place: &str,
        text: &str,
        depth: usize,
    ) -> Option<Flow> {
        let (k, v) = verdict.as_object()?.iter().next()?;
        match k.as_str() {
            "accept" => {
                self.hop(stage, place, Some(text.into()), "accepted (vmap)");
                Some(Flow::Accept)
            }
            "drop" => {
                self.hop(stage, place, Some(text.into()), "dropped (vmap)");
                Some(Flow::Drop(text.into()))
            }
            "jump" | "goto" => {
                let target = v["target"].as_str()?.to_string();
                if !has_chain(rs, family, table, &target) {
                    let at = [family, table, stage, place];
                    return self.nft_missing_chain(at, text, k, &target);
                }
                self.hop(
                    stage,
                    place,
                    Some(text.into()),
                    format!("vmap → {k} {target}"),
                );
                match self.nft_chain(rs, family, table, &target, p, stage, depth + 1) {
                    Flow::Return if k == "goto" => Some(Flow::Return),
                    Flow::Return => None,
                    other => Some(other),
                }
            }
            _ => None,
        }
    }

    /// Looks `key` up in a map (`"@name"` or an anonymous `{"set": [[k, v], …]}`).
    pub(super) fn nft_lookup(
        &mut self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        data: &Value,
        key: &NVal,
    ) -> Option<Value> {
        let elems: Vec<Value> = match data {
            Value::String(s) if s.starts_with('@') => {
                rs.set(family, table, &s[1..])?.elements.clone()
            }
            _ => data.get("set")?.as_array()?.clone(),
        };
        for e in elems {
            // Named maps list `[key, data]` pairs; anonymous ones too.
            let pair = e.as_array()?;
            let (k, v) = (pair.first()?, pair.get(1)?);
            if nval_matches(key, k) {
                return Some(v.clone());
            }
        }
        None
    }

    pub(super) fn nft_match(
        &mut self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        m: &Value,
        p: &Pkt,
    ) -> Option<bool> {
        let op = m.get("op").and_then(Value::as_str).unwrap_or("==");
        let left = match m["left"].get("fib") {
            // `fib saddr . iif oif missing`: the reverse-path lookup (needs the routes).
            Some(f) if f["result"].as_str() == Some("oif") => self.fib_oif(f, p),
            _ => self.nft_eval(&m["left"], p),
        };
        // `ip6 daddr …` on an IPv4 packet: the rule's implied protocol check fails.
        if matches!(left, Some(NVal::Absent)) {
            return Some(false);
        }
        let Some(left) = left else {
            self.assume(format!(
                "nft match on {} not modelled: rules using it count as not matching",
                nft::render_value(&m["left"])
            ));
            return None;
        };
        let right = &m["right"];
        let hit = match right {
            Value::String(s) if s.starts_with('@') => rs
                .set(family, table, &s[1..])
                .is_some_and(|set| set.elements.iter().any(|e| nval_matches(&left, e))),
            _ => nval_matches(&left, right),
        };
        Some(match op {
            "==" | "in" => hit,
            "!=" => !hit,
            _ => {
                self.assume(format!("nft operator {op} not modelled"));
                return None;
            }
        })
    }

    /// The value of an nft expression for this packet.
    pub(super) fn nft_eval(&self, e: &Value, p: &Pkt) -> Option<NVal> {
        match e {
            Value::Number(n) => return Some(NVal::Num(n.as_u64()?)),
            Value::String(s) => return Some(NVal::Str(s.clone())),
            _ => {}
        }
        let (k, v) = e.as_object()?.iter().next()?;
        match k.as_str() {
            "meta" => match v["key"].as_str()? {
                "iifname" | "iif" => Some(NVal::Str(p.iif.clone())),
                "oifname" | "oif" => Some(NVal::Str(p.oif.clone()?)),
                "mark" => Some(NVal::Num(p.mark as u64)),
                "l4proto" | "protocol" => Some(NVal::Num(p.proto.number(p.v6()))),
                "nfproto" => Some(NVal::Str(if p.v6() { "ipv6" } else { "ipv4" }.into())),
                _ => None,
            },
            "ct" => match v["key"].as_str()? {
                "mark" => Some(NVal::Num(p.ct_mark as u64)),
                "state" => Some(NVal::Str(p.ct_state.into())),
                "status" => Some(NVal::Str(if p.dnat {
                    "dnat".into()
                } else {
                    String::new()
                })),
                _ => None,
            },
            "payload" => {
                let proto = v["protocol"].as_str()?;
                let field = v["field"].as_str()?;
                match (proto, field) {
                    // An IPv6 packet has no IPv4 header and the reverse: such matches fail
                    // (`!=` too).
                    ("ip", _) if p.v6() => Some(NVal::Absent),
                    ("ip6", _) if !p.v6() => Some(NVal::Absent),
                    ("ip" | "ip6", "saddr") => Some(NVal::Ip(p.src)),
                    ("ip" | "ip6", "daddr") => Some(NVal::Ip(p.dst)),
                    ("ip", "protocol") | ("ip6", "nexthdr") => {
                        Some(NVal::Num(p.proto.number(p.v6())))
                    }
                    // The walked ICMP packet is an echo request (its reply an echo reply); it
                    // has no ports.
                    ("icmp", "type") if p.proto == Proto::Icmp && !p.v6() => {
                        Some(NVal::Str(p.icmp_type().into()))
                    }
                    ("icmpv6", "type") if p.proto == Proto::Icmp && p.v6() => {
                        Some(NVal::Str(p.icmp_type().into()))
                    }
                    ("icmp" | "icmpv6", _) => Some(NVal::Absent),
                    ("th", _) if !p.proto.has_ports() => Some(NVal::Absent),
                    ("th", "dport") => Some(NVal::Num(p.dport as u64)),
                    ("th", "sport") => Some(NVal::Num(p.sport as u64)),
                    (t, "dport") if t == p.proto.name() => Some(NVal::Num(p.dport as u64)),
                    (t, "sport") if t == p.proto.name() => Some(NVal::Num(p.sport as u64)),
                    ("tcp" | "udp", _) => Some(NVal::Str("<other protocol>".into())),
                    _ => None,
                }
            }
            "fib" => {
                // `fib daddr type local`
                let flags: Vec<&str> = v["flags"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .or_else(|| v["flags"].as_str().map(|s| vec![s]))?;
                let addr = if flags.contains(&"daddr") {
                    Some(p.dst)
                } else if flags.contains(&"saddr") {
                    Some(p.src)
                } else {
                    None
                };
                if let (Some("type"), Some(addr)) = (v["result"].as_str(), addr) {
                    Some(NVal::Str(if self.is_local(addr) {
                        "local".into()
                    } else {
                        "unicast".into()
                    }))
                } else {
                    None
                }
            }
            "&" | "|" | "^" => {
                let parts = v.as_array()?;
                let a = self.nft_eval(parts.first()?, p)?.as_u64()?;
                let b = self.nft_eval(parts.get(1)?, p)?.as_u64()?;
                Some(NVal::Num(match k.as_str() {
                    "&" => a & b,
                    "|" => a | b,
                    _ => a ^ b,
                }))
            }
            "concat" => {
                let parts = v.as_array()?;
                let mut vals = Vec::new();
                for x in parts {
                    vals.push(self.nft_eval(x, p)?);
                }
                Some(NVal::Concat(vals))
            }
            // A random number: any element may match (the walk lists them all).
            "numgen" => Some(NVal::Any),
            _ => None,
        }
    }
}

/// Rule `ri` of `chain`'s counter as evidence (empty without one): its handle when the paste
/// shows handles (`nft -a`), else its place in the chain.
fn nft_counters(chain: &str, ri: usize, r: &nft::Rule) -> String {
    let Some((packets, bytes)) = r.counters() else {
        return String::new();
    };
    let place = match r.handle {
        Some(h) => format!("rule handle {h} of {chain}"),
        None => format!("rule {} of {chain}", ri + 1),
    };
    super::walker::counter_note(Some(place), &packets.to_string(), &bytes.to_string())
}

/// Whether the ruleset holds chain `name` of table `family table`.
fn has_chain(rs: &Ruleset, family: &str, table: &str, name: &str) -> bool {
    rs.chains
        .iter()
        .any(|c| c.family == family && c.table == table && c.name == name)
}

/// The chain an nft walk is in, and where it reports from.
struct ChainAt<'a> {
    rs: &'a Ruleset,
    family: &'a str,
    table: &'a str,
    chain: &'a str,
    stage: &'a str,
    depth: usize,
    place: String,
    policy_table: bool,
}

/// What an expression leaves the walk of its chain to do.
enum Next {
    /// The rule's next expression.
    Expr,
    /// The chain's next rule.
    Rule,
    /// The chain is done.
    Done(Flow),
}

/// Whether a `match` expression tests a `numgen` value (the cascades [`super::nft_choices`]
/// walks as one choice).
pub(super) fn is_numgen_match(m: &Value) -> bool {
    m["left"].get("numgen").is_some()
}

/// A value an nft expression evaluated to.
#[derive(Debug, Clone)]
pub(super) enum NVal {
    Num(u64),
    Str(String),
    Ip(IpAddr),
    Concat(Vec<NVal>),
    /// `numgen random …`: matches any value.
    Any,
    /// A header this packet does not have (`ip6 …` of an IPv4 packet): matches nothing.
    Absent,
}

impl NVal {
    pub(super) fn as_u64(&self) -> Option<u64> {
        match self {
            NVal::Num(n) => Some(*n),
            _ => None,
        }
    }
}

/// Whether a value matches an nft right-hand side: a literal, a prefix, a range, an anonymous
/// set, a concatenation, an `elem` wrapper; `*` wildcards in interface names.
pub(super) fn nval_matches(v: &NVal, right: &Value) -> bool {
    match v {
        NVal::Any => return true,
        NVal::Absent => return false,
        _ => {}
    }
    if let Some(inner) = right.get("elem") {
        return nval_matches(v, &inner["val"]);
    }
    if let Some(items) = right.get("set").and_then(Value::as_array) {
        return items.iter().any(|i| nval_matches(v, i));
    }
    if let Some(parts) = right.get("concat").and_then(Value::as_array) {
        let NVal::Concat(vals) = v else { return false };
        return vals.len() == parts.len()
            && vals.iter().zip(parts).all(|(a, b)| nval_matches(a, b));
    }
    if let Some(pfx) = right.get("prefix") {
        let NVal::Ip(ip) = v else { return false };
        let net = format!("{}/{}", pfx["addr"].as_str().unwrap_or(""), pfx["len"]);
        return cidr_contains(&net, *ip).unwrap_or(false);
    }
    if let Some(r) = right.get("range").and_then(Value::as_array) {
        return match (v, r.first(), r.get(1)) {
            (NVal::Num(n), Some(a), Some(b)) => {
                a.as_u64().is_some_and(|a| *n >= a) && b.as_u64().is_some_and(|b| *n <= b)
            }
            _ => false,
        };
    }
    match (v, right) {
        (NVal::Num(n), Value::Number(m)) => Some(*n) == m.as_u64(),
        (NVal::Num(n), Value::String(s)) => match s.as_str() {
            "tcp" => *n == 6,
            "udp" => *n == 17,
            "icmp" => *n == 1,
            "ipv6-icmp" | "icmpv6" => *n == 58,
            "sctp" => *n == 132,
            _ => parse_num(s) == Some(*n as u32),
        },
        (NVal::Ip(ip), Value::String(s)) => s.parse::<IpAddr>().is_ok_and(|x| x == *ip),
        // `fib … oif exists` / `missing`: the interface found, empty when none.
        (NVal::Str(a), Value::Bool(b)) => a.is_empty() != *b,
        (NVal::Str(a), Value::String(s)) => match s.strip_suffix('*') {
            Some(prefix) => a.starts_with(prefix),
            None => a == s || (s.contains(',') && s.split(',').any(|x| x.trim() == a)),
        },
        (NVal::Str(a), Value::Array(items)) => items.iter().any(|i| i.as_str() == Some(a)),
        _ => false,
    }
}
