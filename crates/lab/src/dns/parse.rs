//! Parsers of what the DNS tools print: nft counters, dnsperf, dig and getent. Pure.

use serde::Serialize;

/// The packets of the first `counter packets N bytes M` in `nft list` output.
pub fn parse_counter(listing: &str) -> anyhow::Result<u64> {
    listing
        .split("counter packets ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no counter in {listing:?}"))
}

/// What dnsperf measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Perf {
    pub qps: f64,
    pub avg_ms: f64,
    pub lost: u64,
    /// At a fixed rate (`-Q`), from every query's latency (`-v`).
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Parses dnsperf's summary (`Queries per second:`, `Average Latency (s):`, `Queries lost:`).
pub fn parse_dnsperf(text: &str) -> Perf {
    let field = |key: &str, idx: usize| -> f64 {
        text.lines()
            .find(|l| l.trim_start().starts_with(key))
            .and_then(|l| {
                l[l.find(':')? + 1..]
                    .split_whitespace()
                    .nth(idx)
                    .map(str::to_string)
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    Perf {
        qps: field("Queries per second", 0),
        avg_ms: field("Average Latency (s)", 0) * 1000.0,
        lost: field("Queries lost", 0) as u64,
        ..Perf::default()
    }
}

/// What `dig` printed: the status and the answer section's data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DigAnswer {
    pub status: String,
    /// `(type, data)` of each answer record.
    pub answers: Vec<(String, String)>,
}

/// Parses `dig +noall +comments +answer` output.
pub fn parse_dig(text: &str) -> DigAnswer {
    let mut a = DigAnswer::default();
    for line in text.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            a.status = rest
                .split(',')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
        } else if !line.starts_with(';') && !line.trim().is_empty() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 5 {
                a.answers.push((f[3].to_string(), f[4..].join(" ")));
            }
        }
    }
    a
}

/// Addresses in `getent ahosts` output (one per line, repeated per socket type).
pub fn parse_getent(text: &str) -> Vec<String> {
    let mut addrs: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    addrs.sort();
    addrs.dedup();
    addrs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nft_counters() {
        let listing = "table inet weir-lab-dnscount {\n\tchain in {\n\t\ttype filter hook input \
                       priority -400; policy accept;\n\t\tip daddr 172.30.0.11 udp dport 53 \
                       counter packets 8 bytes 640\n\t}\n}\n";
        assert_eq!(parse_counter(listing).unwrap(), 8);
        assert!(parse_counter("table inet x {}").is_err());
    }

    #[test]
    fn parses_dnsperf() {
        let p = parse_dnsperf(
            "Statistics:\n\n  Queries sent:         1000\n  Queries completed:    998 (99.80%)\n\
             \x20 Queries lost:         2 (0.20%)\n\n  Queries per second:   12345.678900\n\n\
             \x20 Average Latency (s):  0.000250 (min 0.000100, max 0.002000)\n",
        );
        assert_eq!(p.lost, 2);
        assert!((p.qps - 12345.6789).abs() < 1e-6);
        assert!((p.avg_ms - 0.25).abs() < 1e-9);
    }

    #[test]
    fn parses_dig_and_getent() {
        let a = parse_dig(
            ";; Got answer:\n;; ->>HEADER<<- opcode: QUERY, status: NOERROR, id: 1\n\
             ;; flags: qr aa rd; QUERY: 1, ANSWER: 2\n\n\
             ext.default.svc.cluster.local. 5 IN CNAME www.example.test.\n\
             www.example.test. 300 IN A 198.51.100.1\n",
        );
        assert_eq!(a.status, "NOERROR");
        assert_eq!(
            a.answers,
            [
                ("CNAME".to_string(), "www.example.test.".to_string()),
                ("A".to_string(), "198.51.100.1".to_string())
            ]
        );
        assert_eq!(
            parse_getent("10.96.0.1  STREAM web.default.svc.cluster.local\n10.96.0.1  DGRAM\n"),
            ["10.96.0.1"]
        );
    }
}
