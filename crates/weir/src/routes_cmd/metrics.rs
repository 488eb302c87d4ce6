//! `weir routes`' `/metrics`: which remote nodes are routed and which are refused, with the
//! reason (an operator alerts on a refusal instead of reading logs), whether this node itself
//! is blocked, reconciliation failures and the time of the last success.

use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::{text, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_routes::plan::{Desired, NodeStatus};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabel {
    node: String,
    reason: String,
}

pub struct RoutesMetrics {
    registry: Registry,
    routed: Gauge,
    refused: Family<RefusedLabel, Gauge>,
    blocked: Gauge,
    failures: Counter,
    last_success: Gauge<f64, AtomicU64>,
}

impl RoutesMetrics {
    pub fn new() -> Self {
        let m = RoutesMetrics {
            registry: Registry::default(),
            routed: Gauge::default(),
            refused: Family::default(),
            blocked: Gauge::default(),
            failures: Counter::default(),
            last_success: Gauge::default(),
        };
        let mut registry = Registry::default();
        registry.register(
            "weir_routes_nodes_routed",
            "Remote nodes whose pod CIDRs are all routed",
            m.routed.clone(),
        );
        registry.register(
            "weir_routes_node_refused",
            "1 per remote node (and reason) whose pod CIDRs are not all routed",
            m.refused.clone(),
        );
        registry.register(
            "weir_routes_blocked",
            "1 while this node itself cannot be routed (no Node object, no underlay address)",
            m.blocked.clone(),
        );
        registry.register(
            "weir_routes_reconcile_failures",
            "Reconciliations that failed or left an operation failed",
            m.failures.clone(),
        );
        registry.register(
            "weir_routes_last_reconcile_timestamp_seconds",
            "When the last reconciliation succeeded (Unix time)",
            m.last_success.clone(),
        );
        RoutesMetrics { registry, ..m }
    }

    /// After a reconciliation that computed `desired`; `failed`: an operation failed.
    pub fn reconciled(&self, desired: &Desired, failed: bool) {
        let mut routed = 0;
        self.refused.clear();
        for (node, status) in &desired.status {
            match status {
                NodeStatus::Routed { .. } => routed += 1,
                NodeStatus::Refused { reasons, .. } => {
                    for reason in reasons {
                        let label = RefusedLabel {
                            node: node.clone(),
                            reason: reason.clone(),
                        };
                        self.refused.get_or_create(&label).set(1);
                    }
                }
            }
        }
        self.routed.set(routed);
        self.blocked.set(desired.blocked.is_some().into());
        if failed {
            self.failures.inc();
        } else {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            self.last_success.set(now.as_secs_f64());
        }
    }

    /// A reconciliation that failed as a whole (kernel state left as it was).
    pub fn failed(&self) {
        self.failures.inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn desired(status: BTreeMap<String, NodeStatus>) -> Desired {
        Desired {
            vtep: None,
            entries: Default::default(),
            status,
            blocked: None,
        }
    }

    #[test]
    fn refusals_are_labelled_by_node_and_reason_and_go_when_resolved() {
        let m = RoutesMetrics::new();
        let mut status = BTreeMap::new();
        status.insert(
            "b".to_string(),
            NodeStatus::Routed {
                pod_cidrs: vec!["10.244.2.0/24".parse().unwrap()],
            },
        );
        status.insert(
            "c".to_string(),
            NodeStatus::Refused {
                routed: vec![],
                reasons: vec!["10.99.0.3 is not on a directly connected subnet".into()],
            },
        );
        m.reconciled(&desired(status.clone()), false);
        let text = m.encode();
        assert!(text.contains("weir_routes_nodes_routed 1\n"), "{text}");
        assert!(
            text.contains(
                "weir_routes_node_refused{node=\"c\",reason=\"10.99.0.3 is not on a directly connected subnet\"} 1\n"
            ),
            "{text}"
        );
        assert!(text.contains("weir_routes_blocked 0\n"), "{text}");
        // Node c leaves: its refusal goes with it.
        status.remove("c");
        m.reconciled(&desired(status), true);
        let text = m.encode();
        assert!(!text.contains("node=\"c\""), "{text}");
        assert!(
            text.contains("weir_routes_reconcile_failures_total 1\n"),
            "{text}"
        );
    }
}
