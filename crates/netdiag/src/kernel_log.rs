//! Kernel log lines (`dmesg`, `journalctl -k`) that say the kernel dropped a packet, as pasted:
//! `IPv4: martian source 172.30.182.212 from 172.21.51.75, on dev ens3` (printed with
//! `log_martians` for a packet whose source failed validation: the reverse-path check, or a
//! source no host can have). Other lines are not read (a kernel log is mostly other things) and
//! are not reported. [`conntrack_full`] picks the `nf_conntrack: table full, dropping packet`
//! lines (the conntrack table at `nf_conntrack_max`: new connections' packets dropped).

use std::net::IpAddr;

use serde::Serialize;

use crate::{paste, Parsed};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Martian {
    /// 1-based line in the paste.
    pub line: usize,
    pub text: String,
    /// The packet's destination and source, and the interface it arrived on.
    pub dst: IpAddr,
    pub src: IpAddr,
    pub dev: String,
}

pub fn parse(text: &str) -> Parsed<Vec<Martian>> {
    let mut out = Vec::new();
    for l in paste::lines(text).data() {
        let Some(rest) = l.text.split("martian source ").nth(1) else {
            continue;
        };
        // `D from S, on dev I`
        let mut w = rest.split_whitespace();
        let (Some(dst), Some("from"), Some(src), Some("on"), Some("dev"), Some(dev)) =
            (w.next(), w.next(), w.next(), w.next(), w.next(), w.next())
        else {
            continue;
        };
        let (Ok(dst), Ok(src)) = (dst.parse(), src.trim_end_matches(',').parse()) else {
            continue;
        };
        out.push(Martian {
            line: l.no,
            text: l.text.trim().to_string(),
            dst,
            src,
            dev: dev.to_string(),
        });
    }
    Parsed {
        value: out,
        skipped: Vec::new(),
    }
}

/// The `nf_conntrack: table full, dropping packet` lines, trimmed, in order.
pub fn conntrack_full(text: &str) -> Vec<String> {
    paste::lines(text)
        .data()
        .filter(|l| l.text.contains("nf_conntrack: table full"))
        .map(|l| l.text.trim().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn martian_source_lines_and_nothing_else() {
        let p = parse("[912228.409488] IPv4: martian source 172.30.182.212 from 172.21.51.75, on dev ens3\n[912228.409534] ll header: 00000000: 0e d8 07 a0\n DBGIN= OUT=enp3s0 SRC=192.168.235.13 DST=10.43.206.251\n");
        assert_eq!(p.value.len(), 1);
        let m = &p.value[0];
        assert_eq!(m.dst.to_string(), "172.30.182.212");
        assert_eq!(m.src.to_string(), "172.21.51.75");
        assert_eq!(m.dev, "ens3");
    }

    #[test]
    fn conntrack_table_full_lines() {
        let text = "[Tue Nov 20 22:30:22 2018] nf_conntrack: table full, dropping packet\n[912228.409488] IPv4: martian source 172.30.182.212 from 172.21.51.75, on dev ens3\nFeb 23 16:44:36 jobs kernel: [38775494.393661] nf_conntrack: nf_conntrack: table full, dropping packet\n";
        let full = conntrack_full(text);
        assert_eq!(full.len(), 2);
        assert!(full[0].starts_with("[Tue Nov 20"));
        assert!(parse(text).value.len() == 1);
    }
}
