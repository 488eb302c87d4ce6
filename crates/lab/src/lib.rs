//! weir-lab: a cluster simulated with network namespaces on one machine.
//!
//! A lab is an underlay switch (`wl-<lab>-sw`, a bridge), an outside world (`wl-<lab>-out`, the
//! nodes' default router with an "internet" address on its `lo`), nodes (`wl-<lab>-<node>`) and
//! pods (`wl-<lab>-<node>-<pod>`, whose interfaces a real CNI plugin creates). Every pod, node and
//! the outside run an echo server that answers with its name and the peer address it saw; the
//! connectivity [`matrix`] probes them all. Every node runs `weir proxy` ([`proxy`]) over the
//! lab's Kubernetes objects ([`manifests`]), and the [`services`] probes check what it serves.

pub mod cni;
pub mod dns;
pub mod dns_measure;
pub mod echo;
pub mod eni;
pub mod kube_proxy;
pub mod lab;
pub mod manifests;
pub mod matrix;
pub mod ns;
pub mod proxy;
pub mod routes;
pub mod services;
pub mod state;
pub mod topology;

pub use lab::{down, status, up, Binaries, DownReport, StatusRow};
pub use state::{state_root, LabState};
pub use topology::{
    CniKind, Network, Overlay, ProxyKind, Topology, TopologyError, DEFAULT_TOPOLOGY, ENI_TOPOLOGY,
    VXLAN_TOPOLOGY,
};

/// How long the lab waits for its agents and servers to start: `base` times
/// `WEIR_LAB_TIMEOUT_SCALE` (a whole number, default 1). Under software emulation (the qemu VM
/// of docs/vm.md, on a loaded machine) starting a process takes many times longer than here;
/// the VM tests set 8 rather than every constant growing for everyone.
pub fn startup_timeout(base: std::time::Duration) -> std::time::Duration {
    base * timeout_scale(std::env::var("WEIR_LAB_TIMEOUT_SCALE").ok().as_deref())
}

/// The factor of [`startup_timeout`]: a whole number from 1 to 20; anything else is 1.
fn timeout_scale(value: Option<&str>) -> u32 {
    value
        .and_then(|v| v.trim().parse().ok())
        .filter(|f| (1..=20).contains(f))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn timeout_scale_is_a_small_whole_number_or_one() {
        use super::timeout_scale;
        assert_eq!(timeout_scale(None), 1);
        assert_eq!(timeout_scale(Some("4")), 4);
        assert_eq!(timeout_scale(Some(" 3\n")), 3);
        for bad in ["0", "-2", "1.5", "x", "", "21"] {
            assert_eq!(timeout_scale(Some(bad)), 1, "{bad:?}");
        }
    }
}
