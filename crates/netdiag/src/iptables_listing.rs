//! `iptables -L` listings (`-n`, `-v`, `--line-numbers`, any mix): what people paste when asked
//! for "your iptables rules". Each chain is a `Chain NAME (policy DROP …)` or `Chain NAME (N
//! references)` line, a column header and one line per rule. A rule is read into the same model
//! as `iptables-save` ([`crate::iptables::Rule`]) by turning its columns and the matches iptables
//! prints in its own words (`tcp dpt:80`, `ctstate RELATED,ESTABLISHED`, `mark match
//! 0x4000/0x4000`, `/* comment */`, `to:10.244.1.5:80`, …) back into iptables-save options.
//!
//! A listing is lossy: a match it prints in a form not read here is kept as an option
//! `-m listing --unread "…"`, which the walk does not model, so the rule counts as not matching
//! (and the walk says so) rather than matching more than it does; names printed without `-n`
//! (`anywhere` is read, host names are not addresses) likewise. The text of each rule is the
//! listing's line, so evidence quotes what was pasted.

use crate::iptables::model::{Arg, Chain, Counters, Dump, Rule, Target};
use crate::{paste, Parsed, Skipped};

/// Whether `text` is an `iptables -L` listing rather than iptables-save: a line `Chain NAME (`.
pub fn is_listing(text: &str) -> bool {
    paste::lines(text)
        .data()
        .any(|l| chain_line(l.text).is_some())
}

/// `Chain FORWARD (policy DROP 0 packets, 0 bytes)` → (`FORWARD`, `Some("DROP")`);
/// `Chain KUBE-FORWARD (1 references)` → (`KUBE-FORWARD`, `None`).
fn chain_line(line: &str) -> Option<(&str, Option<&str>)> {
    let rest = line.trim().strip_prefix("Chain ")?;
    let (name, paren) = rest.split_once(' ')?;
    let inner = paren.trim().strip_prefix('(')?;
    let policy = inner
        .strip_prefix("policy ")
        .and_then(|p| p.split([' ', ')']).next());
    Some((name, policy))
}

/// `Chain FORWARD (policy DROP 120 packets, 7200 bytes)` → `Some("120")` (`12K` as shown
/// without `-x`); `None` without counters or when they read zero.
fn policy_packets(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| w.trim_end_matches(',') == "packets")?;
    let count = words.get(at.checked_sub(1)?)?;
    (words.contains(&"(policy") && *count != "0").then(|| count.to_string())
}

/// Which columns a chain's rule lines have, from its header line.
#[derive(Debug, Clone, Copy)]
struct Columns {
    num: bool,
    counters: bool,
    opt: bool,
    ifaces: bool,
}

impl Columns {
    fn from_header(line: &str) -> Option<Columns> {
        let words: Vec<&str> = line.split_whitespace().collect();
        if !words.contains(&"target") || !words.contains(&"prot") || !words.contains(&"source") {
            return None;
        }
        Some(Columns {
            num: words.contains(&"num"),
            counters: words.contains(&"pkts"),
            opt: words.contains(&"opt"),
            ifaces: words.contains(&"in"),
        })
    }
}

const PROTOCOLS: &[&str] = &[
    "all",
    "tcp",
    "udp",
    "icmp",
    "sctp",
    "udplite",
    "esp",
    "ah",
    "gre",
    "icmpv6",
    "ipv6-icmp",
];

fn is_protocol(w: &str) -> bool {
    let w = w.strip_prefix('!').unwrap_or(w);
    PROTOCOLS.contains(&w) || w.chars().all(|c| c.is_ascii_digit())
}

fn is_opt(w: &str) -> bool {
    matches!(w, "--" | "-f" | "!f")
}

fn arg(module: Option<&str>, negated: bool, name: &str, values: &[&str]) -> Arg {
    Arg {
        module: module.map(str::to_string),
        negated,
        name: name.to_string(),
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

/// `!eth0` → (true, `eth0`).
fn negation(w: &str) -> (bool, &str) {
    match w.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, w),
    }
}

/// A rule's options from its columns and the matches printed after the destination.
struct RuleBuilder {
    modules: Vec<String>,
    args: Vec<Arg>,
    target_args: Vec<Arg>,
    unread: Vec<String>,
}

impl RuleBuilder {
    fn module(&mut self, m: &str) {
        if !self.modules.iter().any(|x| x == m) {
            self.modules.push(m.to_string());
        }
    }

    fn push(&mut self, module: Option<&str>, negated: bool, name: &str, values: &[&str]) {
        if let Some(m) = module {
            self.module(m);
        }
        self.args.push(arg(module, negated, name, values));
    }

    /// The matches and target options iptables prints after the destination column.
    fn extras(&mut self, words: &[String], target: &str) {
        let proto_module = |w: &str| matches!(w, "tcp" | "udp" | "sctp" | "udplite");
        let mut i = 0;
        let mut negate = false;
        let mut module: Option<String> = None;
        while i < words.len() {
            let w = words[i].as_str();
            i += 1;
            if w == "!" {
                negate = true;
                continue;
            }
            let neg = std::mem::take(&mut negate);
            // `/* a comment */`
            if w.starts_with("/*") {
                let mut text = vec![w.trim_start_matches("/*").to_string()];
                let mut closed = w.len() > 2 && w.ends_with("*/");
                while !closed && i < words.len() {
                    text.push(words[i].clone());
                    closed = words[i].ends_with("*/");
                    i += 1;
                }
                let joined = text.join(" ");
                let c = joined.trim_end_matches("*/").trim().to_string();
                self.push(Some("comment"), false, "--comment", &[&c]);
                continue;
            }
            if proto_module(w) {
                module = Some(w.to_string());
                self.module(w);
                continue;
            }
            if !(self.listed_match(words, &mut i, neg, module.as_deref())
                || self.listed_target_option(words, &mut i, target))
            {
                // Not read: the rest of the line (a match's own words run on).
                let rest: Vec<String> = words[i - 1..].to_vec();
                self.unread.push(rest.join(" "));
                break;
            }
        }
    }

    /// A match as the listing words it, `words[*i - 1]` its first word (`*i` moves past the
    /// words read); false when it is not one read back.
    fn listed_match(
        &mut self,
        words: &[String],
        i: &mut usize,
        neg: bool,
        module: Option<&str>,
    ) -> bool {
        let (n2, vneg, value, next) = listed_word(words, *i);
        match (n2, next) {
            ("dpt" | "dpts" | "spt" | "spts", _) if !value.is_empty() => {
                let m = module.unwrap_or("tcp");
                let name = if n2.starts_with('d') {
                    "--dport"
                } else {
                    "--sport"
                };
                self.push(Some(m), neg || vneg, name, &[value]);
            }
            ("flags", _) if !value.is_empty() => {
                let m = module.unwrap_or("tcp");
                self.push(Some(m), neg || vneg, "--tcp-flags", &[value]);
            }
            ("multiport", Some(kind @ ("dports" | "sports" | "ports"))) => {
                let (mut n, mut v) = (false, words.get(*i + 1).map(String::as_str));
                let mut used = 2;
                if v == Some("!") {
                    n = true;
                    v = words.get(*i + 2).map(String::as_str);
                    used = 3;
                }
                let (vn, v) = negation(v.unwrap_or(""));
                let name = match kind {
                    "dports" => "--dports",
                    "sports" => "--sports",
                    _ => "--ports",
                };
                self.push(Some("multiport"), neg || n || vn, name, &[v]);
                *i += used;
            }
            ("ctstate" | "state", Some(v)) => {
                let (vn, v) = negation(v);
                let (m, name) = if n2 == "ctstate" {
                    ("conntrack", "--ctstate")
                } else {
                    ("state", "--state")
                };
                self.push(Some(m), neg || vn, name, &[v]);
                *i += 1;
            }
            ("mark" | "connmark", Some("match")) => {
                let mut v = words.get(*i + 1).map(String::as_str).unwrap_or("");
                let mut n = false;
                let mut used = 2;
                if v == "!" {
                    n = true;
                    v = words.get(*i + 2).map(String::as_str).unwrap_or("");
                    used = 3;
                }
                let (vn, v) = negation(v);
                self.push(Some(n2), neg || n || vn, "--mark", &[v]);
                *i += used;
            }
            ("ADDRTYPE", Some("match")) => self.listed_addrtype(words, i),
            ("match-set", Some(set)) => {
                let flags = words.get(*i + 1).map(String::as_str).unwrap_or("");
                self.push(Some("set"), neg, "--match-set", &[set, flags]);
                *i += 2;
            }
            ("statistic", Some("mode")) => {
                let mode = words.get(*i + 1).map(String::as_str).unwrap_or("");
                self.push(Some("statistic"), false, "--mode", &[mode]);
                *i += 2;
                if words.get(*i).map(String::as_str) == Some("probability") {
                    let p = words.get(*i + 1).map(String::as_str).unwrap_or("");
                    self.push(Some("statistic"), false, "--probability", &[p]);
                    *i += 2;
                }
            }
            _ => return false,
        }
        true
    }

    /// `ADDRTYPE match dst-type LOCAL …`: each type pair, then `limit-in`.
    fn listed_addrtype(&mut self, words: &[String], i: &mut usize) {
        *i += 1;
        while let (Some(k), Some(v)) = (words.get(*i), words.get(*i + 1)) {
            let (kn, k) = negation(k);
            let name = match k {
                "dst-type" => "--dst-type",
                "src-type" => "--src-type",
                _ => break,
            };
            let (vn, v) = negation(v);
            self.push(Some("addrtype"), kn || vn, name, &[v]);
            *i += 2;
        }
        if words.get(*i).is_some_and(|w| w.starts_with("limit-")) {
            self.push(Some("addrtype"), false, "--limit-iface-in", &[]);
            *i += 1;
        }
    }

    /// An option of `target` as the listing words it, `words[*i - 1]` its first word; false
    /// when it is not one read back.
    fn listed_target_option(&mut self, words: &[String], i: &mut usize, target: &str) -> bool {
        let (n2, _, value, next) = listed_word(words, *i);
        match (n2, next) {
            ("to", _) if !value.is_empty() && matches!(target, "DNAT" | "SNAT") => {
                let name = if target == "DNAT" {
                    "--to-destination"
                } else {
                    "--to-source"
                };
                self.target_args.push(arg(None, false, name, &[value]));
            }
            ("reject-with", Some(_)) if target == "REJECT" => *i += 1,
            ("random-fully" | "random" | "persistent", _)
                if matches!(target, "MASQUERADE" | "SNAT" | "DNAT") => {}
            ("MARK" | "CONNMARK", Some(op @ ("set" | "xset" | "or" | "and" | "xor")))
                if target == n2 =>
            {
                let v = words.get(*i + 1).map(String::as_str).unwrap_or("");
                let name = match op {
                    "set" => "--set-mark",
                    "xset" => "--set-xmark",
                    "or" => "--or-mark",
                    "and" => "--and-mark",
                    _ => "--xor-mark",
                };
                self.target_args.push(arg(None, false, name, &[v]));
                *i += 2;
            }
            _ => return false,
        }
        true
    }
}

/// `words[i - 1]` split as `name:value` (the value's `!` taken off), and the word after it.
fn listed_word(words: &[String], i: usize) -> (&str, bool, &str, Option<&str>) {
    let w = words[i - 1].as_str();
    let (n2, value) = w.split_once(':').unwrap_or((w, ""));
    let (vneg, value) = negation(value);
    (n2, vneg, value, words.get(i).map(String::as_str))
}

/// Reads an `iptables -L` listing into a [`Dump`] marked as a listing. The table is the one the
/// pasted command names with `-t` (filter, iptables' default, otherwise).
pub fn parse(text: &str) -> Parsed<Dump> {
    let pasted = paste::lines(text);
    let table = pasted
        .commands
        .iter()
        .find_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            words
                .windows(2)
                .find(|w| w[0] == "-t" || w[0] == "--table")
                .map(|w| w[1].to_string())
        })
        .unwrap_or_else(|| "filter".to_string());
    let mut listing = Listing {
        skipped: Vec::new(),
        chains: Vec::new(),
        columns: None,
        numeric: true,
        unread: 0,
        ifaces_hidden: false,
    };
    for l in pasted.data() {
        listing.line(l);
    }
    listing.into_dump(table)
}

/// A listing being read: its chains so far, the current column header and what the rules
/// tell of how it was printed.
struct Listing {
    skipped: Vec<Skipped>,
    chains: Vec<Chain>,
    columns: Option<Columns>,
    /// Printed with -n (no host names seen).
    numeric: bool,
    /// Rules with a match not read back.
    unread: usize,
    /// A header without the in/out columns (printed without -v).
    ifaces_hidden: bool,
}

impl Listing {
    /// A `Chain` line, a column header or a rule of the last chain.
    fn line(&mut self, l: &paste::Line) {
        let line = l.text.trim_end();
        if line.trim().is_empty() {
            return;
        }
        if let Some((name, policy)) = chain_line(line) {
            self.chains.push(Chain {
                name: name.to_string(),
                policy: policy.map(str::to_string),
                policy_packets: policy_packets(line),
                rules: Vec::new(),
            });
            return;
        }
        if let Some(c) = Columns::from_header(line) {
            self.ifaces_hidden |= !c.ifaces;
            self.columns = Some(c);
            return;
        }
        let (Some(_), Some(cols)) = (self.chains.last(), self.columns) else {
            self.skipped.push(Skipped::new(
                l.no,
                l.text,
                l.reason("a listing line before any `Chain` line and column header"),
            ));
            return;
        };
        if l.unterminated {
            self.skipped.push(Skipped::new(
                l.no,
                l.text,
                "the last line, cut off by the paste? (no line end)",
            ));
            return;
        }
        match self.rule(l.no, line, cols) {
            Ok(rule) => {
                if let Some(chain) = self.chains.last_mut() {
                    chain.rules.push(rule);
                }
            }
            Err(why) => self.skipped.push(Skipped::new(l.no, l.text, l.reason(why))),
        }
    }

    /// A rule line: its columns (as the header names them), then the matches and target
    /// options printed after them.
    fn rule(&mut self, no: usize, line: &str, cols: Columns) -> Result<Rule, &'static str> {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let row = Row::split(&words, cols).ok_or("fewer columns than the header names")?;
        if cols.num && !words[0].chars().all(|c| c.is_ascii_digit()) {
            return Err("no rule number where the header has `num`");
        }
        let mut b = RuleBuilder {
            modules: Vec::new(),
            args: Vec::new(),
            target_args: Vec::new(),
            unread: Vec::new(),
        };
        if !row.column_args(&mut b) {
            self.numeric = false;
        }
        b.extras(
            &words[row.rest.min(words.len())..],
            row.target.as_deref().unwrap_or(""),
        );
        if !b.unread.is_empty() {
            self.unread += 1;
            let u = b.unread.join(" ");
            b.push(Some("listing"), false, "--unread", &[&u]);
        }
        let counters = cols.counters.then(|| {
            let at = usize::from(cols.num);
            Counters {
                packets: words[at].clone(),
                bytes: words[at + 1].clone(),
            }
        });
        Ok(Rule {
            line: no,
            counters,
            number: if cols.num {
                words[0].parse().ok()
            } else {
                None
            },
            text: line.trim().to_string(),
            modules: b.modules,
            args: b.args,
            target: row.target.map(|name| Target {
                name,
                goto: false,
                args: b.target_args,
            }),
        })
    }

    /// The dump, with what the listing leaves unknown said as assumptions.
    fn into_dump(self, table: String) -> Parsed<Dump> {
        let mut dump = Dump {
            listing: true,
            ..Dump::default()
        };
        if self.ifaces_hidden {
            dump.ifaces_hidden = true;
            dump.assumptions.push(
                "the listing was printed without -v: it shows no in/out interfaces, so a rule that looks unconditional may match only some interfaces".into(),
            );
        }
        let names: Vec<String> = self.chains.iter().map(|c| c.name.clone()).collect();
        dump.tables.entry(table.clone()).or_default().chains = self.chains;
        dump.assumptions.push(format!(
            "an `iptables -L` listing, not iptables-save: read into table {table} (chains {}); a listing prints matches in its own words, read back where they map to iptables-save options",
            names.join(", ")
        ));
        if self.unread > 0 {
            dump.assumptions.push(format!(
                "{} listed rule(s) print a match not read back (`-m listing --unread`): they count as not matching",
                self.unread
            ));
        }
        if !self.numeric {
            dump.assumptions.push(
                "the listing was printed without -n: host names in it are not read as addresses"
                    .into(),
            );
        }
        Parsed {
            value: dump,
            skipped: self.skipped,
        }
    }
}

/// A rule line's columns; `rest` is where the matches begin.
struct Row {
    target: Option<String>,
    prot: String,
    iif: Option<String>,
    oif: Option<String>,
    src: String,
    dst: String,
    rest: usize,
}

impl Row {
    /// None when the line has fewer columns than the header names.
    fn split(words: &[String], cols: Columns) -> Option<Row> {
        let mut i = usize::from(cols.num) + if cols.counters { 2 } else { 0 };
        // The target column is empty for a rule without one (a counter).
        let has_target = !(words.get(i).is_some_and(|w| is_protocol(w))
            && (!cols.opt || words.get(i + 1).is_some_and(|w| is_opt(w))));
        let target = if has_target {
            i += 1;
            Some(words.get(i - 1).cloned())
        } else {
            None
        };
        let prot = words.get(i).cloned();
        i += 1 + usize::from(cols.opt);
        let (iif, oif) = if cols.ifaces {
            i += 2;
            (words.get(i - 2).cloned(), words.get(i - 1).cloned())
        } else {
            (None, None)
        };
        let (src, dst) = (words.get(i).cloned(), words.get(i + 1).cloned());
        i += 2;
        Some(Row {
            target: target.flatten(),
            prot: prot?,
            iif,
            oif,
            src: src?,
            dst: dst?,
            rest: i,
        })
    }

    /// The addresses, protocol and interfaces as iptables-save options; false when an address
    /// is a host name (the listing was printed without -n).
    fn column_args(&self, b: &mut RuleBuilder) -> bool {
        let mut numeric = true;
        for (name, w) in [("-s", &self.src), ("-d", &self.dst)] {
            let (n, v) = negation(w);
            if v == "anywhere" || v == "0.0.0.0/0" {
                continue;
            }
            if !v.starts_with(|c: char| c.is_ascii_digit()) {
                numeric = false;
            }
            b.push(None, n, name, &[v]);
        }
        let (n, p) = negation(&self.prot);
        if p != "all" && p != "0" {
            b.push(None, n, "-p", &[p]);
        }
        for (name, w) in [("-i", &self.iif), ("-o", &self.oif)] {
            if let Some(w) = w {
                let (n, v) = negation(w);
                if v != "any" && v != "*" {
                    b.push(None, n, name, &[v]);
                }
            }
        }
        numeric
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_lines_with_and_without_policy() {
        assert_eq!(
            chain_line("Chain FORWARD (policy DROP 0 packets, 0 bytes)"),
            Some(("FORWARD", Some("DROP")))
        );
        assert_eq!(
            chain_line("Chain INPUT (policy ACCEPT)"),
            Some(("INPUT", Some("ACCEPT")))
        );
        assert_eq!(
            chain_line("Chain KUBE-FORWARD (1 references)"),
            Some(("KUBE-FORWARD", None))
        );
        assert_eq!(chain_line("-A FORWARD -j ACCEPT"), None);
        let packets = |l: &str| policy_packets(l);
        assert_eq!(
            packets("Chain FORWARD (policy DROP 120 packets, 7200 bytes)").as_deref(),
            Some("120")
        );
        assert_eq!(
            packets("Chain FORWARD (policy DROP 12K packets, 1M bytes)").as_deref(),
            Some("12K")
        );
        assert_eq!(
            packets("Chain FORWARD (policy DROP 0 packets, 0 bytes)"),
            None
        );
        assert_eq!(packets("Chain INPUT (policy ACCEPT)"), None);
    }
}
