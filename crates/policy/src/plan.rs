//! The planner's output: per local pod, what each direction allows.
//!
//! Addresses are concrete (selectors resolved to pod IPs, named ports to numbers), so a
//! backend renders them without reading cluster objects, and an evaluator can answer
//! "would this first packet pass?" from the plan alone.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use crate::key::ObjectKey;
use crate::model::{IpBlock, Protocol};

/// One node's policy program. Pods absent from `pods` (not local, not live, hostNetwork)
/// are not policed on this node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyPlan {
    pub node: Arc<str>,
    /// Shared (`Arc`): a plan after one change holds the programs of the pods it did not
    /// touch as the plan before it did, so comparing and copying them costs a pointer.
    pub pods: BTreeMap<ObjectKey, Arc<PodProgram>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProgram {
    pub ips: Vec<IpAddr>,
    /// `None`: not isolated in that direction (everything passes, no map entry).
    pub ingress: Option<Program>,
    pub egress: Option<Program>,
}

/// An isolated direction: traffic passes when the peer is one of the pod's own addresses
/// (a pod cannot block itself) or some rule allows it; everything else is dropped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Program {
    /// The policies that isolate the pod in this direction (they select it and have this
    /// policy type), by `namespace/name`: what a denial is blamed on when no rule allows.
    pub isolated_by: Vec<ObjectKey>,
    /// In policy order (`namespace/name`), then rule order. Rules that come out the same for
    /// many pods are one shared allocation.
    pub rules: Vec<Arc<AllowRule>>,
}

/// Traffic to (egress) or from (ingress) an address in `peers` on a port in `ports`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllowRule {
    /// The policy this rule comes from, for diagnostics and rule comments.
    pub policy: ObjectKey,
    pub peers: PeerMatch,
    pub ports: PortMatch,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerMatch {
    Any,
    /// Never empty in a plan (a rule matching no address is left out).
    Only(AddressSet),
}

/// Pod IPs and CIDR blocks, IPv4 before IPv6 (the order of `IpAddr`), each sorted and once.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct AddressSet {
    pub ips: Vec<IpAddr>,
    pub blocks: Vec<IpBlock>,
}

impl AddressSet {
    pub fn is_empty(&self) -> bool {
        self.ips.is_empty() && self.blocks.is_empty()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ips.binary_search(&ip).is_ok() || self.blocks.iter().any(|b| b.contains(ip))
    }

    pub(crate) fn normalize(&mut self) {
        self.ips.sort_unstable();
        self.ips.dedup();
        self.blocks.sort();
        self.blocks.dedup();
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortMatch {
    /// Every protocol and port (ICMP too).
    Any,
    /// Never empty in a plan; sorted, each once.
    Only(Vec<L4Match>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct L4Match {
    pub protocol: Protocol,
    /// Inclusive range; `None`: every port of the protocol.
    pub ports: Option<(u16, u16)>,
}

impl L4Match {
    pub fn matches(&self, protocol: Protocol, port: u16) -> bool {
        self.protocol == protocol
            && self
                .ports
                .is_none_or(|(first, last)| (first..=last).contains(&port))
    }
}
