//! A rule's text into the expressions `nft -j` prints for it: matches (`ip saddr != 10.0.0.0/8`,
//! `ct state established,related`, `ip daddr . meta l4proto . th dport @keys`), statements
//! (counters with their numbers, verdicts, NAT, marks, verdict maps, set updates, log, limit,
//! reject) and the rule's comment. What is written as in `nft -j` (names, op `in` for flag
//! types, `reject`'s per-family default, `limit`'s default burst) is nft 1.0's JSON.

use serde_json::{json, Map, Value};

use super::lex::{unlex, Tok};

type R<T> = Result<T, String>;

/// A rule read: its expressions and comment. A part it could not read ends the rule as one
/// `{"unread": "…"}` expression (the walk passes over such a rule, and says so) and `unread`
/// says why.
#[derive(Debug, Default)]
pub struct ReadRule {
    pub expr: Vec<Value>,
    pub comment: Option<String>,
    pub unread: Option<String>,
}

/// Reads a rule's tokens; `family` is its table's (`reject`'s default depends on it).
pub fn rule(toks: &[Tok], family: &str) -> ReadRule {
    let mut out = ReadRule::default();
    // nft prints the comment last: read even when something before it is not.
    let toks = match toks {
        [rest @ .., Tok::Word(w), Tok::Str(s)] if w == "comment" => {
            out.comment = Some(s.clone());
            rest
        }
        _ => toks,
    };
    let mut c = Cur { t: toks, i: 0 };
    while c.i < toks.len() {
        let start = c.i;
        match statement(&mut c, family) {
            Ok(Item::Expr(v)) => out.expr.push(v),
            Ok(Item::Comment(s)) => out.comment = Some(s),
            Err(why) => {
                out.expr.push(json!({ "unread": unlex(&toks[start..]) }));
                out.unread = Some(why);
                break;
            }
        }
    }
    out
}

enum Item {
    Expr(Value),
    Comment(String),
}

/// A cursor over a rule's tokens.
pub(super) struct Cur<'a> {
    pub t: &'a [Tok],
    pub i: usize,
}

impl Cur<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.t.get(self.i)
    }
    pub fn word(&self) -> Option<&str> {
        self.peek().and_then(Tok::word)
    }
    fn word_at(&self, k: usize) -> Option<&str> {
        self.t.get(self.i + k).and_then(Tok::word)
    }
    fn next(&mut self) -> Option<Tok> {
        let t = self.t.get(self.i).cloned();
        self.i += 1;
        t
    }
    /// Consumes word `w` when it is next.
    pub fn eat(&mut self, w: &str) -> bool {
        let hit = self.word() == Some(w);
        if hit {
            self.i += 1;
        }
        hit
    }
    fn eat_tok(&mut self, t: &Tok) -> bool {
        let hit = self.peek() == Some(t);
        if hit {
            self.i += 1;
        }
        hit
    }
    /// The next word or string (a name: a chain, a set, an xt module).
    fn name(&mut self) -> R<String> {
        match self.next() {
            Some(Tok::Word(w) | Tok::Str(w)) => Ok(w),
            other => Err(format!("a name expected, not {other:?}")),
        }
    }
    fn number(&mut self) -> R<u64> {
        let w = self.name()?;
        number(&w).ok_or_else(|| format!("a number expected, not {w:?}"))
    }
}

fn statement(c: &mut Cur, family: &str) -> R<Item> {
    let w = c.word().unwrap_or_default().to_string();
    let v = match w.as_str() {
        "comment" => {
            c.next();
            return match c.next() {
                Some(Tok::Str(s)) => Ok(Item::Comment(s)),
                other => Err(format!("comment without a string: {other:?}")),
            };
        }
        "accept" | "drop" | "continue" | "return" | "notrack" => {
            c.next();
            json!({ w: null })
        }
        "jump" | "goto" => verdict(c)?,
        "counter" => counter(c)?,
        "reject" => reject(c, family)?,
        "log" => log(c)?,
        "limit" => limit(c)?,
        "masquerade" | "redirect" | "snat" | "dnat" => nat(c)?,
        "xt" => {
            c.next();
            let kind = c.name()?;
            json!({ "xt": { "type": kind, "name": c.name()? } })
        }
        "update" | "add" | "delete" if c.word_at(1).is_some_and(|s| s.starts_with('@')) => {
            set_statement(c)?
        }
        _ => led_by_expression(c)?,
    };
    Ok(Item::Expr(v))
}

/// A statement that starts with an expression: a mark set, a verdict map, a match.
fn led_by_expression(c: &mut Cur) -> R<Value> {
    let left = expr(c)?;
    if c.eat("set") {
        let value = value_expr(c)?;
        return Ok(json!({ "mangle": { "key": left, "value": value } }));
    }
    if c.eat("vmap") {
        let data = map_data(c)?;
        return Ok(json!({ "vmap": { "key": left, "data": data } }));
    }
    relation(c, left)
}

/// `LEFT [op] RIGHT`: op `in` where nft's JSON has it (an implicit test of a flag type).
fn relation(c: &mut Cur, left: Value) -> R<Value> {
    let explicit = match c.word() {
        Some(op @ ("==" | "!=" | "<" | ">" | "<=" | ">=")) => Some(op.to_string()),
        _ => None,
    };
    if explicit.is_some() {
        c.next();
    }
    let (right, mask) = rhs(c)?;
    if let Some(mask) = mask {
        // `tcp flags syn / fin,syn,rst,ack`: nft's JSON masks the left side.
        let left = json!({ "&": [left, mask] });
        let op = explicit.unwrap_or_else(|| "==".into());
        return Ok(json!({ "match": { "op": op, "left": left, "right": right } }));
    }
    let flags = is_flag_type(&left) && right.get("set").is_none() && !is_set_ref(&right);
    let op = explicit.unwrap_or_else(|| if flags { "in" } else { "==" }.into());
    Ok(json!({ "match": { "op": op, "left": left, "right": right } }))
}

fn is_set_ref(v: &Value) -> bool {
    v.as_str().is_some_and(|s| s.starts_with('@'))
}

/// Bitmask types, whose implicit test nft's JSON writes as `in`.
fn is_flag_type(left: &Value) -> bool {
    let ct = left["ct"]["key"].as_str();
    matches!(ct, Some("state" | "status" | "event"))
        || left["payload"]["protocol"] == "tcp" && left["payload"]["field"] == "flags"
}

/// A right-hand side: a set reference, an anonymous set, a value (a concatenation, a flag
/// list); with the mask of `VALUE / MASK` when there is one.
fn rhs(c: &mut Cur) -> R<(Value, Option<Value>)> {
    if c.eat_tok(&Tok::Open) {
        return Ok((json!({ "set": elements(c)? }), None));
    }
    let v = concat_value(c, true)?;
    if c.eat("/") {
        return Ok((v, Some(flag_list(c)?)));
    }
    Ok((v, None))
}

/// `a,b,c` (or one value): an array of several.
fn flag_list(c: &mut Cur) -> R<Value> {
    let mut items = vec![value(c)?];
    while c.eat_tok(&Tok::Comma) {
        items.push(value(c)?);
    }
    Ok(if items.len() == 1 {
        items.pop().expect("one")
    } else {
        Value::Array(items)
    })
}

/// A value, a concatenation of values (`10.0.0.1 . tcp . 80`), or (`flags`: outside a set,
/// where a comma separates elements) a flag list.
fn concat_value(c: &mut Cur, flags: bool) -> R<Value> {
    let first = if flags { flag_list(c)? } else { value(c)? };
    if c.word() != Some(".") {
        return Ok(first);
    }
    let mut parts = vec![first];
    while c.eat(".") {
        parts.push(value(c)?);
    }
    Ok(json!({ "concat": parts }))
}

/// One literal: a string, a number, a prefix, a range, `exists`/`missing`.
fn value(c: &mut Cur) -> R<Value> {
    match c.next() {
        Some(Tok::Str(s)) => Ok(Value::String(s)),
        Some(Tok::Word(w)) if w != ";" && w != ":" => Ok(literal(&w)),
        other => Err(format!("a value expected, not {other:?}")),
    }
}

/// A literal word as nft's JSON writes it.
pub(super) fn literal(w: &str) -> Value {
    match w {
        "exists" => return Value::Bool(true),
        "missing" => return Value::Bool(false),
        _ => {}
    }
    if let Some(n) = number(w) {
        return json!(n);
    }
    if let Some((addr, len)) = w.split_once('/') {
        if addr.parse::<std::net::IpAddr>().is_ok() {
            if let Ok(len) = len.parse::<u8>() {
                return json!({ "prefix": { "addr": addr, "len": len } });
            }
        }
    }
    if let Some((a, b)) = w.split_once('-') {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().is_ok();
        match (number(a), number(b)) {
            (Some(x), Some(y)) => return json!({ "range": [x, y] }),
            _ if ip(a) && ip(b) => return json!({ "range": [a, b] }),
            _ => {}
        }
    }
    // `(fin|syn|rst|ack)`: older nft's flag mask.
    if let Some(inner) = w.strip_prefix('(').and_then(|s| s.strip_suffix(')')) {
        return Value::Array(inner.split('|').map(literal).collect());
    }
    Value::String(w.to_string())
}

/// A decimal or `0x` number.
pub(super) fn number(w: &str) -> Option<u64> {
    match w.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None if w.bytes().all(|b| b.is_ascii_digit()) => w.parse().ok(),
        None => None,
    }
}

/// The elements of a set or map up to its `}` (the `{` read): values, `key : data` pairs
/// (verdicts as data), element options (`comment`, `timeout`, `expires`, `counter`). A `;`
/// (a line end in a set block) is passed over.
pub(super) fn elements(c: &mut Cur) -> R<Vec<Value>> {
    let mut out = Vec::new();
    loop {
        while c.eat(";") || c.eat_tok(&Tok::Comma) {}
        if c.eat_tok(&Tok::Close) {
            return Ok(out);
        }
        if c.peek().is_none() {
            return Err("a set's elements without their `}`".into());
        }
        out.push(element(c)?);
    }
}

fn element(c: &mut Cur) -> R<Value> {
    let val = concat_value(c, false)?;
    let mut opts = Map::new();
    loop {
        match c.word() {
            Some("comment") => {
                c.next();
                opts.insert("comment".into(), json!(c.name()?));
            }
            Some(k @ ("timeout" | "expires")) => {
                let k = k.to_string();
                c.next();
                let d = c.name()?;
                opts.insert(k, json!(duration(&d).ok_or(format!("duration {d:?}"))?));
            }
            Some("counter") => {
                c.next();
                let (packets, bytes) = counter_numbers(c)?;
                opts.insert(
                    "counter".into(),
                    json!({ "packets": packets, "bytes": bytes }),
                );
            }
            _ => break,
        }
    }
    let key = if opts.is_empty() {
        val
    } else {
        opts.insert("val".into(), val);
        json!({ "elem": opts })
    };
    if c.eat(":") {
        let data = data(c)?;
        return Ok(json!([key, data]));
    }
    Ok(key)
}

/// A map element's data: a verdict or a value.
fn data(c: &mut Cur) -> R<Value> {
    match c.word() {
        Some("jump" | "goto") => verdict(c),
        Some(v @ ("accept" | "drop" | "continue" | "return")) => {
            let v = json!({ v: null });
            c.next();
            Ok(v)
        }
        _ => concat_value(c, false),
    }
}

/// `jump X` / `goto X`.
fn verdict(c: &mut Cur) -> R<Value> {
    let k = c.name()?;
    Ok(json!({ k: { "target": c.name()? } }))
}

/// `1h2m3s`, `59m59s996ms`, `30s`: whole seconds, as nft's JSON gives them.
fn duration(d: &str) -> Option<u64> {
    let mut total_ms: u64 = 0;
    let mut num = String::new();
    let mut chars = d.chars().peekable();
    while let Some(ch) = chars.next() {
        if ch.is_ascii_digit() {
            num.push(ch);
            continue;
        }
        let n: u64 = num.parse().ok()?;
        num.clear();
        let unit_ms = match ch {
            'd' => 86_400_000,
            'h' => 3_600_000,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                1
            }
            'm' => 60_000,
            's' => 1000,
            _ => return None,
        };
        total_ms = total_ms.checked_add(n.checked_mul(unit_ms)?)?;
    }
    if !num.is_empty() {
        total_ms = total_ms.checked_add(num.parse::<u64>().ok()?.checked_mul(1000)?)?;
    }
    Some(total_ms / 1000)
}

/// A verdict map's or a NAT map's data: `@name` or an anonymous `{ k : v, … }`.
fn map_data(c: &mut Cur) -> R<Value> {
    if c.eat_tok(&Tok::Open) {
        return Ok(json!({ "set": elements(c)? }));
    }
    let name = c.name()?;
    if name.starts_with('@') {
        Ok(Value::String(name))
    } else {
        Err(format!("a map expected, not {name:?}"))
    }
}

/// `counter`, `counter packets N bytes M`, `counter name X`.
fn counter(c: &mut Cur) -> R<Value> {
    c.next();
    if c.word() == Some("packets") {
        let (packets, bytes) = counter_numbers(c)?;
        return Ok(json!({ "counter": { "packets": packets, "bytes": bytes } }));
    }
    if c.eat("name") {
        return Ok(json!({ "counter": c.name()? }));
    }
    Ok(json!({ "counter": null }))
}

fn counter_numbers(c: &mut Cur) -> R<(u64, u64)> {
    if !c.eat("packets") {
        return Err("`packets N bytes M` expected".into());
    }
    let packets = c.number()?;
    if !c.eat("bytes") {
        return Err("`bytes M` expected".into());
    }
    Ok((packets, c.number()?))
}

/// `reject [with tcp reset | with icmp|icmpv6|icmpx [type] X]`; a bare `reject` is nft's
/// port-unreachable of the table's family.
fn reject(c: &mut Cur, family: &str) -> R<Value> {
    c.next();
    if !c.eat("with") {
        let kind = match family {
            "ip" => "icmp",
            "ip6" => "icmpv6",
            _ => "icmpx",
        };
        return Ok(json!({ "reject": { "type": kind, "expr": "port-unreachable" } }));
    }
    let kind = c.name()?;
    if kind == "tcp" {
        c.eat("reset");
        return Ok(json!({ "reject": { "type": "tcp reset" } }));
    }
    c.eat("type");
    Ok(json!({ "reject": { "type": kind, "expr": c.name()? } }))
}

/// `log [prefix S] [level L] [group N] [snaplen N] [queue-threshold N] [flags F]`.
fn log(c: &mut Cur) -> R<Value> {
    c.next();
    let mut opts = Map::new();
    while let Some(k) = c.word() {
        let k = k.to_string();
        match k.as_str() {
            "prefix" | "level" | "flags" => {
                c.next();
                let v = c.name()?;
                opts.insert(k, json!(v));
            }
            "group" | "snaplen" | "queue-threshold" => {
                c.next();
                let v = c.number()?;
                opts.insert(k, json!(v));
            }
            _ => break,
        }
    }
    Ok(json!({ "log": if opts.is_empty() { Value::Null } else { Value::Object(opts) } }))
}

/// `limit rate [over] N/UNIT [burst B packets]` (packets; nft's default burst is 5), or a
/// byte rate `N UNIT/PER`.
fn limit(c: &mut Cur) -> R<Value> {
    c.next();
    if !c.eat("rate") {
        return Err("`limit rate` expected".into());
    }
    let mut opts = Map::new();
    if c.eat("over") {
        opts.insert("inv".into(), json!(true));
    }
    let first = c.name()?;
    let (rate, per) = match first.split_once('/') {
        Some((n, per)) => (n.to_string(), per.to_string()),
        None => {
            let unit = c.name()?;
            let (u, per) = unit.split_once('/').ok_or("a rate unit expected")?;
            opts.insert("rate_unit".into(), json!(u));
            (first.clone(), per.to_string())
        }
    };
    opts.insert(
        "rate".into(),
        json!(number(&rate).ok_or("a rate expected")?),
    );
    opts.insert("per".into(), json!(per));
    let mut burst = if opts.contains_key("rate_unit") { 0 } else { 5 };
    if c.eat("burst") {
        burst = c.number()?;
        if let Some(u) = c.word().filter(|u| *u != "packets") {
            opts.insert("burst_unit".into(), json!(u));
        }
        c.next();
    }
    opts.insert("burst".into(), json!(burst));
    Ok(json!({ "limit": opts }))
}

/// `update @set { EXPR [timeout T] }` (and `add`, `delete`).
fn set_statement(c: &mut Cur) -> R<Value> {
    let op = c.name()?;
    let set = c.name()?;
    if !c.eat_tok(&Tok::Open) {
        return Err("`{` expected after the set".into());
    }
    let mut elem = expr(c)?;
    if c.eat("timeout") {
        let d = c.name()?;
        let t = duration(&d).ok_or(format!("duration {d:?}"))?;
        elem = json!({ "elem": { "val": elem, "timeout": t } });
    }
    if !c.eat_tok(&Tok::Close) {
        return Err("`}` expected after the set's element".into());
    }
    Ok(json!({ "set": { "op": op, "elem": elem, "set": set } }))
}

/// `masquerade|redirect [to :PORT] [FLAGS]`, `snat|dnat [ip|ip6] to ADDR [FLAGS]`.
fn nat(c: &mut Cur) -> R<Value> {
    let kind = c.name()?;
    let mut opts = Map::new();
    if kind == "snat" || kind == "dnat" {
        if matches!(c.word(), Some("ip" | "ip6")) && c.word_at(1) == Some("to") {
            opts.insert("family".into(), json!(c.name()?));
        }
        if !c.eat("to") {
            return Err(format!("`{kind} to` expected"));
        }
        nat_target(c, &mut opts)?;
    } else if c.eat("to") {
        let p = c.name()?;
        let port = p
            .strip_prefix(':')
            .ok_or(format!("`:PORT` expected, not {p:?}"))?;
        opts.insert("port".into(), literal(port));
    }
    let mut flags = Vec::new();
    while let Some(f) = c
        .word()
        .filter(|f| matches!(*f, "random" | "fully-random" | "persistent" | "netmap"))
    {
        flags.push(json!(f));
        c.next();
        c.eat_tok(&Tok::Comma);
    }
    match flags.len() {
        0 => {}
        1 => {
            opts.insert("flags".into(), flags.pop().expect("one"));
        }
        _ => {
            opts.insert("flags".into(), Value::Array(flags));
        }
    }
    Ok(json!({ kind: if opts.is_empty() { Value::Null } else { Value::Object(opts) } }))
}

/// What `snat|dnat to` sets: `ADDR`, `ADDR:PORT`, `[V6]:PORT`, `A-B`, `:PORT`, or
/// `KEY map @m` (weir's and kube-proxy's endpoint maps).
fn nat_target(c: &mut Cur, opts: &mut Map<String, Value>) -> R<()> {
    if c.word().is_some_and(starts_expression) {
        let key = expr(c)?;
        if !c.eat("map") {
            return Err("`map` expected after the NAT key".into());
        }
        let data = map_data(c)?;
        opts.insert(
            "addr".into(),
            json!({ "map": { "key": key, "data": data } }),
        );
        return Ok(());
    }
    let w = c.name()?;
    let (addr, port) = split_addr_port(&w);
    if !addr.is_empty() {
        opts.insert("addr".into(), literal(addr));
    }
    if let Some(p) = port {
        opts.insert("port".into(), literal(p));
    }
    Ok(())
}

/// `10.0.0.1:80` → (`10.0.0.1`, `80`); `[fd00::1]:80`; `fd00::1` (no port); `:80`.
fn split_addr_port(w: &str) -> (&str, Option<&str>) {
    if let Some(rest) = w.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((a, p)) => (a, p.strip_prefix(':')),
            None => (rest, None),
        };
    }
    match w.matches(':').count() {
        1 => {
            let (a, p) = w.split_once(':').expect("one colon");
            (a, Some(p))
        }
        _ => (w, None),
    }
}

const PAYLOADS: &[&str] = &[
    "ether", "vlan", "arp", "ip", "ip6", "icmp", "icmpv6", "igmp", "tcp", "udp", "udplite", "sctp",
    "dccp", "th", "ah", "esp", "comp", "gre",
];

/// Interface keys nft prints without `meta`.
const BARE_META: &[&str] = &[
    "iif", "oif", "iifname", "oifname", "iiftype", "oiftype", "iifgroup", "oifgroup",
];

/// Whether a word starts an expression (not a literal).
fn starts_expression(w: &str) -> bool {
    PAYLOADS.contains(&w)
        || BARE_META.contains(&w)
        || matches!(
            w,
            "meta" | "ct" | "fib" | "numgen" | "symhash" | "jhash" | "rt" | "socket"
        )
}

/// An expression: primaries joined by `.` (a concatenation), then binary operators with
/// literal operands (`meta mark & 0x00004000`).
pub(super) fn expr(c: &mut Cur) -> R<Value> {
    let mut parts = vec![primary(c)?];
    while c.word() == Some(".") && c.word_at(1).is_some_and(starts_expression) {
        c.next();
        parts.push(primary(c)?);
    }
    let left = if parts.len() == 1 {
        parts.pop().expect("one")
    } else {
        json!({ "concat": parts })
    };
    binops(c, left)
}

fn binops(c: &mut Cur, mut left: Value) -> R<Value> {
    loop {
        let op = match c.word() {
            Some(o @ ("&" | "|" | "^" | "<<" | ">>")) => o.to_string(),
            Some("and") => "&".into(),
            Some("or") => "|".into(),
            Some("xor") => "^".into(),
            _ => return Ok(left),
        };
        c.next();
        let right = value(c)?;
        left = json!({ op: [left, right] });
    }
}

/// A `set` statement's value: an expression (`meta mark | 0x4000`, `ct mark`, iptables-nft's
/// `mark or 0x4000`) or a literal.
fn value_expr(c: &mut Cur) -> R<Value> {
    if c.word()
        .is_some_and(|w| starts_expression(w) || w == "mark")
    {
        if c.eat("mark") {
            return binops(c, json!({ "meta": { "key": "mark" } }));
        }
        return expr(c);
    }
    value(c)
}

/// One primary expression: `meta KEY`, a bare interface key, `ct [DIR] KEY`, a payload field,
/// `fib FLAGS RESULT`, `numgen`, `symhash`, `jhash`, `rt KEY`, `socket KEY`.
fn primary(c: &mut Cur) -> R<Value> {
    let w = c.name()?;
    Ok(match w.as_str() {
        "meta" => json!({ "meta": { "key": c.name()? } }),
        k if BARE_META.contains(&k) => json!({ "meta": { "key": k } }),
        "ct" => ct(c)?,
        p if PAYLOADS.contains(&p) => json!({ "payload": { "protocol": p, "field": c.name()? } }),
        "fib" => {
            let mut flags = vec![c.name()?];
            while c.eat(".") {
                flags.push(c.name()?);
            }
            json!({ "fib": { "result": c.name()?, "flags": flags } })
        }
        "numgen" => {
            let mode = c.name()?;
            if !c.eat("mod") {
                return Err("`numgen MODE mod N` expected".into());
            }
            let m = c.number()?;
            let offset = if c.eat("offset") { c.number()? } else { 0 };
            json!({ "numgen": { "mode": mode, "mod": m, "offset": offset } })
        }
        "symhash" => json!({ "symhash": hash_options(c)? }),
        "jhash" => {
            let e = expr(c)?;
            let mut o = hash_options(c)?;
            o.insert("expr".into(), e);
            json!({ "jhash": o })
        }
        "rt" | "socket" => json!({ w: { "key": c.name()? } }),
        other => return Err(format!("expression {other:?} not read")),
    })
}

/// `ct [original|reply] [ip|ip6] KEY`.
fn ct(c: &mut Cur) -> R<Value> {
    let mut dir = None;
    if matches!(c.word(), Some("original" | "reply")) {
        dir = Some(c.name()?);
    }
    let mut key = c.name()?;
    if matches!(key.as_str(), "ip" | "ip6") {
        key = format!("{key} {}", c.name()?);
    }
    Ok(match dir {
        Some(d) => json!({ "ct": { "key": key, "dir": d } }),
        None => json!({ "ct": { "key": key } }),
    })
}

/// `mod N [seed S] [offset O]` of a hash.
fn hash_options(c: &mut Cur) -> R<Map<String, Value>> {
    let mut o = Map::new();
    while let Some(k) = c.word().filter(|k| matches!(*k, "mod" | "seed" | "offset")) {
        let k = k.to_string();
        c.next();
        let n = c.number()?;
        if k != "offset" || n != 0 {
            o.insert(k, json!(n));
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::super::lex::lex;
    use super::*;

    fn read(s: &str, family: &str) -> Vec<Value> {
        let r = rule(&lex(s), family);
        assert!(r.unread.is_none(), "{s}: {:?}", r.unread);
        r.expr
    }

    #[test]
    fn matches_as_nft_json_writes_them() {
        assert_eq!(
            read(
                "ct state established,related counter packets 3 bytes 180 accept",
                "ip"
            ),
            [
                json!({"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}),
                json!({"counter": {"packets": 3, "bytes": 180}}),
                json!({"accept": null})
            ]
        );
        assert_eq!(
            read("ip saddr != 10.244.0.0/16 tcp dport 30000-32767 meta mark & 0x00004000 == 0x00000000 return", "ip"),
            [
                json!({"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": {"prefix": {"addr": "10.244.0.0", "len": 16}}}}),
                json!({"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": {"range": [30000, 32767]}}}),
                json!({"match": {"op": "==", "left": {"&": [{"meta": {"key": "mark"}}, 16384]}, "right": 0}}),
                json!({"return": null})
            ]
        );
        assert_eq!(
            read("tcp flags syn / fin,syn,rst,ack accept", "ip")[0],
            json!({"match": {"op": "==", "left": {"&": [{"payload": {"protocol": "tcp", "field": "flags"}}, ["fin", "syn", "rst", "ack"]]}, "right": "syn"}})
        );
        assert_eq!(
            read("fib saddr . iif oif missing drop", "inet")[0],
            json!({"match": {"op": "==", "left": {"fib": {"result": "oif", "flags": ["saddr", "iif"]}}, "right": false}})
        );
    }

    #[test]
    fn maps_nat_and_the_statements_kube_proxy_and_weir_write() {
        assert_eq!(
            read(
                "numgen random mod 2 vmap { 0 : goto endpoint-A, 1 : goto endpoint-B }",
                "ip"
            )[0],
            json!({"vmap": {"key": {"numgen": {"mode": "random", "mod": 2, "offset": 0}}, "data": {"set": [[0, {"goto": {"target": "endpoint-A"}}], [1, {"goto": {"target": "endpoint-B"}}]]}}})
        );
        assert_eq!(
            read(
                "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @ep4tcp",
                "inet"
            )[0],
            json!({"dnat": {"family": "ip", "addr": {"map": {"key": {"concat": [
                {"payload": {"protocol": "ip", "field": "daddr"}}, {"meta": {"key": "l4proto"}},
                {"payload": {"protocol": "th", "field": "dport"}}, {"numgen": {"mode": "random", "mod": 2, "offset": 0}}
            ]}, "data": "@ep4tcp"}}}})
        );
        assert_eq!(
            read("snat ip6 to [fd00::1]:1000", "inet")[0],
            json!({"snat": {"family": "ip6", "addr": "fd00::1", "port": 1000}})
        );
        assert_eq!(
            read("meta mark set meta mark | 0x00004000", "ip")[0],
            json!({"mangle": {"key": {"meta": {"key": "mark"}}, "value": {"|": [{"meta": {"key": "mark"}}, 16384]}}})
        );
        assert_eq!(
            read("reject", "inet")[0],
            json!({"reject": {"type": "icmpx", "expr": "port-unreachable"}})
        );
        assert_eq!(
            read("reject", "ip")[0],
            json!({"reject": {"type": "icmp", "expr": "port-unreachable"}})
        );
        assert_eq!(
            read("limit rate over 10/minute burst 20 packets drop", "ip")[0],
            json!({"limit": {"rate": 10, "burst": 20, "per": "minute", "inv": true}})
        );
        // What is not read ends the rule, marked; its comment is still read.
        let r = rule(&lex("ip daddr 10.0.0.1 queue num 1 comment \"x\""), "ip");
        assert_eq!(r.expr[1], json!({"unread": "queue num 1"}));
        assert_eq!(r.comment.as_deref(), Some("x"));
        assert!(r.unread.is_some());
    }

    #[test]
    fn durations_are_whole_seconds() {
        assert_eq!(duration("59m59s996ms"), Some(3599));
        assert_eq!(duration("1d2h"), Some(93_600));
        assert_eq!(duration("30s"), Some(30));
        assert_eq!(duration("x"), None);
    }
}
