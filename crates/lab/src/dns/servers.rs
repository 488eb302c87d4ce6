//! The lab's `weir dns`: its arguments, starting it, and replacing it.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

use super::state::{dns_dir, load, DnsState, READY_TIMEOUT, ZONE};
use super::tools::dig;
use crate::process::spawn_in;
use crate::state::{LabDir, LabState};

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

pub(super) fn start_server(
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
pub(super) fn is_lab_server(pid: u32, dir: &LabDir) -> bool {
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
        crate::process::stop(dns.server_pid, false);
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
