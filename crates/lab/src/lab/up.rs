//! Bringing a lab up: the switch, the outside, nodes, routes, pods, echo servers, services,
//! proxies and DNS, one step after another.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use ipnet::{IpNet, Ipv4Net};
use rtnetlink::{LinkBridge, RouteMessageBuilder};
use weir_kernel::{sysctl, Rtnl};

use super::agents::{proxy_launch, start_routes};
use super::context::{ms, Binaries, Progress, Steps};
use super::nodes::{add_pod, create_node};
use crate::cni::Plugin;
use crate::echo;
use crate::eni;
use crate::links::{open, plug_into_switch, setup_eth0, UNDERLAY_BRIDGE};
use crate::manifests;
use crate::names::{self};
use crate::ns;
use crate::proxy::{self};
use crate::state::{EchoState, LabDir, LabState, ProxyState, ServiceState};
use crate::topology::{Network, Topology};

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
            let took = proxy::wait_ready(
                launch,
                *pid,
                crate::timeout::startup_timeout(proxy::READY_TIMEOUT),
            )?;
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
    if let Some(mode) = crate::kube_proxy::Mode::of(topo.proxy) {
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
