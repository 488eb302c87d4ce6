//! The DNS tools run inside a namespace: dig, getent, dnsperf, and an nft counter of the
//! queries arriving at the server.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

use super::parse::{parse_counter, parse_dig, parse_dnsperf, parse_getent, DigAnswer, Perf};
use super::state::DnsState;
use crate::state::LabState;

/// Counts the UDP queries arriving at the server (an nft counter in its node, table
/// `weir-lab-dnscount`) while `f` runs.
pub fn count_queries<T>(
    state: &LabState,
    dns: &DnsState,
    f: impl FnOnce() -> T,
) -> anyhow::Result<(u64, T)> {
    let node = state
        .nodes
        .iter()
        .find(|n| n.name == dns.node)
        .ok_or_else(|| anyhow::anyhow!("no node {}", dns.node))?;
    let nft = |script: &str| -> anyhow::Result<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &node.netns, "nft"])
            .args(script.split_whitespace())
            .output()
            .context("run nft")?;
        if !out.status.success() {
            bail!(
                "nft {script}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let _ = nft("delete table inet weir-lab-dnscount");
    nft("add table inet weir-lab-dnscount")?;
    nft("add chain inet weir-lab-dnscount in { type filter hook input priority -400 ; }")?;
    nft(&format!(
        "add rule inet weir-lab-dnscount in ip daddr {} udp dport 53 counter",
        dns.server_ip
    ))?;
    let value = f();
    let listed = nft("list table inet weir-lab-dnscount");
    let _ = nft("delete table inet weir-lab-dnscount");
    Ok((parse_counter(&listed?)?, value))
}

/// dnsperf from `netns` at `server` with `queries` (a dnsperf data file): `secs` unthrottled
/// (QPS, average), then `secs` at `rate` QPS with every latency (percentiles).
pub fn dnsperf(
    netns: &str,
    server: Ipv4Addr,
    queries: &Path,
    secs: u32,
    rate: u32,
) -> anyhow::Result<Perf> {
    let run = |extra: &[&str]| -> anyhow::Result<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", netns, "dnsperf", "-s"])
            .arg(server.to_string())
            .arg("-d")
            .arg(queries)
            .args(["-l", &secs.to_string(), "-c", "4"])
            .args(extra)
            .output()
            .context("run dnsperf (Debian package dnsperf)")?;
        if !out.status.success() {
            bail!("dnsperf: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let mut perf = parse_dnsperf(&run(&["-q", "200"])?);
    let mut lat: Vec<f64> = run(&["-Q", &rate.to_string(), "-v"])?
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return f64::NAN;
        }
        lat[((lat.len() as f64 * p) as usize).clamp(1, lat.len()) - 1] * 1000.0
    };
    perf.p50_ms = pct(0.5);
    perf.p99_ms = pct(0.99);
    Ok(perf)
}

/// `dig @server name type` inside `netns` (2 s timeout, one try).
pub fn dig(netns: &str, server: Ipv4Addr, name: &str, qtype: &str) -> DigAnswer {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            netns,
            "dig",
            "+noall",
            "+comments",
            "+answer",
        ])
        .args(["+time=2", "+tries=1"])
        .arg(format!("@{server}"))
        .args([name, qtype])
        .output();
    match out {
        Ok(o) => parse_dig(&String::from_utf8_lossy(&o.stdout)),
        Err(e) => DigAnswer {
            status: format!("cannot run dig: {e}"),
            answers: vec![],
        },
    }
}

/// `getent ahosts name` in `netns` (through `ip netns exec`, so `/etc/netns/<netns>/` applies);
/// with `resolv`, that file is bind-mounted over /etc/resolv.conf in the command's own mount
/// namespace first.
pub fn getent(netns: &str, name: &str, resolv: Option<&Path>) -> Result<Vec<String>, String> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]);
    match resolv {
        None => {
            cmd.args(["getent", "ahosts", name]);
        }
        Some(conf) => {
            cmd.args([
                "sh",
                "-c",
                "mount --bind \"$1\" /etc/resolv.conf && exec getent ahosts \"$2\"",
                "sh",
            ])
            .arg(conf)
            .arg(name);
        }
    }
    let out = cmd.output().map_err(|e| format!("run getent: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "getent ahosts {name}: exit {} {}",
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(parse_getent(&String::from_utf8_lossy(&out.stdout)))
}
