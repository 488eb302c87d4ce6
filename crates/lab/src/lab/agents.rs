//! The per-node agents: how the lab launches `weir routes` and `weir proxy`, and restarting
//! a proxy.

use std::path::Path;

use anyhow::{anyhow, bail};

use super::context::Binaries;
use super::status::load_state;
use crate::manifests;
use crate::names;
use crate::ns;
use crate::proxy::{self, Launch};
use crate::routes;
use crate::state::{LabDir, LabState, NodeState, ProxyState};
use crate::topology::Topology;

/// How the lab runs `weir routes` on `node`.
pub fn routes_launch(topo: &Topology, bins: &Binaries, dir: &LabDir, node: &str) -> routes::Launch {
    let files = dir.routes_dir(node);
    routes::Launch {
        weir: bins.weir.clone(),
        backend: topo.overlay,
        manifests: dir.manifests(),
        node: node.to_string(),
        netns: names::node(&topo.name, node),
        log: dir.routes_log(node),
        publish: files.join("node.patch.yaml"),
        status: files.join("status.json"),
        mtu_file: dir.routes_mtu(node),
    }
}

/// Starts `weir routes` on the nodes of `state` (or only on `only`), merges what each
/// publishes into its Node object, rewrites `nodes.yaml` and waits until every node's agent
/// routes every other node. Returns, per started agent, how long convergence took.
pub(super) fn start_routes(
    topo: &Topology,
    bins: &Binaries,
    dir: &LabDir,
    state: &mut LabState,
    only: Option<&str>,
) -> anyhow::Result<Vec<(String, std::time::Duration)>> {
    // The Nodes first (without VTEPs): an agent does nothing before it sees its own Node.
    manifests::write(&dir.manifests(), &[manifests::render_nodes(topo, state)])?;
    let mut started = Vec::new();
    for node in &state.nodes {
        if only.is_some_and(|o| o != node.name) {
            continue;
        }
        let launch = routes_launch(topo, bins, dir, &node.name);
        let pid = launch.spawn()?;
        state.routes.push(ProxyState {
            node: node.name.clone(),
            netns: node.netns.clone(),
            pid,
        });
        started.push((launch, pid));
    }
    state.save(&dir.state())?;
    let published = routes::wait_all_published(&started)?;
    for node in &mut state.nodes {
        if let Some(a) = published.get(&node.name) {
            node.annotations = a.clone();
        }
    }
    manifests::write(&dir.manifests(), &[manifests::render_nodes(topo, state)])?;
    state.save(&dir.state())?;
    // Every agent, old and new, must now route every node.
    let all: Vec<(routes::Launch, u32)> = state
        .routes
        .iter()
        .map(|r| (routes_launch(topo, bins, dir, &r.node), r.pid))
        .collect();
    let names = state.nodes.iter().map(|n| n.name.clone()).collect();
    let took = routes::wait_all_converged(&all, &names)?;
    Ok(took
        .into_iter()
        .filter(|(n, _)| only.is_none_or(|o| o == n))
        .collect())
}

/// How the lab runs `weir proxy` on `node`.
pub fn proxy_launch(
    topo: &Topology,
    bins: &Binaries,
    dir: &LabDir,
    node: &NodeState,
    mode: &str,
) -> Launch {
    Launch {
        weir: bins.weir.clone(),
        mode: mode.to_string(),
        manifests: dir.manifests(),
        cluster_cidr: topo.cluster_cidr,
        node: node.name.clone(),
        node_ip: node.underlay_ip,
        netns: node.netns.clone(),
        log: dir.proxy_log(&node.name),
        state_dir: dir.proxy_state(&node.name),
    }
}

/// How the lab runs `weir policy` on `node` (a topology with policies).
pub fn policy_launch(
    bins: &Binaries,
    dir: &LabDir,
    node: &NodeState,
) -> crate::netpol::agent::Launch {
    crate::netpol::agent::Launch {
        weir: bins.weir.clone(),
        manifests: dir.manifests(),
        node: node.name.clone(),
        node_ip: node.underlay_ip,
        netns: node.netns.clone(),
        log: dir.policy_log(&node.name),
    }
}

/// What [`restart_proxy`] did.
#[derive(Debug)]
pub struct Restart {
    pub node: String,
    pub old_pid: Option<u32>,
    pub new_pid: u32,
    /// From the new process's start to its `/healthz` answering 200.
    pub ready_after: std::time::Duration,
}

/// Stops the proxy of `node` (SIGTERM, or SIGKILL when `hard`: a crash), starts a new one and
/// waits until it is healthy. The rules the old one installed stay in the kernel meanwhile.
pub fn restart_proxy(
    lab: &str,
    node: &str,
    hard: bool,
    bins: &Binaries,
    root: &Path,
) -> anyhow::Result<Restart> {
    let dir = LabDir::new(root, lab);
    let mut state = load_state(lab, root)?;
    let topo = Topology::parse(&std::fs::read_to_string(dir.topology())?)
        .map_err(|e| anyhow!("{}: {e}", dir.topology().display()))?;
    let Some(mode) = state.proxy.weir_mode() else {
        bail!(
            "lab {lab} runs no weir proxy ({}): nothing to restart",
            state.proxy.describe()
        );
    };
    let node_state = state
        .nodes
        .iter()
        .find(|n| n.name == node)
        .cloned()
        .ok_or_else(|| anyhow!("lab {lab} has no node {node}"))?;
    let old_pid = state
        .proxies
        .iter()
        .find(|p| p.node == node)
        .map(|p| p.pid)
        .filter(|&pid| ns::alive(pid) && proxy::is_weir_proxy(pid, &dir.manifests()));
    if let Some(pid) = old_pid {
        crate::process::stop(pid, hard);
    }
    let launch = proxy_launch(&topo, bins, &dir, &node_state, mode);
    let new_pid = launch.spawn()?;
    state.proxies.retain(|p| p.node != node);
    state.proxies.push(ProxyState {
        node: node.to_string(),
        netns: node_state.netns.clone(),
        pid: new_pid,
    });
    state.save(&dir.state())?;
    let ready_after = proxy::wait_ready(
        &launch,
        new_pid,
        crate::timeout::startup_timeout(proxy::READY_TIMEOUT),
    )?;
    Ok(Restart {
        node: node.to_string(),
        old_pid,
        new_pid,
        ready_after,
    })
}
