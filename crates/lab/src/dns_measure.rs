//! `weir lab dns-measure <lab>`: the two DNS measurements issue 11 asks for, in a running lab
//! with `dns:` on. Reported, never asserted (the numbers depend on the machine and kernel).
//!
//! 1. Search-path amplification: the UDP queries reaching the cluster DNS for one
//!    getaddrinfo lookup (A and AAAA, as curl asks) from a pod with the kubelet's ClusterFirst
//!    resolv.conf (`ndots:5`), with `weir dns` started without and then with `--autopath`.
//! 2. The "5-second timeout": thousands of getaddrinfo lookups, many at once, each from its
//!    own socket sending A and AAAA in parallel (glibc's default), through the DNS Service's
//!    ClusterIP (DNAT) and through the node-local cache (NOTRACK): lookups over 1 s, the
//!    slowest, and the conntrack `insert_failed` / `clash_resolve` / `drop` counters of every
//!    node (`conntrack -S`), before and after.
//!
//! The lookups run in `weir lab dns-lookups` ([`lookups`]), started inside the pod's network
//! namespace with the resolv.conf to use bind-mounted over /etc/resolv.conf, so glibc's own
//! resolver (not a Rust one) makes the queries.

use std::net::{Ipv4Addr, ToSocketAddrs};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::dns::{self, DnsState, NODE_LOCAL_IP};
use crate::manifests::NAMESPACE;
use crate::state::{LabDir, LabState, PodState};

/// What one batch of lookups measured ([`lookups`]'s output, one JSON line).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LookupStats {
    pub lookups: usize,
    pub parallel: usize,
    pub failed: usize,
    pub over_1s: usize,
    pub max_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub seconds: f64,
}

/// Summarises per-lookup durations (ms). Pure.
pub fn summarise(mut ms: Vec<f64>, failed: usize, parallel: usize, seconds: f64) -> LookupStats {
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| -> f64 {
        if ms.is_empty() {
            return 0.0; // no lookups (JSON has no NaN)
        }
        ms[((ms.len() as f64 * p).ceil() as usize).clamp(1, ms.len()) - 1]
    };
    LookupStats {
        lookups: ms.len(),
        parallel,
        failed,
        over_1s: ms.iter().filter(|&&m| m > 1000.0).count(),
        max_ms: ms.last().copied().unwrap_or(0.0),
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        seconds,
    }
}

/// `count` getaddrinfo lookups of `name` from `parallel` threads (each lookup its own socket,
/// A and AAAA in parallel as glibc sends them), in this process's network namespace with its
/// /etc/resolv.conf. A lookup that fails counts as failed, with its time.
pub fn lookups(name: &str, count: usize, parallel: usize) -> LookupStats {
    let parallel = parallel.clamp(1, count.max(1));
    let started = Instant::now();
    let threads: Vec<_> = (0..parallel)
        .map(|i| {
            let name = format!("{name}:53");
            let mine = count / parallel + usize::from(i < count % parallel);
            std::thread::spawn(move || {
                let mut times = Vec::with_capacity(mine);
                let mut failed = 0;
                for _ in 0..mine {
                    let t = Instant::now();
                    let ok = name.to_socket_addrs().is_ok_and(|mut a| a.next().is_some());
                    failed += usize::from(!ok);
                    times.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                (times, failed)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(count);
    let mut failed = 0;
    for t in threads {
        let (times, f) = t.join().expect("lookup thread");
        all.extend(times);
        failed += f;
    }
    summarise(all, failed, parallel, started.elapsed().as_secs_f64())
}

/// The conntrack statistics this measurement reports, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ConntrackStats {
    pub insert_failed: u64,
    pub clash_resolve: u64,
    pub drop: u64,
}

/// Parses `conntrack -S` (one line per CPU, `key=value` fields). Pure.
pub fn parse_conntrack_stats(text: &str) -> ConntrackStats {
    let sum = |key: &str| -> u64 {
        text.split_whitespace()
            .filter_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .filter_map(|v| v.parse::<u64>().ok())
            .sum()
    };
    ConntrackStats {
        insert_failed: sum("insert_failed"),
        clash_resolve: sum("clash_resolve"),
        drop: sum("drop"),
    }
}

fn conntrack_stats(netns: &str) -> anyhow::Result<ConntrackStats> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "conntrack", "-S"])
        .output()
        .context("run conntrack -S (Debian package conntrack)")?;
    if !out.status.success() {
        bail!(
            "conntrack -S in {netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(parse_conntrack_stats(&String::from_utf8_lossy(&out.stdout)))
}

/// One row of the search-path table.
#[derive(Debug, Clone, Serialize)]
pub struct SearchRow {
    pub autopath: bool,
    pub what: String,
    pub name: String,
    pub queries: u64,
    pub answer: Vec<String>,
}

/// One row of the parallel-lookup table.
#[derive(Debug, Clone, Serialize)]
pub struct ParallelRow {
    pub path: String,
    pub server: Ipv4Addr,
    pub stats: LookupStats,
    /// Per node: the counters' increase during the run.
    pub conntrack: Vec<(String, ConntrackStats)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub from: String,
    pub search: Vec<SearchRow>,
    pub parallel: Vec<ParallelRow>,
}

/// A resolv.conf as the kubelet writes it, naming `server`, for one command.
fn conf_for(dir: &LabDir, server: Ipv4Addr) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.dir.join("dns").join(format!("measure-{server}.conf"));
    std::fs::write(&path, dns::resolv_conf(server, NAMESPACE))?;
    Ok(path)
}

/// The pod the lookups come from: one on a node other than the cluster DNS's (so the
/// ClusterIP path crosses the underlay, as most pods' lookups do), else the first.
fn client_pod<'a>(state: &'a LabState, dns: &DnsState) -> anyhow::Result<&'a PodState> {
    state
        .pods
        .iter()
        .find(|p| p.node != dns.node)
        .or_else(|| state.pods.first())
        .ok_or_else(|| anyhow::anyhow!("lab {} has no pods", state.lab))
}

/// Runs `weir lab dns-lookups` in `pod`'s namespace with `conf` as its resolv.conf.
fn run_lookups(
    weir: &Path,
    pod: &PodState,
    conf: &Path,
    name: &str,
    count: usize,
    parallel: usize,
) -> anyhow::Result<LookupStats> {
    let out = Command::new("ip")
        .args(["netns", "exec", &pod.netns, "sh", "-c"])
        .arg("mount --bind \"$1\" /etc/resolv.conf && shift && exec \"$@\"")
        .arg("sh")
        .arg(conf)
        .arg(weir)
        .args(["lab", "dns-lookups", name])
        .args(["--count", &count.to_string()])
        .args(["--parallel", &parallel.to_string()])
        .output()
        .context("run weir lab dns-lookups")?;
    if !out.status.success() {
        bail!(
            "dns-lookups in {}: {}",
            pod.netns,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("dns-lookups output")
}

/// Both measurements (see the module doc). Leaves the cluster DNS as the lab had it (without
/// `--autopath`), and starts the node-local caches if the lab does not run them.
pub fn measure(
    weir: &Path,
    dir: &LabDir,
    state: &LabState,
    count: usize,
    parallel: usize,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Report> {
    let dns =
        dns::load(dir).ok_or_else(|| anyhow::anyhow!("lab {} runs no DNS (dns:)", state.lab))?;
    let pod = client_pod(state, &dns)?;
    let via_cluster_ip = conf_for(dir, dns.cluster_ip)?;

    // 1. Queries per lookup, counted at the cluster DNS, asked through the ClusterIP.
    let names = [
        ("external name", dns::EXTERNAL_NAME.to_string()),
        (
            "external, no such name",
            format!("nx.{}", dns::EXTERNAL_ZONE),
        ),
        ("service, short name", dns::TARGET_SERVICE.to_string()),
    ];
    let mut search = Vec::new();
    for autopath in [false, true] {
        let running = dns::restart_server(weir, dir, state, autopath)?;
        for (what, name) in &names {
            let (queries, answer) = dns::count_queries(state, &running, || {
                dns::getent(&pod.netns, name, Some(&via_cluster_ip))
            })?;
            progress(&format!(
                "search path: autopath={autopath} {name}: {queries} queries"
            ));
            search.push(SearchRow {
                autopath,
                what: (*what).into(),
                name: name.clone(),
                queries,
                answer: answer.unwrap_or_else(|e| vec![e]),
            });
        }
    }
    dns::restart_server(weir, dir, state, false)?;

    // 2. Parallel lookups through the ClusterIP, then the node-local cache.
    if !dns.node_local {
        progress("starting the node-local caches (the lab's pods keep their resolv.conf)");
    }
    dns::node_local_up(weir, dir, state)?;
    let via_node_local = conf_for(dir, NODE_LOCAL_IP)?;
    let mut parallel_rows = Vec::new();
    for (path, server, conf) in [
        ("ClusterIP (DNAT)", dns.cluster_ip, &via_cluster_ip),
        ("node-local (NOTRACK)", NODE_LOCAL_IP, &via_node_local),
    ] {
        let before: Vec<ConntrackStats> = state
            .nodes
            .iter()
            .map(|n| conntrack_stats(&n.netns))
            .collect::<anyhow::Result<_>>()?;
        let stats = run_lookups(weir, pod, conf, dns::TARGET_SERVICE, count, parallel)?;
        let mut conntrack = Vec::new();
        for (node, b) in state.nodes.iter().zip(before) {
            let a = conntrack_stats(&node.netns)?;
            conntrack.push((
                node.name.clone(),
                ConntrackStats {
                    insert_failed: a.insert_failed.saturating_sub(b.insert_failed),
                    clash_resolve: a.clash_resolve.saturating_sub(b.clash_resolve),
                    drop: a.drop.saturating_sub(b.drop),
                },
            ));
        }
        progress(&format!(
            "{path}: {} lookups, {} over 1 s, slowest {:.1} ms",
            stats.lookups, stats.over_1s, stats.max_ms
        ));
        parallel_rows.push(ParallelRow {
            path: path.into(),
            server,
            stats,
            conntrack,
        });
    }
    Ok(Report {
        from: format!("{}/{}", pod.node, pod.name),
        search,
        parallel: parallel_rows,
    })
}

/// The report as two tables.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "Queries at the cluster DNS per getaddrinfo lookup (A+AAAA, ndots:5) from pod {}:\n",
        r.from
    );
    let rows: Vec<Vec<String>> = r
        .search
        .iter()
        .map(|s| {
            vec![
                s.what.clone(),
                s.name.clone(),
                if s.autopath { "on" } else { "off" }.into(),
                s.queries.to_string(),
                s.answer.join(" "),
            ]
        })
        .collect();
    out += &crate::table::render_table(&["LOOKUP", "NAME", "AUTOPATH", "QUERIES", "GOT"], &rows);
    out += &format!("\nParallel getaddrinfo lookups of the short service name from pod {}, each its own socket with A and AAAA in parallel:\n", r.from);
    let rows: Vec<Vec<String>> = r
        .parallel
        .iter()
        .map(|p| {
            let s = &p.stats;
            let ct = p
                .conntrack
                .iter()
                .map(|(n, c)| {
                    format!(
                        "{n}: insert_failed +{} clash_resolve +{} drop +{}",
                        c.insert_failed, c.clash_resolve, c.drop
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            vec![
                p.path.clone(),
                s.lookups.to_string(),
                s.parallel.to_string(),
                s.failed.to_string(),
                s.over_1s.to_string(),
                format!("{:.2}", s.p50_ms),
                format!("{:.2}", s.p99_ms),
                format!("{:.1}", s.max_ms),
                format!("{:.0}", s.lookups as f64 / s.seconds.max(1e-9)),
                ct,
            ]
        })
        .collect();
    out += &crate::table::render_table(
        &[
            "PATH",
            "LOOKUPS",
            "PARALLEL",
            "FAILED",
            ">1s",
            "P50 MS",
            "P99 MS",
            "MAX MS",
            "LOOKUPS/S",
            "CONNTRACK (increase per node)",
        ],
        &rows,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_conntrack_stats_summed_over_cpus() {
        let text = "cpu=0   \tfound=0 invalid=3 insert=0 insert_failed=2 drop=1 early_drop=0 \
                    error=0 search_restart=0 clash_resolve=5 chaintoolong=0\n\
                    cpu=1   \tfound=0 invalid=0 insert=0 insert_failed=1 drop=0 early_drop=0 \
                    error=0 search_restart=0 clash_resolve=7 chaintoolong=0\n";
        assert_eq!(
            parse_conntrack_stats(text),
            ConntrackStats {
                insert_failed: 3,
                clash_resolve: 12,
                drop: 1
            }
        );
        assert_eq!(parse_conntrack_stats(""), ConntrackStats::default());
    }

    #[test]
    fn summarises_lookup_times() {
        let mut ms: Vec<f64> = (1..=100).map(f64::from).collect();
        ms.push(5003.0);
        let s = summarise(ms, 1, 10, 2.0);
        assert_eq!(s.lookups, 101);
        assert_eq!(s.over_1s, 1);
        assert_eq!(s.max_ms, 5003.0);
        assert_eq!(s.p50_ms, 51.0);
        assert_eq!(s.p99_ms, 100.0);
        assert_eq!(s.failed, 1);
        assert_eq!(summarise(vec![], 0, 1, 0.0).p50_ms, 0.0);
    }
}
