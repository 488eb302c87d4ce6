//! Pieces of generated plans shared by the proxy's count tests, the scale bench and the
//! nft_full_sync example (included by `#[path]` where `tests/common` as a whole is not).

// Each includer uses its own part.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};

use weir_model::{EndpointSet, Frontend, FrontendKind, Masquerade, Verdict};

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
