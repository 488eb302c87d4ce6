//! Chain names, computed exactly as kube-proxy computes them so that `iptables-save` on a
//! weir node reads like one on a kube-proxy node (and runbooks, dashboards and scripts that
//! grep for a service's `KUBE-SVC-…` chain keep working).
//!
//! kube-proxy: `base32(sha256(servicePortName + protocol))[..16]`, standard (upper-case)
//! alphabet, where `servicePortName` is `namespace/name` plus `:portname` when the port is
//! named and `protocol` is lower case. Endpoint chains hash `… + "ip:port"` as well
//! (`[v6]:port`, Go's `net.JoinHostPort`). The IP family is not part of the name: IPv4 and
//! IPv6 rules live in different tables (iptables / ip6tables).

use std::net::IpAddr;

use data_encoding::BASE32_NOPAD;
use sha2::{Digest, Sha256};
use weir_model::{Endpoint, ServicePortKey};

/// kube-proxy's `ServicePortName.String()`: `namespace/name[:port]`.
pub fn service_port_name(key: &ServicePortKey) -> String {
    if key.port_name.is_empty() {
        format!("{}/{}", key.namespace, key.name)
    } else {
        format!("{}/{}:{}", key.namespace, key.name, key.port_name)
    }
}

/// The first 16 characters of base32(sha256(`s`)), upper case.
fn hash16(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    // Padding only affects the tail, which is cut off: NOPAD equals Go's StdEncoding here.
    BASE32_NOPAD.encode(&digest)[..16].to_string()
}

/// kube-proxy's `portProtoHash`.
pub fn port_proto_hash(key: &ServicePortKey) -> String {
    hash16(&format!(
        "{}{}",
        service_port_name(key),
        key.protocol.as_str()
    ))
}

/// `ip:port`, or `[ip]:port` for IPv6 (Go's `net.JoinHostPort`).
pub fn endpoint_string(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// The per-service-port chains of kube-proxy's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChains {
    /// `KUBE-SVC-…`: balances over the cluster endpoints.
    pub svc: String,
    /// `KUBE-SVL-…`: balances over the local endpoints (traffic policy Local).
    pub svl: String,
    /// `KUBE-EXT-…`: external frontends (NodePort, externalIPs, LB): masquerade and
    /// policy-Local short-circuits, then SVC or SVL.
    pub ext: String,
    /// `KUBE-FW-…`: loadBalancerSourceRanges in front of EXT.
    pub fw: String,
}

impl ServiceChains {
    pub fn of(key: &ServicePortKey) -> Self {
        let h = port_proto_hash(key);
        ServiceChains {
            svc: format!("KUBE-SVC-{h}"),
            svl: format!("KUBE-SVL-{h}"),
            ext: format!("KUBE-EXT-{h}"),
            fw: format!("KUBE-FW-{h}"),
        }
    }
}

/// `KUBE-SEP-…` of one endpoint of a service port.
pub fn endpoint_chain(key: &ServicePortKey, ep: &Endpoint) -> String {
    format!(
        "KUBE-SEP-{}",
        hash16(&format!(
            "{}{}{}",
            service_port_name(key),
            key.protocol.as_str(),
            endpoint_string(ep.ip, ep.port)
        ))
    )
}

/// Prefixes of the chains that exist per service port or endpoint. A full sync deletes
/// every chain with one of these prefixes that the plan no longer uses (kube-proxy's
/// `isServiceChainName`).
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

pub fn is_service_chain(name: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| name.starts_with(p))
}
