//! Reporting on a lab: its namespaces, echo servers and services, and its saved state.

use std::path::Path;

use anyhow::{anyhow, bail, Context};

use crate::names::{self, NsRole};
use crate::ns;
use crate::state::{LabDir, LabState};

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
            (Some(NsRole::Outside), Some(s)) => ("outside".into(), with6(s.outside, s.outside6)),
            (Some(NsRole::Outside), None) => ("outside".into(), "?".into()),
            (Some(NsRole::Node(node)), s) => (
                format!("node {node}"),
                s.as_ref()
                    .and_then(|s| s.nodes.iter().find(|x| &x.name == node))
                    .map(|x| with6(x.underlay_ip, x.underlay_ip6))
                    .unwrap_or_else(|| "?".into()),
            ),
            (Some(NsRole::Pod { node, pod }), s) => (
                format!("pod {node}/{pod}"),
                s.as_ref()
                    .and_then(|s| s.pods.iter().find(|x| &x.name == pod))
                    .map(|x| {
                        let v4 = format!("{}/{}", x.ip, x.prefix_len);
                        with6(v4, x.ip6)
                    })
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
    crate::table::render_table(
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

/// An address and, in a dual-stack lab, its IPv6 twin: `10.244.1.2/24,fd00:10:244:1::2`.
fn with6(v4: impl std::fmt::Display, v6: Option<std::net::Ipv6Addr>) -> String {
    match v6 {
        Some(v6) => format!("{v4},{v6}"),
        None => v4.to_string(),
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
                with6(s.cluster_ip, s.cluster_ip6),
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
    crate::table::render_table(
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
