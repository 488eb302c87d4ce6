//! `weir doctor`'s checks: pure functions over a [`NodeState`] (and, for a pod's DNS, what was
//! probed from its namespace). Each returns a [`Check`] with a status, the evidence it rests on
//! (quoting the dump where it can) and the fix. A check whose inputs are missing says `skip`
//! and which output it needed, rather than guessing.

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde::Serialize;

use crate::iptables::{Dump, Rule as IptRule};
use crate::nft::Ruleset;
use crate::state::{NodeState, Output};

pub use crate::check::{Check, Status};

/// A pod's DNS configuration and what answered from inside its namespace.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PodDns {
    /// Where the resolv.conf came from (a path).
    pub source: String,
    pub resolv_conf: String,
    /// Each nameserver probed from the pod's namespace: `Ok(())` when it answered a query.
    pub probes: Vec<(IpAddr, Result<(), String>)>,
}

impl PodDns {
    /// The pod's resolv.conf saved in a directory (`pod-resolv.conf`): its lines can be
    /// checked, its nameservers cannot be probed.
    pub fn from_saved(st: &NodeState) -> Option<PodDns> {
        Some(PodDns {
            source: "pod-resolv.conf".into(),
            resolv_conf: st.pod_resolv_conf.clone()?,
            probes: Vec::new(),
        })
    }
}

/// Every check, in a fixed order.
pub fn run_all(st: &NodeState, pod: Option<&PodDns>) -> Vec<Check> {
    let mut checks = vec![
        br_netfilter(st),
        forwarding(st),
        forward_policy(st),
        stale_dnat(st),
        pod_dns(pod),
        conntrack(st),
        conntrack_nat(st),
        ipvs_vip_source(st),
        hairpin(st),
        rp_filter_refusals(st),
        mtu(st),
        eni_asymmetric(st),
        crate::doctor_policy::policy_dns(st.objects.as_ref()),
        crate::doctor_policy::policy_selector(st.objects.as_ref()),
        crate::doctor_policy::policy_named_port(st.objects.as_ref()),
        crate::doctor_policy::policy_ip_family(st.objects.as_ref()),
    ];
    for c in &mut checks {
        cannot_tell(c, st);
    }
    checks
}

/// The outputs each node check reads.
fn reads(check: &str) -> &'static [Output] {
    use Output::*;
    match check {
        "br-netfilter" | "forwarding" => &[Sysctl],
        "forward-policy" => &[IptablesSave, NftRuleset],
        "stale-dnat" => &[IptablesSave, NftRuleset, IpvsadmLn, IpRoute, IpAddr],
        "pod-dns" => &[PodResolvConf],
        "conntrack" => &[Sysctl, ConntrackStats],
        "conntrack-nat" => &[ConntrackList, IptablesSave, NftRuleset, IpvsadmLn],
        "ipvs-vip-source" => &[IpvsadmConns, IpvsadmLn],
        "hairpin" => &[HairpinMode, IpLink],
        "rp-filter-refusals" => &[IpRouteGet, KernelLog, Sysctl],
        "mtu" => &[IpLink],
        "eni-asymmetric" => &[IpRule, IpRoute, Sysctl],
        _ => &[],
    }
}

/// A check that reads an output nothing of which could be read (left out as if not
/// collected) cannot tell: never `ok` (a fault it found from the rest still stands).
fn cannot_tell(c: &mut Check, st: &NodeState) {
    let files: Vec<&str> = (st.unreadable.iter())
        .filter(|u| reads(c.id).contains(&u.output))
        .map(|u| u.file.as_str())
        .collect();
    if files.is_empty() {
        return;
    }
    if c.status == Status::Ok {
        c.status = Status::Skip;
    }
    c.note(format!("cannot tell: {} unreadable", files.join(", ")));
}

/// True when any check failed (the command's exit status).
pub fn any_failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.status == Status::Fail)
}

/// br_netfilter loaded and `bridge-nf-call-ip(6)tables` on: without them, traffic between two
/// pods on one bridge skips iptables, so a ClusterIP reply from a same-bridge backend is not
/// de-NATed (scenario 1 of the brief).
pub fn br_netfilter(st: &NodeState) -> Check {
    let mut c = Check::new(
        "br-netfilter",
        "br_netfilter and bridge-nf-call-ip(6)tables",
    );
    let Some(s) = &st.sysctls else {
        return c.skip("no sysctl output");
    };
    let bridges: Vec<&str> = st
        .links
        .iter()
        .flatten()
        .filter(|l| l.kind.as_deref() == Some("bridge"))
        .map(|l| l.name.as_str())
        .collect();
    let loaded = s.0.keys().any(|k| k.starts_with("net.bridge."));
    // Only a whole dump (`sysctl -a`, or `weir trace collect`'s cut, which keeps every
    // net.bridge.* key) shows the module missing by the keys' absence; a few pasted lines do not.
    if !loaded && !st.sysctls_whole() {
        return c.skip(format!(
            "the sysctl output ({} key(s){}) has no net.bridge.*: it cannot tell whether br_netfilter is loaded; needs `sysctl net.bridge` (or `sysctl -a`) as sysctl.txt",
            s.0.len(),
            if st.sysctls_cut { ", cut with grep" } else { "" }
        ));
    }
    if !loaded {
        let status = if bridges.is_empty() {
            Status::Warn
        } else {
            Status::Fail
        };
        c.found(
            status,
            "no net.bridge.* sysctls: the br_netfilter module is not loaded",
        );
        if !bridges.is_empty() {
            c.note(format!("bridges on this node: {}", bridges.join(", ")));
        }
        c.add_fix("modprobe br_netfilter (and list it in /etc/modules-load.d/), then sysctl -w net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1");
        return c;
    }
    for key in [
        "net.bridge.bridge-nf-call-iptables",
        "net.bridge.bridge-nf-call-ip6tables",
    ] {
        match s.int(key) {
            Some(1) => c.note(format!("{key} = 1")),
            Some(v) => {
                c.found(Status::Fail, format!("{key} = {v}"));
                c.add_fix(format!("sysctl -w {key}=1 (persist it in /etc/sysctl.d/)"));
            }
            None => c.found(Status::Warn, format!("{key} not in the sysctl output")),
        }
    }
    c
}

/// IPv4 forwarding (pods' traffic is routed through the node) and IPv6 forwarding.
pub fn forwarding(st: &NodeState) -> Check {
    let mut c = Check::new("forwarding", "ip_forward and IPv6 forwarding");
    let Some(s) = &st.sysctls else {
        return c.skip("no sysctl output");
    };
    if s.get("net.ipv4.ip_forward").is_none() && s.get("net.ipv4.conf.all.forwarding").is_none() {
        return c.skip("the sysctl output has neither net.ipv4.ip_forward nor net.ipv4.conf.all.forwarding: needs `sysctl net.ipv4.ip_forward` as sysctl.txt");
    }
    for key in ["net.ipv4.ip_forward", "net.ipv4.conf.all.forwarding"] {
        match s.int(key) {
            Some(1) => c.note(format!("{key} = 1")),
            Some(v) => {
                c.found(
                    Status::Fail,
                    format!("{key} = {v}: the node drops every pod packet it should route"),
                );
                c.add_fix("sysctl -w net.ipv4.ip_forward=1 (persist it in /etc/sysctl.d/)");
            }
            // ip_forward and conf.all.forwarding are one switch (writing either sets both):
            // the other one, present, decides.
            None => c.note(format!(
                "{key} not in the sysctl output (the same switch as the other key)"
            )),
        }
    }
    match s.int("net.ipv6.conf.all.forwarding") {
        Some(1) => c.note("net.ipv6.conf.all.forwarding = 1"),
        Some(v) => {
            // Only IPv6/dual-stack pods need it, and this check cannot tell whether they exist.
            c.found(Status::Warn, format!("net.ipv6.conf.all.forwarding = {v}: IPv6 pod traffic is not routed (fine for IPv4-only clusters)"));
            c.add_fix("for IPv6 or dual-stack pods: sysctl -w net.ipv6.conf.all.forwarding=1");
        }
        None => c.note("net.ipv6.conf.all.forwarding not in the sysctl output (IPv6 disabled?)"),
    }
    c
}

/// What the accept rules reachable from a forward chain let through.
#[derive(Debug, Default)]
struct Accepts {
    /// kube-proxy's masquerade-marked traffic (`--mark 0x4000/0x4000 -j ACCEPT`).
    marked: Option<String>,
    /// Replies (`--ctstate RELATED,ESTABLISHED -j ACCEPT`).
    established: Option<String>,
    /// An ACCEPT with no condition at all.
    everything: Option<String>,
    /// Chains a listing jumps to but does not show (`iptables -L FORWARD`): what they accept is
    /// unknown.
    unseen: Vec<String>,
    /// ACCEPTs of a listing without -v that look unconditional (their interfaces are hidden).
    hidden: Vec<String>,
}

/// Targets that are not chains (iptables' own and its extensions').
fn builtin_target(t: &str) -> bool {
    matches!(
        t,
        "ACCEPT"
            | "DROP"
            | "REJECT"
            | "RETURN"
            | "QUEUE"
            | "NFQUEUE"
            | "LOG"
            | "NFLOG"
            | "ULOG"
            | "MARK"
            | "CONNMARK"
            | "CONNSECMARK"
            | "SECMARK"
            | "DNAT"
            | "SNAT"
            | "MASQUERADE"
            | "REDIRECT"
            | "NETMAP"
            | "TCPMSS"
            | "TOS"
            | "TTL"
            | "DSCP"
            | "CLASSIFY"
            | "CHECKSUM"
            | "CT"
            | "NOTRACK"
            | "TRACE"
            | "AUDIT"
            | "TEE"
            | "TPROXY"
            | "SET"
    )
}

fn iptables_accepts(d: &Dump, table: &str, chain: &str, depth: usize, acc: &mut Accepts) {
    let Some(ch) = d.chain(table, chain) else {
        return;
    };
    if depth > 8 {
        return;
    }
    for r in &ch.rules {
        match r.target_name() {
            // A listing without -v hides interface matches: an ACCEPT that looks unconditional
            // may be for some interfaces only, so it is not taken as accepting everything.
            Some("ACCEPT") if d.ifaces_hidden => {
                let mut one = Accepts::default();
                classify_iptables_accept(r, &mut one);
                acc.marked = acc.marked.take().or(one.marked);
                acc.established = acc.established.take().or(one.established);
                if let Some(e) = one.everything {
                    if !acc.hidden.contains(&e) {
                        acc.hidden.push(e);
                    }
                }
            }
            Some("ACCEPT") => classify_iptables_accept(r, acc),
            Some(t) if d.chain(table, t).is_some() => iptables_accepts(d, table, t, depth + 1, acc),
            // A listing shows only the chains asked for; in iptables-save every chain jumped to is
            // declared, so an undeclared target there is an extension's, not a chain.
            Some(t) if d.listing && !builtin_target(t) && !acc.unseen.iter().any(|u| u == t) => {
                acc.unseen.push(t.to_string());
            }
            _ => {}
        }
    }
}

fn classify_iptables_accept(r: &IptRule, acc: &mut Accepts) {
    let conditions: Vec<_> = r
        .args
        .iter()
        .filter(|a| a.module.as_deref() != Some("comment"))
        .collect();
    if conditions.is_empty() {
        acc.everything.get_or_insert(r.text.clone());
    }
    if let Some(m) = r.module_arg("mark", "--mark") {
        let v = m.values.first().map(String::as_str).unwrap_or("");
        if !m.negated && mark_covers(v, 0x4000) {
            acc.marked.get_or_insert(r.text.clone());
        }
    }
    let state = r
        .module_arg("conntrack", "--ctstate")
        .or_else(|| r.module_arg("state", "--state"));
    if let Some(s) = state {
        if !s.negated && s.values.iter().any(|v| v.contains("ESTABLISHED")) {
            acc.established.get_or_insert(r.text.clone());
        }
    }
}

/// `0x4000/0x4000` or `0x4000` matches packets carrying `bit`.
fn mark_covers(v: &str, bit: u32) -> bool {
    let parse = |s: &str| {
        s.strip_prefix("0x")
            .map(|h| u32::from_str_radix(h, 16).ok())
            .unwrap_or_else(|| s.parse().ok())
    };
    let (m, mask) = match v.split_once('/') {
        Some((m, k)) => (parse(m), parse(k)),
        None => (parse(v), Some(u32::MAX)),
    };
    matches!((m, mask), (Some(m), Some(k)) if m & k == bit && k & bit == bit)
}

fn nft_accepts(
    rs: &Ruleset,
    family: &str,
    table: &str,
    chain: &str,
    depth: usize,
    acc: &mut Accepts,
) {
    if depth > 8 {
        return;
    }
    for r in rs
        .rules
        .iter()
        .filter(|r| r.family == family && r.table == table && r.chain == chain)
    {
        let t = r.text.trim_start_matches("counter ").trim();
        if t == "accept" || t == "counter accept" {
            acc.everything.get_or_insert(r.text.clone());
        }
        if t.ends_with("accept")
            && t.contains("mark")
            && (t.contains("0x4000") || t.contains("16384"))
        {
            acc.marked.get_or_insert(r.text.clone());
        }
        if t.ends_with("accept") && t.contains("ct state") && t.contains("established") {
            acc.established.get_or_insert(r.text.clone());
        }
        for word in ["jump ", "goto "] {
            if let Some(target) = t
                .split(word)
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
            {
                // nft refuses a jump to a chain that does not exist: one missing from the
                // ruleset is missing from the paste (`nft list table`, or cut), what it
                // accepts unknown.
                let known = rs
                    .chains
                    .iter()
                    .any(|c| c.family == family && c.table == table && c.name == target);
                if !known && !acc.unseen.iter().any(|u| u == target) {
                    acc.unseen.push(target.to_string());
                }
                nft_accepts(rs, family, table, target, depth + 1, acc);
            }
        }
    }
}

/// A line a reporter put in place of the lines they left out: `...`, `....`, `…`.
fn is_elision(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && t.chars().all(|c| c == '.' || c == '…') && (t.contains('…') || t.len() >= 3)
}

/// A FORWARD policy of DROP (iptables, or an nft filter chain on the forward hook) needs
/// kube-proxy's accept rules: masquerade-marked traffic (NodePort/LB traffic DNATed to a
/// backend elsewhere, including hostNetwork backends) and replies. firewalld's own table is
/// reported because its zones drop forwarded traffic unless configured.
pub fn forward_policy(st: &NodeState) -> Check {
    let mut c = Check::new(
        "forward-policy",
        "FORWARD drop policy without the proxy's accept rules",
    );
    if st.iptables.is_none() && st.nft.is_none() {
        return c.skip("neither iptables-save nor nft list ruleset output");
    }
    // A dump cut with grep (or without its table headers), or where the reporter elided
    // lines (`...`: k3s-io/k3s#1114's `iptables -L FORWARD`), may have lost the accept rules.
    let cut = st.assumptions.iter().any(|a| {
        a.starts_with("iptables-save.txt: cut with grep")
            || (a.starts_with("iptables-save.txt:") && a.contains("no `*table` header"))
    }) || st
        .skipped
        .iter()
        .any(|(o, s)| *o == Output::IptablesSave && is_elision(&s.text));
    let mut unjudged: Vec<String> = Vec::new();
    let mut judged = 0;
    if let Some(d) = &st.iptables {
        judged += iptables_forward(&mut c, d, cut, &mut unjudged);
    }
    if let Some(rs) = &st.nft {
        judged += nft_forward(&mut c, st, rs, cut);
        // An nft output none of which was read (kubernetes#97283 before its text was read):
        // nothing read is not a pass.
        if rs.is_empty() && st.skipped.iter().any(|(o, _)| *o == Output::NftRuleset) {
            unjudged.push("the nft output was not read (`nft list ruleset` or `nft -j list ruleset` as nft-ruleset.json would be)".to_string());
        }
    }
    // A FORWARD policy nobody could read is not a pass.
    if !unjudged.is_empty() && judged == 0 && c.status == Status::Ok {
        return c.skip(format!(
            "{}: the forward policy cannot be judged; needs the whole `iptables-save` (its *filter table) as iptables-save.txt",
            unjudged.join("; ")
        ));
    }
    for u in unjudged {
        c.note(u);
    }
    c
}

/// iptables' filter FORWARD: a catch-all reject in it, its drop policy. How many of the two
/// were judged; what could not be goes to `unjudged`.
fn iptables_forward(c: &mut Check, d: &Dump, cut: bool, unjudged: &mut Vec<String>) -> usize {
    let mut judged = 0;
    if let Some(ch) = d.chain("filter", "FORWARD") {
        if catch_all_reject(c, d, ch, cut) {
            judged += 1;
        }
    }
    match d.chain("filter", "FORWARD") {
        Some(ch) if ch.policy.as_deref() == Some("DROP") => {
            let mut acc = Accepts::default();
            iptables_accepts(d, "filter", "FORWARD", 0, &mut acc);
            judge_forward(c, "iptables filter FORWARD".into(), &acc, cut);
            judged += 1;
        }
        Some(ch) if ch.policy.is_some() => c.note(format!(
            "iptables filter FORWARD policy {}",
            ch.policy.as_deref().unwrap_or_default()
        )),
        Some(_) => unjudged.push(
            "iptables filter FORWARD's policy line (`:FORWARD DROP [..]`) is not in the dump"
                .to_string(),
        ),
        None => unjudged.push("iptables-save has no filter FORWARD chain".to_string()),
    }
    judged
}

/// nft base chains on the forward hook (but iptables-nft's, judged from iptables-save) and
/// firewalld's table. How many chains were judged.
fn nft_forward(c: &mut Check, st: &NodeState, rs: &Ruleset, cut: bool) -> usize {
    let mut judged = 0;
    for ch in rs.base_chains("forward", &["ip", "inet"]) {
        let hook = ch.hook.as_ref().expect("base chain");
        // iptables-nft's own chains are judged from iptables-save above.
        let compat = rs
            .rules
            .iter()
            .any(|r| r.family == ch.family && r.table == ch.table && r.uses_xt);
        if compat || (st.iptables.is_some() && ch.family == "ip" && ch.table == "filter") {
            continue;
        }
        judged += 1;
        if hook.policy == "drop" {
            let mut acc = Accepts::default();
            nft_accepts(rs, &ch.family, &ch.table, &ch.name, 0, &mut acc);
            judge_forward(
                c,
                format!("nft chain {} {} {}", ch.family, ch.table, ch.name),
                &acc,
                cut,
            );
        }
    }
    if rs.tables.iter().any(|t| t.name == "firewalld") {
        c.found(Status::Warn, "firewalld is active (table inet firewalld): its zones drop forwarded traffic unless pod and service traffic is allowed");
        c.add_fix("put the pod interfaces (cni0, veths) in a trusted zone or allow forwarding between zones, or stop firewalld");
    }
    judged
}

/// A chain `what` with policy drop: what it accepts first (everything; marked traffic and
/// replies), and what is missing, judged as far as the dump (`cut`: by grep) can show it.
fn judge_forward(c: &mut Check, what: String, acc: &Accepts, cut: bool) {
    if let Some(e) = &acc.everything {
        c.note(format!(
            "{what} has policy drop, but accepts everything first: {e}"
        ));
        return;
    }
    let mut missing = Vec::new();
    match &acc.marked {
        Some(r) => c.note(format!("{what}: marked (0x4000) traffic accepted by `{r}`")),
        None => missing.push("masquerade-marked (0x4000) traffic: NodePort/LoadBalancer traffic to a backend elsewhere, hostNetwork backends included"),
    }
    match &acc.established {
        Some(r) => c.note(format!("{what}: replies accepted by `{r}`")),
        None => missing.push("RELATED,ESTABLISHED replies"),
    }
    if !missing.is_empty() && !acc.hidden.is_empty() {
        c.found(
            Status::Warn,
            format!(
                "{what} has policy drop and no accept for {}; the listing (without -v) shows {} with no condition, but it hides interface matches: it may accept only some interfaces; needs `iptables -L -n -v` or `iptables-save`",
                missing.join(", nor "),
                acc.hidden.iter().map(|h| format!("`{h}`")).collect::<Vec<_>>().join(", ")
            ),
        );
    } else if !missing.is_empty() && cut && what.starts_with("iptables") {
        c.found(
            Status::Warn,
            format!(
                "{what} has policy drop and the dump shows no accept for {}; but the output was cut (grep, no table headers, or lines elided with `...`): the accepts may be in what was cut; needs the whole `iptables-save` as iptables-save.txt",
                missing.join(", nor ")
            ),
        );
    } else if !missing.is_empty() && !acc.unseen.is_empty() {
        let needs = if what.starts_with("nft") {
            "the whole `nft list ruleset`"
        } else {
            "the whole `iptables-save` (or `iptables -L -n -v` of every chain) as iptables-save.txt"
        };
        c.found(
            Status::Warn,
            format!(
                "{what} has policy drop and the dump shows no accept for {}; but it jumps to {}, which the paste does not show: their accepts are unknown; needs {needs}",
                missing.join(", nor "),
                acc.unseen.join(", ")
            ),
        );
        c.add_fix("if nothing in those chains accepts the forwarded traffic, let the proxy install its forward accept rules (kube-proxy's KUBE-FORWARD), add accepts for the overlay/pod interfaces (e.g. `iptables -A FORWARD -o flannel.1 -j ACCEPT`), or set the FORWARD policy to ACCEPT");
    } else if !missing.is_empty() {
        c.found(
            Status::Fail,
            format!(
                "{what} has policy drop and no accept for {}",
                missing.join(", nor ")
            ),
        );
        c.add_fix("let the proxy install its forward accept rules (kube-proxy's KUBE-FORWARD: `-m mark --mark 0x4000/0x4000 -j ACCEPT` and `-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`; is it running with the same --iptables-masquerade-bit?), or add them, or set the policy to ACCEPT");
    }
}

/// A rule in FORWARD itself that rejects or drops everything reaching it (firewalld's
/// `-A FORWARD -j REJECT --reject-with icmp-host-prohibited`) is the chain's effective policy,
/// whatever its policy line says: what the rules before it do not accept is refused, and ACCEPTs
/// after it (a CNI's, appended later: kubeadm#139, kubernetes#81635) are never reached. Fails
/// when such ACCEPTs are in the dump; warns otherwise (what the chains jumped to before it
/// accept is not judged here). True when there is such a rule.
fn catch_all_reject(c: &mut Check, d: &Dump, ch: &crate::iptables::Chain, cut: bool) -> bool {
    let unconditional = |r: &IptRule| {
        r.args
            .iter()
            .all(|a| a.module.as_deref() == Some("comment"))
    };
    let Some(idx) = ch
        .rules
        .iter()
        .position(|r| matches!(r.target_name(), Some("REJECT" | "DROP")) && unconditional(r))
    else {
        return false;
    };
    let r = &ch.rules[idx];
    let verb = if r.target_name() == Some("REJECT") {
        "rejected (the client sees \"No route to host\" for icmp-host-prohibited)"
    } else {
        "dropped"
    };
    let jumps: Vec<&str> = ch.rules[..idx]
        .iter()
        .filter_map(|x| x.target_name())
        .filter(|t| !builtin_target(t))
        .collect();
    let dead: Vec<String> = ch.rules[idx + 1..]
        .iter()
        .filter(|x| x.target_name() == Some("ACCEPT"))
        .map(|x| format!("`{}`", x.text))
        .collect();
    let mut text = format!(
        "iptables filter FORWARD rule {} is a catch-all {}: `{}`; forwarded traffic the rules before it do not accept is {verb}",
        idx + 1,
        r.target_name().unwrap_or_default(),
        r.text
    );
    if !jumps.is_empty() {
        text.push_str(&format!(
            " (before it: jumps to {}{})",
            jumps.join(", "),
            if jumps.iter().any(|j| d.chain("filter", j).is_none()) {
                ", not all in the dump"
            } else {
                ""
            }
        ));
    }
    if dead.is_empty() {
        text.push_str("; any ACCEPT appended after it (a CNI's, added with -A) is never reached");
        if cut {
            text.push_str(" (the dump was cut: what follows it is not shown)");
        }
        c.found(Status::Warn, text);
    } else {
        text.push_str(&format!(
            "; the ACCEPTs after it are never reached: {}",
            dead.join(", ")
        ));
        c.found(Status::Fail, text);
    }
    c.add_fix("put the pod network's accepts before the catch-all (e.g. `iptables -I FORWARD 1 -s 10.244.0.0/16 -j ACCEPT` and `-d 10.244.0.0/16`, with your cluster CIDR), or trust the pod and overlay interfaces in firewalld (`firewall-cmd --zone=trusted --add-interface=cni0`), or remove the catch-all");
    true
}

/// DNAT targets from iptables (`--to-destination`) and nft (`dnat to ADDR`), each with the rule.
pub fn dnat_targets(st: &NodeState) -> Vec<(IpAddr, String)> {
    let mut out = Vec::new();
    for d in [&st.iptables, &st.ip6tables].into_iter().flatten() {
        for (_, _, r) in d.rules() {
            if r.target_name() != Some("DNAT") {
                continue;
            }
            if let Some(to) = r.target_arg("--to-destination") {
                if let Some(ip) = parse_nat_addr(to) {
                    out.push((ip, r.text.clone()));
                }
            }
        }
    }
    if let Some(rs) = &st.nft {
        for r in &rs.rules {
            for e in &r.expr {
                let Some(addr) = e
                    .get("dnat")
                    .and_then(|d| d.get("addr"))
                    .and_then(|a| a.as_str())
                else {
                    continue;
                };
                if let Ok(ip) = addr.parse() {
                    out.push((
                        ip,
                        format!("{} {} {}: {}", r.family, r.table, r.chain, r.text),
                    ));
                }
            }
        }
    }
    out
}

/// `10.0.0.1:80`, `10.0.0.1`, `[fd00::1]:80`, `10.0.0.1-10.0.0.3:80` (the first address).
fn parse_nat_addr(to: &str) -> Option<IpAddr> {
    if let Some(rest) = to.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    if let Ok(ip) = to.parse() {
        return Some(ip);
    }
    let host = to.rsplit_once(':').map(|(h, _)| h).unwrap_or(to);
    host.split('-').next()?.parse().ok()
}

/// A DNAT target is **dead** when this node can tell nobody has it: no route to it, a
/// blackhole/unreachable/prohibit route, a directly connected route through an interface that
/// is missing or down, or a neighbour entry in state FAILED/INCOMPLETE. A target behind a
/// gateway is not verifiable from this node (reported, not judged); a directly connected one
/// with no neighbour entry is idle or gone (reported). Lookups use the main table: the proxy's
/// DNAT happens before policy routing sees the packet's source, so this is the common case.
pub fn stale_dnat(st: &NodeState) -> Check {
    let mut c = Check::new(
        "stale-dnat",
        "DNAT targets that are no longer anyone's address",
    );
    if st.iptables.is_none() && st.nft.is_none() && st.ipvs.is_none() {
        return c.skip("neither iptables-save, nft list ruleset nor ipvsadm -Ln output");
    }
    if st.routes.is_none() {
        return c.skip("no ip route output to look the targets up in");
    }
    let mut targets = dnat_targets(st);
    // IPVS's real servers are its DNAT targets (masquerading forwarding).
    if let Some(text) = &st.ipvs {
        let vs = crate::ipvs::parse(text).value;
        let before = targets.len();
        for v in &vs {
            for r in &v.real_servers {
                targets.push((r.addr.ip(), format!("IPVS `{}` -> {}", v.text, r.addr)));
            }
        }
        c.note(format!(
            "{} IPVS real server(s) of {} virtual server(s) included{}",
            targets.len() - before,
            vs.len(),
            if vs.iter().any(|v| v.cut) {
                " (ipvsadm output cut with grep: only those shown)"
            } else {
                ""
            }
        ));
    }
    let mut seen = BTreeSet::new();
    let (mut local, mut remote, mut verified, mut idle) = (0, 0, 0, Vec::new());
    for (ip, rule) in &targets {
        if !seen.insert(*ip) {
            continue;
        }
        if st.is_local_address(*ip) {
            local += 1;
            continue;
        }
        let Some(route) = st.lookup("main", *ip) else {
            c.found(
                Status::Fail,
                format!("{ip}: no route in table main; rule `{rule}`"),
            );
            continue;
        };
        if matches!(
            route.kind.as_str(),
            "blackhole" | "unreachable" | "prohibit"
        ) {
            c.found(
                Status::Fail,
                format!("{ip}: route `{}`; rule `{rule}`", route.text),
            );
            continue;
        }
        if route.gateway.is_some() {
            remote += 1;
            continue;
        }
        let dev = route.dev.clone().unwrap_or_default();
        match (&st.links, st.link(&dev)) {
            (Some(_), None) => {
                c.found(
                    Status::Fail,
                    format!(
                        "{ip}: its route `{}` names {dev}, which does not exist; rule `{rule}`",
                        route.text
                    ),
                );
                continue;
            }
            (_, Some(l)) if !l.up => {
                c.found(
                    Status::Fail,
                    format!(
                        "{ip}: its route `{}` goes through {dev}, which is down; rule `{rule}`",
                        route.text
                    ),
                );
                continue;
            }
            _ => {}
        }
        let neigh = st
            .neighbours
            .iter()
            .flatten()
            .find(|n| n.dst == *ip && n.dev == dev);
        match neigh.map(|n| n.state.as_str()) {
            Some(s @ ("FAILED" | "INCOMPLETE")) => c.found(
                Status::Fail,
                format!("{ip}: on {dev}'s link, neighbour entry {s} (nobody answers ARP/ND for it); rule `{rule}`"),
            ),
            Some(_) => verified += 1,
            None => idle.push(ip.to_string()),
        }
    }
    c.note(format!(
        "{} DNAT target(s): {local} local, {verified} answering on a local link, {remote} behind a gateway (not verifiable from this node)",
        seen.len()
    ));
    if !idle.is_empty() {
        c.note(format!(
            "on a local link without a neighbour entry (idle, or gone; send traffic and re-check): {}",
            idle.join(", ")
        ));
    }
    if st.neighbours.is_none() {
        c.note("no ip neigh output: neighbour states not checked");
    }
    if c.status == Status::Fail {
        c.add_fix("the rules point at endpoints that left (a host whose IP changed, a deleted pod): make the proxy resync (check its logs and the Service's EndpointSlices), or remove the stale rules");
    }
    c
}

/// The pod's resolv.conf nameservers: present, not host-only (a loopback address inside the
/// pod's namespace is the pod itself: resolv.conf copied from a host running systemd-resolved
/// or dnsmasq), and answering a query sent from the pod's namespace.
pub fn pod_dns(pod: Option<&PodDns>) -> Check {
    let mut c = Check::new("pod-dns", "pod resolv.conf nameservers dead or host-only");
    let Some(pod) = pod else {
        return c.skip("no --pod-netns given, and no pod-resolv.conf in the directory");
    };
    let servers = nameservers(&pod.resolv_conf);
    let mut unprobed: Vec<String> = Vec::new();
    if servers.is_empty() {
        c.found(Status::Fail, format!("{}: no nameserver line", pod.source));
        c.add_fix(
            "give the pod a resolv.conf with the cluster DNS ClusterIP (dnsPolicy ClusterFirst)",
        );
        return c;
    }
    for ip in servers {
        if ip.is_loopback() {
            c.found(Status::Fail, format!("{}: nameserver {ip} is host-only: in the pod's namespace it is the pod's own loopback", pod.source));
            c.add_fix("do not copy the host's resolv.conf into pods (kubelet --resolv-conf=/run/systemd/resolve/resolv.conf on systemd-resolved hosts); use the cluster DNS ClusterIP");
            continue;
        }
        match pod.probes.iter().find(|(p, _)| *p == ip).map(|(_, r)| r) {
            Some(Ok(())) => c.note(format!("nameserver {ip} answers from the pod's namespace")),
            Some(Err(e)) => {
                c.found(
                    Status::Fail,
                    format!(
                        "nameserver {ip} (from {}) does not answer from the pod's namespace: {e}",
                        pod.source
                    ),
                );
                c.add_fix("point the pod at a live server (the cluster DNS ClusterIP); a resolv.conf copied from a DHCP-managed host may name a server that has since gone");
            }
            None if pod.probes.is_empty() => unprobed.push(ip.to_string()),
            None => c.found(Status::Warn, format!("nameserver {ip} was not probed")),
        }
    }
    if !unprobed.is_empty() {
        let why = format!(
            "nameserver {} not probed: {} is a saved file, and whether a server answers can only be asked from the pod's namespace (`weir doctor --pod-netns NS` on the node)",
            unprobed.join(", "),
            pod.source
        );
        if c.status == Status::Ok {
            return c.skip(why);
        }
        c.note(why);
    }
    c
}

/// `nameserver` addresses of a resolv.conf, in order.
pub fn nameservers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("nameserver")).then(|| w.next()).flatten()
        })
        .filter_map(|a| a.split('%').next().and_then(|a| a.parse().ok()))
        .collect()
}

/// Conntrack table pressure: entries against `nf_conntrack_max` (new connections are dropped
/// at the limit: "nf_conntrack: table full, dropping packet"), and `conntrack -S` drop counters.
pub fn conntrack(st: &NodeState) -> Check {
    let mut c = Check::new("conntrack", "conntrack table pressure");
    // The kernel's own word that the table was full (kubernetes#71261's `dmesg -T`).
    let full = st.conntrack_full.as_deref().unwrap_or_default();
    if let Some(first) = full.first() {
        c.found(
            Status::Fail,
            format!(
                "kernel log: {} `nf_conntrack: table full, dropping packet` line(s): the table was full and the kernel dropped packets of new connections (`{first}`)",
                full.len()
            ),
        );
    }
    let counts = st.sysctls.as_ref().and_then(|s| {
        Some((
            s.int("net.netfilter.nf_conntrack_count")?,
            s.int("net.netfilter.nf_conntrack_max")?,
        ))
    });
    match (counts, &st.sysctls) {
        (Some((count, max)), _) => {
            let pct = if max > 0 { count * 100 / max } else { 100 };
            let line = format!("{count} of {max} entries ({pct}%)");
            if pct >= 90 {
                c.found(Status::Fail, line);
            } else if pct >= 75 {
                c.found(Status::Warn, line);
            } else {
                c.note(line);
            }
        }
        // `conntrack -S` alone still shows drops: judged, with the fill level said unknown.
        (None, _) if st.conntrack_stats.is_some() => c.note(
            "nf_conntrack_count/max not in the dump: the table's fill level is unknown (needs `sysctl net.netfilter.nf_conntrack_count net.netfilter.nf_conntrack_max` as sysctl.txt)",
        ),
        (None, None) if !full.is_empty() => c.note(
            "no sysctl output: the table's fill level now is unknown (needs `sysctl net.netfilter.nf_conntrack_count net.netfilter.nf_conntrack_max` as sysctl.txt)",
        ),
        (None, None) => return c.skip("no sysctl output and no conntrack -S output"),
        (None, Some(_)) => {
            return c.skip(
                "nf_conntrack_count/max not in the sysctl output (nf_conntrack not loaded?)",
            )
        }
    }
    if let Some(stats) = &st.conntrack_stats {
        let total = |key: &str| -> u64 {
            stats
                .split_whitespace()
                .filter_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
                .filter_map(|v| v.parse::<u64>().ok())
                .sum()
        };
        let (drop, early, failed) = (total("drop"), total("early_drop"), total("insert_failed"));
        if drop + early > 0 {
            c.found(Status::Warn, format!("conntrack -S: drop={drop} early_drop={early} insert_failed={failed} (summed over CPUs)"));
        } else {
            c.note(format!(
                "conntrack -S: drop=0 early_drop=0 insert_failed={failed}"
            ));
        }
    }
    if c.status >= Status::Warn {
        c.add_fix("raise net.netfilter.nf_conntrack_max (and nf_conntrack_buckets), or find what opens so many connections (conntrack -L | sort by source)");
    }
    c
}

/// A Service's address and port as the dump's proxy rules give it, with its endpoints now.
#[derive(Debug)]
struct ServiceNow {
    proto: String,
    vip: IpAddr,
    port: u16,
    endpoints: BTreeSet<(IpAddr, Option<u16>)>,
    /// The rule or virtual server it comes from.
    source: String,
}

/// DNAT targets reachable from an iptables nat chain (kube-proxy's KUBE-SVC-… → KUBE-SEP-…).
fn iptables_dnat_from(
    d: &Dump,
    chain: &str,
    depth: usize,
    out: &mut BTreeSet<(IpAddr, Option<u16>)>,
) {
    let Some(ch) = d.chain("nat", chain) else {
        return;
    };
    if depth > 8 {
        return;
    }
    for r in &ch.rules {
        match r.target_name() {
            Some("DNAT") => {
                if let Some(to) = r.target_arg("--to-destination") {
                    if let Some(ip) = parse_nat_addr(to) {
                        let port = to.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
                        out.insert((ip, port));
                    }
                }
            }
            Some(t) if d.chain("nat", t).is_some() => iptables_dnat_from(d, t, depth + 1, out),
            _ => {}
        }
    }
}

/// The Services the dump's proxy rules show: iptables nat rules matching one address and port
/// that lead to DNATs, kube-proxy's filter REJECTs for Services without endpoints, and IPVS
/// virtual servers.
fn services_now(st: &NodeState) -> Vec<ServiceNow> {
    let mut out: Vec<ServiceNow> = Vec::new();
    if let Some(d) = &st.iptables {
        for (table, _, r) in d.rules() {
            let Some(dst) = r.arg("-d").filter(|a| !a.negated) else {
                continue;
            };
            let Some(vip) = dst
                .values
                .first()
                .and_then(|v| v.strip_suffix("/32").unwrap_or(v).parse::<IpAddr>().ok())
            else {
                continue;
            };
            let Some(port) = r
                .args
                .iter()
                .find(|a| a.name == "--dport" && !a.negated)
                .and_then(|a| a.values.first()?.parse::<u16>().ok())
            else {
                continue;
            };
            let proto = r
                .arg("-p")
                .and_then(|a| a.values.first().cloned())
                .map(|p| match p.as_str() {
                    "6" => "tcp".to_string(),
                    "17" => "udp".to_string(),
                    _ => p,
                })
                .unwrap_or_else(|| "tcp".into());
            let mut endpoints = BTreeSet::new();
            match (table, r.target_name()) {
                ("nat", Some(t)) if d.chain("nat", t).is_some() => {
                    iptables_dnat_from(d, t, 0, &mut endpoints);
                    if endpoints.is_empty() {
                        // A jump to marking chains only (KUBE-MARK-MASQ): not a Service rule.
                        continue;
                    }
                }
                ("nat", Some("DNAT")) => iptables_dnat_from_rule(r, &mut endpoints),
                ("filter", Some("REJECT"))
                    if r.comment().is_some_and(|c| c.contains("has no endpoints")) => {}
                _ => continue,
            }
            match out
                .iter_mut()
                .find(|s| s.proto == proto && s.vip == vip && s.port == port)
            {
                Some(s) => s.endpoints.extend(endpoints),
                None => out.push(ServiceNow {
                    proto,
                    vip,
                    port,
                    endpoints,
                    source: r.text.clone(),
                }),
            }
        }
    }
    if let Some(text) = &st.ipvs {
        for vs in crate::ipvs::parse(text).value {
            if let crate::ipvs::VirtualKey::Addr(proto, a) = &vs.key {
                out.push(ServiceNow {
                    proto: proto.clone(),
                    vip: a.ip(),
                    port: a.port(),
                    endpoints: vs
                        .real_servers
                        .iter()
                        .map(|r| (r.addr.ip(), Some(r.addr.port())))
                        .collect(),
                    source: vs.text.clone(),
                });
            }
        }
    }
    out
}

fn iptables_dnat_from_rule(r: &IptRule, out: &mut BTreeSet<(IpAddr, Option<u16>)>) {
    if let Some(to) = r.target_arg("--to-destination") {
        if let Some(ip) = parse_nat_addr(to) {
            out.insert((ip, to.rsplit_once(':').and_then(|(_, p)| p.parse().ok())));
        }
    }
}

fn endpoint_text(e: &(IpAddr, Option<u16>)) -> String {
    match e.1 {
        Some(p) => format!("{}:{p}", e.0),
        None => e.0.to_string(),
    }
}

/// A connection's protocol, original destination and port.
type DstKey = (String, IpAddr, Option<u16>);

/// Conntrack entries whose NAT binding the rules no longer give: a connection to a Service
/// that was not DNATed (made while the Service had no endpoints, or before its rules: a UDP
/// client that keeps sending keeps such an entry alive, and its packets keep bypassing the
/// DNAT — kubernetes#48370), or one DNATed to an address that is no longer an endpoint.
/// Without the proxy's rules in the dump, entries to one destination that were DNATed while
/// others to it were not say the same.
pub fn conntrack_nat(st: &NodeState) -> Check {
    let mut c = Check::new(
        "conntrack-nat",
        "conntrack entries bypassing a Service's current DNAT",
    );
    let Some(entries) = &st.conntrack else {
        return c.skip("no `conntrack -L` output");
    };
    let services = services_now(st);
    let mut deletes: Vec<String> = Vec::new();
    let (judged, stale) = stale_service_entries(&mut c, entries, &services, &mut deletes);
    let mixed = mixed_destinations(&mut c, entries, &services, &mut deletes);
    if stale + mixed > 0 {
        c.add_fix(format!(
            "delete the stale entries so the next packet is DNATed again: {} (kube-proxy flushes UDP entries of a Service whose endpoints go from none to some since kubernetes#48370's fix; check its version)",
            deletes.join("; ")
        ));
        return c;
    }
    if judged > 0 {
        c.note(format!(
            "{judged} of {} entries are to Services in the dump's rules, each bound to a current endpoint",
            entries.len()
        ));
        return c;
    }
    let unnat = entries.iter().filter(|e| e.dnat().is_none()).count();
    c.skip(format!(
        "{} conntrack entr{} ({unnat} not DNATed), but no proxy rules in the dump say which destinations are Services and where they go now: needs `iptables-save` (or `ipvsadm -Ln`) as iptables-save.txt",
        entries.len(),
        if entries.len() == 1 { "y" } else { "ies" }
    ))
}

/// Entries to a Service of the dump's rules that bypass its current DNAT: not DNATed though it
/// has endpoints now, or DNATed to an endpoint it no longer has. How many entries were to a
/// Service, and how many of them are stale (their deletes go to `deletes`).
fn stale_service_entries(
    c: &mut Check,
    entries: &[crate::conntrack::Entry],
    services: &[ServiceNow],
    deletes: &mut Vec<String>,
) -> (usize, usize) {
    let (mut judged, mut stale) = (0, 0);
    for e in entries {
        let (Some(dport), true) = (e.orig.dport, e.orig.dst.is_ipv4()) else {
            continue;
        };
        let Some(svc) = services
            .iter()
            .find(|s| s.proto == e.proto && s.vip == e.orig.dst && s.port == dport)
        else {
            continue;
        };
        judged += 1;
        match e.dnat() {
            None if !svc.endpoints.is_empty() => {
                stale += 1;
                c.found(
                    Status::Warn,
                    format!(
                        "{} was not DNATed (its reply comes from {} itself{}), but {}:{dport}/{} has endpoints now ({}, per `{}`): the entry was made while the Service had none (or before its rules), and its packets bypass the DNAT for as long as it lives (`{}`)",
                        e.summary(),
                        e.orig.dst,
                        if e.unreplied { ", and nothing has answered" } else { "" },
                        svc.vip,
                        svc.proto,
                        svc.endpoints.iter().map(endpoint_text).collect::<Vec<_>>().join(", "),
                        svc.source,
                        e.text
                    ),
                );
            }
            Some(to)
                if !svc.endpoints.is_empty()
                    && !svc
                        .endpoints
                        .iter()
                        .any(|x| x.0 == to.0 && (x.1.is_none() || x.1 == to.1)) =>
            {
                stale += 1;
                c.found(
                    Status::Warn,
                    format!(
                        "{} is DNATed to {}, which is not an endpoint of {}:{dport}/{} now ({}, per `{}`): its packets keep going to the old endpoint (`{}`)",
                        e.summary(),
                        endpoint_text(&to),
                        svc.vip,
                        svc.proto,
                        svc.endpoints.iter().map(endpoint_text).collect::<Vec<_>>().join(", "),
                        svc.source,
                        e.text
                    ),
                );
            }
            _ => continue,
        }
        let d = format!("conntrack -D -p {} --orig-dst {}", e.proto, e.orig.dst);
        if !deletes.contains(&d) {
            deletes.push(d);
        }
    }
    (judged, stale)
}

/// Without the rules: entries to one destination (not a known Service), some DNATed and some
/// not. How many such destinations (their deletes go to `deletes`).
fn mixed_destinations(
    c: &mut Check,
    entries: &[crate::conntrack::Entry],
    services: &[ServiceNow],
    deletes: &mut Vec<String>,
) -> usize {
    let mut mixed = 0;
    let mut groups: Vec<(DstKey, Vec<&crate::conntrack::Entry>)> = Vec::new();
    for e in entries {
        let key = (e.proto.clone(), e.orig.dst, e.orig.dport);
        if services
            .iter()
            .any(|s| s.proto == key.0 && s.vip == key.1 && Some(s.port) == key.2)
        {
            continue;
        }
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(e),
            None => groups.push((key, vec![e])),
        }
    }
    for ((proto, dst, dport), es) in &groups {
        let natted: BTreeSet<String> = es
            .iter()
            .filter_map(|e| e.dnat())
            .map(|t| endpoint_text(&t))
            .collect();
        let plain: Vec<&&crate::conntrack::Entry> =
            es.iter().filter(|e| e.dnat().is_none()).collect();
        if natted.is_empty() || plain.is_empty() {
            continue;
        }
        mixed += 1;
        let dst = match dport {
            Some(p) => format!("{dst}:{p}"),
            None => dst.to_string(),
        };
        c.found(
            Status::Warn,
            format!(
                "{proto} connections to {dst} were DNATed (to {}) and {} were not ({}): if the rules DNAT every connection to {dst} (a Service), those bypass it, made while it had no endpoints or no rules",
                natted.into_iter().collect::<Vec<_>>().join(", "),
                plain.len(),
                plain.iter().map(|e| format!("`{}`", e.text)).collect::<Vec<_>>().join(", ")
            ),
        );
        let d = format!("conntrack -D -p {proto} --orig-dst {}", es[0].orig.dst);
        if !deletes.contains(&d) {
            deletes.push(d);
        }
    }
    mixed
}

/// IPVS connections whose source is a virtual server's own address: in IPVS mode every
/// ClusterIP is an address of kube-ipvs0, so a connection the node opens to a ClusterIP takes
/// the ClusterIP as its source (the local route's `src`); IPVS sends it to a real server on
/// another node unmasqueraded, and that node's reply to the ClusterIP stays there (it is that
/// node's own kube-ipvs0 address too): the connection never opens (kubernetes#65158,
/// projectcalico/calico#3258).
pub fn ipvs_vip_source(st: &NodeState) -> Check {
    let mut c = Check::new(
        "ipvs-vip-source",
        "IPVS connections from a virtual server's own address",
    );
    let Some(conns) = &st.ipvs_conns else {
        if kube_ipvs0_sources(&mut c, st) {
            return c;
        }
        return c.skip("no `ipvsadm -Lnc` output");
    };
    let mut vips: BTreeSet<IpAddr> = conns.iter().map(|x| x.virtual_addr.ip()).collect();
    if let Some(text) = &st.ipvs {
        for vs in crate::ipvs::parse(text).value {
            if let crate::ipvs::VirtualKey::Addr(_, a) = vs.key {
                vips.insert(a.ip());
            }
        }
    }
    let from_vip: Vec<&crate::ipvs::Connection> = conns
        .iter()
        .filter(|x| vips.contains(&x.source.ip()))
        .collect();
    for x in &from_vip {
        c.found(
            Status::Warn,
            format!(
                "{} connection {} → {} → {} ({}) has the virtual server address {} as its source: the node opened it to a service address and took the address on kube-ipvs0 as source; {}'s reply goes to {}, which every IPVS node holds on its own kube-ipvs0, so it does not come back{} (`{}`)",
                x.proto,
                x.source,
                x.virtual_addr,
                x.destination,
                x.state,
                x.source.ip(),
                x.destination.ip(),
                x.source.ip(),
                if x.state == "SYN_RECV" || x.state == "SYN_SENT" { " (the entry is stuck half-open)" } else { "" },
                x.text
            ),
        );
    }
    if from_vip.is_empty() {
        c.note(format!(
            "{} IPVS connection entr{}, none from a virtual server's address",
            conns.len(),
            if conns.len() == 1 { "y" } else { "ies" }
        ));
    } else {
        c.add_fix("masquerade the node's own connections to service addresses (kube-proxy's fix for kubernetes#63241, #63319: KUBE-MARK-MASQ on OUTPUT), or make the node pick a real address as source for the VIPs (the calico#3258 reporter replaced the VIP's local route with one whose src is a node address)");
    }
    c
}

/// Without connection entries, the addresses on kube-ipvs0 (`ip addr`) say the same in advance:
/// a connection the node opens to one takes that address as its source (the kernel's source
/// for a local destination), and IPVS sends it on to the endpoints with it, so an endpoint on
/// another node answers an address its own node holds (kubernetes#63241, #65158). kube-proxy
/// masquerades such connections since 1.11 (#63319: `-m set --match-set KUBE-CLUSTER-IP
/// src,dst -j KUBE-MARK-MASQ`, or with a cluster CIDR `! -s <cidr> … dst,dst`); a warning
/// unless the pasted nat table shows such a rule.
/// True when it said something.
fn kube_ipvs0_sources(c: &mut Check, st: &NodeState) -> bool {
    let vips: Vec<String> = st
        .addrs
        .iter()
        .flatten()
        .filter(|a| a.ifname == "kube-ipvs0")
        .map(|a| a.addr.to_string())
        .collect();
    if vips.is_empty() {
        return false;
    }
    let masq = st.iptables.as_ref().and_then(|d| {
        d.tables.get("nat")?.chains.iter().find_map(|ch| {
            ch.rules
                .iter()
                .find(|r| {
                    // `src,dst` (#63319, no cluster CIDR), or `dst,dst` from any source outside
                    // the pods' (`! -s <cluster CIDR>`) or from anywhere (masquerade-all).
                    r.module_arg("set", "--match-set")
                        .is_some_and(|a| a.values.iter().any(|v| v == "KUBE-CLUSTER-IP"))
                        && r.arg("-s").is_none_or(|a| a.negated)
                        && r.target_name() == Some("KUBE-MARK-MASQ")
                })
                .map(|r| r.text.clone())
        })
    });
    let shown = vips.join(", ");
    if let Some(rule) = masq {
        c.note(format!(
            "kube-ipvs0 holds {shown}; the node's own connections to them are masqueraded by `{rule}`"
        ));
        return true;
    }
    c.found(
        Status::Warn,
        format!(
            "kube-ipvs0 holds {shown}: a connection the node opens to one of them takes that address as its source, and IPVS forwards it to the endpoints with it; an endpoint on another node answers an address that node holds itself, so only local endpoints answer — unless kube-proxy masquerades these connections (a nat rule `-m set --match-set KUBE-CLUSTER-IP … -j KUBE-MARK-MASQ` their source passes, kube-proxy ≥ 1.11), which {}",
            if st.iptables.is_some() {
                "the pasted nat table does not show"
            } else {
                "cannot be seen: no iptables-save pasted"
            }
        ),
    );
    c.add_fix("run a kube-proxy that masquerades the node's own connections to service addresses (kubernetes#63319), or check `iptables-save -t nat | grep KUBE-CLUSTER-IP`");
    true
}

/// Bridge ports without hairpin mode: a pod that reaches itself through a Service is DNATed
/// back to its own address, and the bridge must send the frame out the port it came in on,
/// which it does only with `hairpin_mode` 1 on that port (kubelet's hairpin-veth mode sets it;
/// its promiscuous-bridge mode, for kubenet's cbr0, does without). kubernetes#23322: kubelet
/// fell back to hairpin-veth and left every docker0 port at 0.
pub fn hairpin(st: &NodeState) -> Check {
    let mut c = Check::new(
        "hairpin",
        "bridge ports without hairpin mode (pods reaching themselves via a Service)",
    );
    let Some(ports) = &st.hairpin else {
        return c
            .skip("no bridge ports' hairpin_mode (`grep . /sys/class/net/*/brif/*/hairpin_mode`)");
    };
    if ports.is_empty() {
        return c.skip("the hairpin_mode paste holds no values");
    }
    let mut bridges: Vec<Option<String>> = Vec::new();
    for p in ports {
        if !bridges.contains(&p.bridge) {
            bridges.push(p.bridge.clone());
        }
    }
    for b in bridges {
        let of: Vec<&crate::hairpin::HairpinPort> =
            ports.iter().filter(|p| p.bridge == b).collect();
        let off: Vec<&&crate::hairpin::HairpinPort> = of.iter().filter(|p| !p.on).collect();
        let name = b.as_deref().unwrap_or("the bridge");
        if off.is_empty() {
            c.note(format!(
                "{name}: hairpin_mode 1 on all {} port(s)",
                of.len()
            ));
            continue;
        }
        let which: Vec<String> = off.iter().filter_map(|p| p.port.clone()).collect();
        c.found(
            Status::Warn,
            format!(
                "hairpin_mode is 0 on {} of {name}'s {} port(s){}: a pod behind such a port that reaches itself through its Service's ClusterIP (DNATed back to its own address) gets no reply, since {name} does not send a frame back out the port it came in on — unless {name} is in promiscuous mode (kubelet's promiscuous-bridge hairpin, for kubenet's cbr0)",
                off.len(),
                of.len(),
                if which.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", which.join(", "))
                }
            ),
        );
        c.add_fix(format!(
            "run kubelet with --hairpin-mode=hairpin-veth (it sets each pod port's hairpin_mode), or set it: `for f in /sys/class/net/{}/brif/*/hairpin_mode; do echo 1 > $f; done`",
            b.as_deref().unwrap_or("BRIDGE")
        ));
    }
    c
}

/// Cilium's interfaces (cilium_host, cilium_net, lxc*) need the reverse-path filter off: its
/// datapath routes replies in ways the filter refuses, and systemd ≥ 245 sets `rp_filter = 2`
/// on every new interface (cilium/cilium#10645; #19761: `all` at 2 after an upgrade). The
/// kernel applies the larger of `conf/all` and the interface's own. True when one is on.
fn cilium_rp_filter(c: &mut Check, st: &NodeState) -> bool {
    let Some(s) = &st.sysctls else {
        return false;
    };
    let ifaces: BTreeSet<&str> =
        s.0.keys()
            .filter_map(|k| k.strip_prefix("net.ipv4.conf.")?.split('.').next())
            .filter(|i| *i == "cilium_host" || *i == "cilium_net" || i.starts_with("lxc"))
            .collect();
    let on: Vec<String> = ifaces
        .iter()
        .filter_map(|i| {
            let v = s.effective_rp_filter(i).filter(|v| *v != 0)?;
            Some(format!("{i} {v}"))
        })
        .collect();
    if on.is_empty() {
        return false;
    }
    c.found(
        Status::Warn,
        format!(
            "the reverse-path filter (rp_filter) is on for Cilium's interfaces ({}; the kernel applies the larger of net.ipv4.conf.all.rp_filter = {} and the interface's own): Cilium needs it 0 there, or replies it routes back through them are dropped (cilium/cilium#10645: systemd ≥ 245 sets it to 2)",
            on.join(", "),
            s.conf("ipv4", "all", "rp_filter")
                .map_or("?".to_string(), |v| v.to_string())
        ),
    );
    c.add_fix("set net.ipv4.conf.all.rp_filter = 0 and net.ipv4.conf.lxc*.rp_filter = 0 in a file under /etc/sysctl.d that sorts after systemd's 50-default.conf, apply it (`systemctl restart systemd-sysctl`), then recreate the pods");
    true
}

/// Drops the kernel itself reported for a packet's source: a pasted `ip route get D from S iif
/// I` refused with `Invalid cross-device link` (fib_validate_source's EXDEV: the route back to
/// S does not leave by I, and rp_filter on I is strict, or there is none) or, on recent kernels,
/// `Invalid argument` (a martian), and `martian source D from S, on dev I` kernel log lines
/// (`log_martians`). lyft/cni-ipvlan-vpc-k8s#38: a NodePort DNATed to a local pod under policy
/// routing.
pub fn rp_filter_refusals(st: &NodeState) -> Check {
    let mut c = Check::new(
        "rp-filter-refusals",
        "packets the kernel refused for their source (reverse-path filter)",
    );
    let cilium = cilium_rp_filter(&mut c, st);
    if st.route_gets.is_none() && st.martians.is_none() {
        if cilium {
            return c;
        }
        return c.skip("no `ip route get … iif …` answers and no kernel log (dmesg) pasted");
    }
    let rp = |dev: &str| -> String {
        let Some(s) = &st.sysctls else {
            return String::new();
        };
        let all = s.conf("ipv4", "all", "rp_filter");
        let one = s.conf("ipv4", dev, "rp_filter");
        match (all, one) {
            (None, None) => String::new(),
            (a, o) => format!(
                " (rp_filter: conf.all {}, conf.{dev} {})",
                a.map_or("?".into(), |v| v.to_string()),
                o.map_or("?".into(), |v| v.to_string())
            ),
        }
    };
    let mut devs: Vec<String> = Vec::new();
    for g in st.route_gets.iter().flatten() {
        let (Some(iif), Some(from), Err(e)) = (&g.iif, &g.from, &g.answer) else {
            continue;
        };
        let asked = g
            .command
            .clone()
            .unwrap_or_else(|| format!("ip route get {} from {from} iif {iif}", g.dst));
        if e.contains("Invalid cross-device link") {
            c.found(
                Status::Warn,
                format!(
                    "the kernel's `{asked}` answered `{e}`: the reverse-path filter (rp_filter) on {iif} refuses {from} → {} (the route back to {from} does not leave by {iif}){}",
                    g.dst,
                    rp(iif)
                ),
            );
        } else if e.contains("Invalid argument") {
            c.found(
                Status::Warn,
                format!(
                    "the kernel's `{asked}` answered `{e}`: {from} → {} arriving on {iif} is a martian (on recent kernels also the reverse-path filter's (rp_filter) answer){}",
                    g.dst,
                    rp(iif)
                ),
            );
        } else {
            continue;
        }
        if !devs.contains(iif) {
            devs.push(iif.clone());
        }
    }
    let mut seen: Vec<(IpAddr, IpAddr, String)> = Vec::new();
    for m in st.martians.iter().flatten() {
        let key = (m.dst, m.src, m.dev.clone());
        if seen.contains(&key) {
            continue;
        }
        let n = st
            .martians
            .iter()
            .flatten()
            .filter(|x| (x.dst, x.src, x.dev.clone()) == key)
            .count();
        seen.push(key);
        c.found(
            Status::Warn,
            format!(
                "kernel log: martian source {} from {}, on dev {}{}: the kernel dropped a packet from {} arriving on {} whose source failed validation — the reverse-path filter (rp_filter), for a source any host can have{} (`{}`)",
                m.dst,
                m.src,
                m.dev,
                if n > 1 { format!(" ({n} times)") } else { String::new() },
                m.src,
                m.dev,
                rp(&m.dev),
                m.text
            ),
        );
        if !devs.contains(&m.dev) {
            devs.push(m.dev.clone());
        }
    }
    if devs.is_empty() {
        c.note("no refused input lookup and no martian-source line in what was pasted");
        return c;
    }
    for d in devs {
        c.add_fix(format!("make the route back to the client leave by {d} (a policy rule for the connection's mark, with src_valid_mark), or loose reverse-path filtering: sysctl -w net.ipv4.conf.{d}.rp_filter=2 (the effective value is max(conf.all, conf.{d}))"));
    }
    c
}

/// Overlay MTU: a VXLAN device must fit in its underlay (50 bytes of IPv4 encapsulation), and the
/// pod side (bridges and their veth ports) must not exceed the VXLAN MTU, or large packets from
/// pods to other nodes are dropped or depend on PMTU discovery.
pub fn mtu(st: &NodeState) -> Check {
    let mut c = Check::new("mtu", "MTU mismatches between overlay and pods");
    let Some(links) = &st.links else {
        return c.skip("no ip -d link output");
    };
    let vxlans: Vec<_> = links
        .iter()
        .filter(|l| l.kind.as_deref() == Some("vxlan"))
        .collect();
    if vxlans.is_empty() {
        if links.iter().all(|l| l.kind.is_none()) {
            return c.skip("ip link output without -d: device kinds unknown");
        }
        return c.skip("no VXLAN device: no overlay");
    }
    let pod_side: Vec<_> = links
        .iter()
        .filter(|l| {
            l.kind.as_deref() == Some("bridge")
                && links.iter().any(|p| {
                    p.master.as_deref() == Some(&l.name) && p.kind.as_deref() == Some("veth")
                })
                || (l.kind.as_deref() == Some("veth") && l.master.is_some())
        })
        .collect();
    for vx in &vxlans {
        c.note(format!("{}: mtu {}", vx.name, vx.mtu));
        if let Some(under) = vx
            .vxlan
            .as_ref()
            .and_then(|v| v.dev.as_deref())
            .and_then(|d| st.link(d))
        {
            if vx.mtu + 50 > under.mtu {
                c.found(
                    Status::Fail,
                    format!(
                        "{} mtu {} + 50 bytes of VXLAN encapsulation > its underlay {} mtu {}",
                        vx.name, vx.mtu, under.name, under.mtu
                    ),
                );
                c.add_fix(format!(
                    "ip link set {} mtu {}",
                    vx.name,
                    under.mtu.saturating_sub(50)
                ));
            } else if vx.mtu + 50 < under.mtu && vx.name.starts_with("flannel.") {
                // flannel's vxlan backend sets its device to the underlay's MTU − 50 and hands
                // that to the pods (FLANNEL_MTU in subnet.env); a device left below it
                // (flannel#841: 1500 over AWS's 9001) disagrees with what pods may be given.
                let want = under.mtu - 50;
                c.found(
                    Status::Warn,
                    format!(
                        "{} mtu {} is below its underlay {} mtu {} − 50 = {want}, the MTU flannel's vxlan backend gives the device and the pods (FLANNEL_MTU in /run/flannel/subnet.env): pods given {want} send packets {} does not fit (dropped or fragmented); pods at {} use a fraction of the frames the underlay carries",
                        vx.name, vx.mtu, under.name, under.mtu, vx.name, vx.mtu
                    ),
                );
                c.add_fix(format!(
                    "run a flanneld that sets the device MTU itself (flannel#897) and restart it, or `ip link set {} mtu {want}`; check the pods' MTU matches FLANNEL_MTU (a smaller MTU is deliberate only when flannel's backend config sets \"MTU\")",
                    vx.name
                ));
            } else if vx.mtu + 50 < under.mtu {
                c.note(format!(
                    "{} mtu {} is below its underlay {} mtu {} − 50: smaller than the underlay allows (fine when chosen for a smaller path MTU elsewhere)",
                    vx.name, vx.mtu, under.name, under.mtu
                ));
            }
        }
        let too_big: Vec<String> = pod_side
            .iter()
            .filter(|l| l.mtu > vx.mtu)
            .map(|l| format!("{} mtu {}", l.name, l.mtu))
            .collect();
        if !too_big.is_empty() {
            c.found(
                Status::Fail,
                format!(
                    "pod-side devices larger than {} (mtu {}): {}",
                    vx.name,
                    vx.mtu,
                    too_big.join(", ")
                ),
            );
            c.add_fix(format!("set the CNI network's MTU to {} (the pods' eth0 and the host veths and bridge), then recreate the pods", vx.mtu));
        }
    }
    if pod_side.is_empty() {
        c.note("no bridge with veth ports found: pod-side MTUs not compared");
    }
    c
}

/// The eni-shared failure (docs/eni.md): a policy rule sends a pod's traffic through a table
/// whose default route leaves by an interface with no IPv4 address, so MASQUERADE takes another
/// interface's address and the reply comes back there, where strict rp_filter drops it; and
/// requests that arrive on the primary interface and are DNATed to such a pod fail the same
/// check unless a fwmark rule (with `src_valid_mark`) routes them through main.
pub fn eni_asymmetric(st: &NodeState) -> Check {
    let mut c = Check::new(
        "eni-asymmetric",
        "asymmetric routing that strict rp_filter punishes",
    );
    let (Some(rules), Some(_)) = (&st.rules, &st.routes) else {
        return c.skip("needs ip rule and ip route output");
    };
    let Some(primary) = st
        .lookup("main", "0.0.0.0".parse().unwrap())
        .filter(|r| r.dst.prefix_len() == 0)
    else {
        return c.skip("no IPv4 default route in table main");
    };
    let Some(primary_dev) = primary.dev.clone() else {
        return c.skip("the main default route names no device");
    };
    let primary_src = primary
        .prefsrc
        .or_else(|| st.ipv4_on(&primary_dev).first().map(|a| a.addr));
    let rp = st
        .sysctls
        .as_ref()
        .and_then(|s| s.effective_rp_filter(&primary_dev));
    let svm = st
        .sysctls
        .as_ref()
        .and_then(|s| s.effective_src_valid_mark(&primary_dev));
    let mut seen_tables = BTreeSet::new();
    let mut pods = 0;
    for r in rules {
        let (Some(src), Some(table)) = (r.src, r.table.as_deref()) else {
            continue;
        };
        if r.not
            || r.action != "lookup"
            || !src.addr().is_ipv4()
            || matches!(table, "main" | "local" | "default" | "253" | "254" | "255")
        {
            continue;
        }
        let Some(out) = st
            .lookup(table, "0.0.0.0".parse().unwrap())
            .filter(|x| x.dst.prefix_len() == 0)
        else {
            continue;
        };
        let Some(out_dev) = out.dev.clone() else {
            continue;
        };
        if out_dev == primary_dev {
            continue;
        }
        pods += 1;
        // Requests entering by the primary interface, DNATed to this pod: the reverse-path
        // lookup uses the pod's address as source. A fwmark rule before this one rescues it
        // when the mark is honoured by the check (src_valid_mark).
        let fwmark_rescue = rules.iter().find(|f| {
            f.priority < r.priority
                && f.fwmark.is_some()
                && f.src.is_none()
                && matches!(f.table.as_deref(), Some("main" | "254"))
        });
        if seen_tables.insert(table.to_string()) {
            let addrs = st.ipv4_on(&out_dev);
            if addrs.is_empty() && !st.addresses_complete() {
                c.found(Status::Warn, format!("rule `{}` sends the pod's traffic to table {table} (`{}`) out of {out_dev}, and the dump cannot tell whether {out_dev} has an IPv4 address of its own (no ip addr, no table local): if it has none, masquerade takes another interface's and the reply returns elsewhere; needs `ip addr` (ip-addr.txt) or `ip route show table all`", r.text, out.text));
            } else if addrs.is_empty() {
                let masq = primary_src
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| format!("{primary_dev}'s address"));
                let ev = format!(
                    "rule `{}` sends the pod's traffic to table {table} (`{}`), and {out_dev} has no IPv4 address: MASQUERADE (a Service's DNAT marks it) takes {masq} from {primary_dev}, the reply comes back on {primary_dev}, and the reverse-path check for {} points at {out_dev}",
                    r.text, out.text, src.addr()
                );
                match rp {
                    Some(1) => c.found(Status::Fail, format!("{ev}; rp_filter on {primary_dev} is strict (1): the reply is dropped (TcpExtIPReversePathFilter rises)")),
                    Some(v) => c.found(Status::Warn, format!("{ev}; rp_filter on {primary_dev} is {v}, so the reply passes, but the SYN leaves {out_dev} with {masq}: a cloud's source/destination check drops it")),
                    None => c.found(Status::Warn, format!("{ev}; rp_filter on {primary_dev} unknown: dropped if it is 1 (strict); needs `sysctl net.ipv4.conf.all.rp_filter net.ipv4.conf.{primary_dev}.rp_filter` as sysctl.txt")),
                }
                c.add_fix(format!("give {out_dev} an IPv4 address of its own (weir-cni eni-shared: eniAddress, /32 noprefixroute) so masquerade picks it and the path stays symmetric; or loose rp_filter (sysctl -w net.ipv4.conf.{primary_dev}.rp_filter=2; the effective value is the max of conf/all and conf/{primary_dev}), which still leaves the cloud's source check"));
            } else {
                c.note(format!(
                    "{out_dev} (table {table}) has {}: masquerade picks it",
                    addrs[0].addr
                ));
            }
        }
        match (rp, fwmark_rescue) {
            (Some(1), None) => {
                c.found(Status::Fail, format!("outside → NodePort/LB → pod {}: the request arrives on {primary_dev}, is DNATed to the pod, and the reverse-path lookup from {} follows rule `{}` to {out_dev}: strict rp_filter drops the request", src.addr(), src.addr(), r.text));
                c.add_fix(format!("connmark connections that enter by {primary_dev} and route their packets with a fwmark rule before pref {} through main (weir-cni eni-shared's `fwmark 0x80/0x80 lookup main` and table inet weir-eni), with net.ipv4.conf.all.src_valid_mark=1", r.priority));
            }
            (Some(1), Some(f)) if svm != Some(true) => {
                c.found(Status::Fail, format!("rule `{}` would route marked requests through main, but src_valid_mark is off on {primary_dev}: the reverse-path check ignores the mark and drops requests DNATed to {}", f.text, src.addr()));
                c.add_fix("sysctl -w net.ipv4.conf.all.src_valid_mark=1");
            }
            (Some(1), Some(f)) => c.note(format!("requests DNATed to {}: rule `{}` with src_valid_mark routes marked ones through main (the mark itself is set by a connmark rule this check does not verify)", src.addr(), f.text)),
            _ => {}
        }
    }
    if pods == 0 {
        c.note(format!(
            "no source policy rule sends traffic out of an interface other than {primary_dev}"
        ));
    } else {
        c.note(format!("{pods} source rule(s) route out of an interface other than {primary_dev}; rp_filter on {primary_dev}: {}", rp.map(|v| v.to_string()).unwrap_or_else(|| "unknown".into())));
    }
    c
}

/// The checks as a table for people: status, check, evidence and fix, one block per check.
pub fn render_table(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        out.push_str(&format!(
            "{:<5} {:<15} {}\n",
            c.status.label(),
            c.id,
            c.title
        ));
        for e in &c.evidence {
            out.push_str(&format!("{:<21}- {e}\n", ""));
        }
        if let Some(f) = &c.fix {
            out.push_str(&format!("{:<21}fix: {f}\n", ""));
        }
    }
    let count = |s| checks.iter().filter(|c| c.status == s).count();
    out.push_str(&format!(
        "{} ok, {} warn, {} fail, {} skipped\n",
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every node check names the outputs it reads (so an unreadable one makes it say it
    /// cannot tell); the policy checks read objects only.
    #[test]
    fn every_node_check_names_what_it_reads() {
        for c in run_all(&NodeState::default(), None) {
            assert_eq!(
                reads(c.id).is_empty(),
                c.id.starts_with("policy-"),
                "{}",
                c.id
            );
        }
    }

    #[test]
    fn cilium_interfaces_need_rp_filter_off() {
        let sysctls = |pairs: &[(&str, &str)]| NodeState {
            sysctls: Some(crate::sysctl::Sysctls(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )),
            ..Default::default()
        };
        // cilium/cilium#19761: `all` at 2 reaches cilium_host, whose own value was cut.
        let st = sysctls(&[
            ("net.ipv4.conf.all.rp_filter", "2"),
            ("net.ipv4.conf.cilium_host.arp_filter", "0"),
        ]);
        let c = rp_filter_refusals(&st);
        assert_eq!(c.status, Status::Warn);
        assert!(c.evidence[0].contains("cilium_host 2"), "{:?}", c.evidence);
        // All off: nothing to say, and no refusals pasted: skipped.
        let st = sysctls(&[
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.lxc94a9b8960b75.rp_filter", "0"),
        ]);
        assert_eq!(rp_filter_refusals(&st).status, Status::Skip);
        // No Cilium interface: rp_filter 1 on eth0 is not this check's business.
        let st = sysctls(&[("net.ipv4.conf.eth0.rp_filter", "1")]);
        assert_eq!(rp_filter_refusals(&st).status, Status::Skip);
    }

    #[test]
    fn kube_ipvs0_addresses_warn_without_the_masquerade_rule() {
        let mut st = NodeState {
            addrs: Some(vec![crate::iproute::Address {
                ifname: "kube-ipvs0".into(),
                addr: "10.200.10.10".parse().unwrap(),
                prefix_len: 32,
                scope: "global".into(),
                secondary: false,
                noprefixroute: false,
            }]),
            ..Default::default()
        };
        let c = ipvs_vip_source(&st);
        assert_eq!(c.status, Status::Warn);
        assert!(c.evidence[0].contains("no iptables-save pasted"));
        let dump = crate::iptables::parse("*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ\nCOMMIT\n").value;
        st.iptables = Some(dump);
        let c = ipvs_vip_source(&st);
        assert_eq!(c.status, Status::Ok, "{:?}", c.evidence);
        // Today's kube-proxy with a cluster CIDR: everything from outside the pods is masqueraded.
        let dump = crate::iptables::parse("*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\nCOMMIT\n").value;
        st.iptables = Some(dump);
        assert_eq!(ipvs_vip_source(&st).status, Status::Ok);
        // Only pods masqueraded: the node's own connections are not.
        let dump = crate::iptables::parse("*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -s 10.244.0.0/16 -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\nCOMMIT\n").value;
        st.iptables = Some(dump);
        assert_eq!(ipvs_vip_source(&st).status, Status::Warn);
        // No kube-ipvs0 address and no connection entries: nothing to judge.
        assert_eq!(ipvs_vip_source(&NodeState::default()).status, Status::Skip);
    }

    #[test]
    fn marks() {
        assert!(mark_covers("0x4000/0x4000", 0x4000));
        assert!(mark_covers("0x4000", 0x4000));
        assert!(!mark_covers("0x8000/0x8000", 0x4000));
        assert!(!mark_covers("0x0/0x4000", 0x4000));
    }

    #[test]
    fn nat_addresses() {
        assert_eq!(parse_nat_addr("10.0.0.1:80"), "10.0.0.1".parse().ok());
        assert_eq!(parse_nat_addr("10.0.0.1"), "10.0.0.1".parse().ok());
        assert_eq!(parse_nat_addr("[fd00::1]:80"), "fd00::1".parse().ok());
        assert_eq!(
            parse_nat_addr("10.0.0.1-10.0.0.3:80"),
            "10.0.0.1".parse().ok()
        );
    }

    #[test]
    fn resolv_conf_nameservers() {
        assert_eq!(
            nameservers(
                "# x\nsearch a\nnameserver 10.96.0.10\nnameserver fe80::1%eth0\noptions ndots:5\n"
            ),
            vec![
                "10.96.0.10".parse::<IpAddr>().unwrap(),
                "fe80::1".parse().unwrap()
            ]
        );
    }
}
