//! weir-lab: a cluster simulated with network namespaces on one machine.
//!
//! A lab is an underlay switch (`wl-<lab>-sw`, a bridge), an outside world (`wl-<lab>-out`, the
//! nodes' default router with an "internet" address on its `lo`), nodes (`wl-<lab>-<node>`) and
//! pods (`wl-<lab>-<node>-<pod>`, whose interfaces a real CNI plugin creates). Every pod, node and
//! the outside run an echo server that answers with its name and the peer address it saw; the
//! connectivity [`matrix`] probes them all. Every node runs `weir proxy` ([`proxy`]) over the
//! lab's Kubernetes objects ([`manifests`]), and the [`services`] probes check what it serves.
//! A topology with NetworkPolicies ([`policy_spec`]) adds `weir policy` on every node and gives
//! every matrix row weir-policy's oracle's verdict ([`netpol`]).
//!
//! Modules depend one way (docs/ARCHITECTURE.md has the picture): helpers at the bottom
//! ([`addr`], [`names`], [`links`], [`ns`], [`process`], [`table`], [`timeout`]), then the model
//! ([`topology`], [`state`]), then the jobs (CNI, manifests, agents, probes, [`dns`],
//! [`kube_proxy`], [`eni`]), and [`lab`] on top, which brings a lab up and down.

pub mod addr;
pub mod cni;
pub mod dns;
pub mod dns_measure;
pub mod dualstack;
pub mod echo;
pub mod eni;
pub mod kube_proxy;
pub mod lab;
pub mod links;
pub mod manifests;
pub mod matrix;
pub mod names;
pub mod netpol;
pub mod ns;
pub mod policy_spec;
pub mod process;
pub mod proxy;
pub mod routes;
pub mod services;
pub mod state;
pub mod table;
pub mod timeout;
pub mod topology;

pub use lab::{down, status, up, Binaries, DownReport, StatusRow};
pub use state::{state_root, LabState};
pub use timeout::startup_timeout;
pub use topology::{
    CniKind, Network, Overlay, ProxyKind, Topology, TopologyError, DEFAULT_TOPOLOGY,
    DUAL_STACK_TOPOLOGY, ENI_TOPOLOGY, POLICY_ENI_TOPOLOGY, POLICY_TOPOLOGY, VXLAN_TOPOLOGY,
};
