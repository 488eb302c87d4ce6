//! UDP conntrack hygiene: delete the entries a plan change made stale.
//!
//! The agent loop, after `Backend::sync(&new)` succeeded:
//! ```ignore
//! let filters = conntrack::stale_udp_flows(&applied, &new);
//! let n = conntrack::delete(&filters)?; // in the proxy's network namespace
//! metrics.conntrack_deleted(n);
//! ```
//! [`stale_udp_flows`] is pure; [`delete`] talks ctnetlink.

mod filter;
mod netlink;
mod stale;

pub use filter::{protocol_number, ConntrackFilter, Flow, FlowTuple};
pub use netlink::{delete, Conntrack};
pub use stale::stale_udp_flows;
