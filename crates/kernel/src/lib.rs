//! weir-kernel: the only place weir talks to the kernel's network configuration.
//!
//! Everything here is synchronous on purpose: the CNI plugin is exec'd once per pod and must start
//! fast, and network namespaces are per *thread*, which async executors hide from us. Message
//! construction reuses rtnetlink's builders; transport is a plain blocking netlink socket.

pub mod libnftables;
pub mod netlink_reply;
pub mod netns;
pub mod nft;
pub mod rtnl;
pub mod sysctl;

pub use netns::NetNs;
pub use rtnl::{route_message, vxlan_link_message, Link, Neighbour, NlError, Rtnl, VxlanInfo};
