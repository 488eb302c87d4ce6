//! Pieces of generated plans shared by the proxy's count tests, the scale bench and the
//! nft_full_sync example (included by `#[path]` where `tests/common` as a whole is not).

// Each includer uses its own part.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};

use weir_model::{
    Endpoint, EndpointSet, Frontend, FrontendKind, IpFamily, Masquerade, Protocol, ServicePortKey,
    ServicePortPlan, TopologyMode, Verdict,
};

/// `base` + `offset`, for generating address ranges.
pub fn add(base: Ipv4Addr, offset: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + offset as u32)
}

/// A forwarding frontend over the cluster endpoints, masqueraded as the planner does with a
/// cluster CIDR: ClusterIP traffic from outside the cluster, external traffic (policy
/// Cluster) always.
pub fn frontend(kind: FrontendKind, addr: Option<IpAddr>, port: u16) -> Frontend {
    Frontend {
        kind,
        addr,
        port,
        endpoints: EndpointSet::Cluster,
        verdict: Verdict::Forward,
        masquerade: if kind == FrontendKind::ClusterIp {
            Masquerade::OffCluster
        } else {
            Masquerade::Always
        },
        short_circuit: false,
        source_ranges: None,
    }
}

/// Service port `i` of the agent bench's shape in `namespace`: a ClusterIP 10.96.0.1 + i on
/// port 80, every 10th also a NodePort (while the NodePort range lasts), and 10 ready
/// endpoints on another node from 10.128.0.1 + 10 i, port 8080.
pub fn bench_service(namespace: &str, i: usize) -> (ServicePortKey, ServicePortPlan) {
    let key = ServicePortKey {
        namespace: namespace.into(),
        name: format!("svc-{i:05}").into(),
        port_name: "".into(),
        protocol: Protocol::Tcp,
        family: IpFamily::V4,
    };
    let mut frontends = vec![frontend(
        FrontendKind::ClusterIp,
        Some(IpAddr::V4(add(Ipv4Addr::new(10, 96, 0, 1), i))),
        80,
    )];
    if i.is_multiple_of(10) && i / 10 < 2768 {
        frontends.push(frontend(
            FrontendKind::NodePort,
            None,
            30000 + (i / 10) as u16,
        ));
    }
    let cluster_endpoints = (0..10)
        .map(|j| Endpoint {
            ip: IpAddr::V4(add(Ipv4Addr::new(10, 128, 0, 1), i * 10 + j)),
            port: 8080,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
        })
        .collect();
    let sp = ServicePortPlan {
        port: 80,
        frontends,
        cluster_endpoints,
        local_endpoints: Vec::new(),
        affinity_timeout: None,
        internal_policy_local: false,
        external_policy_local: false,
        health_check_node_port: None,
        topology: TopologyMode::None,
        has_any_endpoints: true,
    };
    (key, sp)
}
