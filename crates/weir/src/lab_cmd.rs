//! `weir lab …`: a whole cluster simulated with network namespaces on this machine.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use weir_lab::lab::{self, Binaries};
use weir_lab::{eni, matrix, netpol, services, state_root, CniKind, Network, ProxyKind, Topology};

#[derive(clap::Args)]
pub struct LabArgs {
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(Clone, Copy, ValueEnum)]
enum CniArg {
    Weir,
    Reference,
}

/// The built-in topologies `weir lab demo` can run.
#[derive(Clone, Copy, ValueEnum)]
enum TopologyArg {
    /// Two nodes on one segment, bridge mode, `weir routes --backend host-gw` on each
    /// (weir_lab::DEFAULT_TOPOLOGY).
    Default,
    /// Two nodes whose pods share an addressless secondary ENI behind a VPC router with a source
    /// check (weir_lab::ENI_TOPOLOGY).
    Eni,
    /// Two nodes on different routed underlay subnets, `weir routes --backend vxlan` on each
    /// (weir_lab::VXLAN_TOPOLOGY).
    Vxlan,
    /// The default two nodes, dual-stack: IPv6 underlay, podCIDRs, pods, ClusterIPs and
    /// NodePorts beside the IPv4 ones, and every probe in both families
    /// (weir_lab::DUAL_STACK_TOPOLOGY).
    DualStack,
    /// NetworkPolicy: pods in three namespaces on two nodes, policies, `weir policy` on
    /// every node; each matrix row's expectation from weir-policy's oracle (bridge mode,
    /// weir_lab::POLICY_TOPOLOGY).
    Policy,
    /// The same policy lab in eni-shared mode (weir_lab::POLICY_ENI_TOPOLOGY).
    PolicyEni,
}

#[derive(Clone, Copy, ValueEnum)]
enum ProxyArg {
    Nftables,
    Iptables,
    /// weir proxy's userspace mode (a proxy in the agent, retrying dead endpoints).
    Userspace,
    /// weir proxy's ipvs mode (needs IPVS and dummy in the kernel: the qemu VM, docs/vm.md).
    Ipvs,
    /// Upstream kube-proxy's iptables-mode rule shapes, written once (no weir proxy).
    KubeProxyIptables,
    /// Upstream kube-proxy's nftables-mode rule shapes (table `ip kube-proxy`).
    KubeProxyNftables,
    /// Upstream kube-proxy's ipvs-mode rule shapes (needs IPVS and dummy in the kernel).
    KubeProxyIpvs,
    None,
}

impl From<ProxyArg> for ProxyKind {
    fn from(p: ProxyArg) -> Self {
        match p {
            ProxyArg::Nftables => ProxyKind::Nftables,
            ProxyArg::Iptables => ProxyKind::Iptables,
            ProxyArg::Userspace => ProxyKind::Userspace,
            ProxyArg::Ipvs => ProxyKind::Ipvs,
            ProxyArg::KubeProxyIptables => ProxyKind::KubeProxyIptables,
            ProxyArg::KubeProxyNftables => ProxyKind::KubeProxyNftables,
            ProxyArg::KubeProxyIpvs => ProxyKind::KubeProxyIpvs,
            ProxyArg::None => ProxyKind::None,
        }
    }
}

#[derive(Subcommand)]
enum LabCommand {
    /// Create the namespaces, links, routes, pods (via the CNI plugin) and echo servers of a topology.
    Up {
        /// The topology file (YAML).
        topology: PathBuf,
        /// The proxy every node runs (overrides the topology's `proxy`).
        #[arg(long, value_enum)]
        proxy_mode: Option<ProxyArg>,
    },
    /// Remove everything a lab is made of (also after a crash).
    Down {
        /// The lab's name.
        lab: String,
    },
    /// Namespaces, pods, addresses and echo servers of a lab.
    Status {
        /// The lab's name.
        lab: String,
        /// Print the status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command inside one of the lab's namespaces.
    Exec {
        /// The lab's name.
        lab: String,
        /// `<node>`, `<node>/<pod>`, `out` or `sw`.
        target: String,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Stop a node's `weir proxy` and start it again (its rules stay in the kernel meanwhile).
    RestartProxy {
        /// The lab's name.
        lab: String,
        /// The node (default: every node).
        node: Option<String>,
        /// SIGKILL instead of SIGTERM (a crash).
        #[arg(long)]
        hard: bool,
    },
    /// Add a node (with pods) to a running lab: its namespace, Node object, `weir routes`, pods,
    /// echo servers and proxy; returns once every node's agent routes it.
    AddNode {
        /// The lab's name.
        lab: String,
        /// The node's name ([a-z0-9], at most 10).
        node: String,
        /// The node's pod CIDR (inside the lab's clusterCIDR, overlapping no other node's).
        #[arg(long, value_name = "CIDR")]
        pod_cidr: ipnet::Ipv4Net,
        /// Pods to create on it.
        #[arg(long, value_delimiter = ',', value_name = "POD,...")]
        pods: Vec<String>,
    },
    /// Remove a node from a running lab: its Node object first (every other node's `weir
    /// routes` drops its entries, waited for), then its pods, processes and namespaces.
    RemoveNode {
        /// The lab's name.
        lab: String,
        /// The node to remove.
        node: String,
    },
    /// Probe the connectivity matrix and the services (exit code 1 if any probe fails).
    Check {
        /// The lab's name.
        lab: String,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Bring up the built-in two-node lab, print the matrix, tear it down.
    Demo {
        /// Keep the lab running afterwards.
        #[arg(long)]
        keep: bool,
        /// Lab name (default: demo); set it to run several demos at once.
        #[arg(long)]
        name: Option<String>,
        /// Which CNI plugin creates the pods.
        #[arg(long, value_enum)]
        cni: Option<CniArg>,
        /// The proxy every node runs (default: nftables).
        #[arg(long, value_enum)]
        proxy_mode: Option<ProxyArg>,
        /// Which built-in topology to run.
        #[arg(long, value_enum, default_value = "default")]
        topology: TopologyArg,
        /// eni topology: take weir's fix away after the pods are added, to show the failure.
        #[arg(long)]
        no_eni_fix: bool,
        /// Print the matrix as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure the lab's cluster DNS (needs `dns:`): queries per pod lookup with and without
    /// `--autopath`, and many parallel getaddrinfo lookups through the DNS ClusterIP and
    /// through the node-local cache, with the nodes' conntrack clash counters.
    DnsMeasure {
        /// The lab's name.
        lab: String,
        /// Parallel lookups in total, per path.
        #[arg(long, default_value_t = 5000)]
        lookups: usize,
        /// How many run at once.
        #[arg(long, default_value_t = 100)]
        parallel: usize,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// getaddrinfo lookups of NAME from many threads here, as JSON (run by dns-measure inside
    /// a pod's namespace).
    #[command(hide = true)]
    DnsLookups {
        name: String,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        parallel: usize,
    },
    /// Serve `<name> <peer ip>` on TCP and UDP (run by the lab in every namespace).
    #[command(hide = true)]
    EchoServer {
        #[arg(long)]
        netns: Option<PathBuf>,
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = weir_lab::echo::ECHO_PORT)]
        port: u16,
    },
}

/// `weir` itself and `weir-cni` next to it (or `$WEIR_CNI`).
fn binaries() -> anyhow::Result<Binaries> {
    let weir = std::env::current_exe().context("cannot locate the weir binary")?;
    let weir_cni = match std::env::var_os("WEIR_CNI").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => weir.with_file_name("weir-cni"),
    };
    Ok(Binaries { weir, weir_cni })
}

fn progress(line: &str) {
    eprintln!("{line}");
}

pub fn run(args: LabArgs) -> anyhow::Result<ExitCode> {
    let root = state_root();
    match args.command {
        LabCommand::Up {
            topology,
            proxy_mode,
        } => up(&topology, proxy_mode, &root),
        LabCommand::RestartProxy {
            lab: name,
            node,
            hard,
        } => restart_proxy(&name, node, hard, &root),
        LabCommand::Down { lab: name } => down(&name, &root),
        LabCommand::Status { lab: name, json } => status(&name, json, &root),
        LabCommand::Exec {
            lab: name,
            target,
            command,
        } => exec(&name, &target, &command),
        LabCommand::AddNode {
            lab: name,
            node,
            pod_cidr,
            pods,
        } => add_node(&name, &node, pod_cidr, &pods, &root),
        LabCommand::RemoveNode { lab: name, node } => remove_node(&name, &node, &root),
        LabCommand::DnsMeasure {
            lab: name,
            lookups,
            parallel,
            json,
        } => dns_measure(&name, lookups, parallel, json, &root),
        LabCommand::DnsLookups {
            name,
            count,
            parallel,
        } => {
            let stats = weir_lab::dns_measure::lookups(&name, count, parallel);
            outln!("{}", serde_json::to_string(&stats)?);
            Ok(ExitCode::SUCCESS)
        }
        LabCommand::Check { lab: name, json } => {
            let state = lab::load_state(&name, &root)?;
            Ok(check(&state, json))
        }
        LabCommand::Demo {
            keep,
            name,
            cni,
            proxy_mode,
            topology,
            no_eni_fix,
            json,
        } => {
            let topo = demo_topology(topology, no_eni_fix)?;
            demo(topo, keep, name, cni, proxy_mode, json, &root)
        }
        LabCommand::EchoServer { netns, name, port } => {
            weir_lab::echo::serve(netns.as_deref(), &name, port)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn up(topology: &Path, proxy_mode: Option<ProxyArg>, root: &Path) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(topology)
        .with_context(|| format!("read {}", topology.display()))?;
    let mut topo =
        Topology::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", topology.display()))?;
    if let Some(p) = proxy_mode {
        topo.proxy = p.into();
    }
    let state = lab::up(&topo, &binaries()?, root, &mut progress)?;
    eprintln!(
        "lab {} is up: {} nodes, {} pods, {} services, proxy {} (state in {})",
        state.lab,
        state.nodes.len(),
        state.pods.len(),
        state.services.len(),
        state.proxy.as_str(),
        root.join(&state.lab).display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Restarts the proxy of `node`, or of every node.
fn restart_proxy(
    name: &str,
    node: Option<String>,
    hard: bool,
    root: &Path,
) -> anyhow::Result<ExitCode> {
    let state = lab::load_state(name, root)?;
    let nodes: Vec<String> = match node {
        Some(n) => vec![n],
        None => state.nodes.iter().map(|n| n.name.clone()).collect(),
    };
    let bins = binaries()?;
    for n in nodes {
        let r = lab::restart_proxy(name, &n, hard, &bins, root)?;
        eprintln!(
            "node {}: weir proxy {} → pid {}, healthy after {} ms",
            r.node,
            r.old_pid
                .map(|p| format!("pid {p} {}", if hard { "killed" } else { "stopped" }))
                .unwrap_or_else(|| "was not running".into()),
            r.new_pid,
            r.ready_after.as_millis()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn down(name: &str, root: &Path) -> anyhow::Result<ExitCode> {
    let report = lab::down(name, &binaries()?, root, &mut progress)?;
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    if report.namespaces.is_empty() && !report.state_removed {
        eprintln!("lab {name}: nothing to remove");
    } else {
        eprintln!(
            "lab {name} is down: {} namespaces, {} processes, {} pods deleted via CNI",
            report.namespaces.len(),
            report.killed.len(),
            report.cni_deleted
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The status table (and the services, when the lab has any) or its JSON.
fn status(name: &str, json: bool, root: &Path) -> anyhow::Result<ExitCode> {
    let rows = lab::status(name, root)?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        out!("{}", lab::render_status(&rows));
        if let Ok(state) = lab::load_state(name, root) {
            if !state.services.is_empty() {
                outln!();
                out!("{}", lab::render_services(&state));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Replaces this process with `command` inside the target's network namespace.
fn exec(name: &str, target: &str, command: &[String]) -> anyhow::Result<ExitCode> {
    let ns_name = lab::target_netns(name, target)?;
    let ns = weir_kernel_netns(&ns_name)?;
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("enter netns {ns_name}"))?;
    let err = std::process::Command::new(&command[0])
        .args(&command[1..])
        .exec();
    bail!("exec {}: {err}", command[0])
}

fn add_node(
    name: &str,
    node: &str,
    pod_cidr: ipnet::Ipv4Net,
    pods: &[String],
    root: &Path,
) -> anyhow::Result<ExitCode> {
    let t = std::time::Instant::now();
    let n = lab::add_node(name, node, pod_cidr, pods, &binaries()?, root)?;
    eprintln!(
        "lab {name}: node {node} joined ({} eth0 {}, podCIDR {pod_cidr}, {} pods); every node routes it ({} ms)",
        n.netns,
        n.underlay_ip,
        pods.len(),
        t.elapsed().as_millis()
    );
    Ok(ExitCode::SUCCESS)
}

fn remove_node(name: &str, node: &str, root: &Path) -> anyhow::Result<ExitCode> {
    let t = std::time::Instant::now();
    lab::remove_node(name, node, &binaries()?, root)?;
    eprintln!(
        "lab {name}: node {node} left; no other node routes it any more ({} ms)",
        t.elapsed().as_millis()
    );
    Ok(ExitCode::SUCCESS)
}

fn dns_measure(
    name: &str,
    lookups: usize,
    parallel: usize,
    json: bool,
    root: &Path,
) -> anyhow::Result<ExitCode> {
    let state = lab::load_state(name, root)?;
    let dir = weir_lab::state::LabDir::new(root, name);
    let report = weir_lab::dns_measure::measure(
        &binaries()?.weir,
        &dir,
        &state,
        lookups,
        parallel,
        &mut progress,
    )?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        out!("{}", weir_lab::dns_measure::render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// The demo's topology; `--no-eni-fix` only with the eni one.
fn demo_topology(topology: TopologyArg, no_eni_fix: bool) -> anyhow::Result<Topology> {
    let mut topo = match topology {
        TopologyArg::Default => Topology::default_demo(),
        TopologyArg::Eni => Topology::eni_demo(),
        TopologyArg::Vxlan => Topology::vxlan_demo(),
        TopologyArg::DualStack => Topology::dual_stack_demo(),
        TopologyArg::Policy => Topology::policy_demo(),
        TopologyArg::PolicyEni => Topology::policy_eni_demo(),
    };
    if no_eni_fix {
        if topo.network != Network::Eni {
            bail!("--no-eni-fix needs --topology eni");
        }
        topo.eni_fix = false;
    }
    Ok(topo)
}

fn weir_kernel_netns(name: &str) -> anyhow::Result<std::fs::File> {
    let path = weir_lab::ns::path(name);
    std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))
}

/// The matrix and the service probes, run at the same time; table or JSON
/// (`{"matrix": [...], "services": [...], "proxies": [...], "routes": [...]}`).
/// Each agent process (`node`, `pid`, `alive`) and whether all are alive.
fn agents_json(agents: &[weir_lab::state::ProxyState]) -> (Vec<serde_json::Value>, bool) {
    let rows: Vec<serde_json::Value> = agents
        .iter()
        .map(|a| {
            serde_json::json!({
                "node": a.node,
                "pid": a.pid,
                "alive": weir_lab::ns::alive(a.pid),
            })
        })
        .collect();
    let ok = rows.iter().all(|a| a["alive"] == true);
    (rows, ok)
}

/// The matrix's probes and the service probes. With policies every matrix row carries the
/// oracle's verdict on the lab's objects and the policy rows probe the Services, so the
/// open network's service probes (everything answers) are not planned.
fn plan_probes(
    state: &weir_lab::LabState,
    lab_dir: &weir_lab::state::LabDir,
) -> anyhow::Result<(Vec<matrix::Probe>, Vec<services::SvcProbe>)> {
    let mut probes = matrix::plan(state);
    if state.policy_agents.is_empty() {
        return Ok((probes, services::plan(state)));
    }
    let cluster = netpol::load_cluster(&lab_dir.manifests())?;
    netpol::expect(&cluster, state, &mut probes);
    probes.extend(netpol::service_rows(&cluster, state));
    Ok((probes, Vec::new()))
}

fn check(state: &weir_lab::LabState, json: bool) -> ExitCode {
    let lab_dir = weir_lab::state::LabDir::new(&state_root(), &state.lab);
    let policy = !state.policy_agents.is_empty();
    let (probes, svc_probes) = match plan_probes(state, &lab_dir) {
        Ok(p) => p,
        Err(e) => {
            outln!("FAIL: the lab's policy objects: {e:#}");
            return ExitCode::from(1);
        }
    };
    let (results, svc_results) = std::thread::scope(|s| {
        let m = s.spawn(|| matrix::run(&probes));
        let svc = services::run(&svc_probes);
        (m.join().expect("matrix thread"), svc)
    });
    let (proxies, proxies_ok) = agents_json(&state.proxies);
    let (routes, routes_ok) = agents_json(&state.routes);
    let (policy_agents, policy_ok) = agents_json(&state.policy_agents);
    let dns = weir_lab::dns::load(&lab_dir).map(|d| {
        let results = weir_lab::dns::run(&weir_lab::dns::plan(state, &d), &d, &lab_dir);
        (d, results)
    });
    let dns_ok = dns.as_ref().is_none_or(|(_, r)| r.iter().all(|r| r.ok));
    // eni network: what strict rp_filter and the VPC's source check dropped so far.
    let counters = (state.network == Network::Eni).then(|| eni::counters(state));
    if json {
        let mut out = serde_json::json!({
            "matrix": results,
            "services": svc_results,
            "proxies": proxies,
            "routes": routes,
        });
        if policy {
            out["policy_agents"] = serde_json::Value::Array(policy_agents.clone());
        }
        if let Some(c) = &counters {
            out["eni"] = serde_json::to_value(c).expect("counters serialize");
        }
        if let Some((_, r)) = &dns {
            out["dns"] = serde_json::to_value(r).expect("dns results serialize");
        }
        outln!(
            "{}",
            serde_json::to_string_pretty(&out).expect("results serialize")
        );
    } else {
        out!("{}", matrix::render_matrix(&results));
        outln!("{}", matrix::summary(&results));
        outln!();
        match state.proxy.mode() {
            _ if policy => outln!(
                "{} services probed by the policy rows (cluster-ip, node-port); every \
                 EXPECTED is weir-policy's oracle on the objects in {}",
                state.services.len(),
                lab_dir.manifests().display()
            ),
            None if !state.services.is_empty() => {
                outln!(
                    "{} services not probed: the lab runs no proxy (proxy: none)",
                    state.services.len()
                )
            }
            None => {}
            Some(_) => {
                if !svc_results.is_empty() {
                    out!("{}", services::render(state, &svc_results));
                }
                outln!(
                    "{} ({})",
                    services::summary(&svc_results),
                    state.proxy.describe()
                );
            }
        }
        if let Some(c) = &counters {
            let rp: Vec<String> = c
                .rp_filter
                .iter()
                .map(|(node, n)| format!("node {node} {n}"))
                .collect();
            outln!(
                "eni: strict rp_filter drops (TcpExtIPReversePathFilter): {}; VPC source-check drops: {}",
                rp.join(", "),
                c.source_check
            );
        }
        if let Some((d, r)) = &dns {
            outln!();
            out!("{}", weir_lab::dns::render(r));
            outln!("{}", weir_lab::dns::summary(r, d));
        }
        for (agent, rows) in [
            ("proxy", &proxies),
            ("routes", &routes),
            ("policy", &policy_agents),
        ] {
            for a in rows.iter().filter(|a| a["alive"] != true) {
                outln!(
                    "FAIL: weir {agent} on node {} (pid {}) is not running",
                    a["node"],
                    a["pid"]
                );
            }
        }
    }
    if results.iter().all(|r| r.ok)
        && svc_results.iter().all(|r| r.ok)
        && proxies_ok
        && routes_ok
        && policy_ok
        && dns_ok
    {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn demo(
    mut topo: Topology,
    keep: bool,
    name: Option<String>,
    cni: Option<CniArg>,
    proxy_mode: Option<ProxyArg>,
    json: bool,
    root: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    if let Some(name) = name {
        topo.name = name;
    }
    if let Some(cni) = cni {
        topo.cni = match cni {
            CniArg::Weir => CniKind::Weir,
            CniArg::Reference => CniKind::Reference,
        };
    }
    if let Some(p) = proxy_mode {
        topo.proxy = p.into();
    }
    // Without a proxy nothing routes the DNS Service's ClusterIP.
    if topo.proxy.mode().is_none() {
        topo.dns = weir_lab::topology::Dns::Off;
    }
    topo.validate()?;
    let bins = binaries()?;
    let teardown = |bins: &Binaries| -> anyhow::Result<()> {
        let report = lab::down(&topo.name, bins, root, &mut progress)?;
        for w in &report.warnings {
            eprintln!("warning: {w}");
        }
        eprintln!(
            "lab {} torn down ({} namespaces)",
            topo.name,
            report.namespaces.len()
        );
        Ok(())
    };
    let state = match lab::up(&topo, &bins, root, &mut progress) {
        Ok(s) => s,
        Err(e) => {
            if !keep {
                if let Err(d) = teardown(&bins) {
                    eprintln!("warning: teardown failed: {d:#}");
                }
            }
            return Err(e.context(format!("demo lab {} did not come up", topo.name)));
        }
    };
    let code = check(&state, json);
    if keep {
        eprintln!(
            "lab {} kept; try `weir lab exec {} a/a1 -- ip route`, remove it with `weir lab down {}`",
            topo.name, topo.name, topo.name
        );
    } else {
        teardown(&bins)?;
    }
    Ok(code)
}
