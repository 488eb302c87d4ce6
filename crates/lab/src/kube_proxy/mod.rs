//! Upstream kube-proxy's rule shapes, rendered from a lab's services as static rules: a test
//! fixture standing in for another product, so the lab can show that a datapath (eni-shared mode)
//! holds for kube-proxy itself and not only for `weir proxy`.
//!
//! Each renderer follows one upstream proxier (kubernetes `pkg/proxy/<mode>/proxier.go`, v1.31)
//! in the parts that decide a packet's path: where the DNAT happens, which traffic gets the
//! masquerade mark 0x4000 and where it is turned into MASQUERADE. It is a subset, written out
//! once when the lab comes up: no sync loop, no ClientIP affinity, no firewall (source ranges),
//! no healthz server, no metrics. Chain names use upstream's hashing
//! (`base32(sha256(servicePortName + protocol))[:16]`).
//!
//! Rendering is pure ([`iptables::render`], [`nftables::render`], [`ipvs::render`]); [`install`]
//! applies the result inside a node's namespace.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

use crate::manifests::{NAMESPACE, PORT_NAME};
use crate::state::{LabState, NodeState, ServiceState};

pub mod iptables;
pub mod ipvs;
pub mod nftables;

/// kube-proxy's `--iptables-masquerade-bit` 14: the mark that asks for SNAT.
pub const MASQ_MARK: &str = "0x4000";
/// The dummy link kube-proxy's ipvs mode binds every service IP to.
pub const IPVS_DUMMY: &str = "kube-ipvs0";

/// Which upstream proxier is imitated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
    Ipvs,
}

/// What every renderer needs: the lab's services and pods, the node rendered for, and the
/// `--cluster-cidr` (pod traffic is not masqueraded to ClusterIPs; everything else is).
pub struct Input<'a> {
    pub state: &'a LabState,
    pub node: &'a NodeState,
    pub cluster_cidr: Ipv4Net,
    pub service_cidr: Ipv4Net,
}

/// One service port as the proxiers see it.
struct Port<'a> {
    svc: &'a ServiceState,
    /// `default/web:echo`, upstream's ServicePortName.
    name: String,
    proto: &'static str,
    endpoints: Vec<Ipv4Addr>,
    /// The endpoints on the node rendered for (externalTrafficPolicy Local).
    local: Vec<Ipv4Addr>,
}

impl Port<'_> {
    /// upstream `portProtoHash`.
    fn hash(&self) -> String {
        let digest = Sha256::digest(format!("{}{}", self.name, self.proto));
        data_encoding::BASE32.encode(&digest)[..16].to_string()
    }
    /// The addresses reached from outside: the LoadBalancer IP.
    fn external_ips(&self) -> Vec<Ipv4Addr> {
        self.svc.load_balancer_ip.into_iter().collect()
    }
    fn has_external(&self) -> bool {
        self.svc.node_port.is_some() || self.svc.load_balancer_ip.is_some()
    }
    /// The endpoints external traffic may reach.
    fn external_endpoints(&self) -> &[Ipv4Addr] {
        if self.svc.local_policy() {
            &self.local
        } else {
            &self.endpoints
        }
    }
}

fn ports<'a>(input: &Input<'a>) -> anyhow::Result<Vec<Port<'a>>> {
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
fn nat_base_jumps() -> String {
    "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
     -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
     -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n"
        .to_string()
}

/// KUBE-POSTROUTING (after `first`, ipvs mode's hairpin rule) and KUBE-MARK-MASQ, identical in
/// upstream's iptables and ipvs modes.
fn postrouting_and_mark(first: &str) -> String {
    format!(
        "{first}-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}\n"
    )
}

/// Runs `args` inside `netns` with `stdin`, failing with its stderr.
fn run_in(netns: &str, args: &[&str], stdin: &str) -> anyhow::Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", args[0]))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{} in {netns}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Renders `mode`'s rules for `input.node` and loads them into its namespace.
pub fn install(mode: Mode, input: &Input) -> anyhow::Result<()> {
    let netns = input.node.netns.as_str();
    match mode {
        Mode::Iptables => run_in(
            netns,
            &["iptables-restore", "--noflush"],
            &iptables::render(input)?,
        ),
        Mode::Nftables => run_in(netns, &["nft", "-f", "-"], &nftables::render(input)?),
        Mode::Ipvs => {
            let r = ipvs::render(input)?;
            let mut links = format!("link add {IPVS_DUMMY} type dummy\n");
            for a in &r.addresses {
                let _ = writeln!(links, "address add {a}/32 dev {IPVS_DUMMY}");
            }
            run_in(netns, &["ip", "-b", "-"], &links)?;
            run_in(netns, &["ipset", "restore"], &r.ipset)?;
            run_in(netns, &["ipvsadm", "-R"], &r.ipvsadm)?;
            // one process for all of them: every exec counts in the test VM
            let mut args = vec!["sysctl".to_string(), "-qw".to_string()];
            args.extend(r.sysctls.iter().map(|(k, v)| format!("{k}={v}")));
            run_in(
                netns,
                &args.iter().map(String::as_str).collect::<Vec<_>>(),
                "",
            )?;
            run_in(netns, &["iptables-restore", "--noflush"], &r.iptables)
        }
    }
}

/// The eni demo's lab state, rendered for node a (tests of every renderer).
#[cfg(test)]
fn eni_input<T>(f: impl FnOnce(&Input) -> T) -> T {
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
    use crate::topology::{ServiceType, Topology};

    #[test]
    fn chain_names_use_upstreams_hash() {
        // pkg/proxy/iptables/proxier_test.go: servicePortChainName("ns1/svc1:p80", "tcp")
        let svc = ServiceState {
            name: "svc1".into(),
            kind: ServiceType::ClusterIP,
            protocol: crate::topology::Protocol::Tcp,
            port: 80,
            cluster_ip: Ipv4Addr::new(10, 96, 0, 1),
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

    #[test]
    fn client_ip_affinity_is_refused_clearly() {
        let mut topo = Topology::default_demo();
        topo.services[0].session_affinity = crate::topology::SessionAffinity::ClientIP;
        let state = LabState::simulated(&topo);
        let input = Input {
            state: &state,
            node: &state.nodes[0],
            cluster_cidr: topo.cluster_cidr,
            service_cidr: topo.service_cidr,
        };
        let e = nftables::render(&input).unwrap_err().to_string();
        assert!(e.contains("service web: sessionAffinity ClientIP"), "{e}");
    }
}
