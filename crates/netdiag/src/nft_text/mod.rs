//! `nft list ruleset` as text, read into the [`Ruleset`] that [`crate::nft::parse`] reads
//! `nft -j list ruleset` into: the same tables, base chains (hook, priority as a number,
//! policy), sets and maps with their elements, and each rule's expressions as nft's own JSON
//! would give them, so the walk and doctor read either form alike. A text paste is what
//! tickets hold far more often than JSON (`nft list ruleset`, `nft list table ip filter`,
//! with `-a` handles or without). `tests/nft_text_kernel.rs` holds the two readers to that:
//! rulesets loaded into a scratch network namespace, listed both ways, read into equal models.
//!
//! Where the two forms differ it is nft's doing: a rule iptables-nft wrote with an xtables
//! match is printed as its translation in the text (`ct state related,established`) but as an
//! opaque `xt` expression in the JSON; the text is read as the translation says. What nft
//! cannot translate either it prints as `xt match physdev`, read as an `xt` expression (the
//! walk passes over it and says so). A rule part this reader does not know ends the rule as
//! an `unread` expression and a skipped line, never a guess.

mod expr;
mod lex;

use serde_json::{json, Value};

use crate::nft::{render_exprs, Chain, Hook, Rule, Ruleset, Set, TableRef};
use crate::{Parsed, Skipped};

use expr::Cur;
use lex::{depth_change, lex, Tok};

/// Reads `nft list ruleset` text (a prompt line above it, `\r\n` line ends, `# handle N` of
/// `nft -a`, a paste cut short: what was read stays).
pub fn parse(text: &str) -> Parsed<Ruleset> {
    let lines: Vec<(usize, &str)> = text
        .split('\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
        .collect();
    let mut r = Reader::default();
    let mut k = 0;
    while k < lines.len() {
        let (no, raw) = lines[k];
        k += 1;
        let (t, handle) = strip_handle(raw.trim());
        if t.is_empty() {
            continue;
        }
        // A line opening a block or an anonymous set runs until its braces close.
        let mut whole = t.to_string();
        // (A chain's lines are read one by one.)
        let opens_block =
            r.table.is_some() && r.chain.is_none() && t.ends_with('{') && !t.starts_with("chain ");
        let wraps = r.chain.is_some() && depth_change(t) > 0;
        if opens_block || wraps {
            let mut depth = depth_change(t);
            while depth > 0 && k < lines.len() {
                let next = strip_handle(lines[k].1.trim()).0;
                depth += depth_change(next);
                whole.push_str(if opens_block { " ; " } else { " " });
                whole.push_str(next);
                k += 1;
            }
        }
        r.line(no, &whole, handle);
    }
    // The paste ends inside a chain: the rules after its cut are unknown, not absent.
    if let Some(ci) = r.chain {
        let c = &r.rs.chains[ci];
        let at = format!("{} {} {}", c.family, c.table, c.name);
        r.rs.cut.push(at);
    }
    Parsed {
        value: r.rs,
        skipped: r.skipped,
    }
}

#[derive(Default)]
struct Reader {
    rs: Ruleset,
    skipped: Vec<Skipped>,
    /// The table being read: (family, name).
    table: Option<(String, String)>,
    /// The chain being read: its index in `rs.chains`.
    chain: Option<usize>,
}

impl Reader {
    fn line(&mut self, no: usize, t: &str, handle: Option<u64>) {
        let Some((family, table)) = self.table.clone() else {
            self.top_line(no, t);
            return;
        };
        if t == "}" {
            match self.chain.take() {
                Some(_) => {}
                None => self.table = None,
            }
            return;
        }
        if let Some(ci) = self.chain {
            if t.starts_with("type ") && t.contains(" hook ") {
                self.hook_line(no, ci, t, &family);
            } else if !is_comment_line(t) {
                self.rule(no, ci, t, handle);
            }
            return;
        }
        let words: Vec<&str> = t.split_whitespace().collect();
        match words.as_slice() {
            ["chain", name, "{", rest @ ..] => {
                self.rs.chains.push(Chain {
                    family,
                    table,
                    name: unquote(name),
                    hook: None,
                });
                // `chain x { }` on one line holds nothing more.
                if !rest.contains(&"}") {
                    self.chain = Some(self.rs.chains.len() - 1);
                }
            }
            [kind @ ("set" | "map"), name, "{", ..] => {
                let set = set_block(&family, &table, &unquote(name), *kind == "map", t);
                match set {
                    Ok(s) => self.rs.sets.push(s),
                    Err(why) => self.skipped.push(Skipped::new(no, t, why)),
                }
            }
            // Table options, and the objects the walk does not use (counters, quotas,
            // flowtables, ct helpers…): read over.
            ["comment" | "flags", ..] => {}
            [.., "{" | "}" | ";"] if t.contains('{') => {}
            _ => self
                .skipped
                .push(Skipped::new(no, t, "not a chain, set or map of the table")),
        }
    }

    /// A line outside any table: a table's header, a prompt or a comment, or what a paste cut
    /// from its table.
    fn top_line(&mut self, no: usize, t: &str) {
        let words: Vec<&str> = t.split_whitespace().collect();
        if let ["table", family, name, "{", rest @ ..] = words.as_slice() {
            let (family, name) = (family.to_string(), unquote(name));
            self.rs.tables.push(TableRef {
                family: family.clone(),
                name: name.clone(),
            });
            if !rest.contains(&"}") {
                self.table = Some((family, name));
            }
            return;
        }
        if t.starts_with('#') || t.starts_with("```") || crate::paste::prompt_command(t).is_some() {
            return;
        }
        self.skipped.push(Skipped::new(
            no,
            t,
            "outside any `table … {` block (the paste cut its table's first lines?)",
        ));
    }

    /// `type filter hook input [device "lo"] priority filter + 10; policy drop;`.
    fn hook_line(&mut self, no: usize, ci: usize, t: &str, family: &str) {
        let toks = lex(t);
        let words: Vec<&str> = toks.iter().filter_map(Tok::word).collect();
        let after = |k: &str| {
            words
                .iter()
                .position(|w| *w == k)
                .and_then(|i| words.get(i + 1))
        };
        let (Some(kind), Some(hook)) = (after("type"), after("hook")) else {
            self.skipped.push(Skipped::new(
                no,
                t,
                "a base chain's type line without its hook",
            ));
            return;
        };
        let prio_words: Vec<&str> = words
            .iter()
            .skip_while(|w| **w != "priority")
            .skip(1)
            .take_while(|w| **w != ";")
            .copied()
            .collect();
        let Some(priority) = priority(&prio_words, family) else {
            self.skipped.push(Skipped::new(no, t, "priority not read"));
            return;
        };
        self.rs.chains[ci].hook = Some(Hook {
            kind: kind.to_string(),
            hook: hook.to_string(),
            priority,
            policy: after("policy").unwrap_or(&"accept").to_string(),
        });
    }

    fn rule(&mut self, no: usize, ci: usize, t: &str, handle: Option<u64>) {
        let ch = &self.rs.chains[ci];
        let read = expr::rule(&lex(t), &ch.family);
        if let Some(why) = &read.unread {
            self.skipped.push(Skipped::new(
                no,
                t,
                format!("rule not read whole ({why}): the walk passes over it"),
            ));
        }
        let mut text = render_exprs(&read.expr);
        if let Some(c) = &read.comment {
            text.push_str(&format!(" comment {c:?}"));
        }
        let uses_xt = read.expr.iter().any(|e| e.get("xt").is_some());
        self.rs.rules.push(Rule {
            family: ch.family.clone(),
            table: ch.table.clone(),
            chain: ch.name.clone(),
            handle,
            comment: read.comment,
            expr: read.expr,
            text,
            uses_xt,
        });
    }
}

/// A chain's own comment line (`comment "…"` alone), not a rule.
fn is_comment_line(t: &str) -> bool {
    matches!(lex(t).as_slice(), [Tok::Word(w), Tok::Str(_)] if w == "comment")
}

/// `… # handle 12` (`nft -a`): the line without it, and the handle.
fn strip_handle(t: &str) -> (&str, Option<u64>) {
    match t.rsplit_once("# handle ") {
        Some((before, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            (before.trim_end(), n.parse().ok())
        }
        _ => (t, None),
    }
}

fn unquote(name: &str) -> String {
    name.trim_matches('"').to_string()
}

/// A priority as nft prints it: a number, or a name with an offset (`filter + 10`,
/// `dstnat - 10`), the names' values per family (nft's `std_prio_table`).
fn priority(words: &[&str], family: &str) -> Option<i64> {
    let base = |w: &str| -> Option<i64> {
        if let Ok(n) = w.parse::<i64>() {
            return Some(n);
        }
        Some(match (family, w) {
            ("bridge", "dstnat") => -300,
            ("bridge", "filter") => -200,
            ("bridge", "out") => 100,
            ("bridge", "srcnat") => 300,
            (_, "raw") => -300,
            (_, "mangle") => -150,
            (_, "dstnat") => -100,
            (_, "filter") => 0,
            (_, "security") => 50,
            (_, "srcnat") => 100,
            _ => return None,
        })
    };
    match words {
        [w] => base(w),
        [w, "+", n] => Some(base(w)? + n.parse::<i64>().ok()?),
        [w, "-", n] => Some(base(w)? - n.parse::<i64>().ok()?),
        _ => None,
    }
}

/// A set or map block (its lines joined by ` ; `): its key type and elements.
fn set_block(family: &str, table: &str, name: &str, is_map: bool, t: &str) -> Result<Set, String> {
    let toks = lex(t);
    let open = toks.iter().position(|x| *x == Tok::Open).ok_or("no `{`")?;
    let mut c = Cur {
        t: &toks,
        i: open + 1,
    };
    let mut set = Set {
        family: family.into(),
        table: table.into(),
        name: name.into(),
        is_map,
        key_type: Value::Null,
        elements: Vec::new(),
    };
    while let Some(w) = c.word().map(str::to_string) {
        c.i += 1;
        match w.as_str() {
            ";" => {}
            "type" => set.key_type = key_type(&mut c),
            "typeof" => set.key_type = typeof_type(&mut c)?,
            "elements" => {
                c.eat("=");
                if c.t.get(c.i) != Some(&Tok::Open) {
                    return Err("`elements = {` expected".into());
                }
                c.i += 1;
                set.elements = expr::elements(&mut c)?;
            }
            // size, flags, timeout, gc-interval, policy, auto-merge, comment, counter…
            _ => skip_to_line_end(&mut c),
        }
    }
    Ok(set)
}

fn skip_to_line_end(c: &mut Cur) {
    while let Some(t) = c.t.get(c.i) {
        c.i += 1;
        if t.word() == Some(";") {
            return;
        }
    }
}

/// `type ipv4_addr . inet_proto . inet_service : verdict` → the key's types (one: a string).
fn key_type(c: &mut Cur) -> Value {
    let mut types = Vec::new();
    while let Some(w) = c.word().map(str::to_string) {
        if w == ";" || w == ":" {
            break;
        }
        c.i += 1;
        if w != "." {
            types.push(Value::String(w));
        }
    }
    skip_to_line_end(c);
    one_or_array(types)
}

/// `typeof ip daddr . meta l4proto . th dport` → the types nft names for those expressions.
fn typeof_type(c: &mut Cur) -> Result<Value, String> {
    let e = expr::expr(c)?;
    skip_to_line_end(c);
    let parts = match e.get("concat").and_then(Value::as_array) {
        Some(parts) => parts.clone(),
        None => vec![e],
    };
    Ok(one_or_array(
        parts.iter().map(|p| json!(type_of(p))).collect(),
    ))
}

fn one_or_array(mut v: Vec<Value>) -> Value {
    if v.len() == 1 {
        v.pop().expect("one")
    } else {
        Value::Array(v)
    }
}

/// The datatype nft gives an expression's values (what `nft -j` prints for a `typeof` set).
fn type_of(e: &Value) -> &'static str {
    let field = e["payload"]["field"].as_str().unwrap_or_default();
    let proto = e["payload"]["protocol"].as_str().unwrap_or_default();
    let key = e["meta"]["key"].as_str().or(e["ct"]["key"].as_str());
    match (proto, field, key) {
        ("ip", "saddr" | "daddr", _) => "ipv4_addr",
        ("ip6", "saddr" | "daddr", _) => "ipv6_addr",
        ("ether", "saddr" | "daddr", _) => "ether_addr",
        (_, "sport" | "dport", _) => "inet_service",
        ("ip", "protocol", _) | ("ip6", "nexthdr", _) => "inet_proto",
        (_, _, Some("l4proto")) => "inet_proto",
        (_, _, Some("mark")) => "mark",
        (_, _, Some("iifname" | "oifname")) => "ifname",
        (_, _, Some("iif" | "oif")) => "iface_index",
        (_, _, Some("nfproto")) => "nf_proto",
        (_, _, Some("protocol")) => "ether_type",
        (_, _, Some("state")) => "ct_state",
        _ => "integer",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_by_name_and_offset() {
        assert_eq!(priority(&["filter", "+", "10"], "inet"), Some(10));
        assert_eq!(priority(&["srcnat", "-", "5"], "ip"), Some(95));
        assert_eq!(priority(&["-110"], "ip"), Some(-110));
        assert_eq!(priority(&["filter"], "bridge"), Some(-200));
        assert_eq!(priority(&["nonsense"], "ip"), None);
    }

    #[test]
    fn handles_are_read_off_the_line() {
        assert_eq!(
            strip_handle("ip saddr 1.2.3.4 accept # handle 12"),
            ("ip saddr 1.2.3.4 accept", Some(12))
        );
        assert_eq!(
            strip_handle("accept comment \"# handle x\""),
            ("accept comment \"# handle x\"", None)
        );
    }
}
