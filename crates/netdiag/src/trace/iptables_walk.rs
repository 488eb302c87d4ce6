//! The iptables walk: a chain's rules, their matches and targets.

use std::net::IpAddr;

use crate::iptables::{Dump, Rule as IptRule, Target};

use super::nat::endpoint;
use super::packet::{Fact, Flow, Pkt, Proto};
use super::walker::{cidr_contains, parse_num, Walker};

impl Walker<'_> {
    /// Runs an iptables chain. Returns how it ended.
    pub(super) fn ipt_chain(
        &mut self,
        d: &Dump,
        table: &str,
        chain: &str,
        p: &mut Pkt,
        stage: &str,
        depth: usize,
    ) -> Flow {
        let Some(ch) = d.chain(table, chain) else {
            self.assume(format!("iptables chain {table} {chain} is referenced but not in the dump: treated as empty"));
            return Flow::Return;
        };
        if depth > 16 {
            return Flow::Return;
        }
        let at = IptAt {
            d,
            table,
            chain,
            stage,
            depth,
            place: format!("{} {table} {chain}", super::hooks::ipt_name(p)),
        };
        let rules = ch.rules.clone();
        // The rule taken in a `-m statistic` cascade (each of its options is walked in turn).
        let mut cascade: Option<usize> = None;
        for (idx, r) in rules.iter().enumerate() {
            if self.ipt_matches(r, p) != Some(true) {
                continue;
            }
            if r.module_arg("statistic", "--mode").is_some()
                && !self.ipt_cascade_takes(&at, &rules, idx, &mut cascade)
            {
                continue;
            }
            let Some(target) = &r.target else {
                continue; // a rule without a target only counts
            };
            if let Some(flow) = self.ipt_target(&at, (idx, r), target, p) {
                return flow;
            }
        }
        Flow::Return
    }

    /// Whether rule `idx` of a `-m statistic` cascade is the one walked: chosen once, at the
    /// cascade's first rule.
    fn ipt_cascade_takes(
        &mut self,
        at: &IptAt,
        rules: &[IptRule],
        idx: usize,
        cascade: &mut Option<usize>,
    ) -> bool {
        if let Some(taken) = *cascade {
            return taken == idx;
        }
        let options = self.one_of_ipt(at.d, at.table, &rules[idx..]);
        let c = self.choose(options.iter().map(|(_, l)| l.clone()).collect());
        let taken = idx + options.get(c).map_or(0, |(o, _)| *o);
        *cascade = Some(taken);
        taken == idx
    }

    /// Applies a matching rule's target: how the chain ends, or `None` for its next rule.
    fn ipt_target(
        &mut self,
        at: &IptAt,
        (idx, r): (usize, &IptRule),
        target: &Target,
        p: &mut Pkt,
    ) -> Option<Flow> {
        let (stage, place) = (at.stage, &at.place);
        let name = target.name.as_str();
        match name {
            "ACCEPT" => {
                let note = format!("accepted{}", ipt_counters(at, idx, r));
                self.hop(stage, place.clone(), Some(r.text.clone()), note);
                Some(Flow::Accept)
            }
            "DROP" | "REJECT" => {
                let rejected = name == "REJECT";
                self.rejected = rejected;
                let what = if rejected { "rejected" } else { "dropped" };
                let note = format!("{what}{}", ipt_counters(at, idx, r));
                self.hop(stage, place.clone(), Some(r.text.clone()), note);
                Some(Flow::Drop(r.text.clone()))
            }
            "RETURN" => Some(Flow::Return),
            "MARK" => {
                apply_xmark(&mut p.mark, r);
                self.hop(
                    stage,
                    place.clone(),
                    Some(r.text.clone()),
                    format!("mark → {:#x}", p.mark),
                );
                None
            }
            "CONNMARK" => {
                self.ipt_connmark(at, r, target, p);
                None
            }
            "DNAT" => Some(self.ipt_dnat(at, r, p)),
            "REDIRECT" => self.ipt_redirect(at, r, p),
            "SNAT" => {
                let to = split_host_port(r.target_arg("--to-source").unwrap_or_default());
                self.snat(p, to.map(|(ip, _)| ip), stage, place, &r.text);
                Some(Flow::Accept)
            }
            "MASQUERADE" => {
                self.masquerade(p, "MASQUERADE", stage, place, &r.text);
                Some(Flow::Accept)
            }
            "LOG" | "TRACE" | "NFLOG" | "ULOG" | "CT" | "NOTRACK" | "AUDIT" => None,
            user if at.d.chain(at.table, user).is_some() => {
                self.hop(
                    stage,
                    place.clone(),
                    Some(r.text.clone()),
                    format!("{} {user}", if target.goto { "goto" } else { "jump" }),
                );
                match self.ipt_chain(at.d, at.table, user, p, stage, at.depth + 1) {
                    Flow::Return if target.goto => Some(Flow::Return),
                    Flow::Return => None,
                    other => Some(other),
                }
            }
            other if !is_extension_target(other) => self.ipt_missing_chain(at, r, target),
            other => {
                self.assume(format!(
                    "iptables target {other} not modelled: passed over (`{}`)",
                    r.text
                ));
                None
            }
        }
    }

    /// A jump to a chain the paste does not hold (a CNI's `cali-FORWARD`, a `grep` cut): it
    /// returns or accepts, a fact the walk branches on, so a verdict says what depends on it.
    fn ipt_missing_chain(&mut self, at: &IptAt, r: &IptRule, target: &Target) -> Option<Flow> {
        let chain = &target.name;
        let accepts = self.fact(Fact::Chain(format!("{} {chain}", at.table))) == 1;
        let verb = if target.goto { "goto" } else { "jump" };
        let (note, flow) = match (accepts, target.goto) {
            (true, _) => (
                format!("{verb} {chain} (not in the paste): taken to accept"),
                Some(Flow::Accept),
            ),
            (false, true) => (
                format!("{verb} {chain} (not in the paste): taken to return"),
                Some(Flow::Return),
            ),
            (false, false) => (
                format!("{verb} {chain} (not in the paste): taken to return"),
                None,
            ),
        };
        self.hop(at.stage, at.place.clone(), Some(r.text.clone()), note);
        flow
    }

    /// CONNMARK: `--save-mark`, `--restore-mark`, else set/xor the connection's mark.
    fn ipt_connmark(&mut self, at: &IptAt, r: &IptRule, target: &Target, p: &mut Pkt) {
        if r.target_arg("--save-mark").is_some()
            || target.args.iter().any(|a| a.name == "--save-mark")
        {
            p.ct_mark = p.mark;
        } else if target.args.iter().any(|a| a.name == "--restore-mark") {
            p.mark = p.ct_mark;
        } else {
            apply_xmark(&mut p.ct_mark, r);
        }
        self.hop(
            at.stage,
            at.place.clone(),
            Some(r.text.clone()),
            format!("ct mark {:#x}, mark {:#x}", p.ct_mark, p.mark),
        );
    }

    fn ipt_dnat(&mut self, at: &IptAt, r: &IptRule, p: &mut Pkt) -> Flow {
        let to = r
            .target_arg("--to-destination")
            .unwrap_or_default()
            .to_string();
        if let Some((ip, port)) = split_host_port(&to) {
            p.dst = ip;
            if let Some(port) = port {
                p.dport = port;
            }
            p.dnat = true;
        }
        p.nat_bound = true;
        self.note_endpoints(vec![endpoint(p.dst, Some(p.dport))]);
        self.dnat_hop(p, "DNAT", at.stage, &at.place, &r.text);
        Flow::Accept
    }

    /// REDIRECT: to the incoming interface's primary address (127.0.0.1 from the node);
    /// passed over (`None`) when that address is not known.
    fn ipt_redirect(&mut self, at: &IptAt, r: &IptRule, p: &mut Pkt) -> Option<Flow> {
        let Some(addr) = self.redirect_target(p) else {
            self.assume(format!(
                "REDIRECT on {}, which has no {} address known: passed over (`{}`)",
                p.iif,
                if p.v6() { "IPv6" } else { "IPv4" },
                r.text
            ));
            return None;
        };
        p.dst = addr;
        if let Some(port) = r
            .target_arg("--to-ports")
            .and_then(|x| x.split('-').next()?.parse().ok())
        {
            p.dport = port;
        }
        p.dnat = true;
        p.nat_bound = true;
        self.note_endpoints(vec![endpoint(p.dst, Some(p.dport))]);
        self.dnat_hop(p, "REDIRECT", at.stage, &at.place, &r.text);
        Some(Flow::Accept)
    }

    /// kube-proxy's `-m statistic --mode random` cascade: each rule is an alternative, listed
    /// with where it DNATs. Returns each option's rule (its offset in `rest`) and endpoint (the
    /// DNAT target, else the chain).
    pub(super) fn one_of_ipt(
        &mut self,
        d: &Dump,
        table: &str,
        rest: &[IptRule],
    ) -> Vec<(usize, String)> {
        let mut options = Vec::new();
        let mut endpoints = Vec::new();
        let mut taken = Vec::new();
        for (off, r) in rest.iter().enumerate() {
            let Some(t) = r.target_name() else { continue };
            let prob = r
                .module_arg("statistic", "--probability")
                .and_then(|a| a.values.first().cloned());
            let to = d.chain(table, t).and_then(|c| {
                c.rules
                    .iter()
                    .find_map(|x| x.target_arg("--to-destination").map(str::to_string))
            });
            if let Some(to) = &to {
                endpoints.push(to.clone());
            }
            taken.push((off, to.clone().unwrap_or_else(|| t.to_string())));
            options.push(format!(
                "{t}{}{}",
                to.map(|x| format!(" (DNAT {x})")).unwrap_or_default(),
                prob.map(|p| format!(" p={p}")).unwrap_or_default()
            ));
            if r.module_arg("statistic", "--mode").is_none() {
                break;
            }
        }
        self.note_endpoints(endpoints);
        self.choices
            .push(format!("one of {}: each walked", options.join(", ")));
        taken
    }

    /// Whether an iptables rule matches; `None` when it uses something the walk cannot evaluate.
    pub(super) fn ipt_matches(&mut self, r: &IptRule, p: &Pkt) -> Option<bool> {
        // The other matches first: the reverse-path lookup only for a rule that could apply.
        if r.modules.iter().any(|m| m == "rpfilter") {
            let rest = IptRule {
                args: r
                    .args
                    .iter()
                    .filter(|a| a.module.as_deref() != Some("rpfilter"))
                    .cloned()
                    .collect(),
                modules: r
                    .modules
                    .iter()
                    .filter(|m| *m != "rpfilter")
                    .cloned()
                    .collect(),
                ..r.clone()
            };
            if !self.ipt_matches(&rest, p)? {
                return Some(false);
            }
            return self.ipt_rpfilter(r, p);
        }
        for a in &r.args {
            let v = a.values.first().map(String::as_str).unwrap_or("");
            let hit = match (a.module.as_deref(), a.name.as_str()) {
                (_, "-s") => cidr_contains(v, p.src)?,
                (_, "-d") => cidr_contains(v, p.dst)?,
                (_, "-p") => match v {
                    "all" | "0" => true,
                    "tcp" | "6" => p.proto == Proto::Tcp,
                    "udp" | "17" => p.proto == Proto::Udp,
                    "icmp" | "1" => p.proto == Proto::Icmp && !p.v6(),
                    "ipv6-icmp" | "icmpv6" | "58" => p.proto == Proto::Icmp && p.v6(),
                    _ => false,
                },
                // The walked ICMP packet is an echo request (its reply an echo reply).
                (Some("icmp"), "--icmp-type") | (Some("icmp6"), "--icmpv6-type") => {
                    let (name, v4, v6) = match p.icmp_type() {
                        "echo-request" => ("echo-request", "8", "128"),
                        _ => ("echo-reply", "0", "129"),
                    };
                    v == "any" || v == name || v == if p.v6() { v6 } else { v4 }
                }
                (_, "-i") => ifname_matches(v, &p.iif),
                (_, "-o") => match &p.oif {
                    Some(o) => ifname_matches(v, o),
                    None => false,
                },
                (Some("comment"), _) => true,
                (Some("tcp" | "udp"), "--dport" | "--destination-port") => {
                    port_matches(v, p.dport)?
                }
                (Some("tcp" | "udp"), "--sport" | "--source-port") => port_matches(v, p.sport)?,
                (Some("multiport"), "--dports" | "--destination-ports" | "--dport") => v
                    .split(',')
                    .any(|x| port_matches(x, p.dport).unwrap_or(false)),
                (Some("mark"), "--mark") => mark_matches(v, p.mark)?,
                (Some("connmark"), "--mark") => mark_matches(v, p.ct_mark)?,
                (Some("conntrack"), "--ctstate") | (Some("state"), "--state") => {
                    v.split(',').any(|s| match s {
                        "NEW" => p.ct_state == "new",
                        "ESTABLISHED" => p.ct_state == "established",
                        "DNAT" => p.dnat,
                        _ => false,
                    })
                }
                (Some("addrtype"), "--dst-type") => match v {
                    "LOCAL" => self.is_local(p.dst),
                    "UNICAST" => true,
                    _ => false,
                },
                (Some("addrtype"), "--src-type") => match v {
                    "LOCAL" => self.is_local(p.src),
                    "UNICAST" => true,
                    _ => false,
                },
                (Some("addrtype"), "--limit-iface-in" | "--limit-iface-out") => true,
                (Some("statistic"), _) => true,
                (Some("recent"), name) => self.recent_matches(name, r),
                (Some("set"), "--match-set") => self.set_match(r, &a.values, p)?,
                // Options of the set match that do not change membership.
                (
                    Some("set"),
                    "--return-nomatch" | "--update-counters" | "--update-subcounters",
                ) => true,
                (Some("tcp"), "--tcp-flags" | "--syn") => true,
                (module, name) => {
                    self.assume(format!(
                        "iptables match {}{name} not modelled: rules using it count as not matching (`{}`)",
                        module.map(|m| format!("-m {m} ")).unwrap_or_default(),
                        r.text
                    ));
                    return None;
                }
            };
            if hit == a.negated {
                return Some(false);
            }
        }
        Some(true)
    }
}

/// The chain an iptables walk is in, and where it reports from.
struct IptAt<'a> {
    d: &'a Dump,
    table: &'a str,
    chain: &'a str,
    stage: &'a str,
    depth: usize,
    place: String,
}

/// Rule `idx` of the chain's counters as evidence (empty without them); its number in the
/// chain as a listing printed it, or its place in a dump that holds the whole chain.
fn ipt_counters(at: &IptAt, idx: usize, r: &IptRule) -> String {
    let Some(c) = &r.counters else {
        return String::new();
    };
    let number = r.number.or((!at.d.partial).then_some(idx + 1));
    let place = number.map(|n| format!("rule {n} of {}", at.chain));
    super::walker::counter_note(place, &c.packets, &c.bytes)
}

/// `MARK --set-xmark v/m` (and `--set-mark`, `--or-mark`, `--and-mark`).
pub(super) fn apply_xmark(mark: &mut u32, r: &IptRule) {
    let t = r.target.as_ref().expect("has target");
    for a in &t.args {
        let v = a.values.first().map(String::as_str).unwrap_or("");
        let (val, mask) = match v.split_once('/') {
            Some((x, m)) => (parse_num(x).unwrap_or(0), parse_num(m).unwrap_or(u32::MAX)),
            None => (parse_num(v).unwrap_or(0), u32::MAX),
        };
        match a.name.as_str() {
            "--set-xmark" => *mark = (*mark & !mask) ^ val,
            "--set-mark" => *mark = (*mark & !mask) | val,
            "--or-mark" => *mark |= val,
            "--and-mark" => *mark &= val,
            "--xor-mark" => *mark ^= val,
            _ => {}
        }
    }
}

pub(super) fn mark_matches(v: &str, mark: u32) -> Option<bool> {
    let (val, mask) = match v.split_once('/') {
        Some((x, m)) => (parse_num(x)?, parse_num(m)?),
        None => (parse_num(v)?, u32::MAX),
    };
    Some(mark & mask == val)
}

pub(super) fn ifname_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('+') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

pub(super) fn port_matches(v: &str, port: u16) -> Option<bool> {
    match v.split_once(':') {
        Some((a, b)) => Some(a.parse::<u16>().ok()? <= port && port <= b.parse::<u16>().ok()?),
        None => Some(v.parse::<u16>().ok()? == port),
    }
}

/// `--to-destination`/`--to-source`: `ip[-ip][:port[-port]]`, IPv6 as `[ip6]:port` or a bare
/// `ip6` (the first of a range taken).
pub(super) fn split_host_port(to: &str) -> Option<(IpAddr, Option<u16>)> {
    let port = |p: &str| p.split('-').next().and_then(|p| p.parse().ok());
    let (host, port) = if let Some(rest) = to.strip_prefix('[') {
        let (h, tail) = rest.split_once(']')?;
        (h, tail.strip_prefix(':').and_then(port))
    } else if to.matches(':').count() > 1 {
        (to, None)
    } else {
        match to.rsplit_once(':') {
            Some((h, p)) => (h, port(p)),
            None => (to, None),
        }
    };
    Some((host.split('-').next()?.parse().ok()?, port))
}

impl Walker<'_> {
    /// `-m recent` (kube-proxy's ClientIP affinity): `--set` records the source and matches;
    /// `--rcheck`/`--update` match only a source seen before, and the walk is a client's first
    /// connection, so they do not; the rest are options.
    fn recent_matches(&mut self, name: &str, r: &IptRule) -> bool {
        match name {
            "--rcheck" | "--update" => {
                self.assume(format!(
                    "-m recent {name}: the client has no earlier connection, so no affinity entry (`{}`)",
                    r.text
                ));
                false
            }
            _ => true,
        }
    }
}

/// iptables' target extensions (iptables-extensions(8)); any other target names a chain.
fn is_extension_target(name: &str) -> bool {
    const EXTENSIONS: &[&str] = &[
        "ACCEPT",
        "DROP",
        "RETURN",
        "REJECT",
        "QUEUE",
        "NFQUEUE",
        "LOG",
        "NFLOG",
        "ULOG",
        "TRACE",
        "AUDIT",
        "MARK",
        "CONNMARK",
        "CONNSECMARK",
        "SECMARK",
        "DNAT",
        "SNAT",
        "MASQUERADE",
        "REDIRECT",
        "NETMAP",
        "TPROXY",
        "CT",
        "NOTRACK",
        "CHECKSUM",
        "CLASSIFY",
        "CLUSTERIP",
        "DSCP",
        "ECN",
        "HL",
        "HMARK",
        "IDLETIMER",
        "LED",
        "RATEEST",
        "SET",
        "SYNPROXY",
        "TCPMSS",
        "TCPOPTSTRIP",
        "TEE",
        "TOS",
        "TTL",
        "JOOL",
        "DNPT",
        "SNPT",
    ];
    EXTENSIONS.contains(&name)
}
