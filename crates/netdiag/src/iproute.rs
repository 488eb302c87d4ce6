//! iproute2 outputs: `ip rule`, `ip route show table all`, `ip -d link`, `ip addr`, `ip neigh`,
//! in their JSON (`ip -j …`) and plain-text forms. [`parse_rules`] and friends take either and
//! tell them apart by the first character.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;
use serde_json::Value;

use crate::{paste, Parsed, Skipped};

/// One policy rule (`ip rule`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyRule {
    pub priority: u32,
    pub not: bool,
    /// `None`: `from all`.
    pub src: Option<IpNet>,
    pub dst: Option<IpNet>,
    /// `(mark, mask)`; the mask is all ones when the dump gives none.
    pub fwmark: Option<(u32, u32)>,
    pub iif: Option<String>,
    pub oif: Option<String>,
    /// The table a `lookup` rule uses (`main`, `local`, `1003`, …).
    pub table: Option<String>,
    /// `lookup`, `blackhole`, `unreachable`, `prohibit`, `goto`, `nop`.
    pub action: String,
    pub text: String,
}

/// One route of `ip route show table all`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Route {
    /// `main` when the dump names none.
    pub table: String,
    /// `unicast`, `local`, `broadcast`, `blackhole`, `unreachable`, `prohibit`, `multicast`, …
    pub kind: String,
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub dev: Option<String>,
    pub prefsrc: Option<IpAddr>,
    pub scope: Option<String>,
    pub metric: u32,
    pub onlink: bool,
    /// `proto kernel`, `static`, `boot`, … (`None` when the dump names none).
    pub proto: Option<String>,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vxlan {
    pub id: Option<u32>,
    pub local: Option<IpAddr>,
    /// The underlay device (`dev eth0`).
    pub dev: Option<String>,
    pub port: Option<u16>,
}

/// One interface of `ip -d link`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    /// The `UP` flag (administratively up).
    pub up: bool,
    pub master: Option<String>,
    /// `veth`, `bridge`, `vxlan`, `dummy`, … (`None` for a plain device, or without `-d`).
    pub kind: Option<String>,
    pub vxlan: Option<Vxlan>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Address {
    pub ifname: String,
    pub addr: IpAddr,
    pub prefix_len: u8,
    pub scope: String,
    pub secondary: bool,
    pub noprefixroute: bool,
}

impl Address {
    pub fn net(&self) -> IpNet {
        IpNet::new(self.addr, self.prefix_len).unwrap_or_else(|_| IpNet::from(self.addr))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Neighbour {
    pub dst: IpAddr,
    pub dev: String,
    /// `REACHABLE`, `STALE`, `FAILED`, `PERMANENT`, `INCOMPLETE`, … (the first state word).
    pub state: String,
}

fn is_json(text: &str) -> bool {
    text.trim_start().starts_with('[') || text.trim_start().starts_with('{')
}

/// A pasted output's lines and its JSON form when it is one (`ip -j …`, with any prompt line
/// and `\r` taken away).
fn pasted(text: &str) -> (paste::Pasted<'_>, Option<String>) {
    let p = paste::lines(text);
    let body = p.body();
    let json = is_json(&body).then_some(body);
    (p, json)
}

/// A JSON array from `ip -j`, or the one skip saying why not.
fn json_array(text: &str) -> Result<Vec<Value>, Skipped> {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(Value::Array(items)) => Ok(items),
        Ok(_) => Err(Skipped::new(0, text, "JSON but not an array")),
        Err(e) => Err(Skipped::new(0, text, format!("not JSON: {e}"))),
    }
}

fn s(v: &Value, key: &str) -> Option<String> {
    match v.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// `10.0.0.0/8`, `10.0.0.1` (a host), `all`/`default` (`None`, any address).
fn parse_prefix(s: &str, len: Option<u8>) -> Result<Option<IpNet>, String> {
    if s == "all" || s == "default" {
        return Ok(None);
    }
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(Some(net));
    }
    let ip: IpAddr = s.parse().map_err(|_| format!("bad address {s:?}"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    IpNet::new(ip, len.unwrap_or(max))
        .map(Some)
        .map_err(|e| e.to_string())
}

fn fwmark(mark: &str, mask: Option<&str>) -> Option<(u32, u32)> {
    Some((
        parse_u32(mark)?,
        mask.map(parse_u32).unwrap_or(Some(u32::MAX))?,
    ))
}

/// `ip rule` or `ip -j rule`.
pub fn parse_rules(text: &str) -> Parsed<Vec<PolicyRule>> {
    let mut rules = Vec::new();
    let mut skipped = Vec::new();
    let (p, json) = pasted(text);
    if let Some(text) = json.as_deref() {
        match json_array(text) {
            Ok(items) => {
                for (i, v) in items.iter().enumerate() {
                    match rule_from_json(v) {
                        Ok(r) => rules.push(r),
                        Err(e) => skipped.push(Skipped::new(i, v.to_string(), e)),
                    }
                }
            }
            Err(e) => skipped.push(e),
        }
    } else {
        for l in p.data() {
            match rule_from_text(l.text) {
                Ok(r) => rules.push(r),
                Err(e) => skipped.push(Skipped::new(l.no, l.text, l.reason(e))),
            }
        }
    }
    rules.sort_by_key(|r| r.priority);
    Parsed {
        value: rules,
        skipped,
    }
}

fn rule_from_json(v: &Value) -> Result<PolicyRule, String> {
    let priority = v
        .get("priority")
        .and_then(Value::as_u64)
        .ok_or("no priority")? as u32;
    let len = |k: &str| v.get(k).and_then(Value::as_u64).map(|n| n as u8);
    let src = parse_prefix(&s(v, "src").unwrap_or_else(|| "all".into()), len("srclen"))?;
    let dst = match s(v, "dst") {
        Some(d) => parse_prefix(&d, len("dstlen"))?,
        None => None,
    };
    let fw = match s(v, "fwmark") {
        Some(m) => Some(fwmark(&m, s(v, "fwmask").as_deref()).ok_or("bad fwmark")?),
        None => None,
    };
    let action = s(v, "action").unwrap_or_else(|| "lookup".into());
    let mut r = PolicyRule {
        priority,
        not: v.get("not").is_some(),
        src,
        dst,
        fwmark: fw,
        iif: s(v, "iif"),
        oif: s(v, "oif"),
        table: s(v, "table"),
        action,
        text: String::new(),
    };
    r.text = render_rule(&r);
    Ok(r)
}

/// The rule as `ip rule` prints it.
fn render_rule(r: &PolicyRule) -> String {
    let mut out = format!("{}:\t", r.priority);
    if r.not {
        out.push_str("not ");
    }
    out.push_str(&format!(
        "from {}",
        r.src
            .map(|n| host_or_net(&n))
            .unwrap_or_else(|| "all".into())
    ));
    if let Some(d) = r.dst {
        out.push_str(&format!(" to {}", host_or_net(&d)));
    }
    if let Some((m, mask)) = r.fwmark {
        if mask == u32::MAX {
            out.push_str(&format!(" fwmark {m:#x}"));
        } else {
            out.push_str(&format!(" fwmark {m:#x}/{mask:#x}"));
        }
    }
    if let Some(i) = &r.iif {
        out.push_str(&format!(" iif {i}"));
    }
    if let Some(o) = &r.oif {
        out.push_str(&format!(" oif {o}"));
    }
    match (&r.table, r.action.as_str()) {
        (Some(t), "lookup") => out.push_str(&format!(" lookup {t}")),
        (_, a) => out.push_str(&format!(" {a}")),
    }
    out
}

fn host_or_net(n: &IpNet) -> String {
    if n.prefix_len() == n.max_prefix_len() {
        n.addr().to_string()
    } else {
        n.to_string()
    }
}

fn rule_from_text(line: &str) -> Result<PolicyRule, String> {
    let (prio, rest) = line.split_once(':').ok_or("no `priority:`")?;
    let priority = prio.trim().parse().map_err(|_| "bad priority")?;
    let words: Vec<&str> = rest.split_whitespace().collect();
    let mut r = PolicyRule {
        priority,
        not: false,
        src: None,
        dst: None,
        fwmark: None,
        iif: None,
        oif: None,
        table: None,
        action: "lookup".into(),
        text: line.trim().to_string(),
    };
    let mut i = 0;
    while i < words.len() {
        let next = words.get(i + 1).copied();
        let need = || next.ok_or_else(|| format!("{} without a value", words[i]));
        match words[i] {
            "not" => r.not = true,
            "from" => {
                r.src = parse_prefix(need()?, None)?;
                i += 1;
            }
            "to" => {
                r.dst = parse_prefix(need()?, None)?;
                i += 1;
            }
            "fwmark" => {
                let v = need()?;
                let (m, mask) = match v.split_once('/') {
                    Some((m, k)) => (m, Some(k)),
                    None => (v, None),
                };
                r.fwmark = Some(fwmark(m, mask).ok_or("bad fwmark")?);
                i += 1;
            }
            "iif" => {
                r.iif = Some(need()?.to_string());
                i += 1;
            }
            "oif" => {
                r.oif = Some(need()?.to_string());
                i += 1;
            }
            "lookup" | "table" => {
                r.table = Some(need()?.to_string());
                i += 1;
            }
            "goto" => {
                r.action = "goto".into();
                i += 1;
            }
            a @ ("blackhole" | "unreachable" | "prohibit" | "nop") => r.action = a.to_string(),
            // Qualifiers the walk does not use (tos, ipproto, sport, dport, uidrange, proto,
            // suppress_prefixlength, [detached], realms): skip their value when they have one.
            "tos"
            | "dsfield"
            | "ipproto"
            | "sport"
            | "dport"
            | "uidrange"
            | "proto"
            | "protocol"
            | "suppress_prefixlength"
            | "suppress_ifgroup"
            | "realms"
            | "l3mdev"
            | "pref"
            | "priority" => i += 1,
            _ => {}
        }
        i += 1;
    }
    Ok(r)
}

const ROUTE_KINDS: &[&str] = &[
    "unicast",
    "local",
    "broadcast",
    "multicast",
    "blackhole",
    "unreachable",
    "prohibit",
    "throw",
    "nat",
    "anycast",
];

fn default_net(gateway: Option<IpAddr>) -> IpNet {
    match gateway {
        Some(IpAddr::V6(_)) => "::/0".parse().unwrap(),
        _ => "0.0.0.0/0".parse().unwrap(),
    }
}

/// `ip route show table all` or `ip -j route show table all`.
pub fn parse_routes(text: &str) -> Parsed<Vec<Route>> {
    let mut routes = Vec::new();
    let mut skipped = Vec::new();
    let (p, json) = pasted(text);
    if let Some(text) = json.as_deref() {
        match json_array(text) {
            Ok(items) => {
                for (i, v) in items.iter().enumerate() {
                    match route_from_json(v) {
                        Ok(r) => routes.push(r),
                        Err(e) => skipped.push(Skipped::new(i, v.to_string(), e)),
                    }
                }
            }
            Err(e) => skipped.push(e),
        }
    } else {
        // `ip route show table local` prints no `table local` on its lines: the command above
        // them (a prompt or echoed line) names the table.
        let shown_table = |no: usize| {
            let c = p.command_above(no)?;
            let w: Vec<&str> = c.split_whitespace().collect();
            let i = w.iter().position(|x| *x == "table")?;
            w.get(i + 1)
                .filter(|t| !matches!(**t, "all" | "0"))
                .map(|t| t.to_string())
        };
        for l in p.data() {
            // Multipath next hops are continuation lines ("\tnexthop via …"): not modelled.
            if l.text.starts_with(char::is_whitespace) {
                skipped.push(Skipped::new(
                    l.no,
                    l.text,
                    "multipath next hop (not modelled)",
                ));
                continue;
            }
            match route_from_text(l.text) {
                Ok(mut r) => {
                    if let Some(t) = shown_table(l.no) {
                        if !l.text.split_whitespace().any(|w| w == "table") {
                            r.table = t;
                        }
                    }
                    routes.push(r)
                }
                Err(e) => skipped.push(Skipped::new(l.no, l.text, l.reason(e))),
            }
        }
    }
    Parsed {
        value: routes,
        skipped,
    }
}

/// `ip -6 route show table all` (text or `-j`): as [`parse_routes`], with `default` read as
/// `::/0` (a route without a gateway says nothing of its family; this output holds IPv6 only).
pub fn parse_routes6(text: &str) -> Parsed<Vec<Route>> {
    let mut p = parse_routes(text);
    for r in &mut p.value {
        if r.dst == default_net(None) {
            r.dst = default_net(Some(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)));
        }
    }
    p
}

fn ip(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("bad address {s:?}"))
}

fn route_from_json(v: &Value) -> Result<Route, String> {
    let gateway = s(v, "gateway").map(|g| ip(&g)).transpose()?;
    let dst_s = s(v, "dst").ok_or("no dst")?;
    let dst = parse_prefix(&dst_s, None)?.unwrap_or_else(|| default_net(gateway));
    let flags: Vec<String> = v
        .get("flags")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut r = Route {
        table: s(v, "table").unwrap_or_else(|| "main".into()),
        kind: s(v, "type").unwrap_or_else(|| "unicast".into()),
        dst,
        gateway,
        dev: s(v, "dev"),
        prefsrc: s(v, "prefsrc").map(|p| ip(&p)).transpose()?,
        scope: s(v, "scope"),
        metric: v.get("metric").and_then(Value::as_u64).unwrap_or(0) as u32,
        onlink: flags.iter().any(|f| f == "onlink"),
        proto: s(v, "protocol"),
        text: String::new(),
    };
    r.text = render_route(&r);
    Ok(r)
}

/// The route as `ip route show table all` prints it (the fields the walk uses).
fn render_route(r: &Route) -> String {
    let mut out = String::new();
    if r.kind != "unicast" {
        out.push_str(&r.kind);
        out.push(' ');
    }
    if r.dst.prefix_len() == 0 {
        out.push_str("default");
    } else {
        out.push_str(&host_or_net(&r.dst));
    }
    if let Some(g) = r.gateway {
        out.push_str(&format!(" via {g}"));
    }
    if let Some(d) = &r.dev {
        out.push_str(&format!(" dev {d}"));
    }
    if r.table != "main" {
        out.push_str(&format!(" table {}", r.table));
    }
    if let Some(sc) = &r.scope {
        out.push_str(&format!(" scope {sc}"));
    }
    if let Some(p) = r.prefsrc {
        out.push_str(&format!(" src {p}"));
    }
    if r.metric != 0 {
        out.push_str(&format!(" metric {}", r.metric));
    }
    if r.onlink {
        out.push_str(" onlink");
    }
    out
}

fn route_from_text(line: &str) -> Result<Route, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut i = 0;
    let mut kind = "unicast".to_string();
    if ROUTE_KINDS.contains(&words[0]) {
        kind = words[0].to_string();
        i = 1;
    }
    let dst_s = *words.get(i).ok_or("no destination")?;
    i += 1;
    let mut r = Route {
        table: "main".into(),
        kind,
        dst: "0.0.0.0/0".parse().unwrap(),
        gateway: None,
        dev: None,
        prefsrc: None,
        scope: None,
        metric: 0,
        onlink: false,
        proto: None,
        text: line.trim().to_string(),
    };
    while i < words.len() {
        let next = words.get(i + 1).copied();
        let need = || next.ok_or_else(|| format!("{} without a value", words[i]));
        match words[i] {
            "via" => {
                let mut g = need()?;
                // `via inet6 fe80::1`
                if g == "inet" || g == "inet6" {
                    i += 1;
                    g = words.get(i + 1).ok_or("via without an address")?;
                }
                r.gateway = Some(ip(g)?);
                i += 1;
            }
            "dev" => {
                r.dev = Some(need()?.to_string());
                i += 1;
            }
            "table" => {
                r.table = need()?.to_string();
                i += 1;
            }
            "src" => {
                r.prefsrc = Some(ip(need()?)?);
                i += 1;
            }
            "scope" => {
                r.scope = Some(need()?.to_string());
                i += 1;
            }
            "metric" => {
                r.metric = need()?.parse().map_err(|_| "bad metric")?;
                i += 1;
            }
            "onlink" => r.onlink = true,
            "proto" => {
                r.proto = Some(need()?.to_string());
                i += 1;
            }
            "pref" | "mtu" | "advmss" | "realms" | "expires" | "weight" | "nhid" | "encap"
            | "tos" | "initcwnd" | "initrwnd" | "rto_min" | "quickack" | "congctl" | "features"
            | "hoplimit" => i += 1,
            _ => {}
        }
        i += 1;
    }
    r.dst = parse_prefix(dst_s, None)?.unwrap_or_else(|| default_net(r.gateway));
    Ok(r)
}

/// `ip -d link` or `ip -j -d link` (without `-d` the kinds and vxlan data are missing).
pub fn parse_links(text: &str) -> Parsed<Vec<Link>> {
    let mut links = Vec::new();
    let mut skipped = Vec::new();
    let (p, json) = pasted(text);
    if let Some(text) = json.as_deref() {
        match json_array(text) {
            Ok(items) => {
                for (i, v) in items.iter().enumerate() {
                    match link_from_json(v) {
                        Ok(l) => links.push(l),
                        Err(e) => skipped.push(Skipped::new(i, v.to_string(), e)),
                    }
                }
            }
            Err(e) => skipped.push(e),
        }
        return Parsed {
            value: links,
            skipped,
        };
    }
    let (blocks, stray) = text_blocks(&p);
    for block in blocks {
        match link_from_text(&block.lines) {
            Ok(l) => links.push(l),
            Err(e) => skipped.push(Skipped::new(block.first_line, &block.lines[0], e)),
        }
    }
    skipped.extend(
        stray
            .into_iter()
            .map(|(no, text, why)| Skipped::new(no, text, why)),
    );
    Parsed {
        value: links,
        skipped,
    }
}

fn link_from_json(v: &Value) -> Result<Link, String> {
    let info = v.get("linkinfo");
    let kind = info.and_then(|i| s(i, "info_kind"));
    let vxlan = match (kind.as_deref(), info.and_then(|i| i.get("info_data"))) {
        (Some("vxlan"), Some(d)) => Some(Vxlan {
            id: d.get("id").and_then(Value::as_u64).map(|n| n as u32),
            local: s(d, "local").and_then(|a| a.parse().ok()),
            dev: s(d, "link"),
            port: d.get("port").and_then(Value::as_u64).map(|n| n as u16),
        }),
        _ => None,
    };
    Ok(Link {
        index: v
            .get("ifindex")
            .and_then(Value::as_u64)
            .ok_or("no ifindex")? as u32,
        name: s(v, "ifname").ok_or("no ifname")?,
        mtu: v.get("mtu").and_then(Value::as_u64).ok_or("no mtu")? as u32,
        up: v
            .get("flags")
            .and_then(Value::as_array)
            .is_some_and(|f| f.iter().any(|x| x == "UP")),
        master: s(v, "master"),
        kind,
        vxlan,
    })
}

/// One interface's lines of `ip link` / `ip addr` text: the `N: name: <…>` line and its
/// indented continuation lines.
struct Block {
    first_line: usize,
    lines: Vec<String>,
}

fn starts_block(line: &str) -> bool {
    line.split_once(": ")
        .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// The interface blocks of a pasted `ip link`/`ip addr`, and the lines that belong to none
/// (pasted noise, or continuation lines whose interface line grep cut away).
fn text_blocks(p: &paste::Pasted) -> (Vec<Block>, Vec<(usize, String, &'static str)>) {
    let mut blocks: Vec<Block> = Vec::new();
    let mut stray = Vec::new();
    let mut open = false;
    for l in &p.lines {
        if l.grep_break {
            open = false;
            continue;
        }
        if l.text.trim().is_empty() {
            continue;
        }
        if starts_block(l.text) {
            blocks.push(Block {
                first_line: l.no,
                lines: vec![l.text.to_string()],
            });
            open = true;
        } else if open && l.text.starts_with(char::is_whitespace) {
            if let Some(b) = blocks.last_mut() {
                b.lines.push(l.text.to_string());
            }
        } else {
            let why = if l.text.starts_with(char::is_whitespace) && !blocks.is_empty() {
                "an interface's line whose interface line grep cut away"
            } else {
                "not part of an interface block"
            };
            stray.push((l.no, l.text.to_string(), why));
        }
    }
    (blocks, stray)
}

/// `5: eth1@eth1p: <BROADCAST,…,UP,LOWER_UP> mtu 1500 … master cni0 state UP …`
fn link_header(line: &str) -> Result<(u32, String, bool, u32, Option<String>), String> {
    let mut parts = line.splitn(3, ": ");
    let index = parts
        .next()
        .unwrap_or_default()
        .trim()
        .parse()
        .map_err(|_| "bad index")?;
    let name_full = parts.next().ok_or("no name")?;
    let name = name_full.split('@').next().unwrap_or(name_full).to_string();
    let rest = parts.next().ok_or("no flags")?;
    let flags = rest
        .split_once('<')
        .and_then(|(_, r)| r.split_once('>'))
        .map(|(f, _)| f)
        .unwrap_or_default();
    let up = flags.split(',').any(|f| f == "UP");
    let words: Vec<&str> = rest.split_whitespace().collect();
    let after = |k: &str| {
        words
            .iter()
            .position(|w| *w == k)
            .and_then(|p| words.get(p + 1))
            .map(|s| s.to_string())
    };
    let mtu = after("mtu")
        .ok_or("no mtu")?
        .parse()
        .map_err(|_| "bad mtu")?;
    Ok((index, name, up, mtu, after("master")))
}

const LINK_KINDS: &[&str] = &[
    "veth",
    "bridge",
    "vxlan",
    "dummy",
    "ipvlan",
    "macvlan",
    "vlan",
    "bond",
    "tun",
    "geneve",
    "wireguard",
    "ipip",
    "gre",
    "sit",
    "vrf",
    "team",
    "nlmon",
    "ifb",
    "macvtap",
    "ip6tnl",
];

fn link_from_text(lines: &[String]) -> Result<Link, String> {
    let (index, name, up, mtu, master) = link_header(&lines[0])?;
    let mut kind = None;
    let mut vxlan = None;
    for l in &lines[1..] {
        let words: Vec<&str> = l.split_whitespace().collect();
        let Some(first) = words.first() else { continue };
        if kind.is_none() && LINK_KINDS.contains(first) {
            kind = Some(first.to_string());
            if *first == "vxlan" {
                let after = |k: &str| {
                    words
                        .iter()
                        .position(|w| *w == k)
                        .and_then(|p| words.get(p + 1))
                        .copied()
                };
                vxlan = Some(Vxlan {
                    id: after("id").and_then(|v| v.parse().ok()),
                    local: after("local").and_then(|v| v.parse().ok()),
                    dev: after("dev").map(str::to_string),
                    port: after("dstport").and_then(|v| v.parse().ok()),
                });
            }
        }
    }
    Ok(Link {
        index,
        name,
        mtu,
        up,
        master,
        kind,
        vxlan,
    })
}

/// `ip addr` or `ip -j addr`.
pub fn parse_addrs(text: &str) -> Parsed<Vec<Address>> {
    let mut addrs = Vec::new();
    let mut skipped = Vec::new();
    let (p, json) = pasted(text);
    if let Some(text) = json.as_deref() {
        match json_array(text) {
            Ok(items) => {
                for (i, v) in items.iter().enumerate() {
                    let Some(name) = s(v, "ifname") else {
                        skipped.push(Skipped::new(i, v.to_string(), "no ifname"));
                        continue;
                    };
                    for a in v
                        .get("addr_info")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let parsed = s(a, "local").and_then(|l| l.parse::<IpAddr>().ok());
                        let (Some(addr), Some(len)) =
                            (parsed, a.get("prefixlen").and_then(Value::as_u64))
                        else {
                            skipped.push(Skipped::new(
                                i,
                                a.to_string(),
                                "address without local/prefixlen",
                            ));
                            continue;
                        };
                        addrs.push(Address {
                            ifname: name.clone(),
                            addr,
                            prefix_len: len as u8,
                            scope: s(a, "scope").unwrap_or_else(|| "global".into()),
                            secondary: a.get("secondary").is_some_and(|x| x == true),
                            noprefixroute: a.get("noprefixroute").is_some_and(|x| x == true),
                        });
                    }
                }
            }
            Err(e) => skipped.push(e),
        }
        return Parsed {
            value: addrs,
            skipped,
        };
    }
    let (blocks, stray) = text_blocks(&p);
    for block in blocks {
        let Ok((_, name, ..)) = link_header(&block.lines[0]) else {
            skipped.push(Skipped::new(
                block.first_line,
                &block.lines[0],
                "bad interface line",
            ));
            continue;
        };
        for (k, l) in block.lines.iter().enumerate().skip(1) {
            match inet_line(l, Some(&name)) {
                Some(Ok(a)) => addrs.push(a),
                Some(Err(e)) => skipped.push(Skipped::new(block.first_line + k, l, e)),
                None => {}
            }
        }
    }
    // `ip addr | grep inet` and other cuts: an IPv4 address line names its interface by its
    // label, the last word (`eth0`, or `eth0:1` for an alias), so it is read without its block.
    let mut unread = Vec::new();
    for (no, text, why) in stray {
        if text.trim_start().starts_with("valid_lft") {
            continue; // lifetimes: nothing the walk uses
        }
        if let Some(brief) = brief_addr_line(&text) {
            addrs.extend(brief);
            continue;
        }
        match inet_line(&text, None) {
            Some(Ok(a)) => addrs.push(a),
            Some(Err(e)) => unread.push(Skipped::new(no, &text, e)),
            None => unread.push(Skipped::new(no, &text, why)),
        }
    }
    let stray = unread;
    skipped.extend(stray);
    Parsed {
        value: addrs,
        skipped,
    }
}

/// A line of `ip -br addr`: `eth0@if2   UP   10.12.97.49/24 fe80::1/64`. Its addresses carry no
/// scope or flags: loopback ones are `host`, IPv6 link-local ones `link`, the rest `global`.
fn brief_addr_line(l: &str) -> Option<Vec<Address>> {
    let words: Vec<&str> = l.split_whitespace().collect();
    let (name, state) = (words.first()?, words.get(1)?);
    if l.starts_with(char::is_whitespace)
        || !matches!(
            *state,
            "UP" | "DOWN" | "UNKNOWN" | "LOWERLAYERDOWN" | "DORMANT" | "NOTPRESENT" | "TESTING"
        )
    {
        return None;
    }
    let ifname = name.split('@').next().unwrap_or(name).to_string();
    let mut out = Vec::new();
    for w in &words[2..] {
        let (a, len) = w.split_once('/')?;
        let (addr, prefix_len) = (a.parse::<IpAddr>().ok()?, len.parse::<u8>().ok()?);
        let scope = match addr {
            IpAddr::V4(v) if v.is_loopback() => "host",
            IpAddr::V6(v) if v.is_loopback() => "host",
            IpAddr::V6(v) if v.segments()[0] & 0xffc0 == 0xfe80 => "link",
            _ => "global",
        };
        out.push(Address {
            ifname: ifname.clone(),
            addr,
            prefix_len,
            scope: scope.into(),
            secondary: false,
            noprefixroute: false,
        });
    }
    Some(out)
}

/// An `inet`/`inet6` line of `ip addr` on interface `ifname`, or, without one, on the
/// interface its label names (IPv4 lines only: `inet6` lines carry no label). `None`: not an
/// address line.
fn inet_line(l: &str, ifname: Option<&str>) -> Option<Result<Address, String>> {
    let words: Vec<&str> = l.split_whitespace().collect();
    let family = *words.first()?;
    if family != "inet" && family != "inet6" {
        return None;
    }
    let Some((a, len)) = words.get(1).and_then(|w| w.split_once('/')) else {
        // `inet 10.0.0.1 peer …` without a prefix: rare, skip.
        return Some(Err("address without /prefix".into()));
    };
    let (Ok(addr), Ok(prefix_len)) = (a.parse::<IpAddr>(), len.parse::<u8>()) else {
        return Some(Err("bad address".into()));
    };
    let ifname = match ifname {
        Some(n) => n.to_string(),
        None => {
            const NOT_LABELS: &[&str] = &[
                "secondary",
                "dynamic",
                "noprefixroute",
                "deprecated",
                "tentative",
                "permanent",
                "global",
                "host",
                "link",
                "site",
                "nodad",
                "mngtmpaddr",
            ];
            match words.last() {
                Some(label)
                    if family == "inet" && words.len() > 2 && !NOT_LABELS.contains(label) =>
                {
                    label.split(':').next().unwrap_or(label).to_string()
                }
                _ => {
                    return Some(Err(
                        "an address line whose interface line grep cut away (and no label)".into(),
                    ))
                }
            }
        }
    };
    let scope = words
        .iter()
        .position(|w| *w == "scope")
        .and_then(|p| words.get(p + 1))
        .unwrap_or(&"global")
        .to_string();
    Some(Ok(Address {
        ifname,
        addr,
        prefix_len,
        scope,
        secondary: words.contains(&"secondary"),
        noprefixroute: words.contains(&"noprefixroute"),
    }))
}

/// `ip neigh` or `ip -j neigh`.
pub fn parse_neighbours(text: &str) -> Parsed<Vec<Neighbour>> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let (p, json) = pasted(text);
    if let Some(text) = json.as_deref() {
        match json_array(text) {
            Ok(items) => {
                for (i, v) in items.iter().enumerate() {
                    let dst = s(v, "dst").and_then(|d| d.parse().ok());
                    let state = v
                        .get("state")
                        .and_then(Value::as_array)
                        .and_then(|a| a.first())
                        .and_then(Value::as_str)
                        .unwrap_or("NONE")
                        .to_string();
                    match (dst, s(v, "dev")) {
                        (Some(dst), Some(dev)) => out.push(Neighbour { dst, dev, state }),
                        _ => skipped.push(Skipped::new(i, v.to_string(), "no dst/dev")),
                    }
                }
            }
            Err(e) => skipped.push(e),
        }
    } else {
        for l in p.data() {
            let (i, line) = (l.no - 1, l.text);
            let words: Vec<&str> = line.split_whitespace().collect();
            let dev = words
                .iter()
                .position(|w| *w == "dev")
                .and_then(|p| words.get(p + 1));
            match (words[0].parse::<IpAddr>(), dev, words.last()) {
                (Ok(dst), Some(dev), Some(state)) => out.push(Neighbour {
                    dst,
                    dev: dev.to_string(),
                    state: state.to_string(),
                }),
                _ => skipped.push(Skipped::new(i + 1, line, "not a neighbour line")),
            }
        }
    }
    Parsed {
        value: out,
        skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_text_forms() {
        let p = parse_rules("0:\tfrom all lookup local\n1024:\tfrom all fwmark 0x80/0x80 lookup main\n2000:\tnot from 10.0.0.0/8 iif eth0 lookup 7\n3000: from all to 1.2.3.4 blackhole\ngarbage\n");
        assert_eq!(p.skipped.len(), 1);
        let r = &p.value;
        assert_eq!(r[1].fwmark, Some((0x80, 0x80)));
        assert!(r[2].not);
        assert_eq!(r[2].iif.as_deref(), Some("eth0"));
        assert_eq!(r[2].table.as_deref(), Some("7"));
        assert_eq!(r[3].action, "blackhole");
        assert_eq!(r[3].dst, Some("1.2.3.4/32".parse().unwrap()));
    }

    #[test]
    fn route_text_default_v6_and_kinds() {
        let p = parse_routes("default via fe80::1 dev eth0 proto ra metric 1024\nunreachable default table 5\nlocal 10.0.0.1 dev eth0 table local proto kernel scope host src 10.0.0.1\n\tnexthop via 1.1.1.1 dev x weight 1\n");
        assert_eq!(p.value.len(), 3);
        assert_eq!(p.skipped.len(), 1);
        assert_eq!(p.value[0].dst, "::/0".parse::<IpNet>().unwrap());
        assert_eq!(p.value[0].metric, 1024);
        assert_eq!(p.value[1].kind, "unreachable");
        assert_eq!(p.value[1].table, "5");
        assert_eq!(p.value[2].prefsrc, Some("10.0.0.1".parse().unwrap()));
    }
}
