//! What a span of a paste is, by its content: each line is matched against the shapes the
//! formats print, and the format most lines have wins. The prompt's command and the file's
//! name are hints only: they pick between forms the content cannot tell apart (`ip route get`
//! answers look like routes, `ip -6 rule` like `ip rule`, an `ip addr` of a device without
//! addresses like `ip link`), never against it. Pure.

use std::net::IpAddr;

use serde_json::Value;

use super::Kind;
use crate::paste;

/// A span's kind and how it was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    pub kind: Kind,
    /// The IPv6 form (`ip6tables-save`, `ip -6 rule`, `ip -6 route`).
    pub v6: bool,
    /// The hint that decided between forms of one content, when one did.
    pub hint: Option<String>,
}

/// Classifies a span's text; `command` is its prompt's command, `name` the file it came from.
pub fn classify(text: &str, command: Option<&str>, name: &str) -> Class {
    let p = paste::lines(text);
    let data: Vec<&str> = p
        .data()
        .map(|l| l.text)
        .filter(|t| !t.trim().is_empty())
        .collect();
    let content = by_content(&data, text);
    let cmd_kind = command.and_then(command_kind);
    // `cat /sys/…/brport/hairpin_mode` prints bare values: its command says what they are.
    let content = if content == Kind::Unknown
        && cmd_kind == Some(Kind::HairpinMode)
        && data.iter().all(|t| matches!(t.trim(), "0" | "1"))
    {
        Kind::HairpinMode
    } else {
        content
    };
    let mut class = Class {
        kind: content,
        v6: false,
        hint: None,
    };
    if let Some(k) = cmd_kind.filter(|k| refines(content, *k)) {
        if k != content {
            class.hint = Some(format!("`{}`", command.unwrap_or_default()));
        }
        class.kind = k;
    }
    let v6_cmd = command.is_some_and(is_v6_command);
    let v6_name = {
        let n = name.to_ascii_lowercase();
        n.starts_with("ip6") || n.starts_with("ip-6") || n.contains("ip6tables")
    };
    if class.kind.has_v6_form() {
        class.v6 = v6_cmd || v6_name || only_v6_addresses(&data);
        if class.v6 && !v6_cmd && class.hint.is_none() && v6_name {
            class.hint = Some(format!("file name {name}"));
        }
    }
    class
}

/// Whether a command's kind may replace the content's: the same lines read two ways.
pub(crate) fn refines(content: Kind, cmd: Kind) -> bool {
    use Kind::*;
    content == cmd
        || matches!(
            (content, cmd),
            (IpRoute, IpRouteGet)
                | (IpLink, IpAddr)
                | (IpBrLink, IpBrAddr)
                | (IptablesRules, IptablesSave)
                | (ConntrackList, ProcConntrack)
        )
}

/// The kind of output a command prints, as far as its words say.
pub fn command_kind(cmd: &str) -> Option<Kind> {
    // `kubectl exec POD -- ip addr`: the command run in the pod.
    let cmd = cmd.split_once(" -- ").map_or(cmd, |(_, c)| c);
    let first = cmd.split('|').next().unwrap_or(cmd);
    let w: Vec<&str> = first
        .split_whitespace()
        .skip_while(|w| *w == "sudo" || w.starts_with('-') && !w.starts_with("--"))
        .collect();
    let tool = w.first().map(|t| t.rsplit('/').next().unwrap_or(t))?;
    let rest: Vec<&str> = w[1..]
        .iter()
        .copied()
        .filter(|x| !x.starts_with('-'))
        .collect();
    let has = |flag: &str| w.contains(&flag);
    Some(match tool {
        "ip" => match (rest.first().copied(), rest.get(1).copied()) {
            (Some(r), Some("get" | "g")) if "route".starts_with(r) => Kind::IpRouteGet,
            (Some(r), _) if "route".starts_with(r) => Kind::IpRoute,
            (Some(r), _) if "rule".starts_with(r) && r.len() >= 2 => Kind::IpRule,
            (Some(a), _) if "address".starts_with(a) => {
                if has("-br") || has("-brief") {
                    Kind::IpBrAddr
                } else {
                    Kind::IpAddr
                }
            }
            _ => return None,
        },
        t if t.starts_with("iptables-save") || t.starts_with("ip6tables-save") => {
            Kind::IptablesSave
        }
        "ipvsadm" if has("-Lnc") || has("-lnc") || has("-Lcn") || has("-c") => Kind::IpvsadmConns,
        "conntrack" if has("-S") => Kind::ConntrackStats,
        "cat" | "grep" if first.contains("hairpin_mode") => Kind::HairpinMode,
        "cat" if first.contains("nf_conntrack") => Kind::ProcConntrack,
        _ => return None,
    })
}

fn is_v6_command(cmd: &str) -> bool {
    let w: Vec<&str> = cmd.split_whitespace().collect();
    w.iter().any(|x| {
        x.rsplit('/')
            .next()
            .is_some_and(|b| b.starts_with("ip6tables"))
    }) || w.first().is_some_and(|t| *t == "ip" || *t == "sudo") && w.contains(&"-6")
}

fn only_v6_addresses(data: &[&str]) -> bool {
    let mut v4 = false;
    let mut v6 = false;
    for t in data {
        for w in t.split_whitespace() {
            match w.split('/').next().unwrap_or(w).parse::<IpAddr>() {
                Ok(IpAddr::V4(_)) => v4 = true,
                Ok(IpAddr::V6(_)) => v6 = true,
                Err(_) => {}
            }
        }
    }
    v6 && !v4
}

/// The kind the content says, from its strongest marks first, then by counting lines.
fn by_content(data: &[&str], text: &str) -> Kind {
    let Some(first) = data.first().map(|t| t.trim_start()) else {
        return Kind::Unknown;
    };
    if looks_json(first) {
        return json_kind(data);
    }
    if let Some(k) = marked(data) {
        return k;
    }
    if crate::objects::looks_like_objects(text)
        && data
            .iter()
            .any(|t| t.trim_start().starts_with("kind:") || t.contains("\"kind\""))
    {
        return Kind::Objects;
    }
    counted(data)
}

/// Whether a first line starts a JSON document (`[912228.4] IPv4: …` is a kernel log line).
pub fn looks_json(first: &str) -> bool {
    let t = first.trim_start();
    match t.strip_prefix('[') {
        Some(rest) => {
            let rest = rest.trim_start();
            rest.is_empty() || rest.starts_with(['{', ']', '"'])
        }
        None => t.starts_with('{'),
    }
}

/// Kinds a few lines settle however the rest reads: their headers.
fn marked(data: &[&str]) -> Option<Kind> {
    let any = |f: &dyn Fn(&str) -> bool| data.iter().any(|t| f(t.trim()));
    // `cat /sys/…/brif/*/hairpin_mode` prints bare values under the path.
    if any(&|t| t.contains("/hairpin_mode")) {
        return Some(Kind::HairpinMode);
    }
    if any(&|t| matches!(t, "*filter" | "*nat" | "*mangle" | "*raw" | "*security") || t == "COMMIT")
    {
        return Some(Kind::IptablesSave);
    }
    if any(&|t| {
        t.starts_with("Chain ") && (t.contains(" (policy ") || t.contains(" references)"))
            || t.starts_with("target ") && t.contains(" prot ") && t.contains(" source ")
            || t.starts_with("num ") && t.contains(" target ") && t.contains(" prot ")
            || t.starts_with("pkts bytes target")
    }) {
        return Some(Kind::IptablesListing);
    }
    if any(&|t| {
        t.starts_with("table ") && t.ends_with('{')
            || t.starts_with("type ") && t.contains(" hook ") && t.contains(" priority ")
    }) {
        return Some(Kind::NftText);
    }
    if any(&|t| t.starts_with("IPVS connection entries") || t.starts_with("pro expire state")) {
        return Some(Kind::IpvsadmConns);
    }
    if any(&|t| {
        t.starts_with("IP Virtual Server version") || t.starts_with("Prot LocalAddress:Port")
    }) {
        return Some(Kind::IpvsadmLn);
    }
    if any(&|t| t.starts_with("Name: ")) && any(&|t| t.starts_with("Type: ") || t == "Members:") {
        return Some(Kind::IpsetList);
    }
    if any(&|t| {
        (t.starts_with("listening on ") || t.starts_with("tcpdump: listening on "))
            && t.contains("link-type")
    }) {
        return Some(Kind::Tcpdump);
    }
    None
}

/// `nft -j list ruleset`, `ip -j …`, or Kubernetes objects as JSON.
fn json_kind(data: &[&str]) -> Kind {
    let body = data.join("\n");
    if body.contains("\"nftables\"") {
        return Kind::NftJson;
    }
    let first = match serde_json::from_str::<Value>(&body) {
        Ok(Value::Array(items)) => items.into_iter().next(),
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    };
    let has = |k: &str| match &first {
        Some(v) => v.get(k).is_some(),
        // Cut JSON: the keys as text.
        None => body.contains(&format!("\"{k}\"")),
    };
    if has("apiVersion") && has("kind") {
        Kind::Objects
    } else if has("addr_info") {
        Kind::IpAddr
    } else if has("ifname") {
        Kind::IpLink
    } else if has("priority") && (has("src") || has("table") || has("action")) {
        Kind::IpRule
    } else if has("dst") && (has("lladdr") || has("state") && !has("protocol")) {
        Kind::IpNeigh
    } else if has("dst") {
        Kind::IpRoute
    } else {
        Kind::Unknown
    }
}

/// The kind most lines have (at least a third of them), else not recognised.
fn counted(data: &[&str]) -> Kind {
    let mut counts: Vec<(Kind, usize)> = Vec::new();
    for t in data {
        if let Some(k) = line_kind(t) {
            match counts.iter_mut().find(|(c, _)| *c == k) {
                Some((_, n)) => *n += 1,
                None => counts.push((k, 1)),
            }
        }
    }
    let n = |k: Kind| counts.iter().find(|(c, _)| *c == k).map_or(0, |(_, n)| *n);
    // ip addr's device lines read as ip link's; its address lines decide.
    let mut best = counts.iter().copied().max_by_key(|(_, n)| *n);
    if let Some((Kind::IpLink | Kind::IpAddr, _)) = best {
        let total = n(Kind::IpLink) + n(Kind::IpAddr);
        let k = if n(Kind::IpAddr) > 0 {
            Kind::IpAddr
        } else {
            Kind::IpLink
        };
        best = Some((k, total));
    }
    match best {
        Some((k, c)) if c * 3 >= data.len() => k,
        _ => Kind::Unknown,
    }
}

/// The kind one line looks like, if any.
pub(crate) fn line_kind(line: &str) -> Option<Kind> {
    let t = line.trim();
    let w: Vec<&str> = t.split_whitespace().collect();
    let w0 = *w.first()?;
    let indented = line.starts_with(char::is_whitespace);
    if t.contains("hairpin_mode") {
        return Some(Kind::HairpinMode);
    }
    if let Some(k) = iptables_line(&w) {
        return Some(k);
    }
    if t.starts_with("/proc/sys/") || is_sysctl(t) {
        return Some(Kind::Sysctl);
    }
    if t.starts_with("conntrack v") && t.contains("flow entries") {
        return Some(Kind::ConntrackList);
    }
    if t.contains(" src=") && t.contains(" dst=") && !t.contains(" SRC=") {
        return Some(if matches!(w0, "ipv4" | "ipv6") {
            Kind::ProcConntrack
        } else {
            Kind::ConntrackList
        });
    }
    if w0.starts_with("cpu=") {
        return Some(Kind::ConntrackStats);
    }
    if is_kernel_log(t) {
        return Some(Kind::KernelLog);
    }
    if is_tcpdump(&w) {
        return Some(Kind::Tcpdump);
    }
    if matches!(w0, "nameserver" | "search" | "options") && w.len() >= 2 && !indented {
        return Some(Kind::ResolvConf);
    }
    if let Some(k) = ipvs_line(&w) {
        return Some(k);
    }
    if matches!(w0, "create" | "add") && w.len() >= 3 && !indented {
        return Some(Kind::IpsetSave);
    }
    ip_line(line, &w)
}

fn iptables_line(w: &[&str]) -> Option<Kind> {
    let w0 = *w.first()?;
    let w1 = w.get(1).copied().unwrap_or("");
    // `[0:0] -A …` (iptables-save -c)
    let (w0, w1) = if w0.starts_with('[') && w0.ends_with(']') && w0.contains(':') {
        (w1, w.get(2).copied().unwrap_or(""))
    } else {
        (w0, w1)
    };
    let chain = !w1.is_empty() && !w1.starts_with('-');
    match w0 {
        "-A" | "-I" | "-N" | "-P" if chain => Some(Kind::IptablesRules),
        _ if w0.starts_with(':') && w0.len() > 1 && w.len() >= 2 => Some(Kind::IptablesSave),
        _ => None,
    }
}

fn is_sysctl(t: &str) -> bool {
    let Some((k, v)) = t.split_once('=') else {
        return false;
    };
    let k = k.trim();
    !v.trim().is_empty()
        && ["net.", "kernel.", "vm.", "fs.", "user.", "dev."]
            .iter()
            .any(|p| k.starts_with(p))
        && !k.contains(' ')
}

fn is_kernel_log(t: &str) -> bool {
    let stamped = t.starts_with('[')
        && t[1..]
            .split(']')
            .next()
            .is_some_and(|s| s.trim().chars().all(|c| c.is_ascii_digit() || c == '.'));
    stamped
        || t.contains(" kernel: ")
        || t.contains("martian source")
        || t.contains("nf_conntrack: table full")
        || t.contains("SRC=") && t.contains("DST=")
}

/// `12:34:56.789012 IP 10.0.0.1.40000 > 10.0.0.2.80: Flags [S], …` (with `-i any`, `eth0 In`
/// between; with `-e`, the MAC addresses).
fn is_tcpdump(w: &[&str]) -> bool {
    let stamp = |s: &str| {
        let (hms, frac) = s.split_once('.').unwrap_or((s, ""));
        hms.len() == 8
            && hms.split(':').count() == 3
            && hms
                .split(':')
                .all(|p| p.chars().all(|c| c.is_ascii_digit()))
            && frac.chars().all(|c| c.is_ascii_digit())
    };
    let i = w.iter().position(|x| stamp(x));
    let Some(i) = i.filter(|i| *i <= 1) else {
        return w
            .first()
            .is_some_and(|x| x.ends_with("packets") || *x == "tcpdump:")
            && w.iter().any(|x| *x == "captured" || *x == "verbose");
    };
    w[i + 1..]
        .iter()
        .take(8)
        .any(|x| matches!(*x, "IP" | "IP6" | "ARP," | "ethertype"))
}

fn ipvs_line(w: &[&str]) -> Option<Kind> {
    let w0 = *w.first()?;
    let w1 = w.get(1).copied().unwrap_or("");
    let endpoint = |s: &str| {
        s.rsplit_once(':').is_some_and(|(a, p)| {
            p.parse::<u16>().is_ok() && a.trim_matches(['[', ']']).parse::<IpAddr>().is_ok()
        })
    };
    match w0 {
        "->" if endpoint(w1) || w1 == "RemoteAddress:Port" => Some(Kind::IpvsadmLn),
        "TCP" | "UDP" | "SCTP" if endpoint(w1) => Some(Kind::IpvsadmLn),
        "TCP" | "UDP" | "SCTP" if w.len() >= 5 && w[1].contains(':') && endpoint(w[3]) => {
            Some(Kind::IpvsadmConns)
        }
        "FWM" if w1.parse::<u32>().is_ok() => Some(Kind::IpvsadmLn),
        "-A" | "-a" | "-E" if matches!(w1, "-t" | "-u" | "-f" | "--tcp-service") => {
            Some(Kind::IpvsadmSave)
        }
        _ => None,
    }
}

/// `ip route`, `ip rule`, `ip addr`/`link` (full and `-br`), `ip neigh` and `ip route get`.
fn ip_line(line: &str, w: &[&str]) -> Option<Kind> {
    let w0 = *w.first()?;
    let indented = line.starts_with(char::is_whitespace);
    let addr = |s: &str| s.split('/').next().unwrap_or(s).parse::<IpAddr>().is_ok();
    // (Indented too: `salt-ssh '*' -r 'ip addr'` indents what each node printed.)
    if w0.ends_with(':') && w0[..w0.len() - 1].parse::<u32>().is_ok() {
        if w.get(1).is_some_and(|x| matches!(*x, "from" | "not")) {
            return Some(Kind::IpRule);
        }
        // `3: eth0@if7: <BROADCAST,…> mtu 1500`
        if w.get(2).is_some_and(|x| x.starts_with('<')) {
            return Some(Kind::IpLink);
        }
    }
    if indented && !addr(w0) {
        return match w0 {
            "inet" | "inet6" | "valid_lft" => Some(Kind::IpAddr),
            "cache" | "nexthop" => Some(Kind::IpRoute),
            _ if w0.starts_with("link/") || matches!(w0, "RX:" | "TX:" | "altname") => {
                Some(Kind::IpLink)
            }
            _ => None,
        };
    }
    if w0 == "RTNETLINK" || t_has(w, "uid") && addr(w0) {
        return Some(Kind::IpRouteGet);
    }
    const NEIGH: &[&str] = &[
        "REACHABLE",
        "STALE",
        "DELAY",
        "PROBE",
        "FAILED",
        "INCOMPLETE",
        "PERMANENT",
        "NOARP",
    ];
    if addr(w0)
        && t_has(w, "dev")
        && (t_has(w, "lladdr") || w.last().is_some_and(|l| NEIGH.contains(l)))
    {
        return Some(Kind::IpNeigh);
    }
    const TYPES: &[&str] = &[
        "local",
        "broadcast",
        "unreachable",
        "blackhole",
        "prohibit",
        "throw",
        "multicast",
        "anycast",
        "unicast",
        "nat",
    ];
    let dst = if TYPES.contains(&w0) {
        w.get(1).copied().unwrap_or("")
    } else {
        w0
    };
    if (dst == "default" || addr(dst))
        && (t_has(w, "dev") || t_has(w, "via") || TYPES.contains(&w0) && w0 != "local")
    {
        return Some(Kind::IpRoute);
    }
    // `eth0@if2   UP   10.12.97.49/24 fe80::1/64` / `eth0   UP   0e:7a:…  <BROADCAST,…>`
    const STATES: &[&str] = &[
        "UP",
        "DOWN",
        "UNKNOWN",
        "LOWERLAYERDOWN",
        "DORMANT",
        "NOTPRESENT",
    ];
    if w.len() >= 2 && STATES.contains(&w[1]) {
        return Some(match w.get(2) {
            Some(x) if addr(x) => Kind::IpBrAddr,
            Some(x) if x.contains(':') && x.len() == 17 => Kind::IpBrLink,
            None => Kind::IpBrAddr,
            _ => return None,
        });
    }
    None
}

fn t_has(w: &[&str], word: &str) -> bool {
    w.contains(&word)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> Kind {
        classify(text, None, "paste").kind
    }

    #[test]
    fn forms_are_told_by_their_lines() {
        // Captured here (iproute2 6.1, tcpdump 4.99).
        let br_link = "lo               UNKNOWN        00:00:00:00:00:00 <LOOPBACK,UP,LOWER_UP> \nv1@v0            DOWN           06:32:37:f4:8b:fb <BROADCAST,MULTICAST> \n";
        assert_eq!(kind(br_link), Kind::IpBrLink);
        let br_addr = "lo               UNKNOWN        127.0.0.1/8 ::1/128 \nv1@v0            DOWN           \nv0@v1            LOWERLAYERDOWN 10.99.0.1/24 \n";
        assert_eq!(kind(br_addr), Kind::IpBrAddr);
        assert_eq!(
            kind("03:51:35.942739 IP 127.0.0.1.8080 > 127.0.0.1.42486: Flags [R.], seq 0, ack 763928554, win 0, length 0\n"),
            Kind::Tcpdump
        );
        assert_eq!(
            kind("-P INPUT ACCEPT\n-N KUBE-FORWARD\n-A FORWARD -j KUBE-FORWARD\n"),
            Kind::IptablesRules
        );
        assert_eq!(
            kind(
                "-A -t 10.254.0.1:443 -s rr\n-a -t 10.254.0.1:443 -r 10.111.32.239:6443 -m -w 1\n"
            ),
            Kind::IpvsadmSave
        );
        assert_eq!(
            kind("create KUBE-X hash:ip family inet\nadd KUBE-X 10.0.0.1\n"),
            Kind::IpsetSave
        );
        assert_eq!(kind("cpu=0   \tfound=0 invalid=3 insert=0 insert_failed=0 drop=0 early_drop=0 error=0 search_restart=0\n"), Kind::ConntrackStats);
        assert_eq!(
            kind(
                "10.0.0.1 dev eth0 lladdr 0e:7a:8c:2d:b4:ee REACHABLE\n10.0.0.9 dev eth0 FAILED\n"
            ),
            Kind::IpNeigh
        );
        assert_eq!(
            kind("nameserver 10.96.0.10\nsearch default.svc.cluster.local\noptions ndots:5\n"),
            Kind::ResolvConf
        );
        assert_eq!(
            kind("[{\"ifindex\":1,\"ifname\":\"lo\",\"addr_info\":[]}]\n"),
            Kind::IpAddr
        );
        assert_eq!(
            kind("[{\"priority\":0,\"src\":\"all\",\"table\":\"local\"}]\n"),
            Kind::IpRule
        );
        assert_eq!(
            kind("[{\"dst\":\"default\",\"gateway\":\"10.0.0.1\",\"dev\":\"eth0\"}]\n"),
            Kind::IpRoute
        );
        assert_eq!(
            kind("[912228.409488] IPv4: martian source 1.2.3.4 from 5.6.7.8, on dev ens3\n"),
            Kind::KernelLog
        );
        assert_eq!(
            kind("Hello, my pods cannot talk.\nPlease help.\n"),
            Kind::Unknown
        );
    }

    #[test]
    fn commands_and_names_pick_between_forms_the_lines_share() {
        let answer = "10.1.0.7 via 10.1.0.1 dev eth0 src 10.1.0.1\n";
        assert_eq!(classify(answer, None, "x").kind, Kind::IpRoute);
        let c = classify(answer, Some("ip route get 10.1.0.7"), "x");
        assert_eq!(c.kind, Kind::IpRouteGet);
        assert_eq!(c.hint.as_deref(), Some("`ip route get 10.1.0.7`"));
        // A command never overrules what the lines are.
        assert_eq!(classify(answer, Some("ip rule"), "x").kind, Kind::IpRoute);
        let rule = "0:\tfrom all lookup local\n";
        assert!(!classify(rule, Some("ip rule"), "x").v6);
        assert!(classify(rule, Some("ip -6 rule"), "x").v6);
        assert!(classify(rule, None, "ip-6-rule.txt").v6);
        assert!(classify("default via fe80::1 dev eth0 proto ra\n", None, "x").v6);
        let link_only = "3: kube-ipvs0: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN\n    link/ether da:08:05:49:16:56 brd ff:ff:ff:ff:ff:ff\n";
        assert_eq!(kind(link_only), Kind::IpLink);
        assert_eq!(
            classify(link_only, Some("ip addr show dev kube-ipvs0"), "x").kind,
            Kind::IpAddr
        );
        assert_eq!(
            command_kind("kubectl -n shop exec web-0 -- ip -br a"),
            Some(Kind::IpBrAddr)
        );
        assert!(!looks_json("[912228.409488] IPv4: martian"));
        assert!(looks_json("[") && looks_json("[{\"a\":1}]") && looks_json("{\"nftables\": ["));
    }
}
