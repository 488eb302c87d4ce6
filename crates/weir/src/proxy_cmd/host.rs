//! What kube-proxy sets on the host at start, when given: the process's `oom_score_adj` and
//! conntrack's size and timeouts (`pkg/proxy/conntrack/sysctls.go`'s rules). Unlike
//! kube-proxy, weir applies none of its defaults: an unset value leaves the kernel's.

use anyhow::Context;
use tracing::{info, warn};

use super::config::{ConntrackSettings, Settings};

const CONNTRACK_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";
/// kube-proxy's cap on a scaled nf_conntrack_max.
const MAX_LIMIT: u64 = 1 << 20;

/// The writes (path, value) kube-proxy's conntrack settings `c` need on a node with `cpus`
/// CPUs whose nf_conntrack_max and hash size are `current_max` and `current_hashsize`
/// (`None`: unknown). The size only grows; a zero timeout leaves one; `tcpBeLiberal: false`
/// leaves the sysctl. Per core and min stand in for each other with kube-proxy's defaults.
pub fn conntrack_writes(
    c: &ConntrackSettings,
    cpus: u64,
    current_max: Option<u64>,
    current_hashsize: Option<u64>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if c.max_per_core.is_some() || c.min.is_some() {
        let per_core = u64::from(c.max_per_core.unwrap_or(32 * 1024));
        let floor = u64::from(c.min.unwrap_or(128 * 1024));
        if per_core > 0 {
            let scaled = per_core * cpus;
            let max = if scaled > MAX_LIMIT {
                MAX_LIMIT
            } else {
                scaled.max(floor)
            };
            if max > 0 {
                if current_max.is_none_or(|m| m < max) {
                    out.push((CONNTRACK_MAX, max.to_string()));
                }
                if current_hashsize.is_none_or(|h| h < max / 4) {
                    out.push((HASHSIZE, (max / 4).to_string()));
                }
            }
        }
    }
    let timeouts = [
        (
            "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
            c.tcp_established_timeout,
        ),
        (
            "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
            c.tcp_close_wait_timeout,
        ),
        (
            "/proc/sys/net/netfilter/nf_conntrack_udp_timeout",
            c.udp_timeout,
        ),
        (
            "/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream",
            c.udp_stream_timeout,
        ),
    ];
    for (path, t) in timeouts {
        if let Some(t) = t.filter(|t| t.as_secs() > 0) {
            out.push((path, t.as_secs().to_string()));
        }
    }
    if c.tcp_be_liberal == Some(true) {
        out.push((
            "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal",
            "1".into(),
        ));
    }
    out
}

/// The CPUs this process may run on (Go's `runtime.NumCPU`, which kube-proxy falls back to).
fn cpus() -> u64 {
    // SAFETY: sched_getaffinity fills the zeroed set it is given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            (libc::CPU_COUNT(&set) as u64).max(1)
        } else {
            1
        }
    }
}

fn read_number(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Applies `settings`' oom_score_adj (a failure is logged, as kube-proxy does) and conntrack
/// settings (a failure stops the start, as it stops kube-proxy's).
pub fn apply(settings: &Settings) -> anyhow::Result<()> {
    if let Some(adj) = settings.oom_score_adj {
        match std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
            Ok(()) => info!(oom_score_adj = adj, "oom_score_adj set"),
            Err(e) => warn!("oom_score_adj {adj} not applied: {e}"),
        }
    }
    let writes = conntrack_writes(
        &settings.conntrack,
        cpus(),
        read_number(CONNTRACK_MAX),
        read_number(HASHSIZE),
    );
    for (path, value) in writes {
        std::fs::write(path, &value)
            .with_context(|| format!("conntrack setting {path} = {value}"))?;
        info!(path, value, "conntrack setting applied");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn host_settings_follow_kube_proxy() {
        let none = ConntrackSettings::default();
        assert!(conntrack_writes(&none, 8, Some(1), Some(1)).is_empty());
        // Per core × CPUs above the floor, raised only, hash size a quarter.
        let c = ConntrackSettings {
            max_per_core: Some(32768),
            min: Some(131072),
            ..Default::default()
        };
        assert_eq!(
            conntrack_writes(&c, 8, Some(65536), Some(16384)),
            [(CONNTRACK_MAX, "262144".into()), (HASHSIZE, "65536".into())]
        );
        assert!(conntrack_writes(&c, 8, Some(262144), Some(65536)).is_empty());
        // The floor on a small node; the cap on a big one.
        assert_eq!(conntrack_writes(&c, 2, Some(0), Some(0))[0].1, "131072");
        assert_eq!(conntrack_writes(&c, 64, Some(0), Some(0))[0].1, "1048576");
        // Only min given: kube-proxy's 32768 per core stands in.
        let only_min = ConntrackSettings {
            min: Some(500_000),
            ..Default::default()
        };
        assert_eq!(conntrack_writes(&only_min, 4, None, None)[0].1, "500000");
        // 0 per core leaves the size.
        let zero = ConntrackSettings {
            max_per_core: Some(0),
            ..Default::default()
        };
        assert!(conntrack_writes(&zero, 4, None, None).is_empty());
        // Timeouts in seconds, zero ones left; liberal only when true.
        let t = ConntrackSettings {
            tcp_established_timeout: Some(Duration::from_secs(86400)),
            tcp_close_wait_timeout: Some(Duration::ZERO),
            udp_stream_timeout: Some(Duration::from_secs(120)),
            tcp_be_liberal: Some(true),
            ..Default::default()
        };
        let w = conntrack_writes(&t, 4, None, None);
        assert_eq!(
            w,
            [
                (
                    "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
                    "86400".into()
                ),
                (
                    "/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream",
                    "120".into()
                ),
                (
                    "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal",
                    "1".into()
                ),
            ]
        );
        let lax = ConntrackSettings {
            tcp_be_liberal: Some(false),
            ..Default::default()
        };
        assert!(conntrack_writes(&lax, 4, None, None).is_empty());
        assert!(cpus() >= 1);
    }
}
