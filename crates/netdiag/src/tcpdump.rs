//! `tcpdump -n` lines: which packets were seen, on which interface, from where to where. Read
//! as evidence of which way a packet went (trace cites them, `trace::capture`), never as rules.
//!
//! Forms: `HH:MM:SS.us IP A.port > B.port: Flags [S], …` (IPv4, `IP6` for IPv6), `-i any`'s
//! interface and direction before `IP` (`eth0  In  IP …`, tcpdump 4.99), `-e`'s link layer
//! (`… ethertype IPv4 (0x0800), length 74: A.port > B.port: …`), `-v`'s header line with the
//! addresses on the next line, ICMP echo requests and replies (`ICMP echo request`, `ICMP6,
//! echo reply`), UDP (any port pair without TCP's `Flags`). The interface a capture was taken
//! on comes from its `listening on eth0, link-type …` line or its command's `-i`.

use std::net::IpAddr;

use serde::Serialize;

use crate::{paste, Parsed, Skipped};

/// What a line shows of its packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SeenKind {
    /// TCP, with its flags as tcpdump prints them (`S`, `S.`, `R.`, `.`, `P.`).
    Tcp(String),
    Udp,
    EchoRequest,
    EchoReply,
    /// Any other ICMP message (`ICMP 10.0.0.1 tcp port 80 unreachable`).
    Icmp(String),
}

/// One packet line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Seen {
    /// 1-based line in the input.
    pub line: usize,
    /// The interface it was seen on: the line's own (`-i any`), else the capture's.
    pub iface: Option<String>,
    /// `In`, `Out` (`-i any`), when printed.
    pub direction: Option<String>,
    pub src: IpAddr,
    pub sport: Option<u16>,
    pub dst: IpAddr,
    pub dport: Option<u16>,
    pub kind: SeenKind,
    /// The line as pasted (its `-v` header joined).
    pub text: String,
}

/// One capture: its interface (`None` for `any` or when not shown) and its packets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Capture {
    pub iface: Option<String>,
    pub packets: Vec<Seen>,
}

/// Reads tcpdump's output; its own status lines (`listening on`, `packets captured`) are not
/// packets and not skipped.
pub fn parse(text: &str) -> Parsed<Capture> {
    let pasted = paste::lines(text);
    let mut cap = Capture {
        iface: pasted.commands.iter().find_map(|c| interface_flag(c)),
        packets: Vec::new(),
    };
    let mut skipped = Vec::new();
    let lines: Vec<&paste::Line> = pasted.data().collect();
    let mut k = 0;
    while k < lines.len() {
        let l = lines[k];
        k += 1;
        let t = l.text.trim();
        if let Some(rest) = t
            .strip_prefix("listening on ")
            .or_else(|| t.strip_prefix("tcpdump: listening on "))
        {
            let iface = rest.split([',', ' ']).next().unwrap_or_default();
            cap.iface = (iface != "any").then(|| iface.to_string());
            continue;
        }
        if is_status(t) {
            continue;
        }
        // `-v`: `IP (tos …, proto TCP (6), length 60)` then the addresses on the next line.
        let mut whole = t.to_string();
        if t.ends_with(')') && t.contains(" (tos ") && k < lines.len() {
            whole = format!("{t} {}", lines[k].text.trim());
            k += 1;
        }
        match packet(&whole) {
            Some((iface, direction, rest)) => match addresses(rest) {
                Some((src, sport, dst, dport, kind)) => cap.packets.push(Seen {
                    line: l.no,
                    iface: iface.or_else(|| cap.iface.clone()),
                    direction,
                    src,
                    sport,
                    dst,
                    dport,
                    kind,
                    text: whole.clone(),
                }),
                None => skipped.push(Skipped::new(l.no, l.text, l.reason("no A > B: addresses"))),
            },
            None => skipped.push(Skipped::new(
                l.no,
                l.text,
                l.reason("not a tcpdump IP packet line"),
            )),
        }
    }
    Parsed {
        value: cap,
        skipped,
    }
}

/// `tcpdump -i eth0 …` → `eth0` (`any` is no one interface).
fn interface_flag(cmd: &str) -> Option<String> {
    let w: Vec<&str> = cmd.split_whitespace().collect();
    if !w.iter().any(|x| x.ends_with("tcpdump")) {
        return None;
    }
    let at = w.iter().position(|x| *x == "-i" || *x == "--interface")?;
    w.get(at + 1)
        .filter(|i| **i != "any")
        .map(|i| i.to_string())
}

/// tcpdump's own lines around the packets.
fn is_status(t: &str) -> bool {
    t.starts_with("tcpdump: ")
        || t.ends_with(" packets captured")
        || t.ends_with(" packets received by filter")
        || t.ends_with(" packets dropped by kernel")
        || t.ends_with(" packet captured")
        || t.contains("ARP, ")
}

/// A packet line's interface and direction (`-i any`) and what follows `IP `/`IP6 ` (or the
/// link layer of `-e`).
fn packet(t: &str) -> Option<(Option<String>, Option<String>, &str)> {
    let mut words = t.splitn(2, char::is_whitespace);
    let first = words.next()?;
    // A timestamp (`07:13:16.378445`, `1700000000.123456`), when printed.
    let rest = if first.contains(':') && first.contains('.') || first.parse::<f64>().is_ok() {
        words.next()?.trim_start()
    } else {
        t
    };
    // `-e`: `02:42:… > 02:42:…, ethertype IPv4 (0x0800), length 74: A > B: …`
    if let Some(at) = rest.find("ethertype IPv") {
        let after = &rest[at..];
        return Some((None, None, after.split_once(": ")?.1));
    }
    let w: Vec<&str> = rest.split_whitespace().take(3).collect();
    if let Some(b) = body(rest) {
        return Some((None, None, strip_v_header(b)));
    }
    // `eth0  In  IP …` (tcpdump 4.99 `-i any`).
    let dirs = ["In", "Out", "B", "M", "P"];
    let (iface, dir) = match w.as_slice() {
        [i, d, ..] if dirs.contains(d) => (Some(i.to_string()), Some(d.to_string())),
        [d, ..] if dirs.contains(d) => (None, Some(d.to_string())),
        _ => return None,
    };
    let at = rest.find(" IP")?;
    let b = body(rest[at..].trim_start())?;
    Some((iface, dir, strip_v_header(b)))
}

/// What follows `IP ` or `IP6 `.
fn body(s: &str) -> Option<&str> {
    s.strip_prefix("IP6 ")
        .or_else(|| s.strip_prefix("IP "))
        .map(str::trim_start)
}

/// `(tos 0x0, ttl 64, …, length 84) 127.0.0.1 > …` → `127.0.0.1 > …`.
fn strip_v_header(b: &str) -> &str {
    if !b.starts_with("(tos ") {
        return b;
    }
    let mut depth = 0;
    for (i, c) in b.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return b[i + 1..].trim_start();
                }
            }
            _ => {}
        }
    }
    b
}

type Addrs = (IpAddr, Option<u16>, IpAddr, Option<u16>, SeenKind);

/// `A.port > B.port: what…` (or `A > B: ICMP …`).
fn addresses(rest: &str) -> Option<Addrs> {
    let (ends, what) = rest.split_once(": ")?;
    let (a, b) = ends.split_once(" > ")?;
    let (src, sport) = addr_port(a.trim())?;
    let (dst, dport) = addr_port(b.trim())?;
    let what = what.trim_start();
    let kind = if let Some(f) = what.strip_prefix("Flags [") {
        SeenKind::Tcp(f.split(']').next().unwrap_or_default().to_string())
    } else if what.starts_with("ICMP") {
        let msg = what
            .trim_start_matches("ICMP6,")
            .trim_start_matches("ICMP")
            .trim_start();
        if msg.starts_with("echo request") {
            SeenKind::EchoRequest
        } else if msg.starts_with("echo reply") {
            SeenKind::EchoReply
        } else {
            SeenKind::Icmp(msg.split(',').next().unwrap_or_default().to_string())
        }
    } else if sport.is_some() && dport.is_some() {
        SeenKind::Udp
    } else {
        return None;
    };
    Some((src, sport, dst, dport, kind))
}

/// `10.0.0.1.80`, `fd00::1.80`, `10.0.0.1`, `fd00::1`; a few port names of `-n` without `-nn`.
fn addr_port(s: &str) -> Option<(IpAddr, Option<u16>)> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some((ip, None));
    }
    let (a, p) = s.rsplit_once('.')?;
    let ip = a.parse::<IpAddr>().ok()?;
    let port = p.parse::<u16>().ok().or(match p {
        "http" => Some(80),
        "https" => Some(443),
        "domain" => Some(53),
        "ssh" => Some(22),
        _ => None,
    });
    Some((ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_interface_lines_v_headers_and_link_layers() {
        let p = parse(
            "07:13:02.224653 eth0  In  IP 10.50.0.2.40432 > 10.50.0.1.30080: Flags [S], seq 1, length 0\n\
             07:13:24.845051 IP (tos 0x0, ttl 64, id 5, offset 0, flags [DF], proto ICMP (1), length 84)\n    127.0.0.1 > 127.0.0.1: ICMP echo request, id 1, seq 1, length 64\n\
             10:00:00.000001 02:42:ac:11:00:02 > 02:42:ac:11:00:03, ethertype IPv4 (0x0800), length 74: 10.0.0.1.5 > 10.0.0.2.53: 1+ A? x. (20)\n\
             07:13:31.701397 IP6 fd00::1 > fd00::1: ICMP6, echo reply, id 1, seq 1, length 64\n",
        );
        assert!(p.skipped.is_empty(), "{:?}", p.skipped);
        let k: Vec<_> = p.value.packets.iter().map(|s| &s.kind).collect();
        assert_eq!(
            k,
            [
                &SeenKind::Tcp("S".into()),
                &SeenKind::EchoRequest,
                &SeenKind::Udp,
                &SeenKind::EchoReply
            ]
        );
        let s = &p.value.packets[0];
        assert_eq!(
            (s.iface.as_deref(), s.direction.as_deref(), s.sport, s.dport),
            (Some("eth0"), Some("In"), Some(40432), Some(30080))
        );
        assert_eq!(p.value.packets[1].line, 2);
    }
}
