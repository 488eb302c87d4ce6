//! Nodes and pods: making them, and nodes joining and leaving a running lab.

use std::path::Path;

use anyhow::{anyhow, bail, Context};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use weir_kernel::{NetNs, Rtnl};

use super::agents::{proxy_launch, routes_launch, start_routes};
use super::context::Binaries;
use super::status::load_state;
use crate::cni::{self, Invocation, Plugin};
use crate::echo;
use crate::links::{no_dad, open, plug_into_switch, setup_eth0, setup_eth0_v6, veth_between};
use crate::manifests;
use crate::names;
use crate::ns;
use crate::proxy;
use crate::routes;
use crate::state::{EchoState, LabDir, NodeState, PodState, ProxyState};
use crate::topology::{Network, Overlay, Topology};

/// Makes `node` in node slot `index` of `topo` (which decides its underlay address and,
/// routed, its subnet): its namespace, wired to the underlay (the shared switch, or its own
/// subnet to the outside), `eth0` addressed with a default route, its IPAM directory.
pub(super) fn create_node(
    topo: &Topology,
    index: usize,
    node: &crate::topology::Node,
    out: &NetNs,
    dir: &LabDir,
) -> anyhow::Result<NodeState> {
    let name = names::node(&topo.name, &node.name);
    let ip = topo.underlay_ip(index).expect("validated");
    ns::add(&name)?;
    let node_ns = open(&name)?;
    if topo.ipv6.is_some() {
        no_dad(&node_ns)?;
    }
    if topo.routed_underlay {
        wire_routed(topo, index, &node.name, out, &node_ns)?;
    } else {
        plug_into_switch(&topo.name, &format!("n-{}", node.name), &node_ns)?;
    }
    let subnet = topo.node_subnet(index).expect("validated");
    setup_eth0(
        &node_ns,
        Ipv4Net::new(ip, subnet.prefix_len())?,
        topo.node_router(index),
    )?;
    let ip6 = topo.underlay_ip6(index);
    if let (Some(ip6), Some(v6)) = (ip6, &topo.ipv6) {
        setup_eth0_v6(
            &node_ns,
            Ipv6Net::new(ip6, v6.underlay.prefix_len())?,
            Some(v6.router_ip()),
        )?;
    }
    std::fs::create_dir_all(dir.ipam(&node.name))?;
    Ok(NodeState {
        name: node.name.clone(),
        netns: name,
        underlay_ip: ip,
        pod_gateway: crate::addr::pod_gateway(node.pod_cidr),
        annotations: Default::default(),
        vtep_ip: (topo.network == Network::Bridge && topo.overlay == Overlay::Vxlan)
            .then(|| node.pod_cidr.network()),
        underlay_ip6: ip6,
        pod_gateway6: topo
            .pod_cidr6(node)
            .and_then(|c| crate::dualstack::nth6(c, 1)),
        vtep_ip6: (topo.network == Network::Bridge && topo.overlay == Overlay::Vxlan)
            .then(|| topo.pod_cidr6(node).map(|c| c.network()))
            .flatten(),
    })
}

/// Makes pod `pod` of `node`: its namespace with `lo` up, and `eth0` from the CNI plugin (ADD).
pub(super) fn add_pod(
    topo: &Topology,
    plugin: &Plugin,
    dir: &LabDir,
    node: &crate::topology::Node,
    pod: &str,
) -> anyhow::Result<(PodState, std::time::Duration)> {
    let node_ns = open(&names::node(&topo.name, &node.name))?;
    let conf = cni::net_conf(topo, node, dir);
    let pod_ns_name = names::pod(&topo.name, &node.name, pod);
    ns::add(&pod_ns_name)?;
    {
        let mut rt = Rtnl::in_netns(&open(&pod_ns_name)?)?;
        let lo = rt.require_link("lo")?;
        rt.link_up(lo.index, "lo")?;
    }
    let netns_path = ns::path(&pod_ns_name);
    let outcome = cni::invoke(
        plugin,
        &Invocation {
            command: "ADD",
            container_id: &pod_ns_name,
            netns: &netns_path,
            ifname: "eth0",
            config: &conf,
            node_ns: &node_ns,
        },
    )
    .with_context(|| format!("node {}: pod {pod}", node.name))?;
    let ip = cni::result_ipv4(&outcome.stdout)?;
    let ip6 = match topo.ipv6 {
        Some(_) => Some(cni::result_ipv6(&outcome.stdout)?.addr()),
        None => None,
    };
    Ok((
        PodState {
            node: node.name.clone(),
            name: pod.to_string(),
            netns: pod_ns_name,
            ip: ip.addr(),
            prefix_len: ip.prefix_len(),
            ip6,
        },
        outcome.elapsed,
    ))
}

/// Wires node `index` to the outside (the underlay router) on its own subnet: a veth
/// `n-<node>` in the outside holding the node's router address, `eth0` in the node.
fn wire_routed(
    topo: &Topology,
    index: usize,
    node: &str,
    out: &NetNs,
    node_ns: &NetNs,
) -> anyhow::Result<()> {
    let subnet = topo.node_subnet(index).expect("validated");
    let router = topo.node_router(index).expect("validated");
    let port = format!("n-{node}");
    let mut rt = Rtnl::in_netns(out)?;
    veth_between(&mut rt, &port, node_ns, "eth0")?;
    let link = rt.require_link(&port)?;
    rt.addr_ensure(
        link.index,
        IpNet::V4(Ipv4Net::new(router, subnet.prefix_len())?),
    )?;
    rt.link_up(link.index, &port)?;
    Ok(())
}

/// Adds node `name` with pod CIDR `pod_cidr` and pods `pods` to the running lab `lab` (bridge
/// network), as a node joining a cluster: its namespace on the underlay (the first free node
/// address), its Node object, `weir routes` on it, then — once every node's agent routes every
/// other node — its pods (CNI ADD), their echo servers and its `weir proxy`.
pub fn add_node(
    lab: &str,
    name: &str,
    pod_cidr: Ipv4Net,
    pods: &[String],
    bins: &Binaries,
    root: &Path,
) -> anyhow::Result<NodeState> {
    let dir = LabDir::new(root, lab);
    let mut state = load_state(lab, root)?;
    let mut topo = Topology::parse(&std::fs::read_to_string(dir.topology())?)
        .map_err(|e| anyhow!("{}: {e}", dir.topology().display()))?;
    if topo.enforces_policy() {
        // Its pods would need Pod objects and the node its own `weir policy`.
        bail!("lab {lab}: nodes do not join a lab with policies");
    }
    if topo.network != Network::Bridge {
        bail!("lab {lab}: nodes join bridge-network labs only");
    }
    // The first node slot whose underlay address no running node holds (removed nodes leave
    // holes; the slot decides the address and, routed, the subnet).
    let index = (0..)
        .find(|&i| {
            topo.underlay_ip(i)
                .is_none_or(|ip| state.nodes.iter().all(|n| n.underlay_ip != ip))
        })
        .expect("an unbounded search ends");
    let new = crate::topology::Node {
        name: name.to_string(),
        pod_cidr,
        pods: pods.to_vec(),
    };
    if topo.underlay_ip(index).is_none() {
        bail!(
            "lab {lab}: no node address left on underlay {}",
            topo.underlay
        );
    }
    // Validated as part of the whole topology (name, pod CIDR overlaps).
    topo.nodes.push(new.clone());
    topo.validate()?;
    let out = open(&names::outside(lab))?;
    let node_state = create_node(&topo, index, &new, &out, &dir)?;
    state.nodes.push(node_state.clone());
    state.save(&dir.state())?;
    std::fs::write(dir.topology(), topo.to_yaml())?;

    start_routes(&topo, bins, &dir, &mut state, Some(name))?;

    let plugin = Plugin::for_kind(topo.cni, &bins.weir_cni);
    for pod in pods {
        let (pod_state, _) = add_pod(&topo, &plugin, &dir, &new, pod)?;
        let pid = echo::spawn(
            &bins.weir,
            &ns::path(&pod_state.netns),
            pod,
            &dir.log(&pod_state.netns),
        )?;
        state.echo.push(EchoState {
            netns: pod_state.netns.clone(),
            name: pod.clone(),
            pid,
        });
        state.pods.push(pod_state);
        state.save(&dir.state())?;
    }
    let pid = echo::spawn(
        &bins.weir,
        &ns::path(&node_state.netns),
        name,
        &dir.log(&node_state.netns),
    )?;
    state.echo.push(EchoState {
        netns: node_state.netns.clone(),
        name: name.to_string(),
        pid,
    });
    state.save(&dir.state())?;
    if let Some(mode) = topo.proxy.weir_mode() {
        let launch = proxy_launch(&topo, bins, &dir, &node_state, mode);
        let pid = launch.spawn()?;
        state.proxies.push(ProxyState {
            node: name.to_string(),
            netns: node_state.netns.clone(),
            pid,
        });
        state.save(&dir.state())?;
        proxy::wait_ready(
            &launch,
            pid,
            crate::timeout::startup_timeout(proxy::READY_TIMEOUT),
        )?;
    }
    Ok(node_state)
}

/// Removes node `name` from the running lab `lab`, as a node leaving a cluster: its Node
/// object goes first and every other node's `weir routes` drops its routes, neighbour and FDB
/// entries (waited for), then its pods (CNI DEL), processes and namespaces. A node hosting a
/// service backend is refused (its endpoints would dangle).
pub fn remove_node(lab: &str, name: &str, bins: &Binaries, root: &Path) -> anyhow::Result<()> {
    let dir = LabDir::new(root, lab);
    let mut state = load_state(lab, root)?;
    let mut topo = Topology::parse(&std::fs::read_to_string(dir.topology())?)
        .map_err(|e| anyhow!("{}: {e}", dir.topology().display()))?;
    let Some((_, node)) = topo.node(name) else {
        bail!("lab {lab} has no node {name}");
    };
    let node = node.clone();
    if let Some(svc) = state
        .services
        .iter()
        .find(|s| s.backends.iter().any(|b| node.pods.contains(b)))
    {
        bail!(
            "node {name} hosts a backend of service {}: not removed",
            svc.name
        );
    }
    if state.nodes.len() == 1 {
        bail!("node {name} is the lab's last node: use `weir lab down {lab}`");
    }
    topo.nodes.retain(|n| n.name != name);
    state.nodes.retain(|n| n.name != name);
    let gone: Vec<u32> = state
        .routes
        .iter()
        .filter(|r| r.node == name)
        .map(|r| r.pid)
        .collect();
    state.routes.retain(|r| r.node != name);
    // The Node object goes: the other agents remove its entries.
    manifests::write(&dir.manifests(), &[manifests::render_nodes(&topo, &state)])?;
    let others: Vec<(routes::Launch, u32)> = state
        .routes
        .iter()
        .map(|r| (routes_launch(&topo, bins, &dir, &r.node), r.pid))
        .collect();
    let names = state.nodes.iter().map(|n| n.name.clone()).collect();
    routes::wait_all_converged(&others, &names)?;
    // Then the machine: pods (CNI DEL), every process in its namespaces, the namespaces.
    let node_ns_name = names::node(lab, name);
    let plugin = Plugin::for_kind(topo.cni, &bins.weir_cni);
    let conf = cni::net_conf(&topo, &node, &dir);
    let mut namespaces: Vec<String> = node.pods.iter().map(|p| names::pod(lab, name, p)).collect();
    let node_ns = open(&node_ns_name)?;
    for pod_ns in &namespaces {
        cni::invoke(
            &plugin,
            &Invocation {
                command: "DEL",
                container_id: pod_ns,
                netns: &ns::path(pod_ns),
                ifname: "eth0",
                config: &conf,
                node_ns: &node_ns,
            },
        )
        .with_context(|| format!("node {name}: CNI DEL of {pod_ns}"))?;
    }
    namespaces.push(node_ns_name.clone());
    let mut pids: Vec<u32> = namespaces.iter().flat_map(|n| ns::pids(n)).collect();
    pids.extend(
        gone.iter()
            .filter(|&&p| routes::is_weir_routes(p, &dir.manifests())),
    );
    ns::kill_all(&pids);
    for n in &namespaces {
        ns::del(n)?;
    }
    state.pods.retain(|p| p.node != name);
    state.echo.retain(|e| !namespaces.contains(&e.netns));
    state.proxies.retain(|p| p.node != name);
    state.save(&dir.state())?;
    std::fs::write(dir.topology(), topo.to_yaml())?;
    Ok(())
}
