//! One netfilter hook: the iptables tables and nft base chains on it, run in priority order.

use super::packet::{Fact, Flow, Pkt};
use super::walker::{Dropped, Walker};

impl Walker<'_> {
    /// The netfilter chains of one hook in priority order; each one's verdict applied.
    pub(super) fn hook(&mut self, stage: &str, p: &mut Pkt) -> Result<(), Dropped> {
        let hook = stage.trim_start_matches("reply ");
        let mut slots: Vec<(i64, Slot)> = Vec::new();
        // An IPv6 packet meets ip6tables and nft's ip6 and inet tables; an IPv4 one iptables
        // and ip and inet.
        let st = self.st;
        let (ipt, nft_family) = if p.v6() {
            (st.ip6tables.as_ref(), "ip6")
        } else {
            (st.iptables.as_ref(), "ip")
        };
        if let Some(d) = ipt {
            for (table, prio) in iptables_tables(hook) {
                if d.chain(table, hook).is_some() {
                    slots.push((prio, Slot::Ipt(table)));
                } else if d.partial && matches!(table, "filter" | "nat") {
                    // A cut dump without this chain: not shown, not absent.
                    slots.push((prio, Slot::IptUnseen(table)));
                }
            }
        }
        if let Some(rs) = &self.st.nft {
            for c in rs.base_chains(&hook.to_ascii_lowercase(), &[nft_family, "inet"]) {
                // iptables-nft's own tables are read from iptables-save (their xt expressions
                // carry no meaning in JSON).
                if ipt.is_some()
                    && c.family == nft_family
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
                Slot::IptUnseen(table) => {
                    if table == "nat" && (p.ct_state != "new" || p.nat_bound || p.skip_nat) {
                        continue;
                    }
                    self.ipt_unseen(table, hook, stage, p)?;
                }
                Slot::Ipt(table) => {
                    if table == "nat" && (p.ct_state != "new" || p.nat_bound || p.skip_nat) {
                        continue;
                    }
                    let d = ipt.expect("checked");
                    let flow = self.ipt_chain(d, table, hook, p, stage, 0);
                    let place = format!("{} {table} {hook}", ipt_name(p));
                    match flow {
                        Flow::Drop(rule) => return Err(self.drop_cause(stage, &place, rule, p)),
                        Flow::Unknown(cause) => {
                            self.unknown_outcome = true;
                            return Err((cause, Vec::new()));
                        }
                        Flow::Accept => {}
                        Flow::Return => {
                            let chain = d.chain(table, hook);
                            let policy = chain.and_then(|c| c.policy.clone());
                            if policy.as_deref() == Some("DROP") {
                                let rule = format!(":{hook} DROP (policy)");
                                // The paste's counters are evidence the policy does drop.
                                let note = match chain.and_then(|c| c.policy_packets.as_deref()) {
                                    Some(n) => format!("no rule accepted it: the chain's policy (its counter in the paste: {n} packets dropped so far)"),
                                    None => "no rule accepted it: the chain's policy".to_string(),
                                };
                                self.hop(stage, place.clone(), Some(rule.clone()), note);
                                return Err(self.drop_cause(stage, &place, rule, p));
                            }
                        }
                    }
                }
                Slot::Nft(family, table, chain, policy, nat) => {
                    if nat && (p.nat_bound || p.skip_nat) {
                        continue;
                    }
                    let rs = self.st.nft.as_ref().expect("checked");
                    let flow = self.nft_chain(rs, &family, &table, &chain, p, stage, 0);
                    let place = format!("nft {family} {table} {chain}");
                    match flow {
                        Flow::Drop(rule) => return Err(self.drop_cause(stage, &place, rule, p)),
                        Flow::Unknown(cause) => {
                            self.unknown_outcome = true;
                            return Err((cause, Vec::new()));
                        }
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

    /// A built-in chain a cut dump does not show (`iptables-save | grep KUBE-SVC`, `-A` lines
    /// with no `*table` header): it has no rule for the packet, or one whose effect nobody can
    /// see, a fact the walk branches on (the second an unknown outcome).
    fn ipt_unseen(&mut self, table: &str, hook: &str, stage: &str, p: &Pkt) -> Result<(), Dropped> {
        let ipt = ipt_name(p);
        let fact = Fact::Unseen(format!("{ipt} {table} {hook}"));
        if self.fact(fact) == 0 {
            return Ok(());
        }
        let place = format!("{ipt} {table} {hook}");
        self.unknown_outcome = true;
        self.hop(
            stage,
            place.clone(),
            None,
            "not in the paste (cut): taken to have a rule for the packet",
        );
        Err((
            format!(
                "{stage}: {place} is not in the paste (cut with grep, or no `*{table}` header): what its rules do to the packet is unknown; settle it with `{ipt}-save -t {table}`"
            ),
            Vec::new(),
        ))
    }

    /// A netfilter drop, with fixes for the cases this module recognises.
    pub(super) fn drop_cause(&self, stage: &str, place: &str, rule: String, p: &Pkt) -> Dropped {
        if let Some(dropped) = self.policy_drop_cause(stage, &rule, p) {
            return dropped;
        }
        let mut fixes = Vec::new();
        if stage.ends_with("FORWARD") && rule.contains("policy") {
            // The tool of the packet's family: an IPv6 packet's FORWARD policy is ip6tables'.
            let ipt = ipt_name(p);
            fixes.push(format!("accept forwarded traffic the proxy marked for masquerade: {ipt} -A FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT (kube-proxy's KUBE-FORWARD does; the packet's mark here is {:#x})", p.mark));
            fixes.push(format!("accept replies: {ipt} -A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"));
            fixes.push(
                "or set the FORWARD policy to ACCEPT (loses the firewall's default deny)".into(),
            );
        }
        (format!("{stage}: dropped in {place} by `{rule}`"), fixes)
    }
}

pub(super) enum Slot {
    Ipt(&'static str),
    /// A table whose chain on the hook a cut dump does not show.
    IptUnseen(&'static str),
    /// family, table, chain, policy, is a nat chain
    Nft(String, String, String, String, bool),
}

/// `iptables` or, for an IPv6 packet, `ip6tables`: the dump a hop's rule is quoted from.
pub(super) fn ipt_name(p: &Pkt) -> &'static str {
    if p.v6() {
        "ip6tables"
    } else {
        "iptables"
    }
}

/// iptables tables on a hook, with their priorities.
pub(super) fn iptables_tables(hook: &str) -> Vec<(&'static str, i64)> {
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
