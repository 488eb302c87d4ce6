//! What the three renderers share: their input, the service ports as upstream's proxiers see
//! them (with upstream's chain-name hash) and the nat rules common to iptables and ipvs modes.

use std::net::Ipv4Addr;

use anyhow::bail;
use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

use crate::manifests::{NAMESPACE, PORT_NAME};
use crate::state::{LabState, NodeState, ServiceState};

/// kube-proxy's `--iptables-masquerade-bit` 14: the mark that asks for SNAT.
pub const MASQ_MARK: &str = "0x4000";
/// The dummy link kube-proxy's ipvs mode binds every service IP to.
pub const IPVS_DUMMY: &str = "kube-ipvs0";

/// What every renderer needs: the lab's services and pods, the node rendered for, and the
/// `--cluster-cidr` (pod traffic is not masqueraded to ClusterIPs; everything else is).
pub struct Input<'a> {
    pub state: &'a LabState,
    pub node: &'a NodeState,
    pub cluster_cidr: Ipv4Net,
    pub service_cidr: Ipv4Net,
}

/// One service port as the proxiers see it.
pub(super) struct Port<'a> {
    pub(super) svc: &'a ServiceState,
    /// `default/web:echo`, upstream's ServicePortName.
    pub(super) name: String,
    pub(super) proto: &'static str,
    pub(super) endpoints: Vec<Ipv4Addr>,
    /// The endpoints on the node rendered for (externalTrafficPolicy Local).
    pub(super) local: Vec<Ipv4Addr>,
}

impl Port<'_> {
    /// upstream `portProtoHash`.
    pub(super) fn hash(&self) -> String {
        let digest = Sha256::digest(format!("{}{}", self.name, self.proto));
        data_encoding::BASE32.encode(&digest)[..16].to_string()
    }
    /// The addresses reached from outside: the LoadBalancer IP.
    pub(super) fn external_ips(&self) -> Vec<Ipv4Addr> {
        self.svc.load_balancer_ip.into_iter().collect()
    }
    pub(super) fn has_external(&self) -> bool {
        self.svc.node_port.is_some() || self.svc.load_balancer_ip.is_some()
    }
    /// The endpoints external traffic may reach.
    pub(super) fn external_endpoints(&self) -> &[Ipv4Addr] {
        if self.svc.local_policy() {
            &self.local
        } else {
            &self.endpoints
        }
    }
}

pub(super) fn ports<'a>(input: &Input<'a>) -> anyhow::Result<Vec<Port<'a>>> {
    input
        .state
        .services
        .iter()
        .map(|svc| {
            if svc.sticky() {
                bail!(
                    "service {}: sessionAffinity ClientIP is outside the kube-proxy-shaped subset",
                    svc.name
                );
            }
            let pods: Vec<_> = svc
                .backends
                .iter()
                .filter_map(|b| input.state.pods.iter().find(|p| &p.name == b))
                .collect();
            Ok(Port {
                svc,
                name: format!("{NAMESPACE}/{}:{PORT_NAME}", svc.name),
                proto: svc.protocol.as_str(),
                endpoints: pods.iter().map(|p| p.ip).collect(),
                local: pods
                    .iter()
                    .filter(|p| p.node == input.node.name)
                    .map(|p| p.ip)
                    .collect(),
            })
        })
        .collect()
}

/// The built-in chains' jumps into kube-proxy's nat chains (iptables and ipvs modes).
pub(super) fn nat_base_jumps() -> String {
    "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
     -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
     -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n"
        .to_string()
}

/// KUBE-POSTROUTING (after `first`, ipvs mode's hairpin rule) and KUBE-MARK-MASQ, identical in
/// upstream's iptables and ipvs modes.
pub(super) fn postrouting_and_mark(first: &str) -> String {
    format!(
        "{first}-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}\n"
    )
}

/// The eni demo's lab state, rendered for node a (tests of every renderer).
#[cfg(test)]
pub(super) fn eni_input<T>(f: impl FnOnce(&Input) -> T) -> T {
    let topo = crate::topology::Topology::eni_demo();
    let state = LabState::simulated(&topo);
    let input = Input {
        state: &state,
        node: &state.nodes[0],
        cluster_cidr: topo.cluster_cidr,
        service_cidr: topo.service_cidr,
    };
    f(&input)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::ServiceType;

    #[test]
    fn chain_names_use_upstreams_hash() {
        // pkg/proxy/iptables/proxier_test.go: servicePortChainName("ns1/svc1:p80", "tcp")
        let svc = ServiceState {
            name: "svc1".into(),
            kind: ServiceType::ClusterIP,
            protocol: crate::topology::Protocol::Tcp,
            port: 80,
            cluster_ip: Ipv4Addr::new(10, 96, 0, 1),
            cluster_ip6: None,
            node_port: None,
            health_check_node_port: None,
            load_balancer_ip: None,
            load_balancer_node: None,
            external_traffic_policy: Default::default(),
            session_affinity: Default::default(),
            backends: vec![],
        };
        let p = Port {
            svc: &svc,
            name: "ns1/svc1:p80".into(),
            proto: "tcp",
            endpoints: vec![],
            local: vec![],
        };
        assert_eq!(p.hash(), "XPGD46QRK7WJZT7O");
    }
}
