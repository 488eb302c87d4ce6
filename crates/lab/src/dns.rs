//! Cluster DNS in the lab (topology `dns: true`): `weir dns` on the first node behind the DNS
//! Service ClusterIP (serviceCIDR host 10, kubeadm's convention: 10.96.0.10), routed by the
//! nodes' proxies like any Service; NSD in the outside world serving an external zone that
//! `weir dns` forwards to; every pod namespace gets the resolv.conf the kubelet writes for
//! dnsPolicy ClusterFirst, as `/etc/netns/<netns>/resolv.conf` (which `ip netns exec` mounts over
//! `/etc/resolv.conf`). [`plan`] and [`run`] are the name checks `weir lab check` adds.
//!
//! Files: `<lab>/dns/` (NSD's config and zone, weir dns's upstream file, `dns.json`), the
//! per-namespace `/etc/netns/<netns>/resolv.conf` (removed by [`remove_netns_etc`]).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use weir_kernel::NetNs;

use crate::echo::ECHO_PORT;
use crate::manifests::{NAMESPACE, PORT_NAME};
use crate::state::{LabDir, LabState};
use crate::topology::Dns;

/// The cluster domain.
pub const ZONE: &str = "cluster.local";
/// The external zone NSD serves in the outside world.
pub const EXTERNAL_ZONE: &str = "example.test";
/// The external name the checks resolve through the forwarder; its address is the outside's.
pub const EXTERNAL_NAME: &str = "www.example.test";
/// The headless service over `web`'s backends (hostnames = pod names, as a StatefulSet's).
pub const HEADLESS: &str = "web-headless";
/// The ExternalName service, pointing at [`EXTERNAL_NAME`].
pub const EXTERNAL_SERVICE: &str = "ext";
/// The service whose ClusterIP, SRV record and backends the checks look up.
pub const TARGET_SERVICE: &str = "web";
const DNS_NAMESPACE: &str = "kube-system";
const DNS_SERVICE: &str = "kube-dns";
/// How long `weir dns` and NSD may take to answer after starting.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The DNS Service's ClusterIP: host 10 of serviceCIDR.
pub fn cluster_ip(service_cidr: ipnet::Ipv4Net) -> Ipv4Addr {
    (u32::from(service_cidr.network()) + 10).into()
}

/// What `weir lab check` needs to know about a lab's DNS (`<lab>/dns/dns.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsState {
    pub cluster_ip: Ipv4Addr,
    /// The node `weir dns` runs on (host network) and the address it listens on.
    pub node: String,
    pub server_ip: Ipv4Addr,
    pub server_pid: u32,
    pub nsd_pid: u32,
    /// `dns: node-local`: every node runs a cache on [`NODE_LOCAL_IP`], which the pods'
    /// resolv.conf names instead of the ClusterIP.
    #[serde(default)]
    pub node_local: bool,
}

impl DnsState {
    /// The address pods' resolv.conf names (kubelet `--cluster-dns`).
    pub fn nameserver(&self) -> Ipv4Addr {
        if self.node_local {
            NODE_LOCAL_IP
        } else {
            self.cluster_ip
        }
    }
}

fn dns_dir(dir: &LabDir) -> PathBuf {
    dir.dir.join("dns")
}

/// The lab's DNS state, if the lab runs DNS.
pub fn load(dir: &LabDir) -> Option<DnsState> {
    let text = std::fs::read_to_string(dns_dir(dir).join("dns.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// The resolv.conf the kubelet writes for dnsPolicy ClusterFirst in namespace `ns` (and for
/// ClusterFirstWithHostNet in a hostNetwork pod).
pub fn resolv_conf(nameserver: Ipv4Addr, ns: &str) -> String {
    format!(
        "# written by weir lab (kubelet, dnsPolicy ClusterFirst)\nnameserver {nameserver}\n\
         search {ns}.svc.{ZONE} svc.{ZONE} {ZONE}\noptions ndots:5\n"
    )
}

/// The DNS Service and its EndpointSlice (the server on `server_ip`, a host-network endpoint),
/// a headless service over `web`'s backends and an ExternalName service. Pure.
pub fn objects(cluster_ip: Ipv4Addr, server_ip: Ipv4Addr, state: &LabState) -> Vec<Value> {
    let ports = json!([
        { "name": "dns", "port": 53, "protocol": "UDP" },
        { "name": "dns-tcp", "port": 53, "protocol": "TCP" },
    ]);
    let mut docs = vec![
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": DNS_SERVICE, "namespace": DNS_NAMESPACE },
            "spec": {
                "type": "ClusterIP",
                "clusterIP": cluster_ip.to_string(), "clusterIPs": [cluster_ip.to_string()],
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "selector": { "k8s-app": DNS_SERVICE },
                "ports": ports.as_array().unwrap().iter().map(|p| {
                    let mut p = p.clone();
                    p["targetPort"] = json!(53);
                    p
                }).collect::<Vec<_>>(),
            },
        }),
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{DNS_SERVICE}-lab"), "namespace": DNS_NAMESPACE,
                "labels": { "kubernetes.io/service-name": DNS_SERVICE },
            },
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": [{
                "addresses": [server_ip.to_string()],
                "conditions": { "ready": true, "serving": true, "terminating": false },
            }],
        }),
    ];
    if let Some(web) = state.services.iter().find(|s| s.name == TARGET_SERVICE) {
        let endpoints: Vec<Value> = web
            .backends
            .iter()
            .filter_map(|b| state.pods.iter().find(|p| &p.name == b))
            .map(|p| {
                json!({
                    "addresses": [p.ip.to_string()], "hostname": p.name,
                    "conditions": { "ready": true }, "nodeName": p.node,
                })
            })
            .collect();
        docs.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": { "name": HEADLESS, "namespace": NAMESPACE },
            "spec": {
                "clusterIP": "None", "selector": { "app": TARGET_SERVICE },
                "ports": [{ "name": PORT_NAME, "port": ECHO_PORT, "protocol": "TCP" }],
            },
        }));
        docs.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{HEADLESS}-lab"), "namespace": NAMESPACE,
                "labels": { "kubernetes.io/service-name": HEADLESS },
            },
            "addressType": "IPv4",
            "ports": [{ "name": PORT_NAME, "port": ECHO_PORT, "protocol": "TCP" }],
            "endpoints": endpoints,
        }));
    }
    docs.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": EXTERNAL_SERVICE, "namespace": NAMESPACE },
        "spec": { "type": "ExternalName", "externalName": EXTERNAL_NAME },
    }));
    docs
}

/// NSD's zone file for [`EXTERNAL_ZONE`]: `www` is the outside's address (where its echo
/// server answers).
pub fn external_zone(outside: Ipv4Addr) -> String {
    format!(
        "$ORIGIN {EXTERNAL_ZONE}.\n$TTL 300\n\
         @ IN SOA ns.{EXTERNAL_ZONE}. admin.{EXTERNAL_ZONE}. 1 3600 600 86400 60\n\
         @ IN NS ns\nns IN A {outside}\nwww IN A {outside}\n"
    )
}

fn nsd_conf(dir: &Path, listen: Ipv4Addr) -> String {
    let d = dir.display();
    format!(
        "server:\n  ip-address: {listen}\n  port: 53\n  username: \"\"\n  chroot: \"\"\n  \
         zonesdir: \"{d}\"\n  pidfile: \"{d}/nsd.pid\"\n  database: \"\"\n  \
         zonelistfile: \"{d}/zone.list\"\n  xfrdfile: \"{d}/xfrd.state\"\n  xfrdir: \"{d}\"\n  \
         logfile: \"{d}/nsd.log\"\n  server-count: 1\nremote-control:\n  control-enable: no\n\
         zone:\n  name: {EXTERNAL_ZONE}\n  zonefile: \"{d}/{EXTERNAL_ZONE}.zone\"\n"
    )
}

/// `/etc/netns/<netns>`: where `ip netns exec <netns>` finds files to mount over `/etc`.
pub fn netns_etc(netns: &str) -> PathBuf {
    Path::new("/etc/netns").join(netns)
}

/// Removes the resolv.conf the lab wrote for each of `namespaces` (and the directory when it
/// is left empty). Best effort: returns what could not be removed.
pub fn remove_netns_etc(namespaces: &[String]) -> Vec<String> {
    let mut failed = Vec::new();
    for n in namespaces {
        let dir = netns_etc(n);
        let file = dir.join("resolv.conf");
        if file.exists() {
            if let Err(e) = std::fs::remove_file(&file) {
                failed.push(format!("{}: {e}", file.display()));
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
    failed
}

fn spawn_in(netns: &str, program: &Path, args: &[String], log: &Path) -> anyhow::Result<u32> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open {}", log.display()))?;
    let err = out.try_clone()?;
    let ns = NetNs::named(netns).with_context(|| format!("open netns {netns}"))?;
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    crate::ns::detach(&mut cmd);
    ns.spawn_inside(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawn {} in {netns}", program.display()))?;
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(pid)
}

/// Starts NSD (outside) and `weir dns` (first node), writes the DNS objects and the pods'
/// resolv.conf files, and waits until a pod gets an answer through the ClusterIP. With
/// `Dns::NodeLocal`, then starts the node-local caches ([`node_local_up`]) and the pods'
/// resolv.conf names [`NODE_LOCAL_IP`].
pub fn up(
    weir: &Path,
    dir: &LabDir,
    state: &LabState,
    service_cidr: ipnet::Ipv4Net,
    mode: Dns,
) -> anyhow::Result<DnsState> {
    let d = dns_dir(dir);
    std::fs::create_dir_all(&d)?;
    let out_ns = crate::topology::names::outside(&state.lab);
    let node = state
        .nodes
        .first()
        .ok_or_else(|| anyhow::anyhow!("dns needs a node"))?;

    // The upstream: NSD on the outside's address.
    std::fs::write(
        d.join(format!("{EXTERNAL_ZONE}.zone")),
        external_zone(state.outside),
    )?;
    std::fs::write(d.join("nsd.conf"), nsd_conf(&d, state.outside))?;
    let nsd_pid = spawn_in(
        &out_ns,
        Path::new("nsd"),
        &[
            "-d".into(),
            "-c".into(),
            d.join("nsd.conf").display().to_string(),
        ],
        &d.join("nsd.out"),
    )
    .context("start nsd (Debian package nsd)")?;

    // The objects, then the server.
    let cip = cluster_ip(service_cidr);
    let docs: Vec<String> = objects(cip, node.underlay_ip, state)
        .iter()
        .map(|v| serde_yaml::to_string(v).expect("JSON values serialize as YAML"))
        .collect();
    crate::manifests::write(
        &dir.manifests(),
        &[(
            "dns.yaml".into(),
            format!("# written by weir lab\n{}", docs.join("---\n")),
        )],
    )?;
    std::fs::write(
        d.join("upstream.conf"),
        format!("nameserver {}\n", state.outside),
    )?;
    let server_pid = start_server(weir, dir, &node.netns, node.underlay_ip, false)?;
    let mut dns = DnsState {
        cluster_ip: cip,
        node: node.name.clone(),
        server_ip: node.underlay_ip,
        server_pid,
        nsd_pid,
        node_local: false,
    };
    std::fs::write(d.join("dns.json"), serde_json::to_vec_pretty(&dns)?)?;

    // Ready: NSD answers in the outside, and a pod's query through the ClusterIP is answered.
    let started = Instant::now();
    let probe_ns = state.pods.first().map(|p| p.netns.clone());
    loop {
        let nsd_ok = dig(&out_ns, state.outside, EXTERNAL_NAME, "A").status == "NOERROR";
        let dns_ok = match &probe_ns {
            Some(ns) => dig(ns, cip, &format!("dns-version.{ZONE}"), "TXT").status == "NOERROR",
            None => true,
        };
        if nsd_ok && dns_ok {
            if mode == Dns::NodeLocal {
                node_local_up(weir, dir, state)?;
                dns.node_local = true;
                std::fs::write(d.join("dns.json"), serde_json::to_vec_pretty(&dns)?)?;
            }
            for pod in &state.pods {
                let etc = netns_etc(&pod.netns);
                std::fs::create_dir_all(&etc)?;
                std::fs::write(
                    etc.join("resolv.conf"),
                    resolv_conf(dns.nameserver(), NAMESPACE),
                )?;
            }
            return Ok(dns);
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!(
                "cluster DNS not ready after {} s (nsd answers: {nsd_ok}, weir dns via {cip}: \
                 {dns_ok}); logs: {}, {}",
                READY_TIMEOUT.as_secs(),
                dir.dir.join("logs/dns.log").display(),
                d.join("nsd.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `weir dns`'s arguments in the lab.
pub fn server_args(dir: &LabDir, listen: Ipv4Addr, autopath: bool) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "dns".into(),
        "--manifests".into(),
        dir.manifests().display().to_string(),
        "--listen".into(),
        format!("{listen}:53"),
        "--zone".into(),
        ZONE.into(),
        "--upstream-resolv-conf".into(),
        dns_dir(dir).join("upstream.conf").display().to_string(),
        "--manifest-poll-interval".into(),
        "100ms".into(),
        "--pods".into(),
        "insecure".into(),
    ];
    if autopath {
        args.push("--autopath".into());
    }
    args
}

fn start_server(
    weir: &Path,
    dir: &LabDir,
    netns: &str,
    listen: Ipv4Addr,
    autopath: bool,
) -> anyhow::Result<u32> {
    spawn_in(
        netns,
        weir,
        &server_args(dir, listen, autopath),
        &dir.dir.join("logs").join("dns.log"),
    )
}

/// True when `pid` is this lab's `weir dns` (a recorded pid reused by another process is
/// never killed).
fn is_lab_server(pid: u32, dir: &LabDir) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    cmdline.contains("\0dns\0") && cmdline.contains(&*dir.manifests().to_string_lossy())
}

/// Replaces the lab's `weir dns` with one started with or without `--autopath`, and waits
/// until it answers in the node.
pub fn restart_server(
    weir: &Path,
    dir: &LabDir,
    state: &LabState,
    autopath: bool,
) -> anyhow::Result<DnsState> {
    let mut dns = load(dir).ok_or_else(|| anyhow::anyhow!("lab {} runs no DNS", state.lab))?;
    let node = state
        .nodes
        .iter()
        .find(|n| n.name == dns.node)
        .ok_or_else(|| anyhow::anyhow!("no node {}", dns.node))?;
    if crate::ns::alive(dns.server_pid) && is_lab_server(dns.server_pid, dir) {
        crate::proxy::stop(dns.server_pid, false);
    }
    dns.server_pid = start_server(weir, dir, &node.netns, node.underlay_ip, autopath)?;
    std::fs::write(
        dns_dir(dir).join("dns.json"),
        serde_json::to_vec_pretty(&dns)?,
    )?;
    let started = Instant::now();
    while dig(
        &node.netns,
        dns.server_ip,
        &format!("dns-version.{ZONE}"),
        "TXT",
    )
    .status
        != "NOERROR"
    {
        if started.elapsed() > READY_TIMEOUT {
            bail!("weir dns on node {} not answering after restart", dns.node);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(dns)
}

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

/// The packets of the first `counter packets N bytes M` in `nft list` output.
pub fn parse_counter(listing: &str) -> anyhow::Result<u64> {
    listing
        .split("counter packets ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no counter in {listing:?}"))
}

/// The node-local cache's address on every node (NodeLocal DNSCache's default).
pub const NODE_LOCAL_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 20, 10);

/// The nft table exempting the node-local cache's traffic from conntrack: in the raw-priority
/// hooks, before conntrack sees a packet, so a lookup makes no conntrack entry (and cannot
/// race on inserting one). Its own table: the proxies' tables are not touched.
pub fn notrack_table(ip: Ipv4Addr) -> String {
    // Both hooks match both directions: a pod's query arrives in prerouting and the answer
    // leaves through output; a host-network client's query and answer pass output and then
    // (over lo) prerouting.
    let rules = format!(
        "ip daddr {ip} udp dport 53 notrack; ip daddr {ip} tcp dport 53 notrack; \
         ip saddr {ip} udp sport 53 notrack; ip saddr {ip} tcp sport 53 notrack;"
    );
    format!(
        "table ip weir-nodelocal-dns {{\n\
         \tchain pre {{ type filter hook prerouting priority raw; {rules} }}\n\
         \tchain out {{ type filter hook output priority raw; {rules} }}\n}}\n"
    )
}

/// Whether the node-local cache in `netns` answers (asked only once its address exists: a
/// query to an address the node does not have would wait for dig's timeout).
fn node_local_answers(netns: &str) -> bool {
    let addrs = Command::new("ip")
        .args(["-n", netns, "-o", "addr", "show", "dev", "lo"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    addrs.contains(&format!(" {NODE_LOCAL_IP}/"))
        && dig(netns, NODE_LOCAL_IP, &format!("dns-version.{ZONE}"), "TXT").status == "NOERROR"
}

/// Node-local mode: on every node, [`NODE_LOCAL_IP`] on `lo`, the NOTRACK table, and a
/// `weir dns` listening there that serves the cluster zone from the same objects and sends
/// its cache misses to the cluster DNS over TCP. A node whose cache already answers is left
/// as it is. Returns the pids of the servers started.
pub fn node_local_up(weir: &Path, dir: &LabDir, state: &LabState) -> anyhow::Result<Vec<u32>> {
    let dns = load(dir).ok_or_else(|| anyhow::anyhow!("lab {} runs no DNS", state.lab))?;
    let upstream = dns_dir(dir).join("node-local-upstream.conf");
    std::fs::write(&upstream, format!("nameserver {}\n", dns.cluster_ip))?;
    let mut pids = Vec::new();
    for node in &state.nodes {
        if node_local_answers(&node.netns) {
            continue;
        }
        let sh = |args: &[&str], stdin: Option<&str>| -> anyhow::Result<()> {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &node.netns]).args(args);
            let out = match stdin {
                None => cmd.output(),
                Some(text) => {
                    use std::io::Write;
                    let mut child = cmd
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .spawn()?;
                    child
                        .stdin
                        .take()
                        .expect("piped")
                        .write_all(text.as_bytes())?;
                    child.wait_with_output()
                }
            }
            .with_context(|| format!("run {args:?}"))?;
            if !out.status.success() {
                bail!(
                    "node {}: {}: {}",
                    node.name,
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            Ok(())
        };
        // The table first: the address's DNS traffic is never tracked (as `weir dns --node-local`).
        sh(&["nft", "-f", "-"], Some(&notrack_table(NODE_LOCAL_IP)))?;
        sh(
            &[
                "ip",
                "addr",
                "replace",
                &format!("{NODE_LOCAL_IP}/32"),
                "dev",
                "lo",
            ],
            None,
        )?;
        let mut args = server_args(dir, NODE_LOCAL_IP, false);
        let i = args
            .iter()
            .position(|a| a == "--upstream-resolv-conf")
            .expect("set")
            + 1;
        args[i] = upstream.display().to_string();
        args.push("--upstream-tcp".into());
        let log = dir
            .dir
            .join("logs")
            .join(format!("dns-node-local-{}.log", node.name));
        pids.push(spawn_in(&node.netns, weir, &args, &log)?);
    }
    for node in &state.nodes {
        let started = Instant::now();
        while !node_local_answers(&node.netns) {
            if started.elapsed() > READY_TIMEOUT {
                bail!("node-local weir dns on node {} not answering", node.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(pids)
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

/// How a check asks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// `dig @<cluster ip> <name> <type>`.
    Dig { qtype: String },
    /// `getent ahosts <name>`: glibc's getaddrinfo with the namespace's resolv.conf.
    Libc,
    /// `getent ahosts` in a host-network namespace whose resolv.conf is the one given
    /// (ClusterFirstWithHostNet) — bind-mounted for this command only.
    LibcHostNet,
}

/// One name check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NameCheck {
    /// `a/a1` or `a` (host network).
    pub from: String,
    pub netns: String,
    pub what: String,
    pub name: String,
    pub via: Via,
    /// Every one of these must be in the answer (record data or addresses).
    pub expect: Vec<String>,
}

/// The checks: from the first pod of every node, each name form by dig and through libc;
/// from the first node (host network) with the ClusterFirstWithHostNet resolv.conf. Pure.
pub fn plan(state: &LabState, dns: &DnsState) -> Vec<NameCheck> {
    let mut checks = Vec::new();
    let Some(web) = state.services.iter().find(|s| s.name == TARGET_SERVICE) else {
        return checks;
    };
    let ip = web.cluster_ip.to_string();
    let fqdn = format!("{TARGET_SERVICE}.{NAMESPACE}.svc.{ZONE}");
    let backends: Vec<String> = web
        .backends
        .iter()
        .filter_map(|b| state.pods.iter().find(|p| &p.name == b))
        .map(|p| p.ip.to_string())
        .collect();
    let outside = state.outside.to_string();
    let mut seen_nodes = Vec::new();
    for pod in &state.pods {
        if seen_nodes.contains(&pod.node) {
            continue;
        }
        seen_nodes.push(pod.node.clone());
        let from = format!("{}/{}", pod.node, pod.name);
        let mut add = |what: &str, name: &str, via: Via, expect: Vec<String>| {
            checks.push(NameCheck {
                from: from.clone(),
                netns: pod.netns.clone(),
                what: what.into(),
                name: name.into(),
                via,
                expect,
            })
        };
        let a = || Via::Dig { qtype: "A".into() };
        add("service FQDN", &fqdn, a(), vec![ip.clone()]);
        add("service FQDN", &fqdn, Via::Libc, vec![ip.clone()]);
        add("svc", TARGET_SERVICE, Via::Libc, vec![ip.clone()]);
        add(
            "svc.ns",
            &format!("{TARGET_SERVICE}.{NAMESPACE}"),
            Via::Libc,
            vec![ip.clone()],
        );
        let headless = format!("{HEADLESS}.{NAMESPACE}.svc.{ZONE}");
        add("headless", &headless, a(), backends.clone());
        add("headless", HEADLESS, Via::Libc, backends.clone());
        add(
            "named port SRV",
            &format!("_{PORT_NAME}._tcp.{fqdn}"),
            Via::Dig {
                qtype: "SRV".into(),
            },
            vec![format!("0 100 {} {fqdn}.", web.port)],
        );
        let ext = format!("{EXTERNAL_SERVICE}.{NAMESPACE}.svc.{ZONE}");
        add(
            "ExternalName",
            &ext,
            a(),
            vec![format!("{EXTERNAL_NAME}."), outside.clone()],
        );
        add(
            "ExternalName",
            EXTERNAL_SERVICE,
            Via::Libc,
            vec![outside.clone()],
        );
        add(
            "external (forwarded)",
            EXTERNAL_NAME,
            a(),
            vec![outside.clone()],
        );
        add(
            "external (forwarded)",
            EXTERNAL_NAME,
            Via::Libc,
            vec![outside.clone()],
        );
        // Pod records (`--pods insecure`): the pod's own dashed address.
        let pod_name = format!(
            "{}.{NAMESPACE}.pod.{ZONE}",
            pod.ip.to_string().replace('.', "-")
        );
        add("pod name", &pod_name, a(), vec![pod.ip.to_string()]);
    }
    if let Some(node) = state.nodes.iter().find(|n| n.name == dns.node) {
        checks.push(NameCheck {
            from: format!("{} (hostNetwork, ClusterFirstWithHostNet)", node.name),
            netns: node.netns.clone(),
            what: "service FQDN".into(),
            name: fqdn,
            via: Via::LibcHostNet,
            expect: vec![ip],
        });
    }
    checks
}

/// The outcome of one check.
#[derive(Debug, Clone, Serialize)]
pub struct NameResult {
    pub check: NameCheck,
    pub ok: bool,
    /// What came back (record data or addresses), or the error.
    pub got: Vec<String>,
    pub ms: u128,
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

/// Runs one check.
pub fn run_one(c: &NameCheck, dns: &DnsState, lab_dir: &LabDir) -> NameResult {
    let t = Instant::now();
    let got = match &c.via {
        Via::Dig { qtype } => {
            let a = dig(&c.netns, dns.nameserver(), &c.name, qtype);
            if a.status == "NOERROR" {
                Ok(a.answers.into_iter().map(|(_, d)| d).collect())
            } else {
                Err(format!("status {:?}", a.status))
            }
        }
        Via::Libc => getent(&c.netns, &c.name, None),
        Via::LibcHostNet => {
            let conf = dns_dir(lab_dir).join("resolv-hostnet.conf");
            match std::fs::write(&conf, resolv_conf(dns.nameserver(), NAMESPACE)) {
                Ok(()) => getent(&c.netns, &c.name, Some(&conf)),
                Err(e) => Err(format!("write {}: {e}", conf.display())),
            }
        }
    };
    let (ok, got) = match got {
        Ok(got) => (c.expect.iter().all(|e| got.contains(e)), got),
        Err(e) => (false, vec![e]),
    };
    NameResult {
        check: c.clone(),
        ok,
        got,
        ms: t.elapsed().as_millis(),
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

pub fn run(checks: &[NameCheck], dns: &DnsState, lab_dir: &LabDir) -> Vec<NameResult> {
    checks.iter().map(|c| run_one(c, dns, lab_dir)).collect()
}

/// The results as a table.
pub fn render(results: &[NameResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                r.check.from.clone(),
                r.check.what.clone(),
                match &r.check.via {
                    Via::Dig { qtype } => format!("dig {qtype}"),
                    Via::Libc | Via::LibcHostNet => "getaddrinfo".into(),
                },
                r.check.name.clone(),
                r.got.join(" "),
                if r.ok { "ok".into() } else { "FAIL".into() },
            ]
        })
        .collect();
    crate::matrix::render_table(&["FROM", "CHECK", "VIA", "NAME", "GOT", "RESULT"], &rows)
}

pub fn summary(results: &[NameResult], dns: &DnsState) -> String {
    let ok = results.iter().filter(|r| r.ok).count();
    let via = if dns.node_local {
        format!(", pods asking the node-local cache on {NODE_LOCAL_IP}")
    } else {
        String::new()
    };
    format!(
        "dns: {ok}/{} name checks ok (weir dns on node {} behind {}{via}, forwarding to NSD)",
        results.len(),
        dns.node,
        dns.cluster_ip
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    #[test]
    fn resolv_conf_is_the_kubelets() {
        assert_eq!(
            resolv_conf(Ipv4Addr::new(10, 96, 0, 10), "default")
                .lines()
                .skip(1)
                .collect::<Vec<_>>(),
            [
                "nameserver 10.96.0.10",
                "search default.svc.cluster.local svc.cluster.local cluster.local",
                "options ndots:5"
            ]
        );
    }

    #[test]
    fn allocation_skips_the_dns_ip() {
        let mut t = Topology::default_demo();
        for i in 0..8 {
            let mut s = t.services[0].clone();
            s.name = format!("x{i}");
            t.services.push(s);
        }
        let dns_ip = Ipv4Addr::new(10, 96, 0, 10);
        let ips = |t: &Topology| -> Vec<Ipv4Addr> {
            t.allocate().unwrap().iter().map(|a| a.cluster_ip).collect()
        };
        assert!(t.dns.on());
        assert!(!ips(&t).contains(&dns_ip), "{:?}", ips(&t));
        assert_eq!(ips(&t).len(), 13);
        t.dns = Dns::Off;
        assert!(ips(&t).contains(&dns_ip));
    }

    #[test]
    fn dns_key_takes_true_false_cluster_ip_and_node_local() {
        let with = |v: &str| {
            Topology::parse(
                &crate::topology::DEFAULT_TOPOLOGY
                    .lines()
                    .map(|l| {
                        if l.starts_with("dns:") {
                            format!("dns: {v}")
                        } else {
                            l.into()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        };
        assert_eq!(with("true").unwrap().dns, Dns::ClusterIp);
        assert_eq!(with("cluster-ip").unwrap().dns, Dns::ClusterIp);
        assert_eq!(with("node-local").unwrap().dns, Dns::NodeLocal);
        assert_eq!(with("false").unwrap().dns, Dns::Off);
        let e = with("nodelocal").unwrap_err().to_string();
        assert!(e.contains("node-local"), "{e}");
        // The default demo keeps the ClusterIP.
        assert_eq!(Topology::default_demo().dns, Dns::ClusterIp);
    }

    #[test]
    fn parses_nft_counters() {
        let listing = "table inet weir-lab-dnscount {\n\tchain in {\n\t\ttype filter hook input \
                       priority -400; policy accept;\n\t\tip daddr 172.30.0.11 udp dport 53 \
                       counter packets 8 bytes 640\n\t}\n}\n";
        assert_eq!(parse_counter(listing).unwrap(), 8);
        assert!(parse_counter("table inet x {}").is_err());
    }

    #[test]
    fn notrack_table_exempts_both_directions() {
        let t = notrack_table(NODE_LOCAL_IP);
        for hook in ["prerouting", "output"] {
            let chain = t
                .lines()
                .find(|l| l.contains(&format!("hook {hook} priority raw;")))
                .unwrap();
            for rule in [
                "ip daddr 169.254.20.10 udp dport 53 notrack;",
                "ip daddr 169.254.20.10 tcp dport 53 notrack;",
                "ip saddr 169.254.20.10 udp sport 53 notrack;",
                "ip saddr 169.254.20.10 tcp sport 53 notrack;",
            ] {
                assert!(chain.contains(rule), "{hook}: {rule}: {t}");
            }
        }
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

    #[test]
    fn plans_every_name_form_from_each_node() {
        let topo = Topology::default_demo();
        let state = crate::services::tests::demo_state(&topo);
        let dns = DnsState {
            cluster_ip: cluster_ip(topo.service_cidr),
            node: "a".into(),
            server_ip: Ipv4Addr::new(172, 30, 0, 11),
            server_pid: 1,
            nsd_pid: 2,
            node_local: false,
        };
        assert_eq!(dns.cluster_ip, Ipv4Addr::new(10, 96, 0, 10));
        let checks = plan(&state, &dns);
        // 12 per node with pods, and the host-network one.
        assert_eq!(checks.len(), 2 * 12 + 1);
        let pod = checks.iter().find(|c| c.what == "pod name").unwrap();
        assert_eq!(pod.name, "10-244-1-2.default.pod.cluster.local");
        let froms: std::collections::BTreeSet<&str> =
            checks.iter().map(|c| c.from.as_str()).collect();
        assert!(
            froms.contains("a/a1") && froms.contains("b/b1"),
            "{froms:?}"
        );
        let srv = checks.iter().find(|c| c.what == "named port SRV").unwrap();
        assert_eq!(srv.name, "_echo._tcp.web.default.svc.cluster.local");
        assert_eq!(srv.expect, ["0 100 80 web.default.svc.cluster.local."]);
        let headless = checks.iter().find(|c| c.what == "headless").unwrap();
        assert_eq!(headless.expect, ["10.244.1.2", "10.244.2.2"]);
        let objs = objects(dns.cluster_ip, dns.server_ip, &state);
        assert_eq!(objs[0]["spec"]["clusterIP"], "10.96.0.10");
        assert_eq!(objs[1]["endpoints"][0]["addresses"][0], "172.30.0.11");
        assert_eq!(objs[3]["endpoints"][1]["hostname"], "b1");
        assert_eq!(objs[4]["spec"]["externalName"], "www.example.test");
    }
}
