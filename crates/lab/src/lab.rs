//! Bringing a lab up and down, and reporting on it.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use ipnet::{IpNet, Ipv4Net};
use rtnetlink::packet_route::link::{InfoData, InfoVeth};
use rtnetlink::{LinkBridge, LinkUnspec, LinkVeth, RouteMessageBuilder};
use weir_kernel::{sysctl, NetNs, Rtnl};

use crate::cni::{self, Invocation, Plugin};
use crate::echo;
use crate::eni;
use crate::manifests;
use crate::ns;
use crate::proxy::{self, Launch};
use crate::routes;
use crate::state::{EchoState, LabDir, LabState, NodeState, PodState, ProxyState, ServiceState};
use crate::topology::names::{self, NsRole};
use crate::topology::{Network, Overlay, Topology};

/// The programs a lab runs: `weir` (for echo servers) and `weir-cni`.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub weir: PathBuf,
    pub weir_cni: PathBuf,
}

/// Where progress lines go (`[3/9] node b: pod b1 10.244.2.2 (ADD 4 ms)`).
pub type Progress<'a> = &'a mut dyn FnMut(&str);

const UNDERLAY_BRIDGE: &str = "br0";

struct Steps<'a> {
    done: usize,
    total: usize,
    out: Progress<'a>,
}

impl Steps<'_> {
    fn step(&mut self, msg: &str) {
        self.done += 1;
        (self.out)(&format!("[{}/{}] {msg}", self.done, self.total));
    }
}

fn ms(since: Instant) -> u128 {
    since.elapsed().as_millis()
}

/// Creates a veth pair: `local_name` in the namespace of `local`, `peer_name` in `peer_ns`.
pub(crate) fn veth_between(
    local: &mut Rtnl,
    local_name: &str,
    peer_ns: &NetNs,
    peer_name: &str,
) -> anyhow::Result<()> {
    let peer = LinkUnspec::new_with_name(peer_name)
        .setns_by_fd(peer_ns.file().as_raw_fd())
        .build();
    let msg = LinkVeth::new(local_name, peer_name)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    local.link_add(msg, &format!("veth {local_name}/{peer_name}"))?;
    Ok(())
}

/// Brings `lo` up and configures `eth0` (already moved in) with `addr`, up.
fn setup_eth0(ns: &NetNs, addr: Ipv4Net, default_via: Option<Ipv4Addr>) -> anyhow::Result<()> {
    let mut rt = Rtnl::in_netns(ns)?;
    let lo = rt.require_link("lo")?;
    rt.link_up(lo.index, "lo")?;
    let eth0 = rt.require_link("eth0")?;
    rt.addr_ensure(eth0.index, IpNet::V4(addr))?;
    rt.link_up(eth0.index, "eth0")?;
    if let Some(gw) = default_via {
        let route = RouteMessageBuilder::<Ipv4Addr>::new().gateway(gw).build();
        rt.route_ensure(route, &format!("default via {gw}"))?;
    }
    Ok(())
}

fn open(name: &str) -> anyhow::Result<NetNs> {
    NetNs::named(name).with_context(|| format!("open netns {name}"))
}

/// Brings up the lab described by `topo`. On failure, what was made stays (run [`down`]).
pub fn up(
    topo: &Topology,
    bins: &Binaries,
    root: &Path,
    progress: Progress,
) -> anyhow::Result<LabState> {
    topo.validate()?;
    let lab = topo.name.as_str();
    let existing = ns::list(&names::prefix(lab));
    if !existing.is_empty() {
        bail!(
            "lab {lab} already exists ({} namespaces); run `weir lab down {lab}` first",
            existing.len()
        );
    }
    let plugin = Plugin::for_kind(topo.cni, &bins.weir_cni);
    if !plugin.binary.exists() {
        bail!("CNI plugin {} not found", plugin.binary.display());
    }
    build(topo, bins, root, &plugin, progress)
        .with_context(|| format!("lab {lab} is partly up; `weir lab down {lab}` removes it"))
}

fn build(
    topo: &Topology,
    bins: &Binaries,
    root: &Path,
    plugin: &Plugin,
    progress: Progress,
) -> anyhow::Result<LabState> {
    let lab = topo.name.as_str();
    let dir = LabDir::new(root, lab);
    if dir.dir.exists() {
        std::fs::remove_dir_all(&dir.dir)
            .with_context(|| format!("remove stale {}", dir.dir.display()))?;
    }
    std::fs::create_dir_all(dir.dir.join("logs"))?;
    std::fs::write(dir.topology(), topo.to_yaml())?;

    let pod_count = topo.pods().count();
    let proxy_mode = topo.proxy.weir_mode();
    let mut steps = Steps {
        done: 0,
        total: 2
            + topo.nodes.len()
            + 1
            + pod_count
            + 1
            + 1
            + usize::from(topo.proxy.mode().is_some())
            + usize::from(topo.dns.on()),
        out: progress,
    };
    let allocations = topo.allocate()?;
    let mut state = LabState {
        lab: lab.to_string(),
        cni: topo.cni,
        network: topo.network,
        outside: topo.outside,
        nodes: Vec::new(),
        pods: Vec::new(),
        echo: Vec::new(),
        proxy: topo.proxy,
        services: topo
            .services
            .iter()
            .zip(&allocations)
            .map(|(s, a)| ServiceState::new(s, a))
            .collect(),
        proxies: Vec::new(),
        routes: Vec::new(),
    };

    // The underlay switch.
    let t = Instant::now();
    let sw_name = names::switch(lab);
    ns::add(&sw_name)?;
    let sw = open(&sw_name)?;
    let mut sw_rt = Rtnl::in_netns(&sw)?;
    sw_rt.link_add(LinkBridge::new(UNDERLAY_BRIDGE).up().build(), "bridge br0")?;
    let lo = sw_rt.require_link("lo")?;
    sw_rt.link_up(lo.index, "lo")?;
    steps.step(&format!(
        "switch {sw_name}: bridge {UNDERLAY_BRIDGE} ({} ms)",
        ms(t)
    ));

    // The outside world.
    let t = Instant::now();
    let out_name = names::outside(lab);
    ns::add(&out_name)?;
    let out = open(&out_name)?;
    plug_into_switch(lab, "out", &out)?;
    let out_net = Ipv4Net::new(topo.router_ip(), topo.outside_net().prefix_len())?;
    setup_eth0(&out, out_net, None)?;
    {
        let mut rt = Rtnl::in_netns(&out)?;
        let lo = rt.require_link("lo")?;
        rt.addr_ensure(lo.index, IpNet::V4(Ipv4Net::new(topo.outside, 32)?))?;
    }
    out.run(|| sysctl::ensure("net.ipv4.ip_forward", "1"))??;
    steps.step(&format!(
        "outside {out_name}: {} on eth0, {} on lo ({} ms)",
        topo.router_ip(),
        topo.outside,
        ms(t)
    ));

    // Nodes.
    for (i, node) in topo.nodes.iter().enumerate() {
        let t = Instant::now();
        let node_state = create_node(topo, i, node, &out, &dir)?;
        if topo.network == Network::Eni {
            let node_ns = open(&node_state.netns)?;
            eni::strict_rp_filter(&node_ns)?;
            eni::attach(topo, node, &node_ns, &out, &out_name)?;
        }
        steps.step(&format!(
            "node {}: {} eth0 {}, podCIDR {} ({} ms)",
            node.name,
            node_state.netns,
            node_state.underlay_ip,
            node.pod_cidr,
            ms(t)
        ));
        state.nodes.push(node_state);
    }
    state.save(&dir.state())?;

    // In an eni network the VPC router routes pod addresses, and may check sources.
    let t = Instant::now();
    if topo.network == Network::Eni {
        if topo.source_check {
            eni::source_check(topo, &state)?;
        }
        steps.step(&format!(
            "routes: the VPC router delivers each ENI's addresses to it; source check {} ({} ms)",
            if topo.source_check { "on" } else { "off" },
            ms(t)
        ));
    }
    // Pod routes between the nodes: `weir routes` on every node, as in a real cluster.
    if topo.network == Network::Bridge {
        std::fs::create_dir_all(dir.manifests())?;
        let took = start_routes(topo, bins, &dir, &mut state, None)?;
        let took: Vec<String> = took
            .iter()
            .map(|(n, d)| format!("{n} {} ms", d.as_millis()))
            .collect();
        steps.step(&format!(
            "routes: weir routes --backend {} on {} nodes, every other node routed ({}; {} ms)",
            topo.overlay.as_str(),
            state.nodes.len(),
            took.join(", "),
            ms(t)
        ));
    }

    // Pods, through the CNI plugin.
    for node in &topo.nodes {
        for pod in &node.pods {
            let (pod_state, took) = add_pod(topo, plugin, &dir, node, pod)?;
            steps.step(&format!(
                "node {}: pod {pod} {} (ADD {} ms)",
                node.name,
                pod_state.ip,
                took.as_millis()
            ));
            state.pods.push(pod_state);
            state.save(&dir.state())?;
        }
    }

    if topo.network == Network::Eni && !topo.eni_fix {
        for node in &state.nodes {
            eni::remove_fix(topo, &node.netns)?;
        }
        (steps.out)("eniFix: false: weir's fix removed from every node (ENI address, fwmark rule, connmark table)");
    }

    // Echo servers everywhere.
    let t = Instant::now();
    let mut servers: Vec<(String, String)> = vec![(out_name.clone(), "outside".into())];
    servers.extend(
        state
            .nodes
            .iter()
            .map(|n| (n.netns.clone(), n.name.clone())),
    );
    servers.extend(state.pods.iter().map(|p| (p.netns.clone(), p.name.clone())));
    for (netns, name) in servers {
        let pid = echo::spawn(&bins.weir, &ns::path(&netns), &name, &dir.log(&netns))?;
        state.echo.push(EchoState { netns, name, pid });
        state.save(&dir.state())?;
    }
    steps.step(&format!(
        "echo servers: {} on port {} ({} ms)",
        state.echo.len(),
        echo::ECHO_PORT,
        ms(t)
    ));

    // Services: the objects every proxy watches, and the outside's routes to LB IPs.
    let t = Instant::now();
    manifests::write(&dir.manifests(), &manifests::render(topo, &state))?;
    let mut lb_routes = Vec::new();
    {
        let mut rt = Rtnl::in_netns(&out)?;
        for svc in &state.services {
            let (Some(lb), Some(node)) = (svc.load_balancer_ip, &svc.load_balancer_node) else {
                continue;
            };
            let via = state
                .nodes
                .iter()
                .find(|n| &n.name == node)
                .map(|n| n.underlay_ip)
                .ok_or_else(|| anyhow!("service {}: no node {node}", svc.name))?;
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(lb, 32)
                .gateway(via)
                .build();
            rt.route_ensure(route, &format!("{lb} via {via}"))?;
            lb_routes.push(format!("{lb} via node {node}"));
        }
    }
    steps.step(&format!(
        "services: {} in {}{} ({} ms)",
        state.services.len(),
        dir.manifests().display(),
        if lb_routes.is_empty() {
            String::new()
        } else {
            format!("; outside routes {}", lb_routes.join(", "))
        },
        ms(t)
    ));

    // `weir proxy` on every node, all started before waiting for any.
    if let Some(mode) = proxy_mode {
        let t = Instant::now();
        let mut started = Vec::new();
        for node in &state.nodes {
            let launch = proxy_launch(topo, bins, &dir, node, mode);
            let pid = launch.spawn()?;
            state.proxies.push(ProxyState {
                node: node.name.clone(),
                netns: node.netns.clone(),
                pid,
            });
            state.save(&dir.state())?;
            started.push((launch, pid));
        }
        let mut ready = Vec::new();
        for (launch, pid) in &started {
            let took =
                proxy::wait_ready(launch, *pid, crate::startup_timeout(proxy::READY_TIMEOUT))?;
            ready.push(format!("{} {} ms", launch.node, took.as_millis()));
        }
        steps.step(&format!(
            "proxies: weir proxy --proxy-mode {mode} healthy on {} ({}; {} ms)",
            started.len(),
            ready.join(", "),
            ms(t)
        ));
    }
    // Or upstream kube-proxy's rule shapes, written once on every node.
    if let Some(mode) = topo.proxy.kube_proxy() {
        let t = Instant::now();
        for node in &state.nodes {
            let input = crate::kube_proxy::Input {
                state: &state,
                node,
                cluster_cidr: topo.cluster_cidr,
                service_cidr: topo.service_cidr,
            };
            crate::kube_proxy::install(mode, &input)
                .with_context(|| format!("node {}: {}", node.name, topo.proxy.describe()))?;
        }
        steps.step(&format!(
            "proxies: {} on {} nodes ({} ms)",
            topo.proxy.describe(),
            state.nodes.len(),
            ms(t)
        ));
    }
    if topo.dns.on() {
        let t = Instant::now();
        let dns = crate::dns::up(&bins.weir, &dir, &state, topo.service_cidr, topo.dns)?;
        steps.step(&format!(
            "dns: weir dns on node {} ({}:53) behind {}, NSD outside serving {}, pods' \
             resolv.conf in /etc/netns naming {}{} ({} ms)",
            dns.node,
            dns.server_ip,
            dns.cluster_ip,
            crate::dns::EXTERNAL_ZONE,
            dns.nameserver(),
            if dns.node_local {
                " (node-local caches on every node)"
            } else {
                ""
            },
            ms(t)
        ));
    }
    Ok(state)
}

/// Plugs `peer`'s `eth0` into the lab's underlay switch as port `port`.
fn plug_into_switch(lab: &str, port: &str, peer: &NetNs) -> anyhow::Result<()> {
    let mut sw_rt = Rtnl::in_netns(&open(&names::switch(lab))?)?;
    let br = sw_rt.require_link(UNDERLAY_BRIDGE)?;
    veth_between(&mut sw_rt, port, peer, "eth0")?;
    let link = sw_rt.require_link(port)?;
    sw_rt.link_set(
        LinkUnspec::new_with_index(link.index)
            .controller(br.index)
            .up()
            .build(),
        port,
    )?;
    Ok(())
}

/// Makes `node` in node slot `index` of `topo` (which decides its underlay address and,
/// routed, its subnet): its namespace, wired to the underlay (the shared switch, or its own
/// subnet to the outside), `eth0` addressed with a default route, its IPAM directory.
fn create_node(
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
    std::fs::create_dir_all(dir.ipam(&node.name))?;
    Ok(NodeState {
        name: node.name.clone(),
        netns: name,
        underlay_ip: ip,
        pod_gateway: cni::gateway(node),
        annotations: Default::default(),
        vtep_ip: (topo.network == Network::Bridge && topo.overlay == Overlay::Vxlan)
            .then(|| node.pod_cidr.network()),
    })
}

/// Makes pod `pod` of `node`: its namespace with `lo` up, and `eth0` from the CNI plugin (ADD).
fn add_pod(
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
    Ok((
        PodState {
            node: node.name.clone(),
            name: pod.to_string(),
            netns: pod_ns_name,
            ip: ip.addr(),
            prefix_len: ip.prefix_len(),
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
fn start_routes(
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
        proxy::wait_ready(&launch, pid, crate::startup_timeout(proxy::READY_TIMEOUT))?;
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
        proxy::stop(pid, hard);
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
        crate::startup_timeout(proxy::READY_TIMEOUT),
    )?;
    Ok(Restart {
        node: node.to_string(),
        old_pid,
        new_pid,
        ready_after,
    })
}

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

/// One row of `weir lab status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StatusRow {
    pub namespace: String,
    pub role: String,
    pub address: String,
    pub echo_pid: Option<u32>,
    pub echo_alive: Option<bool>,
    /// Nodes only.
    pub proxy_pid: Option<u32>,
    pub proxy_alive: Option<bool>,
}

/// The lab's namespaces with their addresses and echo servers.
pub fn status(lab: &str, root: &Path) -> anyhow::Result<Vec<StatusRow>> {
    let dir = LabDir::new(root, lab);
    let namespaces = ns::list(&names::prefix(lab));
    if namespaces.is_empty() && !dir.dir.exists() {
        bail!(
            "no lab named {lab} (no wl-{lab}-* namespace, no {})",
            dir.dir.display()
        );
    }
    let state = LabState::load(&dir.state()).ok();
    let mut rows = Vec::new();
    for n in namespaces {
        let role = names::parse(lab, &n);
        let (role_s, address) = match (&role, &state) {
            (Some(NsRole::Switch), _) => ("switch".to_string(), "-".to_string()),
            (Some(NsRole::Outside), Some(s)) => ("outside".into(), s.outside.to_string()),
            (Some(NsRole::Outside), None) => ("outside".into(), "?".into()),
            (Some(NsRole::Node(node)), s) => (
                format!("node {node}"),
                s.as_ref()
                    .and_then(|s| s.nodes.iter().find(|x| &x.name == node))
                    .map(|x| x.underlay_ip.to_string())
                    .unwrap_or_else(|| "?".into()),
            ),
            (Some(NsRole::Pod { node, pod }), s) => (
                format!("pod {node}/{pod}"),
                s.as_ref()
                    .and_then(|s| s.pods.iter().find(|x| &x.name == pod))
                    .map(|x| format!("{}/{}", x.ip, x.prefix_len))
                    .unwrap_or_else(|| "?".into()),
            ),
            (None, _) => ("?".into(), "?".into()),
        };
        let echo_pid = state
            .as_ref()
            .and_then(|s| s.echo.iter().find(|e| e.netns == n))
            .map(|e| e.pid);
        let proxy_pid = state
            .as_ref()
            .and_then(|s| s.proxies.iter().find(|p| p.netns == n))
            .map(|p| p.pid);
        rows.push(StatusRow {
            namespace: n,
            role: role_s,
            address,
            echo_pid,
            echo_alive: echo_pid.map(ns::alive),
            proxy_pid,
            proxy_alive: proxy_pid.map(ns::alive),
        });
    }
    Ok(rows)
}

pub fn render_status(rows: &[StatusRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.namespace.clone(),
                r.role.clone(),
                r.address.clone(),
                r.echo_pid
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "-".into()),
                alive(r.echo_alive),
                r.proxy_pid
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "-".into()),
                alive(r.proxy_alive),
            ]
        })
        .collect();
    crate::matrix::render_table(
        &[
            "NAMESPACE",
            "ROLE",
            "ADDRESS",
            "ECHO-PID",
            "ECHO",
            "PROXY-PID",
            "PROXY",
        ],
        &cells,
    )
}

fn alive(a: Option<bool>) -> String {
    match a {
        Some(true) => "alive".into(),
        Some(false) => "DEAD".into(),
        None => "-".into(),
    }
}

/// The lab's services as a table (`weir lab status`).
pub fn render_services(state: &LabState) -> String {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = state
        .services
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.kind.as_str().to_string(),
                s.cluster_ip.to_string(),
                format!("{}/{}", s.port, s.protocol.as_str()),
                opt(s.node_port.map(|p| p.to_string())),
                opt(s
                    .load_balancer_ip
                    .map(|ip| format!("{ip} via {}", opt(s.load_balancer_node.clone())))),
                format!(
                    "{}{}",
                    if s.local_policy() { "Local" } else { "Cluster" },
                    if s.sticky() { ", ClientIP" } else { "" }
                ),
                if s.backends.is_empty() {
                    "(none)".into()
                } else {
                    s.backends.join(",")
                },
            ]
        })
        .collect();
    crate::matrix::render_table(
        &[
            "SERVICE",
            "TYPE",
            "CLUSTER-IP",
            "PORT",
            "NODE-PORT",
            "LOAD-BALANCER",
            "POLICY",
            "BACKENDS",
        ],
        &rows,
    )
}

/// The namespace `target` names: `<node>`, `<node>/<pod>`, `out` or `sw`.
pub fn target_netns(lab: &str, target: &str) -> anyhow::Result<String> {
    let name = match target.split_once('/') {
        Some((node, pod)) => names::pod(lab, node, pod),
        None => match target {
            "out" | "outside" => names::outside(lab),
            "sw" | "switch" => names::switch(lab),
            node => names::node(lab, node),
        },
    };
    if !ns::path(&name).exists() {
        return Err(anyhow!(
            "no namespace {name} (target {target:?} of lab {lab})"
        ));
    }
    Ok(name)
}

/// Loads a running lab's state.
pub fn load_state(lab: &str, root: &Path) -> anyhow::Result<LabState> {
    let dir = LabDir::new(root, lab);
    LabState::load(&dir.state())
        .with_context(|| format!("lab {lab} is not up (or its state is lost)"))
}
