//! weir-proxy: the service proxy — its control loop ([`agent`]) and its modes.
//!
//! * [`nft`]: nftables renderer (pure: plan → `nft -f` script text) — the default mode.
//! * [`iptables`]: kube-proxy-compatible iptables layout, applied with `iptables-restore --noflush`.
//! * [`ipvs`]: kube-proxy's ipvs layout (`kube-ipvs0`, ipsets, IPVS over generic netlink).
//! * [`userspace`]: a proxy in the agent process behind nftables redirects, retrying dead
//!   endpoints.
//! * [`conntrack`]: stale UDP conntrack cleanup over netlink.
//! * [`health`], [`metrics`]: `/healthz`, `/livez`, `/metrics` and healthCheckNodePort servers.
//!
//! Every mode implements [`Backend`]; the control loop, [`agent::ProxyLoop`], only talks to
//! that (the `weir` binary keeps the flags and the wiring).

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
