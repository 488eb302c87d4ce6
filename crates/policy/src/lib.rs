//! weir-policy: Kubernetes NetworkPolicy enforcement.
//!
//! The pure half: objects in ([`model`], converted from k8s-openapi with [`Warning`]s for
//! what cannot be enforced as written), wanted per-pod rules out ([`plan()`] →
//! [`PolicyPlan`]), rendered as one nftables table with a keyed diff ([`nft`]). [`oracle`] is
//! the specification read literally, against which the planner is property-tested. No I/O,
//! no clock, no kernel.
//!
//! The running half: [`backend::Backend`] (what the loop programs; [`kernel::NftBackend`]
//! writes the table with `nft -f -`, checks it and cleans it up) and [`agent::PolicyLoop`]
//! (source → plan → backend, generic over the source, backend, clock and observer so it is
//! tested without root). The `weir policy` command wires them.
//! Design and the safe outcomes: `docs/policy.md`.

pub mod agent;
pub mod backend;
mod index;
pub mod kernel;
pub mod key;
pub mod model;
pub mod nft;
pub mod oracle;
pub mod plan;
mod planner;
mod selector;
pub mod warning;

pub use key::ObjectKey;
pub use model::{Cluster, Converted};
pub use plan::{
    AddressSet, AllowRule, L4Match, PeerMatch, PodProgram, PolicyPlan, PortMatch, Program,
};
pub use planner::{plan, NodePlanner};
pub use warning::{Outcome, Problem, Warning};

/// Re-export of the Kubernetes API types this crate reads.
pub use k8s_openapi;
