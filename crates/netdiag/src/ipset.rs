//! `ipset list` and `ipset save`: the sets iptables rules name with `-m set --match-set`, and
//! whether a packet is in one (for the dimensions the rule's flags pick, `dst,dst` …).

use std::net::IpAddr;

use serde::Serialize;

use crate::{Parsed, Skipped};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpSet {
    pub name: String,
    /// `hash:ip,port`, `bitmap:port`, …
    pub kind: String,
    /// Members as written, without comments.
    pub members: Vec<String>,
    /// The member list may be incomplete: the output was cut with grep and the list ends
    /// where a cut does, or it has fewer members than its `Number of entries:`.
    pub cut: bool,
    /// `Number of entries:` of `ipset list`.
    #[serde(skip)]
    entries: Option<usize>,
}

/// The packet fields a set lookup reads.
#[derive(Debug, Clone, Copy)]
pub struct Fields {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: &'static str,
    pub sport: u16,
    pub dport: u16,
}

impl IpSet {
    /// Whether the packet is in the set, reading each dimension of the set's type from the
    /// source or destination as `flags` (`dst,dst`, `dst,dst,src`) say. `None` for a type this
    /// module does not know.
    pub fn contains(&self, flags: &str, f: &Fields) -> Option<bool> {
        let dims: Vec<&str> = self
            .kind
            .split(':')
            .nth(1)
            .unwrap_or("")
            .split(',')
            .collect();
        let flags: Vec<&str> = flags.split(',').collect();
        // iptables uses the last flag for dimensions past the flags given.
        let flag = |i: usize| *flags.get(i).or(flags.last()).unwrap_or(&"dst");
        let want: Vec<Dim> = dims
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let src = flag(i) == "src";
                match *d {
                    "ip" | "net" => Some(Dim::Ip(if src { f.src } else { f.dst })),
                    "port" => Some(Dim::Port(f.proto, if src { f.sport } else { f.dport })),
                    _ => None,
                }
            })
            .collect::<Option<_>>()?;
        let found = self.members.iter().any(|m| member_matches(m, &want));
        // Not found in a list grep cut: unknown, not absent.
        (found || !self.cut).then_some(found)
    }
}

enum Dim {
    Ip(IpAddr),
    Port(&'static str, u16),
}

fn member_matches(member: &str, want: &[Dim]) -> bool {
    let parts: Vec<&str> = member.split(',').collect();
    parts.len() == want.len()
        && parts.iter().zip(want).all(|(p, d)| match d {
            Dim::Ip(ip) => ip_matches(p, *ip),
            Dim::Port(proto, port) => port_matches(p, proto, *port),
        })
}

fn ip_matches(p: &str, ip: IpAddr) -> bool {
    if let Ok(net) = p.parse::<ipnet::IpNet>() {
        return net.contains(&ip);
    }
    if let Some((a, b)) = p.split_once('-') {
        return match (a.parse::<IpAddr>(), b.parse::<IpAddr>()) {
            (Ok(a), Ok(b)) => a <= ip && ip <= b,
            _ => false,
        };
    }
    p.parse::<IpAddr>().is_ok_and(|x| x == ip)
}

/// `tcp:80`, `80` (tcp, ipset's default), `udp:30000-30100`.
fn port_matches(p: &str, proto: &str, port: u16) -> bool {
    let (pr, ports) = p.split_once(':').unwrap_or(("tcp", p));
    // bitmap:port members carry no protocol: the rule's `-p` decides.
    let proto_ok = !p.contains(':') || pr == proto;
    let in_range = match ports.split_once('-') {
        Some((a, b)) => {
            a.parse::<u16>().is_ok_and(|a| a <= port) && b.parse::<u16>().is_ok_and(|b| port <= b)
        }
        None => ports.parse::<u16>().is_ok_and(|x| x == port),
    };
    proto_ok && in_range
}

/// Parses `ipset list` or `ipset save` output, as pasted (a `grep` cut ends the member list
/// it falls in, and marks that set [`IpSet::cut`]).
pub fn parse(text: &str) -> Parsed<Vec<IpSet>> {
    let mut sets: Vec<IpSet> = Vec::new();
    let mut skipped = Vec::new();
    let mut in_members = false;
    let pasted = crate::paste::lines(text);
    let new = |name: &str, kind: &str| IpSet {
        name: name.into(),
        kind: kind.into(),
        members: Vec::new(),
        cut: false,
        entries: None,
    };
    for l in &pasted.lines {
        let (i, raw, line) = (l.no - 1, l.text, l.text.trim());
        if l.grep_break {
            if in_members {
                if let Some(s) = sets.last_mut() {
                    s.cut = true;
                }
            }
            in_members = false;
            continue;
        }
        if line.is_empty() {
            in_members = false;
            continue;
        }
        if let Some(name) = line.strip_prefix("Name: ") {
            in_members = false;
            sets.push(new(name.trim(), ""));
            continue;
        }
        if let Some(n) = line.strip_prefix("Number of entries: ") {
            if let (Some(s), Ok(n)) = (sets.last_mut(), n.trim().parse::<usize>()) {
                s.entries = Some(n);
            }
            continue;
        }
        if let Some(kind) = line.strip_prefix("Type: ") {
            if let Some(s) = sets.last_mut() {
                s.kind = kind.trim().into();
            }
            continue;
        }
        if line == "Members:" {
            in_members = true;
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["create", name, kind, ..] => {
                in_members = false;
                sets.push(new(name, kind));
            }
            ["add", name, member, ..] => match sets.iter_mut().find(|s| s.name == *name) {
                Some(s) => s.members.push(member.to_string()),
                None => skipped.push(Skipped::new(i + 1, raw, "a member of a set not created")),
            },
            [member, ..] if in_members => match sets.last_mut() {
                Some(s) => s.members.push(member.to_string()),
                None => skipped.push(Skipped::new(i + 1, raw, "a member before any set")),
            },
            _ if line.contains(": ") => {} // Revision:, Header:, References: …
            _ if pasted.grep_cut => skipped.push(Skipped::new(
                i + 1,
                raw,
                "a member whose set's header grep cut away",
            )),
            _ => skipped.push(Skipped::new(
                i + 1,
                raw,
                l.reason("not an ipset list or save line"),
            )),
        }
    }
    if pasted.grep_cut && in_members {
        if let Some(s) = sets.last_mut() {
            s.cut = true;
        }
    }
    for s in &mut sets {
        if s.entries.is_some_and(|n| s.members.len() < n) {
            s.cut = true;
        }
    }
    Parsed {
        value: sets,
        skipped,
    }
}
