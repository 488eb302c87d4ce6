//! weir-proxy: the service proxy's dataplane side.
//!
//! * [`nft`]: nftables renderer (pure: plan → `nft -f` script text) — the default mode.
//! * [`iptables`]: kube-proxy-compatible iptables layout, applied with `iptables-restore --noflush`.
//! * [`userspace`]: a proxy in the agent process behind nftables redirects, retrying dead
//!   endpoints.
//! * [`conntrack`]: stale UDP conntrack cleanup over netlink.
//! * [`health`], [`metrics`]: `/healthz`, `/livez`, `/metrics` and healthCheckNodePort servers.
//!
//! Every mode implements [`Backend`]; the agent loop (in the `weir` binary) only talks to that.

pub mod agent;
pub mod backend;
pub mod conntrack;
pub mod health;
pub mod iptables;
pub mod ipvs;
pub mod metrics;
pub mod nft;
pub mod process_stats;
pub mod userspace;

pub use backend::{Backend, Error, Result, SyncKind, SyncReport};
