//! `weir trace`: one IPv4 packet (the first of a new connection) walked through a node's state
//! the way the kernel would, then its reply on the way back.
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
//! What it models and what it assumes is said in [`Trace::assumptions`]; rules it cannot
//! evaluate (match modules it does not know, ipsets) count as not matching, and are named there.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use serde::Serialize;
use serde_json::Value;

use crate::iproute::PolicyRule;
use crate::iptables::{Dump, Rule as IptRule};
use crate::nft::{self, Ruleset};
use crate::state::NodeState;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
    fn number(self) -> u64 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        }
    }
}

/// The packet to trace: the first packet of a connection arriving on `iif` (from outside or
/// from a pod's veth).
#[derive(Debug, Clone, Serialize)]
pub struct Packet {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: Proto,
    pub sport: u16,
    pub dport: u16,
    pub iif: String,
}

/// The packet as the walk changes it.
#[derive(Debug, Clone)]
struct Pkt {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    proto: Proto,
    iif: String,
    oif: Option<String>,
    mark: u32,
    ct_mark: u32,
    /// `new` for the first packet, `established` for the reply.
    ct_state: &'static str,
    /// The connection was DNATed (conntrack's `DNAT` status).
    dnat: bool,
    /// A nat chain of the current hook set up a binding: the kernel's nat core runs no further
    /// nat chains on that hook (nf_nat_inet_fn).
    nat_bound: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Hop {
    /// `PREROUTING`, `routing`, `FORWARD`, `POSTROUTING`, `reply routing`, …
    pub stage: String,
    /// `iptables nat KUBE-SERVICES`, `nft ip kube-proxy nat-prerouting`, `table 1003`, …
    pub place: String,
    /// The rule or route that decided, as written in the dump.
    pub rule: Option<String>,
    pub note: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The connection works as far as this node can tell.
    Delivered,
    /// Dropped on this node (request or reply).
    Dropped,
}

#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    pub packet: Packet,
    pub hops: Vec<Hop>,
    pub verdict: Verdict,
    /// Where and why it was dropped.
    pub cause: Option<String>,
    /// Candidate fixes, cheapest first.
    pub fixes: Vec<String>,
    /// Random choices the walk made ("one of …") and what it followed.
    pub choices: Vec<String>,
    pub assumptions: Vec<String>,
}

/// How a chain (or a whole hook) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Flow {
    Accept,
    Drop(String),
    Return,
}

struct Walker<'a> {
    st: &'a NodeState,
    hops: Vec<Hop>,
    choices: Vec<String>,
    assumptions: BTreeSet<String>,
}

/// Runs the walk.
pub fn trace(st: &NodeState, packet: &Packet) -> Trace {
    let mut w = Walker {
        st,
        hops: Vec::new(),
        choices: Vec::new(),
        assumptions: BTreeSet::new(),
    };
    w.note_missing();
    let mut p = Pkt {
        src: packet.src,
        dst: packet.dst,
        sport: packet.sport,
        dport: packet.dport,
        proto: packet.proto,
        iif: packet.iif.clone(),
        oif: None,
        mark: 0,
        ct_mark: 0,
        ct_state: "new",
        dnat: false,
        nat_bound: false,
    };
    let (verdict, cause, fixes) = match w.request_and_reply(&mut p) {
        Ok(()) => (Verdict::Delivered, None, Vec::new()),
        Err((cause, fixes)) => (Verdict::Dropped, Some(cause), fixes),
    };
    Trace {
        packet: packet.clone(),
        hops: w.hops,
        verdict,
        cause,
        fixes,
        choices: w.choices,
        assumptions: w.assumptions.into_iter().collect(),
    }
}

/// Why the packet was dropped, and candidate fixes.
type Dropped = (String, Vec<String>);

impl Walker<'_> {
    fn hop(
        &mut self,
        stage: &str,
        place: impl Into<String>,
        rule: Option<String>,
        note: impl Into<String>,
    ) {
        self.hops.push(Hop {
            stage: stage.into(),
            place: place.into(),
            rule,
            note: note.into(),
        });
    }

    fn assume(&mut self, a: impl Into<String>) {
        self.assumptions.insert(a.into());
    }

    fn note_missing(&mut self) {
        let st = self.st;
        if st.iptables.is_none() && st.nft.is_none() {
            self.assume("no iptables-save or nft ruleset: no netfilter rules, every policy ACCEPT");
        }
        if st.rules.is_none() {
            self.assume(
                "no ip rule output: the default rules (0 local, 32766 main, 32767 default)",
            );
        }
        if st.routes.is_none() {
            self.assume("no ip route output: no routes, nothing is reachable");
        }
        if st.addrs.is_none() {
            self.assume("no ip addr output: local addresses only from table local's routes; masquerade's source unknown");
        }
        if st.sysctls.is_none() {
            self.assume("no sysctl output: rp_filter 0 (the kernel's default; many distributions set 1 or 2), ip_forward 1, src_valid_mark 0");
        }
    }

    fn request_and_reply(&mut self, p: &mut Pkt) -> Result<(), Dropped> {
        let orig = p.clone();
        // PREROUTING
        self.hook("PREROUTING", p)?;
        // Routing (and the reverse-path check of the request).
        let local = self.is_local(p.dst);
        let route = self.route("routing", p.src, p.dst, p.mark, &p.iif)?;
        self.rp_check("routing", p, &p.iif.clone())?;
        if local || route.local {
            self.hook("INPUT", p)?;
            self.hop(
                "deliver",
                "local",
                None,
                format!(
                    "to a local socket on {}:{} (assumed listening)",
                    p.dst, p.dport
                ),
            );
            return Ok(());
        }
        if self.sysctl("net.ipv4.ip_forward") == Some(0) {
            return Err((
                "net.ipv4.ip_forward = 0: the node does not forward".into(),
                vec!["sysctl -w net.ipv4.ip_forward=1".into()],
            ));
        }
        p.oif = Some(route.oif.clone());
        self.hook("FORWARD", p)?;
        // POSTROUTING: srcnat, including MASQUERADE's choice of source.
        let before = p.src;
        self.hook("POSTROUTING", p)?;
        let masq_src = p.src;
        let mut sent = format!("out {} {} → {}:{}", route.oif, p.src, p.dst, p.dport);
        if masq_src != before && self.owner_of(masq_src).is_some_and(|o| o != route.oif) {
            sent.push_str(&format!(
                "; {masq_src} is not {}'s address: a cloud's source/destination check on {} drops it before any reply",
                route.oif, route.oif
            ));
        }
        self.hop("send", route.oif.clone(), None, sent);

        // The reply: from the (possibly DNATed) destination back to the (possibly
        // masqueraded) source. It arrives where that source lives: on the interface holding
        // the address when it is this node's, else on the interface the request left by.
        let reply_iif = if masq_src != before {
            self.owner_of(masq_src).unwrap_or_else(|| route.oif.clone())
        } else {
            route.oif.clone()
        };
        self.hop(
            "reply",
            reply_iif.clone(),
            None,
            format!(
                "{}:{} → {} arrives on {reply_iif}; conntrack restores its destination to {}",
                p.dst, p.dport, masq_src, orig.src
            ),
        );
        let mut r = Pkt {
            src: p.dst,
            dst: orig.src,
            sport: p.dport,
            dport: orig.sport,
            proto: p.proto,
            iif: reply_iif.clone(),
            oif: None,
            mark: 0,
            ct_mark: p.ct_mark,
            ct_state: "established",
            dnat: p.dnat,
            nat_bound: false,
        };
        self.hook("reply PREROUTING", &mut r)?;
        let back = self.route("reply routing", r.src, r.dst, r.mark, &r.iif)?;
        self.rp_check("reply routing", &r, &reply_iif)?;
        if back.local {
            self.hop("reply deliver", "local", None, "the reply is for this node");
            return Ok(());
        }
        r.oif = Some(back.oif.clone());
        self.hook("reply FORWARD", &mut r)?;
        self.hop(
            "reply send",
            back.oif.clone(),
            None,
            format!(
                "out {} to {} (source restored to {}:{})",
                back.oif, orig.src, orig.dst, orig.dport
            ),
        );
        Ok(())
    }

    fn sysctl(&self, key: &str) -> Option<i64> {
        self.st.sysctls.as_ref()?.int(key)
    }

    fn is_local(&self, ip: Ipv4Addr) -> bool {
        self.st.is_local_address(IpAddr::V4(ip))
    }

    fn owner_of(&self, ip: Ipv4Addr) -> Option<String> {
        self.st
            .local_addresses()
            .find(|a| a.addr == IpAddr::V4(ip))
            .map(|a| a.ifname.clone())
    }

    /// The netfilter chains of one hook in priority order; each one's verdict applied.
    fn hook(&mut self, stage: &str, p: &mut Pkt) -> Result<(), Dropped> {
        let hook = stage.trim_start_matches("reply ");
        let mut slots: Vec<(i64, Slot)> = Vec::new();
        if let Some(d) = &self.st.iptables {
            for (table, prio) in iptables_tables(hook) {
                if d.chain(table, hook).is_some() {
                    slots.push((prio, Slot::Ipt(table)));
                }
            }
        }
        if let Some(rs) = &self.st.nft {
            for c in rs.base_chains(&hook.to_ascii_lowercase(), &["ip", "inet"]) {
                // iptables-nft's own tables are read from iptables-save (their xt expressions
                // carry no meaning in JSON).
                if self.st.iptables.is_some()
                    && c.family == "ip"
                    && matches!(
                        c.table.as_str(),
                        "filter" | "nat" | "mangle" | "raw" | "security"
                    )
                {
                    continue;
                }
                let h = c.hook.as_ref().expect("base chain");
                // nat chains see only a connection's first packet.
                if h.kind == "nat" && p.ct_state != "new" {
                    continue;
                }
                slots.push((
                    h.priority,
                    Slot::Nft(
                        c.family.clone(),
                        c.table.clone(),
                        c.name.clone(),
                        h.policy.clone(),
                        h.kind == "nat",
                    ),
                ));
            }
        }
        slots.sort_by_key(|(prio, _)| *prio);
        p.nat_bound = false;
        for (_, slot) in slots {
            match slot {
                Slot::Ipt(table) => {
                    if table == "nat" && (p.ct_state != "new" || p.nat_bound) {
                        continue;
                    }
                    let d = self.st.iptables.as_ref().expect("checked");
                    let flow = self.ipt_chain(d, table, hook, p, stage, 0);
                    let place = format!("iptables {table} {hook}");
                    match flow {
                        Flow::Drop(rule) => return Err(self.drop_cause(stage, &place, rule, p)),
                        Flow::Accept => {}
                        Flow::Return => {
                            let policy = d.chain(table, hook).and_then(|c| c.policy.clone());
                            if policy.as_deref() == Some("DROP") {
                                let rule = format!(":{hook} DROP (policy)");
                                self.hop(
                                    stage,
                                    place.clone(),
                                    Some(rule.clone()),
                                    "no rule accepted it: the chain's policy",
                                );
                                return Err(self.drop_cause(stage, &place, rule, p));
                            }
                        }
                    }
                }
                Slot::Nft(family, table, chain, policy, nat) => {
                    if nat && p.nat_bound {
                        continue;
                    }
                    let rs = self.st.nft.as_ref().expect("checked");
                    let flow = self.nft_chain(rs, &family, &table, &chain, p, stage, 0);
                    let place = format!("nft {family} {table} {chain}");
                    match flow {
                        Flow::Drop(rule) => return Err(self.drop_cause(stage, &place, rule, p)),
                        Flow::Accept => {}
                        Flow::Return if policy == "drop" => {
                            let rule = format!("chain {chain} {{ policy drop; }}");
                            self.hop(
                                stage,
                                place.clone(),
                                Some(rule.clone()),
                                "no rule accepted it: the chain's policy",
                            );
                            return Err(self.drop_cause(stage, &place, rule, p));
                        }
                        Flow::Return => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// A netfilter drop, with fixes for the cases this module recognises.
    fn drop_cause(&self, stage: &str, place: &str, rule: String, p: &Pkt) -> Dropped {
        let mut fixes = Vec::new();
        if stage.ends_with("FORWARD") && rule.contains("policy") {
            fixes.push(format!("accept forwarded traffic the proxy marked for masquerade: iptables -A FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT (kube-proxy's KUBE-FORWARD does; the packet's mark here is {:#x})", p.mark));
            fixes.push("accept replies: iptables -A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".into());
            fixes.push(
                "or set the FORWARD policy to ACCEPT (loses the firewall's default deny)".into(),
            );
        }
        (format!("{stage}: dropped in {place} by `{rule}`"), fixes)
    }

    /// Runs an iptables chain. Returns how it ended.
    fn ipt_chain(
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
        let place = format!("iptables {table} {chain}");
        let rules = ch.rules.clone();
        let mut i = 0;
        while i < rules.len() {
            let r = &rules[i];
            i += 1;
            match self.ipt_matches(r, p) {
                Some(true) => {}
                Some(false) => continue,
                None => continue,
            }
            if r.module_arg("statistic", "--mode").is_some() {
                self.one_of_ipt(d, table, &rules[i - 1..]);
            }
            let Some(target) = r.target.clone() else {
                continue; // a rule without a target only counts
            };
            let name = target.name.as_str();
            match name {
                "ACCEPT" => {
                    self.hop(stage, place, Some(r.text.clone()), "accepted");
                    return Flow::Accept;
                }
                "DROP" | "REJECT" => {
                    self.hop(stage, place, Some(r.text.clone()), "dropped");
                    return Flow::Drop(r.text.clone());
                }
                "RETURN" => return Flow::Return,
                "MARK" => {
                    apply_xmark(&mut p.mark, r);
                    self.hop(
                        stage,
                        place.clone(),
                        Some(r.text.clone()),
                        format!("mark → {:#x}", p.mark),
                    );
                }
                "CONNMARK" => {
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
                        stage,
                        place.clone(),
                        Some(r.text.clone()),
                        format!("ct mark {:#x}, mark {:#x}", p.ct_mark, p.mark),
                    );
                }
                "DNAT" => {
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
                    self.hop(
                        stage,
                        place,
                        Some(r.text.clone()),
                        format!("DNAT to {}:{}", p.dst, p.dport),
                    );
                    return Flow::Accept;
                }
                "SNAT" => {
                    let to = r.target_arg("--to-source").unwrap_or_default().to_string();
                    if let Some((ip, _)) = split_host_port(&to) {
                        p.src = ip;
                    }
                    p.nat_bound = true;
                    self.hop(
                        stage,
                        place,
                        Some(r.text.clone()),
                        format!("SNAT to {}", p.src),
                    );
                    return Flow::Accept;
                }
                "MASQUERADE" => {
                    let src = self.masquerade_source(p);
                    self.hop(
                        stage,
                        place,
                        Some(r.text.clone()),
                        format!("MASQUERADE: source {} → {src}", p.src),
                    );
                    p.src = src;
                    p.nat_bound = true;
                    return Flow::Accept;
                }
                "LOG" | "TRACE" | "NFLOG" | "ULOG" | "CT" | "NOTRACK" | "AUDIT" => {}
                user if d.chain(table, user).is_some() => {
                    self.hop(
                        stage,
                        place.clone(),
                        Some(r.text.clone()),
                        format!("{} {user}", if target.goto { "goto" } else { "jump" }),
                    );
                    match self.ipt_chain(d, table, user, p, stage, depth + 1) {
                        Flow::Return if target.goto => return Flow::Return,
                        Flow::Return => {}
                        other => return other,
                    }
                }
                other => self.assume(format!(
                    "iptables target {other} not modelled: passed over (`{}`)",
                    r.text
                )),
            }
        }
        Flow::Return
    }

    /// kube-proxy's `-m statistic --mode random` cascade: the walk follows the first rule; the
    /// others are alternatives, listed with where each one DNATs.
    fn one_of_ipt(&mut self, d: &Dump, table: &str, rest: &[IptRule]) {
        let mut options = Vec::new();
        for r in rest {
            let Some(t) = r.target_name() else { continue };
            let prob = r
                .module_arg("statistic", "--probability")
                .and_then(|a| a.values.first().cloned());
            let to = d.chain(table, t).and_then(|c| {
                c.rules
                    .iter()
                    .find_map(|x| x.target_arg("--to-destination").map(str::to_string))
            });
            options.push(format!(
                "{t}{}{}",
                to.map(|x| format!(" (DNAT {x})")).unwrap_or_default(),
                prob.map(|p| format!(" p={p}")).unwrap_or_default()
            ));
            if r.module_arg("statistic", "--mode").is_none() {
                break;
            }
        }
        self.choices
            .push(format!("one of {}: followed the first", options.join(", ")));
    }

    /// Whether an iptables rule matches; `None` when it uses something the walk cannot evaluate.
    fn ipt_matches(&mut self, r: &IptRule, p: &Pkt) -> Option<bool> {
        for a in &r.args {
            let v = a.values.first().map(String::as_str).unwrap_or("");
            let hit = match (a.module.as_deref(), a.name.as_str()) {
                (_, "-s") => cidr_contains(v, p.src)?,
                (_, "-d") => cidr_contains(v, p.dst)?,
                (_, "-p") => match v {
                    "all" | "0" => true,
                    "tcp" | "6" => p.proto == Proto::Tcp,
                    "udp" | "17" => p.proto == Proto::Udp,
                    _ => false,
                },
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

    /// Runs an nft chain.
    #[allow(clippy::too_many_arguments)]
    fn nft_chain(
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
        let place = format!("nft {family} {table} {chain}");
        let rules: Vec<nft::Rule> = rs
            .rules
            .iter()
            .filter(|r| r.family == family && r.table == table && r.chain == chain)
            .cloned()
            .collect();
        'rules: for r in &rules {
            for e in &r.expr {
                let Some((k, v)) = e.as_object().and_then(|o| o.iter().next()) else {
                    continue;
                };
                match k.as_str() {
                    "match" => match self.nft_match(rs, family, table, v, p) {
                        Some(true) => {}
                        _ => continue 'rules,
                    },
                    "counter" | "log" | "limit" | "notrack" => {}
                    "accept" => {
                        self.hop(stage, place, Some(r.text.clone()), "accepted");
                        return Flow::Accept;
                    }
                    "drop" | "reject" => {
                        self.hop(stage, place, Some(r.text.clone()), "dropped");
                        return Flow::Drop(r.text.clone());
                    }
                    "return" => return Flow::Return,
                    "jump" | "goto" => {
                        let target = v["target"].as_str().unwrap_or_default().to_string();
                        self.hop(
                            stage,
                            place.clone(),
                            Some(r.text.clone()),
                            format!("{k} {target}"),
                        );
                        match self.nft_chain(rs, family, table, &target, p, stage, depth + 1) {
                            Flow::Return if k == "goto" => return Flow::Return,
                            Flow::Return => {}
                            other => return other,
                        }
                    }
                    "mangle" => {
                        let key = nft::render_value(&v["key"]);
                        let Some(val) = self.nft_eval(&v["value"], p).and_then(|x| x.as_u64())
                        else {
                            self.assume(format!("nft statement not modelled: `{}`", r.text));
                            continue 'rules;
                        };
                        match key.as_str() {
                            "meta mark" => p.mark = val as u32,
                            "ct mark" => p.ct_mark = val as u32,
                            _ => self
                                .assume(format!("nft mangle of {key} not modelled (`{}`)", r.text)),
                        }
                        self.hop(
                            stage,
                            place.clone(),
                            Some(r.text.clone()),
                            format!("mark {:#x}, ct mark {:#x}", p.mark, p.ct_mark),
                        );
                    }
                    "dnat" => {
                        if let Some(ip) = v
                            .get("addr")
                            .and_then(Value::as_str)
                            .and_then(|a| a.parse().ok())
                        {
                            p.dst = ip;
                            p.dnat = true;
                        }
                        if let Some(port) = v.get("port").and_then(Value::as_u64) {
                            p.dport = port as u16;
                        }
                        p.nat_bound = true;
                        self.hop(
                            stage,
                            place,
                            Some(r.text.clone()),
                            format!("DNAT to {}:{}", p.dst, p.dport),
                        );
                        return Flow::Accept;
                    }
                    "snat" => {
                        if let Some(ip) = v
                            .get("addr")
                            .and_then(Value::as_str)
                            .and_then(|a| a.parse().ok())
                        {
                            p.src = ip;
                        }
                        p.nat_bound = true;
                        self.hop(
                            stage,
                            place,
                            Some(r.text.clone()),
                            format!("SNAT to {}", p.src),
                        );
                        return Flow::Accept;
                    }
                    "masquerade" => {
                        let src = self.masquerade_source(p);
                        self.hop(
                            stage,
                            place,
                            Some(r.text.clone()),
                            format!("masquerade: source {} → {src}", p.src),
                        );
                        p.src = src;
                        p.nat_bound = true;
                        return Flow::Accept;
                    }
                    "vmap" => {
                        let key = &v["key"];
                        if key.get("numgen").is_some() {
                            // `numgen random mod N vmap { 0 : goto a, … }`: one of.
                            let opts = nft::render_value(&v["data"]);
                            self.choices.push(format!(
                                "one of {{ {opts} }} (numgen random): followed the first"
                            ));
                            let first =
                                v["data"]["set"].as_array().and_then(|a| a.first()).cloned();
                            if let Some(verdict) =
                                first.and_then(|e| e.as_array().and_then(|x| x.get(1)).cloned())
                            {
                                match self.nft_verdict(
                                    rs, family, table, &verdict, p, stage, &place, &r.text, depth,
                                ) {
                                    Some(f) => return f,
                                    None => continue 'rules,
                                }
                            }
                            continue 'rules;
                        }
                        let Some(k) = self.nft_eval(key, p) else {
                            self.assume(format!("nft vmap key not modelled: `{}`", r.text));
                            continue 'rules;
                        };
                        let Some(verdict) = self.nft_lookup(rs, family, table, &v["data"], &k)
                        else {
                            continue 'rules;
                        };
                        match self.nft_verdict(
                            rs, family, table, &verdict, p, stage, &place, &r.text, depth,
                        ) {
                            Some(f) => return f,
                            None => continue 'rules,
                        }
                    }
                    other => {
                        self.assume(format!(
                            "nft expression {other} not modelled: rule passed over (`{}`)",
                            r.text
                        ));
                        continue 'rules;
                    }
                }
            }
        }
        Flow::Return
    }

    /// Applies a verdict value from a vmap (`{"goto": {"target": …}}`, `{"accept": null}`).
    #[allow(clippy::too_many_arguments)]
    fn nft_verdict(
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
    fn nft_lookup(
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

    fn nft_match(
        &mut self,
        rs: &Ruleset,
        family: &str,
        table: &str,
        m: &Value,
        p: &Pkt,
    ) -> Option<bool> {
        let op = m.get("op").and_then(Value::as_str).unwrap_or("==");
        let left = self.nft_eval(&m["left"], p);
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
    fn nft_eval(&self, e: &Value, p: &Pkt) -> Option<NVal> {
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
                "l4proto" | "protocol" => Some(NVal::Num(p.proto.number())),
                "nfproto" => Some(NVal::Str("ipv4".into())),
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
                    ("ip", "saddr") => Some(NVal::Ip(p.src)),
                    ("ip", "daddr") => Some(NVal::Ip(p.dst)),
                    ("ip", "protocol") => Some(NVal::Num(p.proto.number())),
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
                if v["result"].as_str()? == "type" && flags.contains(&"daddr") {
                    Some(NVal::Str(if self.is_local(p.dst) {
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
            _ => None,
        }
    }

    /// MASQUERADE's source (`inet_select_addr(out, …)`, not the route's `src`): the outgoing
    /// interface's primary IPv4 address, else (an interface with no address) the first global
    /// address of another interface, in interface order.
    fn masquerade_source(&mut self, p: &Pkt) -> Ipv4Addr {
        let oif = p.oif.clone().unwrap_or_default();
        let on_oif: Vec<Ipv4Addr> = self
            .st
            .local_addresses()
            .filter(|a| a.ifname == oif && !a.secondary)
            .filter_map(|a| match a.addr {
                IpAddr::V4(v) => Some(v),
                _ => None,
            })
            .collect();
        if let Some(a) = on_oif.first() {
            return *a;
        }
        let fallback = self
            .st
            .links
            .iter()
            .flatten()
            .map(|l| l.name.clone())
            .chain(self.st.local_addresses().map(|a| a.ifname.clone()))
            .find_map(|ifname| {
                self.st.local_addresses().find_map(|a| match a.addr {
                    IpAddr::V4(v)
                        if a.ifname == ifname && a.scope == "global" && !v.is_loopback() =>
                    {
                        Some(v)
                    }
                    _ => None,
                })
            });
        match fallback {
            Some(a) => {
                self.assume(format!("masquerade on {oif}, which has no IPv4 address: the kernel takes another interface's ({a}), as inet_select_addr does"));
                a
            }
            None => {
                self.assume(format!(
                    "no IPv4 address known for masquerade on {oif}: source left unchanged"
                ));
                p.src
            }
        }
    }
}

enum Slot {
    Ipt(&'static str),
    /// family, table, chain, policy, is a nat chain
    Nft(String, String, String, String, bool),
}

/// iptables tables on a hook, with their priorities.
fn iptables_tables(hook: &str) -> Vec<(&'static str, i64)> {
    match hook {
        "PREROUTING" => vec![("raw", -300), ("mangle", -150), ("nat", -100)],
        "INPUT" => vec![("mangle", -150), ("filter", 0), ("nat", 100)],
        "FORWARD" => vec![("mangle", -150), ("filter", 0)],
        "OUTPUT" => vec![
            ("raw", -300),
            ("mangle", -150),
            ("nat", -100),
            ("filter", 0),
        ],
        "POSTROUTING" => vec![("mangle", -150), ("nat", 100)],
        _ => vec![],
    }
}

/// A value an nft expression evaluated to.
#[derive(Debug, Clone)]
enum NVal {
    Num(u64),
    Str(String),
    Ip(Ipv4Addr),
    Concat(Vec<NVal>),
}

impl NVal {
    fn as_u64(&self) -> Option<u64> {
        match self {
            NVal::Num(n) => Some(*n),
            _ => None,
        }
    }
}

/// Whether a value matches an nft right-hand side: a literal, a prefix, a range, an anonymous
/// set, a concatenation, an `elem` wrapper; `*` wildcards in interface names.
fn nval_matches(v: &NVal, right: &Value) -> bool {
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
            _ => parse_num(s) == Some(*n as u32),
        },
        (NVal::Ip(ip), Value::String(s)) => s.parse::<Ipv4Addr>().is_ok_and(|x| x == *ip),
        (NVal::Str(a), Value::String(s)) => match s.strip_suffix('*') {
            Some(prefix) => a.starts_with(prefix),
            None => a == s || (s.contains(',') && s.split(',').any(|x| x.trim() == a)),
        },
        (NVal::Str(a), Value::Array(items)) => items.iter().any(|i| i.as_str() == Some(a)),
        _ => false,
    }
}

fn parse_num(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// `MARK --set-xmark v/m` (and `--set-mark`, `--or-mark`, `--and-mark`).
fn apply_xmark(mark: &mut u32, r: &IptRule) {
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

fn mark_matches(v: &str, mark: u32) -> Option<bool> {
    let (val, mask) = match v.split_once('/') {
        Some((x, m)) => (parse_num(x)?, parse_num(m)?),
        None => (parse_num(v)?, u32::MAX),
    };
    Some(mark & mask == val)
}

fn cidr_contains(v: &str, ip: Ipv4Addr) -> Option<bool> {
    let net: ipnet::Ipv4Net = match v.parse() {
        Ok(n) => n,
        Err(_) => ipnet::Ipv4Net::new(v.parse().ok()?, 32).ok()?,
    };
    Some(net.contains(&ip))
}

fn ifname_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('+') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

fn port_matches(v: &str, port: u16) -> Option<bool> {
    match v.split_once(':') {
        Some((a, b)) => Some(a.parse::<u16>().ok()? <= port && port <= b.parse::<u16>().ok()?),
        None => Some(v.parse::<u16>().ok()? == port),
    }
}

fn split_host_port(to: &str) -> Option<(Ipv4Addr, Option<u16>)> {
    let (host, port) = match to.rsplit_once(':') {
        Some((h, p)) => (h, p.split('-').next().and_then(|p| p.parse().ok())),
        None => (to, None),
    };
    Some((host.split('-').next()?.parse().ok()?, port))
}

/// The result of a routing decision.
#[derive(Debug, Clone)]
struct RouteResult {
    local: bool,
    oif: String,
}

impl Walker<'_> {
    /// Policy routing: rules in priority order, the first whose table has a route decides.
    fn route(
        &mut self,
        stage: &str,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        mark: u32,
        iif: &str,
    ) -> Result<RouteResult, Dropped> {
        let found = self.lookup(src, dst, mark, Some(iif));
        match found {
            Some((rule, route)) => {
                let local = route.kind == "local";
                match route.kind.as_str() {
                    "blackhole" | "unreachable" | "prohibit" => {
                        self.hop(
                            stage,
                            format!("table {}", route.table),
                            Some(route.text.clone()),
                            format!("{dst}: {}", route.kind),
                        );
                        return Err((
                            format!(
                                "{stage}: route to {dst} is {} (`{}`)",
                                route.kind, route.text
                            ),
                            vec![],
                        ));
                    }
                    _ => {}
                }
                self.hop(
                    stage,
                    format!("table {}", route.table),
                    Some(format!("{} → {}", rule, route.text)),
                    if local {
                        format!("{dst} is local")
                    } else {
                        format!(
                            "from {src} to {dst} (mark {mark:#x}): out {}",
                            route.dev.clone().unwrap_or_default()
                        )
                    },
                );
                Ok(RouteResult {
                    local,
                    oif: route.dev.unwrap_or_default(),
                })
            }
            None => {
                self.hop(
                    stage,
                    "rules",
                    None,
                    format!("no route from {src} to {dst}"),
                );
                Err((format!("{stage}: no route to {dst}"), vec![]))
            }
        }
    }

    /// The policy rules (or the default ones) and the route they lead to.
    fn lookup(
        &self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        mark: u32,
        iif: Option<&str>,
    ) -> Option<(String, crate::iproute::Route)> {
        let defaults;
        let rules: &[PolicyRule] = match &self.st.rules {
            Some(r) => r,
            None => {
                defaults = crate::iproute::parse_rules("0: from all lookup local\n32766: from all lookup main\n32767: from all lookup default\n").value;
                &defaults
            }
        };
        for r in rules {
            let mut hit = r.src.is_none_or(|n| n.contains(&IpAddr::V4(src)))
                && r.dst.is_none_or(|n| n.contains(&IpAddr::V4(dst)))
                && r.fwmark.is_none_or(|(m, k)| mark & k == m)
                && r.iif.as_deref().is_none_or(|i| Some(i) == iif)
                && r.oif.is_none();
            if r.not {
                hit = !hit;
            }
            if !hit {
                continue;
            }
            match r.action.as_str() {
                "lookup" => {
                    let table = match r.table.as_deref() {
                        Some("254") | None => "main",
                        Some("255") => "local",
                        Some("253") => "default",
                        Some(t) => t,
                    };
                    if let Some(route) = self.st.lookup(table, IpAddr::V4(dst)) {
                        return Some((r.text.replace('\t', " "), route.clone()));
                    }
                }
                "blackhole" | "unreachable" | "prohibit" => {
                    let route = crate::iproute::Route {
                        table: "rule".into(),
                        kind: r.action.clone(),
                        dst: ipnet::IpNet::from(IpAddr::V4(dst)),
                        gateway: None,
                        dev: None,
                        prefsrc: None,
                        scope: None,
                        metric: 0,
                        onlink: false,
                        text: r.text.replace('\t', " "),
                    };
                    return Some((r.text.replace('\t', " "), route));
                }
                _ => {}
            }
        }
        None
    }

    /// The reverse-path check of a packet that arrived on `iif` (`fib_validate_source`): the
    /// route back to its source, looked up from its destination with `iif lo` and the packet's
    /// mark only under `src_valid_mark`, must leave by `iif` (strict, 1) or exist (loose, 2).
    fn rp_check(&mut self, stage: &str, p: &Pkt, iif: &str) -> Result<(), Dropped> {
        let rp = self
            .st
            .sysctls
            .as_ref()
            .and_then(|s| s.effective_rp_filter(iif))
            .unwrap_or(0);
        if rp == 0 {
            return Ok(());
        }
        let svm = self
            .st
            .sysctls
            .as_ref()
            .and_then(|s| s.effective_src_valid_mark(iif))
            .unwrap_or(false);
        let mark = if svm { p.mark } else { 0 };
        let back = self.lookup(p.dst, p.src, mark, Some("lo"));
        let Some((rule, route)) = back else {
            self.hop(
                stage,
                "rp_filter",
                None,
                format!("no route back to {}", p.src),
            );
            return Err((
                format!("{stage}: reverse-path check: no route back to {} ", p.src),
                vec![],
            ));
        };
        let out = route.dev.clone().unwrap_or_default();
        if rp == 2 || out == iif {
            self.hop(
                stage,
                "rp_filter",
                Some(format!("{rule} → {}", route.text)),
                format!(
                    "reverse path to {} via {out}: passes (rp_filter {rp})",
                    p.src
                ),
            );
            return Ok(());
        }
        self.hop(
            stage,
            "rp_filter",
            Some(format!("{rule} → {}", route.text)),
            format!("reverse path from {} to {} leaves by {out}, not {iif}: strict rp_filter drops it (TcpExtIPReversePathFilter)", p.dst, p.src),
        );
        let mut fixes = Vec::new();
        let out_has_addr = !self.st.ipv4_on(&out).is_empty();
        if !out_has_addr && stage.starts_with("reply") {
            fixes.push(format!("give {out} an IPv4 address of its own, so masquerade picks it and the reply returns on {out} (weir-cni eni-shared's eniAddress)"));
        }
        if stage.starts_with("reply") {
            fixes.push(format!("loose reverse-path filtering on {iif}: sysctl -w net.ipv4.conf.{iif}.rp_filter=2 (the effective value is max(conf/all, conf/{iif})); a cloud's source check may still drop the request"));
        } else {
            fixes.push(format!("connmark connections arriving on {iif} and add `ip rule add fwmark <mark> lookup main` before `{}`, with net.ipv4.conf.all.src_valid_mark=1 (weir-cni eni-shared does this)", rule.trim()));
            fixes.push(format!(
                "loose reverse-path filtering on {iif}: sysctl -w net.ipv4.conf.{iif}.rp_filter=2"
            ));
        }
        fixes.push(format!(
            "mark the traffic in mangle and route it through main with a fwmark rule before `{}`",
            rule.trim()
        ));
        Err((format!("{stage}: strict reverse-path filter on {iif} drops {} → {} (the route back leaves by {out})", p.src, p.dst), fixes))
    }
}

/// A trace for people: one line per hop with its rule, then the verdict.
pub fn render(t: &Trace) -> String {
    let p = &t.packet;
    let mut out = format!(
        "{} {}:{} → {}:{} in {}\n",
        p.proto.name(),
        p.src,
        p.sport,
        p.dst,
        p.dport,
        p.iif
    );
    for h in &t.hops {
        out.push_str(&format!("  {:<18} {:<36} {}\n", h.stage, h.place, h.note));
        if let Some(r) = &h.rule {
            out.push_str(&format!("  {:<18}   {r}\n", ""));
        }
    }
    for c in &t.choices {
        out.push_str(&format!("choice: {c}\n"));
    }
    match &t.verdict {
        Verdict::Delivered => {
            out.push_str("verdict: delivered (request and reply pass this node)\n")
        }
        Verdict::Dropped => {
            out.push_str(&format!(
                "verdict: DROPPED: {}\n",
                t.cause.as_deref().unwrap_or("")
            ));
            for (i, f) in t.fixes.iter().enumerate() {
                out.push_str(&format!("  fix {}: {f}\n", i + 1));
            }
        }
    }
    for a in &t.assumptions {
        out.push_str(&format!("assumed: {a}\n"));
    }
    out
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The path as an SVG picture: one box per hop, top to bottom, with the stage, the place, the
/// note and the rule that decided; the box where the packet was dropped is red, and the verdict
/// closes the column.
pub fn svg(t: &Trace) -> String {
    const BOX_H: usize = 58;
    const GAP: usize = 18;
    let p = &t.packet;
    // Wide enough for the longest line at 12px monospace (~7.3px a character).
    let longest = t
        .hops
        .iter()
        .flat_map(|h| {
            [
                h.note.chars().count(),
                h.rule.as_deref().map_or(0, |r| r.chars().count()),
            ]
        })
        .chain(t.fixes.iter().map(|f| f.chars().count() + 8))
        .chain(t.cause.iter().map(|c| c.chars().count() + 20))
        .max()
        .unwrap_or(0);
    let w = (longest * 73 / 10 + 60).max(900);
    let n = t.hops.len();
    let height = 70 + n * (BOX_H + GAP) + 60 + 18 * t.fixes.len();
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"monospace\" font-size=\"12\">\n"
    );
    out.push_str(&format!(
        "<text x=\"10\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        xml_escape(&format!(
            "{} {}:{} → {}:{} in {}",
            p.proto.name(),
            p.src,
            p.sport,
            p.dst,
            p.dport,
            p.iif
        ))
    ));
    let dropped_at = match t.verdict {
        Verdict::Dropped => n.checked_sub(1),
        Verdict::Delivered => None,
    };
    for (i, h) in t.hops.iter().enumerate() {
        let y = 40 + i * (BOX_H + GAP);
        let (fill, stroke) = if Some(i) == dropped_at {
            ("#fde2e2", "#c0392b")
        } else if h.stage.starts_with("reply") {
            ("#e8f0fe", "#4a6fa5")
        } else {
            ("#eef7ee", "#4a8a4a")
        };
        out.push_str(&format!(
            "<rect x=\"10\" y=\"{y}\" width=\"{}\" height=\"{BOX_H}\" rx=\"6\" fill=\"{fill}\" stroke=\"{stroke}\"/>\n",
            w - 20
        ));
        out.push_str(&format!(
            "<text x=\"20\" y=\"{}\" font-weight=\"bold\">{}</text>\n",
            y + 17,
            xml_escape(&format!("{}  {}", h.stage, h.place))
        ));
        out.push_str(&format!(
            "<text x=\"20\" y=\"{}\">{}</text>\n",
            y + 34,
            xml_escape(&h.note)
        ));
        if let Some(r) = &h.rule {
            out.push_str(&format!(
                "<text x=\"20\" y=\"{}\" fill=\"#555\">{}</text>\n",
                y + 50,
                xml_escape(r)
            ));
        }
        if i + 1 < n {
            let (x, y1, y2) = (w / 2, y + BOX_H, y + BOX_H + GAP);
            out.push_str(&format!(
                "<line x1=\"{x}\" y1=\"{y1}\" x2=\"{x}\" y2=\"{y2}\" stroke=\"#333\"/><path d=\"M{} {} L{x} {y2} L{} {} Z\" fill=\"#333\"/>\n",
                x - 4,
                y2 - 6,
                x + 4,
                y2 - 6
            ));
        }
    }
    let y = 40 + n * (BOX_H + GAP) + 16;
    let verdict = match t.verdict {
        Verdict::Delivered => "verdict: delivered".to_string(),
        Verdict::Dropped => format!("verdict: DROPPED: {}", t.cause.as_deref().unwrap_or("")),
    };
    let color = if t.verdict == Verdict::Delivered {
        "#2e7d32"
    } else {
        "#c0392b"
    };
    out.push_str(&format!(
        "<text x=\"10\" y=\"{y}\" font-weight=\"bold\" fill=\"{color}\">{}</text>\n",
        xml_escape(&verdict)
    ));
    for (i, f) in t.fixes.iter().enumerate() {
        out.push_str(&format!(
            "<text x=\"20\" y=\"{}\">{}</text>\n",
            y + 18 * (i + 1),
            xml_escape(&format!("fix {}: {f}", i + 1))
        ));
    }
    out.push_str("</svg>\n");
    out
}
