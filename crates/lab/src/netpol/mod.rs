//! NetworkPolicy in the lab: the objects `weir policy` reads (Namespaces, Pods, the
//! topology's NetworkPolicies), the agent on every node, and the matrix's policy rows, whose
//! expectations weir-policy's oracle computes from those same objects, read back from the
//! manifest directory.
//!
//! - [`objects`]: rendering the three kinds (pure) and reading them back as a
//!   [`weir_policy::Cluster`];
//! - [`agent`]: `weir policy`'s command line on a node and waiting for its first sync;
//! - [`expect`]: who each probe's ends are as the policy hook sees them, the oracle's verdict
//!   per matrix row, and the rows through Services (pure).

pub mod agent;
pub mod expect;
pub mod objects;

pub use expect::{expect, service_rows};
pub use objects::load_cluster;
