//! weir-routes: the node agent's routes to the other nodes' pods (flanneld's job).
//!
//! From the Node objects (`spec.podCIDRs`, `status.addresses`, the VTEP annotations) and this
//! node's name, [`plan::desire`] computes the complete desired state as data: for `host-gw`,
//! `<podCIDR> via <nodeIP>`; for `vxlan`, one VTEP device plus, per remote node, a permanent
//! neighbour entry for its gateway address, a permanent FDB entry for its VTEP MAC and the route
//! `<podCIDR> via <gw> dev <vtep> onlink`. [`diff::diff`] compares it with what the kernel has
//! ([`kernel::observe`]) and yields the few operations that close the gap; [`kernel::apply`]
//! carries them out. Nothing is ever flushed: a restart with everything right does nothing, and
//! entries weir did not make are never touched.
//!
//! Ownership: weir's routes carry the route protocol [`ROUTE_PROTOCOL`] (`ip route … proto 87`);
//! neighbour and FDB entries are weir's because they live on weir's own VTEP device.

pub mod agent;
pub mod annotations;
pub mod diff;
pub mod kernel;
pub mod node;
pub mod plan;

pub use annotations::Annotations;
pub use diff::{diff, Op};
pub use node::NodeFacts;
pub use plan::{desire, Backend, Config, Desired, Local, NodeStatus, Underlay, VxlanConfig};

/// The route protocol number marking weir's routes (`proto 87`, ASCII `W`). Chosen outside the
/// numbers iproute2 names (0–18, 42, 99, 186–192) and the ones other Kubernetes network agents
/// are known to use (Calico's 80), so `ip route show proto 87` lists exactly weir's routes.
pub const ROUTE_PROTOCOL: u8 = 87;

/// Where `weir routes` writes the pod MTU (the VTEP's, one decimal line) and weir-cni reads it
/// when its conflist sets no `mtu`: like flannel's `/run/flannel/subnet.env` (`FLANNEL_MTU`).
pub const MTU_FILE: &str = "/run/weir/routes/mtu";

/// A MAC address.
pub type Mac = [u8; 6];

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &Mac) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff` (either case).
pub fn parse_mac(s: &str) -> Option<Mac> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in mac.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}
