//! weir-policy: Kubernetes NetworkPolicy enforcement, the pure half.
//!
//! Objects in ([`model`], converted from k8s-openapi with [`Warning`]s for what cannot be
//! enforced as written), wanted per-pod rules out ([`plan()`] → [`PolicyPlan`]), rendered as
//! one nftables table with a keyed diff ([`nft`]). [`oracle`] is the specification read
//! literally, against which the planner is property-tested. No I/O, no clock, no kernel.
//! Design and the safe outcomes: `docs/policy.md`.

mod index;
pub mod key;
pub mod model;
pub mod nft;
pub mod oracle;
pub mod plan;
mod planner;
mod selector;
pub mod warning;

pub use key::ObjectKey;
pub use model::Cluster;
pub use plan::{
    AddressSet, AllowRule, L4Match, PeerMatch, PodProgram, PolicyPlan, PortMatch, Program,
};
pub use planner::plan;
pub use warning::{Outcome, Problem, Warning};

/// Re-export of the Kubernetes API types this crate reads.
pub use k8s_openapi;
