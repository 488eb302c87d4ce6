//! Node-local mode: a `weir dns` cache on [`NODE_LOCAL_IP`] on every node, NOTRACKed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use weir_dns::node_local::notrack_table;

use super::servers::server_args;
use super::state::{dns_dir, load, NODE_LOCAL_IP, READY_TIMEOUT, ZONE};
use super::tools::dig;
use crate::process::spawn_in;
use crate::state::{LabDir, LabState};

/// Whether the node-local cache in `netns` answers (asked only once its address exists: a
/// query to an address the node does not have would wait for dig's timeout).
pub(super) fn node_local_answers(netns: &str) -> bool {
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
        // Beside the cluster DNS in that node's namespace: NodeLocal DNSCache's metrics port,
        // not CoreDNS's (the lab sets the address up itself, without --node-local).
        args.push("--metrics-bind-address=127.0.0.1:9253".into());
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
