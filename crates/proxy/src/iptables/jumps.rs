//! The rules in built-in chains that hook weir's chains in (kube-proxy's
//! `iptablesJumpChains`; kubelet's jumps to its `KUBE-FIREWALL` are kubelet's, not weir's,
//! so weir neither adds nor removes them). They cannot be part of the
//! restore input — that would mean owning all of PREROUTING, FORWARD, … — so the backend
//! checks each with `iptables -C` and inserts only the missing ones, which keeps them
//! single across restarts.

use super::render::{
    KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_FIREWALL,
    KUBE_SERVICES,
};
use super::restore::Table;

/// One jump rule: `-t table -A chain args…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jump {
    pub table: Table,
    /// The built-in chain.
    pub chain: &'static str,
    /// The rule's arguments, one per element (a comment is one argument, unquoted).
    pub args: Vec<&'static str>,
}

impl Jump {
    fn new(
        table: Table,
        chain: &'static str,
        extra: &[&'static str],
        comment: &'static str,
        to: &'static str,
    ) -> Jump {
        let mut args = extra.to_vec();
        if !comment.is_empty() {
            args.extend(["-m", "comment", "--comment", comment]);
        }
        args.extend(["-j", to]);
        Jump { table, chain, args }
    }

    /// The weir chain this rule jumps to.
    pub fn target(&self) -> &'static str {
        self.args.last().copied().unwrap_or_default()
    }
}

const NEW: &[&str] = &["-m", "conntrack", "--ctstate", "NEW"];

/// Every jump, in the order they should appear at the head of each built-in chain.
pub fn jumps() -> Vec<Jump> {
    use Table::{Filter, Nat};
    let mut v: Vec<Jump> = ["INPUT", "FORWARD", "OUTPUT"]
        .into_iter()
        .map(|chain| {
            Jump::new(
                Filter,
                chain,
                NEW,
                "kubernetes load balancer firewall",
                KUBE_PROXY_FIREWALL,
            )
        })
        .collect();
    v.extend([
        Jump::new(
            Filter,
            "INPUT",
            NEW,
            "kubernetes externally-visible service portals",
            KUBE_EXTERNAL_SERVICES,
        ),
        Jump::new(
            Filter,
            "FORWARD",
            NEW,
            "kubernetes externally-visible service portals",
            KUBE_EXTERNAL_SERVICES,
        ),
        Jump::new(
            Filter,
            "INPUT",
            &[],
            "kubernetes health check service ports",
            KUBE_NODEPORTS,
        ),
        Jump::new(
            Filter,
            "FORWARD",
            NEW,
            "kubernetes service portals",
            KUBE_SERVICES,
        ),
        Jump::new(
            Filter,
            "OUTPUT",
            NEW,
            "kubernetes service portals",
            KUBE_SERVICES,
        ),
        Jump::new(
            Filter,
            "FORWARD",
            &[],
            "kubernetes forwarding rules",
            KUBE_FORWARD,
        ),
        Jump::new(
            Nat,
            "OUTPUT",
            &[],
            "kubernetes service portals",
            KUBE_SERVICES,
        ),
        Jump::new(
            Nat,
            "PREROUTING",
            &[],
            "kubernetes service portals",
            KUBE_SERVICES,
        ),
        Jump::new(
            Nat,
            "POSTROUTING",
            &[],
            "kubernetes postrouting rules",
            KUBE_POSTROUTING,
        ),
    ]);
    v
}
