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

    // 1. Processes: everything living in the lab's namespaces, plus recorded echo servers that
    //    still name one of them (in case a namespace file vanished under them).
    let mut pids: Vec<u32> = namespaces.iter().flat_map(|n| ns::pids(n)).collect();
    let me = std::process::id();
    pids.retain(|&p| p != me);
    if let Some(state) = &state {
        for e in &state.echo {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", e.pid)).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("echo-server")
                && cmdline.contains(&e.netns)
                && !pids.contains(&e.pid)
            {
                pids.push(e.pid);
            }
        }
        for p in &state.proxies {
            if proxy::is_weir_proxy(p.pid, &dir.manifests()) && !pids.contains(&p.pid) {
                pids.push(p.pid);
            }
        }
        for r in &state.routes {
            if routes::is_weir_routes(r.pid, &dir.manifests()) && !pids.contains(&r.pid) {
                pids.push(r.pid);
            }
        }
        for a in &state.policy_agents {
            if crate::netpol::agent::is_weir_policy(a.pid, &dir.manifests())
                && !pids.contains(&a.pid)
            {
                pids.push(a.pid);
            }
        }
    }
    ns::kill_all(&pids);
    report.killed = pids;

    // 2. Pods: CNI DEL, run in the node's namespace (best effort).
    let pods: Vec<(String, String, String)> = namespaces
        .iter()
        .filter_map(|n| match names::parse(lab, n) {
            Some(NsRole::Pod { node, pod }) => Some((n.clone(), node, pod)),
            _ => None,
        })
        .collect();
    for (pod_ns, node, pod) in &pods {
        let Some(topo) = &topo else {
            report
                .warnings
                .push(format!("pod {pod}: no topology.yaml, skipping CNI DEL"));
            continue;
        };
        let Some((_, node_conf)) = topo.node(node) else {
            report.warnings.push(format!(
                "pod {pod}: node {node} not in topology, skipping CNI DEL"
            ));
            continue;
        };
        let Ok(node_ns) = NetNs::named(&names::node(lab, node)) else {
            report
                .warnings
                .push(format!("pod {pod}: node namespace gone, skipping CNI DEL"));
            continue;
        };
        let plugin = Plugin::for_kind(topo.cni, &bins.weir_cni);
        let conf = cni::net_conf(topo, node_conf, &dir);
        let netns = ns::path(pod_ns);
        match cni::invoke(
            &plugin,
            &Invocation {
                command: "DEL",
                container_id: pod_ns,
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

    // 3. Namespaces: pods, then nodes, outside, switch.
    let mut ordered = namespaces.clone();
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
