//! Bringing a lab up: the switch, the outside, nodes, routes, pods, echo servers, services,
//! proxies and DNS, one step after another.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rtnetlink::{LinkBridge, RouteMessageBuilder};
use weir_kernel::{sysctl, NetNs, Rtnl};

use super::agents::{policy_launch, proxy_launch, start_routes};
use super::context::{ms, Binaries, Progress, Steps};
use super::nodes::{add_pod, create_node};
use crate::cni::Plugin;
use crate::echo;
use crate::eni;
use crate::links::{no_dad, open, plug_into_switch, setup_eth0, setup_eth0_v6, UNDERLAY_BRIDGE};
use crate::manifests;
use crate::names;
use crate::ns;
use crate::proxy;
use crate::state::{EchoState, LabDir, LabState, ProxyState, ServiceState};
use crate::topology::{Network, Topology};

/// Brings up the lab described by `topo`. On failure, what was made stays (run
/// [`down`](super::down())).
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

/// The lab's state directory, fresh: the previous one (of a lab that is down) is removed; the
/// topology is saved in it.
fn fresh_dir(topo: &Topology, root: &Path) -> anyhow::Result<LabDir> {
    let dir = LabDir::new(root, &topo.name);
    if dir.dir.exists() {
        std::fs::remove_dir_all(&dir.dir)
            .with_context(|| format!("remove stale {}", dir.dir.display()))?;
    }
    std::fs::create_dir_all(dir.dir.join("logs"))?;
    std::fs::write(dir.topology(), topo.to_yaml())?;
    Ok(dir)
}

/// How many progress lines [`build`] prints.
fn step_count(topo: &Topology) -> usize {
    2 + topo.nodes.len()
        + 1
        + topo.pods().count()
        + 1
        + 1
        + usize::from(topo.proxy.mode().is_some())
        + usize::from(topo.enforces_policy())
        + usize::from(topo.dns.on())
}

/// The state of a lab with nothing running yet: its services with their allocated addresses.
fn initial_state(topo: &Topology) -> anyhow::Result<LabState> {
    let allocations = topo.allocate()?;
    Ok(LabState {
        lab: topo.name.clone(),
        cni: topo.cni,
        network: topo.network,
        outside: topo.outside,
        outside6: topo.ipv6.as_ref().map(|v6| v6.outside),
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
        policy_agents: Vec::new(),
        outside_addresses: topo.outside_addresses.clone(),
    })
}

/// A lab being built: each step adds to `state` (saved as it goes) and prints one progress line
/// (or one per node or pod).
struct Build<'a> {
    topo: &'a Topology,
    bins: &'a Binaries,
    dir: LabDir,
    steps: Steps<'a>,
    state: LabState,
}

fn build(
    topo: &Topology,
    bins: &Binaries,
    root: &Path,
    plugin: &Plugin,
    progress: Progress,
) -> anyhow::Result<LabState> {
    let dir = fresh_dir(topo, root)?;
    let steps = Steps {
        done: 0,
        total: step_count(topo),
        out: progress,
    };
    let state = initial_state(topo)?;
    let mut b = Build {
        topo,
        bins,
        dir,
        steps,
        state,
    };
    b.switch()?;
    let (out, out_name) = b.outside()?;
    b.nodes(&out, &out_name)?;
    b.pod_routes()?;
    b.pods(plugin)?;
    b.eni_fix_off()?;
    b.echo_servers(&out_name)?;
    b.services(&out)?;
    b.policy_agents()?;
    b.weir_proxies()?;
    b.kube_proxy_rules()?;
    b.dns()?;
    Ok(b.state)
}

impl Build<'_> {
    fn lab(&self) -> &str {
        &self.topo.name
    }

    /// The underlay switch: a namespace with a bridge.
    fn switch(&mut self) -> anyhow::Result<()> {
        let t = Instant::now();
        let sw_name = names::switch(self.lab());
        ns::add(&sw_name)?;
        let sw = open(&sw_name)?;
        let mut sw_rt = Rtnl::in_netns(&sw)?;
        sw_rt.link_add(LinkBridge::new(UNDERLAY_BRIDGE).up().build(), "bridge br0")?;
        let lo = sw_rt.require_link("lo")?;
        sw_rt.link_up(lo.index, "lo")?;
        self.steps.step(&format!(
            "switch {sw_name}: bridge {UNDERLAY_BRIDGE} ({} ms)",
            ms(t)
        ));
        Ok(())
    }

    /// The outside world: on the switch as the underlay's router, the "internet" address on
    /// its `lo`, forwarding on. Returns its namespace and name.
    fn outside(&mut self) -> anyhow::Result<(NetNs, String)> {
        let topo = self.topo;
        let t = Instant::now();
        let out_name = names::outside(self.lab());
        ns::add(&out_name)?;
        let out = open(&out_name)?;
        if topo.ipv6.is_some() {
            no_dad(&out)?;
        }
        plug_into_switch(self.lab(), "out", &out)?;
        let out_net = Ipv4Net::new(topo.router_ip(), topo.outside_net().prefix_len())?;
        setup_eth0(&out, out_net, None)?;
        {
            let mut rt = Rtnl::in_netns(&out)?;
            let lo = rt.require_link("lo")?;
            rt.addr_ensure(lo.index, IpNet::V4(Ipv4Net::new(topo.outside, 32)?))?;
            for extra in &topo.outside_addresses {
                rt.addr_ensure(lo.index, IpNet::V4(Ipv4Net::new(*extra, 32)?))?;
            }
        }
        out.run(|| sysctl::ensure("net.ipv4.ip_forward", "1"))??;
        let mut v6 = String::new();
        if let Some(ipv6) = &topo.ipv6 {
            let router = ipv6.router_ip();
            setup_eth0_v6(
                &out,
                Ipv6Net::new(router, ipv6.underlay.prefix_len())?,
                None,
            )?;
            let mut rt = Rtnl::in_netns(&out)?;
            let lo = rt.require_link("lo")?;
            rt.addr_ensure(lo.index, IpNet::V6(Ipv6Net::new(ipv6.outside, 128)?))?;
            out.run(|| sysctl::ensure("net.ipv6.conf.all.forwarding", "1"))??;
            v6 = format!(", {router} on eth0, {} on lo", ipv6.outside);
        }
        let extra: String = topo
            .outside_addresses
            .iter()
            .map(|a| format!(", {a}"))
            .collect();
        self.steps.step(&format!(
            "outside {out_name}: {} on eth0, {}{extra} on lo{v6} ({} ms)",
            topo.router_ip(),
            topo.outside,
            ms(t)
        ));
        Ok((out, out_name))
    }

    /// The nodes, on the underlay; in an eni network each with its ENI from the VPC router.
    fn nodes(&mut self, out: &NetNs, out_name: &str) -> anyhow::Result<()> {
        let topo = self.topo;
        for (i, node) in topo.nodes.iter().enumerate() {
            let t = Instant::now();
            let node_state = create_node(topo, i, node, out, &self.dir)?;
            if topo.network == Network::Eni {
                let node_ns = open(&node_state.netns)?;
                eni::strict_rp_filter(&node_ns)?;
                eni::attach(topo, node, &node_ns, out, out_name)?;
            }
            let (ip6, cidr6) = match (node_state.underlay_ip6, topo.pod_cidr6(node)) {
                (Some(ip), Some(cidr)) => (format!(" {ip}"), format!(" {cidr}")),
                _ => (String::new(), String::new()),
            };
            self.steps.step(&format!(
                "node {}: {} eth0 {}{ip6}, podCIDR {}{cidr6} ({} ms)",
                node.name,
                node_state.netns,
                node_state.underlay_ip,
                node.pod_cidr,
                ms(t)
            ));
            self.state.nodes.push(node_state);
        }
        self.state.save(&self.dir.state())?;
        Ok(())
    }

    /// Pod routes between the nodes: in an eni network the VPC router routes pod addresses (and
    /// may check sources); in a bridge network `weir routes` on every node, as in a real
    /// cluster.
    fn pod_routes(&mut self) -> anyhow::Result<()> {
        let topo = self.topo;
        let t = Instant::now();
        if topo.network == Network::Eni {
            if topo.source_check {
                eni::source_check(topo, &self.state)?;
            }
            self.steps.step(&format!(
                "routes: the VPC router delivers each ENI's addresses to it; source check {} ({} ms)",
                if topo.source_check { "on" } else { "off" },
                ms(t)
            ));
        }
        if topo.network == Network::Bridge {
            std::fs::create_dir_all(self.dir.manifests())?;
            let took = start_routes(topo, self.bins, &self.dir, &mut self.state, None)?;
            let took: Vec<String> = took
                .iter()
                .map(|(n, d)| format!("{n} {} ms", d.as_millis()))
                .collect();
            self.steps.step(&format!(
                "routes: weir routes --backend {} on {} nodes, every other node routed ({}; {} ms)",
                topo.overlay.as_str(),
                self.state.nodes.len(),
                took.join(", "),
                ms(t)
            ));
        }
        Ok(())
    }

    /// Pods, through the CNI plugin.
    fn pods(&mut self, plugin: &Plugin) -> anyhow::Result<()> {
        let topo = self.topo;
        for node in &topo.nodes {
            for pod in &node.pods {
                let (pod_state, took) = add_pod(topo, plugin, &self.dir, node, pod)?;
                self.steps.step(&format!(
                    "node {}: pod {pod} {}{} (ADD {} ms)",
                    node.name,
                    pod_state.ip,
                    pod_state.ip6.map(|ip| format!(" {ip}")).unwrap_or_default(),
                    took.as_millis()
                ));
                self.state.pods.push(pod_state);
                self.state.save(&self.dir.state())?;
            }
        }
        Ok(())
    }

    /// `eniFix: false`: weir's fix taken out of every node again, to show what it fixes.
    fn eni_fix_off(&mut self) -> anyhow::Result<()> {
        let topo = self.topo;
        if topo.network == Network::Eni && !topo.eni_fix {
            for node in &self.state.nodes {
                eni::remove_fix(topo, &node.netns)?;
            }
            (self.steps.out)("eniFix: false: weir's fix removed from every node (ENI address, fwmark rule, connmark table)");
        }
        Ok(())
    }

    /// Echo servers everywhere: the outside, every node and every pod.
    fn echo_servers(&mut self, out_name: &str) -> anyhow::Result<()> {
        let t = Instant::now();
        let state = &mut self.state;
        let mut servers: Vec<(String, String)> = vec![(out_name.to_string(), "outside".into())];
        servers.extend(
            state
                .nodes
                .iter()
                .map(|n| (n.netns.clone(), n.name.clone())),
        );
        servers.extend(state.pods.iter().map(|p| (p.netns.clone(), p.name.clone())));
        for (netns, name) in servers {
            let pid = echo::spawn(
                &self.bins.weir,
                &ns::path(&netns),
                &name,
                &self.dir.log(&netns),
            )?;
            state.echo.push(EchoState { netns, name, pid });
            state.save(&self.dir.state())?;
        }
        self.steps.step(&format!(
            "echo servers: {} on port {} ({} ms)",
            state.echo.len(),
            echo::ECHO_PORT,
            ms(t)
        ));
        Ok(())
    }

    /// Services: the objects every proxy watches, and the outside's routes to LB IPs.
    fn services(&mut self, out: &NetNs) -> anyhow::Result<()> {
        let t = Instant::now();
        let state = &self.state;
        manifests::write(&self.dir.manifests(), &manifests::render(self.topo, state))?;
        let mut lb_routes = Vec::new();
        {
            let mut rt = Rtnl::in_netns(out)?;
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
        self.steps.step(&format!(
            "services: {} in {}{} ({} ms)",
            state.services.len(),
            self.dir.manifests().display(),
            if lb_routes.is_empty() {
                String::new()
            } else {
                format!("; outside routes {}", lb_routes.join(", "))
            },
            ms(t)
        ));
        Ok(())
    }

    /// `weir policy` on every node of a lab with policies, all started before waiting for
    /// any: the probes run only once every node enforces the objects just written.
    fn policy_agents(&mut self) -> anyhow::Result<()> {
        if !self.topo.enforces_policy() {
            return Ok(());
        }
        let t = Instant::now();
        let mut started = Vec::new();
        for node in &self.state.nodes {
            let launch = policy_launch(self.bins, &self.dir, node);
            let pid = launch.spawn()?;
            self.state.policy_agents.push(ProxyState {
                node: node.name.clone(),
                netns: node.netns.clone(),
                pid,
            });
            self.state.save(&self.dir.state())?;
            started.push((launch, pid));
        }
        let mut ready = Vec::new();
        for (launch, pid) in &started {
            let timeout = crate::timeout::startup_timeout(crate::netpol::agent::READY_TIMEOUT);
            let took = launch.wait_ready(*pid, timeout)?;
            ready.push(format!("{} {} ms", launch.node, took.as_millis()));
        }
        self.steps.step(&format!(
            "policy: weir policy enforcing {} NetworkPolicies on {} nodes ({}; {} ms)",
            self.topo.policies.len(),
            started.len(),
            ready.join(", "),
            ms(t)
        ));
        Ok(())
    }

    /// `weir proxy` on every node, all started before waiting for any.
    fn weir_proxies(&mut self) -> anyhow::Result<()> {
        let Some(mode) = self.topo.proxy.weir_mode() else {
            return Ok(());
        };
        let t = Instant::now();
        let mut started = Vec::new();
        for node in &self.state.nodes {
            let launch = proxy_launch(self.topo, self.bins, &self.dir, node, mode);
            let pid = launch.spawn()?;
            self.state.proxies.push(ProxyState {
                node: node.name.clone(),
                netns: node.netns.clone(),
                pid,
            });
            self.state.save(&self.dir.state())?;
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
        self.steps.step(&format!(
            "proxies: weir proxy --proxy-mode {mode} healthy on {} ({}; {} ms)",
            started.len(),
            ready.join(", "),
            ms(t)
        ));
        Ok(())
    }

    /// Or upstream kube-proxy's rule shapes, written once on every node.
    fn kube_proxy_rules(&mut self) -> anyhow::Result<()> {
        let topo = self.topo;
        let Some(mode) = crate::kube_proxy::Mode::of(topo.proxy) else {
            return Ok(());
        };
        let t = Instant::now();
        for node in &self.state.nodes {
            let input = crate::kube_proxy::Input {
                state: &self.state,
                node,
                cluster_cidr: topo.cluster_cidr,
                service_cidr: topo.service_cidr,
            };
            crate::kube_proxy::install(mode, &input)
                .with_context(|| format!("node {}: {}", node.name, topo.proxy.describe()))?;
        }
        self.steps.step(&format!(
            "proxies: {} on {} nodes ({} ms)",
            topo.proxy.describe(),
            self.state.nodes.len(),
            ms(t)
        ));
        Ok(())
    }

    /// Cluster DNS, if the topology asks for it.
    fn dns(&mut self) -> anyhow::Result<()> {
        let topo = self.topo;
        if !topo.dns.on() {
            return Ok(());
        }
        let t = Instant::now();
        let dns = crate::dns::up(
            &self.bins.weir,
            &self.dir,
            &self.state,
            topo.service_cidr,
            topo.dns,
        )?;
        self.steps.step(&format!(
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
        Ok(())
    }
}
