//! `nft -j list ruleset`: tables, chains (base chains with hook, priority and policy), rules
//! (their JSON expressions kept, plus a readable rendering), sets and maps.
//!
//! Tables that `iptables-nft` manages show up here too, with `xt` expressions nft cannot
//! decode; [`Rule::uses_xt`] marks those, and their rules should be read from `iptables-save`.

use serde::Serialize;
use serde_json::Value;

use crate::{Parsed, Skipped};

#[derive(Debug, Clone, Default, Serialize)]
pub struct Ruleset {
    pub version: Option<String>,
    pub tables: Vec<TableRef>,
    pub chains: Vec<Chain>,
    pub rules: Vec<Rule>,
    pub sets: Vec<Set>,
    /// Chains a text paste ends inside (`family table chain`): their later rules are not
    /// shown. (A JSON document is whole or unreadable: always empty there.)
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableRef {
    pub family: String,
    pub name: String,
}

/// A base chain's hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hook {
    /// `filter`, `nat`, `route`.
    pub kind: String,
    pub hook: String,
    pub priority: i64,
    /// `accept` or `drop`.
    pub policy: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Chain {
    pub family: String,
    pub table: String,
    pub name: String,
    /// `None` for a regular chain (reached only by jump/goto).
    pub hook: Option<Hook>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rule {
    pub family: String,
    pub table: String,
    pub chain: String,
    pub handle: Option<u64>,
    pub comment: Option<String>,
    pub expr: Vec<Value>,
    /// The rule in nft's own syntax, rendered from `expr` (best effort; unknown expressions are
    /// shown as their JSON).
    pub text: String,
    /// An iptables-nft rule (`xt` match or target): nft's JSON does not carry its meaning.
    pub uses_xt: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Set {
    pub family: String,
    pub table: String,
    pub name: String,
    pub is_map: bool,
    pub key_type: Value,
    pub elements: Vec<Value>,
}

impl Rule {
    /// Its counter as the paste shows it (`counter packets N bytes M`): (packets, bytes).
    pub fn counters(&self) -> Option<(u64, u64)> {
        self.expr.iter().find_map(|e| {
            let c = e.get("counter")?;
            Some((c.get("packets")?.as_u64()?, c.get("bytes")?.as_u64()?))
        })
    }
}

impl Ruleset {
    /// Base chains on `hook` of `families` (e.g. `["ip", "inet"]`), lowest priority first: the
    /// order the kernel runs them in.
    pub fn base_chains(&self, hook: &str, families: &[&str]) -> Vec<&Chain> {
        let mut chains: Vec<&Chain> = self
            .chains
            .iter()
            .filter(|c| families.contains(&c.family.as_str()))
            .filter(|c| c.hook.as_ref().is_some_and(|h| h.hook == hook))
            .collect();
        chains.sort_by_key(|c| c.hook.as_ref().map(|h| h.priority));
        chains
    }

    pub fn rules_of<'a>(&'a self, chain: &'a Chain) -> impl Iterator<Item = &'a Rule> {
        self.rules.iter().filter(move |r| {
            r.family == chain.family && r.table == chain.table && r.chain == chain.name
        })
    }

    pub fn set(&self, family: &str, table: &str, name: &str) -> Option<&Set> {
        self.sets
            .iter()
            .find(|s| s.family == family && s.table == table && s.name == name)
    }

    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }
}

impl Ruleset {
    /// Adds another ruleset of the same node (a second paste of `nft -j list table …`).
    pub fn merge(&mut self, other: Ruleset) {
        self.version = self.version.take().or(other.version);
        for t in other.tables {
            if !self.tables.contains(&t) {
                self.tables.push(t);
            }
        }
        self.chains.extend(other.chains);
        self.rules.extend(other.rules);
        self.sets.extend(other.sets);
        self.cut.extend(other.cut);
    }
}

fn str_field(obj: &Value, key: &str) -> Option<String> {
    obj.get(key).and_then(Value::as_str).map(str::to_string)
}

/// Parses `nft -j list ruleset` output. An unreadable document is one skipped entry; unknown or
/// malformed elements are skipped one by one.
pub fn parse(text: &str) -> Parsed<Ruleset> {
    let mut rs = Ruleset::default();
    let mut skipped = Vec::new();
    // A prompt line above the JSON (`$ nft -j list ruleset`) or `\r\n` line ends.
    let body;
    let text = if text.trim_start().starts_with('{') {
        text
    } else {
        body = crate::paste::lines(text).body();
        &body
    };
    let doc: Value = match serde_json::from_str(text.trim()) {
        Ok(v) => v,
        Err(e) => {
            skipped.push(Skipped::new(0, text, format!("not JSON: {e}")));
            return Parsed { value: rs, skipped };
        }
    };
    let Some(items) = doc.get("nftables").and_then(Value::as_array) else {
        skipped.push(Skipped::new(0, text, "no top-level \"nftables\" array"));
        return Parsed { value: rs, skipped };
    };
    for (i, item) in items.iter().enumerate() {
        let Some((kind, obj)) = item.as_object().and_then(|o| o.iter().next()) else {
            skipped.push(Skipped::new(i, item.to_string(), "not an object"));
            continue;
        };
        if let Err(why) = read_item(&mut rs, kind, obj) {
            skipped.push(Skipped::new(i, item.to_string(), why));
        }
    }
    Parsed { value: rs, skipped }
}

/// One element of the `nftables` array into `rs`; why it was not read.
fn read_item(rs: &mut Ruleset, kind: &str, obj: &Value) -> Result<(), String> {
    match kind {
        "metainfo" => rs.version = str_field(obj, "version"),
        "table" => match (str_field(obj, "family"), str_field(obj, "name")) {
            (Some(family), Some(name)) => rs.tables.push(TableRef { family, name }),
            _ => return Err("table without family/name".into()),
        },
        "chain" => rs
            .chains
            .push(read_chain(obj).ok_or("chain without family/table/name")?),
        "rule" => rs
            .rules
            .push(read_rule(obj).ok_or("rule without family/table/chain")?),
        "set" | "map" => rs
            .sets
            .push(read_set(kind, obj).ok_or("set without family/table/name")?),
        // Objects the walk does not use yet; not an error.
        "counter" | "quota" | "ct helper" | "limit" | "flowtable" | "ct timeout"
        | "ct expectation" | "secmark" | "synproxy" | "element" => {}
        other => return Err(format!("unknown element {other:?}")),
    }
    Ok(())
}

/// A chain; a base chain (with hook and priority) has its [`Hook`].
fn read_chain(obj: &Value) -> Option<Chain> {
    let (family, table, name) = (
        str_field(obj, "family")?,
        str_field(obj, "table")?,
        str_field(obj, "name")?,
    );
    let hook = match (
        str_field(obj, "hook"),
        obj.get("prio").and_then(Value::as_i64),
    ) {
        (Some(hook), Some(priority)) => Some(Hook {
            kind: str_field(obj, "type").unwrap_or_else(|| "filter".into()),
            hook,
            priority,
            policy: str_field(obj, "policy").unwrap_or_else(|| "accept".into()),
        }),
        _ => None,
    };
    Some(Chain {
        family,
        table,
        name,
        hook,
    })
}

/// A rule, with its expressions rendered in nft's syntax (and its comment).
fn read_rule(obj: &Value) -> Option<Rule> {
    let (family, table, chain) = (
        str_field(obj, "family")?,
        str_field(obj, "table")?,
        str_field(obj, "chain")?,
    );
    let expr = obj
        .get("expr")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let uses_xt = expr.iter().any(|e| e.get("xt").is_some());
    let comment = str_field(obj, "comment");
    let mut text = render_exprs(&expr);
    if let Some(c) = &comment {
        text.push_str(&format!(" comment {c:?}"));
    }
    Some(Rule {
        family,
        table,
        chain,
        handle: obj.get("handle").and_then(Value::as_u64),
        comment,
        expr,
        text,
        uses_xt,
    })
}

fn read_set(kind: &str, obj: &Value) -> Option<Set> {
    Some(Set {
        family: str_field(obj, "family")?,
        table: str_field(obj, "table")?,
        name: str_field(obj, "name")?,
        is_map: kind == "map",
        key_type: obj.get("type").cloned().unwrap_or(Value::Null),
        elements: obj
            .get("elem")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    })
}

/// A rule's expressions in nft's syntax, space-separated.
pub fn render_exprs(exprs: &[Value]) -> String {
    exprs
        .iter()
        .map(render_stmt)
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn render_stmt(stmt: &Value) -> String {
    let Some((k, v)) = stmt.as_object().and_then(|o| o.iter().next()) else {
        return stmt.to_string();
    };
    match k.as_str() {
        "match" => {
            let op = v.get("op").and_then(Value::as_str).unwrap_or("==");
            let left = render_value(&v["left"]);
            let right = render_value(&v["right"]);
            let binary = v["left"]
                .as_object()
                .is_some_and(|o| o.keys().any(|k| matches!(k.as_str(), "&" | "|" | "^")));
            match op {
                "==" if binary => format!("{left} == {right}"),
                "==" | "in" => format!("{left} {right}"),
                _ => format!("{left} {op} {right}"),
            }
        }
        "counter" => "counter".into(),
        "accept" | "drop" | "return" | "continue" | "masquerade" | "notrack" => {
            let mut s = k.clone();
            if let Some(flags) = v.get("flags") {
                s.push(' ');
                s.push_str(&render_value(flags));
            }
            s
        }
        "jump" | "goto" => format!("{k} {}", v["target"].as_str().unwrap_or("?")),
        "mangle" => format!(
            "{} set {}",
            render_value(&v["key"]),
            render_value(&v["value"])
        ),
        "snat" | "dnat" => {
            let mut s = format!("{k} to {}", render_value(&v["addr"]));
            if let Some(p) = v.get("port") {
                s.push(':');
                s.push_str(&render_value(p));
            }
            s
        }
        "vmap" => format!(
            "{} vmap {}",
            render_value(&v["key"]),
            render_value(&v["data"])
        ),
        "reject" => "reject".into(),
        "log" => "log".into(),
        // A rule part the text reader could not read (`crate::nft_text`), as written.
        "unread" => v.as_str().unwrap_or_default().to_string(),
        "xt" => format!(
            "xt {} {}",
            v.get("type").and_then(Value::as_str).unwrap_or("?"),
            v.get("name").and_then(Value::as_str).unwrap_or("?")
        ),
        _ => stmt.to_string(),
    }
}

/// An expression (left or right side, key, data) in nft's syntax.
pub fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        // `exists`/`missing` (fib, exthdr and option tests) are booleans in JSON.
        Value::Bool(b) => if *b { "exists" } else { "missing" }.to_string(),
        Value::Null => String::new(),
        Value::Array(items) => items.iter().map(render_value).collect::<Vec<_>>().join(","),
        Value::Object(o) => {
            let Some((k, inner)) = o.iter().next() else {
                return "{}".into();
            };
            match k.as_str() {
                // `fib saddr . iif oif`
                "fib" => {
                    let flags: Vec<&str> = match &inner["flags"] {
                        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                        Value::String(f) => vec![f.as_str()],
                        _ => Vec::new(),
                    };
                    let result = inner.get("result").and_then(Value::as_str).unwrap_or("?");
                    format!("fib {} {result}", flags.join(" . "))
                }
                "meta" | "ct" | "rt" | "socket" | "osf" => {
                    let key = inner.get("key").and_then(Value::as_str).unwrap_or("?");
                    match k.as_str() {
                        // nft prints these meta keys bare.
                        "meta" if matches!(key, "iifname" | "oifname" | "iif" | "oif") => {
                            key.to_string()
                        }
                        _ => format!("{k} {key}"),
                    }
                }
                "payload" => {
                    let proto = inner.get("protocol").and_then(Value::as_str).unwrap_or("?");
                    let field = inner.get("field").and_then(Value::as_str).unwrap_or("?");
                    format!("{proto} {field}")
                }
                "prefix" => format!(
                    "{}/{}",
                    render_value(&inner["addr"]),
                    inner["len"].as_u64().unwrap_or(0)
                ),
                "range" => {
                    let r = inner.as_array().cloned().unwrap_or_default();
                    format!(
                        "{}-{}",
                        r.first().map(render_value).unwrap_or_default(),
                        r.get(1).map(render_value).unwrap_or_default()
                    )
                }
                "set" => match inner {
                    Value::Array(items) => format!(
                        "{{ {} }}",
                        items
                            .iter()
                            .map(render_value)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    other => format!("{{ {} }}", render_value(other)),
                },
                "concat" => inner
                    .as_array()
                    .map(|a| a.iter().map(render_value).collect::<Vec<_>>().join(" . "))
                    .unwrap_or_default(),
                "&" | "|" | "^" | "<<" | ">>" => {
                    let parts = inner.as_array().cloned().unwrap_or_default();
                    parts
                        .iter()
                        .map(render_value)
                        .collect::<Vec<_>>()
                        .join(&format!(" {k} "))
                }
                "numgen" => format!(
                    "numgen {} mod {}",
                    inner.get("mode").and_then(Value::as_str).unwrap_or("?"),
                    inner.get("mod").and_then(Value::as_u64).unwrap_or(0)
                ),
                "jhash" | "symhash" => format!(
                    "{k} mod {}",
                    inner.get("mod").and_then(Value::as_u64).unwrap_or(0)
                ),
                "map" => format!(
                    "{} map {}",
                    render_value(&inner["key"]),
                    render_value(&inner["data"])
                ),
                "jump" | "goto" => format!("{k} {}", inner["target"].as_str().unwrap_or("?")),
                "accept" | "drop" | "return" | "continue" => k.clone(),
                "elem" => render_value(&inner["val"]),
                _ => v.to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_one_skip_and_unknown_elements_are_skipped() {
        assert_eq!(parse("not json").skipped.len(), 1);
        let p = parse(
            r#"{"nftables":[{"table":{"family":"ip","name":"t"}},{"frobnicator":{}},{"chain":{"family":"ip"}}]}"#,
        );
        assert_eq!(p.value.tables.len(), 1);
        assert_eq!(p.skipped.len(), 2, "{:?}", p.skipped);
        assert_eq!(p.skipped[0].line, 1);
    }
}
