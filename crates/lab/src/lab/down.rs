//! Taking a lab down, from its namespace names and state directory alone.

use std::path::Path;

use anyhow::{bail, Context};
use weir_kernel::NetNs;

use super::context::{Binaries, Progress};
use crate::cni::{self, Invocation, Plugin};
use crate::names::{self, NsRole};
use crate::ns;
use crate::proxy;
use crate::routes;
use crate::state::{LabDir, LabState};
use crate::topology::Topology;

/// What [`down`] did.
#[derive(Debug, Default)]
pub struct DownReport {
    pub namespaces: Vec<String>,
    pub killed: Vec<u32>,
    pub cni_deleted: usize,
    /// Best-effort steps that failed (CNI DEL errors, …).
    pub warnings: Vec<String>,
    pub state_removed: bool,
}

/// Removes everything of lab `lab`: processes in its namespaces, pods (CNI DEL first), namespaces
/// and the state directory. Works from the namespace names and the state dir alone, so it also
/// cleans up after a crash or a lost state.json.
pub fn down(
    lab: &str,
    bins: &Binaries,
    root: &Path,
    progress: Progress,
) -> anyhow::Result<DownReport> {
    if !crate::topology::valid_name(lab) {
        bail!("invalid lab name {lab:?}");
    }
    let dir = LabDir::new(root, lab);
    let mut report = DownReport::default();
    let namespaces = ns::list(&names::prefix(lab));
    let topo = std::fs::read_to_string(dir.topology())
        .ok()
        .and_then(|t| Topology::parse(&t).ok());
    let state = LabState::load(&dir.state()).ok();

    // 1. Processes.
    let pids = lab_pids(&namespaces, state.as_ref(), &dir);
    ns::kill_all(&pids);
    report.killed = pids;

    // 2. Pods: CNI DEL, run in the node's namespace (best effort).
    for n in &namespaces {
        if let Some(NsRole::Pod { node, pod }) = names::parse(lab, n) {
            let pod = PodNs {
                lab,
                netns: n,
                node: &node,
                pod: &pod,
            };
            cni_del(&pod, topo.as_ref(), bins, &dir, &mut report, progress);
        }
    }

    // 3. Namespaces: pods, then nodes, outside, switch.
    let errors = delete_namespaces(lab, namespaces, &mut report);

    // 4. State.
    if dir.dir.exists() {
        std::fs::remove_dir_all(&dir.dir)
            .with_context(|| format!("remove {}", dir.dir.display()))?;
        report.state_removed = true;
    }
    if !errors.is_empty() {
        bail!("could not delete every namespace: {}", errors.join("; "));
    }
    Ok(report)
}

/// Every process living in the lab's namespaces (but this one), plus the recorded echo
/// servers, proxies, route and policy agents that still name the lab (in case a namespace
/// file vanished under them).
fn lab_pids(namespaces: &[String], state: Option<&LabState>, dir: &LabDir) -> Vec<u32> {
    let mut pids: Vec<u32> = namespaces.iter().flat_map(|n| ns::pids(n)).collect();
    let me = std::process::id();
    pids.retain(|&p| p != me);
    let Some(state) = state else {
        return pids;
    };
    let mut add = |pid: u32, ours: bool| {
        if ours && !pids.contains(&pid) {
            pids.push(pid);
        }
    };
    for e in &state.echo {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", e.pid)).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        add(
            e.pid,
            cmdline.contains("echo-server") && cmdline.contains(&e.netns),
        );
    }
    for p in &state.proxies {
        add(p.pid, proxy::is_weir_proxy(p.pid, &dir.manifests()));
    }
    for r in &state.routes {
        add(r.pid, routes::is_weir_routes(r.pid, &dir.manifests()));
    }
    for a in &state.policy_agents {
        add(
            a.pid,
            crate::netpol::agent::is_weir_policy(a.pid, &dir.manifests()),
        );
    }
    pids
}

/// A pod's namespace, as its name tells.
struct PodNs<'a> {
    lab: &'a str,
    netns: &'a str,
    node: &'a str,
    pod: &'a str,
}

/// CNI DEL of one pod in its node's namespace; what prevents it is a warning, not an error.
fn cni_del(
    p: &PodNs,
    topo: Option<&Topology>,
    bins: &Binaries,
    dir: &LabDir,
    report: &mut DownReport,
    progress: Progress,
) {
    let (node, pod) = (p.node, p.pod);
    let Some(topo) = topo else {
        report
            .warnings
            .push(format!("pod {pod}: no topology.yaml, skipping CNI DEL"));
        return;
    };
    let Some((_, node_conf)) = topo.node(node) else {
        report.warnings.push(format!(
            "pod {pod}: node {node} not in topology, skipping CNI DEL"
        ));
        return;
    };
    let Ok(node_ns) = NetNs::named(&names::node(p.lab, node)) else {
        report
            .warnings
            .push(format!("pod {pod}: node namespace gone, skipping CNI DEL"));
        return;
    };
    let plugin = Plugin::for_kind(topo.cni, &bins.weir_cni);
    let conf = cni::net_conf(topo, node_conf, dir);
    let netns = ns::path(p.netns);
    match cni::invoke(
        &plugin,
        &Invocation {
            command: "DEL",
            container_id: p.netns,
            netns: &netns,
            ifname: "eth0",
            config: &conf,
            node_ns: &node_ns,
        },
    ) {
        Ok(o) => {
            report.cni_deleted += 1;
            progress(&format!(
                "node {node}: pod {pod} (DEL {} ms)",
                o.elapsed.as_millis()
            ));
        }
        Err(e) => report.warnings.push(format!("pod {pod}: {e:#}")),
    }
}

/// Deletes the namespaces, pods first, then nodes, outside, switch (recorded in `report`);
/// the errors of those that could not be deleted.
fn delete_namespaces(lab: &str, mut ordered: Vec<String>, report: &mut DownReport) -> Vec<String> {
    ordered.sort_by_key(|n| match names::parse(lab, n) {
        Some(NsRole::Pod { .. }) => 0,
        Some(NsRole::Node(_)) => 1,
        Some(NsRole::Outside) => 2,
        Some(NsRole::Switch) => 3,
        None => 4,
    });
    let mut errors = Vec::new();
    for n in &ordered {
        if let Err(e) = ns::del(n) {
            errors.push(format!("{e:#}"));
        }
    }
    report.namespaces = ordered;
    report
        .warnings
        .extend(crate::dns::remove_netns_etc(&report.namespaces));
    errors
}
