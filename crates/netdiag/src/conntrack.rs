//! `conntrack -L` entries (also `/proc/net/nf_conntrack` lines, which start with `ipv4 2`):
//! each connection's original and reply tuples, from which its NAT bindings follow (a reply
//! source other than the original destination is a DNAT; a reply destination other than the
//! original source, a SNAT or masquerade).
//!
//! ```text
//! tcp      6 431999 ESTABLISHED src=10.0.0.5 dst=10.96.0.10 sport=40000 dport=80 src=10.244.1.5 dst=10.0.0.5 sport=80 dport=40000 [ASSURED] mark=0 use=1
//! udp      17 29 src=10.12.0.14 dst=10.15.240.10 sport=43145 dport=53 [UNREPLIED] src=10.15.240.10 dst=10.12.0.14 sport=53 dport=43145 mark=0 use=1
//! ```

use std::net::IpAddr;

use serde::Serialize;

use crate::{paste, Parsed, Skipped};

/// One direction of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: Option<u16>,
    pub dport: Option<u16>,
}

impl Tuple {
    fn dst_text(&self) -> String {
        match self.dport {
            Some(p) => format!("{}:{p}", self.dst),
            None => self.dst.to_string(),
        }
    }
}

/// One conntrack entry.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// 1-based line in the paste.
    pub line: usize,
    pub text: String,
    /// `tcp`, `udp`, `icmp`, …
    pub proto: String,
    /// TCP's state (`ESTABLISHED`, `SYN_RECV`, …); `None` for other protocols.
    pub state: Option<String>,
    pub orig: Tuple,
    pub reply: Tuple,
    /// `[UNREPLIED]`: nothing has come back in the reply direction.
    pub unreplied: bool,
    pub assured: bool,
    pub mark: Option<u32>,
}

impl Entry {
    /// Where the connection was DNATed to (the reply's source), when it was.
    pub fn dnat(&self) -> Option<(IpAddr, Option<u16>)> {
        (self.reply.src != self.orig.dst || self.reply.sport != self.orig.dport)
            .then_some((self.reply.src, self.reply.sport))
    }

    /// The source the connection was SNATed or masqueraded to (the reply's destination).
    pub fn snat(&self) -> Option<IpAddr> {
        (self.reply.dst != self.orig.src).then_some(self.reply.dst)
    }

    /// `udp 10.12.0.14:43145 → 10.15.240.10:53`.
    pub fn summary(&self) -> String {
        let src = match self.orig.sport {
            Some(p) => format!("{}:{p}", self.orig.src),
            None => self.orig.src.to_string(),
        };
        format!("{} {src} → {}", self.proto, self.orig.dst_text())
    }
}

/// Reads `conntrack -L` output; lines it cannot read are skipped and reported (the
/// `conntrack v1.4.6 (conntrack-tools): N flow entries have been shown.` summary is not data).
pub fn parse(text: &str) -> Parsed<Vec<Entry>> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for l in paste::lines(text).data() {
        let line = l.text.trim();
        if line.is_empty() || line.starts_with("conntrack v") {
            continue;
        }
        match parse_line(line) {
            Ok(mut e) => {
                e.line = l.no;
                out.push(e);
            }
            Err(why) => skipped.push(Skipped::new(l.no, l.text, l.reason(why))),
        }
    }
    Parsed {
        value: out,
        skipped,
    }
}

/// A tuple as read so far: src, dst, sport, dport.
type PartTuple = (Option<IpAddr>, Option<IpAddr>, Option<u16>, Option<u16>);

fn parse_line(line: &str) -> Result<Entry, String> {
    let mut words: Vec<&str> = line.split_whitespace().collect();
    // /proc/net/nf_conntrack: `ipv4     2 tcp      6 …`
    if words.first().is_some_and(|w| *w == "ipv4" || *w == "ipv6") {
        words.drain(..2.min(words.len()));
    }
    let proto = words.first().ok_or("empty line")?.to_string();
    if !proto
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    {
        return Err(format!("not a conntrack entry (starts with {proto:?})"));
    }
    let mut state = None;
    let mut tuples: Vec<PartTuple> = Vec::new();
    let (mut unreplied, mut assured, mut mark) = (false, false, None);
    for w in words.iter().skip(3) {
        if let Some((k, v)) = w.split_once('=') {
            let num = |v: &str| v.parse::<u16>().map_err(|_| format!("{k}={v}: not a port"));
            match k {
                "src" => tuples.push((
                    Some(v.parse().map_err(|_| format!("src={v}: not an address"))?),
                    None,
                    None,
                    None,
                )),
                "dst" | "sport" | "dport" => {
                    let t = tuples.last_mut().ok_or(format!("{k}= before src="))?;
                    match k {
                        "dst" => {
                            t.1 = Some(v.parse().map_err(|_| format!("dst={v}: not an address"))?)
                        }
                        "sport" => t.2 = Some(num(v)?),
                        _ => t.3 = Some(num(v)?),
                    }
                }
                "mark" => mark = v.parse().ok(),
                _ => {}
            }
        } else if *w == "[UNREPLIED]" {
            unreplied = true;
        } else if *w == "[ASSURED]" {
            assured = true;
        } else if tuples.is_empty() && w.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            state = Some(w.to_string());
        }
    }
    let tuple = |t: Option<&PartTuple>| {
        let t = t?;
        Some(Tuple {
            src: t.0?,
            dst: t.1?,
            sport: t.2,
            dport: t.3,
        })
    };
    let (Some(orig), Some(reply)) = (tuple(tuples.first()), tuple(tuples.get(1))) else {
        return Err("not a conntrack entry: no original and reply src=/dst= tuples".into());
    };
    Ok(Entry {
        line: 0,
        text: line.to_string(),
        proto,
        state,
        orig,
        reply,
        unreplied,
        assured,
        mark,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dnat_and_snat_from_the_tuples() {
        let p = parse("tcp      6 117 SYN_SENT src=10.0.0.5 dst=10.96.0.10 sport=40000 dport=80 [UNREPLIED] src=10.244.1.5 dst=10.244.0.0 sport=80 dport=40000 mark=0 use=1\n");
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        let e = &p.value[0];
        assert_eq!(e.state.as_deref(), Some("SYN_SENT"));
        assert!(e.unreplied);
        assert_eq!(e.dnat(), Some(("10.244.1.5".parse().unwrap(), Some(80))));
        assert_eq!(e.snat(), Some("10.244.0.0".parse().unwrap()));
        assert_eq!(e.summary(), "tcp 10.0.0.5:40000 → 10.96.0.10:80");
    }
}
